//! How a session's queued work is seen to finish: completion signals behind
//! its launches, for the scheduling gate and for synchronizes.

use std::sync::Arc;

use crate::device::signals::{SignalArea, StreamSignals};
use crate::device::{StreamOrdered, StreamWork};

/// Under `priority`, a batch tenant's stream is signalled after every this many
/// launches (a latency-critical tenant's, and every tenant's under `fair`, after
/// each): a signal is a device-side
/// write that the next kernel of the stream waits for, which costs tiny kernels
/// a third of their rate when it follows every one (measured on the H100, 5 µs
/// kernels). Launches not yet covered are covered before the session waits for
/// anything (a synchronizing call, or the gate).
pub const SIGNAL_EVERY: u64 = 8;
/// Launches the gate expects to take at least this long (nanoseconds) are
/// signalled each: a signal costs them little, and a late completion would bill
/// their tenant for time another tenant's kernel ran (`Charging::Oldest`).
pub const SIGNAL_EACH_FROM_NS: u64 = 10_000;

/// A synchronize answered from completion signals waits for them at least this
/// long before it asks the worker (longer on large hosts: `answer_spin_time`)...
pub const SIGNAL_WAIT_MIN: std::time::Duration = std::time::Duration::from_micros(200);
/// ...spinning for the first this long, then yielding between looks.
pub const SIGNAL_SPIN: std::time::Duration = std::time::Duration::from_micros(20);

/// Queues the signals that cover every launch of the session not yet covered.
pub fn flush_signals(ordered: &dyn StreamOrdered, signals: &mut StreamSignals) {
    for (stream, slot, value) in signals.flush() {
        ordered.enqueue(stream, StreamWork::Signal { slot, value });
    }
}

/// A signal area for the session's launches, attached to its stream order; `None`
/// (and a debug line) where it cannot signal completions.
pub fn attach_signals(ordered: &dyn StreamOrdered, session: u64) -> Option<StreamSignals> {
    let attached = SignalArea::create().and_then(|area| {
        let path = area.path().expect("a fresh area has a name");
        let result = ordered.attach_signals(&path);
        area.unlink();
        result.map(|()| StreamSignals::new(Arc::new(area)))
    });
    match attached {
        Ok(signals) => Some(signals),
        Err(e) => {
            tracing::debug!(session, "no completion signals: {e}");
            None
        }
    }
}
