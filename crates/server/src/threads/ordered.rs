//! [`ThreadedStreams`]: CUDA stream semantics over any synchronous [`DeviceContext`]
//! (the in-process CPU device), with a thread per stream so streams run side by
//! side; events are timestamps their streams' threads take. Under a scheduling
//! gate each thread asks it before it runs a piece of work.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, LazyLock, Mutex, Weak};
use std::time::Instant;

use cumux_protocol::{codes, CuError, DevicePtr, Handle, DEFAULT_STREAM};

use super::workers::{Position, Streams, Tracker, Work};
use crate::device::ipc_table::HandleTable;
use crate::device::ordering::{
    append_printf, elapsed_ms, launches_only, no_signal_area, not_a_launch, store_signal, unknown,
    EVENT_DISABLE_TIMING, MAX_STDOUT_BYTES,
};
use crate::device::signals::SignalArea;
use crate::device::socket_bytes::{FillBytes, SendBytes};
use crate::device::{
    DeviceContext, KernelLaunch, LaunchOutcome, StreamOrdered, StreamWork, SyncTarget,
};
use crate::gate::{kernel_id_of, GateSession, SchedStreams, READ_KERNEL_ID, WRITE_KERNEL_ID};
use crate::locking::lock;

/// Payload bytes (async copies, launch parameters) the streams may hold in their
/// queues; past it, queueing more first waits for the streams to drain.
pub const MAX_QUEUED_BYTES: u64 = 1 << 30;

/// Told the device time of every launch the streams run, in nanoseconds.
pub type LaunchMeter = Box<dyn Fn(u64) + Send + Sync>;

/// What the streams' threads share with the caller.
struct Shared {
    ctx: Arc<dyn DeviceContext>,
    /// The first failure of queued work, for the next waiting call.
    pending: Mutex<Option<CuError>>,
    /// A fatal failure happened: later work is skipped, as on a dead context.
    dead: AtomicBool,
    /// Set by [`StreamOrdered::cancel_queued`]: queued work is skipped.
    cancelled: AtomicBool,
    stdout: Mutex<Vec<u8>>,
    queued_bytes: AtomicU64,
    signals: Mutex<Option<Arc<SignalArea>>>,
    meter: Option<LaunchMeter>,
    /// The session's place at the device's scheduling gate, if any.
    gate: Option<Arc<GateSession>>,
}

impl Shared {
    fn skips_work(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed) || self.dead.load(Ordering::Relaxed)
    }

    fn fail(&self, err: CuError) {
        if codes::is_fatal(err.code) {
            self.dead.store(true, Ordering::Relaxed);
        }
        lock(&self.pending).get_or_insert(err);
    }

    fn append_stdout(&self, bytes: &[u8]) {
        if !append_printf(&mut lock(&self.stdout), bytes) {
            tracing::warn!("device printf output over {MAX_STDOUT_BYTES} bytes dropped");
        }
    }

    /// Runs one launch, timing it for the meter.
    fn launch(&self, launch: &KernelLaunch) -> Result<(), CuError> {
        let started = Instant::now();
        let outcome = self.ctx.launch(launch);
        if let Some(meter) = &self.meter {
            meter(started.elapsed().as_nanos().min(u64::MAX as u128) as u64);
        }
        self.append_stdout(&outcome.stdout);
        outcome.result
    }

    /// Runs one piece of device work on the calling (stream) thread.
    fn run(&self, work: &StreamWork, graph: Option<&[StreamWork]>) -> Result<(), CuError> {
        let ctx = self.ctx.as_ref();
        match work {
            StreamWork::Write { dst, data } => ctx.mem_write(*dst, data),
            StreamWork::Copy { dst, src, bytes } => ctx.mem_copy(*dst, *src, *bytes),
            StreamWork::Fill(fill) => {
                fill.each_row(|row| ctx.mem_fill(row, &fill.pattern, fill.count))
            }
            StreamWork::Launch(launch) => self.launch(launch),
            StreamWork::HostToDevice { dst, host } => ctx.mem_write(*dst, host.read()?),
            // SAFETY: the job runs in its stream's order, apart from the
            // program's other copies into the span.
            StreamWork::DeviceToHost { src, host } => ctx.mem_read(*src, unsafe { host.write()? }),
            StreamWork::Graph { graph: handle } => match graph {
                Some(launches) => launches.iter().try_for_each(|l| match l {
                    StreamWork::Launch(launch) => self.launch(launch),
                    _ => Err(not_a_launch()),
                }),
                None => Err(unknown("graph", *handle)),
            },
            StreamWork::Signal { slot, value } => {
                let area = lock(&self.signals).clone();
                match area {
                    Some(area) => store_signal(&area, *slot, *value),
                    None => Err(no_signal_area()),
                }
            }
            StreamWork::SignalTo { area, slot, value } => store_signal(area, *slot, *value),
            // Left out after a failure or printf: the next wait must ask.
            StreamWork::Mark { host, value, .. } => {
                match lock(&self.pending).is_some() || !lock(&self.stdout).is_empty() {
                    true => Ok(()),
                    false => host.store_mark(*value),
                }
            }
            // Ordering work: handled when queued.
            StreamWork::Record { .. } | StreamWork::Wait { .. } => Ok(()),
        }
    }

    /// `run` once the gate lets it go (named `kernel` on scheduler stream
    /// `stream`); not at all if the session ends while it waits.
    fn gated<R>(
        &self,
        stream: Option<cumux_scheduler::StreamId>,
        kernel: Option<cumux_scheduler::KernelId>,
        run: impl FnOnce() -> R,
    ) -> Option<R> {
        match (&self.gate, stream, kernel) {
            (Some(gate), Some(stream), Some(kernel)) => gate.run(stream, kernel, None, run),
            _ => Some(run()),
        }
    }

    /// [`run`](Self::run), skipped once the context is dead or the work cancelled,
    /// its failure (or panic) kept for the next waiting call.
    fn run_guarded(
        &self,
        work: &StreamWork,
        graph: Option<&[StreamWork]>,
        sched_stream: Option<cumux_scheduler::StreamId>,
    ) {
        if self.skips_work() {
            return;
        }
        let result = self.gated(sched_stream, kernel_id_of(work), || {
            catch_unwind(AssertUnwindSafe(|| self.run(work, graph)))
                .unwrap_or_else(|_| Err(CuError::new(codes::LAUNCH_FAILED, "the device panicked")))
        });
        if let Some(Err(e)) = result {
            self.fail(e);
        }
    }

    /// Reads device memory, once the gate lets it go.
    fn read(
        &self,
        src: DevicePtr,
        buf: &mut [u8],
        sched_stream: Option<cumux_scheduler::StreamId>,
    ) -> Result<(), CuError> {
        let skipped = || Err(CuError::new(codes::UNKNOWN, "the copy did not run"));
        if self.skips_work() {
            return skipped();
        }
        let read = || {
            catch_unwind(AssertUnwindSafe(|| self.ctx.mem_read(src, buf)))
                .unwrap_or_else(|_| Err(CuError::new(codes::UNKNOWN, "the device panicked")))
        };
        self.gated(sched_stream, Some(READ_KERNEL_ID), read)
            .unwrap_or_else(skipped)
    }

    /// What waiting calls hand back: the printf output so far and the first failure.
    fn outcome(&self, result: Result<(), CuError>) -> LaunchOutcome {
        let result = match lock(&self.pending).take() {
            Some(e) => Err(e),
            None => result,
        };
        LaunchOutcome {
            stdout: std::mem::take(&mut *lock(&self.stdout)),
            result,
        }
    }
}

/// One event: its flags, and where and when its latest record ran.
struct Event {
    flags: u32,
    state: Mutex<EventState>,
}

#[derive(Default)]
struct EventState {
    /// Where the latest record is, if ever recorded.
    recorded: Option<Recorded>,
    /// Bumped per record, so a stale record's job leaves the time alone.
    generation: u64,
    time: Option<Instant>,
}

/// Where an event's latest record is: a position in the streams of the
/// session that recorded it (another program's, for an event it shared,
/// [`StreamOrdered::event_open_ipc`]).
#[derive(Clone)]
struct Recorded {
    pos: Position,
    tracker: Arc<Tracker>,
}

impl Recorded {
    fn is_done(&self) -> bool {
        self.tracker.is_done(self.pos)
    }

    /// Whether the record is in the streams `tracker` follows.
    fn is_in(&self, tracker: &Arc<Tracker>) -> bool {
        Arc::ptr_eq(&self.tracker, tracker)
    }
}

/// The events of this process's sessions that were given a handle
/// (`cuIpcGetEventHandle`), for another session to open: one table for the
/// process, as a context's streams know no device.
static OPENABLE_EVENTS: LazyLock<HandleTable<Weak<Event>>> = LazyLock::new(HandleTable::default);

/// Stream-ordered work over a synchronous context: each stream's work runs on a
/// thread of its own, in order; the legacy default stream and event waits order
/// work across streams. A failure of queued work, and device printf output, come
/// back from the next waiting call.
pub struct ThreadedStreams {
    shared: Arc<Shared>,
    streams: Mutex<Streams>,
    /// The gate's names of the streams (with a gate only).
    sched_streams: Mutex<SchedStreams>,
    events: Mutex<HashMap<Handle, Arc<Event>>>,
    graphs: Mutex<HashMap<Handle, Arc<Vec<StreamWork>>>>,
}

impl ThreadedStreams {
    /// Streams over `ctx`, starting with the default stream; `label` names their
    /// threads (the session), `meter` is told each launch's time, and `gate` (the
    /// session's place at the device's gate) lets each piece of work go.
    pub fn new(
        ctx: Arc<dyn DeviceContext>,
        label: u64,
        meter: Option<LaunchMeter>,
        gate: Option<Arc<GateSession>>,
    ) -> Result<Self, CuError> {
        let streams = Streams::new(label).map_err(|e| {
            CuError::new(
                codes::OUT_OF_MEMORY,
                format!("cannot start a stream thread: {e}"),
            )
        })?;
        Ok(ThreadedStreams {
            shared: Arc::new(Shared {
                ctx,
                pending: Mutex::new(None),
                dead: AtomicBool::new(false),
                cancelled: AtomicBool::new(false),
                stdout: Mutex::new(Vec::new()),
                queued_bytes: AtomicU64::new(0),
                signals: Mutex::new(None),
                meter,
                gate,
            }),
            streams: Mutex::new(streams),
            sched_streams: Mutex::new(SchedStreams::default()),
            events: Mutex::new(HashMap::new()),
            graphs: Mutex::new(HashMap::new()),
        })
    }

    /// The gate's name of `stream`, where there is a gate.
    fn sched_stream(&self, stream: Handle) -> Option<cumux_scheduler::StreamId> {
        self.shared.gate.as_ref()?;
        Some(lock(&self.sched_streams).of(stream))
    }

    fn event(&self, event: Handle) -> Result<Arc<Event>, CuError> {
        lock(&self.events)
            .get(&event)
            .cloned()
            .ok_or_else(|| unknown("event", event))
    }

    /// Queues `job` on `stream` after `deps`; a failure to queue is kept.
    fn push(&self, streams: &mut Streams, stream: Handle, deps: Vec<Position>, job: Work) -> bool {
        match streams.enqueue(stream, deps, job) {
            Some(_) => true,
            None => {
                self.shared.fail(unknown("stream", stream));
                false
            }
        }
    }

    /// Payload bytes `work` holds while queued.
    fn payload(work: &StreamWork) -> u64 {
        match work {
            StreamWork::Write { data, .. } => data.len() as u64,
            StreamWork::Launch(launch) => launch.params.len() as u64,
            _ => 0,
        }
    }

    fn record(&self, streams: &mut Streams, stream: Handle, event: Handle) -> bool {
        let Ok(event) = self.event(event) else {
            self.shared.fail(unknown("event", event));
            return false;
        };
        let generation = {
            let mut state = lock(&event.state);
            state.generation += 1;
            state.generation
        };
        let target = Arc::clone(&event);
        let job: Work = Box::new(move || {
            let now = Instant::now();
            let mut state = lock(&target.state);
            if state.generation == generation {
                state.time = Some(now);
            }
        });
        let Some(pos) = streams.enqueue(stream, Vec::new(), job) else {
            self.shared.fail(unknown("stream", stream));
            return false;
        };
        let mut state = lock(&event.state);
        if state.generation == generation {
            state.recorded = Some(Recorded {
                pos,
                tracker: Arc::clone(streams.tracker()),
            });
        }
        true
    }

    /// Writes the `len` bytes `fill` yields at `dst` now, on this thread,
    /// once the gate lets it go (the caller found `stream` ready).
    fn write_in_place(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> Result<(), CuError> {
        let shared = &self.shared;
        let write = || {
            catch_unwind(AssertUnwindSafe(|| {
                shared.ctx.mem_write_filled(dst, len, fill)
            }))
            .unwrap_or_else(|_| Err(CuError::new(codes::LAUNCH_FAILED, "the device panicked")))
        };
        shared
            .gated(self.sched_stream(stream), Some(WRITE_KERNEL_ID), write)
            .unwrap_or_else(|| Err(CuError::new(codes::UNKNOWN, "the copy did not run")))
    }

    /// Whether `target` is done now.
    fn done(&self, target: SyncTarget) -> Result<bool, CuError> {
        let streams = lock(&self.streams);
        match target {
            SyncTarget::Stream(s) if !streams.contains(s) => Err(unknown("stream", s)),
            SyncTarget::Stream(DEFAULT_STREAM) => Ok(streams.ready(DEFAULT_STREAM)),
            SyncTarget::Stream(s) => Ok(streams.is_idle(s)),
            SyncTarget::Event(e) => {
                let recorded = lock(&self.event(e)?.state).recorded.clone();
                Ok(recorded.is_none_or(|r| r.is_done()))
            }
            SyncTarget::Context => Ok(false),
        }
    }
}

impl StreamOrdered for ThreadedStreams {
    fn stream_create(&self, stream: Handle, flags: u32, _priority: i32) -> Result<(), CuError> {
        let mut streams = lock(&self.streams);
        if streams.contains(stream) {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("stream {stream:#x} exists"),
            ));
        }
        streams.create(stream, flags).map_err(|e| {
            CuError::new(
                codes::OUT_OF_MEMORY,
                format!("cannot start a stream thread: {e}"),
            )
        })
    }

    fn stream_destroy(&self, stream: Handle) -> Result<(), CuError> {
        lock(&self.sched_streams).forget(stream);
        match lock(&self.streams).destroy(stream) {
            true => Ok(()),
            false => Err(unknown("stream", stream)),
        }
    }

    fn event_create(&self, event: Handle, flags: u32) -> Result<(), CuError> {
        let mut events = lock(&self.events);
        if events.contains_key(&event) {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("event {event:#x} exists"),
            ));
        }
        let state = Mutex::new(EventState::default());
        events.insert(event, Arc::new(Event { flags, state }));
        Ok(())
    }

    /// A handle another session of this process opens as the same event.
    fn event_ipc_handle(&self, event: Handle) -> Result<Vec<u8>, CuError> {
        OPENABLE_EVENTS.issue(Arc::downgrade(&self.event(event)?))
    }

    /// Opens the event `handle` names as `event` of this session: its records
    /// here and in the exporter's session are one event's.
    fn event_open_ipc(&self, event: Handle, handle: &[u8]) -> Result<(), CuError> {
        let shared = OPENABLE_EVENTS
            .find(handle)
            .and_then(|weak| weak.upgrade())
            .ok_or_else(|| {
                CuError::new(
                    codes::INVALID_VALUE,
                    "the handle names no live event of this process",
                )
            })?;
        let mut events = lock(&self.events);
        if events.contains_key(&event) {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("event {event:#x} exists"),
            ));
        }
        events.insert(event, shared);
        Ok(())
    }

    fn event_destroy(&self, event: Handle) -> Result<(), CuError> {
        match lock(&self.events).remove(&event) {
            Some(_) => Ok(()),
            None => Err(unknown("event", event)),
        }
    }

    fn enqueue(&self, stream: Handle, work: StreamWork) -> bool {
        let mut streams = lock(&self.streams);
        match work {
            StreamWork::Record { event } => return self.record(&mut streams, stream, event),
            StreamWork::Wait { event } => {
                let recorded = match self.event(event) {
                    Ok(e) => lock(&e.state).recorded.clone(),
                    Err(e) => {
                        self.shared.fail(e);
                        return false;
                    }
                };
                let (deps, job): (Vec<Position>, Work) = match recorded {
                    None => (Vec::new(), Box::new(|| {})),
                    Some(r) if r.is_in(streams.tracker()) => (vec![r.pos], Box::new(|| {})),
                    // Another session's record: the stream's thread waits for
                    // it, unless this session's work is dropped meanwhile.
                    Some(r) => {
                        let shared = Arc::clone(&self.shared);
                        let wait = move || r.tracker.wait_unless(&[r.pos], || shared.skips_work());
                        (Vec::new(), Box::new(wait))
                    }
                };
                return self.push(&mut streams, stream, deps, job);
            }
            _ => {}
        }
        let graph = match &work {
            StreamWork::Graph { graph } => lock(&self.graphs).get(graph).cloned(),
            _ => None,
        };
        let bytes = Self::payload(&work);
        let queued = &self.shared.queued_bytes;
        if queued.load(Ordering::Acquire).saturating_add(bytes) > MAX_QUEUED_BYTES {
            streams.synchronize_all();
        }
        queued.fetch_add(bytes, Ordering::AcqRel);
        let shared = Arc::clone(&self.shared);
        let sched_stream = self.sched_stream(stream);
        let job: Work = Box::new(move || {
            shared.run_guarded(&work, graph.as_deref().map(Vec::as_slice), sched_stream);
            shared.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
        });
        self.push(&mut streams, stream, Vec::new(), job)
    }

    fn run_now(&self, stream: Handle, work: StreamWork) -> LaunchOutcome {
        // Nothing it is ordered after is pending: it runs right here, sparing
        // two thread hops.
        let ready = {
            let streams = lock(&self.streams);
            streams.ready(stream)
        };
        if !ready || matches!(work, StreamWork::Record { .. } | StreamWork::Wait { .. }) {
            self.enqueue(stream, work);
            return self.synchronize(SyncTarget::Stream(stream));
        }
        let graph = match &work {
            StreamWork::Graph { graph } => lock(&self.graphs).get(graph).cloned(),
            _ => None,
        };
        let sched_stream = self.sched_stream(stream);
        self.shared
            .run_guarded(&work, graph.as_deref().map(Vec::as_slice), sched_stream);
        self.shared.outcome(Ok(()))
    }

    /// In place when nothing it is ordered after is pending: the bytes go
    /// from the socket straight into the context's memory, on this thread.
    fn run_now_filled(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> LaunchOutcome {
        let shared = &self.shared;
        let ready = lock(&self.streams).ready(stream);
        if !ready || shared.skips_work() {
            return self.run_now_buffered(stream, dst, len, fill);
        }
        let result = self.write_in_place(stream, dst, len, fill);
        shared.outcome(result)
    }

    /// In place when the stream is idle (the work would run at once): on
    /// this thread, straight from the socket into the context's memory.
    fn enqueue_filled(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> bool {
        let shared = &self.shared;
        let ready = lock(&self.streams).ready(stream);
        if !ready || shared.skips_work() {
            return self.enqueue_buffered(stream, dst, len, fill);
        }
        match self.write_in_place(stream, dst, len, fill) {
            Ok(()) => true,
            Err(e) => {
                shared.fail(e);
                false
            }
        }
    }

    /// From where the bytes lie when the stream is idle and no failure of
    /// earlier work waits to be told (which would follow the bytes sent).
    fn read_sent(
        &self,
        stream: Handle,
        src: DevicePtr,
        len: usize,
        send: &mut dyn SendBytes,
    ) -> LaunchOutcome {
        let shared = &self.shared;
        let ready = lock(&self.streams).ready(stream);
        let pending = lock(&shared.pending).is_some();
        if !ready || pending || shared.skips_work() {
            return self.read_sent_buffered(stream, src, len, send);
        }
        let read = || {
            catch_unwind(AssertUnwindSafe(|| {
                shared.ctx.mem_read_sent(src, len, send)
            }))
            .unwrap_or_else(|_| Err(CuError::new(codes::UNKNOWN, "the device panicked")))
        };
        let result = shared
            .gated(self.sched_stream(stream), Some(READ_KERNEL_ID), read)
            .unwrap_or_else(|| Err(CuError::new(codes::UNKNOWN, "the copy did not run")));
        LaunchOutcome {
            stdout: std::mem::take(&mut *lock(&shared.stdout)),
            result,
        }
    }

    fn read(&self, stream: Handle, src: DevicePtr, buf: &mut [u8]) -> LaunchOutcome {
        let (ready, known) = {
            let streams = lock(&self.streams);
            (streams.ready(stream), streams.contains(stream))
        };
        if !known {
            return self.shared.outcome(Err(unknown("stream", stream)));
        }
        let shared = &self.shared;
        let sched_stream = self.sched_stream(stream);
        if ready {
            let result = shared.read(src, buf, sched_stream);
            return shared.outcome(result);
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let len = buf.len();
        let job_shared = Arc::clone(shared);
        let job: Work = Box::new(move || {
            let mut data = vec![0u8; len];
            let result = job_shared.read(src, &mut data, sched_stream);
            let _ = tx.send(result.map(|()| data));
        });
        let pos = lock(&self.streams).enqueue(stream, Vec::new(), job);
        if let Some(pos) = pos {
            lock(&self.streams).tracker().wait(&[pos]);
        }
        let result = match rx.try_recv() {
            Ok(Ok(data)) => {
                buf.copy_from_slice(&data);
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            // The stream is gone (teardown): the job never ran.
            Err(_) => Err(CuError::new(codes::UNKNOWN, "the copy did not run")),
        };
        shared.outcome(result)
    }

    fn synchronize(&self, target: SyncTarget) -> LaunchOutcome {
        let result = (|| {
            let streams = lock(&self.streams);
            match target {
                SyncTarget::Stream(s) if !streams.contains(s) => return Err(unknown("stream", s)),
                SyncTarget::Stream(s) => streams.synchronize(s),
                SyncTarget::Event(e) => {
                    // Not under the event's lock: its record job takes it;
                    // nor the streams', for a record in another session's.
                    let recorded = lock(&self.event(e)?.state).recorded.clone();
                    drop(streams);
                    if let Some(r) = recorded {
                        r.tracker.wait_unless(&[r.pos], || self.shared.skips_work());
                    }
                }
                SyncTarget::Context => streams.synchronize_all(),
            }
            Ok(())
        })();
        self.shared.outcome(result)
    }

    fn query(&self, target: SyncTarget) -> Result<bool, CuError> {
        if !self.done(target)? {
            return Ok(false);
        }
        match lock(&self.shared.pending).take() {
            Some(e) => Err(e),
            None => Ok(true),
        }
    }

    fn elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, CuError> {
        let (start, end) = (self.event(start)?, self.event(end)?);
        if (start.flags | end.flags) & EVENT_DISABLE_TIMING != 0 {
            return Err(CuError::new(
                codes::INVALID_HANDLE,
                "event created with timing disabled",
            ));
        }
        let read = |e: &Event| {
            let state = lock(&e.state);
            (state.recorded.clone(), state.time)
        };
        let (start, end) = (read(&start), read(&end));
        let (Some(r0), Some(r1)) = (&start.0, &end.0) else {
            return Err(CuError::new(
                codes::INVALID_HANDLE,
                "event was never recorded",
            ));
        };
        if !r0.is_done() || !r1.is_done() {
            return Err(CuError::new(codes::NOT_READY, "event not reached yet"));
        }
        match (start.1, end.1) {
            (Some(t0), Some(t1)) => Ok(elapsed_ms(t0, t1)),
            _ => Err(CuError::new(codes::NOT_READY, "event has no timestamp")),
        }
    }

    fn attach_signals(&self, path: &std::path::Path) -> Result<(), CuError> {
        let area = SignalArea::open(path)?;
        *lock(&self.shared.signals) = Some(Arc::new(area));
        Ok(())
    }

    fn graph_create(&self, graph: Handle, launches: Vec<StreamWork>) -> Result<(), CuError> {
        launches_only(&launches)?;
        lock(&self.graphs).insert(graph, Arc::new(launches));
        Ok(())
    }

    fn graph_destroy(&self, graph: Handle) {
        lock(&self.graphs).remove(&graph);
    }

    fn cancel_queued(&self) {
        self.shared.cancelled.store(true, Ordering::Relaxed);
        // A kernel running on a stream thread stops, so the join below does
        // not wait for it.
        self.shared.ctx.cancel_launches();
        lock(&self.streams).shutdown();
    }
}

impl Drop for ThreadedStreams {
    fn drop(&mut self) {
        self.cancel_queued();
    }
}
