//! How a session's work reaches its one stream order: queued unwaited, or
//! first let go by the scheduling gate with a completion signal behind it; and
//! how waiting calls are answered, from the signals where they can say.

use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::{codes, Handle, ReplyBody, DEFAULT_STREAM};

use super::core::err;
use super::signalling::{flush_signals, SIGNAL_EACH_FROM_NS, SIGNAL_EVERY, SIGNAL_SPIN};
use super::{stream_order, CallResult, Session};
use crate::device::signals::ERROR_SLOT;
use crate::device::{LaunchOutcome, StreamWork, SyncTarget};
use crate::gate::{kernel_id_of, Admission};

impl Session {
    /// Queues the signals that cover every launch not yet covered.
    pub(super) fn flush_signals(&mut self) {
        if let (Ok(ordered), Some(signals)) =
            (stream_order(&self.threads, &self.ctx), &mut self.signals)
        {
            flush_signals(ordered, signals);
        }
    }

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

    /// Queues a launch (or a graph). Under a gate it first waits for the
    /// scheduler to let it go; a signal that tells the gate when it is done
    /// follows it on its stream, or a later one covers it (see [`SIGNAL_EVERY`]).
    pub(super) fn launch_work(&mut self, stream: Handle, work: StreamWork) -> CallResult {
        self.ordered()?;
        self.queued_since_sync.set(true);
        if self.gate.is_some() {
            self.gated(stream, work);
            return Ok(ReplyBody::Unit);
        }
        self.enqueue(stream, work);
        // Covered by a signal when the session next synchronizes (or, for
        // the watchdog's sake, after every few launches).
        let Some(signals) = &mut self.signals else {
            return Ok(ReplyBody::Unit);
        };
        if signals.launch(stream).is_none() {
            signals.note_work(stream);
        } else if self.watched {
            if let Some((slot, value)) = signals.due(stream, SIGNAL_EVERY) {
                self.enqueue(stream, StreamWork::Signal { slot, value });
            }
        }
        Ok(ReplyBody::Unit)
    }

    /// Hands `work` to the stream order; a failure to queue it waits there for
    /// the next synchronize, which must then ask the device.
    fn enqueue(&self, stream: Handle, work: StreamWork) {
        let queued = self.ordered().is_ok_and(|o| o.enqueue(stream, work));
        if !queued {
            self.enqueue_failed.set(true);
        }
    }

    /// Queues `work` (a launch, a copy or a memset) on the device once the gate
    /// lets it go, the gate watching for its end through the stream's signals.
    /// Without signals (the server's own stream threads) the work goes at once:
    /// those threads ask the gate themselves before they run it.
    fn gated(&mut self, stream: Handle, work: StreamWork) {
        let Ok(ordered) = stream_order(&self.threads, &self.ctx) else {
            return;
        };
        let (Some(gate), Some(signals), Some(kernel_id)) =
            (&self.gate, &mut self.signals, kernel_id_of(&work))
        else {
            self.enqueue(stream, work);
            return;
        };
        let failed = &self.enqueue_failed;
        let queue = |work| {
            if !ordered.enqueue(stream, work) {
                failed.set(true);
            }
        };
        let sched_stream = self.sched_streams.of(stream);
        // Work the gate never holds goes to the device first and is accounted
        // right after: the gate's bookkeeping stays off the kernel's start.
        let mut work = Some(work);
        if gate.never_held() {
            work.take().map(queue);
        }
        // While it waits, what the session already queued must be able to finish.
        let admitted = gate.admit(sched_stream, kernel_id, None, || {
            flush_signals(ordered, signals)
        });
        hop_trace::mark(Hop::Step, "admitted");
        match (admitted, signals.launch(stream)) {
            // The session ended while the launch waited: it is skipped (unless
            // it went first; then only its signal is left out).
            (Admission::Skip, _) => {
                if work.is_none() {
                    signals.note_work(stream);
                }
            }
            (Admission::Go(id, estimate), Some((slot, value))) => {
                work.take().map(queue);
                // Launches the gate expects to be long are signalled at once: their
                // completions must be seen on time for the charges to be right.
                let every = match estimate >= SIGNAL_EACH_FROM_NS {
                    true => 1,
                    false => self.signal_every,
                };
                hop_trace::mark(Hop::Step, "queued");
                if let Some((slot, value)) = signals.due(stream, every) {
                    ordered.enqueue(stream, StreamWork::Signal { slot, value });
                }
                gate.watch(id, signals.area(), slot, value);
                hop_trace::mark(Hop::Step, "watched");
            }
            // No slot left (not reachable: there are more than streams) or the
            // scheduler refused it: the launch runs, unscheduled.
            (Admission::Go(..), None) => {
                work.take().map(queue);
                signals.note_work(stream);
                gate.forget_in_flight();
            }
            (Admission::Ungated, _) => {
                work.take().map(queue);
                signals.note_work(stream);
            }
        }
    }

    /// A stream or event query against the device.
    pub(super) fn query(&self, target: SyncTarget, busy: &str) -> CallResult {
        match self.ordered()?.query(target) {
            Ok(true) => self.sync_result(),
            Ok(false) => Err(err(codes::NOT_READY, busy)),
            Err(e) => {
                self.core.fail(e);
                self.sync_result()
            }
        }
    }

    /// Queues a copy or memset: on `stream` without waiting, or (`None`) on the
    /// default stream, waiting for it as a synchronous call does.
    pub(super) fn submit(&mut self, stream: Option<Handle>, work: StreamWork) -> CallResult {
        let on = stream.unwrap_or(DEFAULT_STREAM);
        // Under a gate, copies and memsets are scheduled as launches are.
        let gated = self.gate.is_some() && self.signals.is_some();
        // Without signals (so without the gate's either) it is the stream
        // order's to run now.
        if stream.is_none() && self.signals.is_none() {
            let outcome = self.ordered()?.run_now(on, work);
            return self.waited(outcome);
        }
        self.ordered()?;
        self.queued_since_sync.set(true);
        match gated {
            true => self.gated(on, work),
            false => {
                if let Some(signals) = &mut self.signals {
                    signals.note_work(on);
                }
                self.enqueue(on, work);
            }
        }
        if stream.is_some() {
            return Ok(ReplyBody::Unit);
        }
        // A signal right behind it says when it is done.
        match gated {
            true => self.flush_signals(),
            false => {
                if let Some(signals) = &mut self.signals {
                    signals.launch(DEFAULT_STREAM);
                }
            }
        }
        self.synchronize(SyncTarget::Stream(DEFAULT_STREAM))
    }

    /// Queues ordering work (an event's record, a wait for one) on `stream`.
    pub(super) fn queue(&mut self, stream: Handle, work: StreamWork) -> CallResult {
        self.ordered()?;
        self.queued_since_sync.set(true);
        if let Some(signals) = &mut self.signals {
            signals.note_work(stream);
        }
        self.enqueue(stream, work);
        Ok(ReplyBody::Unit)
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
    /// last asked (the session's own failures, or the worker's error counter):
    /// two hand-offs fewer for a short kernel's wait. `None`: ask the worker.
    fn signalled_sync(&mut self, target: SyncTarget) -> Option<CallResult> {
        if self.enqueue_failed.get() || self.signal_wait.is_zero() {
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
