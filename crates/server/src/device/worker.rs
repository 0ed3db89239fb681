//! Worker-backed devices: each session's context lives in a `cumux worker`
//! child process, so a GPU fault or a driver crash takes down that process only
//! and each session's device `printf` reaches a stdout pipe of its own. This
//! module is the wire and the server's side; the worker's is
//! [`super::worker_process`].
//!
//! Wire: the worker's fd 0 is one end of a socket pair; requests and replies
//! are postcard frames ([`WorkerRequest`], [`WorkerReply`]) and bulk bytes
//! (copies, images) travel as raw frames right after their header: on the
//! socket at first, then through a shared-memory area ([`super::worker_link`]).
//! The worker's fd 1 is a pipe the server reads on a thread: after every call
//! that can flush printf the worker writes a marker (a per-worker nonce and a
//! sequence number) there, and the reply names that number, so the server
//! knows the call's output has all arrived. Calls of one context are serialised
//! by a mutex on the connection (several stream threads wait on each other);
//! a pipelined fast path is later work.
//!
//! Each device keeps one spare worker warm (driver loaded, context created), so
//! a session's first call rarely waits for a process to start.
//!
//! Cost, measured on the H100 against contexts in the server process: a
//! launch+sync round trip takes about 16 µs more (≈ 69 vs 53 µs); a whole
//! `cumux run` of vector_add takes ≈ 30 ms with the spare, ≈ 170 ms without,
//! ≈ 400 ms with in-process contexts (370 ms natively).

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::pinned::HostMapping;
use cumux_protocol::shm::ShmLayout;
use cumux_protocol::{
    codes, decode, encode, write_frame, CuError, DeviceInfo, DevicePtr, FunctionAttrs, Handle,
    ParamInfo, TensorMapRequest,
};
use serde::{Deserialize, Serialize};

use super::shared::{PrintRoute, SharedView};
use super::signals::SignalArea;
use super::spin::answer_spin_time;
use super::watchdog::{AreaWatch, ContextWatch, Reset, Watchdog};
use super::worker_link::{shm_wanted, Link, WORKER_LAYOUT};
use super::{
    Device, DeviceContext, GlobalDesc, KernelDesc, LaunchGeometry, LaunchOutcome, LoadedModule,
    ModuleId, StreamOrdered, StreamWork, SyncTarget,
};

pub use super::worker_process::{
    image_print_detector, serve_worker, WorkerStdout, PRINTF_MARKERS_ENV,
};

/// Bytes that start a stdout marker; the nonce and a little-endian u64 follow.
const MARKER_PREFIX: &[u8] = b"\0\x1bcumux-worker-mark\x1b";
/// Bytes of the per-worker nonce.
pub const NONCE_BYTES: usize = 16;
/// How long a reply waits for its printf output to come through the pipe.
const MARKER_WAIT: Duration = Duration::from_secs(10);
/// How long a new worker may take to create its context.
const READY_WAIT: Duration = Duration::from_secs(120);
/// How long a worker may take to exit once its socket is closed.
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// Printf bytes kept per context between launches at most.
const STDOUT_CAP: usize = 64 << 20;
/// Image parts a module load may send (each at most `MAX_CHUNK_BYTES`).
pub(super) const MAX_IMAGE_PARTS: u32 = 64;

/// A call to a worker. Variants marked so are followed by raw frames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum WorkerRequest {
    MemAlloc {
        bytes: u64,
    },
    MemFree {
        ptr: DevicePtr,
    },
    /// Answered by [`WorkerValue::Bytes`] and one raw frame of `len` bytes.
    MemRead {
        src: DevicePtr,
        len: u64,
    },
    /// Followed by one raw frame: the bytes to write.
    MemWrite {
        dst: DevicePtr,
    },
    MemCopy {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    },
    MemFill {
        dst: DevicePtr,
        pattern: Vec<u8>,
        count: u64,
    },
    /// Followed by `parts` raw frames: the image, in order.
    ModuleLoad {
        parts: u32,
    },
    ModuleUnload {
        module: ModuleId,
    },
    Launch {
        module: ModuleId,
        kernel: u64,
        geometry: LaunchGeometry,
        #[serde(with = "serde_bytes")]
        params: Vec<u8>,
    },
    // Stream-ordered calls ([`StreamOrdered`]); the handles are the session's.
    StreamCreate {
        stream: Handle,
        flags: u32,
        priority: i32,
    },
    StreamDestroy {
        stream: Handle,
    },
    EventCreate {
        event: Handle,
        flags: u32,
    },
    EventDestroy {
        event: Handle,
    },
    /// A graph of launches for [`StreamWork::Graph`] ([`StreamOrdered::graph_create`]).
    GraphCreate {
        graph: Handle,
        launches: Vec<StreamWork>,
    },
    GraphDestroy {
        graph: Handle,
    },
    /// Posted: the worker answers nothing (a failure comes back from the next
    /// waiting call). `Write` work travels with empty `data`; its bytes follow
    /// as one raw frame.
    Enqueue {
        stream: Handle,
        work: StreamWork,
    },
    /// Answered by [`WorkerValue::Bytes`] and one raw frame of `len` bytes.
    StreamRead {
        stream: Handle,
        src: DevicePtr,
        len: u64,
    },
    Synchronize {
        target: SyncTarget,
    },
    /// Answered by [`WorkerValue::Done`].
    Query {
        target: SyncTarget,
    },
    /// Answered by [`WorkerValue::Ms`].
    Elapsed {
        start: Handle,
        end: Handle,
    },
    /// Answered by [`WorkerValue::TensorMap`].
    TensorMapEncode {
        request: TensorMapRequest,
    },
    /// Asks the worker to take further connections to its context, each
    /// served on a thread of its own (`shared` mode); answered by
    /// [`WorkerValue::Sessions`]. Only on the worker's own connection.
    OpenSessions,
    /// Opens the server's signal area at `path` for this connection's
    /// [`StreamWork::Signal`] work ([`StreamOrdered::attach_signals`]).
    AttachSignals {
        path: String,
    },
    /// Maps a client's pinned host region, whose memfd comes with this
    /// request (`SCM_RIGHTS`), and registers it with the context.
    HostRegister {
        region: Handle,
        bytes: u64,
    },
    /// Forgets a region (the server has waited for the work that used it).
    HostUnregister {
        region: Handle,
    },
    /// Polls this connection for `spin_us` before sleeping from now on
    /// ([`StreamOrdered::keep_hot`]); answers nothing.
    KeepHot {
        spin_us: u64,
    },
    /// Offers this connection a shared-memory area of `layout`, whose memfd
    /// comes with this request (`SCM_RIGHTS`); answered on the socket by
    /// [`WorkerValue::Unit`] (every later frame goes through the area) or an
    /// error (the connection stays on the socket). See [`super::worker_link`].
    ShmAttach {
        layout: ShmLayout,
    },
}

/// A worker's answer. The first message a worker sends is one with
/// [`WorkerValue::Ready`] (or the error that kept it from creating its context).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerReply {
    pub result: Result<WorkerValue, CuError>,
    /// The stdout marker written after this call's printf output, if any.
    pub marker: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerValue {
    Ready,
    Unit,
    Ptr(DevicePtr),
    /// One raw frame follows.
    Bytes,
    Module(WireModule),
    Done(bool),
    Ms(f32),
    TensorMap(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Where further connections come in, and the token they open with.
    Sessions {
        path: String,
        token: [u8; NONCE_BYTES],
    },
}

/// [`LoadedModule`] on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireModule {
    pub id: ModuleId,
    pub kernels: Vec<WireKernel>,
    pub globals: Vec<(String, DevicePtr, u64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireKernel {
    pub name: String,
    pub params: Vec<ParamInfo>,
    pub attrs: FunctionAttrs,
}

impl From<&LoadedModule> for WireModule {
    fn from(m: &LoadedModule) -> Self {
        WireModule {
            id: m.id,
            kernels: m
                .kernels
                .iter()
                .map(|k| WireKernel {
                    name: k.name.clone(),
                    params: k.params.clone(),
                    attrs: k.attrs,
                })
                .collect(),
            globals: m
                .globals
                .iter()
                .map(|g| (g.name.clone(), g.ptr, g.size))
                .collect(),
        }
    }
}

impl From<WireModule> for LoadedModule {
    fn from(m: WireModule) -> Self {
        LoadedModule {
            id: m.id,
            kernels: m
                .kernels
                .into_iter()
                .map(|k| KernelDesc {
                    name: k.name,
                    params: k.params,
                    attrs: k.attrs,
                })
                .collect(),
            globals: m
                .globals
                .into_iter()
                .map(|(name, ptr, size)| GlobalDesc { name, ptr, size })
                .collect(),
        }
    }
}

/// The driver's number of hardware work queues per context (1 to 32; 8 by default).
const MAX_CONNECTIONS_ENV: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

pub(super) fn send<T: Serialize>(link: &mut Link, msg: &T) -> io::Result<()> {
    let bytes = encode(msg).map_err(io_err)?;
    link.send_frame(&bytes)
}

/// The marker bytes that end output for call `seq` of the worker with `nonce`.
pub fn marker_bytes(nonce: &[u8; NONCE_BYTES], seq: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(MARKER_PREFIX.len() + NONCE_BYTES + 8);
    m.extend_from_slice(MARKER_PREFIX);
    m.extend_from_slice(nonce);
    m.extend_from_slice(&seq.to_le_bytes());
    m
}

/// A fresh nonce: std's randomly keyed hasher over the pid, time and a counter.
pub fn new_nonce() -> [u8; NONCE_BYTES] {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut out = [0u8; NONCE_BYTES];
    for (i, half) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_usize(i);
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// `nonce` as lowercase hex, for the worker's command line.
pub fn nonce_to_hex(nonce: &[u8; NONCE_BYTES]) -> String {
    nonce.iter().map(|b| format!("{b:02x}")).collect()
}

/// The nonce a hex string names, if it is one.
pub fn nonce_from_hex(text: &str) -> Option<[u8; NONCE_BYTES]> {
    let text = text.as_bytes();
    if text.len() != NONCE_BYTES * 2 {
        return None;
    }
    let mut out = [0u8; NONCE_BYTES];
    for (i, pair) in text.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

// ----- the server side -----

/// How to start a worker: a program and its arguments (the nonce is added).
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl WorkerCommand {
    /// `program worker --device KIND --ordinal N [--memory BYTES]`.
    pub fn cumux(program: PathBuf, kind: &str, ordinal: u32, memory: Option<u64>) -> Self {
        let mut args: Vec<OsString> = vec![
            "worker".into(),
            "--device".into(),
            kind.into(),
            "--ordinal".into(),
            ordinal.to_string().into(),
        ];
        if let Some(bytes) = memory {
            args.push("--memory".into());
            args.push(bytes.to_string().into());
        }
        WorkerCommand { program, args }
    }
}

/// How a worker device gives sessions their contexts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// A context per session, each in a worker process of its own: a fault
    /// or a stray pointer stays with its session; the GPU time-slices
    /// between the contexts.
    Isolated,
    /// One context (one worker) for every session, each on streams of its
    /// own ([`SharedView`]): kernels of different tenants run side by side;
    /// a fault fails every session of the context.
    Shared,
}

impl Sharing {
    /// `isolated` or `shared`.
    pub fn parse(text: &str) -> Result<Sharing, String> {
        match text {
            "isolated" => Ok(Sharing::Isolated),
            "shared" => Ok(Sharing::Shared),
            other => Err(format!(
                "unknown sharing {other:?}: expected isolated or shared"
            )),
        }
    }
}

/// A device whose contexts live in worker processes: one per session, or one
/// for all ([`Sharing`]).
pub struct WorkerDevice {
    info: DeviceInfo,
    launcher: Arc<Launcher>,
    used: Arc<AtomicU64>,
    next_module: Arc<AtomicU64>,
    sharing: Sharing,
    /// The context sessions share (`Shared`), replaced once it dies, and the
    /// route of its device printf.
    shared: Mutex<Option<(Arc<WorkerContext>, Arc<PrintRoute>)>>,
    next_view: AtomicU64,
    /// Whether a module image can print through the driver (which then
    /// writes it wherever the context's next wait flushes it).
    may_print: fn(&[u8]) -> bool,
}

/// `0` turns off the spare worker each device keeps warm for the next session.
pub const SPARES_ENV: &str = "CUMUX_WORKER_SPARES";

impl WorkerDevice {
    /// A device described by `info` whose sessions run in workers that
    /// `command` starts; one spare is kept warm unless `CUMUX_WORKER_SPARES=0`.
    pub fn new(info: DeviceInfo, command: WorkerCommand) -> Self {
        let spare = std::env::var(SPARES_ENV).map_or(true, |v| v.trim() != "0");
        WorkerDevice {
            info,
            launcher: Arc::new(Launcher {
                command,
                keep_spare: spare,
                spare: Mutex::new(None),
                watchdog: std::sync::OnceLock::new(),
            }),
            used: Arc::new(AtomicU64::new(0)),
            next_module: Arc::new(AtomicU64::new(1)),
            sharing: Sharing::Isolated,
            shared: Mutex::new(None),
            next_view: AtomicU64::new(1),
            may_print: |_| false,
        }
    }

    /// The same device, its workers' printing images told by `may_print`
    /// (see [`image_print_detector`]).
    pub fn with_print_detector(mut self, may_print: fn(&[u8]) -> bool) -> Self {
        self.may_print = may_print;
        self
    }

    /// The same device, giving sessions contexts as `sharing` says.
    pub fn with_sharing(mut self, sharing: Sharing) -> Self {
        self.sharing = sharing;
        self
    }

    /// The same device, resetting a context whose queued work makes no progress
    /// for `timeout` ([`Watchdog`]); `None`: never.
    pub fn with_kernel_timeout(self, timeout: Option<Duration>) -> Self {
        if let Some(timeout) = timeout {
            let _ = self.launcher.watchdog.set(Watchdog::new(timeout));
        }
        self
    }

    /// The shared context and its printf route, started anew if there is none
    /// or it died.
    fn shared_context(&self) -> (Arc<WorkerContext>, Arc<PrintRoute>) {
        let mut slot = lock(&self.shared);
        match &*slot {
            Some((ctx, route)) if !ctx.is_dead() => (Arc::clone(ctx), Arc::clone(route)),
            _ => {
                if slot.is_some() {
                    tracing::warn!("the shared context died; new sessions get a fresh one");
                }
                let ctx = Arc::new(WorkerContext::new(
                    Some(Arc::clone(&self.launcher)),
                    Arc::clone(&self.used),
                    Arc::clone(&self.next_module),
                ));
                let route = Arc::new(PrintRoute::default());
                *slot = Some((Arc::clone(&ctx), Arc::clone(&route)));
                (ctx, route)
            }
        }
    }
}

impl Device for WorkerDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The worker starts at the context's first call, so a session that never
    /// touches the device (a `cumux status` query) costs no process.
    fn create_context(&self) -> Result<Arc<dyn DeviceContext>, CuError> {
        if self.sharing == Sharing::Shared {
            let tag = self.next_view.fetch_add(1, Ordering::Relaxed);
            let (primary, route) = self.shared_context();
            let conn = primary.open_connection()?;
            return Ok(Arc::new(SharedView::new(
                primary,
                conn,
                tag,
                route,
                self.may_print,
            )));
        }
        Ok(Arc::new(WorkerContext::new(
            Some(Arc::clone(&self.launcher)),
            Arc::clone(&self.used),
            Arc::clone(&self.next_module),
        )))
    }

    /// Shared: the shared context's worker, then the spare; isolated: the spare
    /// the first session will take. Measured on the H100: a spare creating its
    /// context while a tenant ran stretched that tenant's 50 µs kernels to
    /// 0.5-0.7 ms for ~50 ms (2 % of a 3 s run, its whole p99 tail).
    fn warm_up(&self) {
        let started = Instant::now();
        let ordinal = self.info.ordinal;
        tracing::info!(
            ordinal,
            "starting the device's workers (each creates its context)"
        );
        if self.sharing == Sharing::Shared {
            if let Err(e) = self.shared_context().0.start_now() {
                tracing::warn!(ordinal, "the shared worker did not start: {e}");
                return;
            }
        }
        self.launcher.warm_spare(READY_WAIT);
        let ms = started.elapsed().as_millis();
        tracing::info!(ordinal, ms, "the device's workers are ready");
    }
}

/// A worker started (and perhaps still creating its context) that no session
/// has attached yet.
struct Spawned {
    child: Child,
    stream: UnixStream,
    stdout: ChildStdout,
    nonce: [u8; NONCE_BYTES],
}

/// Starts a device's workers, keeping one spare warming up (driver loaded,
/// context created) so the next session's first call need not wait for it.
pub struct Launcher {
    command: WorkerCommand,
    keep_spare: bool,
    spare: Mutex<Option<Spawned>>,
    /// Resets contexts whose work stops progressing (`--kernel-timeout`).
    watchdog: std::sync::OnceLock<Arc<Watchdog>>,
}

impl Launcher {
    /// The spare if there is a live one (`true`), else a worker started now.
    fn take(&self) -> Result<(Spawned, bool), CuError> {
        let spare = lock(&self.spare).take();
        if let Some(mut spare) = spare {
            match spare.child.try_wait() {
                Ok(None) => return Ok((spare, true)),
                _ => reap(spare.child, Duration::ZERO),
            }
        }
        Ok((spawn_worker(&self.command)?, false))
    }

    /// Starts a spare if there is none and waits, at most `wait`, until it has
    /// created its context (its first message, still unread, is waiting).
    fn warm_spare(&self, wait: Duration) {
        self.refill();
        let socket = match &*lock(&self.spare) {
            Some(spare) => spare.stream.try_clone(),
            None => return,
        };
        match socket {
            Ok(socket) if !readable_within(&socket, wait) => {
                tracing::warn!("the spare worker was not ready within {wait:?}")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cannot watch the spare worker: {e}"),
        }
    }

    /// Starts a new spare if this launcher keeps one and has none.
    fn refill(&self) {
        if !self.keep_spare {
            return;
        }
        let mut spare = lock(&self.spare);
        if spare.is_none() {
            match spawn_worker(&self.command) {
                Ok(s) => *spare = Some(s),
                Err(e) => tracing::warn!("no spare worker: {e}"),
            }
        }
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Some(spare) = lock(&self.spare).take() {
            let Spawned { child, .. } = spare;
            // The socket is closed now; the spare exits on its own.
            reap_in_background(child);
        }
    }
}

/// Whether `socket` has something to read (or hung up) within `wait`.
fn readable_within(socket: &UnixStream, wait: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    rc > 0
}

/// Reaps `child` on a thread of its own, killing it after [`EXIT_GRACE`].
fn reap_in_background(child: Child) {
    let reaper = std::thread::Builder::new()
        .name("cumux-worker-reaper".into())
        .spawn(move || reap(child, EXIT_GRACE));
    if let Err(e) = reaper {
        tracing::warn!("cannot start a reaper thread: {e}");
    }
}

/// Starts a worker: its socket, the read end of its stdout, its nonce.
fn spawn_worker(command: &WorkerCommand) -> Result<Spawned, CuError> {
    let spawn_err = |what: &str, e: io::Error| {
        CuError::new(
            codes::UNKNOWN,
            format!("cannot start a worker: {what}: {e}"),
        )
    };
    let (ours, theirs) = UnixStream::pair().map_err(|e| spawn_err("socketpair", e))?;
    let nonce = new_nonce();
    let mut child = Command::new(&command.program);
    child
        .args(&command.args)
        .arg("--nonce")
        .arg(nonce_to_hex(&nonce))
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // A shared context holds many tenants' streams; with the driver's default of
    // 8 hardware queues, streams of different tenants share queues and a kernel
    // can wait behind another tenant's kernels (false serialization).
    if std::env::var_os(MAX_CONNECTIONS_ENV).is_none() {
        child.env(MAX_CONNECTIONS_ENV, "32");
    }
    let mut child = child
        .spawn()
        .map_err(|e| spawn_err(&command.program.display().to_string(), e))?;
    match child.stdout.take() {
        Some(pipe) => {
            tracing::debug!(pid = child.id(), "worker started");
            Ok(Spawned {
                child,
                stream: ours,
                stdout: pipe,
                nonce,
            })
        }
        None => {
            reap(child, Duration::ZERO);
            Err(CuError::new(codes::UNKNOWN, "a worker without a stdout"))
        }
    }
}

/// Printf text read from a worker's stdout, and the markers seen so far.
#[derive(Default)]
struct TapState {
    text: Vec<u8>,
    seen: u64,
    eof: bool,
}

#[derive(Default)]
struct StdoutTap {
    state: Mutex<TapState>,
    changed: Condvar,
}

impl StdoutTap {
    fn keep(state: &mut TapState, bytes: &[u8]) {
        let room = STDOUT_CAP.saturating_sub(state.text.len());
        if bytes.len() > room {
            tracing::warn!("worker printf output over {STDOUT_CAP} bytes dropped");
        }
        state
            .text
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Reads `pipe` to its end, splitting text from markers.
    fn read_all(&self, mut pipe: impl Read, nonce: [u8; NONCE_BYTES]) {
        let mut needle = MARKER_PREFIX.to_vec();
        needle.extend_from_slice(&nonce);
        let whole = needle.len() + 8;
        let mut pending: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let n = match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            pending.extend_from_slice(&chunk[..n]);
            let mut state = lock(&self.state);
            loop {
                match find(&pending, &needle) {
                    Some(at) if pending.len() >= at + whole => {
                        Self::keep(&mut state, &pending[..at]);
                        let mut seq = [0u8; 8];
                        seq.copy_from_slice(&pending[at + needle.len()..at + whole]);
                        state.seen = state.seen.max(u64::from_le_bytes(seq));
                        pending.drain(..at + whole);
                    }
                    Some(at) => {
                        Self::keep(&mut state, &pending[..at]);
                        pending.drain(..at);
                        break;
                    }
                    None => {
                        // The tail may be the start of a marker: keep it back.
                        let cut = pending.len().saturating_sub(whole - 1);
                        Self::keep(&mut state, &pending[..cut]);
                        pending.drain(..cut);
                        break;
                    }
                }
            }
            drop(state);
            self.changed.notify_all();
        }
        let mut state = lock(&self.state);
        Self::keep(&mut state, &pending);
        state.eof = true;
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until marker `seq` has been read (or the pipe ended).
    fn wait_for(&self, seq: u64) {
        let deadline = Instant::now() + MARKER_WAIT;
        let mut state = lock(&self.state);
        while state.seen < seq && !state.eof {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(seq, "worker printf marker never came; output may be late");
                return;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut lock(&self.state).text)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// How the watchdog resets a context: its error for every later call, and its
/// worker killed (the waits on it end as the worker's socket closes).
fn reset_by_killing(
    sticky: &Arc<Mutex<Option<CuError>>>,
    child: &Arc<Mutex<Option<Child>>>,
) -> Reset {
    let (sticky, child) = (Arc::clone(sticky), Arc::clone(child));
    Box::new(move |why: CuError| {
        lock(&sticky).get_or_insert(why);
        if let Some(child) = lock(&child).as_mut() {
            tracing::warn!(pid = child.id(), "stopping the hung context's worker");
            let _ = child.kill();
        }
    })
}

/// Waits up to `grace` for `child` to exit, then kills it; always reaps it.
fn reap(mut child: Child, grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                tracing::debug!(pid = child.id(), %status, "worker exited");
                return;
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                tracing::warn!(pid = child.id(), "worker did not exit; killing it");
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            Err(_) => return,
        }
    }
}

struct Connection {
    link: Link,
    buf: Vec<u8>,
}

impl Connection {
    /// A connection over `stream`, still on the socket.
    fn new(stream: UnixStream) -> Result<Connection, CuError> {
        let link = Link::new(stream, answer_spin_time()).map_err(|e| {
            CuError::new(
                codes::UNKNOWN,
                format!("cannot clone the worker socket: {e}"),
            )
        })?;
        Ok(Connection {
            link,
            buf: Vec::new(),
        })
    }

    /// Moves the connection onto shared memory unless `CUMUX_WORKER_TRANSPORT`
    /// says `socket`; a worker that refuses, or an area that cannot be made,
    /// leaves it on the socket. An error: the socket itself failed.
    fn offer_shm(&mut self) -> io::Result<()> {
        if !shm_wanted() {
            tracing::debug!("worker connection on its socket (CUMUX_WORKER_TRANSPORT=socket)");
            return Ok(());
        }
        let request = encode(&WorkerRequest::ShmAttach {
            layout: WORKER_LAYOUT,
        })
        .map_err(io_err)?;
        let answer = |bytes: &[u8]| match decode::<WorkerReply>(bytes) {
            Ok(WorkerReply {
                result: Ok(WorkerValue::Unit),
                ..
            }) => Ok(()),
            Ok(WorkerReply { result: Err(e), .. }) => Err(e.to_string()),
            Ok(other) => Err(format!("answered {other:?}")),
            Err(e) => Err(format!("an undecodable answer: {e}")),
        };
        let spin = answer_spin_time();
        match self
            .link
            .offer_area(WORKER_LAYOUT, spin, &request, answer)?
        {
            Ok(()) => tracing::debug!("worker connection on shared memory"),
            Err(why) => tracing::info!("worker connection stays on its socket: {why}"),
        }
        Ok(())
    }
}

/// One session's context in a worker process.
pub struct WorkerContext {
    /// The connection to the worker; `None` until the first call starts it.
    conn: Mutex<Option<Connection>>,
    /// Where the worker comes from (`None`: attached by [`WorkerContext::attach`]).
    launcher: Option<Arc<Launcher>>,
    /// The fault or death that ends this context: every later call fails with it.
    /// Shared by every connection to the same worker context.
    sticky: Arc<Mutex<Option<CuError>>>,
    /// The worker's printf, read from its stdout (replaced if a start is retried).
    tap: Mutex<Arc<StdoutTap>>,
    /// The worker process (the context's first connection's alone).
    child: Arc<Mutex<Option<Child>>>,
    /// The kernel watchdog's view of this context, shared by its connections.
    watch: Option<Arc<ContextWatch>>,
    /// This connection's signal area, as the watchdog reads it.
    area_watch: Mutex<Option<Arc<AreaWatch>>>,
    used: Arc<AtomicU64>,
    next_module: Arc<AtomicU64>,
    /// This context's allocations: base → bytes.
    allocations: Mutex<HashMap<DevicePtr, u64>>,
    /// Device-wide module id → the worker's id and the bytes of its globals.
    modules: Mutex<HashMap<ModuleId, (ModuleId, u64)>>,
    /// A failure of stream-ordered work found here, before posting it.
    deferred: Mutex<Option<CuError>>,
    /// Where further connections to this worker's context come in, once asked.
    sessions: Mutex<Option<(PathBuf, [u8; NONCE_BYTES])>>,
}

impl WorkerContext {
    /// A context whose worker `launcher` starts at the first call.
    fn new(
        launcher: Option<Arc<Launcher>>,
        used: Arc<AtomicU64>,
        next_module: Arc<AtomicU64>,
    ) -> WorkerContext {
        let sticky = Arc::new(Mutex::new(None));
        let child = Arc::new(Mutex::new(None));
        let watch = launcher
            .as_ref()
            .and_then(|l| l.watchdog.get())
            .map(|dog| dog.watch(reset_by_killing(&sticky, &child)));
        WorkerContext {
            conn: Mutex::new(None),
            launcher,
            sticky,
            tap: Mutex::new(Arc::new(StdoutTap::default())),
            child,
            watch,
            area_watch: Mutex::new(None),
            used,
            next_module,
            allocations: Mutex::new(HashMap::new()),
            modules: Mutex::new(HashMap::new()),
            deferred: Mutex::new(None),
            sessions: Mutex::new(None),
        }
    }

    /// A context over a worker already running: `conn` is its socket, `stdout`
    /// the read end of its fd 1 (a thread serving in-process, in tests). Waits
    /// for the worker to be ready.
    pub fn attach(
        conn: UnixStream,
        stdout: impl Read + Send + 'static,
        nonce: [u8; NONCE_BYTES],
        used: Arc<AtomicU64>,
        next_module: Arc<AtomicU64>,
    ) -> Result<WorkerContext, CuError> {
        let ctx = WorkerContext::new(None, used, next_module);
        let connection = ctx.connect(conn, stdout, nonce)?;
        *lock(&ctx.conn) = Some(connection);
        Ok(ctx)
    }

    /// Reads `stdout` on a thread of its own and waits for the worker's ready.
    fn connect(
        &self,
        stream: UnixStream,
        stdout: impl Read + Send + 'static,
        nonce: [u8; NONCE_BYTES],
    ) -> Result<Connection, CuError> {
        let tap = Arc::new(StdoutTap::default());
        *lock(&self.tap) = Arc::clone(&tap);
        std::thread::Builder::new()
            .name("cumux-worker-stdout".into())
            .spawn(move || tap.read_all(stdout, nonce))
            .map_err(|e| {
                CuError::new(codes::UNKNOWN, format!("cannot start a stdout reader: {e}"))
            })?;
        let mut conn = Connection::new(stream)?;
        let _ = conn.link.socket().set_read_timeout(Some(READY_WAIT));
        let ready = self.receive(&mut conn);
        let _ = conn.link.socket().set_read_timeout(None);
        match ready {
            Ok(WorkerReply {
                result: Ok(WorkerValue::Ready),
                ..
            }) => {
                conn.offer_shm().map_err(|e| {
                    CuError::new(
                        codes::UNKNOWN,
                        format!("the worker failed at the transport offer: {e}"),
                    )
                })?;
                Ok(conn)
            }
            Ok(WorkerReply { result: Err(e), .. }) => Err(e),
            Ok(other) => Err(CuError::new(
                codes::UNKNOWN,
                format!("the worker started with {other:?}"),
            )),
            Err(e) => Err(CuError::new(
                codes::UNKNOWN,
                format!("the worker never became ready: {e}"),
            )),
        }
    }

    /// Starts this context's worker now, if it has not started.
    fn start_now(&self) -> Result<(), CuError> {
        let mut slot = lock(&self.conn);
        self.connection(&mut slot).map(|_| ())
    }

    /// Starts the worker of a context made by [`WorkerContext::new`].
    /// A spare that fails to attach (it died idle) is replaced by a fresh
    /// worker once; a new spare starts warming up either way.
    fn start(&self) -> Result<Connection, CuError> {
        let Some(launcher) = &self.launcher else {
            return Err(CuError::new(
                codes::INVALID_CONTEXT,
                "the context's worker is gone",
            ));
        };
        let (spawned, warm) = launcher.take()?;
        let attached = self.adopt(spawned);
        launcher.refill();
        match attached {
            Err(e) if warm => {
                tracing::warn!("the spare worker failed ({e}); starting another");
                self.adopt(spawn_worker(&launcher.command)?)
            }
            other => other,
        }
    }

    /// Makes `spawned` this context's worker.
    fn adopt(&self, spawned: Spawned) -> Result<Connection, CuError> {
        let Spawned {
            child,
            stream,
            stdout,
            nonce,
        } = spawned;
        *lock(&self.child) = Some(child);
        self.connect(stream, stdout, nonce).inspect_err(|_| {
            if let Some(child) = lock(&self.child).take() {
                reap(child, Duration::from_secs(1));
            }
        })
    }

    /// How this context's calls reach its worker: `shm`, `socket`, or `none`
    /// before the worker starts.
    pub fn transport(&self) -> &'static str {
        match &*lock(&self.conn) {
            Some(conn) if conn.link.is_shm() => "shm",
            Some(_) => "socket",
            None => "none",
        }
    }

    /// The worker's process id, if it is a process.
    pub fn pid(&self) -> Option<u32> {
        lock(&self.child).as_ref().map(Child::id)
    }

    fn receive(&self, conn: &mut Connection) -> io::Result<WorkerReply> {
        conn.link.recv_frame(&mut conn.buf).map_err(io_err)?;
        decode(&conn.buf).map_err(io_err)
    }

    fn sticky(&self) -> Option<CuError> {
        lock(&self.sticky).clone()
    }

    /// Whether the context is unusable: its worker died or a fault poisoned it.
    pub fn is_dead(&self) -> bool {
        self.sticky().is_some()
    }

    /// Where further connections to this context come in, once opened.
    pub fn sessions_address(&self) -> Option<(PathBuf, [u8; NONCE_BYTES])> {
        lock(&self.sessions).clone()
    }

    /// A further connection to this context's worker, served on a thread of
    /// its own there (`shared` mode): its calls and waits hold up no other
    /// connection's. It shares this context's fate (a fault or the worker's
    /// death ends both) and printf stream; its memory and modules are its own
    /// to track.
    pub fn open_connection(&self) -> Result<WorkerContext, CuError> {
        let known = lock(&self.sessions).clone();
        let (path, token) = match known {
            Some(found) => found,
            None => match self.call(&WorkerRequest::OpenSessions, &[], None)? {
                WorkerValue::Sessions { path, token } => {
                    let found = (PathBuf::from(path), token);
                    *lock(&self.sessions) = Some(found.clone());
                    found
                }
                other => return Err(unexpected(&other)),
            },
        };
        let fail = |e: io::Error| {
            CuError::new(
                codes::UNKNOWN,
                format!("cannot connect to the shared worker: {e}"),
            )
        };
        let mut stream = UnixStream::connect(&path).map_err(fail)?;
        write_frame(&mut stream, &token).map_err(|e| fail(io_err(e)))?;
        let mut conn = Connection::new(stream)?;
        conn.offer_shm().map_err(fail)?;
        Ok(WorkerContext {
            conn: Mutex::new(Some(conn)),
            launcher: None,
            sticky: Arc::clone(&self.sticky),
            tap: Mutex::new(Arc::clone(&lock(&self.tap))),
            child: Arc::new(Mutex::new(None)),
            watch: self.watch.clone(),
            area_watch: Mutex::new(None),
            used: Arc::clone(&self.used),
            next_module: Arc::clone(&self.next_module),
            allocations: Mutex::new(HashMap::new()),
            modules: Mutex::new(HashMap::new()),
            deferred: Mutex::new(None),
            sessions: Mutex::new(None),
        })
    }

    /// Records that the worker is gone; the error every later call gets.
    fn died(&self, why: &io::Error) -> CuError {
        let mut sticky = lock(&self.sticky);
        if let Some(e) = &*sticky {
            return e.clone();
        }
        let e = CuError::new(
            codes::LAUNCH_FAILED,
            format!("the session's worker process died ({why})"),
        );
        tracing::warn!(pid = ?self.pid(), "{e}");
        *sticky = Some(e.clone());
        drop(sticky);
        // Reap it now (it is exiting) so no zombie waits for the session to end.
        if let Some(child) = lock(&self.child).take() {
            reap(child, Duration::from_secs(1));
        }
        e
    }

    /// One round trip: the request, its raw frames, the reply and any bytes
    /// read back into `back`.
    fn call(
        &self,
        request: &WorkerRequest,
        frames: &[&[u8]],
        back: Option<&mut [u8]>,
    ) -> Result<WorkerValue, CuError> {
        self.call_passing(request, None, frames, back)
    }

    /// [`WorkerContext::call`], with `fd` sent along with the request (`SCM_RIGHTS`).
    fn call_passing(
        &self,
        request: &WorkerRequest,
        fd: Option<BorrowedFd<'_>>,
        frames: &[&[u8]],
        back: Option<&mut [u8]>,
    ) -> Result<WorkerValue, CuError> {
        if let Some(e) = self.sticky() {
            return Err(e);
        }
        let kind: &'static str = request.into();
        let mut slot = lock(&self.conn);
        let conn = self.connection(&mut slot)?;
        hop_trace::mark(Hop::ServerForward, kind);
        let exchanged = (|| -> io::Result<WorkerReply> {
            match fd {
                None => send(&mut conn.link, request)?,
                Some(fd) => {
                    let bytes = encode(request).map_err(io_err)?;
                    conn.link.send_frame_with_fd(&bytes, fd)?;
                }
            }
            for frame in frames {
                conn.link.send_frame(frame)?;
            }
            let reply = self.receive(conn)?;
            if let Ok(WorkerValue::Bytes) = &reply.result {
                conn.link.recv_frame(&mut conn.buf).map_err(io_err)?;
                match back {
                    Some(back) if back.len() == conn.buf.len() => back.copy_from_slice(&conn.buf),
                    _ => {
                        return Err(io_err(format!(
                            "{} unexpected bytes back from the worker",
                            conn.buf.len()
                        )))
                    }
                }
            }
            Ok(reply)
        })();
        drop(slot);
        hop_trace::mark(Hop::ServerBack, kind);
        let reply = match exchanged {
            Ok(reply) => reply,
            Err(e) => return Err(self.died(&e)),
        };
        if let Some(seq) = reply.marker {
            let tap = Arc::clone(&lock(&self.tap));
            tap.wait_for(seq);
            hop_trace::mark(Hop::PrintfMarker, kind);
        }
        match reply.result {
            Err(e) if codes::is_fatal(e.code) => {
                lock(&self.sticky).get_or_insert_with(|| e.clone());
                Err(e)
            }
            other => other,
        }
    }

    /// The worker's connection, starting the worker at the first call.
    fn connection<'a>(
        &self,
        slot: &'a mut Option<Connection>,
    ) -> Result<&'a mut Connection, CuError> {
        if slot.is_none() {
            match self.start() {
                Ok(conn) => *slot = Some(conn),
                Err(e) => {
                    tracing::warn!("a session's worker did not start: {e}");
                    lock(&self.sticky).get_or_insert_with(|| e.clone());
                    return Err(e);
                }
            }
        }
        slot.as_mut()
            .ok_or_else(|| CuError::new(codes::INVALID_CONTEXT, "no worker"))
    }

    /// Sends a request the worker does not answer, and its raw frames. A
    /// failure is kept for the next waiting call.
    fn post(&self, request: &WorkerRequest, frames: &[&[u8]]) {
        if self.sticky().is_some() {
            return;
        }
        let mut slot = lock(&self.conn);
        let conn = match self.connection(&mut slot) {
            Ok(conn) => conn,
            Err(_) => return,
        };
        hop_trace::mark(Hop::ServerForward, request.into());
        let sent = (|| -> io::Result<()> {
            send(&mut conn.link, request)?;
            for frame in frames {
                conn.link.send_frame(frame)?;
            }
            Ok(())
        })();
        drop(slot);
        hop_trace::mark(Hop::Step, "posted");
        if let Err(e) = sent {
            self.died(&e);
        }
    }

    /// Keeps a failure found before work could be posted, for the next waiting call.
    fn defer(&self, e: CuError) {
        lock(&self.deferred).get_or_insert(e);
    }

    /// `result`, unless posted work failed before it; with the printf text.
    fn waited(&self, result: Result<(), CuError>) -> LaunchOutcome {
        let result = match lock(&self.deferred).take() {
            Some(e) => Err(e),
            None => result,
        };
        LaunchOutcome {
            stdout: Arc::clone(&lock(&self.tap)).take(),
            result,
        }
    }

    fn unit(&self, request: &WorkerRequest, frames: &[&[u8]]) -> Result<(), CuError> {
        match self.call(request, frames, None)? {
            WorkerValue::Unit => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(value: &WorkerValue) -> CuError {
    CuError::new(
        codes::UNKNOWN,
        format!("unexpected answer from the worker: {value:?}"),
    )
}

fn release(used: &AtomicU64, bytes: u64) {
    let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        Some(u.saturating_sub(bytes))
    });
}

impl DeviceContext for WorkerContext {
    fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, CuError> {
        match self.call(&WorkerRequest::MemAlloc { bytes }, &[], None)? {
            WorkerValue::Ptr(ptr) => {
                lock(&self.allocations).insert(ptr, bytes);
                self.used.fetch_add(bytes, Ordering::AcqRel);
                Ok(ptr)
            }
            other => Err(unexpected(&other)),
        }
    }

    fn mem_free(&self, ptr: DevicePtr) -> Result<(), CuError> {
        self.unit(&WorkerRequest::MemFree { ptr }, &[])?;
        if let Some(bytes) = lock(&self.allocations).remove(&ptr) {
            release(&self.used, bytes);
        }
        Ok(())
    }

    fn mem_read(&self, src: DevicePtr, buf: &mut [u8]) -> Result<(), CuError> {
        let mut offset = 0u64;
        for part in buf.chunks_mut(MAX_CHUNK_BYTES) {
            let request = WorkerRequest::MemRead {
                src: src.wrapping_add(offset),
                len: part.len() as u64,
            };
            offset += part.len() as u64;
            match self.call(&request, &[], Some(part))? {
                WorkerValue::Bytes => {}
                other => return Err(unexpected(&other)),
            }
        }
        Ok(())
    }

    fn mem_write(&self, dst: DevicePtr, data: &[u8]) -> Result<(), CuError> {
        let mut offset = 0u64;
        for part in data.chunks(MAX_CHUNK_BYTES) {
            let request = WorkerRequest::MemWrite {
                dst: dst.wrapping_add(offset),
            };
            offset += part.len() as u64;
            self.unit(&request, &[part])?;
        }
        Ok(())
    }

    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), CuError> {
        self.unit(&WorkerRequest::MemCopy { dst, src, bytes }, &[])
    }

    fn mem_fill(&self, dst: DevicePtr, pattern: &[u8], count: u64) -> Result<(), CuError> {
        let request = WorkerRequest::MemFill {
            dst,
            pattern: pattern.to_vec(),
            count,
        };
        self.unit(&request, &[])
    }

    fn module_load(&self, image: &[u8]) -> Result<LoadedModule, CuError> {
        let parts: Vec<&[u8]> = image.chunks(MAX_CHUNK_BYTES).collect();
        let count = u32::try_from(parts.len())
            .ok()
            .filter(|n| *n <= MAX_IMAGE_PARTS)
            .ok_or_else(|| {
                CuError::new(
                    codes::INVALID_IMAGE,
                    format!("an image of {} bytes", image.len()),
                )
            })?;
        let module = match self.call(&WorkerRequest::ModuleLoad { parts: count }, &parts, None)? {
            WorkerValue::Module(m) => LoadedModule::from(m),
            other => return Err(unexpected(&other)),
        };
        let globals_bytes: u64 = module.globals.iter().map(|g| g.size).sum();
        self.used.fetch_add(globals_bytes, Ordering::AcqRel);
        let id = self.next_module.fetch_add(1, Ordering::Relaxed);
        lock(&self.modules).insert(id, (module.id, globals_bytes));
        Ok(LoadedModule { id, ..module })
    }

    fn module_unload(&self, module: ModuleId) {
        let Some((local, globals_bytes)) = lock(&self.modules).remove(&module) else {
            return;
        };
        release(&self.used, globals_bytes);
        if let Err(e) = self.unit(&WorkerRequest::ModuleUnload { module: local }, &[]) {
            tracing::debug!("worker module unload: {e}");
        }
    }

    fn launch(
        &self,
        module: ModuleId,
        kernel: usize,
        geometry: &LaunchGeometry,
        params: &[u8],
    ) -> LaunchOutcome {
        let local = lock(&self.modules).get(&module).map(|(local, _)| *local);
        let result = match local {
            None => Err(CuError::new(codes::INVALID_HANDLE, "module not loaded")),
            Some(local) => {
                let request = WorkerRequest::Launch {
                    module: local,
                    kernel: kernel as u64,
                    geometry: geometry.clone(),
                    params: params.to_vec(),
                };
                self.unit(&request, &[])
            }
        };
        LaunchOutcome {
            stdout: Arc::clone(&lock(&self.tap)).take(),
            result,
        }
    }

    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        Some(self)
    }

    fn tensor_map_encode(&self, request: &TensorMapRequest) -> Result<Vec<u8>, CuError> {
        let request = WorkerRequest::TensorMapEncode {
            request: request.clone(),
        };
        match self.call(&request, &[], None)? {
            WorkerValue::TensorMap(bytes) => Ok(bytes),
            other => Err(unexpected(&other)),
        }
    }

    fn host_register(
        &self,
        region: Handle,
        mapping: &Arc<HostMapping>,
        fd: BorrowedFd<'_>,
    ) -> Result<(), CuError> {
        let request = WorkerRequest::HostRegister {
            region,
            bytes: mapping.len() as u64,
        };
        match self.call_passing(&request, Some(fd), &[], None)? {
            WorkerValue::Unit => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    fn host_unregister(&self, region: Handle) {
        if let Err(e) = self.unit(&WorkerRequest::HostUnregister { region }, &[]) {
            tracing::debug!(region, "worker host unregister: {e}");
        }
    }
}

impl StreamOrdered for WorkerContext {
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

    fn graph_create(&self, graph: Handle, launches: Vec<StreamWork>) -> Result<(), CuError> {
        let modules = lock(&self.modules);
        let local = launches
            .into_iter()
            .map(|work| match work {
                StreamWork::Launch {
                    module,
                    kernel,
                    geometry,
                    params,
                } => match modules.get(&module) {
                    Some((local, _)) => Ok(StreamWork::Launch {
                        module: *local,
                        kernel,
                        geometry,
                        params,
                    }),
                    None => Err(CuError::new(codes::INVALID_HANDLE, "module not loaded")),
                },
                _ => Err(CuError::new(
                    codes::INVALID_VALUE,
                    "a graph of launches only",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        drop(modules);
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
    /// context does not have; what fails in the worker comes back later.
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
                    let work = StreamWork::Write {
                        dst: dst.wrapping_add(offset),
                        data: Vec::new(),
                    };
                    offset += part.len() as u64;
                    self.post(&WorkerRequest::Enqueue { stream, work }, &[part]);
                }
                true
            }
            StreamWork::Launch {
                module,
                kernel,
                geometry,
                params,
            } => match lock(&self.modules).get(&module).map(|(local, _)| *local) {
                Some(local) => {
                    let work = StreamWork::Launch {
                        module: local,
                        kernel,
                        geometry,
                        params,
                    };
                    self.post(&WorkerRequest::Enqueue { stream, work }, &[]);
                    true
                }
                None => {
                    self.defer(CuError::new(codes::INVALID_HANDLE, "module not loaded"));
                    false
                }
            },
            work => {
                self.post(&WorkerRequest::Enqueue { stream, work }, &[]);
                true
            }
        }
    }

    fn read(&self, stream: Handle, src: DevicePtr, buf: &mut [u8]) -> LaunchOutcome {
        let mut offset = 0u64;
        let mut result = Ok(());
        for part in buf.chunks_mut(MAX_CHUNK_BYTES) {
            let request = WorkerRequest::StreamRead {
                stream,
                src: src.wrapping_add(offset),
                len: part.len() as u64,
            };
            offset += part.len() as u64;
            result = match self.call(&request, &[], Some(part)) {
                Ok(WorkerValue::Bytes) => Ok(()),
                Ok(other) => Err(unexpected(&other)),
                Err(e) => Err(e),
            };
            if result.is_err() {
                break;
            }
        }
        self.waited(result)
    }

    fn synchronize(&self, target: SyncTarget) -> LaunchOutcome {
        let result = self.unit(&WorkerRequest::Synchronize { target }, &[]);
        self.waited(result)
    }

    fn query(&self, target: SyncTarget) -> Result<bool, CuError> {
        if let Some(e) = lock(&self.deferred).take() {
            return Err(e);
        }
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

    fn attach_signals(&self, path: &Path) -> Result<(), CuError> {
        let path = path.to_str().ok_or_else(|| {
            CuError::new(codes::INVALID_VALUE, "a signal area path that is not UTF-8")
        })?;
        let request = WorkerRequest::AttachSignals {
            path: path.to_string(),
        };
        self.unit(&request, &[])?;
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

impl Drop for WorkerContext {
    fn drop(&mut self) {
        let allocated: u64 = lock(&self.allocations).drain().map(|(_, b)| b).sum();
        let globals: u64 = lock(&self.modules).drain().map(|(_, (_, b))| b).sum();
        release(&self.used, allocated + globals);
        // Closing the socket tells the worker to tear its context down and exit.
        if let Some(conn) = lock(&self.conn).take() {
            let _ = conn.link.socket().shutdown(std::net::Shutdown::Both);
        }
        if let Some(child) = lock(&self.child).take() {
            reap_in_background(child);
        }
    }
}

// ----- devices -----

/// The CPU reference device served by workers (for tests of this machinery).
#[cfg(feature = "cpu")]
pub fn cpu_worker_device(
    program: PathBuf,
    memory: u64,
    launch_budget: u64,
    sharing: Sharing,
    kernel_timeout: Option<Duration>,
) -> Arc<dyn Device> {
    let info = super::cpu::CpuDevice::new(memory).info().clone();
    let mut command = WorkerCommand::cumux(program, "cpu", 0, Some(memory));
    command.args.push("--launch-budget".into());
    command.args.push(launch_budget.to_string().into());
    Arc::new(
        WorkerDevice::new(info, command)
            .with_sharing(sharing)
            .with_kernel_timeout(kernel_timeout)
            .with_print_detector(image_print_detector("cpu")),
    )
}

/// Every GPU of the system's CUDA driver, each served by workers that
/// `program` starts. The driver is initialised here to read the devices'
/// descriptions, but no context is created in this process.
#[cfg(feature = "cuda")]
pub fn cuda_worker_devices(
    program: PathBuf,
    sharing: Sharing,
    kernel_timeout: Option<Duration>,
) -> Result<Vec<Arc<dyn Device>>, String> {
    let driver = cumux_cuda_driver::Driver::load().map_err(|e| e.to_string())?;
    let count = driver.device_count().map_err(|e| e.to_string())?;
    if count == 0 {
        return Err(format!(
            "the CUDA driver {} reports no GPU",
            driver.library()
        ));
    }
    let mut out: Vec<Arc<dyn Device>> = Vec::new();
    for ordinal in 0..count {
        let device = super::cuda::CudaDevice::new(
            &driver,
            ordinal,
            super::cuda::ContextMode::PerSession,
            false,
        )
        .map_err(|e| e.to_string())?;
        let info = device.info().clone();
        tracing::info!(ordinal, name = %info.name, memory = info.total_mem, ?sharing, "cuda: GPU, served by worker processes");
        out.push(Arc::new(
            WorkerDevice::new(
                info,
                WorkerCommand::cumux(program.clone(), "cuda", ordinal, None),
            )
            .with_sharing(sharing)
            .with_kernel_timeout(kernel_timeout)
            .with_print_detector(image_print_detector("cuda")),
        ));
    }
    Ok(out)
}

/// The device a worker process serves: `cpu` (with `memory` bytes and a
/// per-block `launch_budget` of instructions, 0 for none) or `cuda` (GPU
/// `ordinal`, its context created in this process, printf left on fd 1).
pub fn local_device(
    kind: &str,
    ordinal: u32,
    memory: u64,
    launch_budget: u64,
) -> Result<Arc<dyn Device>, String> {
    match kind {
        "cpu" => super::cpu_device(memory, launch_budget),
        #[cfg(feature = "cuda")]
        "cuda" => {
            let driver = cumux_cuda_driver::Driver::load().map_err(|e| e.to_string())?;
            let device = super::cuda::CudaDevice::new(
                &driver,
                ordinal,
                super::cuda::ContextMode::PerSession,
                false,
            )
            .map_err(|e| e.to_string())?;
            Ok(Arc::new(device))
        }
        other => Err(format!(
            "a worker serves cpu or cuda devices, not {other:?} (ordinal {ordinal})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_round_trip_through_hex() {
        let n = new_nonce();
        assert_ne!(n, new_nonce());
        assert_eq!(nonce_from_hex(&nonce_to_hex(&n)), Some(n));
        assert_eq!(nonce_from_hex("zz"), None);
        assert_eq!(nonce_from_hex(&"g".repeat(32)), None);
    }

    #[test]
    fn the_tap_splits_text_from_markers_across_reads() {
        let nonce = new_nonce();
        let mut stream = b"hello ".to_vec();
        stream.extend(marker_bytes(&nonce, 1));
        stream.extend_from_slice(b"world\n");
        // A marker of another nonce is text.
        stream.extend(marker_bytes(&[0; NONCE_BYTES], 9));
        stream.extend(marker_bytes(&nonce, 2));
        stream.extend_from_slice(b"tail");
        /// Hands out one byte per read, so markers straddle reads.
        struct Trickle(Vec<u8>, usize);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.1 >= self.0.len() || buf.is_empty() {
                    return Ok(0);
                }
                buf[0] = self.0[self.1];
                self.1 += 1;
                Ok(1)
            }
        }
        let tap = StdoutTap::default();
        tap.read_all(Trickle(stream, 0), nonce);
        let state = lock(&tap.state);
        assert_eq!(state.seen, 2);
        assert!(state.eof);
        let mut want = b"hello world\n".to_vec();
        want.extend(marker_bytes(&[0; NONCE_BYTES], 9));
        want.extend_from_slice(b"tail");
        assert_eq!(state.text, want);
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let requests = [
            WorkerRequest::MemAlloc { bytes: 7 },
            WorkerRequest::MemRead { src: 1, len: 2 },
            WorkerRequest::ModuleLoad { parts: 3 },
            WorkerRequest::Launch {
                module: 1,
                kernel: 2,
                geometry: LaunchGeometry {
                    grid: [1, 2, 3],
                    block: [4, 5, 6],
                    dynamic_shared_bytes: 7,
                    attributes: vec![cumux_protocol::LaunchAttribute::ClusterDim([2, 1, 1])],
                },
                params: vec![8, 9],
            },
        ];
        for r in requests {
            let back: WorkerRequest = decode(&encode(&r).unwrap()).unwrap();
            assert_eq!(back, r);
        }
        // Every kind of queued work that travels (a variant skipped by serde in the
        // middle of the enum once shifted the numbers of those after it).
        let span = crate::host_regions::HostSpan {
            region: 4,
            offset: 8,
            bytes: 16,
            mapping: None,
        };
        let works = [
            StreamWork::Record { event: 1 },
            StreamWork::Wait { event: 2 },
            StreamWork::Signal { slot: 3, value: 4 },
            StreamWork::HostToDevice {
                dst: 5,
                host: span.clone(),
            },
            StreamWork::DeviceToHost { src: 6, host: span },
        ];
        for work in works {
            let r = WorkerRequest::Enqueue { stream: 9, work };
            let back: WorkerRequest = decode(&encode(&r).unwrap()).unwrap();
            assert_eq!(back, r);
        }
        let reply = WorkerReply {
            result: Err(CuError::new(700, "fault")),
            marker: Some(3),
        };
        let back: WorkerReply = decode(&encode(&reply).unwrap()).unwrap();
        assert_eq!(back, reply);
    }
}
