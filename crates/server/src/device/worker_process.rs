//! The worker process's side of worker-backed devices (`cumux worker`): serves
//! one device context to the server over its socket (or shared memory), each
//! extra `shared`-mode connection on a thread of its own; printf markers on fd 1.

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::{codes, decode, read_frame, CuError, Handle};

use super::serial::SerialStreams;
use super::signals::SignalArea;
use super::spin::spin_time;
use super::worker::{
    io_err, lock, marker_bytes, new_nonce, nonce_to_hex, send, WireModule, WorkerReply,
    WorkerRequest, WorkerValue, MAX_IMAGE_PARTS, NONCE_BYTES,
};
use super::worker_link::Link;
use super::{Device, DeviceContext, LaunchOutcome, StreamOrdered, StreamWork};
use crate::host_regions::WorkerRegions;

/// Where a worker's device printf and markers go (its fd 1), and how C stdio
/// is flushed before a marker.
pub struct WorkerStdout<'a> {
    pub out: &'a mut (dyn Write + Send),
    /// Flushes the C library's output streams (the driver may print through them).
    pub flush_c_stdio: &'a (dyn Fn() + Sync),
    pub nonce: [u8; NONCE_BYTES],
    /// Whether a module image can print through the driver (at sync points,
    /// to fd 1). Until one that can is loaded, calls write no marker unless
    /// they return printed text themselves, which saves a pipe hand-off per call.
    pub image_may_print: &'a (dyn Fn(&[u8]) -> bool + Sync),
}

/// Makes every flushing call write a marker (`always`), for drivers whose
/// printing images the detector misses.
pub const PRINTF_MARKERS_ENV: &str = "CUMUX_WORKER_PRINTF";

/// The printing-image detector of a worker serving `kind`: the CPU device
/// returns printf text with each launch, so only the `cuda` driver's images
/// need a look (for `vprintf`).
pub fn image_print_detector(kind: &str) -> fn(&[u8]) -> bool {
    if std::env::var(PRINTF_MARKERS_ENV).is_ok_and(|v| v.trim() == "always") {
        return |_| true;
    }
    match kind {
        #[cfg(feature = "cuda")]
        "cuda" => cumux_cuda_driver::capture::image_may_print,
        _ => |_| false,
    }
}

impl WorkerStdout<'_> {
    fn mark(&mut self, printed: &[u8], seq: u64) -> io::Result<()> {
        (self.flush_c_stdio)();
        self.out.write_all(printed)?;
        self.out.write_all(&marker_bytes(&self.nonce, seq))?;
        self.out.flush()
    }
}

/// Serves one context of `device` over `conn` until the socket closes.
/// Returns an error only when the connection itself fails. On request
/// ([`WorkerRequest::OpenSessions`]) it also serves further connections to
/// the same context, each on a thread of its own (`shared` mode).
pub fn serve_worker(
    device: &dyn Device,
    conn: UnixStream,
    stdout: &mut WorkerStdout<'_>,
) -> io::Result<()> {
    let mut link = Link::new(conn, spin_time())?;
    let created = catch_unwind(AssertUnwindSafe(|| device.create_context()))
        .unwrap_or_else(|_| Err(CuError::new(codes::UNKNOWN, "context creation panicked")));
    let ctx = match created {
        Ok(ctx) => ctx,
        Err(e) => {
            let reply = WorkerReply {
                result: Err(e),
                marker: None,
            };
            return send(&mut link, &reply);
        }
    };
    let ready = WorkerReply {
        result: Ok(WorkerValue::Ready),
        marker: None,
    };
    send(&mut link, &ready)?;
    let served = Served {
        ctx,
        stdout: Mutex::new(stdout),
        seq: AtomicU64::new(0),
        may_print: AtomicBool::new(false),
        sessions: Mutex::new(None),
        regions: WorkerRegions::default(),
    };
    std::thread::scope(|scope| {
        let result = served.serve(scope, link, true);
        served.close_sessions();
        result
    })
}

/// What every connection of one worker shares: the context, the stdout
/// marker sequence and the listener for further connections.
struct Served<'a, 'b> {
    ctx: Arc<dyn DeviceContext>,
    stdout: Mutex<&'a mut WorkerStdout<'b>>,
    seq: AtomicU64,
    may_print: AtomicBool,
    sessions: Mutex<Option<SessionListener>>,
    /// Pinned host regions of every connection ([`crate::host_regions`]).
    regions: WorkerRegions,
}

/// Where further connections to a worker's context come in: a socket in a
/// private directory, and the token a connection must open with.
struct SessionListener {
    dir: PathBuf,
    path: PathBuf,
    token: [u8; NONCE_BYTES],
    closing: Arc<AtomicBool>,
}

impl Served<'_, '_> {
    /// Starts the listener for further connections (once) and says where it is.
    fn open_sessions<'s>(
        &'s self,
        scope: &'s std::thread::Scope<'s, '_>,
    ) -> Result<WorkerValue, CuError> {
        let mut slot = lock(&self.sessions);
        if let Some(l) = &*slot {
            return Ok(WorkerValue::Sessions {
                path: l.path.display().to_string(),
                token: l.token,
            });
        }
        let fail = |what: &str, e: io::Error| {
            CuError::new(codes::UNKNOWN, format!("cannot open sessions: {what}: {e}"))
        };
        let token = new_nonce();
        let dir = std::env::temp_dir().join(format!(
            "cumux-worker-{}-{}",
            std::process::id(),
            &nonce_to_hex(&token)[..12]
        ));
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&dir)
            .map_err(|e| fail("directory", e))?;
        let path = dir.join("sessions.sock");
        let listener =
            std::os::unix::net::UnixListener::bind(&path).map_err(|e| fail("bind", e))?;
        let closing = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&closing);
        scope.spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                // The token is read on the connection's own thread, so a
                // silent connection holds up no other.
                scope.spawn(move || {
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut first = Vec::new();
                    let mut r = &conn;
                    let opened = read_frame(&mut r, &mut first).is_ok() && first[..] == token[..];
                    let _ = conn.set_read_timeout(None);
                    if !opened {
                        tracing::warn!("worker: a session connection without the token; closed");
                        return;
                    }
                    let Ok(link) = Link::new(conn, spin_time()) else {
                        return;
                    };
                    if let Err(e) = self.serve(scope, link, false) {
                        tracing::debug!("worker: a session connection ended: {e}");
                    }
                });
            }
        });
        *slot = Some(SessionListener {
            dir,
            path: path.clone(),
            token,
            closing,
        });
        Ok(WorkerValue::Sessions {
            path: path.display().to_string(),
            token,
        })
    }

    /// Stops taking connections (the accept loop ends at the next one).
    fn close_sessions(&self) {
        if let Some(l) = lock(&self.sessions).take() {
            l.closing.store(true, Ordering::Release);
            let _ = UnixStream::connect(&l.path);
            let _ = std::fs::remove_dir_all(&l.dir);
        }
    }

    /// Serves one connection's requests until it closes.
    fn serve<'s>(
        &'s self,
        scope: &'s std::thread::Scope<'s, '_>,
        mut link: Link,
        main: bool,
    ) -> io::Result<()> {
        // Stream semantics: the context's own, else work runs as it arrives
        // (one set of streams and events per connection).
        let serial;
        let ordered: &dyn StreamOrdered = match self.ctx.stream_ordered() {
            Some(ordered) => ordered,
            None => {
                serial = SerialStreams::new(Arc::clone(&self.ctx));
                &serial
            }
        };
        let mut frame = Vec::new();
        let mut data = Vec::new();
        // The server's completion counters for this connection's streams.
        let mut signals: Option<Arc<SignalArea>> = None;
        // This connection's regions go when it does.
        let mut mine = ConnectionRegions {
            served: self,
            ids: Vec::new(),
        };
        loop {
            match link.recv_frame(&mut frame) {
                Ok(()) => {}
                Err(cumux_protocol::FrameError::Closed) => return Ok(()),
                Err(e) => return Err(io_err(e)),
            }
            let request: WorkerRequest = match decode::<WorkerRequest>(&frame) {
                Ok(r) => {
                    hop_trace::mark(Hop::WorkerReceive, (&r).into());
                    r
                }
                Err(e) => {
                    tracing::warn!("worker: undecodable request: {e}");
                    let e = CuError::new(codes::INVALID_VALUE, format!("undecodable request: {e}"));
                    send(
                        &mut link,
                        &WorkerReply {
                            result: Err(e),
                            marker: None,
                        },
                    )?;
                    continue;
                }
            };
            // Raw frames that belong to the request come first.
            match &request {
                WorkerRequest::ModuleLoad { parts } if *parts > MAX_IMAGE_PARTS => {
                    let e =
                        CuError::new(codes::INVALID_IMAGE, format!("an image in {parts} parts"));
                    let reply = WorkerReply {
                        result: Err(e),
                        marker: None,
                    };
                    send(&mut link, &reply)?;
                    continue;
                }
                WorkerRequest::MemWrite { .. } => link.recv_frame(&mut data).map_err(io_err)?,
                WorkerRequest::ModuleLoad { parts } => {
                    data.clear();
                    for _ in 0..*parts {
                        link.recv_frame(&mut frame).map_err(io_err)?;
                        data.extend_from_slice(&frame);
                    }
                    let prints = (lock(&self.stdout).image_may_print)(&data);
                    if prints {
                        self.may_print.store(true, Ordering::Release);
                    }
                }
                _ => {}
            }
            if let WorkerRequest::Enqueue { stream, mut work } = request {
                if let StreamWork::Write { data, .. } = &mut work {
                    link.recv_frame(data).map_err(io_err)?;
                }
                if let StreamWork::Signal { slot, value } = work {
                    work = match &signals {
                        Some(area) => StreamWork::SignalTo {
                            area: Arc::clone(area),
                            slot,
                            value,
                        },
                        // Fails in the context, and so at the next waiting call.
                        None => work,
                    };
                }
                self.regions.resolve(&mut work);
                hop_trace::mark(Hop::Step, "resolved");
                let queued = catch_unwind(AssertUnwindSafe(|| ordered.enqueue(stream, work)))
                    .unwrap_or_else(|_| {
                        tracing::error!("worker: queued work panicked");
                        false
                    });
                // The server answers synchronizes from the signals until told.
                if let (false, Some(area)) = (queued, &signals) {
                    area.raise_error();
                }
                hop_trace::mark(Hop::WorkerDone, "Enqueue");
                continue;
            }
            if let WorkerRequest::KeepHot { spin_us } = request {
                let spin = Duration::from_micros(spin_us.min(100_000));
                link.set_spin(spin);
                continue;
            }
            if let WorkerRequest::ShmAttach { layout } = request {
                // Answered on the socket; only then do frames move to the area.
                match link.accept_area(layout) {
                    Ok(area) => {
                        send(
                            &mut link,
                            &WorkerReply {
                                result: Ok(WorkerValue::Unit),
                                marker: None,
                            },
                        )?;
                        link.switch_to(area)?;
                    }
                    Err(why) => {
                        tracing::warn!("worker: shared memory refused: {why}");
                        let e = CuError::new(codes::INVALID_VALUE, why);
                        send(
                            &mut link,
                            &WorkerReply {
                                result: Err(e),
                                marker: None,
                            },
                        )?;
                    }
                }
                continue;
            }
            if let WorkerRequest::AttachSignals { path } = &request {
                let opened = SignalArea::open(Path::new(path)).map(Arc::new);
                let result = opened.and_then(|area| {
                    ordered.prepare_signals(&area)?;
                    signals = Some(area);
                    Ok(WorkerValue::Unit)
                });
                send(
                    &mut link,
                    &WorkerReply {
                        result,
                        marker: None,
                    },
                )?;
                continue;
            }
            if let WorkerRequest::HostRegister { region, bytes } = request {
                let fd = link.take_fd();
                let result = self.regions.insert(&*self.ctx, region, bytes, fd);
                if result.is_ok() {
                    mine.ids.push(region);
                }
                let result = result.map(|()| WorkerValue::Unit);
                send(
                    &mut link,
                    &WorkerReply {
                        result,
                        marker: None,
                    },
                )?;
                continue;
            }
            if let WorkerRequest::HostUnregister { region } = request {
                mine.ids.retain(|r| *r != region);
                self.regions.remove(&*self.ctx, region);
                let result = Ok(WorkerValue::Unit);
                send(
                    &mut link,
                    &WorkerReply {
                        result,
                        marker: None,
                    },
                )?;
                continue;
            }
            if let WorkerRequest::OpenSessions = request {
                let result = match main {
                    true => self.open_sessions(scope),
                    false => Err(CuError::new(
                        codes::INVALID_VALUE,
                        "sessions open from the worker's own connection",
                    )),
                };
                send(
                    &mut link,
                    &WorkerReply {
                        result,
                        marker: None,
                    },
                )?;
                continue;
            }
            let flushes = !matches!(
                request,
                WorkerRequest::MemAlloc { .. }
                    | WorkerRequest::MemFree { .. }
                    | WorkerRequest::StreamCreate { .. }
                    | WorkerRequest::EventCreate { .. }
                    | WorkerRequest::EventDestroy { .. }
                    | WorkerRequest::Query { .. }
                    | WorkerRequest::Elapsed { .. }
                    | WorkerRequest::TensorMapEncode { .. }
            );
            let kind: &'static str = (&request).into();
            let started = Instant::now();
            let executed = catch_unwind(AssertUnwindSafe(|| {
                execute(&*self.ctx, ordered, request, &data)
            }));
            hop_trace::mark(Hop::WorkerDone, kind);
            let us = started.elapsed().as_micros();
            if us > cumux_protocol::SLOW_CALL_US {
                tracing::debug!(target: "cumux::slow", us, kind, "worker: slow request");
            }
            let (result, printed, bytes) = match executed {
                Ok(done) => done,
                Err(_) => (
                    Err(CuError::new(
                        codes::LAUNCH_FAILED,
                        "the worker's call panicked",
                    )),
                    Vec::new(),
                    None,
                ),
            };
            let may_print = self.may_print.load(Ordering::Acquire);
            let marker = if flushes && (may_print || !printed.is_empty()) {
                let mut stdout = lock(&self.stdout);
                let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
                stdout.mark(&printed, seq)?;
                Some(seq)
            } else {
                None
            };
            send(&mut link, &WorkerReply { result, marker })?;
            if let Some(bytes) = bytes {
                link.send_frame(&bytes)?;
            }
            hop_trace::mark(Hop::WorkerReply, kind);
        }
    }
}

/// The regions one connection registered, dropped when it ends (a session
/// of a shared context that went away without unregistering them).
struct ConnectionRegions<'s, 'a, 'b> {
    served: &'s Served<'a, 'b>,
    ids: Vec<Handle>,
}

impl Drop for ConnectionRegions<'_, '_, '_> {
    fn drop(&mut self) {
        for region in self.ids.drain(..) {
            self.served.regions.remove(&*self.served.ctx, region);
        }
    }
}

type Executed = (Result<WorkerValue, CuError>, Vec<u8>, Option<Vec<u8>>);

/// Runs one request: its result, what a launch printed, and bytes read back.
fn execute(
    ctx: &dyn DeviceContext,
    ordered: &dyn StreamOrdered,
    request: WorkerRequest,
    data: &[u8],
) -> Executed {
    let unit = |r: Result<(), CuError>| (r.map(|()| WorkerValue::Unit), Vec::new(), None);
    let waited = |o: LaunchOutcome| (o.result.map(|()| WorkerValue::Unit), o.stdout, None);
    match request {
        WorkerRequest::StreamCreate {
            stream,
            flags,
            priority,
        } => unit(ordered.stream_create(stream, flags, priority)),
        WorkerRequest::StreamDestroy { stream } => unit(ordered.stream_destroy(stream)),
        WorkerRequest::EventCreate { event, flags } => unit(ordered.event_create(event, flags)),
        WorkerRequest::EventDestroy { event } => unit(ordered.event_destroy(event)),
        WorkerRequest::GraphCreate { graph, launches } => {
            unit(ordered.graph_create(graph, launches))
        }
        WorkerRequest::GraphDestroy { graph } => {
            ordered.graph_destroy(graph);
            unit(Ok(()))
        }
        WorkerRequest::Enqueue { stream, work } => {
            ordered.enqueue(stream, work);
            unit(Ok(()))
        }
        WorkerRequest::StreamRead { stream, src, len } => {
            if len > MAX_CHUNK_BYTES as u64 {
                let e = CuError::new(codes::INVALID_VALUE, format!("a read of {len} bytes"));
                return (Err(e), Vec::new(), None);
            }
            let mut buf = vec![0u8; len as usize];
            let outcome = ordered.read(stream, src, &mut buf);
            match outcome.result {
                Ok(()) => (Ok(WorkerValue::Bytes), outcome.stdout, Some(buf)),
                Err(e) => (Err(e), outcome.stdout, None),
            }
        }
        WorkerRequest::Synchronize { target } => waited(ordered.synchronize(target)),
        WorkerRequest::Query { target } => (
            ordered.query(target).map(WorkerValue::Done),
            Vec::new(),
            None,
        ),
        WorkerRequest::Elapsed { start, end } => (
            ordered.elapsed_ms(start, end).map(WorkerValue::Ms),
            Vec::new(),
            None,
        ),
        WorkerRequest::OpenSessions
        | WorkerRequest::KeepHot { .. }
        | WorkerRequest::ShmAttach { .. }
        | WorkerRequest::AttachSignals { .. }
        | WorkerRequest::HostRegister { .. }
        | WorkerRequest::HostUnregister { .. } => (
            Err(CuError::new(
                codes::INVALID_VALUE,
                "served by the connection",
            )),
            Vec::new(),
            None,
        ),
        WorkerRequest::TensorMapEncode { request } => (
            ctx.tensor_map_encode(&request).map(WorkerValue::TensorMap),
            Vec::new(),
            None,
        ),
        WorkerRequest::MemAlloc { bytes } => {
            (ctx.mem_alloc(bytes).map(WorkerValue::Ptr), Vec::new(), None)
        }
        WorkerRequest::MemFree { ptr } => unit(ctx.mem_free(ptr)),
        WorkerRequest::MemRead { src, len } => {
            if len > MAX_CHUNK_BYTES as u64 {
                let e = CuError::new(codes::INVALID_VALUE, format!("a read of {len} bytes"));
                return (Err(e), Vec::new(), None);
            }
            let mut buf = vec![0u8; len as usize];
            match ctx.mem_read(src, &mut buf) {
                Ok(()) => (Ok(WorkerValue::Bytes), Vec::new(), Some(buf)),
                Err(e) => (Err(e), Vec::new(), None),
            }
        }
        WorkerRequest::MemWrite { dst } => unit(ctx.mem_write(dst, data)),
        WorkerRequest::MemCopy { dst, src, bytes } => unit(ctx.mem_copy(dst, src, bytes)),
        WorkerRequest::MemFill {
            dst,
            pattern,
            count,
        } => unit(ctx.mem_fill(dst, &pattern, count)),
        WorkerRequest::ModuleLoad { .. } => (
            ctx.module_load(data)
                .map(|m| WorkerValue::Module(WireModule::from(&m))),
            Vec::new(),
            None,
        ),
        WorkerRequest::ModuleUnload { module } => {
            ctx.module_unload(module);
            unit(Ok(()))
        }
        WorkerRequest::Launch {
            module,
            kernel,
            geometry,
            params,
        } => {
            let Ok(kernel) = usize::try_from(kernel) else {
                let e = CuError::new(codes::INVALID_HANDLE, "no such kernel");
                return (Err(e), Vec::new(), None);
            };
            let outcome = ctx.launch(module, kernel, &geometry, &params);
            (
                outcome.result.map(|()| WorkerValue::Unit),
                outcome.stdout,
                None,
            )
        }
    }
}
