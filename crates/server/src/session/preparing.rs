//! A move's target made ready while its session runs on (issue 17): a context
//! on the target device with the session's modules loaded, made by a thread
//! of its own, so that the program's pause is only its memory's copy.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cumux_protocol::{codes, CuError, DevicePtr, Handle};

use crate::device::{Device, DeviceContext, LoadedModule};
use crate::moves::Order;

/// A module as the target loads it: its handle, image and (on a device
/// that places module memory itself) where its loading allocated.
pub(super) type ModuleToLoad = (Handle, Arc<Vec<u8>>, Vec<DevicePtr>);

/// The target made ready.
pub(super) struct Prepared {
    pub ctx: Arc<dyn DeviceContext>,
    /// Each module handle's loading on `ctx`.
    pub loaded: HashMap<Handle, LoadedModule>,
    pub took: Duration,
}

/// A move whose target is being made ready.
pub(super) struct Preparing {
    pub order: Order,
    pub ordinal: u32,
    pub target: Arc<dyn Device>,
    work: JoinHandle<Result<Prepared, CuError>>,
}

impl Preparing {
    /// Starts making a context of `target` in address `window` with
    /// `modules` loaded, for `order`.
    pub fn start(
        order: Order,
        ordinal: u32,
        target: Arc<dyn Device>,
        window: u32,
        modules: Vec<ModuleToLoad>,
    ) -> Result<Preparing, (Order, CuError)> {
        let device = Arc::clone(&target);
        let spawned = std::thread::Builder::new()
            .name("cumux-move".into())
            .spawn(move || prepare(&*device, window, modules));
        match spawned {
            Ok(work) => Ok(Preparing {
                order,
                ordinal,
                target,
                work,
            }),
            Err(e) => Err((
                order,
                CuError::new(codes::OUT_OF_MEMORY, format!("no thread for the move: {e}")),
            )),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.work.is_finished()
    }

    /// The order, and the target made ready (or why not).
    pub fn finish(self) -> (Order, u32, Arc<dyn Device>, Result<Prepared, CuError>) {
        let prepared = self.work.join().unwrap_or_else(|_| {
            Err(CuError::new(
                codes::UNKNOWN,
                "making the target ready panicked",
            ))
        });
        (self.order, self.ordinal, self.target, prepared)
    }
}

fn prepare(
    target: &dyn Device,
    window: u32,
    modules: Vec<ModuleToLoad>,
) -> Result<Prepared, CuError> {
    let started = Instant::now();
    let refused = |what: &str| CuError::new(codes::NOT_SUPPORTED, what.to_string());
    let ctx = target
        .movable()
        .ok_or_else(|| refused("the target device cannot take a moved session"))?
        .create_context_in_window(window)?;
    let placed = ctx
        .movable()
        .ok_or_else(|| refused("the target context cannot place memory"))?;
    let mut loaded = HashMap::with_capacity(modules.len());
    for (handle, image, blocks) in modules {
        loaded.insert(handle, placed.module_load_at(&image, &blocks)?);
    }
    Ok(Prepared {
        ctx,
        loaded,
        took: started.elapsed(),
    })
}
