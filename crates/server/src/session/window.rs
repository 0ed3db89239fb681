//! How far a session's launches may run ahead of its device: NVIDIA's driver
//! blocks a launch while about a thousand wait on its stream, so a session's
//! launch waits while more than [`MAX_PENDING_LAUNCHES`] of its stream are unfinished.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cumux_protocol::Handle;

use super::signalling::SIGNAL_SPIN;
use super::Session;
use crate::device::signals::ERROR_SLOT;
use crate::device::SyncTarget;

/// Launches of one stream that may be queued and unfinished at once. A
/// program that launches without synchronizing waits at the next one, as it
/// would natively (an H200 took about 2,100 4096² matmuls of PyTorch in 3 s;
/// through cumux without this window, 47,000, which took 128 s to run).
pub const MAX_PENDING_LAUNCHES: u64 = 1024;
/// Under `fifo`, a stream is signalled after this many launches (so the window
/// sees its launches finish); a signal this rare costs nothing measurable.
pub const WINDOW_SIGNAL_EVERY: u64 = 128;
/// A wait that sees no launch finish for this long asks the device whether the
/// stream is still busy: a stream that is idle or failed ends the wait.
const STALL_CHECK: Duration = Duration::from_millis(100);
/// Past its spin and a millisecond of yielding, a waiting launch sleeps this long
/// between looks.
const WAIT_SLEEP: Duration = Duration::from_micros(100);

/// Adds the wait that began at `.1` to the tenant's window wait when dropped
/// (whichever way the wait ends).
struct WaitCounted<'a>(&'a Session, Instant);

impl Drop for WaitCounted<'_> {
    fn drop(&mut self) {
        if let Some(hold) = &self.0.account {
            let waited = self.1.elapsed().as_nanos() as u64;
            let counters = hold.account().counters();
            counters.window_wait_ns.fetch_add(waited, Ordering::Relaxed);
        }
    }
}

impl Session {
    /// Waits until the launch numbered `value` on `stream` (signal `slot`) is at
    /// most [`MAX_PENDING_LAUNCHES`] ahead of the stream's last finished launch.
    /// Ends early when the device reports a failure, the stream turns out idle
    /// or failed, or the client hung up: the next synchronize reports what failed.
    pub(super) fn hold_to_window(&self, stream: Handle, slot: u32, value: u64) {
        let Some(target) = value.checked_sub(MAX_PENDING_LAUNCHES) else {
            return;
        };
        let Some(area) = self.signals.as_ref().map(|s| Arc::clone(s.area())) else {
            return;
        };
        let mut seen = area.load(slot);
        if seen >= target {
            return;
        }
        self.send_held();
        let errors = area.load(ERROR_SLOT);
        let started = Instant::now();
        let _counted = WaitCounted(self, started);
        let mut progress_at = started;
        loop {
            let done = area.load(slot);
            if done >= target
                || area.load(ERROR_SLOT) != errors
                || self.hung_up.load(Ordering::Relaxed)
            {
                return;
            }
            if done != seen {
                seen = done;
                progress_at = Instant::now();
            } else if progress_at.elapsed() >= STALL_CHECK {
                match self.ordered().map(|o| o.query(SyncTarget::Stream(stream))) {
                    Ok(Ok(false)) => progress_at = Instant::now(),
                    _ => return,
                }
            }
            let waited = started.elapsed();
            if waited < SIGNAL_SPIN {
                std::hint::spin_loop();
            } else if waited < Duration::from_millis(1) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(WAIT_SLEEP);
            }
        }
    }
}
