//! SM caps in a shared context: a capped session's streams are made in a
//! green context of its tenant's SMs, so its kernels run there beside others'.
//!
//! A `shared` worker serves each session's connection on a thread of its
//! own, and every stream a session makes is made on that thread; so the
//! thread keeps the green context its streams go to. Its events and graphs
//! go there too (a stream records only its own context's events).
//! Everything else (memory, modules) stays in the shared context, whose
//! functions launch on a
//! green context's streams on its SMs (measured on the H100,
//! `bench/cuda/green_probe.c`). Green contexts are made once per part and
//! kept by the context, so all sessions of a tenant share theirs.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cumux_cuda_driver as cu;
use cumux_protocol::CuError;

use super::convert::cu_err;
use crate::locking::lock;
use crate::sm_parts::SmPart;

thread_local! {
    /// Where streams made on this thread go; `None`: the context itself.
    static STREAM_HOME: RefCell<Option<Arc<cu::Context>>> = const { RefCell::new(None) };
}

/// The green context streams made on this thread go to, if any.
pub(super) fn stream_home() -> Option<Arc<cu::Context>> {
    STREAM_HOME.with(|home| home.borrow().clone())
}

/// A shared context's green contexts, one per SM part, with their SM counts.
#[derive(Default)]
pub(super) struct GreenParts(Mutex<HashMap<SmPart, (Arc<cu::Context>, u32)>>);

impl GreenParts {
    /// Sends the calling thread's future streams to `part`'s green context
    /// of `ctx`'s device (made at its first use); the SMs it has.
    pub(super) fn send_streams(
        &self,
        ctx: &Arc<cu::Context>,
        part: SmPart,
    ) -> Result<u32, CuError> {
        let (green, sms) = {
            let mut parts = lock(&self.0);
            match parts.get(&part) {
                Some(made) => made.clone(),
                None => {
                    let (green, sms) = green_part(
                        ctx,
                        part,
                        "a shared context's capped sessions make their streams on part of the GPU",
                    )?;
                    parts.insert(part, (Arc::clone(&green), sms));
                    (green, sms)
                }
            }
        };
        STREAM_HOME.with(|home| *home.borrow_mut() = Some(green));
        Ok(sms)
    }
}

/// A green context on `part` of `ctx`'s device's SMs and the SMs it got,
/// logged with `what` and the groups it took.
pub(super) fn green_part(
    ctx: &Arc<cu::Context>,
    part: SmPart,
    what: &str,
) -> Result<(Arc<cu::Context>, u32), CuError> {
    let (green, sms, groups) = ctx
        .driver()
        .green_context(ctx.device(), part.from, part.to)
        .map_err(cu_err)?;
    tracing::info!(
        %part,
        sms,
        first_group = groups.first,
        groups = groups.end - groups.first,
        "{what}"
    );
    Ok((green, sms))
}
