//! [`SerialStreams`]: stream semantics over any synchronous [`DeviceContext`],
//! running each piece of work as it arrives (a worker process serving the CPU device).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use cumux_protocol::{codes, CuError, DevicePtr, Handle, DEFAULT_STREAM};

use super::ordering::{
    elapsed_ms, launches_only, no_signal_area, store_signal, unknown, EVENT_DISABLE_TIMING,
};
use super::{DeviceContext, FillBytes, LaunchOutcome, StreamOrdered, StreamWork, SyncTarget};
use crate::locking::lock;

/// Runs stream-ordered work at once, in arrival order: every stream is always
/// idle, an event's time is when its record arrived. Correct for any program
/// that does not need two streams to run at the same time, which CUDA never
/// promises either.
pub struct SerialStreams {
    ctx: Arc<dyn DeviceContext>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    streams: HashSet<Handle>,
    /// Flags and the time of the latest record.
    events: HashMap<Handle, (u32, Option<Instant>)>,
    /// The first failure of queued work, for the next waiting call.
    pending: Option<CuError>,
    stdout: Vec<u8>,
    /// Graphs' launches, run in order when the graph is.
    graphs: HashMap<Handle, Arc<Vec<StreamWork>>>,
}

impl SerialStreams {
    pub fn new(ctx: Arc<dyn DeviceContext>) -> Self {
        SerialStreams {
            ctx,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn check_stream(&self, stream: Handle) -> Result<(), CuError> {
        if stream == DEFAULT_STREAM || self.lock().streams.contains(&stream) {
            Ok(())
        } else {
            Err(unknown("stream", stream))
        }
    }

    fn run(&self, work: StreamWork) -> Result<(), CuError> {
        match work {
            StreamWork::Write { dst, data } => self.ctx.mem_write(dst, &data),
            // Earlier work has run: this one is done at once.
            StreamWork::SignalTo { area, slot, value } => store_signal(&area, slot, value),
            StreamWork::Signal { .. } => Err(no_signal_area()),
            // Left out after a failure or printf: the next wait must ask.
            StreamWork::Mark { host, value, .. } => {
                let news = {
                    let state = self.lock();
                    state.pending.is_some() || !state.stdout.is_empty()
                };
                match news {
                    true => Ok(()),
                    false => host.store_mark(value),
                }
            }
            StreamWork::Copy { dst, src, bytes } => self.ctx.mem_copy(dst, src, bytes),
            StreamWork::Fill(fill) => {
                fill.each_row(|row| self.ctx.mem_fill(row, &fill.pattern, fill.count))
            }
            StreamWork::Launch(launch) => {
                let outcome = self.ctx.launch(&launch);
                self.lock().stdout.extend_from_slice(&outcome.stdout);
                outcome.result
            }
            StreamWork::Record { event } => match self.lock().events.get_mut(&event) {
                Some((_, time)) => {
                    *time = Some(Instant::now());
                    Ok(())
                }
                None => Err(unknown("event", event)),
            },
            StreamWork::Wait { event } => match self.lock().events.contains_key(&event) {
                true => Ok(()),
                false => Err(unknown("event", event)),
            },
            StreamWork::HostToDevice { dst, host } => self.ctx.mem_write(dst, host.read()?),
            StreamWork::DeviceToHost { src, host } => {
                // SAFETY: work runs one piece at a time here, so nothing else of
                // this process touches the span meanwhile.
                self.ctx.mem_read(src, unsafe { host.write()? })
            }
            StreamWork::Graph { graph } => {
                let launches = self.lock().graphs.get(&graph).cloned();
                let launches = launches.ok_or_else(|| unknown("graph", graph))?;
                launches.iter().try_for_each(|l| self.run(l.clone()))
            }
        }
    }

    /// Hands out what queued work printed and its first failure.
    fn outcome(&self, result: Result<(), CuError>) -> LaunchOutcome {
        let mut state = self.lock();
        let result = match state.pending.take() {
            Some(e) => Err(e),
            None => result,
        };
        LaunchOutcome {
            stdout: std::mem::take(&mut state.stdout),
            result,
        }
    }

    /// Whether queued work went in; a failure is kept for the next
    /// waiting call.
    fn queued(&self, result: Result<(), CuError>) -> bool {
        match result {
            Ok(()) => true,
            Err(e) => {
                self.lock().pending.get_or_insert(e);
                false
            }
        }
    }
}

impl StreamOrdered for SerialStreams {
    fn stream_create(&self, stream: Handle, _flags: u32, _priority: i32) -> Result<(), CuError> {
        if stream == DEFAULT_STREAM || !self.lock().streams.insert(stream) {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("stream {stream:#x} exists"),
            ));
        }
        Ok(())
    }

    fn stream_destroy(&self, stream: Handle) -> Result<(), CuError> {
        match self.lock().streams.remove(&stream) {
            true => Ok(()),
            false => Err(unknown("stream", stream)),
        }
    }

    fn event_create(&self, event: Handle, flags: u32) -> Result<(), CuError> {
        let mut state = self.lock();
        if state.events.contains_key(&event) {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("event {event:#x} exists"),
            ));
        }
        state.events.insert(event, (flags, None));
        Ok(())
    }

    fn event_destroy(&self, event: Handle) -> Result<(), CuError> {
        match self.lock().events.remove(&event) {
            Some(_) => Ok(()),
            None => Err(unknown("event", event)),
        }
    }

    fn graph_create(&self, graph: Handle, launches: Vec<StreamWork>) -> Result<(), CuError> {
        launches_only(&launches)?;
        self.lock().graphs.insert(graph, Arc::new(launches));
        Ok(())
    }

    fn graph_destroy(&self, graph: Handle) {
        self.lock().graphs.remove(&graph);
    }

    fn enqueue(&self, stream: Handle, work: StreamWork) -> bool {
        let result = self.check_stream(stream).and_then(|()| self.run(work));
        self.queued(result)
    }

    /// Written at once, in place where the context can.
    fn enqueue_filled(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> bool {
        let result = self
            .check_stream(stream)
            .and_then(|()| self.ctx.mem_write_filled(dst, len, fill));
        self.queued(result)
    }

    fn read(&self, stream: Handle, src: DevicePtr, buf: &mut [u8]) -> LaunchOutcome {
        let result = self
            .check_stream(stream)
            .and_then(|()| self.ctx.mem_read(src, buf));
        self.outcome(result)
    }

    fn synchronize(&self, target: SyncTarget) -> LaunchOutcome {
        let result = match target {
            SyncTarget::Stream(s) => self.check_stream(s),
            SyncTarget::Event(e) => match self.lock().events.contains_key(&e) {
                true => Ok(()),
                false => Err(unknown("event", e)),
            },
            SyncTarget::Context => Ok(()),
        };
        self.outcome(result)
    }

    fn query(&self, target: SyncTarget) -> Result<bool, CuError> {
        let outcome = self.synchronize(target);
        if !outcome.stdout.is_empty() {
            // Not a flushing call: keep the text for the next one.
            self.lock().stdout.splice(0..0, outcome.stdout);
        }
        outcome.result.map(|()| true)
    }

    fn elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, CuError> {
        let state = self.lock();
        let get = |e: Handle| {
            state
                .events
                .get(&e)
                .copied()
                .ok_or_else(|| unknown("event", e))
        };
        let ((f0, t0), (f1, t1)) = (get(start)?, get(end)?);
        if (f0 | f1) & EVENT_DISABLE_TIMING != 0 {
            return Err(CuError::new(
                codes::INVALID_HANDLE,
                "event created with timing disabled",
            ));
        }
        match (t0, t1) {
            (Some(t0), Some(t1)) => Ok(elapsed_ms(t0, t1)),
            _ => Err(CuError::new(
                codes::INVALID_HANDLE,
                "event was never recorded",
            )),
        }
    }
}
