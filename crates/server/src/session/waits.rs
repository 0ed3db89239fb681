//! How a session's waiting calls are answered: from the completion signals
//! where they can say, else by the device; and what a wait's outcome leaves
//! (printf for the reply, a failure recorded).

use std::time::{Duration, Instant};

use cumux_protocol::{codes, Call, DEFAULT_STREAM, MAX_QUERY_WITHIN_US};

use super::core::err;
use super::signalling::SIGNAL_SPIN;
use super::{CallResult, Session};
use crate::device::signals::ERROR_SLOT;
use crate::device::{LaunchOutcome, SyncTarget};

impl Session {
    /// The result of a call that waited on the device: its printf output is
    /// kept for the reply, its failure recorded (fatal ones poison the session).
    pub(super) fn waited(&self, outcome: LaunchOutcome) -> CallResult {
        self.core.append_stdout(&outcome.stdout);
        if let Err(e) = outcome.result {
            // A failed context signals nothing more: its launches leave the gate now.
            if codes::is_fatal(e.code) {
                if let Some(gate) = &self.gate {
                    gate.forget_in_flight();
                }
            }
            self.core.fail(e);
        }
        self.sync_result()
    }

    /// `Call::QueryWithin`: a stream or event query asked again while it
    /// says "not ready", for up to `within_us` (at most
    /// `MAX_QUERY_WITHIN_US`), sleeping a little longer each time (20 µs
    /// to 200 µs): a remote client's poll without a round trip per poll.
    pub(super) fn query_within(&self, query: &Call, within_us: u32) -> CallResult {
        let ask = || match *query {
            Call::StreamQuery { stream } => self.stream_query(stream),
            Call::EventQuery { event } => self.event_query(event),
            _ => Err(err(
                codes::INVALID_VALUE,
                "QueryWithin carries a stream or an event query only",
            )),
        };
        let budget = Duration::from_micros(within_us.min(MAX_QUERY_WITHIN_US).into());
        let started = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            match ask() {
                Err(e) if e.code == codes::NOT_READY && started.elapsed() < budget => {
                    std::thread::sleep(pause.min(budget.saturating_sub(started.elapsed())));
                    pause = (pause * 2).min(Duration::from_micros(200));
                }
                answer => return answer,
            }
        }
    }

    /// A stream or event query against the device.
    pub(super) fn query(&self, target: SyncTarget, busy: &str) -> CallResult {
        match self.ordered()?.query(target) {
            // A finished stream's query does what its synchronize would (its
            // kernels' printf output and errors, gathered from the device),
            // so a client that polled need not synchronize after it.
            Ok(true) if matches!(target, SyncTarget::Stream(_)) => {
                let outcome = self.ordered()?.synchronize(target);
                self.enqueue_failed.set(false);
                self.waited(outcome)
            }
            Ok(true) => self.sync_result(),
            Ok(false) => Err(err(codes::NOT_READY, busy)),
            Err(e) => {
                self.core.fail(e);
                self.sync_result()
            }
        }
    }

    /// Waits for `target` (a stream or all the session's work), answered from the
    /// completion signals where they can say, else by the device.
    pub(super) fn synchronize(&mut self, target: SyncTarget) -> CallResult {
        if let Some(result) = self.signalled_sync(target) {
            return result;
        }
        let outcome = self.ordered()?.synchronize(target);
        self.enqueue_failed.set(false);
        self.waited(outcome)
    }

    /// Answers a synchronize from the session's completion signals, without
    /// the worker, when they can say (every launch of the streams waited for
    /// is covered by a signal queued after all their other work), they come
    /// within `signal_wait`, and nothing failed to queue since the worker was
    /// last asked (the session's own failures, or the worker's error counter),
    /// and no printf waits in the order for the session: two hand-offs fewer
    /// for a short kernel's wait. `None`: ask the worker.
    fn signalled_sync(&mut self, target: SyncTarget) -> Option<CallResult> {
        if self.enqueue_failed.get() || self.signal_wait.is_zero() {
            return None;
        }
        // Printf that the order holds for the session goes with this wait.
        if self.ordered().is_ok_and(|o| o.printf_waiting()) {
            return None;
        }
        // Under a gate every waiting call has flushed them already.
        if self.gate.is_none() {
            self.flush_signals();
        }
        let signals = self.signals.as_ref()?;
        let wanted = match target {
            SyncTarget::Stream(DEFAULT_STREAM) | SyncTarget::Context => signals.all_settled()?,
            SyncTarget::Stream(stream) => vec![signals.settled(stream)?],
            SyncTarget::Event(_) => return None,
        };
        if wanted.is_empty() {
            return None;
        }
        let area = signals.area();
        let errors = area.load(ERROR_SLOT);
        if errors != self.worker_errors_seen.get() {
            self.worker_errors_seen.set(errors);
            return None;
        }
        self.send_held();
        let started = std::time::Instant::now();
        while !wanted.iter().all(|&(slot, value)| area.load(slot) >= value) {
            let waited = started.elapsed();
            if waited >= self.signal_wait {
                return None;
            }
            // Past a short spin, let the worker have this core if it needs it.
            match waited < SIGNAL_SPIN {
                true => std::hint::spin_loop(),
                false => std::thread::yield_now(),
            }
        }
        if area.load(ERROR_SLOT) != errors {
            return None;
        }
        Some(self.sync_result())
    }

    /// Waits for all of the session's stream work (before a free or an unload).
    pub(super) fn drain_all(&mut self) {
        if let Ok(ordered) = self.ordered() {
            let outcome = ordered.synchronize(SyncTarget::Context);
            self.queued_since_sync.set(outcome.result.is_err());
            self.core.append_stdout(&outcome.stdout);
            if let Err(e) = outcome.result {
                self.core.fail(e);
            }
        }
    }
}
