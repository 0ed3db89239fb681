//! A move's target made ready while its session runs on (issue 17): a context
//! on the target device with the session's modules loaded and its memory
//! placed, made by a thread of its own, so that the program's pause is only
//! its memory's copy.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cumux_protocol::{codes, CuError, DevicePtr, Handle};

use crate::device::placed_copy::{self, SourceMapping};
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
    /// The session's allocations placed on `ctx` beforehand, as they were
    /// then (zero-filled): the move places only what changed since.
    pub placed: Vec<(DevicePtr, u64)>,
    /// Those allocations' memory on `ctx` as the session's own context
    /// mapped it beforehand, where it can (a GPU's worker), a mapping a
    /// round: the move only copies into it.
    pub mapping: Vec<SourceMapping>,
    pub took: Duration,
}

/// Rounds of loading a move's target takes at most: modules its program
/// loaded while the last round ran are loaded in the next. A program that
/// loads modules lazily (PyTorch: the first steps load a few hundred ms of
/// them at a time) needs several; one still loading after the last has the
/// rest loaded in its pause.
pub(super) const ROUNDS: u32 = 10;

/// Address space past a session's memory kept free on a move's target
/// beforehand: where its driver would put the modules it loads, which is
/// where the source's driver puts the program's next allocations.
pub const ROOM_TO_GROW: u64 = 16 << 30;

/// The spans around `memory` that a move's target keeps free: each
/// allocation and [`ROOM_TO_GROW`] past it (the target keeps them in whole
/// windows, `MovableContext::keep_free`).
pub fn room_to_grow(memory: &[(DevicePtr, u64)]) -> Vec<(u64, u64)> {
    memory
        .iter()
        .filter_map(|&(ptr, bytes)| {
            let end = ptr.checked_add(bytes.max(1))?.checked_add(ROOM_TO_GROW)?;
            Some((ptr, end))
        })
        .collect()
}

/// A move whose target is being made ready.
pub(super) struct Preparing {
    pub order: Order,
    pub ordinal: u32,
    pub target: Arc<dyn Device>,
    /// This round's number, from 1.
    pub round: u32,
    work: JoinHandle<Result<Prepared, CuError>>,
}

impl Preparing {
    /// Starts making a context of `target` in address `window` with
    /// `modules` loaded, for `order`: on the one an earlier round made
    /// (`base`), if any; the session's `memory` ranges (on a `base`, those
    /// allocated since it placed its own) are placed there, and mapped by
    /// the session's context `source` where it can.
    pub fn start(
        order: Order,
        ordinal: u32,
        (target, source): (Arc<dyn Device>, Arc<dyn DeviceContext>),
        window: u32,
        (modules, memory): (Vec<ModuleToLoad>, Vec<(DevicePtr, u64)>),
        base: Option<(u32, Prepared)>,
    ) -> Result<Preparing, (Order, CuError)> {
        let device = Arc::clone(&target);
        let round = base.as_ref().map_or(1, |b| b.0 + 1);
        let base = base.map(|b| b.1);
        let spawned = std::thread::Builder::new()
            .name("cumux-move".into())
            .spawn(move || prepare(&*device, &source, window, modules, &memory, base));
        match spawned {
            Ok(work) => Ok(Preparing {
                order,
                ordinal,
                target,
                round,
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

    /// The order, the round, and the target made ready (or why not).
    pub fn finish(self) -> (Order, u32, u32, Arc<dyn Device>, Result<Prepared, CuError>) {
        let prepared = self.work.join().unwrap_or_else(|_| {
            Err(CuError::new(
                codes::UNKNOWN,
                "making the target ready panicked",
            ))
        });
        (self.order, self.ordinal, self.round, self.target, prepared)
    }
}

/// The target of a move made ready: a context of `target` in `window` (or
/// the one `base` made) with `modules` loaded, the addresses of the
/// session's `memory` first kept unused, so that the driver puts no
/// module's memory where the move must place the session's.
fn prepare(
    target: &dyn Device,
    source: &Arc<dyn DeviceContext>,
    window: u32,
    modules: Vec<ModuleToLoad>,
    memory: &[(DevicePtr, u64)],
    base: Option<Prepared>,
) -> Result<Prepared, CuError> {
    let started = Instant::now();
    let refused = |what: &str| CuError::new(codes::NOT_SUPPORTED, what.to_string());
    let first = base.is_none();
    let (ctx, mut loaded, mut placed_now, mut mapping, took) = match base {
        Some(b) => (b.ctx, b.loaded, b.placed, b.mapping, b.took),
        None => (
            target
                .movable()
                .ok_or_else(|| refused("the target device cannot take a moved session"))?
                .create_context_in_window(window)?,
            HashMap::with_capacity(modules.len()),
            Vec::new(),
            Vec::new(),
            Duration::ZERO,
        ),
    };
    let placed = ctx
        .movable()
        .ok_or_else(|| refused("the target context cannot place memory"))?;
    if !memory.is_empty() {
        // Where they are taken already, the move finds out when it places
        // them, as it would have without this.
        if first {
            if let Err(e) = placed.hold(memory) {
                tracing::debug!("keeping a moved session's addresses free: {}", e.detail);
            }
            // And the room its program allocates in next, which the
            // target's driver would give to the modules loaded below.
            match placed.keep_free(&room_to_grow(memory)) {
                Ok(kept) => tracing::debug!("a move's target keeps {kept} bytes free to grow in"),
                Err(e) => tracing::debug!("keeping room to grow: {}", e.detail),
            }
        }
        // Placed now, the memory is not placed in the pause; where the
        // target has no room for it yet (or, in a later round, it shares a
        // page with memory placed before), the move places it then.
        match placed.place_all(memory) {
            Ok(()) => {
                placed_now.extend_from_slice(memory);
                // Where the devices share memory between processes, the
                // session's context maps it too, so that the pause is only
                // the copy.
                match placed_copy::map_early(source, placed, memory) {
                    Ok(m) => mapping.push(m),
                    Err(e) => {
                        tracing::debug!("mapping a move's target memory early: {}", e.detail)
                    }
                }
            }
            Err(e) => tracing::debug!("placing a moved session's memory early: {}", e.detail),
        }
    }
    for (handle, image, blocks) in modules {
        loaded.insert(handle, placed.module_load_at(&image, &blocks)?);
    }
    Ok(Prepared {
        ctx,
        loaded,
        placed: placed_now,
        mapping,
        took: took + started.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_to_grow_runs_from_the_memory_past_its_end() {
        let room = room_to_grow(&[(0x4_0820_0000, 4096), (0x4_4000_0000, 0)]);
        assert_eq!(room[0], (0x4_0820_0000, 0x4_0820_1000 + ROOM_TO_GROW));
        assert_eq!(room[1], (0x4_4000_0000, 0x4_4000_0001 + ROOM_TO_GROW));
        assert!(
            room_to_grow(&[(u64::MAX - 8, 4)]).is_empty(),
            "past the end"
        );
    }
}
