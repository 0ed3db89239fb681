//! The worker process's side of worker-backed devices (`cumux worker`): serves
//! one device context to the server over its socket (or shared memory), each
//! extra `shared`-mode connection on a thread of its own. One dispatcher
//! (`Served::dispatch`) answers every request; calls that may flush device
//! printf write a marker on fd 1 after it.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::Scope;
use std::time::{Duration, Instant};

use cumux_protocol::arrays::CopyEnd;
use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::shm::ShmLayout;
use cumux_protocol::{codes, decode, encode, read_frame, CuError, DevicePtr, FrameError, Handle};

use super::link::{io_err, Link};
use super::regions::WorkerRegions;
use super::wire::{
    marker_bytes, new_nonce, nonce_to_hex, WorkerReply, WorkerRequest, WorkerValue,
    MAX_IMAGE_PARTS, MAX_READ_SPAN, NONCE_BYTES,
};
use crate::device::backends::{numbered_cpu_device, CpuSpec};
#[cfg(feature = "cuda")]
use crate::device::cuda::CudaDevice;
use crate::device::pieces::one_value;
use crate::device::serial::SerialStreams;
use crate::device::signals::SignalArea;
use crate::device::spin::spin_time;
use crate::device::{
    AreaPin, Device, DeviceContext, LaunchOutcome, MovableContext, StreamOrdered, StreamWork,
};
use crate::locking::lock;

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

/// The printing-image detector of a worker serving any device: an image
/// whose code calls `vprintf`. A synchronize of a session that loaded one
/// asks its worker, which hands over the printf text with the answer (the
/// CPU device's too: a stream-ordered launch's text waits in the worker).
pub fn image_print_detector() -> fn(&[u8]) -> bool {
    if std::env::var(PRINTF_MARKERS_ENV).is_ok_and(|v| v.trim() == "always") {
        return |_| true;
    }
    cumux_fatbin::image_may_print
}

impl WorkerStdout<'_> {
    fn mark(&mut self, printed: &[u8], seq: u64) -> io::Result<()> {
        (self.flush_c_stdio)();
        self.out.write_all(printed)?;
        self.out.write_all(&marker_bytes(&self.nonce, seq))?;
        self.out.flush()
    }
}

/// The device a worker process serves: `cpu` (as `cpu` says) or `cuda` (GPU
/// `ordinal`, its context created in this process, or the GPU's primary
/// context with `primary_context`; printf left on fd 1).
pub fn local_device(
    kind: &str,
    ordinal: u32,
    cpu: &CpuSpec,
    primary_context: bool,
) -> Result<Arc<dyn Device>, String> {
    // Only a GPU has a primary context.
    #[cfg(not(feature = "cuda"))]
    let _ = primary_context;
    match kind {
        "cpu" => numbered_cpu_device(ordinal, cpu),
        #[cfg(feature = "cuda")]
        "cuda" => {
            let driver = cumux_cuda_driver::Driver::load().map_err(|e| e.to_string())?;
            let device = match primary_context {
                true => CudaDevice::primary(&driver, ordinal),
                false => CudaDevice::per_session(&driver, ordinal),
            };
            Ok(Arc::new(device.map_err(|e| e.to_string())?))
        }
        other => Err(format!(
            "a worker serves cpu or cuda devices, not {other:?} (ordinal {ordinal})"
        )),
    }
}

/// Opens device `n` of the worker's kind, for a further connection that asks
/// for a context of its own there ([`serve_worker_beside`]).
pub type DeviceOpener<'a> = &'a (dyn Fn(u32) -> Result<Arc<dyn Device>, String> + Sync);

/// Serves one context of `device` over `conn` until the socket closes.
/// Returns an error only when the connection itself fails. On request
/// ([`WorkerRequest::OpenSessions`]) it also serves further connections to
/// the same context, each on a thread of its own (`shared` mode).
pub fn serve_worker(
    device: &dyn Device,
    conn: UnixStream,
    stdout: &mut WorkerStdout<'_>,
) -> io::Result<()> {
    serve_worker_beside(
        device,
        &|n| Err(format!("this worker opens no device {n}")),
        conn,
        stdout,
    )
}

/// [`serve_worker`], where a further connection may also ask for a context of
/// its own on another device, which `open` opens: one program's contexts on
/// several devices then live in one process, one address space.
pub fn serve_worker_beside(
    device: &dyn Device,
    open: DeviceOpener<'_>,
    conn: UnixStream,
    stdout: &mut WorkerStdout<'_>,
) -> io::Result<()> {
    let mut link = Link::new(conn, spin_time())?;
    let created = catch_unwind(AssertUnwindSafe(|| device.create_context()))
        .unwrap_or_else(|_| Err(CuError::new(codes::UNKNOWN, "context creation panicked")));
    let ctx = match created {
        Ok(ctx) => ctx,
        Err(e) => return link.send_message(&WorkerReply::unmarked(Err(e))),
    };
    link.send_message(&WorkerReply::unmarked(Ok(WorkerValue::Ready)))?;
    let served = Served {
        ctx: Mutex::new(ctx),
        open,
        stdout: Mutex::new(stdout),
        seq: AtomicU64::new(0),
        may_print: AtomicBool::new(false),
        sessions: Mutex::new(None),
        regions: WorkerRegions::default(),
        contexts: Mutex::new(HashMap::new()),
        next_context: AtomicU64::new(1),
    };
    std::thread::scope(|scope| {
        let ctx = Arc::clone(&lock(&served.ctx));
        let result = served.serve(scope, link, true, ctx);
        served.close_sessions();
        result
    })
}

/// What every connection of one worker shares: the context, the stdout
/// marker sequence and the listener for further connections.
struct Served<'a, 'b> {
    /// The main connection's context (replaced with it when that connection
    /// asks for a window or an SM cap, so the unused one ends).
    ctx: Mutex<Arc<dyn DeviceContext>>,
    /// Opens the other devices further connections ask for.
    open: DeviceOpener<'a>,
    stdout: Mutex<&'a mut WorkerStdout<'b>>,
    seq: AtomicU64,
    may_print: AtomicBool,
    sessions: Mutex<Option<SessionListener>>,
    /// Pinned host regions of every connection.
    regions: WorkerRegions,
    /// Each connection's context by its number ([`WorkerRequest::ContextId`]),
    /// for peer access between a program's contexts.
    contexts: Mutex<HashMap<u64, Weak<dyn DeviceContext>>>,
    next_context: AtomicU64,
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
    fn open_sessions<'s>(&'s self, scope: &'s Scope<'s, '_>) -> Result<WorkerValue, CuError> {
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
                    let mut asked = Vec::new();
                    let own = match opened && read_frame(&mut r, &mut asked).is_ok() {
                        true => decode::<Option<u32>>(&asked).ok(),
                        false => None,
                    };
                    let _ = conn.set_read_timeout(None);
                    let Some(own) = own else {
                        tracing::warn!("worker: a session connection without the token; closed");
                        return;
                    };
                    let Ok(mut link) = Link::new(conn, spin_time()) else {
                        return;
                    };
                    let ctx = match own {
                        None => Ok(Arc::clone(&lock(&self.ctx))),
                        Some(n) => self.own_context(n),
                    };
                    let ready = ctx
                        .as_ref()
                        .map(|_| WorkerValue::Ready)
                        .map_err(Clone::clone);
                    if link.send_message(&WorkerReply::unmarked(ready)).is_err() {
                        return;
                    }
                    let Ok(ctx) = ctx else { return };
                    if let Err(e) = self.serve(scope, link, false, ctx) {
                        tracing::debug!("worker: a session connection ended: {e}");
                    }
                    // A shared worker outlives its sessions: what they freed
                    // goes back, as the server's does.
                    crate::freed_memory::after_session();
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

    /// A context of a connection's own on device `n` of this worker's kind.
    fn own_context(&self, n: u32) -> Result<Arc<dyn DeviceContext>, CuError> {
        let opened = catch_unwind(AssertUnwindSafe(|| {
            (self.open)(n)
                .map_err(|e| CuError::new(codes::INVALID_DEVICE, e))
                .and_then(|device| device.create_context())
        }));
        opened.unwrap_or_else(|_| Err(CuError::new(codes::UNKNOWN, "context creation panicked")))
    }

    /// Stops taking connections (the accept loop ends at the next one).
    fn close_sessions(&self) {
        if let Some(l) = lock(&self.sessions).take() {
            l.closing.store(true, Ordering::Release);
            let _ = UnixStream::connect(&l.path);
            let _ = std::fs::remove_dir_all(&l.dir);
        }
    }

    /// Serves one connection's requests on `ctx` until it closes.
    fn serve<'s>(
        &'s self,
        scope: &'s Scope<'s, '_>,
        link: Link,
        main: bool,
        ctx: Arc<dyn DeviceContext>,
    ) -> io::Result<()> {
        let context_id = self.next_context.fetch_add(1, Ordering::Relaxed);
        lock(&self.contexts).insert(context_id, Arc::downgrade(&ctx));
        let _forget = Forget(&self.contexts, context_id);
        let mut conn = Connection {
            served: self,
            context_id,
            ctx,
            area_pin: None,
            link,
            main,
            signals: None,
            regions: Vec::new(),
            frame: Vec::new(),
            data: Vec::new(),
            may_print: false,
            long_spin: crate::device::spin::answer_spin_time(),
        };
        loop {
            // Stream semantics: the context's own, else work runs as it
            // arrives (one set of streams and events per connection).
            let ctx = Arc::clone(&conn.ctx);
            let serial;
            let ordered: &dyn StreamOrdered = match ctx.stream_ordered() {
                Some(ordered) => ordered,
                None => {
                    serial = SerialStreams::new(Arc::clone(&ctx));
                    &serial
                }
            };
            match self.serve_requests(scope, &mut conn, ordered)? {
                Some(next) => {
                    lock(&self.contexts).insert(context_id, Arc::downgrade(&next));
                    if conn.main {
                        *lock(&self.ctx) = Arc::clone(&next);
                    }
                    conn.ctx = next;
                }
                None => return Ok(()),
            }
        }
    }

    /// Serves `conn`'s requests on `ordered` until it closes (`None`) or
    /// asks for a context in another window (that context).
    fn serve_requests<'s>(
        &'s self,
        scope: &'s Scope<'s, '_>,
        conn: &mut Connection<'s, '_, '_>,
        ordered: &dyn StreamOrdered,
    ) -> io::Result<Option<Arc<dyn DeviceContext>>> {
        loop {
            match conn.link.recv_frame(&mut conn.frame) {
                Ok(()) => {}
                Err(FrameError::Closed) => return Ok(None),
                Err(e) => return Err(io_err(e)),
            }
            let request = match decode::<WorkerRequest>(&conn.frame) {
                Ok(r) => {
                    hop_trace::mark(Hop::WorkerReceive, (&r).into());
                    r
                }
                Err(e) => {
                    tracing::warn!("worker: undecodable request: {e}");
                    let e = CuError::new(codes::INVALID_VALUE, format!("undecodable request: {e}"));
                    conn.link.send_message(&WorkerReply::unmarked(Err(e)))?;
                    continue;
                }
            };
            if let WorkerRequest::SmCap { part } = request {
                // A further connection to the worker's own context is a
                // session of a shared context: its streams go to the part.
                // Any other connection's context is its own, swapped whole.
                let shares = !conn.main && Arc::ptr_eq(&conn.ctx, &*lock(&self.ctx));
                if shares {
                    let sms = conn.ctx.cap_streams(part);
                    conn.reply(sms.map(|sms| WorkerValue::Number(sms.into())))?;
                    continue;
                }
                match conn.ctx.capped(part) {
                    Ok((next, sms)) => {
                        conn.reply(Ok(WorkerValue::Number(sms.into())))?;
                        return Ok(Some(next));
                    }
                    Err(e) => conn.reply(Err(e))?,
                }
                continue;
            }
            if let WorkerRequest::Window { window } = request {
                match self.in_window(&conn.ctx, window) {
                    Ok(None) => conn.reply(Ok(WorkerValue::Unit))?,
                    Ok(Some(next)) => {
                        conn.reply(Ok(WorkerValue::Unit))?;
                        return Ok(Some(next));
                    }
                    Err(e) => conn.reply(Err(e))?,
                }
                continue;
            }
            self.dispatch(scope, conn, ordered, request)?;
        }
    }

    /// A context like `ctx` handing out addresses in `window`: `None` if
    /// `ctx` does; else a fresh one of the device numbered `window` (a CPU
    /// device's number is its window).
    fn in_window(
        &self,
        ctx: &Arc<dyn DeviceContext>,
        window: u32,
    ) -> Result<Option<Arc<dyn DeviceContext>>, CuError> {
        let here = movable(&**ctx)?.window();
        if here == window {
            return Ok(None);
        }
        let device = (self.open)(window).map_err(|e| CuError::new(codes::INVALID_DEVICE, e))?;
        let fresh = device.create_context()?;
        match fresh.movable().map(|m| m.window()) {
            Some(w) if w == window => Ok(Some(fresh)),
            _ => Err(CuError::new(
                codes::NOT_SUPPORTED,
                format!("this worker hands out addresses in window {here}, not {window}"),
            )),
        }
    }

    /// Answers `MemReadPieces` of `len` bytes from `src`: each piece read
    /// into `conn.data` and answered at once, as one value where it is all
    /// one byte value, else as its bytes; an error is the last answer.
    fn read_pieces(
        &self,
        conn: &mut Connection<'_, '_, '_>,
        kind: &'static str,
        flushes: bool,
        (src, len, piece): (DevicePtr, u64, u64),
    ) -> io::Result<()> {
        if piece == 0 || piece > MAX_CHUNK_BYTES as u64 || len > MAX_READ_SPAN {
            let e = CuError::new(
                codes::INVALID_VALUE,
                format!("a read of {len} bytes in pieces of {piece}"),
            );
            return self.answer(&mut conn.link, kind, flushes, value(Err(e)));
        }
        let ctx = Arc::clone(&conn.ctx);
        let mut offset = 0;
        while offset < len {
            let n = (len - offset).min(piece) as usize;
            conn.data.resize(n, 0);
            let data = &mut conn.data;
            let at = src.wrapping_add(offset);
            let answer = guarded(kind, || {
                value(ctx.mem_read(at, data).map(|()| match one_value(data) {
                    Some(v) => WorkerValue::Fill(v),
                    None => WorkerValue::Bytes,
                }))
            });
            let (failed, bytes) = match answer.result {
                Ok(WorkerValue::Bytes) => (false, true),
                Ok(_) => (false, false),
                Err(_) => (true, false),
            };
            self.answer(&mut conn.link, kind, flushes, answer)?;
            if bytes {
                conn.link.send_frame(&conn.data)?;
            }
            if failed {
                break;
            }
            offset += n as u64;
        }
        Ok(())
    }

    /// Reads a module image of `parts` raw frames into `conn.data`, noting
    /// whether it can print: what it returns.
    fn receive_image(&self, conn: &mut Connection<'_, '_, '_>, parts: u32) -> io::Result<bool> {
        conn.data.clear();
        for _ in 0..parts {
            conn.link.recv_frame(&mut conn.frame).map_err(io_err)?;
            conn.data.extend_from_slice(&conn.frame);
        }
        let prints = (lock(&self.stdout).image_may_print)(&conn.data);
        if prints {
            self.may_print.store(true, Ordering::Release);
            conn.may_print = true;
        }
        Ok(prints)
    }

    /// Serves one request of `conn`: the one place each kind is handled.
    /// Posted work and `KeepHot` get no answer; the connection's own requests
    /// are answered at once; calls on the context run guarded against panics
    /// ([`guarded`]) and are answered with their printf marker ([`Served::answer`]).
    fn dispatch<'s>(
        &'s self,
        scope: &'s Scope<'s, '_>,
        conn: &mut Connection<'s, '_, '_>,
        ordered: &dyn StreamOrdered,
        request: WorkerRequest,
    ) -> io::Result<()> {
        let conn_ctx = Arc::clone(&conn.ctx);
        let ctx = &*conn_ctx;
        let kind: &'static str = (&request).into();
        let flushes = request.may_flush_printf();
        let answer = match request {
            // The connection's own requests.
            WorkerRequest::Enqueue { stream, work } => {
                return conn.enqueue(ordered, stream, work.into())
            }
            WorkerRequest::KeepHot { spin_us } => {
                conn.link
                    .set_spin(Duration::from_micros(spin_us.min(100_000)));
                return Ok(());
            }
            WorkerRequest::ShmAttach { layout } => return conn.attach_shm(layout),
            WorkerRequest::AttachSignals { path } => {
                let result = conn.attach_signals(ordered, Path::new(&path));
                return conn.reply(result);
            }
            WorkerRequest::HostRegister {
                region,
                bytes,
                client_base,
            } => {
                let fd = conn.link.take_fd();
                let result = self.regions.insert(ctx, region, bytes, client_base, fd);
                if result.is_ok() {
                    conn.regions.push(region);
                }
                return conn.reply(result.map(|reached| WorkerValue::Number(reached.into())));
            }
            WorkerRequest::HostUnregister { region } => {
                conn.regions.retain(|r| *r != region);
                self.regions.remove(ctx, region);
                return conn.reply(Ok(WorkerValue::Unit));
            }
            WorkerRequest::OpenSessions => {
                let result = match conn.main {
                    true => self.open_sessions(scope),
                    false => Err(CuError::new(
                        codes::INVALID_VALUE,
                        "sessions open from the worker's own connection",
                    )),
                };
                return conn.reply(result);
            }
            // Calls on the context: memory and modules.
            WorkerRequest::MemAlloc { bytes } => {
                guarded(kind, || value(ctx.mem_alloc(bytes).map(WorkerValue::Ptr)))
            }
            WorkerRequest::MemFree { ptr, bytes } => {
                guarded(kind, || unit(ctx.mem_free(ptr, bytes)))
            }
            WorkerRequest::MemRead { src, len } => guarded(kind, || {
                read_into(len, |buf| LaunchOutcome {
                    stdout: Vec::new(),
                    result: ctx.mem_read(src, buf),
                })
            }),
            WorkerRequest::MemReadSpans { spans } => guarded(kind, || {
                let total = spans.iter().fold(0u64, |t, s| t.saturating_add(s.1));
                read_into(total, |buf| LaunchOutcome {
                    stdout: Vec::new(),
                    result: read_spans(ctx, &spans, buf),
                })
            }),
            WorkerRequest::MemWriteSpans { spans } => {
                conn.link.recv_frame(&mut conn.data).map_err(io_err)?;
                let data = &conn.data;
                guarded(kind, || unit(write_spans(ctx, &spans, data)))
            }
            WorkerRequest::MemReadPieces { src, len, piece } => {
                return self.read_pieces(conn, kind, flushes, (src, len, piece))
            }
            WorkerRequest::MemWrite { dst } => {
                conn.link.recv_frame(&mut conn.data).map_err(io_err)?;
                let data = &conn.data;
                guarded(kind, || unit(ctx.mem_write(dst, data)))
            }
            WorkerRequest::MemCopy { dst, src, bytes } => {
                guarded(kind, || unit(ctx.mem_copy(dst, src, bytes)))
            }
            WorkerRequest::MemFill {
                dst,
                pattern,
                count,
            } => guarded(kind, || unit(ctx.mem_fill(dst, &pattern, count))),
            WorkerRequest::ModuleLoad { parts } | WorkerRequest::ModuleLoadAt { parts, .. }
                if parts > MAX_IMAGE_PARTS =>
            {
                let e = CuError::new(codes::INVALID_IMAGE, format!("an image in {parts} parts"));
                return conn.reply(Err(e));
            }
            WorkerRequest::ModuleLoad { parts } => {
                let prints = self.receive_image(conn, parts)?;
                let image = &conn.data;
                guarded(kind, || {
                    value(
                        ctx.module_load(image)
                            .map(|m| WorkerValue::Module(m, prints)),
                    )
                })
            }
            WorkerRequest::ModuleLoadAt { parts, blocks } => {
                let prints = self.receive_image(conn, parts)?;
                let image = &conn.data;
                guarded(kind, || {
                    value(
                        movable(ctx)
                            .and_then(|m| m.module_load_at(image, &blocks))
                            .map(|m| WorkerValue::Module(m, prints)),
                    )
                })
            }
            WorkerRequest::Place { allocations } => guarded(kind, || {
                unit(movable(ctx).and_then(|m| m.place_all(&allocations)))
            }),
            // Taken by `serve_requests` before it gets here.
            WorkerRequest::Window { .. } | WorkerRequest::SmCap { .. } => {
                return conn.reply(Err(CuError::new(
                    codes::UNKNOWN,
                    "a window or SM cap out of place",
                )))
            }
            WorkerRequest::Hold { ranges } => {
                guarded(kind, || unit(movable(ctx).and_then(|m| m.hold(&ranges))))
            }
            WorkerRequest::KeepFree { spans } => guarded(kind, || {
                value(movable(ctx).and_then(|m| m.keep_free(&spans).map(WorkerValue::Number)))
            }),
            WorkerRequest::MoveFacts => guarded(kind, || {
                value(movable(ctx).map(|m| WorkerValue::MoveFacts {
                    window: m.window(),
                    limits: m.limits(),
                    unmovable: m.unmovable(),
                }))
            }),
            WorkerRequest::ModulesBlocks { modules } => guarded(kind, || {
                value(movable(ctx).map(|m| WorkerValue::PtrLists(m.modules_blocks(&modules))))
            }),
            WorkerRequest::ModuleBlocks { module } => guarded(kind, || {
                value(movable(ctx).map(|m| WorkerValue::Ptrs(m.module_blocks(module))))
            }),
            WorkerRequest::ModuleUnload { module } => guarded(kind, || {
                ctx.module_unload(module);
                unit(Ok(()))
            }),
            WorkerRequest::Launch(launch) => guarded(kind, || waited(ctx.launch(&launch))),
            WorkerRequest::SetLimit { limit, setting } => {
                guarded(kind, || unit(ctx.apply_limit(limit, setting)))
            }
            WorkerRequest::ResetLimits => guarded(kind, || unit(ctx.reset_limits())),
            WorkerRequest::TensorMapEncode { request } => guarded(kind, || {
                value(ctx.tensor_map_encode(&request).map(WorkerValue::TensorMap))
            }),
            WorkerRequest::ClusterOccupancy {
                module,
                kernel,
                geometry,
                query,
            } => guarded(kind, || {
                value(
                    ctx.cluster_occupancy(module, kernel, &geometry, query)
                        .map(|n| WorkerValue::Number(n.max(0) as u64)),
                )
            }),
            WorkerRequest::Vmm(op) => {
                guarded(kind, || value(ctx.vmm(&op).map(WorkerValue::Number)))
            }
            WorkerRequest::Array(op) => {
                guarded(kind, || value(ctx.array(&op).map(WorkerValue::Number)))
            }
            WorkerRequest::ArrayCopy { src, dst, extent } => {
                if src == CopyEnd::Host {
                    conn.link.recv_frame(&mut conn.data).map_err(io_err)?;
                }
                let from: &[u8] = match src {
                    CopyEnd::Host => &conn.data,
                    _ => &[],
                };
                let copy = |to: &mut [u8]| ctx.array_copy(&src, &dst, &extent, from, to);
                match (dst, extent.packed_bytes()) {
                    (CopyEnd::Host, Some(len)) => guarded(kind, || {
                        read_into(len, |buf| LaunchOutcome {
                            stdout: Vec::new(),
                            result: copy(buf),
                        })
                    }),
                    (CopyEnd::Host, None) => {
                        let e = CuError::new(codes::INVALID_VALUE, "a copy past u64");
                        return conn.reply(Err(e));
                    }
                    _ => guarded(kind, || unit(copy(&mut []))),
                }
            }
            WorkerRequest::ContextId => {
                return conn.reply(Ok(WorkerValue::Number(conn.context_id)));
            }
            WorkerRequest::PeerAccess { peer, enable } => {
                let found = lock(&self.contexts).get(&peer).and_then(Weak::upgrade);
                let Some(peer) = found else {
                    let e = CuError::new(codes::INVALID_CONTEXT, "no such context in this worker");
                    return conn.reply(Err(e));
                };
                guarded(kind, || unit(ctx.peer_access(&*peer, enable)))
            }
            WorkerRequest::VmmExport { physical } => {
                let exported = catch_unwind(AssertUnwindSafe(|| ctx.vmm_export(physical)))
                    .unwrap_or_else(|_| Err(CuError::new(codes::UNKNOWN, "export panicked")));
                return conn.reply_with_fd(exported.map(|fd| (WorkerValue::Unit, fd)));
            }
            WorkerRequest::PlacedExport { ptr } => {
                let exported = catch_unwind(AssertUnwindSafe(|| {
                    movable(ctx).and_then(|m| m.export_placed(ptr))
                }))
                .unwrap_or_else(|_| Err(CuError::new(codes::UNKNOWN, "export panicked")));
                return conn.reply_with_fd(
                    exported.map(|(base, size, fd)| (WorkerValue::Range { base, size }, fd)),
                );
            }
            WorkerRequest::VmmImport => {
                let imported = match conn.link.take_fd() {
                    Some(fd) => catch_unwind(AssertUnwindSafe(|| {
                        ctx.vmm_import(std::os::fd::AsFd::as_fd(&fd))
                    }))
                    .unwrap_or_else(|_| Err(CuError::new(codes::UNKNOWN, "import panicked"))),
                    None => Err(CuError::new(codes::INVALID_VALUE, "no descriptor came")),
                };
                return conn.reply(imported.map(WorkerValue::Number));
            }
            WorkerRequest::PlacedCopy { chunks, copies } => guarded(kind, || {
                value(
                    ctx.copy_into_imported(&chunks, &copies)
                        .map(WorkerValue::Number),
                )
            }),
            WorkerRequest::PlacedMap { chunks } => guarded(kind, || {
                value(ctx.map_imported(&chunks).map(WorkerValue::Mapped))
            }),
            WorkerRequest::PlacedCopyMapped { mapped, copies } => guarded(kind, || {
                value(
                    ctx.copy_into_mapped(&mapped, &copies)
                        .map(WorkerValue::Number),
                )
            }),
            WorkerRequest::PlacedUnmap { mapped } => guarded(kind, || {
                ctx.unmap_imported(&mapped);
                unit(Ok(()))
            }),
            WorkerRequest::IpcExport { base } => guarded(kind, || {
                value(ctx.ipc_export(base).map(WorkerValue::IpcHandle))
            }),
            WorkerRequest::IpcOpen { handle, flags } => guarded(kind, || {
                value(
                    ctx.ipc_open(&handle, flags)
                        .map(|(base, size)| WorkerValue::Range { base, size }),
                )
            }),
            WorkerRequest::IpcClose { base } => guarded(kind, || unit(ctx.ipc_close(base))),
            // Calls on the context: streams, events and graphs.
            WorkerRequest::StreamCreate {
                stream,
                flags,
                priority,
            } => guarded(kind, || {
                unit(ordered.stream_create(stream, flags, priority))
            }),
            WorkerRequest::StreamDestroy { stream } => {
                guarded(kind, || unit(ordered.stream_destroy(stream)))
            }
            WorkerRequest::EventCreate { event, flags } => {
                guarded(kind, || unit(ordered.event_create(event, flags)))
            }
            WorkerRequest::EventDestroy { event } => {
                guarded(kind, || unit(ordered.event_destroy(event)))
            }
            WorkerRequest::EventIpcHandle { event } => guarded(kind, || {
                value(ordered.event_ipc_handle(event).map(WorkerValue::IpcHandle))
            }),
            WorkerRequest::EventOpenIpc { event, handle } => {
                guarded(kind, || unit(ordered.event_open_ipc(event, &handle)))
            }
            WorkerRequest::GraphCreate { graph, launches } => guarded(kind, || {
                unit(ordered.graph_create(graph, launches.into_iter().map(Into::into).collect()))
            }),
            WorkerRequest::GraphDestroy { graph } => guarded(kind, || {
                ordered.graph_destroy(graph);
                unit(Ok(()))
            }),
            WorkerRequest::StreamRead { stream, src, len } => {
                let mut read =
                    |buf: &mut [u8], at: u64| ordered.read(stream, src.wrapping_add(at), buf);
                if self.read_ahead(conn, kind, flushes, len, &mut read)? {
                    return Ok(());
                }
                guarded(kind, || read_into(len, |buf| read(buf, 0)))
            }
            WorkerRequest::Synchronize { target } => {
                guarded(kind, || waited(ordered.synchronize(target.into())))
            }
            WorkerRequest::Query { target } => guarded(kind, || {
                value(ordered.query(target.into()).map(WorkerValue::Done))
            }),
            WorkerRequest::Elapsed { start, end } => guarded(kind, || {
                value(ordered.elapsed_ms(start, end).map(WorkerValue::Ms))
            }),
        };
        self.answer(&mut conn.link, kind, flushes, answer)
    }

    /// Answers a read of `len` bytes with `read(piece, offset)` done straight
    /// into the ring, ahead of the answer that says how it went (the bytes
    /// follow only a good one): false, nothing done, where the ring cannot
    /// take them so.
    fn read_ahead(
        &self,
        conn: &mut Connection<'_, '_, '_>,
        kind: &'static str,
        flushes: bool,
        len: u64,
        read: &mut dyn FnMut(&mut [u8], u64) -> LaunchOutcome,
    ) -> io::Result<bool> {
        if len > MAX_CHUNK_BYTES as u64 {
            return Ok(false);
        }
        let mut printed = Vec::new();
        let mut failed = None;
        let mut at = 0u64;
        let mut fill = |piece: &mut [u8]| {
            let answer = guarded(kind, || {
                let outcome = read(piece, at);
                Answer {
                    result: outcome.result.map(|()| WorkerValue::Bytes),
                    printed: outcome.stdout,
                    bytes: None,
                }
            });
            at += piece.len() as u64;
            printed.extend(answer.printed);
            answer.result.map(|_| ()).map_err(|e| {
                let why = io::Error::other(e.detail.clone());
                failed = Some(e);
                why
            })
        };
        if conn.link.fill_ahead(len as usize, &mut fill)?.is_none() {
            return Ok(false);
        }
        let good = failed.is_none();
        let answer = Answer {
            result: failed.map_or(Ok(WorkerValue::Bytes), Err),
            printed,
            bytes: None,
        };
        // The bytes ring the server, once, for both.
        self.answer_quietly(&mut conn.link, kind, flushes, answer, good)?;
        if good {
            conn.link.send_filled_ahead()?;
        }
        Ok(true)
    }

    /// Answers a call on the context: a marker after its printf where it may
    /// have flushed some, the reply, and the bytes it read back.
    fn answer(
        &self,
        link: &mut Link,
        kind: &'static str,
        flushes: bool,
        answer: Answer,
    ) -> io::Result<()> {
        self.answer_quietly(link, kind, flushes, answer, false)
    }

    /// [`Served::answer`], the reply not ringing the server where `quiet`
    /// (a frame that rings follows at once).
    fn answer_quietly(
        &self,
        link: &mut Link,
        kind: &'static str,
        flushes: bool,
        answer: Answer,
        quiet: bool,
    ) -> io::Result<()> {
        let Answer {
            result,
            printed,
            bytes,
        } = answer;
        let may_print = self.may_print.load(Ordering::Acquire);
        let marker = if flushes && (may_print || !printed.is_empty()) {
            let mut stdout = lock(&self.stdout);
            let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
            stdout.mark(&printed, seq)?;
            Some(seq)
        } else {
            None
        };
        let reply = WorkerReply { result, marker };
        match quiet {
            true => link.send_frames_quiet(&[&encode(&reply).map_err(io_err)?])?,
            false => link.send_message(&reply)?,
        }
        if let Some(bytes) = bytes {
            link.send_frame(&bytes)?;
        }
        hop_trace::mark(Hop::WorkerReply, kind);
        Ok(())
    }
}

/// One connection being served: its link, the signal area its streams raise,
/// the regions it registered (dropped with it: a session of a shared context
/// may go without unregistering them) and its receive buffers.
struct Connection<'s, 'a, 'b> {
    served: &'s Served<'a, 'b>,
    /// Its context's number ([`Served::contexts`]).
    context_id: u64,
    /// The context it serves: the worker's, or one of its own on another device.
    ctx: Arc<dyn DeviceContext>,
    /// The link's shared area pinned for the device (dropped before the
    /// link, which may unmap the area).
    area_pin: Option<AreaPin>,
    link: Link,
    /// The worker's own connection (the one made at spawn).
    main: bool,
    /// The server's completion counters for this connection's streams.
    signals: Option<Arc<SignalArea>>,
    regions: Vec<Handle>,
    frame: Vec<u8>,
    /// Raw frames a request brought (bytes to write, a module image).
    data: Vec<u8>,
    /// Whether it loaded a module that can print: its clients' marks are
    /// left out (another connection's printing module, a shared context's
    /// other tenant's, leaves them as they are).
    may_print: bool,
    /// How long it polls for the next request after a synchronize's mark
    /// (as the server's connection does; looked up once: the lookup reads
    /// cgroup files).
    long_spin: std::time::Duration,
}

impl Connection<'_, '_, '_> {
    /// Answers a request of the connection's own (no printf of its own).
    fn reply(&mut self, result: Result<WorkerValue, CuError>) -> io::Result<()> {
        self.link.send_message(&WorkerReply::unmarked(result))
    }

    /// Answers with a value and a descriptor attached (`SCM_RIGHTS`), or
    /// with the error that kept it from being made.
    fn reply_with_fd(
        &mut self,
        result: Result<(WorkerValue, std::os::fd::OwnedFd), CuError>,
    ) -> io::Result<()> {
        match result {
            Ok((value, fd)) => {
                let reply = WorkerReply::unmarked(Ok(value));
                let bytes = cumux_protocol::encode(&reply).map_err(io_err)?;
                self.link
                    .send_frame_with_fd(&bytes, std::os::fd::AsFd::as_fd(&fd))
            }
            Err(e) => self.reply(Err(e)),
        }
    }

    /// Queues posted work on `ordered`, unanswered; a failure to queue is
    /// kept there for the next waiting call, and counted in the signal area.
    fn enqueue(
        &mut self,
        ordered: &dyn StreamOrdered,
        stream: Handle,
        mut work: StreamWork,
    ) -> io::Result<()> {
        if let StreamWork::Write { dst, .. } = work {
            // Its bytes go from the ring to where the stream order takes
            // them: in place, on the CPU device (`SerialStreams`).
            let queued = self.link.recv_frame_taken(&mut self.data, |len, fill| {
                catch_unwind(AssertUnwindSafe(|| {
                    ordered.enqueue_filled(stream, dst, len, fill)
                }))
                .unwrap_or_else(|_| {
                    tracing::error!("worker: queued work panicked");
                    false
                })
            })?;
            self.queued(queued);
            return Ok(());
        }
        // A connection whose modules may print leaves its client's marks
        // out: the wait must ask, and take the printf with it.
        if matches!(work, StreamWork::Mark { .. }) && self.may_print {
            self.queued(true);
            return Ok(());
        }
        if let StreamWork::Signal { slot, value } = work {
            work = match &self.signals {
                Some(area) => StreamWork::SignalTo {
                    area: Arc::clone(area),
                    slot,
                    value,
                },
                // Fails in the context, and so at the next waiting call.
                None => work,
            };
        }
        self.served.regions.resolve(&mut work);
        hop_trace::mark(Hop::Step, "resolved");
        // A synchronize's mark: its client calls again as soon as the work
        // is done, after as long as that takes.
        if matches!(work, StreamWork::Mark { event: None, .. }) {
            self.link.after_sync_mark(self.long_spin);
        }
        let queued = catch_unwind(AssertUnwindSafe(|| ordered.enqueue(stream, work)))
            .unwrap_or_else(|_| {
                tracing::error!("worker: queued work panicked");
                false
            });
        self.queued(queued);
        Ok(())
    }

    /// After work was queued (`queued` false: it failed to).
    fn queued(&self, queued: bool) {
        // The server answers synchronizes from the signals until told.
        if let (false, Some(area)) = (queued, &self.signals) {
            area.raise_error();
        }
        hop_trace::mark(Hop::WorkerDone, "Enqueue");
    }

    /// Takes the offered shared-memory area: answered on the socket, and only
    /// then do frames move to the area. A refusal leaves the link as it was.
    fn attach_shm(&mut self, layout: ShmLayout) -> io::Result<()> {
        match self.link.accept_area(layout) {
            Ok(area) => {
                let (ptr, len) = area.raw_parts();
                self.reply(Ok(WorkerValue::Unit))?;
                self.link.switch_to(area)?;
                // SAFETY: the link now holds the area's mapping, and
                // `area_pin` is dropped before the link (held payloads keep
                // the mapping longer still).
                self.area_pin = unsafe { self.ctx.pin_link_area(ptr, len) };
                Ok(())
            }
            Err(why) => {
                tracing::warn!("worker: shared memory refused: {why}");
                self.reply(Err(CuError::new(codes::INVALID_VALUE, why)))
            }
        }
    }

    /// Opens the server's signal area at `path` for this connection's signals.
    fn attach_signals(
        &mut self,
        ordered: &dyn StreamOrdered,
        path: &Path,
    ) -> Result<WorkerValue, CuError> {
        let area = Arc::new(SignalArea::open(path)?);
        ordered.prepare_signals(&area)?;
        self.signals = Some(area);
        Ok(WorkerValue::Unit)
    }
}

impl Drop for Connection<'_, '_, '_> {
    fn drop(&mut self) {
        for region in self.regions.drain(..) {
            self.served.regions.remove(&*self.ctx, region);
        }
    }
}

/// Takes a connection's context out of [`Served::contexts`] when it ends.
struct Forget<'a>(&'a Mutex<HashMap<u64, Weak<dyn DeviceContext>>>, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

/// What a call on the context comes to: its result, the printf text it
/// returned, and bytes read back (one raw frame after the reply).
struct Answer {
    result: Result<WorkerValue, CuError>,
    printed: Vec<u8>,
    bytes: Option<Vec<u8>>,
}

fn value(result: Result<WorkerValue, CuError>) -> Answer {
    Answer {
        result,
        printed: Vec::new(),
        bytes: None,
    }
}

/// The context as a [`MovableContext`], else why not.
fn movable(ctx: &dyn DeviceContext) -> Result<&dyn MovableContext, CuError> {
    ctx.movable().ok_or_else(|| {
        CuError::new(
            codes::NOT_SUPPORTED,
            "this worker's device cannot place memory at given addresses",
        )
    })
}

fn unit(result: Result<(), CuError>) -> Answer {
    value(result.map(|()| WorkerValue::Unit))
}

/// A waiting call's answer: its result, with what it printed.
fn waited(outcome: LaunchOutcome) -> Answer {
    Answer {
        result: outcome.result.map(|()| WorkerValue::Unit),
        printed: outcome.stdout,
        bytes: None,
    }
}

/// Reads `len` bytes (one frame's worth at most) with `read`.
/// Each span of `ctx` read into its place in `buf`, one after another.
fn read_spans(
    ctx: &dyn DeviceContext,
    spans: &[(DevicePtr, u64)],
    buf: &mut [u8],
) -> Result<(), CuError> {
    let mut at = 0usize;
    for &(ptr, bytes) in spans {
        let end = at + bytes as usize;
        ctx.mem_read(ptr, &mut buf[at..end])?;
        at = end;
    }
    Ok(())
}

/// Each span of `ctx` written from its place in `data`, which must hold
/// exactly their bytes.
fn write_spans(
    ctx: &dyn DeviceContext,
    spans: &[(DevicePtr, u64)],
    data: &[u8],
) -> Result<(), CuError> {
    let total = spans.iter().fold(0u64, |t, s| t.saturating_add(s.1));
    if total != data.len() as u64 {
        return Err(CuError::new(
            codes::INVALID_VALUE,
            format!("{} bytes for spans of {total}", data.len()),
        ));
    }
    let mut at = 0usize;
    for &(ptr, bytes) in spans {
        let end = at + bytes as usize;
        ctx.mem_write(ptr, &data[at..end])?;
        at = end;
    }
    Ok(())
}

fn read_into(len: u64, read: impl FnOnce(&mut [u8]) -> LaunchOutcome) -> Answer {
    if len > MAX_CHUNK_BYTES as u64 {
        return value(Err(CuError::new(
            codes::INVALID_VALUE,
            format!("a read of {len} bytes"),
        )));
    }
    let mut buf = vec![0u8; len as usize];
    let outcome = read(&mut buf);
    let ok = outcome.result.is_ok();
    Answer {
        result: outcome.result.map(|()| WorkerValue::Bytes),
        printed: outcome.stdout,
        bytes: ok.then_some(buf),
    }
}

/// Runs `call`, a call on the context, a panic its failure; marks when it is
/// done, and logs it when it was slow.
fn guarded(kind: &'static str, call: impl FnOnce() -> Answer) -> Answer {
    let started = Instant::now();
    let executed = catch_unwind(AssertUnwindSafe(call));
    hop_trace::mark(Hop::WorkerDone, kind);
    let us = started.elapsed().as_micros();
    if us > cumux_protocol::SLOW_CALL_US {
        tracing::debug!(target: "cumux::slow", us, kind, "worker: slow request");
    }
    executed.unwrap_or_else(|_| {
        unit(Err(CuError::new(
            codes::LAUNCH_FAILED,
            "the worker's call panicked",
        )))
    })
}
