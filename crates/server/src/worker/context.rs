//! [`WorkerContext`]: the server's side of one context in a worker process (a
//! session's own, or one connection to a `shared` context). It implements
//! [`DeviceContext`] and [`StreamOrdered`] by round trips to the worker, except
//! stream-ordered work, which it posts unanswered; it starts its worker at the
//! first call (taking the device's spare), keeps the fault or death that ends
//! the context, and waits for a call's printf to come through the stdout tap.

use crate::sm_parts::SmPart;
use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cumux_protocol::arrays::{CopyEnd, CopyExtent};
use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::{
    codes, decode, encode, write_frame, ClusterQuery, CuError, DevicePtr, Handle, TensorMapRequest,
};

mod sm_cap;
mod stream_ordered;

use super::colocation::{Colocation, Host};
use super::link::{io_err, Connection};
use super::spawn::{reap, reap_in_background, reset_by_killing, Launcher, Spawned, READY_WAIT};
use super::stdout_tap::StdoutTap;
use super::watchdog::{AreaWatch, ContextWatch};
use super::wire::{
    WireWork, WorkerReply, WorkerRequest, WorkerValue, MAX_IMAGE_PARTS, NONCE_BYTES,
};
use crate::device::arrays::ArrayOp;
use crate::device::imported::{ImportedChunk, MappedChunks};
use crate::device::limits::LimitSetting;
use crate::device::memory_use::ContextMemory;
use crate::device::pieces::{Buffer, TakePiece};
use crate::device::{
    DeviceContext, HostRegion, KernelLaunch, LaunchGeometry, LaunchOutcome, LoadedModule, ModuleId,
    StreamOrdered, StreamWork, VmmOp, WorkProcess,
};
use crate::locking::lock;

/// What ends a context, shared by the contexts of one worker process: the
/// fault or death kept for every later call, and the process itself.
type Fate = (Arc<Mutex<Option<CuError>>>, Arc<Mutex<Option<Child>>>);

/// One session's context in a worker process.
pub struct WorkerContext {
    /// The connection to the worker; `None` until the first call starts it.
    pub(super) conn: Mutex<Option<Connection>>,
    /// Where the worker comes from (`None`: attached by [`WorkerContext::attach`]).
    launcher: Option<Arc<Launcher>>,
    /// The fault or death that ends this context: every later call fails with it.
    /// Shared by every connection to the same worker context.
    pub(super) sticky: Arc<Mutex<Option<CuError>>>,
    /// The worker's printf, read from its stdout (replaced if a start is retried).
    tap: Mutex<Arc<StdoutTap>>,
    /// This connection's printf markers whose text it has not taken yet.
    markers: Mutex<Vec<u64>>,
    /// The worker process (the context's first connection's alone).
    child: Arc<Mutex<Option<Child>>>,
    /// The kernel watchdog's view of this context, shared by its connections.
    watch: Option<Arc<ContextWatch>>,
    /// This connection's signal area, as the watchdog reads it.
    area_watch: Mutex<Option<Arc<AreaWatch>>>,
    /// This connection's allocations, in the device's bytes in use.
    pub(super) memory: ContextMemory,
    next_module: Arc<AtomicU64>,
    /// Device-wide module id → the worker's id and the bytes of its globals.
    modules: Mutex<HashMap<ModuleId, (ModuleId, u64)>>,
    /// A failure of stream-ordered work found here, before posting it.
    deferred: Mutex<Option<CuError>>,
    /// Whether posts go without ringing a sleeping worker
    /// (`StreamOrdered::hold_posts`).
    posts_held: AtomicBool,
    /// Whether it loaded a module that can print: its printf waits in the
    /// worker for a wait that asks it (`StreamOrdered::printf_waiting`).
    pub(super) printing: AtomicBool,
    /// Where further connections to this worker's context come in, once asked.
    sessions: Mutex<Option<(PathBuf, [u8; NONCE_BYTES])>>,
    /// A signal area to attach once the worker starts: a link to it that
    /// keeps it while the session unlinks its own name
    /// (`StreamOrdered::attach_signals` before the first call).
    pending_signals: Mutex<Option<PathBuf>>,
    /// The program's group this context joins, and its device's ordinal
    /// there ([`Colocation`]); `None`: a process of its own.
    member: Option<(Arc<Colocation>, u32)>,
    /// Whether its process runs only its program's contexts (an isolated
    /// device's), so that NVIDIA's figures for that process are its own.
    own_process: bool,
    /// The share of its device's SMs the context's kernels may use, asked of
    /// the worker when it starts (`WorkerRequest::SmCap`); `None`: all.
    sm_cap: Mutex<Option<SmPart>>,
    /// Requests sent that waited for an answer.
    round_trips: AtomicU64,
}

impl WorkerContext {
    /// A context whose worker `launcher` starts at the first call.
    pub fn new(
        launcher: Option<Arc<Launcher>>,
        used: Arc<AtomicU64>,
        next_module: Arc<AtomicU64>,
    ) -> WorkerContext {
        let fate = (Arc::default(), Arc::default());
        WorkerContext::sharing_fate(launcher, used, next_module, fate, None)
    }

    /// A context whose fault and worker process are `fate`'s (shared with
    /// the other members of `member`'s group, if any).
    fn sharing_fate(
        launcher: Option<Arc<Launcher>>,
        used: Arc<AtomicU64>,
        next_module: Arc<AtomicU64>,
        fate: Fate,
        member: Option<(Arc<Colocation>, u32)>,
    ) -> WorkerContext {
        let (sticky, child) = fate;
        let watch = launcher
            .as_ref()
            .and_then(|l| l.watchdog())
            .map(|dog| dog.watch(reset_by_killing(&sticky, &child)));
        WorkerContext {
            conn: Mutex::new(None),
            launcher,
            sticky,
            tap: Mutex::new(Arc::new(StdoutTap::default())),
            markers: Mutex::new(Vec::new()),
            child,
            watch,
            area_watch: Mutex::new(None),
            memory: ContextMemory::new(used),
            next_module,
            modules: Mutex::new(HashMap::new()),
            deferred: Mutex::new(None),
            posts_held: AtomicBool::new(false),
            printing: AtomicBool::new(false),
            sessions: Mutex::new(None),
            pending_signals: Mutex::new(None),
            member,
            own_process: false,
            sm_cap: Mutex::new(None),
            round_trips: AtomicU64::new(0),
        }
    }

    /// A context of a program's group on device `ordinal`: at its first call
    /// it joins the group's host process with a context of its own there, or,
    /// with no live host, starts a worker (from `launcher`) and hosts the group.
    pub fn member(
        launcher: Arc<Launcher>,
        used: Arc<AtomicU64>,
        next_module: Arc<AtomicU64>,
        group: Arc<Colocation>,
        ordinal: u32,
    ) -> WorkerContext {
        let fate = (Arc::clone(&group.sticky), Arc::clone(&group.child));
        let member = Some((group, ordinal));
        WorkerContext::sharing_fate(Some(launcher), used, next_module, fate, member)
    }

    /// What a group's later members need to join this context's process:
    /// its sessions socket (opened now if need be), printf stream and fate.
    pub fn as_host(&self) -> Result<Host, CuError> {
        let (path, token) = self.sessions_socket()?;
        Ok(self.host_at(path, token))
    }

    /// This context's process as a group's host, its sessions socket `path`.
    fn host_at(&self, path: PathBuf, token: [u8; NONCE_BYTES]) -> Host {
        Host {
            path,
            token,
            tap: Arc::clone(&lock(&self.tap)),
            sticky: Arc::clone(&self.sticky),
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
        // A new worker numbers its markers afresh.
        lock(&self.markers).clear();
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
    pub fn start_now(&self) -> Result<(), CuError> {
        let mut slot = lock(&self.conn);
        self.connection(&mut slot).map(|_| ())
    }

    /// Starts this context: a group member joins its group's live host, or
    /// starts a worker of its own and becomes the host; any other context
    /// starts a worker ([`WorkerContext::start_own`]).
    fn start(&self) -> Result<Connection, CuError> {
        let Some((group, ordinal)) = &self.member else {
            return self.start_own();
        };
        let mut host = group.starting();
        if let Some(live) = host.as_ref().filter(|h| lock(&h.sticky).is_none()) {
            *lock(&self.tap) = Arc::clone(&live.tap);
            lock(&self.markers).clear();
            let joined = join(&live.path, &live.token, Some(*ordinal))?;
            tracing::info!(
                ordinal,
                "a context joins its program's worker process (one address space for its devices)"
            );
            return Ok(joined);
        }
        let mut conn = self.start_own()?;
        tracing::debug!(ordinal, pid = ?self.pid(), "a program's first context hosts its others");
        let (path, token) = match self.exchange(&mut conn, &WorkerRequest::OpenSessions)? {
            WorkerValue::Sessions { path, token } => (PathBuf::from(path), token),
            other => return Err(unexpected(&other)),
        };
        *lock(&self.sessions) = Some((path.clone(), token));
        *host = Some(self.host_at(path, token));
        Ok(conn)
    }

    /// Starts the worker of a context made by [`WorkerContext::new`].
    /// A spare that fails to attach (it died idle) is replaced by a fresh
    /// worker once; a new spare starts warming up either way.
    fn start_own(&self) -> Result<Connection, CuError> {
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
                self.adopt(launcher.spawn()?)
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

    /// The same context, its process running only its program's contexts.
    pub fn in_own_process(mut self) -> Self {
        self.own_process = true;
        self
    }

    /// The worker's process id, if it is a process.
    pub fn pid(&self) -> Option<u32> {
        lock(&self.child).as_ref().map(Child::id)
    }

    pub(super) fn receive(&self, conn: &mut Connection) -> io::Result<WorkerReply> {
        conn.link.recv_frame(&mut conn.buf).map_err(io_err)?;
        decode(&conn.buf).map_err(io_err)
    }

    pub(super) fn sticky(&self) -> Option<CuError> {
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
        let (path, token) = self.sessions_socket()?;
        let conn = join(&path, &token, None)?;
        Ok(WorkerContext {
            conn: Mutex::new(Some(conn)),
            launcher: None,
            sticky: Arc::clone(&self.sticky),
            tap: Mutex::new(Arc::clone(&lock(&self.tap))),
            markers: Mutex::new(Vec::new()),
            child: Arc::new(Mutex::new(None)),
            watch: self.watch.clone(),
            area_watch: Mutex::new(None),
            memory: ContextMemory::new(Arc::clone(self.memory.device_used())),
            next_module: Arc::clone(&self.next_module),
            modules: Mutex::new(HashMap::new()),
            deferred: Mutex::new(None),
            posts_held: AtomicBool::new(false),
            printing: AtomicBool::new(false),
            sessions: Mutex::new(None),
            pending_signals: Mutex::new(None),
            member: None,
            own_process: false,
            sm_cap: Mutex::new(None),
            round_trips: AtomicU64::new(0),
        })
    }

    /// The worker's socket for further connections and their token, asked
    /// of the worker the first time.
    fn sessions_socket(&self) -> Result<(PathBuf, [u8; NONCE_BYTES]), CuError> {
        if let Some(found) = lock(&self.sessions).clone() {
            return Ok(found);
        }
        match self.call(&WorkerRequest::OpenSessions, &[], None)? {
            WorkerValue::Sessions { path, token } => {
                let found = (PathBuf::from(path), token);
                *lock(&self.sessions) = Some(found.clone());
                Ok(found)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Records that the worker is gone; the error every later call gets.
    pub(super) fn died(&self, why: &io::Error) -> CuError {
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

    /// How many requests this context has sent that waited for an answer.
    pub fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// One round trip: the request, its raw frames, the reply and any bytes
    /// read back into `back`.
    pub(super) fn call(
        &self,
        request: &WorkerRequest,
        frames: &[&[u8]],
        back: Option<&mut [u8]>,
    ) -> Result<WorkerValue, CuError> {
        self.call_passing(request, None, frames, back)
    }

    /// A round trip whose successful reply brings a descriptor along.
    pub(super) fn call_for_fd(
        &self,
        request: &WorkerRequest,
    ) -> Result<(WorkerValue, Option<std::os::fd::OwnedFd>), CuError> {
        if let Some(e) = self.sticky() {
            return Err(e);
        }
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let mut slot = lock(&self.conn);
        let conn = self.connection(&mut slot)?;
        let exchanged = (|| -> io::Result<(WorkerReply, Option<std::os::fd::OwnedFd>)> {
            conn.send_message(request)?;
            let reply = self.receive(conn)?;
            let fd = match &reply.result {
                Ok(_) => conn.link.take_fd(),
                Err(_) => None,
            };
            Ok((reply, fd))
        })();
        drop(slot);
        let (reply, fd) = exchanged.map_err(|e| self.died(&e))?;
        Ok((reply.result?, fd))
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
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let mut slot = lock(&self.conn);
        let conn = self.connection(&mut slot)?;
        hop_trace::mark(Hop::ServerForward, kind);
        let exchanged = (|| -> io::Result<WorkerReply> {
            let bytes = encode(request).map_err(io_err)?;
            match fd {
                // The worker wakes once, to the request and its data.
                None => {
                    let mut all: Vec<&[u8]> = Vec::with_capacity(1 + frames.len());
                    all.push(&bytes);
                    all.extend_from_slice(frames);
                    conn.send_frames(&all)?;
                }
                Some(fd) => {
                    conn.send_frame_with_fd(&bytes, fd)?;
                    for frame in frames {
                        conn.link.send_frame(frame)?;
                    }
                }
            }
            let reply = self.receive(conn)?;
            if let Ok(WorkerValue::Bytes) = &reply.result {
                // Straight from the ring into `back`.
                match back {
                    Some(back) => conn.link.recv_frame_into(&mut conn.buf, back)?,
                    None => {
                        conn.link.recv_frame(&mut conn.buf).map_err(io_err)?;
                        return Err(io_err(format!(
                            "{} unexpected bytes back from the worker",
                            conn.buf.len()
                        )));
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
            self.marked(seq, kind);
        }
        match reply.result {
            Err(e) if codes::is_fatal(e.code) => {
                lock(&self.sticky).get_or_insert_with(|| e.clone());
                Err(e)
            }
            other => other,
        }
    }

    /// Waits for the printf a reply's marker `seq` ends, keeping it for the session.
    pub(super) fn marked(&self, seq: u64, kind: &'static str) {
        let tap = Arc::clone(&lock(&self.tap));
        tap.wait_for(seq);
        lock(&self.markers).push(seq);
        hop_trace::mark(Hop::PrintfMarker, kind);
    }

    /// The worker's connection, starting the worker at the first call.
    pub(super) fn connection<'a>(
        &self,
        slot: &'a mut Option<Connection>,
    ) -> Result<&'a mut Connection, CuError> {
        if slot.is_none() {
            let started = self
                .start()
                .and_then(|conn| self.cap_sms(conn))
                .and_then(|conn| self.attach_pending(conn));
            match started {
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

    /// Attaches the signal area the session gave before the worker started.
    fn attach_pending(&self, mut conn: Connection) -> Result<Connection, CuError> {
        let Some(link) = lock(&self.pending_signals).take() else {
            return Ok(conn);
        };
        let request = WorkerRequest::AttachSignals {
            path: link.display().to_string(),
        };
        let attached = self.exchange(&mut conn, &request);
        let _ = std::fs::remove_file(&link);
        attached.map(|_| conn)
    }

    /// One round trip on `conn` while it starts (before it is this context's
    /// connection, so `call` cannot take it).
    fn exchange(
        &self,
        conn: &mut Connection,
        request: &WorkerRequest,
    ) -> Result<WorkerValue, CuError> {
        conn.send_message(request).map_err(worker_err)?;
        self.receive(conn).map_err(worker_err)?.result
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
            let bytes = encode(request).map_err(io_err)?;
            // The worker wakes once, to the request and its data (or, while
            // posts are held, to them with the next request that waits).
            let mut all: Vec<&[u8]> = Vec::with_capacity(1 + frames.len());
            all.push(&bytes);
            all.extend_from_slice(frames);
            conn.post_frames(&all, self.posts_held.load(Ordering::Relaxed))
        })();
        drop(slot);
        hop_trace::mark(Hop::Step, "posted");
        if let Err(e) = sent {
            self.died(&e);
        }
    }

    /// Keeps a failure found before work could be posted, for the next waiting call.
    /// `launch` as the worker knows it: with the worker's id of its module.
    fn local_launch(&self, launch: KernelLaunch) -> Result<KernelLaunch, CuError> {
        match lock(&self.modules).get(&launch.module) {
            Some((local, _)) => Ok(KernelLaunch {
                module: *local,
                ..launch
            }),
            None => Err(CuError::new(codes::INVALID_HANDLE, "module not loaded")),
        }
    }

    /// Queued `work` as it goes to the worker: a launch with the worker's
    /// module id; a signal bound to an area of this process does not go.
    fn travelling(&self, work: StreamWork) -> Result<WireWork, CuError> {
        match work {
            StreamWork::Launch(launch) => self.local_launch(launch).map(WireWork::Launch),
            work => WireWork::try_from(work),
        }
    }

    fn defer(&self, e: CuError) {
        lock(&self.deferred).get_or_insert(e);
    }

    /// The printf text of this connection's calls so far.
    fn take_printed(&self) -> Vec<u8> {
        let tap = Arc::clone(&lock(&self.tap));
        tap.take(&mut lock(&self.markers))
    }

    /// `result`, unless posted work failed before it; with the printf text.
    fn waited(&self, result: Result<(), CuError>) -> LaunchOutcome {
        let result = match lock(&self.deferred).take() {
            Some(e) => Err(e),
            None => result,
        };
        LaunchOutcome {
            stdout: self.take_printed(),
            result,
        }
    }

    /// A round trip answered by a number.
    pub(super) fn number(&self, request: &WorkerRequest) -> Result<u64, CuError> {
        match self.call(request, &[], None)? {
            WorkerValue::Number(n) => Ok(n),
            other => Err(unexpected(&other)),
        }
    }

    pub(super) fn unit(&self, request: &WorkerRequest, frames: &[&[u8]]) -> Result<(), CuError> {
        match self.call(request, frames, None)? {
            WorkerValue::Unit => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}

pub(super) fn unexpected(value: &WorkerValue) -> CuError {
    CuError::new(
        codes::UNKNOWN,
        format!("unexpected answer from the worker: {value:?}"),
    )
}

impl WorkerContext {
    /// Loads `image` in the worker (its memory at `blocks`, if given): the
    /// module under a device-wide id.
    pub(super) fn load_module(
        &self,
        image: &[u8],
        blocks: Option<&[DevicePtr]>,
    ) -> Result<LoadedModule, CuError> {
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
        let request = match blocks {
            None => WorkerRequest::ModuleLoad { parts: count },
            Some(blocks) => WorkerRequest::ModuleLoadAt {
                parts: count,
                blocks: blocks.to_vec(),
            },
        };
        let module = match self.call(&request, &parts, None)? {
            WorkerValue::Module(m, prints) => {
                if prints {
                    self.printing.store(true, Ordering::Release);
                }
                m
            }
            other => return Err(unexpected(&other)),
        };
        let globals_bytes: u64 = module.globals.iter().map(|g| g.size).sum();
        self.memory.charge(globals_bytes);
        let id = self.next_module.fetch_add(1, Ordering::Relaxed);
        lock(&self.modules).insert(id, (module.id, globals_bytes));
        Ok(LoadedModule { id, ..module })
    }

    /// The worker's id of the device-wide module `module`.
    pub(super) fn local_module(&self, module: ModuleId) -> Option<ModuleId> {
        lock(&self.modules).get(&module).map(|m| m.0)
    }

    /// Counts `bytes` placed in the worker as this context's.
    pub(super) fn charge(&self, bytes: u64) {
        self.memory.charge(bytes);
    }
}

impl DeviceContext for WorkerContext {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn process(&self) -> WorkProcess {
        match self.pid() {
            _ if !self.own_process => WorkProcess::Shared,
            Some(pid) => WorkProcess::Own(pid),
            None => WorkProcess::NotStarted,
        }
    }

    /// Stops the worker this context started (an isolated session's), so
    /// that a kernel nobody waits for any more holds no GPU; every later call
    /// fails. A further connection to a shared worker stops nothing.
    fn cancel_launches(&self) {
        lock(&self.sticky).get_or_insert(CuError::new(
            codes::LAUNCH_FAILED,
            "the session's client is gone; its worker was stopped",
        ));
        if let Some(child) = lock(&self.child).as_mut() {
            tracing::info!(
                pid = child.id(),
                "stopping the worker of a client that hung up"
            );
            let _ = child.kill();
        }
    }

    fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, CuError> {
        match self.call(&WorkerRequest::MemAlloc { bytes }, &[], None)? {
            WorkerValue::Ptr(ptr) => {
                self.memory.charge(bytes);
                Ok(ptr)
            }
            other => Err(unexpected(&other)),
        }
    }

    fn mem_free(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        self.unit(&WorkerRequest::MemFree { ptr, bytes }, &[])?;
        self.memory.release(bytes);
        Ok(())
    }

    fn mem_read(&self, src: DevicePtr, buf: &mut [u8]) -> Result<(), CuError> {
        self.read_chunks(src, buf, |src, len| WorkerRequest::MemRead { src, len })
    }

    fn mem_read_pieces(
        &self,
        src: DevicePtr,
        len: u64,
        piece: usize,
        buffer: &mut Buffer<'_>,
        take: &mut TakePiece<'_>,
    ) -> Result<(), CuError> {
        self.read_pieces(src, len, piece, buffer, take)
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

    /// In one request where the bytes fit one frame.
    fn mem_read_spans(&self, spans: &[(DevicePtr, u64)]) -> Result<Vec<Vec<u8>>, CuError> {
        let total = spans.iter().fold(0u64, |t, s| t.saturating_add(s.1));
        if spans.len() < 2 || total > MAX_CHUNK_BYTES as u64 {
            return crate::device::read_spans_one_by_one(self, spans);
        }
        let mut all = vec![0u8; total as usize];
        let request = WorkerRequest::MemReadSpans {
            spans: spans.to_vec(),
        };
        match self.call(&request, &[], Some(&mut all))? {
            WorkerValue::Bytes => {}
            other => return Err(unexpected(&other)),
        }
        let mut at = 0usize;
        Ok(spans
            .iter()
            .map(|&(_, bytes)| {
                let part = all[at..at + bytes as usize].to_vec();
                at += bytes as usize;
                part
            })
            .collect())
    }

    /// In one request where the bytes fit one frame.
    fn mem_write_spans(&self, writes: &[(DevicePtr, &[u8])]) -> Result<(), CuError> {
        let total: usize = writes.iter().map(|w| w.1.len()).sum();
        if writes.len() < 2 || total > MAX_CHUNK_BYTES {
            return writes
                .iter()
                .try_for_each(|&(ptr, data)| self.mem_write(ptr, data));
        }
        let spans = writes.iter().map(|&(p, d)| (p, d.len() as u64)).collect();
        let data: Vec<u8> = writes.iter().flat_map(|w| w.1.iter().copied()).collect();
        self.unit(&WorkerRequest::MemWriteSpans { spans }, &[&data])
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
        self.load_module(image, None)
    }

    fn module_unload(&self, module: ModuleId) {
        let Some((local, globals_bytes)) = lock(&self.modules).remove(&module) else {
            return;
        };
        self.memory.release(globals_bytes);
        if let Err(e) = self.unit(&WorkerRequest::ModuleUnload { module: local }, &[]) {
            tracing::debug!("worker module unload: {e}");
        }
    }

    fn launch(&self, launch: &KernelLaunch) -> LaunchOutcome {
        let result = self
            .local_launch(launch.clone())
            .and_then(|local| self.unit(&WorkerRequest::Launch(local), &[]));
        LaunchOutcome {
            stdout: self.take_printed(),
            result,
        }
    }

    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        Some(self)
    }

    fn set_sm_cap(&self, part: SmPart) -> Result<(), CuError> {
        self.keep_sm_cap(part)
    }

    fn movable(&self) -> Option<&dyn crate::device::MovableContext> {
        Some(self)
    }

    /// Exactly, unless the context is a program's on another GPU in a
    /// shared worker, whose other programs may share it: then it only grows.
    fn set_limit(&self, limit: u32, value: u64) -> Result<(), CuError> {
        let setting = match self.member.is_some() && !self.own_process {
            true => LimitSetting::AtLeastNow(value),
            false => LimitSetting::Exactly(value),
        };
        self.apply_limit(limit, setting)
    }

    fn apply_limit(&self, limit: u32, setting: LimitSetting) -> Result<(), CuError> {
        self.unit(&WorkerRequest::SetLimit { limit, setting }, &[])
    }

    fn reset_limits(&self) -> Result<(), CuError> {
        self.unit(&WorkerRequest::ResetLimits, &[])
    }

    fn cluster_occupancy(
        &self,
        module: ModuleId,
        kernel: usize,
        geometry: &LaunchGeometry,
        query: ClusterQuery,
    ) -> Result<i32, CuError> {
        let module = self
            .local_module(module)
            .ok_or_else(|| CuError::new(codes::INVALID_HANDLE, "module not loaded"))?;
        let request = WorkerRequest::ClusterOccupancy {
            module,
            kernel,
            geometry: geometry.clone(),
            query,
        };
        match self.call(&request, &[], None)? {
            WorkerValue::Number(n) => Ok(i32::try_from(n).unwrap_or(i32::MAX)),
            other => Err(unexpected(&other)),
        }
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

    fn host_register(&self, region: HostRegion<'_>) -> Result<bool, CuError> {
        let request = WorkerRequest::HostRegister {
            region: region.id,
            bytes: region.mapping.len() as u64,
            client_base: region.client_base,
        };
        match self.call_passing(&request, Some(region.fd), &[], None)? {
            WorkerValue::Number(reached) => Ok(reached != 0),
            other => Err(unexpected(&other)),
        }
    }

    fn host_unregister(&self, region: Handle) {
        if let Err(e) = self.unit(&WorkerRequest::HostUnregister { region }, &[]) {
            tracing::debug!(region, "worker host unregister: {e}");
        }
    }

    /// Runs in the worker's context: a GPU's reservations and mappings are
    /// its driver's, so the addresses the client sees are the device's own.
    fn vmm(&self, op: &VmmOp) -> Result<u64, CuError> {
        let value = self.number(&WorkerRequest::Vmm(op.clone()))?;
        match *op {
            VmmOp::Create { size, .. } => self.memory.charge(size),
            VmmOp::Release { size, .. } => self.memory.release(size),
            _ => {}
        }
        Ok(value)
    }

    fn array(&self, op: &ArrayOp) -> Result<u64, CuError> {
        self.array_in_worker(op)
    }

    fn array_copy(
        &self,
        src: &CopyEnd,
        dst: &CopyEnd,
        extent: &CopyExtent,
        from_host: &[u8],
        to_host: &mut [u8],
    ) -> Result<(), CuError> {
        self.array_copy_in_worker(src, dst, extent, from_host, to_host)
    }

    /// The peer is the program's context on another device, in this
    /// context's worker process (`Colocation`): the worker enables it
    /// between the two, by the peer's number there.
    fn peer_access(&self, peer: &dyn DeviceContext, enable: bool) -> Result<(), CuError> {
        let peer = peer
            .peer_any()
            .downcast_ref::<WorkerContext>()
            .ok_or_else(|| CuError::new(codes::INVALID_CONTEXT, "the peer is not in a worker"))?;
        let peer_id = peer.number(&WorkerRequest::ContextId)?;
        self.call(
            &WorkerRequest::PeerAccess {
                peer: peer_id,
                enable,
            },
            &[],
            None,
        )
        .map(|_| ())
    }

    fn vmm_export(&self, physical: u64) -> Result<std::os::fd::OwnedFd, CuError> {
        let request = WorkerRequest::VmmExport { physical };
        match self.call_for_fd(&request)? {
            (WorkerValue::Unit, Some(fd)) => Ok(fd),
            (WorkerValue::Unit, None) => Err(CuError::new(
                codes::UNKNOWN,
                "the worker exported no descriptor",
            )),
            (other, _) => Err(unexpected(&other)),
        }
    }

    fn vmm_import(&self, fd: BorrowedFd<'_>) -> Result<u64, CuError> {
        match self.call_passing(&WorkerRequest::VmmImport, Some(fd), &[], None)? {
            WorkerValue::Number(physical) => Ok(physical),
            other => Err(unexpected(&other)),
        }
    }

    /// One request: the worker maps, copies and releases in its own process.
    fn copy_into_imported(
        &self,
        chunks: &[ImportedChunk],
        copies: &[(DevicePtr, u64)],
    ) -> Result<u64, CuError> {
        let request = WorkerRequest::PlacedCopy {
            chunks: chunks.to_vec(),
            copies: copies.to_vec(),
        };
        self.number(&request)
    }

    fn map_imported(&self, chunks: &[ImportedChunk]) -> Result<MappedChunks, CuError> {
        let request = WorkerRequest::PlacedMap {
            chunks: chunks.to_vec(),
        };
        match self.call(&request, &[], None)? {
            WorkerValue::Mapped(mapped) => Ok(mapped),
            other => Err(unexpected(&other)),
        }
    }

    fn copy_into_mapped(
        &self,
        mapped: &MappedChunks,
        copies: &[(DevicePtr, u64)],
    ) -> Result<u64, CuError> {
        let request = WorkerRequest::PlacedCopyMapped {
            mapped: mapped.clone(),
            copies: copies.to_vec(),
        };
        self.number(&request)
    }

    fn unmap_imported(&self, mapped: &MappedChunks) {
        let request = WorkerRequest::PlacedUnmap {
            mapped: mapped.clone(),
        };
        if let Err(e) = self.unit(&request, &[]) {
            tracing::warn!("unmapping a moved session's target memory: {}", e.detail);
        }
    }

    fn ipc_export(&self, base: DevicePtr) -> Result<Vec<u8>, CuError> {
        match self.call(&WorkerRequest::IpcExport { base }, &[], None)? {
            WorkerValue::IpcHandle(handle) => Ok(handle),
            other => Err(unexpected(&other)),
        }
    }

    fn ipc_open(&self, handle: &[u8], flags: u32) -> Result<(DevicePtr, u64), CuError> {
        let request = WorkerRequest::IpcOpen {
            handle: handle.to_vec(),
            flags,
        };
        match self.call(&request, &[], None)? {
            WorkerValue::Range { base, size } => Ok((base, size)),
            other => Err(unexpected(&other)),
        }
    }

    fn ipc_close(&self, base: DevicePtr) -> Result<(), CuError> {
        self.call(&WorkerRequest::IpcClose { base }, &[], None)
            .map(|_| ())
    }
}

impl Drop for WorkerContext {
    fn drop(&mut self) {
        // The text of markers this connection never took would stay in a
        // shared worker's tap for the worker's life.
        drop(self.take_printed());
        if let Some(link) = lock(&self.pending_signals).take() {
            let _ = std::fs::remove_file(link);
        }
        // Closing the socket tells the worker to tear its context down and exit.
        if let Some(conn) = lock(&self.conn).take() {
            let _ = conn.link.socket().shutdown(std::net::Shutdown::Both);
        }
        // A group's process is reaped with the group (`Colocation`).
        if self.member.is_none() {
            if let Some(child) = lock(&self.child).take() {
                reap_in_background(child);
            }
        }
    }
}

/// A further connection to the worker process whose sessions socket is
/// `path`: the same context as its first connection (`own: None`) or a
/// context of its own on device `own`. Waits until the worker says it is ready.
fn join(path: &Path, token: &[u8; NONCE_BYTES], own: Option<u32>) -> Result<Connection, CuError> {
    let fail = |e: io::Error| {
        CuError::new(
            codes::UNKNOWN,
            format!("cannot connect to the worker at {}: {e}", path.display()),
        )
    };
    let mut stream = UnixStream::connect(path).map_err(fail)?;
    write_frame(&mut stream, token).map_err(|e| fail(io_err(e)))?;
    let asked = encode(&own).map_err(|e| fail(io_err(e)))?;
    write_frame(&mut stream, &asked).map_err(|e| fail(io_err(e)))?;
    let mut conn = Connection::new(stream)?;
    let _ = conn.link.socket().set_read_timeout(Some(READY_WAIT));
    let ready = conn.link.recv_frame(&mut conn.buf).map_err(io_err);
    let _ = conn.link.socket().set_read_timeout(None);
    ready.map_err(fail)?;
    match decode::<WorkerReply>(&conn.buf)
        .map_err(|e| fail(io_err(e)))?
        .result
    {
        Ok(WorkerValue::Ready) => {}
        Ok(other) => return Err(unexpected(&other)),
        Err(e) => return Err(e),
    }
    conn.offer_shm().map_err(fail)?;
    Ok(conn)
}

/// A worker's socket failing while a context starts.
fn worker_err(e: io::Error) -> CuError {
    CuError::new(
        codes::UNKNOWN,
        format!("the worker failed as it started: {e}"),
    )
}
