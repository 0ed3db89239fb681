//! A session's one stream order on its context, as its opening and its moves
//! set it up: the context's own with completion signals, else server threads.

use std::sync::Arc;
use std::time::Duration;

use cumux_protocol::{codes, CuError};

use super::signalling::{attach_signals, SIGNAL_WAIT_MIN};
use crate::device::signals::StreamSignals;
use crate::device::{DeviceContext, StreamOrdered};
use crate::gate::GateSession;
use crate::threads::{LaunchMeter, ThreadedStreams};

/// `1` keeps stream order in the server (a thread per stream) even where the
/// device keeps it itself: for comparisons.
pub const STREAM_THREADS_ENV: &str = "CUMUX_STREAM_THREADS";

/// A session's stream order over one context.
pub(super) struct Order {
    /// The server's own threads, where the context's order is not used.
    pub threads: Option<ThreadedStreams>,
    /// The completion signals of the context's own order.
    pub signals: Option<StreamSignals>,
    /// Whether a kernel watchdog reads the signals.
    pub watched: bool,
    /// How long a synchronize waits for signals before asking the device.
    pub signal_wait: Duration,
}

/// The order of session `id` on `ctx`: the context's own, with completion
/// signals that tell the gate when work is done and answer synchronizes
/// (`signalled`: a driver's session); else (no order of its own, or no
/// signals under a gate) threads of the server's own over the context, which
/// ask the gate themselves before each piece of work and time it with `meter`.
/// Then its settings: `priority` forced on its own streams, kept hot if
/// `latency_critical`.
pub(super) fn stream_order(
    ctx: &Arc<dyn DeviceContext>,
    id: u64,
    signalled: bool,
    gate: Option<&Arc<GateSession>>,
    meter: impl FnOnce() -> LaunchMeter,
    priority: Option<i32>,
    latency_critical: bool,
) -> Result<Order, CuError> {
    let forced_threads = std::env::var(STREAM_THREADS_ENV).is_ok_and(|v| v.trim() == "1");
    let own = ctx.stream_ordered().filter(|_| !forced_threads);
    let mut signals = match own {
        Some(ordered) if signalled => attach_signals(ordered, id),
        _ => None,
    };
    let threads = match own {
        Some(_) if gate.is_none() || signals.is_some() => None,
        _ => {
            signals = None;
            Some(ThreadedStreams::new(
                Arc::clone(ctx),
                id,
                Some(meter()),
                gate.cloned(),
            )?)
        }
    };
    let ordered: &dyn StreamOrdered = match (&threads, own) {
        (Some(threads), _) => threads,
        (None, Some(own)) => own,
        (None, None) => return Err(CuError::new(codes::UNKNOWN, "no stream order")),
    };
    if let Some(priority) = priority {
        ordered.set_own_stream_priority(priority);
    }
    // A latency-critical tenant's calls find the worker awake.
    if latency_critical {
        ordered.keep_hot(crate::device::spin::hot_spin_time());
    }
    let watched = ordered.watched();
    // The server's own threads answer a synchronize at once; signals only
    // spare a round trip to a device in another process.
    let signal_wait = match threads {
        Some(_) => Duration::ZERO,
        None => crate::device::spin::answer_spin_time().max(SIGNAL_WAIT_MIN),
    };
    Ok(Order {
        threads,
        signals,
        watched,
        signal_wait,
    })
}
