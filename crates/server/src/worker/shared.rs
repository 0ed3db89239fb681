//! `shared` mode: many sessions in one device context (one worker process),
//! each on streams of its own, so their kernels can run side by side.
//! [`SharedView`] is one session's view: its handles, its default stream.
//!
//! What a view adds to the context it shares:
//! - **Names**: the session's stream and event handles are moved into a range
//!   of its own (`tag << TAG_SHIFT`), so two sessions' handle 0x100 differ.
//! - **A default stream per session**: the context's legacy default stream
//!   would serialise every tenant, so each session gets a blocking stream of
//!   its own, and the view keeps legacy order within the session: work on the
//!   default stream waits for the session's blocking streams and they wait for
//!   it (an event record and a wait, only when the other side has new work).
//! - **Its own waits**: synchronizing "the context" waits for this session's
//!   streams, not the other tenants'.
//! - **Clean-up**: dropping the view frees the session's memory, modules,
//!   streams and events in the shared context; the context lives on.
//! - **Limits of its own**: the session's `cuCtxSetLimit` requests are kept
//!   ([`LimitBook`]); the context runs each limit at the largest its live
//!   sessions asked, so one that ended keeps no big stack or heap reserved.
//! - **Scrubbed memory**: what a session frees (its modules' globals too) is
//!   zeroed first, so the next allocation, another tenant's perhaps, finds
//!   none of its bytes.
//!
//! - **Fences**: an untrusted session's memory lies in a partition of its own
//!   and its kernels are loaded from fenced PTX ([`super::fencing`]), so a
//!   kernel cannot reach another session's memory; a trusted tenant's
//!   (`trusted = true`) are not, and may.
//!
//! What it cannot add: a fault poisons the context, failing every session on it (the device then
//! starts a fresh context for new sessions). That is the trade-off against
//! `isolated` mode (a context per session in a process of its own).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use cumux_protocol::arrays::{CopyEnd, CopyExtent};
use cumux_protocol::{ClusterQuery, CuError, DevicePtr, Handle, TensorMapRequest, DEFAULT_STREAM};

use super::arrays::zero_new;
use super::context::WorkerContext;
use super::fencing::{Claims, Partition};
use super::shared_limits::LimitBook;
use crate::device::arrays::ArrayOp;
use crate::device::limits::{not_through_a_view, LimitSetting};
use crate::device::ordering::{EVENT_DISABLE_TIMING, NON_BLOCKING};
use crate::device::{
    DeviceContext, HostRegion, KernelLaunch, LaunchGeometry, LaunchOutcome, LoadedModule, ModuleId,
    StreamOrdered, StreamWork, SyncTarget, VmmOp,
};
use crate::locking::lock;
use crate::sm_parts::SmPart;

/// Session handles are below 2^40; the view's tag goes above.
const TAG_SHIFT: u32 = 40;
/// Marks the view's own events (legacy order), apart from the session's.
const INTERNAL: Handle = 1 << 39;
/// The session's default stream, in the view's range.
const DEFAULT_SLOT: Handle = INTERNAL | 1;

/// Device printf of one shared context, routed to the session whose kernel
/// printed it. The driver writes a context's printf wherever the next wait
/// flushes it, whichever session waits; so the kernels of modules that can
/// print run one at a time across the context's sessions, each waited for
/// on its stream before the next may start, and whatever text any wait
/// brings back belongs to the session that launched the last of them.
#[derive(Default)]
pub struct PrintRoute {
    /// Held while a printing kernel runs and is waited for.
    turn: Mutex<()>,
    /// The inbox of the session whose printing kernel ran last.
    owner: Mutex<Option<Arc<Mutex<Vec<u8>>>>>,
}

impl PrintRoute {
    /// Gives `text`, device printf that some session's wait brought back, to
    /// the session whose printing kernel ran last; with none (no module of
    /// the context prints through the driver, as on the CPU device, whose
    /// workers return each connection's own printf), it stays the waiter's.
    fn deliver(&self, text: Vec<u8>, waiter: &Mutex<Vec<u8>>) {
        if text.is_empty() {
            return;
        }
        match &*lock(&self.owner) {
            Some(inbox) => lock(inbox).extend_from_slice(&text),
            None => lock(waiter).extend_from_slice(&text),
        }
    }
}

/// One session's view of a shared worker context.
pub struct SharedView {
    /// The worker's own connection: kept so the shared context lives.
    _primary: Arc<WorkerContext>,
    /// This session's connection to the same context, served on a thread of
    /// its own in the worker, so its waits hold up nobody else.
    conn: WorkerContext,
    tag: u64,
    state: Mutex<ViewState>,
    /// The context's printf route, and this session's share of what it routes.
    route: Arc<PrintRoute>,
    inbox: Arc<Mutex<Vec<u8>>>,
    /// Whether a module image can print through the driver.
    may_print: fn(&[u8]) -> bool,
    fencing: Mutex<Fencing>,
    setup: FenceSetup,
    /// The limit requests of the context's live sessions, this one's among them.
    limits: Arc<LimitBook>,
}

/// What a view needs to fence its session: the context's claims, how large
/// a partition is, and the compute capability whose PTX it loads.
#[derive(Clone)]
pub struct FenceSetup {
    /// Whether untrusted tenants are fenced at all (`Sharing::Fenced`).
    pub enabled: bool,
    pub claims: Arc<Claims>,
    pub partition_bytes: u64,
    pub sm: u32,
}

/// Whether a view fences its session.
enum Fencing {
    /// Not decided until the first allocation or module: the tenant's name.
    Pending(String),
    /// A trusted tenant's: nothing fenced.
    Trusted,
    Fenced(Arc<Partition>),
}

#[derive(Default)]
struct ViewState {
    default_created: bool,
    /// The session's streams: whether each is blocking.
    streams: HashMap<Handle, bool>,
    events: HashSet<Handle>,
    /// Blocking streams with work the default stream has not waited for.
    ahead_of_default: HashSet<Handle>,
    /// Blocking streams that have not waited for the default stream's latest work.
    behind_default: HashSet<Handle>,
    /// Internal events made so far (one per blocking stream, one for the default).
    internal_events: HashSet<Handle>,
    /// The session's modules, with their globals (base, bytes).
    modules: HashMap<ModuleId, Vec<(DevicePtr, u64)>>,
    /// The priority of the session's own default stream.
    own_priority: i32,
    /// Modules that can print, and graphs with launches of theirs.
    printing: HashSet<ModuleId>,
    printing_graphs: HashSet<Handle>,
    /// A failure of a printing launch's wait, for the session's next wait.
    deferred: Option<CuError>,
}

impl SharedView {
    /// A view numbered `tag` (unique among the context's live views) over
    /// `conn`, a connection of its own to `primary`'s context, whose printf
    /// `route` takes and whose sessions' limits `limits` keeps; `may_print`
    /// tells modules that can print.
    pub fn new(
        primary: Arc<WorkerContext>,
        conn: WorkerContext,
        tag: u64,
        route: Arc<PrintRoute>,
        may_print: fn(&[u8]) -> bool,
        setup: FenceSetup,
        limits: Arc<LimitBook>,
    ) -> Self {
        // 1 ..= 2^24 - 1: never 0, so no name is a session's own.
        let tag = tag % 0xff_ffff + 1;
        limits.join(tag);
        SharedView {
            _primary: primary,
            conn,
            tag,
            state: Mutex::new(ViewState::default()),
            route,
            inbox: Arc::new(Mutex::new(Vec::new())),
            may_print,
            fencing: Mutex::new(match setup.enabled {
                true => Fencing::Pending("unknown".into()),
                false => Fencing::Trusted,
            }),
            setup,
            limits,
        }
    }

    /// The session's partition, reserved at its first need; `None` for a
    /// trusted tenant.
    fn partition(&self) -> Result<Option<Arc<Partition>>, CuError> {
        let mut fencing = lock(&self.fencing);
        let tenant = match &*fencing {
            Fencing::Trusted => return Ok(None),
            Fencing::Fenced(p) => return Ok(Some(Arc::clone(p))),
            Fencing::Pending(tenant) => tenant.clone(),
        };
        let partition = Arc::new(Partition::reserve(
            &self.conn,
            &tenant,
            self.tag,
            self.setup.partition_bytes,
            Arc::clone(&self.setup.claims),
        )?);
        *fencing = Fencing::Fenced(Arc::clone(&partition));
        Ok(Some(partition))
    }

    /// The session's partition, if it has one by now.
    fn fenced(&self) -> Option<Arc<Partition>> {
        match &*lock(&self.fencing) {
            Fencing::Fenced(p) => Some(Arc::clone(p)),
            _ => None,
        }
    }

    /// Queues `work` on `stream` in the shared context: its handles renamed,
    /// the legacy default stream's order kept within the session.
    fn enqueue_plain(&self, stream: Handle, work: StreamWork) -> bool {
        let mut state = lock(&self.state);
        let work = match work {
            StreamWork::Record { event } => StreamWork::Record {
                event: self.name(event),
            },
            StreamWork::Wait { event } => StreamWork::Wait {
                event: self.name(event),
            },
            StreamWork::Graph { graph } => StreamWork::Graph {
                graph: self.name(graph),
            },
            StreamWork::Mark { event, host, value } => StreamWork::Mark {
                event: event.map(|e| self.name(e)),
                host,
                value,
            },
            other => other,
        };
        if stream == DEFAULT_STREAM {
            if let Err(e) = self.default_stream(&mut state) {
                tracing::warn!("shared context: no default stream: {e}");
            }
            for blocking in std::mem::take(&mut state.ahead_of_default) {
                self.order_after(&mut state, DEFAULT_STREAM, blocking);
            }
            let queued = self.conn.enqueue(self.name(DEFAULT_STREAM), work);
            let blocking: Vec<Handle> = state
                .streams
                .iter()
                .filter(|(_, b)| **b)
                .map(|(s, _)| *s)
                .collect();
            state.behind_default.extend(blocking);
            return queued;
        }
        if state.streams.get(&stream) == Some(&true) {
            if state.behind_default.remove(&stream) && state.default_created {
                self.order_after(&mut state, stream, DEFAULT_STREAM);
            }
            state.ahead_of_default.insert(stream);
        }
        self.conn.enqueue(self.name(stream), work)
    }

    /// Runs `f`, a printing launch and the wait for it, in the context's
    /// printing turn, this session the owner of what it prints.
    fn printing_turn<T>(&self, f: impl FnOnce() -> T) -> T {
        let _turn = lock(&self.route.turn);
        *lock(&self.route.owner) = Some(Arc::clone(&self.inbox));
        f()
    }

    /// `out` with the session's own printf: what came back with it goes to
    /// its owner, and this session gets what is its own (and a printing
    /// launch's failure, if it has none of its own).
    fn routed(&self, mut out: LaunchOutcome) -> LaunchOutcome {
        self.route
            .deliver(std::mem::take(&mut out.stdout), &self.inbox);
        out.stdout = std::mem::take(&mut *lock(&self.inbox));
        if let (Ok(()), Some(e)) = (&out.result, lock(&self.state).deferred.take()) {
            out.result = Err(e);
        }
        out
    }

    /// Whether `work` launches a kernel that can print.
    fn prints(&self, work: &StreamWork) -> bool {
        let state = lock(&self.state);
        match work {
            StreamWork::Launch(launch) => state.printing.contains(&launch.module),
            StreamWork::Graph { graph } => state.printing_graphs.contains(graph),
            _ => false,
        }
    }

    /// Unloads `module` once its `globals` are scrubbed: the driver frees them
    /// to the context's allocator like any memory.
    fn unload(&self, module: ModuleId, globals: &[(DevicePtr, u64)]) {
        for &(ptr, bytes) in globals.iter().filter(|g| g.1 > 0) {
            if let Err(e) = self.scrub(ptr, bytes) {
                tracing::warn!("shared context: scrubbing a global at {ptr:#x} failed: {e}");
            }
        }
        self.conn.module_unload(module);
    }

    /// Zeroes `bytes` at `ptr` before the memory goes back to the context: its
    /// allocator hands freed memory to the next allocation as it is, which may
    /// be another tenant's (a GPU's driver does not clear memory within a
    /// context, only between processes).
    fn scrub(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        self.conn.mem_fill(ptr, &[0], bytes)
    }

    /// Zeroes a physical allocation that no mapping uses any more: mapped
    /// for the moment in a reservation of its own.
    fn scrub_physical(&self, physical: u64, size: u64) -> Result<(), CuError> {
        let ptr = self.conn.vmm(&VmmOp::Reserve { size, alignment: 0 })?;
        let map = VmmOp::Map {
            ptr,
            size,
            physical,
        };
        let mapped = self.conn.vmm(&map);
        let zeroed = mapped.clone().and_then(|_| {
            let flags = cumux_protocol::vmm::ACCESS_READWRITE;
            self.conn.vmm(&VmmOp::SetAccess { ptr, size, flags })?;
            self.scrub(ptr, size)
        });
        if mapped.is_ok() {
            self.conn.vmm(&VmmOp::Unmap { ptr, size })?;
        }
        self.conn.vmm(&VmmOp::FreeReservation { ptr, size })?;
        zeroed
    }

    /// Waits for the work of the session's own streams.
    fn wait_own_streams(&self) -> Result<(), CuError> {
        let streams = self.streams_of(&lock(&self.state), SyncTarget::Context);
        for stream in streams {
            let waited = self.conn.synchronize(stream);
            self.route.deliver(waited.stdout, &self.inbox);
            waited.result?;
        }
        Ok(())
    }

    fn name(&self, h: Handle) -> Handle {
        let h = if h == DEFAULT_STREAM { DEFAULT_SLOT } else { h };
        (self.tag << TAG_SHIFT) | (h & ((1 << TAG_SHIFT) - 1))
    }

    /// The event the view records on `stream` to order another stream after it.
    fn order_event(&self, state: &mut ViewState, stream: Handle) -> Result<Handle, CuError> {
        let event = self.name(INTERNAL | 2 | (stream << 2));
        if state.internal_events.insert(event) {
            // An ordering point only.
            if let Err(e) = self.conn.event_create(event, EVENT_DISABLE_TIMING) {
                state.internal_events.remove(&event);
                return Err(e);
            }
        }
        Ok(event)
    }

    /// Makes `waiter` wait for `target`'s work so far.
    fn order_after(&self, state: &mut ViewState, waiter: Handle, target: Handle) {
        match self.order_event(state, target) {
            Ok(event) => {
                self.conn
                    .enqueue(self.name(target), StreamWork::Record { event });
                self.conn
                    .enqueue(self.name(waiter), StreamWork::Wait { event });
            }
            // The next waiting call reports the context's trouble.
            Err(e) => tracing::warn!("shared context: cannot order streams: {e}"),
        }
    }

    /// Creates the session's default stream at its first use.
    fn default_stream(&self, state: &mut ViewState) -> Result<(), CuError> {
        if !state.default_created {
            let priority = state.own_priority;
            self.conn
                .stream_create(self.name(DEFAULT_STREAM), 0, priority)?;
            state.default_created = true;
        }
        Ok(())
    }

    /// The session's streams a wait on `target` covers (names in the context).
    fn streams_of(&self, state: &ViewState, target: SyncTarget) -> Vec<SyncTarget> {
        let all = || {
            let mut v: Vec<SyncTarget> = state
                .streams
                .keys()
                .map(|s| SyncTarget::Stream(self.name(*s)))
                .collect();
            if state.default_created {
                v.push(SyncTarget::Stream(self.name(DEFAULT_STREAM)));
            }
            v
        };
        match target {
            SyncTarget::Context => all(),
            // The legacy default stream waits for the blocking streams too.
            SyncTarget::Stream(DEFAULT_STREAM) => {
                let mut v: Vec<SyncTarget> = state
                    .streams
                    .iter()
                    .filter(|(_, blocking)| **blocking)
                    .map(|(s, _)| SyncTarget::Stream(self.name(*s)))
                    .collect();
                if state.default_created {
                    v.push(SyncTarget::Stream(self.name(DEFAULT_STREAM)));
                }
                v
            }
            SyncTarget::Stream(s) => vec![SyncTarget::Stream(self.name(s))],
            SyncTarget::Event(e) => vec![SyncTarget::Event(self.name(e))],
        }
    }
}

impl DeviceContext for SharedView {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, CuError> {
        match self.partition()? {
            Some(p) => p.alloc(&self.conn, bytes),
            None => self.conn.mem_alloc(bytes),
        }
    }

    /// Fences a tenant's sessions unless it is trusted; decided once.
    /// The session's streams run on the part (the worker makes them in a
    /// green context, `device::cuda::green_streams`); its memory and modules
    /// stay in the shared context.
    fn set_sm_cap(&self, part: SmPart) -> Result<(), CuError> {
        self.conn.cap_streams(part)
    }

    fn set_tenant(&self, tenant: &str, trusted: bool) {
        let mut fencing = lock(&self.fencing);
        if let Fencing::Pending(_) = &*fencing {
            *fencing = match trusted {
                true => Fencing::Trusted,
                false => Fencing::Pending(tenant.to_string()),
            };
        }
    }

    /// The session frees each of its allocations here, at the latest at its
    /// end (`Session`'s teardown), so the shared context keeps none of them.
    fn mem_free(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        // Nothing of the session's may write it after the scrub (cuMemFree
        // waits for the device anyway; a closing session's work may run).
        self.wait_own_streams()?;
        self.scrub(ptr, bytes)?;
        match self.fenced() {
            Some(p) if p.owns(ptr) => p.free(&self.conn, ptr),
            _ => self.conn.mem_free(ptr, bytes),
        }
    }

    fn mem_read(&self, src: DevicePtr, buf: &mut [u8]) -> Result<(), CuError> {
        self.conn.mem_read(src, buf)
    }

    fn mem_write(&self, dst: DevicePtr, data: &[u8]) -> Result<(), CuError> {
        self.conn.mem_write(dst, data)
    }

    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), CuError> {
        self.conn.mem_copy(dst, src, bytes)
    }

    fn mem_fill(&self, dst: DevicePtr, pattern: &[u8], count: u64) -> Result<(), CuError> {
        self.conn.mem_fill(dst, pattern, count)
    }

    fn module_load(&self, image: &[u8]) -> Result<LoadedModule, CuError> {
        let module = match self.partition()? {
            Some(p) => p.module_load(&self.conn, image, self.setup.sm)?,
            None => self.conn.module_load(image)?,
        };
        let globals = module.globals.iter().map(|g| (g.ptr, g.size)).collect();
        let mut state = lock(&self.state);
        state.modules.insert(module.id, globals);
        if (self.may_print)(image) {
            state.printing.insert(module.id);
        }
        drop(state);
        Ok(module)
    }

    fn module_unload(&self, module: ModuleId) {
        let globals = {
            let mut state = lock(&self.state);
            state.printing.remove(&module);
            state.modules.remove(&module)
        };
        if let Some(p) = self.fenced() {
            p.module_unloaded(module);
        }
        if let Some(globals) = globals {
            self.unload(module, &globals);
        }
    }

    fn launch(&self, launch: &KernelLaunch) -> LaunchOutcome {
        let run = || self.conn.launch(launch);
        let out = match lock(&self.state).printing.contains(&launch.module) {
            true => self.printing_turn(run),
            false => run(),
        };
        self.routed(out)
    }

    fn tensor_map_encode(&self, request: &TensorMapRequest) -> Result<Vec<u8>, CuError> {
        self.conn.tensor_map_encode(request)
    }

    fn cluster_occupancy(
        &self,
        module: ModuleId,
        kernel: usize,
        geometry: &LaunchGeometry,
        query: ClusterQuery,
    ) -> Result<i32, CuError> {
        self.conn.cluster_occupancy(module, kernel, geometry, query)
    }

    /// The session's request, kept; the context runs at what its live
    /// sessions need ([`LimitBook::ask`]).
    fn set_limit(&self, limit: u32, value: u64) -> Result<(), CuError> {
        let apply = |limit, setting| self.conn.apply_limit(limit, setting);
        self.limits.ask(self.tag, limit, value, apply)
    }

    fn apply_limit(&self, _limit: u32, _setting: LimitSetting) -> Result<(), CuError> {
        Err(not_through_a_view())
    }

    fn reset_limits(&self) -> Result<(), CuError> {
        Err(not_through_a_view())
    }

    /// The session's arrays and objects are its own in the shared context;
    /// the session destroys them at its end. A new array is zeroed before
    /// the session sees it, as freed memory is scrubbed.
    fn array(&self, op: &ArrayOp) -> Result<u64, CuError> {
        let id = self.conn.array(op)?;
        if let Err(e) = zero_new(&self.conn, op, id) {
            let undo = match *op {
                ArrayOp::Create { bytes, .. } => ArrayOp::Destroy { array: id, bytes },
                ArrayOp::CreateMipmapped { bytes, .. } => {
                    ArrayOp::DestroyMipmapped { mipmap: id, bytes }
                }
                _ => return Err(e),
            };
            let _ = self.conn.array(&undo);
            return Err(e);
        }
        Ok(id)
    }

    fn array_copy(
        &self,
        src: &CopyEnd,
        dst: &CopyEnd,
        extent: &CopyExtent,
        from_host: &[u8],
        to_host: &mut [u8],
    ) -> Result<(), CuError> {
        self.conn.array_copy(src, dst, extent, from_host, to_host)
    }

    fn host_register(&self, region: HostRegion<'_>) -> Result<bool, CuError> {
        self.conn.host_register(region)
    }

    fn host_unregister(&self, region: Handle) {
        self.conn.host_unregister(region)
    }

    fn vmm_export(&self, physical: u64) -> Result<std::os::fd::OwnedFd, CuError> {
        self.conn.vmm_export(physical)
    }

    fn peer_access(&self, peer: &dyn DeviceContext, enable: bool) -> Result<(), CuError> {
        self.conn.peer_access(peer, enable)
    }

    fn peer_any(&self) -> &dyn std::any::Any {
        self.conn.as_any()
    }

    fn vmm_import(&self, fd: std::os::fd::BorrowedFd<'_>) -> Result<u64, CuError> {
        self.conn.vmm_import(fd)
    }

    /// In the shared context: the handle names the session's allocation,
    /// which the session checked.
    fn ipc_export(&self, base: DevicePtr) -> Result<Vec<u8>, CuError> {
        self.refuse_fenced("cuIpcGetMemHandle")?;
        self.conn.ipc_export(base)
    }

    fn ipc_open(&self, handle: &[u8], flags: u32) -> Result<(DevicePtr, u64), CuError> {
        self.refuse_fenced("cuIpcOpenMemHandle")?;
        self.conn.ipc_open(handle, flags)
    }

    fn ipc_close(&self, base: DevicePtr) -> Result<(), CuError> {
        self.wait_own_streams()?;
        self.conn.ipc_close(base)
    }

    /// In the shared context, as the session checked it; the session frees
    /// all of it at its end. Unmapping waits for the session's streams, and
    /// physical memory is zeroed before it goes back, as freed allocations.
    fn vmm(&self, op: &VmmOp) -> Result<u64, CuError> {
        if matches!(op, VmmOp::Reserve { .. } | VmmOp::FreeReservation { .. }) {
            if let Some(answer) = self.partition()?.and_then(|p| p.reservation(op)) {
                return answer;
            }
        }
        match *op {
            VmmOp::Unmap { .. } => self.wait_own_streams()?,
            // An import's memory is its exporter's, who scrubs it (the
            // session releases it with no size: it never counted it).
            VmmOp::Release { size: 0, .. } => {}
            VmmOp::Release { physical, size } => {
                if let Err(e) = self.scrub_physical(physical, size) {
                    tracing::warn!("shared context: scrubbing physical memory failed: {e}");
                }
            }
            _ => {}
        }
        self.conn.vmm(op)
    }

    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        Some(self)
    }
}

impl StreamOrdered for SharedView {
    fn printf_waiting(&self) -> bool {
        !lock(&self.inbox).is_empty()
    }

    fn stream_create(&self, stream: Handle, flags: u32, priority: i32) -> Result<(), CuError> {
        self.conn
            .stream_create(self.name(stream), flags, priority)?;
        lock(&self.state)
            .streams
            .insert(stream, flags & NON_BLOCKING == 0);
        Ok(())
    }

    fn stream_destroy(&self, stream: Handle) -> Result<(), CuError> {
        self.conn.stream_destroy(self.name(stream))?;
        let mut state = lock(&self.state);
        state.streams.remove(&stream);
        state.ahead_of_default.remove(&stream);
        state.behind_default.remove(&stream);
        Ok(())
    }

    fn event_create(&self, event: Handle, flags: u32) -> Result<(), CuError> {
        self.conn.event_create(self.name(event), flags)?;
        lock(&self.state).events.insert(event);
        Ok(())
    }

    fn event_destroy(&self, event: Handle) -> Result<(), CuError> {
        self.conn.event_destroy(self.name(event))?;
        lock(&self.state).events.remove(&event);
        Ok(())
    }

    fn event_ipc_handle(&self, event: Handle) -> Result<Vec<u8>, CuError> {
        self.conn.event_ipc_handle(self.name(event))
    }

    fn event_open_ipc(&self, event: Handle, handle: &[u8]) -> Result<(), CuError> {
        self.conn.event_open_ipc(self.name(event), handle)?;
        lock(&self.state).events.insert(event);
        Ok(())
    }

    fn taken(&self) -> Result<(), CuError> {
        self.conn.taken()
    }

    fn attach_signals(&self, path: &std::path::Path) -> Result<(), CuError> {
        self.conn.attach_signals(path)
    }

    fn keep_hot(&self, spin: std::time::Duration) {
        self.conn.keep_hot(spin);
    }

    fn watched(&self) -> bool {
        self.conn.watched()
    }

    fn set_own_stream_priority(&self, priority: i32) {
        lock(&self.state).own_priority = priority;
    }

    fn graph_create(&self, graph: Handle, launches: Vec<StreamWork>) -> Result<(), CuError> {
        let prints = launches.iter().any(|l| self.prints(l));
        self.conn.graph_create(self.name(graph), launches)?;
        if prints {
            lock(&self.state).printing_graphs.insert(graph);
        }
        Ok(())
    }

    fn graph_destroy(&self, graph: Handle) {
        self.conn.graph_destroy(self.name(graph));
        lock(&self.state).printing_graphs.remove(&graph);
    }

    fn enqueue(&self, stream: Handle, work: StreamWork) -> bool {
        if !self.prints(&work) {
            return self.enqueue_plain(stream, work);
        }
        self.printing_turn(|| {
            let queued = self.enqueue_plain(stream, work);
            let waited = self.conn.synchronize(SyncTarget::Stream(self.name(stream)));
            self.route.deliver(waited.stdout, &self.inbox);
            if let Err(e) = waited.result {
                lock(&self.state).deferred.get_or_insert(e);
            }
            queued
        })
    }

    fn read(&self, stream: Handle, src: DevicePtr, buf: &mut [u8]) -> LaunchOutcome {
        let mut state = lock(&self.state);
        if state.streams.get(&stream) == Some(&true)
            && state.behind_default.remove(&stream)
            && state.default_created
        {
            self.order_after(&mut state, stream, DEFAULT_STREAM);
        }
        if stream == DEFAULT_STREAM {
            if let Err(e) = self.default_stream(&mut state) {
                return LaunchOutcome::failed(e);
            }
            for blocking in std::mem::take(&mut state.ahead_of_default) {
                self.order_after(&mut state, DEFAULT_STREAM, blocking);
            }
        }
        drop(state);
        self.routed(self.conn.read(self.name(stream), src, buf))
    }

    fn synchronize(&self, target: SyncTarget) -> LaunchOutcome {
        let targets = self.streams_of(&lock(&self.state), target);
        let mut out = LaunchOutcome {
            stdout: Vec::new(),
            result: Ok(()),
        };
        for t in targets {
            let one = self.conn.synchronize(t);
            out.stdout.extend_from_slice(&one.stdout);
            if out.result.is_ok() {
                out.result = one.result;
            }
        }
        self.routed(out)
    }

    fn query(&self, target: SyncTarget) -> Result<bool, CuError> {
        let targets = self.streams_of(&lock(&self.state), target);
        for t in targets {
            if !self.conn.query(t)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, CuError> {
        self.conn.elapsed_ms(self.name(start), self.name(end))
    }
}

impl Drop for SharedView {
    fn drop(&mut self) {
        let state = std::mem::take(&mut *lock(&self.state));
        if self.conn.is_dead() {
            self.limits.forget(self.tag);
            return;
        }
        // The session's work is done or skipped by now; what it held goes back.
        let _ = self.synchronize_all(&state);
        for (m, globals) in state.modules {
            self.unload(m, &globals);
        }
        for s in state.streams.keys() {
            let _ = self.conn.stream_destroy(self.name(*s));
        }
        if state.default_created {
            let _ = self.conn.stream_destroy(self.name(DEFAULT_STREAM));
        }
        for e in state.events.iter().copied().map(|e| self.name(e)) {
            let _ = self.conn.event_destroy(e);
        }
        for e in state.internal_events {
            let _ = self.conn.event_destroy(e);
        }
        if let Some(p) = self.fenced() {
            p.release(&self.conn);
        }
        // Its work is done; lowering the stack waits for the context's
        // queued work, the other tenants' too (the driver's rule).
        let apply = |limit, setting| self.conn.apply_limit(limit, setting);
        let reset = || self.conn.reset_limits();
        self.limits.leave(self.tag, apply, reset);
    }
}

impl SharedView {
    /// Memory handles between programs: a fenced kernel could not reach
    /// what another session's partition holds, so they are refused.
    fn refuse_fenced(&self, what: &str) -> Result<(), CuError> {
        match self.fenced() {
            Some(_) => Err(CuError::new(
                cumux_protocol::codes::NOT_SUPPORTED,
                format!("{what}: a fenced session of a shared context cannot share memory with another program (trusted tenants can)"),
            )),
            None => Ok(()),
        }
    }

    fn synchronize_all(&self, state: &ViewState) -> Result<(), CuError> {
        for t in self.streams_of(state, SyncTarget::Context) {
            let waited = self.conn.synchronize(t);
            self.route.deliver(waited.stdout, &self.inbox);
            waited.result?;
        }
        Ok(())
    }
}
