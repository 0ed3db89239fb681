//! One client's session: its handle tables (streams, events, modules, functions)
//! and allocations, the check of every handle and pointer it sends, the execution
//! of its calls, its sticky errors and printf output, and its clean-up.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Instant;

use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::{
    codes, Call, CuError, DevicePtr, FunctionInfo, GlobalInfo, Handle, Hello, ModuleInfo,
    ReplyBody, DEFAULT_STREAM,
};

use crate::device::attributes::{MAX_BLOCK_DIM, MAX_GRID_DIM, SHARED_PER_BLOCK_OPTIN};
use crate::device::signals::{SignalArea, StreamSignals, ERROR_SLOT};
use crate::device::{
    Device, DeviceContext, KernelDesc, LaunchGeometry, LaunchOutcome, ModuleId, StreamOrdered,
    StreamWork, SyncTarget,
};
use crate::gate::{Admission, GateSession};
use crate::host_regions::HostRegions;
use crate::status::{server_status, SessionEntry, SessionStats};
use crate::streams::{Position, Streams, Work, MAX_STREAMS, NON_BLOCKING};
use crate::tenants::{AccountHold, TenantSettings};
use crate::Server;
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::{DeviceInfo, GraphLaunch, LaunchAttribute, TensorMapRequest};

/// Printf output a session may hold before further output is dropped.
pub const MAX_STDOUT_BYTES: usize = 16 << 20;
/// The first handle a session issues: well clear of 0 (the default stream)
/// and CUDA's special stream values 1 and 2, so a confused client gets
/// CUDA_ERROR_INVALID_HANDLE rather than somebody's stream.
pub const FIRST_HANDLE: Handle = 0x100;
/// Payload bytes (async copies, launch parameters) a session may hold in its
/// queues; past it, the session waits for its streams before queueing more.
pub const MAX_QUEUED_BYTES: u64 = 1 << 30;
/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: u32 = 0x2;
/// Dimensions a tensor map may have (CUDA's limit).
const MAX_TENSOR_RANK: usize = 5;
/// `CUDA_ERROR_INVALID_CLUSTER_SIZE`.
const CLUSTER_SIZE_ERROR: u32 = 912;
/// `1` keeps stream order in the server (a thread per stream) even where the
/// device keeps it itself: for comparisons.
pub const STREAM_THREADS_ENV: &str = "CUMUX_STREAM_THREADS";

type CallResult = Result<ReplyBody, CuError>;

/// Codes after which CUDA's context is unusable: every later call fails with them.
pub fn is_fatal(code: u32) -> bool {
    matches!(
        code,
        codes::ILLEGAL_ADDRESS | codes::LAUNCH_TIMEOUT | 714..=719
    )
}

/// What the session shares with its stream workers.
pub struct SessionCore {
    pub id: u64,
    /// A fatal fault: the context is unusable; never cleared.
    fatal: Mutex<Option<CuError>>,
    /// A failure of stream-ordered work, returned by the next synchronizing call.
    sticky: Mutex<Option<CuError>>,
    stdout: Mutex<Vec<u8>>,
    /// Set at teardown: queued work is skipped.
    closing: AtomicBool,
    /// Payload bytes waiting in stream queues.
    queued_bytes: AtomicU64,
    pub stats: Arc<SessionStats>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SessionCore {
    fn fatal(&self) -> Option<CuError> {
        lock(&self.fatal).clone()
    }

    /// Records a failure of stream-ordered work: fatal codes poison the context.
    fn fail(&self, err: CuError) {
        if is_fatal(err.code) {
            tracing::warn!(session = self.id, %err, "fatal device error: the context is now unusable");
            lock(&self.fatal).get_or_insert(err);
        } else {
            tracing::debug!(session = self.id, %err, "stream-ordered call failed");
            lock(&self.sticky).get_or_insert(err);
        }
    }

    /// The error a synchronizing call returns: the fatal one, else the sticky one (cleared).
    fn take_error(&self) -> Option<CuError> {
        self.fatal().or_else(|| lock(&self.sticky).take())
    }

    fn skips_work(&self) -> bool {
        self.closing.load(Ordering::Relaxed) || lock(&self.fatal).is_some()
    }

    fn append_stdout(&self, bytes: &[u8]) {
        let mut out = lock(&self.stdout);
        let room = MAX_STDOUT_BYTES.saturating_sub(out.len());
        if bytes.len() > room {
            tracing::warn!(
                session = self.id,
                "device printf output over {MAX_STDOUT_BYTES} bytes dropped"
            );
        }
        out.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

struct ModuleEntry {
    id: ModuleId,
    functions: Vec<Handle>,
    globals: Vec<DevicePtr>,
}

struct FunctionEntry {
    module: ModuleId,
    index: usize,
    desc: KernelDesc,
}

struct Event {
    flags: u32,
    state: Mutex<EventState>,
}

#[derive(Default)]
struct EventState {
    /// The position of the latest record, if ever recorded.
    recorded: Option<Position>,
    /// Bumped per record, so a stale record's job leaves the time alone.
    generation: u64,
    time: Option<Instant>,
}

/// A device's launch limits, from its attributes (the defaults where a
/// device does not give one).
struct LaunchLimits {
    block: [i32; 3],
    grid: [i32; 3],
    shared_per_block_optin: i32,
    /// 0 where the device runs no clusters (before compute capability 9).
    max_cluster_blocks: u32,
}

impl LaunchLimits {
    fn of(info: &DeviceInfo) -> Self {
        let attr = |id: u32, default: i32| {
            info.attributes
                .iter()
                .find(|(a, _)| *a == id)
                .map_or(default, |(_, v)| *v)
        };
        LaunchLimits {
            block: [2, 3, 4].map(|id| attr(id, MAX_BLOCK_DIM[id as usize - 2])),
            grid: [5, 6, 7].map(|id| attr(id, MAX_GRID_DIM[id as usize - 5])),
            // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
            shared_per_block_optin: attr(97, SHARED_PER_BLOCK_OPTIN),
            // CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, then Hopper's non-portable limit.
            max_cluster_blocks: if attr(120, 0) != 0 { 16 } else { 0 },
        }
    }
}

/// Checks what a launch's attributes ask of the device: cluster dimensions
/// must divide the grid and fit the device.
fn check_launch_attributes(
    attributes: &[LaunchAttribute],
    grid: [u32; 3],
    max_cluster_blocks: u32,
) -> Result<(), CuError> {
    for a in attributes {
        if let LaunchAttribute::ClusterDim(dims) = a {
            let blocks = dims.iter().map(|d| u64::from(*d)).product::<u64>();
            if blocks <= 1 && !dims.contains(&0) {
                continue;
            }
            if max_cluster_blocks == 0 {
                return Err(err(
                    codes::NOT_SUPPORTED,
                    "this device runs no thread-block clusters",
                ));
            }
            let divides = dims.iter().zip(grid).all(|(d, g)| *d > 0 && g % d == 0);
            if !divides || blocks > u64::from(max_cluster_blocks) {
                return Err(err(
                    CLUSTER_SIZE_ERROR,
                    format!("cluster {dims:?} for grid {grid:?}"),
                ));
            }
        }
    }
    Ok(())
}

/// One client connection's view of the server.
pub struct Session {
    server: Arc<Server>,
    device: Arc<dyn Device>,
    /// The session's own address space and modules on the device.
    ctx: Arc<dyn DeviceContext>,
    core: Arc<SessionCore>,
    entry: Option<Arc<SessionEntry>>,
    /// The tenant's memory account; `None` for status queries, which may make
    /// no other call.
    account: Option<AccountHold>,
    /// Bytes of module globals charged to the tenant, by module handle.
    module_bytes: HashMap<Handle, u64>,
    streams: Streams,
    /// Whether the device keeps stream order ([`StreamOrdered`]): then stream
    /// work goes straight to it, unwaited, and `ordered_streams` are the
    /// session's streams (besides the default one).
    ordered: bool,
    ordered_streams: HashSet<Handle>,
    /// Whether queuing failed at once since the worker was last asked to
    /// synchronize (the failure waits there): then synchronizes ask it.
    enqueue_failed: Cell<bool>,
    /// The worker's error counter ([`ERROR_SLOT`]) when last looked at.
    worker_errors_seen: Cell<u64>,
    /// How long a synchronize waits for completion signals before it asks the worker.
    signal_wait: std::time::Duration,
    /// Whether stream-ordered work was queued since the last context
    /// synchronize that succeeded: if not, the next one has nothing to wait for.
    queued_since_sync: Cell<bool>,
    next_handle: Handle,
    /// Allocations made by this session: base → size.
    allocations: BTreeMap<DevicePtr, u64>,
    /// Module globals of this session: base → size.
    globals: BTreeMap<DevicePtr, u64>,
    modules: HashMap<Handle, ModuleEntry>,
    functions: HashMap<Handle, FunctionEntry>,
    /// The device's launch limits, looked up once (every launch is checked against them).
    limits: LaunchLimits,
    events: HashMap<Handle, Arc<Event>>,
    /// Graphs of launches ([`Call::GraphCreate`]), checked.
    graphs: HashMap<Handle, Vec<CheckedLaunch>>,
    /// The session's place at its device's scheduling gate; `None` under `fifo`
    /// and for status queries.
    gate: Option<Arc<GateSession>>,
    /// The scheduler's name of each stream that has launched: unique server-wide.
    sched_streams: HashMap<Handle, cumux_scheduler::StreamId>,
    /// With a gate on a device that queues work: the completion signals of the
    /// session's launches, which tell the gate when each is done.
    signals: Option<StreamSignals>,
    /// The priority the session's streams get on the device under `priority`
    /// (latency-critical first), instead of the one the client asked for.
    forced_priority: Option<i32>,
    /// Launches per signal (see [`SIGNAL_EVERY`]); 1 for a latency-critical tenant.
    signal_every: u64,
    /// Whether the tenant's class is latency-critical.
    latency_critical: bool,
    /// Whether a kernel watchdog reads the session's signals for progress: its
    /// streams are then signalled every [`SIGNAL_EVERY`] launches under `fifo` too.
    watched: bool,
    /// The client's pinned host regions.
    host: HostRegions,
    /// The memfd that came with the call being handled (`HostRegister`).
    incoming_fd: Option<Result<OwnedFd, String>>,
}

/// Source of the scheduler's stream ids (see `Session::sched_streams`). Ids only need
/// to differ among streams with work at the gate at once; wrapping after 2^32 streams
/// is harmless.
static NEXT_SCHED_STREAM: AtomicU32 = AtomicU32::new(0);

/// The most urgent stream priority (the device clamps it to its own range).
const HIGHEST_PRIORITY: i32 = -1000;

/// Under `priority`, a batch tenant's stream is signalled after every this many
/// launches (a latency-critical tenant's, and every tenant's under `fair`, after
/// each): a signal is a device-side
/// write that the next kernel of the stream waits for, which costs tiny kernels
/// a third of their rate when it follows every one (measured on the H100, 5 µs
/// kernels). Launches not yet covered are covered before the session waits for
/// anything (a synchronizing call, or the gate).
pub const SIGNAL_EVERY: u64 = 8;
/// Launches the gate expects to take at least this long (nanoseconds) are
/// signalled each: a signal costs them little, and a late completion would bill
/// their tenant for time another tenant's kernel ran (`Charging::Oldest`).
pub const SIGNAL_EACH_FROM_NS: u64 = 10_000;

/// A synchronize answered from completion signals waits for them at least this
/// long before it asks the worker (longer on large hosts: `answer_spin_time`)...
const SIGNAL_WAIT_MIN: std::time::Duration = std::time::Duration::from_micros(200);
/// ...spinning for the first this long, then yielding between looks.
const SIGNAL_SPIN: std::time::Duration = std::time::Duration::from_micros(20);

/// Graphs a session may hold, and launches a graph may have.
const MAX_GRAPHS: usize = 4096;
const MAX_GRAPH_LAUNCHES: usize = 1 << 16;

/// A launch checked against its kernel and the device ([`Session::checked_launch`]).
#[derive(Clone)]
struct CheckedLaunch {
    module: ModuleId,
    kernel: usize,
    geometry: LaunchGeometry,
    params: Vec<u8>,
}

impl CheckedLaunch {
    fn work(&self) -> StreamWork {
        StreamWork::Launch {
            module: self.module,
            kernel: self.kernel,
            geometry: self.geometry.clone(),
            params: self.params.clone(),
        }
    }
}

/// The scheduler's names for copies and memsets, by kind (launches are named by
/// module and kernel, far below these): each kind's cost is learnt apart.
const TO_DEVICE: cumux_scheduler::KernelId = cumux_scheduler::KernelId(u64::MAX - 1);
const TO_HOST: cumux_scheduler::KernelId = cumux_scheduler::KernelId(u64::MAX - 2);
const DEVICE_COPY: cumux_scheduler::KernelId = cumux_scheduler::KernelId(u64::MAX - 3);
const MEMSET: cumux_scheduler::KernelId = cumux_scheduler::KernelId(u64::MAX - 4);

/// The scheduler's name of a copy or memset.
fn copy_kernel_id(work: &StreamWork) -> cumux_scheduler::KernelId {
    match work {
        StreamWork::DeviceToHost { .. } => TO_HOST,
        StreamWork::Copy { .. } => DEVICE_COPY,
        StreamWork::Fill { .. } => MEMSET,
        _ => TO_DEVICE,
    }
}

/// The scheduler's name of `stream`, made at its first use (see
/// `Session::sched_streams`).
fn sched_stream_of(
    names: &mut HashMap<Handle, cumux_scheduler::StreamId>,
    stream: Handle,
) -> cumux_scheduler::StreamId {
    *names.entry(stream).or_insert_with(|| {
        cumux_scheduler::StreamId(NEXT_SCHED_STREAM.fetch_add(1, Ordering::Relaxed))
    })
}

/// Queues the signals that cover every launch of the session not yet covered.
fn flush_signals(ordered: &dyn StreamOrdered, signals: &mut StreamSignals) {
    for (stream, slot, value) in signals.flush() {
        ordered.enqueue(stream, StreamWork::Signal { slot, value });
    }
}

/// A signal area for the session's launches, attached to its context; `None` (and a
/// debug line) where the context cannot signal completions.
fn attach_signals(ordered: &dyn StreamOrdered, session: u64) -> Option<StreamSignals> {
    let attached = SignalArea::create().and_then(|area| {
        let path = area.path().expect("a fresh area has a name");
        let result = ordered.attach_signals(&path);
        area.unlink();
        result.map(|()| StreamSignals::new(Arc::new(area)))
    });
    match attached {
        Ok(signals) => Some(signals),
        Err(e) => {
            tracing::debug!(session, "launches go through stream workers: {e}");
            None
        }
    }
}

fn err(code: u32, detail: impl Into<String>) -> CuError {
    CuError::new(code, detail)
}

fn invalid_handle(what: &str, h: Handle) -> CuError {
    err(
        codes::INVALID_HANDLE,
        format!("unknown {what} handle {h:#x}"),
    )
}

impl Session {
    /// Opens a session for a client that said `hello`, admitted as `tenant`
    /// (name and settings; `None` for a status query). Driver sessions appear
    /// in `cumux status`; status queries do not. The session's device is the
    /// first the tenant may see.
    pub fn open(
        server: Arc<Server>,
        hello: &Hello,
        tenant: Option<(String, TenantSettings)>,
    ) -> Result<Self, CuError> {
        let (device, account) = match &tenant {
            Some((name, settings)) => {
                let (device, _) =
                    server
                        .devices_for(settings)
                        .into_iter()
                        .next()
                        .ok_or_else(|| {
                            err(
                                codes::NO_DEVICE,
                                format!("tenant {name:?} may use no device of this server"),
                            )
                        })?;
                (device, Some(server.accounts().join(name, settings)))
            }
            None => (
                server
                    .devices()
                    .first()
                    .cloned()
                    .ok_or_else(|| err(codes::NO_DEVICE, "the server has no device"))?,
                None,
            ),
        };
        let ctx = device.create_context()?;
        let id = server.next_session_id();
        let gate = match (&tenant, server.gate_of(&device)) {
            (Some((name, settings)), Some(gate)) => {
                Some(Arc::new(gate.join(name, settings, id).map_err(|e| {
                    err(codes::OUT_OF_MEMORY, format!("scheduler: {e}"))
                })?))
            }
            _ => None,
        };
        let stats = Arc::new(SessionStats::default());
        let entry = (hello.role == cumux_protocol::ClientRole::Driver).then(|| {
            Arc::new(SessionEntry {
                session: id,
                pid: hello.pid,
                program: hello.program.clone(),
                tenant: tenant
                    .as_ref()
                    .map_or_else(|| crate::tenants::DEFAULT_TENANT.into(), |t| t.0.clone()),
                stats: Arc::clone(&stats),
            })
        });
        let streams = Streams::new(id).map_err(|e| {
            err(
                codes::OUT_OF_MEMORY,
                format!("cannot start a stream worker: {e}"),
            )
        })?;
        if let Some(entry) = &entry {
            server.registry().insert(Arc::clone(entry));
        }
        // Under a scheduling gate, work is queued on the device only where the device
        // can signal each launch's completion; elsewhere the server's stream workers
        // run launches one by one and report them.
        let threads = std::env::var(STREAM_THREADS_ENV).is_ok_and(|v| v.trim() == "1");
        // Completion signals also let the server answer a synchronize itself
        // (`signalled_sync`), so every session that queues work has them.
        let signals = match ctx.stream_ordered() {
            Some(ordered) if !threads && entry.is_some() => attach_signals(ordered, id),
            _ => None,
        };
        let ordered =
            ctx.stream_ordered().is_some() && !threads && (gate.is_none() || signals.is_some());
        let forced_priority = match (&gate, &tenant) {
            (Some(g), Some((_, settings)))
                if matches!(g.gate().policy(), cumux_scheduler::Policy::Priority(_)) =>
            {
                Some(match settings.class {
                    crate::tenants::TenantClass::LatencyCritical => HIGHEST_PRIORITY,
                    crate::tenants::TenantClass::Batch => 0,
                })
            }
            _ => None,
        };
        if let (Some(priority), Some(ordered)) = (forced_priority, ctx.stream_ordered()) {
            ordered.set_own_stream_priority(priority);
        }
        let latency_critical = tenant
            .as_ref()
            .is_some_and(|(_, s)| s.class == crate::tenants::TenantClass::LatencyCritical);
        // Under `fair` every launch is signalled: a completion seen late bills its
        // tenant for the kernels that ran meanwhile (`Charging::Oldest`), which
        // starved tenants of 5 µs kernels on the H100.
        let fair = gate
            .as_ref()
            .is_some_and(|g| matches!(g.gate().policy(), cumux_scheduler::Policy::Fair(_)));
        let signal_every = if latency_critical || fair {
            1
        } else {
            SIGNAL_EVERY
        };
        // A latency-critical tenant's calls find the worker awake.
        if let (true, Some(ordered)) = (latency_critical, ctx.stream_ordered()) {
            ordered.keep_hot(crate::device::spin::hot_spin_time());
        }
        let limits = LaunchLimits::of(device.info());
        let watched = ordered && ctx.stream_ordered().is_some_and(|o| o.watched());
        Ok(Session {
            server,
            device,
            ctx,
            core: Arc::new(SessionCore {
                id,
                fatal: Mutex::new(None),
                sticky: Mutex::new(None),
                stdout: Mutex::new(Vec::new()),
                closing: AtomicBool::new(false),
                queued_bytes: AtomicU64::new(0),
                stats,
            }),
            entry,
            account,
            module_bytes: HashMap::new(),
            streams,
            ordered,
            ordered_streams: HashSet::new(),
            next_handle: FIRST_HANDLE,
            allocations: BTreeMap::new(),
            globals: BTreeMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            limits,
            events: HashMap::new(),
            graphs: HashMap::new(),
            gate,
            sched_streams: HashMap::new(),
            signals,
            forced_priority,
            signal_every,
            queued_since_sync: Cell::new(false),
            enqueue_failed: Cell::new(false),
            worker_errors_seen: Cell::new(0),
            signal_wait: crate::device::spin::answer_spin_time().max(SIGNAL_WAIT_MIN),
            latency_critical,
            watched,
            host: HostRegions::default(),
            incoming_fd: None,
        })
    }

    /// Whether the session's tenant is latency-critical (its calls are polled for
    /// longer, so the threads that serve them do not sleep between them).
    pub fn latency_critical(&self) -> bool {
        self.latency_critical
    }

    pub fn id(&self) -> u64 {
        self.core.id
    }

    /// Launches run so far and the device time they took, in ms.
    pub fn totals(&self) -> (u64, f64) {
        let stats = &self.core.stats;
        (
            stats.launches.load(Ordering::Relaxed),
            stats.gpu_time_ns.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }

    /// Bytes copied to or from pinned host regions without crossing the wire.
    pub fn zero_copy_bytes(&self) -> u64 {
        self.core.stats.zero_copy_bytes.load(Ordering::Relaxed)
    }

    /// The descriptor (or why there is none) that came with the next call,
    /// a `HostRegister`.
    pub fn give_fd(&mut self, fd: Result<OwnedFd, String>) {
        self.incoming_fd = Some(fd);
    }

    /// Device printf output gathered since the last call, for the next reply.
    pub fn take_stdout(&self) -> Vec<u8> {
        std::mem::take(&mut *lock(&self.core.stdout))
    }

    /// Executes one call. Fire-and-forget calls return `None`: their failures are
    /// sticky and come back from the next synchronizing call.
    pub fn handle(&mut self, call: Call) -> Option<CallResult> {
        if matches!(call, Call::ServerStatus) {
            return Some(Ok(ReplyBody::Status(server_status(&self.server))));
        }
        if self.account.is_none() {
            // A status connection passed no tenant check: it may only ask for status.
            let refused = err(
                codes::INVALID_CONTEXT,
                "a status connection may only ask for the server's status",
            );
            return (!call.is_fire_and_forget()).then_some(Err(refused));
        }
        let fire_and_forget = call.is_fire_and_forget();
        if let (false, Some(_), Some(signals), Some(ordered)) = (
            fire_and_forget,
            &self.gate,
            &mut self.signals,
            self.ctx.stream_ordered(),
        ) {
            // Whatever this call waits for, the gate must see the launches finish.
            flush_signals(ordered, signals);
        }
        let result = match self.core.fatal() {
            Some(fatal) => Err(fatal),
            None => self.execute(call),
        };
        // A memfd that came with a refused call is closed now.
        self.incoming_fd = None;
        if fire_and_forget {
            if let Err(e) = result {
                if self.core.fatal().is_none() {
                    self.core.fail(e);
                }
            }
            None
        } else {
            Some(result)
        }
    }

    fn execute(&mut self, call: Call) -> CallResult {
        match call {
            Call::MemAlloc { device, bytes } => self.mem_alloc(device, bytes),
            Call::MemFree { ptr } => self.mem_free(ptr),
            Call::MemGetInfo { device } => {
                self.check_device(device)?;
                let total = self.device.mem_total();
                let free = total.saturating_sub(self.device.mem_used());
                let (free, total) = match &self.account {
                    Some(hold) => hold.account().mem_info(total, free),
                    None => (free, total),
                };
                Ok(ReplyBody::MemInfo { free, total })
            }
            Call::MemAddressRange { ptr } => self
                .containing(ptr)
                .map(|(base, size)| ReplyBody::Range { base, size })
                .ok_or_else(|| err(codes::NOT_FOUND, format!("{ptr:#x} is in no allocation"))),
            Call::MemcpyHtoD { dst, data, stream } => self.memcpy_htod(dst, data, stream),
            Call::MemcpyDtoH { src, bytes, stream } => self.memcpy_dtoh(src, bytes, stream),
            Call::MemcpyDtoD {
                dst,
                src,
                bytes,
                stream,
            } => self.memcpy_dtod(dst, src, bytes, stream),
            Call::Memset {
                dst,
                value,
                elem_bytes,
                count,
                pitch,
                height,
                stream,
            } => self.memset(dst, value, elem_bytes, count, pitch, height, stream),
            Call::ModuleLoad { image } => self.module_load(&image),
            Call::ModuleUnload { module } => self.module_unload(module),
            Call::Launch {
                function,
                grid,
                block,
                shared_bytes,
                stream,
                params,
                attributes,
            } => self.launch(
                function,
                grid,
                block,
                shared_bytes,
                stream,
                params,
                attributes,
            ),
            Call::GraphCreate { launches } => self.graph_create(launches),
            Call::GraphLaunch { graph, stream } => self.graph_launch(graph, stream),
            Call::GraphDestroy { graph } => self.graph_destroy(graph),
            Call::StreamCreate { flags, priority } => self.stream_create(flags, priority),
            Call::StreamDestroy { stream } if self.ordered => {
                if !self.ordered_streams.remove(&stream) {
                    return Err(invalid_handle("stream", stream));
                }
                self.sched_streams.remove(&stream);
                if let Some(signals) = &mut self.signals {
                    signals.release(stream);
                }
                self.ordered()?.stream_destroy(stream)?;
                Ok(ReplyBody::Unit)
            }
            Call::StreamDestroy { stream } => {
                self.sched_streams.remove(&stream);
                if self.streams.destroy(stream) {
                    Ok(ReplyBody::Unit)
                } else {
                    Err(invalid_handle("stream", stream))
                }
            }
            Call::StreamSynchronize { stream } if self.ordered => {
                self.check_stream(stream)?;
                if let Some(result) = self.signalled_sync(SyncTarget::Stream(stream)) {
                    return result;
                }
                let outcome = self.ordered()?.synchronize(SyncTarget::Stream(stream));
                self.enqueue_failed.set(false);
                self.waited(outcome)
            }
            Call::StreamSynchronize { stream } => {
                self.check_stream(stream)?;
                self.streams.synchronize(stream);
                self.sync_result()
            }
            Call::StreamQuery { stream } if self.ordered => {
                self.check_stream(stream)?;
                self.ordered_query(SyncTarget::Stream(stream), "stream busy")
            }
            Call::StreamQuery { stream } => {
                self.check_stream(stream)?;
                let idle = if stream == DEFAULT_STREAM {
                    self.streams.ready(DEFAULT_STREAM)
                } else {
                    self.streams.is_idle(stream)
                };
                if idle {
                    self.sync_result()
                } else {
                    Err(err(codes::NOT_READY, "stream busy"))
                }
            }
            Call::StreamWaitEvent { stream, event } if self.ordered => {
                self.check_stream(stream)?;
                self.event(event)?;
                self.queue(stream, StreamWork::Wait { event })?;
                Ok(ReplyBody::Unit)
            }
            Call::StreamWaitEvent { stream, event } => {
                self.check_stream(stream)?;
                let event = self.event(event)?;
                let deps: Vec<Position> = lock(&event.state).recorded.into_iter().collect();
                self.enqueue(stream, deps, Box::new(|| {}))?;
                Ok(ReplyBody::Unit)
            }
            Call::EventCreate { flags } => {
                if flags & !0xf != 0 {
                    return Err(err(codes::INVALID_VALUE, format!("event flags {flags:#x}")));
                }
                let handle = self.mint_handle();
                if self.ordered {
                    self.ordered()?.event_create(handle, flags)?;
                }
                self.events.insert(
                    handle,
                    Arc::new(Event {
                        flags,
                        state: Mutex::new(EventState::default()),
                    }),
                );
                Ok(ReplyBody::Handle(handle))
            }
            Call::EventRecord { event, stream } => self.event_record(event, stream),
            Call::EventQuery { event } if self.ordered => {
                self.event(event)?;
                self.ordered_query(SyncTarget::Event(event), "event not reached yet")
            }
            Call::EventQuery { event } => {
                let event = self.event(event)?;
                let recorded = lock(&event.state).recorded;
                match recorded {
                    Some(pos) if !self.streams.tracker().is_done(pos) => {
                        Err(err(codes::NOT_READY, "event not reached yet"))
                    }
                    _ => Ok(ReplyBody::Unit),
                }
            }
            Call::EventSynchronize { event } if self.ordered => {
                self.event(event)?;
                let outcome = self.ordered()?.synchronize(SyncTarget::Event(event));
                self.waited(outcome)
            }
            Call::EventSynchronize { event } => {
                let event = self.event(event)?;
                let recorded = lock(&event.state).recorded;
                if let Some(pos) = recorded {
                    self.streams.tracker().wait(&[pos]);
                }
                self.sync_result()
            }
            Call::EventElapsed { start, end } => self.event_elapsed(start, end),
            Call::EventDestroy { event } => match self.events.remove(&event) {
                Some(_) if self.ordered => {
                    self.ordered()?.event_destroy(event)?;
                    Ok(ReplyBody::Unit)
                }
                Some(_) => Ok(ReplyBody::Unit),
                None => Err(invalid_handle("event", event)),
            },
            // Nothing queued since the last one: the device has nothing of ours
            // to wait for (a program that synchronizes again and again).
            Call::ContextSynchronize if self.ordered && !self.queued_since_sync.get() => {
                self.sync_result()
            }
            Call::ContextSynchronize if self.ordered => {
                if let Some(result) = self.signalled_sync(SyncTarget::Context) {
                    self.queued_since_sync.set(false);
                    return result;
                }
                let outcome = self.ordered()?.synchronize(SyncTarget::Context);
                self.queued_since_sync.set(outcome.result.is_err());
                self.enqueue_failed.set(false);
                self.waited(outcome)
            }
            Call::ContextSynchronize => {
                self.streams.synchronize_all();
                self.sync_result()
            }
            Call::TensorMapEncode { request } => self.tensor_map_encode(request),
            Call::ServerStatus => Ok(ReplyBody::Status(server_status(&self.server))),
            Call::HostRegister { base, bytes } => {
                let fd = self
                    .incoming_fd
                    .take()
                    .unwrap_or_else(|| Err("none came with the call".into()));
                let region = self.host.register(self.ctx.as_ref(), base, bytes, fd)?;
                Ok(ReplyBody::Handle(region))
            }
            Call::HostUnregister { region } => {
                self.host.span(region, 0, 0)?;
                // Like cuMemFreeHost: work that may still use it finishes first.
                self.drain_all();
                self.host.unregister(self.ctx.as_ref(), region)?;
                Ok(ReplyBody::Unit)
            }
            Call::MemcpyHtoDHost {
                dst,
                region,
                offset,
                bytes,
                stream,
            } => self.memcpy_host(dst, region, offset, bytes, stream, true),
            Call::MemcpyDtoHHost {
                src,
                region,
                offset,
                bytes,
                stream,
            } => self.memcpy_host(src, region, offset, bytes, stream, false),
        }
    }

    /// A copy between device memory at `device` and a span of a pinned host
    /// region (`to_device`: from the region): checked against the session's
    /// allocations and the region, then queued like any copy.
    fn memcpy_host(
        &mut self,
        device: DevicePtr,
        region: Handle,
        offset: u64,
        bytes: u64,
        stream: Option<Handle>,
        to_device: bool,
    ) -> CallResult {
        if let Some(s) = stream {
            self.check_stream(s)?;
        }
        let host = self.host.span(region, offset, bytes)?;
        self.check_range(device, bytes)?;
        if bytes == 0 {
            return Ok(ReplyBody::Unit);
        }
        self.core
            .stats
            .zero_copy_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        if self.ordered {
            let work = match to_device {
                true => StreamWork::HostToDevice { dst: device, host },
                false => StreamWork::DeviceToHost { src: device, host },
            };
            return self.ordered_submit(stream, work);
        }
        let job = self.device_job(move |d| match to_device {
            true => d.mem_write(device, host.read()?),
            // SAFETY: the job runs in its stream's order, apart from the
            // program's other copies into the span.
            false => d.mem_read(device, unsafe { host.write()? }),
        });
        let kind = if to_device { TO_DEVICE } else { TO_HOST };
        self.submit_copy(stream, kind, job)
    }

    /// A tensor-memory-access descriptor, for a tensor that starts in this
    /// session's memory. (Its end is not checked: a descriptor only ever
    /// reaches the memory of the context it is used in, and the tile reads
    /// past a tensor's bounds are filled, not made.)
    fn tensor_map_encode(&mut self, request: TensorMapRequest) -> CallResult {
        let rank = request.rank as usize;
        let short = request.global_dim.len() < rank
            || request.global_strides.len() + 1 < rank
            || request.element_strides.len() < rank;
        if !(1..=MAX_TENSOR_RANK).contains(&rank) || short {
            return Err(err(
                codes::INVALID_VALUE,
                format!("a tensor map of rank {rank} with too few dimensions"),
            ));
        }
        self.check_range(request.global_address, 1)?;
        let bytes = self.ctx.tensor_map_encode(&request)?;
        Ok(ReplyBody::TensorMap(bytes))
    }

    // ----- checks -----

    fn mint_handle(&mut self) -> Handle {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    fn check_device(&self, device: u32) -> Result<(), CuError> {
        if device == 0 {
            Ok(())
        } else {
            Err(err(
                codes::INVALID_DEVICE,
                format!("device {device} is not this session's device"),
            ))
        }
    }

    fn check_stream(&self, stream: Handle) -> Result<(), CuError> {
        let known = match self.ordered {
            true => stream == DEFAULT_STREAM || self.ordered_streams.contains(&stream),
            false => self.streams.contains(stream),
        };
        if known {
            Ok(())
        } else {
            Err(invalid_handle("stream", stream))
        }
    }

    fn event(&self, event: Handle) -> Result<Arc<Event>, CuError> {
        self.events
            .get(&event)
            .cloned()
            .ok_or_else(|| invalid_handle("event", event))
    }

    /// The session allocation or module global holding `ptr`: (base, size).
    fn containing(&self, ptr: DevicePtr) -> Option<(DevicePtr, u64)> {
        [&self.allocations, &self.globals]
            .into_iter()
            .filter_map(|table| table.range(..=ptr).next_back())
            .map(|(b, s)| (*b, *s))
            .find(|(base, size)| ptr - base < *size)
    }

    /// Checks that `[ptr, ptr+bytes)` lies inside one of this session's allocations.
    fn check_range(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        let inside = self
            .containing(ptr)
            .is_some_and(|(base, size)| ptr - base <= size && bytes <= size - (ptr - base));
        if inside {
            Ok(())
        } else {
            Err(err(
                codes::INVALID_VALUE,
                format!("[{ptr:#x}, +{bytes}) is not inside an allocation of this session"),
            ))
        }
    }

    /// The result of a synchronizing call: success or the pending error.
    fn sync_result(&self) -> CallResult {
        match self.core.take_error() {
            Some(e) => Err(e),
            None => Ok(ReplyBody::Unit),
        }
    }

    // ----- stream-ordered execution -----

    /// The device's stream ordering, when this session uses it.
    fn ordered(&self) -> Result<&dyn StreamOrdered, CuError> {
        self.ctx
            .stream_ordered()
            .filter(|_| self.ordered)
            .ok_or_else(|| err(codes::UNKNOWN, "the device keeps no stream order"))
    }

    /// The result of a call that waited on the device: its printf output is
    /// kept for the reply, its failure recorded (fatal ones poison the session).
    fn waited(&self, outcome: LaunchOutcome) -> CallResult {
        self.core.append_stdout(&outcome.stdout);
        if let Err(e) = outcome.result {
            // A failed context signals nothing more: its launches leave the gate now.
            if is_fatal(e.code) {
                if let Some(gate) = &self.gate {
                    gate.forget_in_flight();
                }
            }
            self.core.fail(e);
        }
        self.sync_result()
    }

    /// Queues a launch on the device. Under a gate it first waits for the scheduler
    /// to let it go; a signal that tells the gate when it is done follows it on its
    /// stream, or a later one covers it (see [`SIGNAL_EVERY`]).
    fn ordered_launch(
        &mut self,
        stream: Handle,
        module: ModuleId,
        kernel: usize,
        work: StreamWork,
    ) -> CallResult {
        let ordered = self
            .ctx
            .stream_ordered()
            .ok_or_else(|| err(codes::NOT_SUPPORTED, "stream-ordered work"))?;
        self.queued_since_sync.set(true);
        if self.gate.is_none() {
            if !ordered.enqueue(stream, work) {
                self.enqueue_failed.set(true);
            }
            // Covered by a signal when the session next synchronizes (or, for
            // the watchdog's sake, after every few launches).
            if let Some(signals) = &mut self.signals {
                if signals.launch(stream).is_none() {
                    signals.note_work(stream);
                } else if self.watched {
                    if let Some((slot, value)) = signals.due(stream, SIGNAL_EVERY) {
                        ordered.enqueue(stream, StreamWork::Signal { slot, value });
                    }
                }
            }
            return Ok(ReplyBody::Unit);
        }
        let kernel_id = cumux_scheduler::KernelId((module << 16) ^ kernel as u64);
        self.ordered_gated(stream, kernel_id, work);
        Ok(ReplyBody::Unit)
    }

    /// Queues `work` (a launch, a copy or a memset) on the device once the gate
    /// lets it go, the gate watching for its end through the stream's signals.
    fn ordered_gated(
        &mut self,
        stream: Handle,
        kernel_id: cumux_scheduler::KernelId,
        work: StreamWork,
    ) {
        let Some(ordered) = self.ctx.stream_ordered() else {
            return;
        };
        let (Some(gate), Some(signals)) = (&self.gate, &mut self.signals) else {
            if !ordered.enqueue(stream, work) {
                self.enqueue_failed.set(true);
            }
            return;
        };
        let failed = &self.enqueue_failed;
        let queue = |work| {
            if !ordered.enqueue(stream, work) {
                failed.set(true);
            }
        };
        let sched_stream = sched_stream_of(&mut self.sched_streams, stream);
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
    fn ordered_query(&self, target: SyncTarget, busy: &str) -> CallResult {
        match self.ordered()?.query(target) {
            Ok(true) => self.sync_result(),
            Ok(false) => Err(err(codes::NOT_READY, busy)),
            Err(e) => {
                self.core.fail(e);
                self.sync_result()
            }
        }
    }

    /// Queues `work` on the device: on `stream` without waiting, or (`None`)
    /// on the default stream, waiting for it as a synchronous call does.
    fn ordered_submit(&mut self, stream: Option<Handle>, work: StreamWork) -> CallResult {
        let on = stream.unwrap_or(DEFAULT_STREAM);
        // Under a gate, copies and memsets are scheduled as launches are.
        let gated = self.gate.is_some() && self.signals.is_some();
        match gated {
            true => {
                self.ordered()?;
                self.queued_since_sync.set(true);
                self.ordered_gated(on, copy_kernel_id(&work), work);
            }
            false => self.queue(on, work)?,
        }
        match stream {
            Some(_) => Ok(ReplyBody::Unit),
            None => {
                // A signal right behind it says when it is done.
                if let (Some(signals), Some(ordered)) =
                    (&mut self.signals, self.ctx.stream_ordered())
                {
                    match gated {
                        true => flush_signals(ordered, signals),
                        false => {
                            signals.launch(DEFAULT_STREAM);
                        }
                    }
                }
                if let Some(result) = self.signalled_sync(SyncTarget::Stream(DEFAULT_STREAM)) {
                    return result;
                }
                let outcome = self
                    .ordered()?
                    .synchronize(SyncTarget::Stream(DEFAULT_STREAM));
                self.enqueue_failed.set(false);
                self.waited(outcome)
            }
        }
    }

    /// Queues `work` on `stream` of the device, unwaited.
    fn queue(&mut self, stream: Handle, work: StreamWork) -> Result<(), CuError> {
        self.queued_since_sync.set(true);
        if let Some(signals) = &mut self.signals {
            signals.note_work(stream);
        }
        if !self.ordered()?.enqueue(stream, work) {
            self.enqueue_failed.set(true);
        }
        Ok(())
    }

    /// Answers a synchronize from the session's completion signals, without
    /// the worker, when they can say (every launch of the streams waited for
    /// is covered by a signal queued after all their other work), they come
    /// within `signal_wait`, and nothing failed to queue since the worker was
    /// last asked (the session's own failures, or the worker's error counter):
    /// two hand-offs fewer for a short kernel's wait. `None`: ask the worker.
    fn signalled_sync(&mut self, target: SyncTarget) -> Option<CallResult> {
        if self.enqueue_failed.get() {
            return None;
        }
        // Under a gate every waiting call has flushed them already.
        if let (None, Some(signals), Some(ordered)) =
            (&self.gate, &mut self.signals, self.ctx.stream_ordered())
        {
            flush_signals(ordered, signals);
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
    fn drain_all(&mut self) {
        if self.ordered {
            if let Ok(ordered) = self.ordered() {
                let outcome = ordered.synchronize(SyncTarget::Context);
                self.queued_since_sync.set(outcome.result.is_err());
                self.core.append_stdout(&outcome.stdout);
                if let Err(e) = outcome.result {
                    self.core.fail(e);
                }
            }
        } else {
            self.streams.synchronize_all();
        }
    }

    fn enqueue(
        &mut self,
        stream: Handle,
        deps: Vec<Position>,
        work: Work,
    ) -> Result<Position, CuError> {
        self.streams
            .enqueue(stream, deps, work)
            .ok_or_else(|| invalid_handle("stream", stream))
    }

    /// Wraps device work so it is skipped once the context is dead or closing,
    /// and its failure is recorded on the session.
    fn device_job(
        &self,
        work: impl FnOnce(&dyn DeviceContext) -> Result<(), CuError> + Send + 'static,
    ) -> Work {
        let core = Arc::clone(&self.core);
        let ctx = Arc::clone(&self.ctx);
        Box::new(move || {
            if core.skips_work() {
                return;
            }
            let result = catch_unwind(AssertUnwindSafe(|| work(ctx.as_ref())))
                .unwrap_or_else(|_| Err(err(codes::UNKNOWN, "the device panicked")));
            if let Err(e) = result {
                core.fail(e);
            }
        })
    }

    /// Queues `work` on `stream`; `None` is a synchronous call on the default
    /// stream: it runs once the work it is ordered after is done, and returns
    /// the session's pending error.
    fn submit(&mut self, stream: Option<Handle>, work: Work) -> CallResult {
        match stream {
            Some(s) => {
                self.enqueue(s, Vec::new(), work)?;
                Ok(ReplyBody::Unit)
            }
            None => {
                self.run_now(DEFAULT_STREAM, work)?;
                self.sync_result()
            }
        }
    }

    /// `work` as a stream thread runs it: under a gate, once the scheduler lets it
    /// go (named `kernel_id`, its time measured); skipped if the session ends
    /// while it waits.
    fn gated_job(
        &mut self,
        stream: Handle,
        kernel_id: cumux_scheduler::KernelId,
        work: Work,
    ) -> Work {
        let Some(gate) = &self.gate else {
            return work;
        };
        let gate = Arc::clone(gate);
        let sched_stream = sched_stream_of(&mut self.sched_streams, stream);
        Box::new(move || {
            let _ = gate.run(sched_stream, kernel_id, None, work);
        })
    }

    /// Device work of a copy or memset (`kind`: its name at the gate), queued
    /// on `stream` or, with `None`, run in the default stream's order and
    /// waited for.
    fn submit_copy(
        &mut self,
        stream: Option<Handle>,
        kind: cumux_scheduler::KernelId,
        work: Work,
    ) -> CallResult {
        let work = self.gated_job(stream.unwrap_or(DEFAULT_STREAM), kind, work);
        self.submit(stream, work)
    }

    /// Runs `work` in `stream`'s order and waits for it. When nothing it is
    /// ordered after is pending, it runs right here, sparing two thread hops.
    fn run_now(&mut self, stream: Handle, work: Work) -> Result<(), CuError> {
        if self.streams.ready(stream) {
            work();
        } else {
            let pos = self.enqueue(stream, Vec::new(), work)?;
            self.streams.tracker().wait(&[pos]);
        }
        Ok(())
    }

    /// Counts `bytes` of payload held in a queue until `work` has run, first
    /// draining the session's streams if it holds too much already.
    fn metered(&mut self, bytes: u64, work: Work) -> Work {
        let queued = &self.core.queued_bytes;
        if queued.load(Ordering::Acquire).saturating_add(bytes) > MAX_QUEUED_BYTES {
            self.streams.synchronize_all();
        }
        queued.fetch_add(bytes, Ordering::AcqRel);
        let core = Arc::clone(&self.core);
        Box::new(move || {
            work();
            core.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
        })
    }

    // ----- memory -----

    fn mem_alloc(&mut self, device: u32, bytes: u64) -> CallResult {
        self.check_device(device)?;
        if bytes == 0 {
            return Err(err(codes::INVALID_VALUE, "cannot allocate 0 bytes"));
        }
        self.reserve(bytes)?;
        let ptr = match self.ctx.mem_alloc(bytes) {
            Ok(ptr) => ptr,
            Err(e) => {
                self.release(bytes);
                return Err(e);
            }
        };
        self.allocations.insert(ptr, bytes);
        let stats = &self.core.stats;
        stats.mem_used.fetch_add(bytes, Ordering::Relaxed);
        stats.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(ReplyBody::Ptr(ptr))
    }

    fn mem_free(&mut self, ptr: DevicePtr) -> CallResult {
        let Some(&size) = self.allocations.get(&ptr) else {
            return Err(err(
                codes::INVALID_VALUE,
                format!("{ptr:#x} is not an allocation of this session"),
            ));
        };
        // Like cuMemFree, wait for work that may still use it.
        self.drain_all();
        self.allocations.remove(&ptr);
        let stats = &self.core.stats;
        stats.mem_used.fetch_sub(size, Ordering::Relaxed);
        stats.allocations.fetch_sub(1, Ordering::Relaxed);
        self.release(size);
        self.ctx.mem_free(ptr)?;
        Ok(ReplyBody::Unit)
    }

    /// Holds `bytes` against the tenant's quota, or fails as the driver does
    /// when memory runs out.
    fn reserve(&self, bytes: u64) -> Result<(), CuError> {
        let Some(hold) = &self.account else {
            return Ok(());
        };
        let account = hold.account();
        if account.reserve(bytes) {
            return Ok(());
        }
        Err(err(
            codes::OUT_OF_MEMORY,
            format!(
                "{bytes} bytes would take tenant {:?} past its quota of {} bytes ({} in use)",
                account.name,
                account.settings.memory_quota.unwrap_or(u64::MAX),
                account.mem_used()
            ),
        ))
    }

    fn release(&self, bytes: u64) {
        if let Some(hold) = &self.account {
            hold.account().release(bytes);
        }
    }

    fn memcpy_htod(&mut self, dst: DevicePtr, data: Vec<u8>, stream: Option<Handle>) -> CallResult {
        if let Some(s) = stream {
            self.check_stream(s)?;
        }
        self.check_range(dst, data.len() as u64)?;
        if data.is_empty() {
            return Ok(ReplyBody::Unit);
        }
        if self.ordered {
            return self.ordered_submit(stream, StreamWork::Write { dst, data });
        }
        let bytes = data.len() as u64;
        let mut job = self.device_job(move |d| d.mem_write(dst, &data));
        if stream.is_some() {
            job = self.metered(bytes, job);
        }
        self.submit_copy(stream, TO_DEVICE, job)
    }

    fn memcpy_dtoh(&mut self, src: DevicePtr, bytes: u64, stream: Option<Handle>) -> CallResult {
        let stream = stream.unwrap_or(DEFAULT_STREAM);
        self.check_stream(stream)?;
        if bytes > MAX_CHUNK_BYTES as u64 {
            return Err(err(
                codes::INVALID_VALUE,
                format!("a copy of {bytes} bytes exceeds one chunk"),
            ));
        }
        self.check_range(src, bytes)?;
        if self.ordered {
            let mut buf = vec![0u8; bytes as usize];
            let outcome = self.ordered()?.read(stream, src, &mut buf);
            self.waited(outcome)?;
            return Ok(ReplyBody::Data(buf));
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let job = self.device_job(move |d| {
            let mut buf = vec![0u8; bytes as usize];
            let result = d.mem_read(src, &mut buf);
            let _ = tx.send(buf);
            result
        });
        let job = self.gated_job(stream, TO_HOST, job);
        self.run_now(stream, job)?;
        let data = rx.try_recv().ok();
        if let Some(e) = self.core.take_error() {
            return Err(e);
        }
        data.map(ReplyBody::Data)
            .ok_or_else(|| err(codes::UNKNOWN, "the copy did not run"))
    }

    fn memcpy_dtod(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: Option<Handle>,
    ) -> CallResult {
        if let Some(s) = stream {
            self.check_stream(s)?;
        }
        self.check_range(src, bytes)?;
        self.check_range(dst, bytes)?;
        if bytes == 0 {
            return Ok(ReplyBody::Unit);
        }
        if self.ordered {
            return self.ordered_submit(stream, StreamWork::Copy { dst, src, bytes });
        }
        let job = self.device_job(move |d| d.mem_copy(dst, src, bytes));
        self.submit_copy(stream, DEVICE_COPY, job)
    }

    #[allow(clippy::too_many_arguments)]
    fn memset(
        &mut self,
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
        pitch: u64,
        height: u64,
        stream: Option<Handle>,
    ) -> CallResult {
        if let Some(s) = stream {
            self.check_stream(s)?;
        }
        let pattern = match elem_bytes {
            1 => vec![value as u8],
            2 => (value as u16).to_le_bytes().to_vec(),
            4 => value.to_le_bytes().to_vec(),
            _ => {
                return Err(err(
                    codes::INVALID_VALUE,
                    format!("memset element of {elem_bytes} bytes"),
                ))
            }
        };
        let row = count
            .checked_mul(u64::from(elem_bytes))
            .ok_or_else(|| err(codes::INVALID_VALUE, "memset too large"))?;
        if count == 0 || height == 0 {
            return Ok(ReplyBody::Unit);
        }
        if height > 1 && pitch < row {
            return Err(err(codes::INVALID_VALUE, "memset pitch smaller than a row"));
        }
        let span = (height - 1)
            .checked_mul(pitch)
            .and_then(|s| s.checked_add(row))
            .ok_or_else(|| err(codes::INVALID_VALUE, "memset too large"))?;
        self.check_range(dst, span)?;
        if self.ordered {
            let work = StreamWork::Fill {
                dst,
                pattern,
                count,
                pitch,
                height,
            };
            return self.ordered_submit(stream, work);
        }
        let job = self.device_job(move |d| {
            (0..height).try_for_each(|r| d.mem_fill(dst + r * pitch, &pattern, count))
        });
        self.submit_copy(stream, MEMSET, job)
    }

    // ----- modules and launches -----

    fn module_load(&mut self, image: &[u8]) -> CallResult {
        let loaded = self.ctx.module_load(image)?;
        // Module globals are device memory too: they count against the quota.
        let global_bytes = loaded
            .globals
            .iter()
            .fold(0u64, |sum, g| sum.saturating_add(g.size));
        if let Err(e) = self.reserve(global_bytes) {
            self.ctx.module_unload(loaded.id);
            return Err(e);
        }
        let module = self.mint_handle();
        if global_bytes > 0 {
            self.module_bytes.insert(module, global_bytes);
        }
        let mut functions = Vec::with_capacity(loaded.kernels.len());
        let mut infos = Vec::with_capacity(loaded.kernels.len());
        for (index, kernel) in loaded.kernels.into_iter().enumerate() {
            let handle = self.mint_handle();
            infos.push(FunctionInfo {
                name: kernel.name.clone(),
                handle,
                params: kernel.params.clone(),
                attrs: kernel.attrs,
            });
            functions.push(handle);
            self.functions.insert(
                handle,
                FunctionEntry {
                    module: loaded.id,
                    index,
                    desc: kernel,
                },
            );
        }
        for g in &loaded.globals {
            if g.size > 0 {
                self.globals.insert(g.ptr, g.size);
            }
        }
        self.modules.insert(
            module,
            ModuleEntry {
                id: loaded.id,
                functions,
                globals: loaded.globals.iter().map(|g| g.ptr).collect(),
            },
        );
        tracing::debug!(
            session = self.id(),
            module,
            kernels = infos.len(),
            "module loaded"
        );
        Ok(ReplyBody::Module(ModuleInfo {
            module,
            functions: infos,
            globals: loaded
                .globals
                .into_iter()
                .map(|g| GlobalInfo {
                    name: g.name,
                    ptr: g.ptr,
                    size: g.size,
                })
                .collect(),
        }))
    }

    fn module_unload(&mut self, module: Handle) -> CallResult {
        if !self.modules.contains_key(&module) {
            return Err(invalid_handle("module", module));
        }
        self.drain_all();
        if let Some(entry) = self.modules.remove(&module) {
            self.drop_module(entry);
        }
        if let Some(bytes) = self.module_bytes.remove(&module) {
            self.release(bytes);
        }
        Ok(ReplyBody::Unit)
    }

    fn drop_module(&mut self, entry: ModuleEntry) {
        for f in &entry.functions {
            self.functions.remove(f);
        }
        for g in &entry.globals {
            self.globals.remove(g);
        }
        // Graphs of its kernels go with it: launching one later would run
        // kernels the device no longer has.
        let stale: Vec<Handle> = self
            .graphs
            .iter()
            .filter(|(_, launches)| launches.iter().any(|l| l.module == entry.id))
            .map(|(graph, _)| *graph)
            .collect();
        for graph in stale {
            self.graphs.remove(&graph);
            if let (true, Some(ordered)) = (self.ordered, self.ctx.stream_ordered()) {
                ordered.graph_destroy(graph);
            }
        }
        self.ctx.module_unload(entry.id);
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        function: Handle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: Handle,
        params: Vec<u8>,
        attributes: Vec<LaunchAttribute>,
    ) -> CallResult {
        self.check_stream(stream)?;
        let checked = self.checked_launch(GraphLaunch {
            function,
            grid,
            block,
            shared_bytes,
            params,
            attributes,
        })?;
        hop_trace::mark(Hop::Step, "checked");
        self.submit_launch(stream, checked)
    }

    /// A launch checked against its kernel and the device's limits.
    fn checked_launch(&self, launch: GraphLaunch) -> Result<CheckedLaunch, CuError> {
        let GraphLaunch {
            function,
            grid,
            block,
            shared_bytes,
            params,
            attributes,
        } = launch;
        let f = self
            .functions
            .get(&function)
            .ok_or_else(|| invalid_handle("function", function))?;
        let bad = |what: String| Err(err(codes::INVALID_VALUE, what));
        if grid.contains(&0) || block.contains(&0) {
            return bad(format!("empty launch grid {grid:?} block {block:?}"));
        }
        let over = |dims: [u32; 3], limits: [i32; 3]| {
            dims.iter().zip(limits).any(|(d, l)| *d as u64 > l as u64)
        };
        let limits = &self.limits;
        if over(block, limits.block) || over(grid, limits.grid) {
            return bad(format!(
                "launch grid {grid:?} block {block:?} over the device's limits"
            ));
        }
        let threads: u64 = block.iter().map(|d| u64::from(*d)).product();
        let max_threads = match f.desc.attrs.max_threads_per_block {
            n if n > 0 => n as u64,
            _ => 1024,
        };
        if threads > max_threads {
            return bad(format!(
                "block of {threads} threads over the kernel's {max_threads}"
            ));
        }
        let shared_total = u64::from(shared_bytes) + f.desc.attrs.shared_size_bytes.max(0) as u64;
        if shared_total > limits.shared_per_block_optin as u64 {
            return bad(format!("{shared_total} bytes of shared memory per block"));
        }
        if (params.len() as u64) < f.desc.params_bytes() {
            return bad(format!(
                "{} parameter bytes for {}, which takes {}",
                params.len(),
                f.desc.name,
                f.desc.params_bytes()
            ));
        }
        check_launch_attributes(&attributes, grid, limits.max_cluster_blocks)?;
        Ok(CheckedLaunch {
            module: f.module,
            kernel: f.index,
            geometry: LaunchGeometry {
                grid,
                block,
                dynamic_shared_bytes: shared_bytes,
                attributes,
            },
            params,
        })
    }

    /// Runs a checked launch on `stream` (queued on a device that keeps stream
    /// order, else by the stream's thread).
    fn submit_launch(&mut self, stream: Handle, launch: CheckedLaunch) -> CallResult {
        let CheckedLaunch {
            module,
            kernel,
            geometry,
            params,
        } = launch;
        let params_len = params.len() as u64;
        if self.ordered {
            // The device times nothing per launch here: the count is exact,
            // the GPU time is not measured.
            self.core.stats.launches.fetch_add(1, Ordering::Relaxed);
            if let Some(hold) = &self.account {
                hold.account().record_launch(0);
            }
            let work = StreamWork::Launch {
                module,
                kernel,
                geometry,
                params,
            };
            return self.ordered_launch(stream, module, kernel, work);
        }
        let core = Arc::clone(&self.core);
        let ctx = Arc::clone(&self.ctx);
        let account = self.account.as_ref().map(|hold| Arc::clone(hold.account()));
        let run = move || {
            if core.skips_work() {
                return;
            }
            let started = Instant::now();
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                ctx.launch(module, kernel, &geometry, &params)
            }))
            .unwrap_or_else(|_| LaunchOutcome {
                stdout: Vec::new(),
                result: Err(err(codes::LAUNCH_FAILED, "the kernel crashed the device")),
            });
            let ns = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            core.stats.launches.fetch_add(1, Ordering::Relaxed);
            core.stats.gpu_time_ns.fetch_add(ns, Ordering::Relaxed);
            if let Some(account) = &account {
                account.record_launch(ns);
            }
            core.append_stdout(&outcome.stdout);
            if let Err(e) = outcome.result {
                core.fail(e);
            }
        };
        // Kernels of one tenant cost alike across its sessions: name them by
        // the device's module id (unique per device) and index.
        let kernel_id = cumux_scheduler::KernelId((module << 16) ^ kernel as u64);
        let work = self.gated_job(stream, kernel_id, Box::new(run));
        let work = self.metered(params_len, work);
        self.enqueue(stream, Vec::new(), work)?;
        Ok(ReplyBody::Unit)
    }

    // ----- graphs of launches -----

    /// Checks every launch now, as a launch is checked, and keeps them; a
    /// device that keeps stream order makes them one graph of its own.
    fn graph_create(&mut self, launches: Vec<GraphLaunch>) -> CallResult {
        if launches.is_empty() || launches.len() > MAX_GRAPH_LAUNCHES {
            return Err(err(
                codes::INVALID_VALUE,
                format!("a graph of {} launches", launches.len()),
            ));
        }
        if self.graphs.len() >= MAX_GRAPHS {
            return Err(err(
                codes::OUT_OF_MEMORY,
                format!("a session may hold {MAX_GRAPHS} graphs"),
            ));
        }
        let checked = launches
            .into_iter()
            .map(|l| self.checked_launch(l))
            .collect::<Result<Vec<_>, _>>()?;
        let handle = self.mint_handle();
        if self.ordered {
            let works = checked.iter().map(CheckedLaunch::work).collect();
            self.ordered()?.graph_create(handle, works)?;
        }
        self.graphs.insert(handle, checked);
        Ok(ReplyBody::Handle(handle))
    }

    fn graph_launch(&mut self, graph: Handle, stream: Handle) -> CallResult {
        self.check_stream(stream)?;
        let launches = self
            .graphs
            .get(&graph)
            .ok_or_else(|| invalid_handle("graph", graph))?;
        if !self.ordered {
            for launch in launches.clone() {
                self.submit_launch(stream, launch)?;
            }
            return Ok(ReplyBody::Unit);
        }
        let count = launches.len() as u64;
        self.core.stats.launches.fetch_add(count, Ordering::Relaxed);
        if let Some(hold) = &self.account {
            for _ in 0..count {
                hold.account().record_launch(0);
            }
        }
        // The scheduler sees the graph as one launch of a kernel of its own.
        self.ordered_launch(stream, graph, 0, StreamWork::Graph { graph })
    }

    fn graph_destroy(&mut self, graph: Handle) -> CallResult {
        self.graphs
            .remove(&graph)
            .ok_or_else(|| invalid_handle("graph", graph))?;
        if self.ordered {
            self.ordered()?.graph_destroy(graph);
        }
        Ok(ReplyBody::Unit)
    }

    // ----- streams and events -----

    fn stream_create(&mut self, flags: u32, priority: i32) -> CallResult {
        if flags & !NON_BLOCKING != 0 {
            return Err(err(
                codes::INVALID_VALUE,
                format!("stream flags {flags:#x}"),
            ));
        }
        if self.streams.len() >= MAX_STREAMS {
            return Err(err(
                codes::OUT_OF_MEMORY,
                format!("a session may hold {MAX_STREAMS} streams"),
            ));
        }
        let handle = self.mint_handle();
        if self.ordered {
            if self.ordered_streams.len() >= MAX_STREAMS {
                return Err(err(
                    codes::OUT_OF_MEMORY,
                    format!("a session may hold {MAX_STREAMS} streams"),
                ));
            }
            let priority = self.forced_priority.unwrap_or(priority);
            self.ordered()?.stream_create(handle, flags, priority)?;
            self.ordered_streams.insert(handle);
            return Ok(ReplyBody::Handle(handle));
        }
        self.streams.create(handle, flags).map_err(|e| {
            err(
                codes::OUT_OF_MEMORY,
                format!("cannot start a stream worker: {e}"),
            )
        })?;
        Ok(ReplyBody::Handle(handle))
    }

    fn event_record(&mut self, event: Handle, stream: Handle) -> CallResult {
        self.check_stream(stream)?;
        if self.ordered {
            self.event(event)?;
            self.queue(stream, StreamWork::Record { event })?;
            return Ok(ReplyBody::Unit);
        }
        let event = self.event(event)?;
        let generation = {
            let mut state = lock(&event.state);
            state.generation += 1;
            state.generation
        };
        let target = Arc::clone(&event);
        let pos = self.enqueue(
            stream,
            Vec::new(),
            Box::new(move || {
                let now = Instant::now();
                let mut state = lock(&target.state);
                if state.generation == generation {
                    state.time = Some(now);
                }
            }),
        )?;
        let mut state = lock(&event.state);
        if state.generation == generation {
            state.recorded = Some(pos);
        }
        Ok(ReplyBody::Unit)
    }

    fn event_elapsed(&self, start: Handle, end: Handle) -> CallResult {
        let (start_handle, end_handle) = (start, end);
        let (start, end) = (self.event(start)?, self.event(end)?);
        if (start.flags | end.flags) & EVENT_DISABLE_TIMING != 0 {
            return Err(err(
                codes::INVALID_HANDLE,
                "event created with timing disabled",
            ));
        }
        if self.ordered {
            let ms = self.ordered()?.elapsed_ms(start_handle, end_handle)?;
            return Ok(ReplyBody::ElapsedMs(ms));
        }
        let read = |e: &Event| {
            let state = lock(&e.state);
            (state.recorded, state.time)
        };
        let (start, end) = (read(&start), read(&end));
        let (Some(p0), Some(p1)) = (start.0, end.0) else {
            return Err(err(codes::INVALID_HANDLE, "event was never recorded"));
        };
        let tracker = self.streams.tracker();
        if !tracker.is_done(p0) || !tracker.is_done(p1) {
            return Err(err(codes::NOT_READY, "event not reached yet"));
        }
        match (start.1, end.1) {
            (Some(t0), Some(t1)) => {
                let ms = if t1 >= t0 {
                    (t1 - t0).as_secs_f64() * 1e3
                } else {
                    -((t0 - t1).as_secs_f64() * 1e3)
                };
                Ok(ReplyBody::ElapsedMs(ms as f32))
            }
            _ => Err(err(codes::NOT_READY, "event has no timestamp")),
        }
    }

    /// Tears the session down: queued work is skipped, running work finishes,
    /// then every module and allocation of the session is released.
    pub fn close(mut self) {
        self.core.closing.store(true, Ordering::Relaxed);
        // Launches waiting at the gate are dropped, so they hold nobody up; the
        // tenant leaves the scheduler once the session's workers have stopped.
        if let Some(gate) = &self.gate {
            gate.cancel_queued();
            // Its launches on the device may never signal (the context goes away).
            gate.forget_in_flight();
        }
        self.streams.shutdown();
        self.gate = None;
        // The watchdog sees the session's last launches through their signals,
        // so a kernel that never ends cannot hold the teardown forever.
        if let (true, Some(signals), Some(ordered)) =
            (self.watched, &mut self.signals, self.ctx.stream_ordered())
        {
            flush_signals(ordered, signals);
        }
        if !self.host.is_empty() {
            // Copies into the client's pinned regions end before they go.
            self.drain_all();
            self.host.clear(self.ctx.as_ref());
        }
        let modules: Vec<ModuleEntry> = self.modules.drain().map(|(_, m)| m).collect();
        let (n_modules, n_allocs) = (modules.len(), self.allocations.len());
        for m in modules {
            self.drop_module(m);
        }
        for (ptr, size) in std::mem::take(&mut self.allocations) {
            if let Err(e) = self.ctx.mem_free(ptr) {
                tracing::error!(session = self.id(), %e, "freeing {ptr:#x} at teardown failed");
            }
            self.release(size);
        }
        for (_, bytes) in std::mem::take(&mut self.module_bytes) {
            self.release(bytes);
        }
        self.core.stats.mem_used.store(0, Ordering::Relaxed);
        self.core.stats.allocations.store(0, Ordering::Relaxed);
        // Ends this session's hold on the tenant's account.
        self.account = None;
        if let Some(entry) = &self.entry {
            self.server.registry().remove(entry.session);
        }
        tracing::debug!(
            session = self.id(),
            modules = n_modules,
            allocations = n_allocs,
            "session closed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100 lets a block opt in to 227 KiB of shared memory; cuBLASLt's
    /// Hopper GEMMs take 226 KiB, which the CPU device's 99 KiB refused.
    #[test]
    fn launch_limits_are_the_devices_own() {
        let mut info = DeviceInfo {
            ordinal: 0,
            name: "gpu".into(),
            uuid: [0; 16],
            pci: [0; 3],
            total_mem: 1 << 30,
            attributes: vec![(97, 232_448), (5, 1 << 30)],
            backend: "cuda".into(),
        };
        let limits = LaunchLimits::of(&info);
        assert_eq!(limits.shared_per_block_optin, 232_448);
        assert_eq!(limits.grid, [1 << 30, MAX_GRID_DIM[1], MAX_GRID_DIM[2]]);
        assert_eq!(limits.block, MAX_BLOCK_DIM);
        info.attributes.clear();
        assert_eq!(
            LaunchLimits::of(&info).shared_per_block_optin,
            SHARED_PER_BLOCK_OPTIN
        );
    }
}
