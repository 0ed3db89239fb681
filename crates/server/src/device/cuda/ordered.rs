//! The stream order of a [`CudaContext`] ([`StreamOrdered`]): the session's
//! streams and events as real CUDA streams and events, work queued on them
//! without waiting, graphs of launches captured once, completion signals
//! written by the device into the server's signal area.

use std::sync::Arc;

use cumux_cuda_driver::sys::{CU_MEMHOSTREGISTER_DEVICEMAP, CU_STREAM_NON_BLOCKING};
use cumux_cuda_driver::{self as cu, Event, HostRegistration, Stream};
use cumux_protocol::{codes, CuError, DevicePtr, Handle, DEFAULT_STREAM};

use super::context::CudaContext;
use super::convert::{cu_err, fill_of, memset};
use crate::device::host_span::HostSpan;
use crate::device::ordering::{launches_only, no_signal_area};
use crate::device::signals::SignalArea;
use crate::device::{
    socket_bytes, FillBytes, LaunchOutcome, StreamOrdered, StreamWork, SyncTarget,
};
use crate::locking::lock;

impl CudaContext {
    /// A session stream, the legacy default stream for [`DEFAULT_STREAM`].
    pub(super) fn ordered_stream(&self, stream: Handle) -> Result<Arc<Stream>, CuError> {
        let ctx = self.ctx()?;
        let mut state = lock(&self.ordered);
        if let Some(s) = state.streams.get(&stream) {
            return Ok(Arc::clone(s));
        }
        if stream != DEFAULT_STREAM {
            return Err(CuError::new(
                codes::INVALID_HANDLE,
                format!("unknown stream {stream:#x}"),
            ));
        }
        let legacy = Arc::new(Stream::legacy_default(ctx));
        state.streams.insert(DEFAULT_STREAM, Arc::clone(&legacy));
        Ok(legacy)
    }

    /// Where the calling thread's new streams and events go: a capped
    /// session's green context in a shared context, else this context.
    fn stream_home(&self) -> Result<Arc<cu::Context>, CuError> {
        let ctx = self.ctx()?;
        Ok(super::green_streams::stream_home().unwrap_or_else(|| Arc::clone(ctx)))
    }

    fn ordered_event(&self, event: Handle) -> Result<Arc<Event>, CuError> {
        lock(&self.ordered)
            .events
            .get(&event)
            .cloned()
            .ok_or_else(|| CuError::new(codes::INVALID_HANDLE, format!("unknown event {event:#x}")))
    }

    fn run_work(&self, stream: &Stream, work: StreamWork) -> Result<(), CuError> {
        match work {
            StreamWork::Write { dst, data } => {
                stream.copy_htod_pageable(dst, &data).map_err(cu_err)
            }
            StreamWork::Copy { dst, src, bytes } => {
                stream.copy_dtod(dst, src, bytes).map_err(cu_err)
            }
            StreamWork::Fill(fill) => {
                let pattern = fill_of(&fill.pattern)?;
                fill.each_row(|row| memset(stream, row, pattern, fill.count))
            }
            StreamWork::Launch(launch) => self.launch_on(stream, &launch),
            StreamWork::Record { event } => {
                self.ordered_event(event)?.record(stream).map_err(cu_err)
            }
            StreamWork::Wait { event } => stream
                .wait_event(&*self.ordered_event(event)?)
                .map_err(cu_err),
            StreamWork::SignalTo { area, slot, value } => {
                let addr = area.device_addr(slot).ok_or_else(|| {
                    CuError::new(codes::INVALID_VALUE, format!("signal slot {slot}"))
                })?;
                stream.write_value64(addr, value).map_err(cu_err)
            }
            StreamWork::Signal { .. } => Err(no_signal_area()),
            StreamWork::Mark { event, host, value } => self.mark(stream, event, &host, value),
            StreamWork::HostToDevice { dst, host } => {
                // SAFETY: the region stays mapped until it is unregistered, which
                // waits for the context's work first.
                unsafe { stream.copy_htod_async(dst, host.read()?) }.map_err(cu_err)
            }
            StreamWork::DeviceToHost { src, host } => {
                // SAFETY: as above; stream order keeps the program's copies
                // into one span apart.
                unsafe { stream.copy_dtoh_async(host.write()?, src) }.map_err(cu_err)
            }
            StreamWork::Graph { graph } => {
                let exec = lock(&self.ordered).graphs.get(&graph).cloned();
                let exec = exec.ok_or_else(|| {
                    CuError::new(codes::INVALID_HANDLE, format!("unknown graph {graph:#x}"))
                })?;
                stream.launch_graph(&exec).map_err(cu_err)
            }
        }
    }

    /// Queues the device's store of `value` into a client's mark once
    /// `event` is reached, on the context's mark stream (the event's own
    /// stream goes on with its next kernel meanwhile), or without an event
    /// on `stream` itself (a synchronize's mark: the program waits for that
    /// stream anyway); unless queued work failed already (the next wait
    /// must then ask) or the region is not mapped for the device (the
    /// client asks then too). Its worker leaves marks out once a module may
    /// print (`worker::process`).
    fn mark(
        &self,
        stream: &Stream,
        event: Option<Handle>,
        host: &HostSpan,
        value: u64,
    ) -> Result<(), CuError> {
        let (base, side) = {
            let ordered = lock(&self.ordered);
            if ordered.pending.is_some() {
                return Ok(());
            }
            (
                ordered.device_base(host.region),
                ordered.mark_stream.clone(),
            )
        };
        let Some(base) = base else {
            tracing::debug!(
                region = host.region,
                "cuda: a mark into an unmapped region left out"
            );
            return Ok(());
        };
        if host.bytes != 8 || !host.offset.is_multiple_of(8) || host.read().is_err() {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("{host:?} is not an aligned mark"),
            ));
        }
        let Some(event) = event else {
            return stream
                .write_value64(base + host.offset, value)
                .map_err(cu_err);
        };
        let side = match side {
            Some(side) => side,
            None => {
                let made = Arc::new(
                    Stream::new(&self.stream_home()?, CU_STREAM_NON_BLOCKING, 0).map_err(cu_err)?,
                );
                Arc::clone(lock(&self.ordered).mark_stream.get_or_insert(made))
            }
        };
        side.wait_event(&*self.ordered_event(event)?)
            .map_err(cu_err)?;
        side.write_value64(base + host.offset, value)
            .map_err(cu_err)
    }

    /// `result`, unless queued work failed first.
    fn with_pending(&self, result: Result<(), CuError>) -> Result<(), CuError> {
        match lock(&self.ordered).pending.take() {
            Some(e) => Err(e),
            None => result,
        }
    }
}

impl StreamOrdered for CudaContext {
    /// Captures the launches on a stream of its own into one CUDA graph.
    fn graph_create(&self, graph: Handle, launches: Vec<StreamWork>) -> Result<(), CuError> {
        launches_only(&launches)?;
        let home = self.stream_home()?;
        let stream = Stream::new(&home, CU_STREAM_NON_BLOCKING, 0).map_err(cu_err)?;
        let exec = stream.capture(
            |s| launches.into_iter().try_for_each(|l| self.run_work(s, l)),
            cu_err,
        )?;
        lock(&self.ordered).graphs.insert(graph, Arc::new(exec));
        Ok(())
    }

    fn graph_destroy(&self, graph: Handle) {
        lock(&self.ordered).graphs.remove(&graph);
    }

    fn stream_create(&self, stream: Handle, flags: u32, priority: i32) -> Result<(), CuError> {
        if stream == DEFAULT_STREAM || lock(&self.ordered).streams.contains_key(&stream) {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("stream {stream:#x} exists"),
            ));
        }
        // The driver clamps a priority outside the device's range.
        let home = self.stream_home()?;
        let created = Arc::new(Stream::new(&home, flags, priority).map_err(cu_err)?);
        lock(&self.ordered).streams.insert(stream, created);
        Ok(())
    }

    fn stream_destroy(&self, stream: Handle) -> Result<(), CuError> {
        // cuStreamDestroy lets queued work finish first, as the session expects.
        match lock(&self.ordered).streams.remove(&stream) {
            Some(_) if stream != DEFAULT_STREAM => Ok(()),
            _ => Err(CuError::new(
                codes::INVALID_HANDLE,
                format!("unknown stream {stream:#x}"),
            )),
        }
    }

    fn event_create(&self, event: Handle, flags: u32) -> Result<(), CuError> {
        // A stream records only events of its own context: a capped
        // session's events live where its streams do.
        let home = self.stream_home()?;
        let created = Arc::new(Event::new(&home, flags).map_err(cu_err)?);
        lock(&self.ordered).events.insert(event, created);
        Ok(())
    }

    fn event_ipc_handle(&self, event: Handle) -> Result<Vec<u8>, CuError> {
        let found = lock(&self.ordered).events.get(&event).cloned();
        let event = found.ok_or_else(|| {
            CuError::new(codes::INVALID_HANDLE, format!("unknown event {event:#x}"))
        })?;
        let handle = event.ipc_handle().map_err(cu_err)?;
        super::exported::note_event(handle, &event);
        Ok(handle.to_vec())
    }

    fn event_open_ipc(&self, event: Handle, handle: &[u8]) -> Result<(), CuError> {
        let handle: [u8; 64] = handle
            .try_into()
            .map_err(|_| CuError::new(codes::INVALID_VALUE, "an IPC handle is 64 bytes"))?;
        // Given out by this very process: the event itself.
        let opened = match super::exported::event(&handle) {
            Some(event) => event,
            None => Arc::new(Event::open_ipc(self.ctx()?, handle).map_err(cu_err)?),
        };
        lock(&self.ordered).events.insert(event, opened);
        Ok(())
    }

    fn event_destroy(&self, event: Handle) -> Result<(), CuError> {
        match lock(&self.ordered).events.remove(&event) {
            Some(_) => Ok(()),
            None => Err(CuError::new(
                codes::INVALID_HANDLE,
                format!("unknown event {event:#x}"),
            )),
        }
    }

    fn enqueue(&self, stream: Handle, work: StreamWork) -> bool {
        let result = self
            .ordered_stream(stream)
            .and_then(|s| self.run_work(&s, work));
        match result {
            Ok(()) => true,
            Err(e) => {
                lock(&self.ordered).pending.get_or_insert(e);
                false
            }
        }
    }

    /// Through the context's pinned staging buffers where they are free:
    /// one copy out of where the bytes lie, then DMA, where a buffered write
    /// makes two copies (into a buffer, then the driver's staging of
    /// pageable memory) before its DMA.
    fn enqueue_filled(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> bool {
        let result = self
            .ordered_stream(stream)
            .and_then(|s| self.staged_write(&s, dst, len, fill));
        match result {
            Ok(true) => true,
            Ok(false) => self.enqueue_buffered(stream, dst, len, fill),
            Err(e) => {
                lock(&self.ordered).pending.get_or_insert(e);
                false
            }
        }
    }

    fn run_now_filled(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> LaunchOutcome {
        if self.enqueue_filled(stream, dst, len, fill) {
            return self.synchronize(SyncTarget::Stream(stream));
        }
        // Not queued: the failure it left, else its bytes did not all come
        // (the buffered path's `fill` failed), never a success.
        let failed = Err(socket_bytes::not_arrived(std::io::Error::other(
            "the write was not queued",
        )));
        let result = self.with_pending(failed);
        self.outcome(result)
    }

    fn read(&self, stream: Handle, src: DevicePtr, buf: &mut [u8]) -> LaunchOutcome {
        let result = self.ordered_stream(stream).and_then(|s| {
            let (result, out) = s.copy_dtoh_sync(buf, src, self.capture());
            self.keep_stdout(out);
            result.map_err(cu_err)
        });
        let result = self.with_pending(result);
        self.outcome(result)
    }

    fn synchronize(&self, target: SyncTarget) -> LaunchOutcome {
        let result = match target {
            SyncTarget::Stream(s) => self.ordered_stream(s).and_then(|s| self.finish(&s)),
            SyncTarget::Event(e) => self
                .ordered_event(e)
                .and_then(|e| self.flushing(|| e.synchronize()).map_err(cu_err)),
            SyncTarget::Context => self
                .ctx()
                .and_then(|c| self.flushing(|| c.synchronize()).map_err(cu_err)),
        };
        let result = self.with_pending(result);
        self.outcome(result)
    }

    fn query(&self, target: SyncTarget) -> Result<bool, CuError> {
        let done = match target {
            SyncTarget::Stream(s) => self.ordered_stream(s)?.is_idle(),
            SyncTarget::Event(e) => self.ordered_event(e)?.is_done(),
            SyncTarget::Context => Ok(false),
        };
        let done = done.map_err(cu_err);
        match lock(&self.ordered).pending.take() {
            Some(e) => Err(e),
            None => done,
        }
    }

    fn elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, CuError> {
        let (start, end) = (self.ordered_event(start)?, self.ordered_event(end)?);
        start.elapsed_ms(&end).map_err(cu_err)
    }

    fn prepare_signals(&self, area: &Arc<SignalArea>) -> Result<(), CuError> {
        let (ptr, len) = area.host_range();
        // SAFETY: the registration is dropped by the area's drop hook, before the
        // area unmaps the range.
        let registration = unsafe {
            HostRegistration::new(
                self.ctx()?,
                ptr as *mut u8,
                len,
                CU_MEMHOSTREGISTER_DEVICEMAP,
            )
        }
        .map_err(cu_err)?;
        area.set_device_base(registration.device_ptr().map_err(cu_err)?);
        area.on_drop(Box::new(move || drop(registration)));
        Ok(())
    }
}
