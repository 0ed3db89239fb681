//! [`WorkerContext`] as a [`StreamOrdered`]: streams, events and graphs made
//! by round trips, queued work posted unanswered, waits and queries answered.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::{codes, encode, CuError, DevicePtr, Handle};

use super::{unexpected, WorkerContext};
use crate::device::ordering::not_a_launch;
use crate::device::signals::SignalArea;
use crate::device::socket_bytes::{self, FillBytes, SendBytes};
use crate::device::{LaunchOutcome, StreamOrdered, StreamWork, SyncTarget};
use crate::locking::lock;
use crate::worker::link::io_err;
use crate::worker::wire::{WireWork, WorkerReply, WorkerRequest, WorkerValue};

impl StreamOrdered for WorkerContext {
    /// Once it loaded a module that can print: the text of its launches
    /// waits in the worker, which hands it over with a wait's answer.
    fn printf_waiting(&self) -> bool {
        self.printing.load(Ordering::Acquire)
    }

    fn stream_create(&self, stream: Handle, flags: u32, priority: i32) -> Result<(), CuError> {
        let request = WorkerRequest::StreamCreate {
            stream,
            flags,
            priority,
        };
        self.unit(&request, &[])
    }

    fn stream_destroy(&self, stream: Handle) -> Result<(), CuError> {
        self.unit(&WorkerRequest::StreamDestroy { stream }, &[])
    }

    fn event_create(&self, event: Handle, flags: u32) -> Result<(), CuError> {
        self.unit(&WorkerRequest::EventCreate { event, flags }, &[])
    }

    fn event_destroy(&self, event: Handle) -> Result<(), CuError> {
        self.unit(&WorkerRequest::EventDestroy { event }, &[])
    }

    fn event_ipc_handle(&self, event: Handle) -> Result<Vec<u8>, CuError> {
        match self.call(&WorkerRequest::EventIpcHandle { event }, &[], None)? {
            WorkerValue::IpcHandle(handle) => Ok(handle),
            other => Err(unexpected(&other)),
        }
    }

    fn event_open_ipc(&self, event: Handle, handle: &[u8]) -> Result<(), CuError> {
        let request = WorkerRequest::EventOpenIpc {
            event,
            handle: handle.to_vec(),
        };
        self.unit(&request, &[])
    }

    /// A round trip behind the posted work: the worker answers in order.
    fn taken(&self) -> Result<(), CuError> {
        self.number(&WorkerRequest::ContextId).map(|_| ())
    }

    fn graph_create(&self, graph: Handle, launches: Vec<StreamWork>) -> Result<(), CuError> {
        let local = launches
            .into_iter()
            .map(|work| match work {
                StreamWork::Launch(launch) => self.local_launch(launch).map(WireWork::Launch),
                _ => Err(not_a_launch()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.unit(
            &WorkerRequest::GraphCreate {
                graph,
                launches: local,
            },
            &[],
        )
    }

    fn graph_destroy(&self, graph: Handle) {
        let _ = self.unit(&WorkerRequest::GraphDestroy { graph }, &[]);
    }

    /// Posts `work` (unanswered): false only for a launch of a module this
    /// context does not have (or a signal bound to an area of this process);
    /// what fails in the worker comes back later.
    fn enqueue(&self, stream: Handle, work: StreamWork) -> bool {
        if let StreamWork::Signal { slot, value } = &work {
            if let Some(area) = &*lock(&self.area_watch) {
                area.queued(*slot, *value);
            }
        }
        match work {
            StreamWork::Write { dst, data } => {
                let mut offset = 0u64;
                for part in data.chunks(MAX_CHUNK_BYTES) {
                    let work = WireWork::Write {
                        dst: dst.wrapping_add(offset),
                        data: Vec::new(),
                    };
                    offset += part.len() as u64;
                    self.post(&WorkerRequest::Enqueue { stream, work }, &[part]);
                }
                true
            }
            work => match self.travelling(work) {
                Ok(work) => {
                    self.post(&WorkerRequest::Enqueue { stream, work }, &[]);
                    true
                }
                Err(e) => {
                    self.defer(e);
                    false
                }
            },
        }
    }

    /// The bytes go from the socket straight into the worker's ring.
    fn enqueue_filled(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> bool {
        if len > MAX_CHUNK_BYTES {
            return self.enqueue_buffered(stream, dst, len, fill);
        }
        let work = WireWork::Write {
            dst,
            data: Vec::new(),
        };
        self.post_filled(&WorkerRequest::Enqueue { stream, work }, len, fill)
    }

    /// The bytes go from the worker's ring straight to the socket, unless
    /// a failure of earlier work waits to be told.
    fn read_sent(
        &self,
        stream: Handle,
        src: DevicePtr,
        len: usize,
        send: &mut dyn SendBytes,
    ) -> LaunchOutcome {
        let deferred = lock(&self.deferred).is_some();
        if deferred || len > MAX_CHUNK_BYTES {
            return self.read_sent_buffered(stream, src, len, send);
        }
        let request = WorkerRequest::StreamRead {
            stream,
            src,
            len: len as u64,
        };
        let result = self.call_sending(&request, len, send);
        LaunchOutcome {
            stdout: self.take_printed(),
            result,
        }
    }

    fn read(&self, stream: Handle, src: DevicePtr, buf: &mut [u8]) -> LaunchOutcome {
        let result = self.read_chunks(src, buf, |src, len| WorkerRequest::StreamRead {
            stream,
            src,
            len,
        });
        self.waited(result)
    }

    fn synchronize(&self, target: SyncTarget) -> LaunchOutcome {
        let target = target.into();
        let result = self.unit(&WorkerRequest::Synchronize { target }, &[]);
        self.waited(result)
    }

    fn query(&self, target: SyncTarget) -> Result<bool, CuError> {
        if let Some(e) = lock(&self.deferred).take() {
            return Err(e);
        }
        let target = target.into();
        match self.call(&WorkerRequest::Query { target }, &[], None)? {
            WorkerValue::Done(done) => Ok(done),
            other => Err(unexpected(&other)),
        }
    }

    fn elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, CuError> {
        match self.call(&WorkerRequest::Elapsed { start, end }, &[], None)? {
            WorkerValue::Ms(ms) => Ok(ms),
            other => Err(unexpected(&other)),
        }
    }

    fn keep_hot(&self, spin: Duration) {
        let spin_us = u64::try_from(spin.as_micros()).unwrap_or(u64::MAX);
        self.post(&WorkerRequest::KeepHot { spin_us }, &[]);
    }

    fn hold_posts(&self, on: bool) {
        self.posts_held.store(on, Ordering::Relaxed);
        if !on {
            if let Some(conn) = lock(&self.conn).as_mut() {
                conn.ring();
            }
        }
    }

    fn attach_signals(&self, path: &Path) -> Result<(), CuError> {
        let path = path.to_str().ok_or_else(|| {
            CuError::new(codes::INVALID_VALUE, "a signal area path that is not UTF-8")
        })?;
        // A worker not started yet attaches it with its start (its first
        // call): a session that never uses its device starts no process.
        let started = lock(&self.conn).is_some();
        if started {
            let request = WorkerRequest::AttachSignals {
                path: path.to_string(),
            };
            self.unit(&request, &[])?;
        } else {
            let link = PathBuf::from(format!("{path}.cumux-pending"));
            std::fs::hard_link(path, &link).map_err(|e| {
                CuError::new(codes::UNKNOWN, format!("cannot keep the signal area: {e}"))
            })?;
            *lock(&self.pending_signals) = Some(link);
        }
        if let Some(watch) = &self.watch {
            let area = SignalArea::open(Path::new(path))?;
            *lock(&self.area_watch) = Some(watch.add_area(area));
        }
        Ok(())
    }

    fn watched(&self) -> bool {
        self.watch.is_some()
    }
}

impl WorkerContext {
    /// [`WorkerContext::post`] of `request` with a frame of the `len` bytes
    /// `fill` writes into the ring, posted only once they all came: false
    /// when the link or `fill` failed.
    fn post_filled(&self, request: &WorkerRequest, len: usize, fill: &mut FillBytes<'_>) -> bool {
        if self.sticky().is_some() {
            return false;
        }
        let mut slot = lock(&self.conn);
        let Ok(conn) = self.connection(&mut slot) else {
            return false;
        };
        hop_trace::mark(Hop::ServerForward, request.into());
        let held = self.posts_held.load(Ordering::Relaxed);
        let sent = encode(request)
            .map_err(io_err)
            .and_then(|bytes| conn.post_filled(&bytes, len, fill, held));
        drop(slot);
        match sent {
            Ok(Ok(())) => true,
            // Nothing was posted: the next wait tells why.
            Ok(Err(e)) => {
                self.defer(socket_bytes::not_arrived(e));
                false
            }
            Err(e) => {
                self.died(&e);
                false
            }
        }
    }

    /// A round trip answered by `len` bytes, which go to `send` from where
    /// they lie in the ring.
    fn call_sending(
        &self,
        request: &WorkerRequest,
        len: usize,
        send: &mut dyn SendBytes,
    ) -> Result<(), CuError> {
        if let Some(e) = self.sticky() {
            return Err(e);
        }
        let kind: &'static str = request.into();
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let mut slot = lock(&self.conn);
        let conn = self.connection(&mut slot)?;
        hop_trace::mark(Hop::ServerForward, kind);
        let exchanged = (|| -> io::Result<(WorkerReply, io::Result<()>)> {
            conn.send_frames(&[&encode(request).map_err(io_err)?])?;
            let reply = self.receive(conn)?;
            let sent = match &reply.result {
                Ok(WorkerValue::Bytes) => conn.link.recv_frame_sent(&mut conn.buf, len, send)?,
                _ => Ok(()),
            };
            Ok((reply, sent))
        })();
        drop(slot);
        hop_trace::mark(Hop::ServerBack, kind);
        let (reply, sent) = exchanged.map_err(|e| self.died(&e))?;
        if let Some(seq) = reply.marker {
            self.marked(seq, kind);
        }
        match reply.result {
            Ok(WorkerValue::Bytes) => sent.map_err(socket_bytes::not_sent),
            Ok(other) => Err(unexpected(&other)),
            Err(e) => {
                if codes::is_fatal(e.code) {
                    lock(&self.sticky).get_or_insert_with(|| e.clone());
                }
                Err(e)
            }
        }
    }
}
