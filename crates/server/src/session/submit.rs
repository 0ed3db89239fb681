//! How a session's stream work reaches its one stream order. A launch is
//! checked against its kernel and the device's limits (the rules of
//! `cumux_protocol::launch_checks`, which the client applies at the call too),
//! then, like copies and ordering work, queued unwaited, or first let go by the
//! scheduling gate with a completion signal behind it.

use std::sync::atomic::Ordering;

use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::launch_checks::{check_params, LaunchLimits};
use cumux_protocol::{
    ClusterQuery, CuError, DevicePtr, GraphLaunch, Handle, ReplyBody, DEFAULT_STREAM,
};

use super::core::invalid_handle;
use super::signalling::{flush_signals, SIGNAL_EACH_FROM_NS, SIGNAL_EVERY};
use super::window::WINDOW_SIGNAL_EVERY;
use super::{stream_order, CallResult, Session};
use crate::device::socket_bytes::{self, FillBytes};
use crate::device::{KernelDesc, KernelLaunch, LaunchGeometry, ModuleId, StreamWork, SyncTarget};
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

    pub(super) fn launch(&mut self, stream: Handle, launch: GraphLaunch) -> CallResult {
        self.check_stream(stream)?;
        let checked = self.checked_launch(launch)?;
        hop_trace::mark(Hop::Step, "checked");
        self.submit_launch(stream, checked)
    }

    /// A launch checked against its kernel and the device's limits.
    pub(super) fn checked_launch(&self, launch: GraphLaunch) -> Result<KernelLaunch, CuError> {
        let f = self
            .functions
            .get(&launch.function)
            .ok_or_else(|| invalid_handle("function", launch.function))?;
        check_launch(&self.limits, f.module, f.index, &f.desc, launch)
    }

    /// `cuOccupancyMaxActiveClusters` or `cuOccupancyMaxPotentialClusterSize`
    /// for a launch of one of the session's kernels, asked of the device:
    /// its block and shared memory are checked as a launch's; its grid and
    /// cluster shape are the driver's to judge, as natively.
    pub(super) fn cluster_occupancy(&self, launch: GraphLaunch, query: ClusterQuery) -> CallResult {
        let f = self
            .functions
            .get(&launch.function)
            .ok_or_else(|| invalid_handle("function", launch.function))?;
        self.limits
            .check_shape([1; 3], launch.block, &f.desc.attrs)?;
        self.limits
            .check_shared(launch.shared_bytes, &f.desc.attrs)?;
        let geometry = LaunchGeometry {
            grid: launch.grid,
            block: launch.block,
            dynamic_shared_bytes: launch.shared_bytes,
            attributes: launch.attributes,
        };
        let n = self
            .ctx
            .cluster_occupancy(f.module, f.index, &geometry, query)?;
        Ok(ReplyBody::Value(n.max(0) as u64))
    }

    /// Queues a checked launch on `stream`.
    pub(super) fn submit_launch(&mut self, stream: Handle, launch: KernelLaunch) -> CallResult {
        // The count is exact; the device time is measured only where the
        // server's own threads run the kernel (`launch_meter`).
        self.core.stats.launches.fetch_add(1, Ordering::Relaxed);
        if let Some(hold) = &self.account {
            hold.account().record_launch(0);
        }
        self.launch_work(stream, StreamWork::Launch(launch))
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
        // Covered by a signal every few launches (for the watchdog's sake
        // every SIGNAL_EVERY), the rest when the session next synchronizes.
        let Some(signals) = &mut self.signals else {
            return Ok(ReplyBody::Unit);
        };
        let Some((slot, value)) = signals.launch(stream) else {
            signals.note_work(stream);
            return Ok(ReplyBody::Unit);
        };
        let every = match self.watched {
            true => SIGNAL_EVERY,
            false => WINDOW_SIGNAL_EVERY,
        };
        if let Some((slot, value)) = signals.due(stream, every) {
            self.enqueue(stream, StreamWork::Signal { slot, value });
        }
        self.hold_to_window(stream, slot, value);
        Ok(ReplyBody::Unit)
    }

    /// Hands `work` to the stream order; a failure to queue it waits there for
    /// the next synchronize, which must then ask the device.
    pub(super) fn enqueue(&self, stream: Handle, work: StreamWork) {
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
        // The gate may wait for this session's own work to finish.
        self.send_held();
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
        let asked = std::time::Instant::now();
        let admitted = gate.admit(sched_stream, kernel_id, None, || {
            flush_signals(ordered, signals)
        });
        if let Some(hold) = &self.account {
            let waited = asked.elapsed().as_nanos() as u64;
            let counters = hold.account().counters();
            counters.gate_wait_ns.fetch_add(waited, Ordering::Relaxed);
        }
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

    /// [`Session::submit`] of a write of the `len` bytes `fill` yields,
    /// taken in place where the stream order can (not under a gate that
    /// watches signals: that one queues buffered work).
    pub(super) fn submit_filled(
        &mut self,
        stream: Option<Handle>,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> CallResult {
        let on = stream.unwrap_or(DEFAULT_STREAM);
        if self.gate.is_some() && self.signals.is_some() {
            let data = socket_bytes::gathered(len, fill)?;
            return self.submit(stream, StreamWork::Write { dst, data });
        }
        if stream.is_none() && self.signals.is_none() {
            let outcome = self.ordered()?.run_now_filled(on, dst, len, fill);
            return self.waited(outcome);
        }
        self.ordered()?;
        self.queued_since_sync.set(true);
        if let Some(signals) = &mut self.signals {
            signals.note_work(on);
        }
        let queued = self
            .ordered()
            .is_ok_and(|o| o.enqueue_filled(on, dst, len, fill));
        if !queued {
            self.enqueue_failed.set(true);
        }
        if stream.is_some() {
            return Ok(ReplyBody::Unit);
        }
        if let Some(signals) = &mut self.signals {
            signals.launch(DEFAULT_STREAM);
        }
        self.synchronize(SyncTarget::Stream(DEFAULT_STREAM))
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
}

/// Checks `launch` of kernel `desc` (index `kernel` of device module `module`)
/// against the kernel and the device's `limits`.
fn check_launch(
    limits: &LaunchLimits,
    module: ModuleId,
    kernel: usize,
    desc: &KernelDesc,
    launch: GraphLaunch,
) -> Result<KernelLaunch, CuError> {
    let GraphLaunch {
        function: _,
        grid,
        block,
        shared_bytes,
        params,
        attributes,
    } = launch;
    limits.check_shape(grid, block, &desc.attrs)?;
    limits.check_shared(shared_bytes, &desc.attrs)?;
    check_params(&desc.name, &desc.params, params.len())?;
    limits.check_attributes(&attributes, grid)?;
    Ok(KernelLaunch {
        module,
        kernel,
        geometry: LaunchGeometry {
            grid,
            block,
            dynamic_shared_bytes: shared_bytes,
            attributes,
        },
        params,
    })
}
