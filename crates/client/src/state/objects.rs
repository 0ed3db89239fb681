//! Everything in the client that changes after the handshake, in one `State`
//! behind the client's one lock, and the objects it holds. Server objects
//! (streams, events, modules, functions) are keyed by the server's handle,
//! the one the wire carries; objects only the client keeps (contexts,
//! libraries, graphs, link states) by the handle it minted.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::{c_void, CString};

use cumux_protocol::pinned::HostMapping;
use cumux_protocol::{
    Call, ClusterQuery, FunctionAttrs, GlobalInfo, GraphLaunch, Handle, ModuleInfo, ParamInfo,
    DEFAULT_STREAM,
};

use super::current::current_context;
use super::handles;
use super::window::is_device_ptr;
use crate::errors::*;
use crate::graph::{stream_of_call, GraphOp, Recording};
use crate::link::LinkState;

pub struct Context {
    pub device: u32,
    pub primary: bool,
    pub flags: u32,
    /// The `CU_LIMIT_*` values set on it (`cuCtxSetLimit`); a limit never set
    /// reads as its default.
    pub limits: HashMap<u32, usize>,
}

pub struct PrimaryContext {
    pub handle: usize,
    pub refs: u32,
    pub flags: u32,
}

/// A module the server loaded, keyed by its handle.
pub struct Module {
    /// Its functions' handles.
    pub functions: Vec<Handle>,
    pub globals: Vec<GlobalInfo>,
    /// The library it was loaded for, whose handle the program also uses
    /// as the module's.
    pub library: Option<usize>,
}

/// A module with nothing in it: what a library with no code for this
/// device offers.
static CODELESS: Module = Module {
    functions: Vec::new(),
    globals: Vec::new(),
    library: None,
};

/// A library (`cuLibraryLoadData`), keyed by the handle the client minted.
pub enum Library {
    /// Not loaded yet, as NVIDIA's lazy loader has it: its image lies at
    /// this address, in a file the program mapped (a fat binary the CUDA
    /// runtime registered). Loaded when first asked for a kernel, global or
    /// module (`crate::exports::module`).
    Lazy { image_at: usize },
    /// Being loaded by another thread.
    Loading,
    /// No code this device can run: loaded, as NVIDIA's lazy loader has
    /// them, and failing only when a kernel, global or module is asked of it.
    Codeless,
    /// Loaded as this server module.
    Loaded(Handle),
}

/// Where a library's image lies, for loading it on another device.
#[derive(Clone)]
pub enum LibrarySource {
    /// In a file the program mapped, at this address (read again when needed).
    Mapped(usize),
    /// A copy of the image the program gave (it may free its own).
    Bytes(std::sync::Arc<Vec<u8>>),
}

/// A function (or kernel) of a loaded module, keyed by its server handle.
pub struct Function {
    pub module: Handle,
    pub name: CString,
    pub params: Vec<ParamInfo>,
    pub attrs: FunctionAttrs,
    /// Settings made with `cuFuncSetAttribute` that ride on its launches.
    pub settings: FunctionSettings,
    /// The device driver's answers to cluster occupancy queries, by query
    /// and launch shape (`exports::occupancy`).
    pub cluster_answers: HashMap<(ClusterQuery, GraphLaunch), i32>,
}

/// A function's settable attributes besides its dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionSettings {
    /// `CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH` (0: not set):
    /// launches that name no cluster run in clusters of this shape.
    pub required_cluster: [i32; 3],
    pub non_portable_cluster_size_allowed: i32,
    pub cluster_scheduling_policy: i32,
    /// -1: the driver's default.
    pub preferred_carveout: i32,
}

impl Default for FunctionSettings {
    fn default() -> Self {
        FunctionSettings {
            required_cluster: [0; 3],
            non_portable_cluster_size_allowed: 0,
            cluster_scheduling_policy: 0,
            preferred_carveout: -1,
        }
    }
}

/// A stream the program created, keyed by its server handle.
pub struct Stream {
    pub flags: u32,
    pub priority: i32,
}

/// An event the program created, keyed by its server handle.
pub struct Event {
    pub flags: u32,
    /// Its slot of the device's marks, if it has one (`crate::marks`).
    pub mark: Option<crate::marks::EventMark>,
}

/// Host memory the program allocated or registered through the driver.
pub struct HostRegion {
    pub size: usize,
    pub flags: u32,
    /// Allocated by cumux (freed by `cuMemFreeHost`) rather than registered.
    pub owned: bool,
    /// Shared with the server (`crate::pinned`): copies name it.
    pub pinned: Option<PinnedMemory>,
}

/// A pinned buffer the server knows: its region and the program's mapping.
pub struct PinnedMemory {
    pub region: Handle,
    /// The device whose session registered it.
    pub device: u32,
    pub mapping: HostMapping,
}

impl PinnedMemory {
    pub fn ptr(&self) -> *mut c_void {
        self.mapping.as_ptr().cast()
    }
}

/// A conditional handle: the device word kernels set, and what a launch of
/// its graph sets it to first (`CU_GRAPH_COND_ASSIGN_DEFAULT`).
#[derive(Clone, Copy, Debug)]
pub struct ConditionalHandle {
    pub cell: u64,
    pub default: u32,
    pub assign_default: bool,
}

/// A managed allocation (`crate::managed`), also in `State::allocations`.
pub struct Managed {
    pub size: u64,
    /// The host copy is the newer one (pushed before the next device work).
    pub host_newer: bool,
}

/// A pending host function: what to call once its stream reaches `event`.
pub struct HostCall {
    pub event: Handle,
    pub run: Box<dyn FnOnce(CUresult) + Send>,
}

/// A stream's host functions (`crate::host_fn`).
/// Memory a graph's allocation node made: how many graphs and
/// instantiations hold it, and whether it was freed (by the program, or by a
/// free node of a graph): it goes back to the device when both are so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphAlloc {
    pub bytes: u64,
    pub holders: u32,
    pub freed: bool,
}

#[derive(Default)]
pub struct HostFnQueue {
    pub calls: VecDeque<HostCall>,
    /// Calls queued or running; work for the stream waits while non-zero.
    pub pending: usize,
    /// Whether a worker thread runs the queue.
    pub worker: bool,
}

/// The pinned buffer large pageable copies go through (`crate::staging`):
/// two slots of `SLOT_BYTES`, and an event per slot recorded after its
/// latest copy.
pub struct StagingBuffer {
    /// The device whose session registered it and made its events: copies
    /// of that device use it.
    pub device: u32,
    pub region: Handle,
    pub mapping: HostMapping,
    pub events: [Handle; 2],
}

/// Where the staging buffer is: made at the first large copy, lent to one
/// copy at a time.
#[derive(Default)]
pub enum StagingSlot {
    #[default]
    Untried,
    /// Lent to a copy (or being made by one).
    Lent,
    Ready(StagingBuffer),
    /// The server would not take it, or `CUMUX_PINNED=off`: copies carry
    /// their bytes.
    Unavailable,
}

/// What a copy gets of the staging buffer.
pub enum StagingLoan {
    Ready(StagingBuffer),
    /// Nobody made it yet: this copy does.
    ToMake,
}

/// All of the client's mutable state. The client's one lock guards it.
#[derive(Default)]
pub struct State {
    pub contexts: HashMap<usize, Context>,
    /// (device, peer device) pairs with peer access enabled.
    pub peer_access: std::collections::HashSet<(u32, u32)>,
    pub primary: HashMap<u32, PrimaryContext>,
    pub modules: HashMap<Handle, Module>,
    pub libraries: HashMap<usize, Library>,
    /// Where each library's image is, to load it on another device.
    pub library_sources: HashMap<usize, LibrarySource>,
    /// A library's modules on devices besides the one it first loaded on:
    /// (library, device) → server module. A kernel of a library is launched
    /// in the current context, so each device gets the library's module.
    pub library_copies: HashMap<(usize, u32), Handle>,
    pub functions: HashMap<Handle, Function>,
    pub streams: HashMap<Handle, Stream>,
    pub events: HashMap<Handle, Event>,
    /// Each device's page of marks (`crate::marks`); `None`: it could not be made.
    pub marks: HashMap<u32, Option<crate::marks::Marks>>,
    /// Device allocations: base → size.
    pub allocations: BTreeMap<u64, u64>,
    /// Managed allocations (also in `allocations`).
    pub managed: BTreeMap<u64, Managed>,
    /// Managed memory on a GPU (`crate::managed`): shared host memory the
    /// device reaches at the same address; base → the buffer. Also in
    /// `allocations`; never pushed or pulled.
    pub managed_reached: BTreeMap<u64, PinnedMemory>,
    /// Mapped virtual memory (`cuMemMap`): base → size of each mapping.
    /// Device memory as allocations are.
    pub mappings: BTreeMap<u64, u64>,
    pub host: BTreeMap<usize, HostRegion>,
    /// Context-local storage of the runtime (dark API): (ctx, key) → value.
    pub ctx_storage: HashMap<(usize, usize), usize>,
    /// `cuLink*` states.
    pub links: HashMap<usize, LinkState>,
    /// Streams being captured and what they recorded.
    pub capture: HashMap<Handle, Vec<GraphOp>>,
    /// Streams that joined another's capture (by waiting on an event it
    /// recorded while capturing): stream → the capturing stream. Their work
    /// is recorded there in the order issued, which respects every
    /// dependency of the forked work.
    pub capture_joined: HashMap<Handle, Handle>,
    /// Events recorded while capturing: event → the capturing stream.
    pub capture_events: HashMap<Handle, Handle>,
    /// The graph a capture makes, where the program has asked for it
    /// (`cuStreamGetCaptureInfo`) or named it (`cuStreamBeginCaptureToGraph`):
    /// capturing stream → graph. Nodes the program adds to such a graph
    /// while capturing are recorded in the capture's order.
    pub capture_graph: HashMap<Handle, usize>,
    /// Captures into a graph that exists already (`cuStreamBeginCaptureToGraph`).
    pub capture_into: std::collections::HashSet<Handle>,
    /// Captured graphs and their instantiations.
    pub graphs: HashMap<usize, Recording>,
    pub graph_execs: HashMap<usize, Recording>,
    /// Memory of graphs' allocation nodes, by address (`exports::graph_allocs`).
    pub graph_allocs: HashMap<u64, GraphAlloc>,
    /// Clone → the graph it was cloned from (`cuGraphNodeFindInClone`).
    pub graph_origins: HashMap<usize, usize>,
    /// Disabled nodes of execs: (exec, node) → the op they had.
    pub disabled_nodes: HashMap<(usize, usize), GraphOp>,
    /// Conditional handles of each graph (`cuGraphConditionalHandleCreate`).
    pub conditionals: HashMap<usize, Vec<ConditionalHandle>>,
    /// Exec → the graph it was instantiated from (whose nodes it updates).
    pub exec_graphs: HashMap<usize, usize>,
    /// Instantiated graphs of launches alone that the server keeps as one
    /// graph (`Call::GraphCreate`): exec → the server's graph.
    pub server_graphs: HashMap<usize, Handle>,
    /// The node handles of each graph, one per recorded op, in order.
    pub graph_nodes: HashMap<usize, Vec<usize>>,
    /// Node → (graph, index of its op in the recording).
    pub nodes: HashMap<usize, (usize, usize)>,
    /// The edges (from, to) of graphs built node by node; a captured graph
    /// has none here, being a chain in its recording's order.
    pub graph_edges: HashMap<usize, Vec<(usize, usize)>>,
    /// Argument storage handed out by `cuGraphKernelNodeGetParams`: node →
    /// (argument bytes, one pointer per argument into them). Lives as long
    /// as the graph, as the driver's does.
    pub kernel_node_args: HashMap<usize, (Vec<u8>, Vec<usize>)>,
    /// Host functions waiting on streams.
    pub host_fns: HashMap<Handle, HostFnQueue>,
    pub staging: StagingSlot,
    /// Stream-ordered memory pools.
    pub pools: super::pools::Pools,
}

impl State {
    /// The allocation (or mapping of virtual memory) containing `ptr`:
    /// (base, size).
    pub fn allocation_of(&self, ptr: u64) -> Option<(u64, u64)> {
        let within = |(&base, &size): (&u64, &u64)| {
            (ptr < base.saturating_add(size.max(1))).then_some((base, size))
        };
        let allocated = self.allocations.range(..=ptr).next_back().and_then(within);
        allocated.or_else(|| self.mappings.range(..=ptr).next_back().and_then(within))
    }

    pub fn host_region_of(&self, ptr: usize) -> Option<(usize, &HostRegion)> {
        let (&base, region) = self.host.range(..=ptr).next_back()?;
        (ptr < base + region.size.max(1)).then_some((base, region))
    }

    /// Whether `p` is device memory: inside an allocation the server returned
    /// (the GPU's real addresses, anywhere in the address space), or in the
    /// CPU device's window (which never aliases host memory, being reserved).
    pub fn is_device_memory(&self, p: u64) -> bool {
        is_device_ptr(p) || self.allocation_of(p).is_some()
    }

    /// The region and offset of `[ptr, ptr + len)` if it lies wholly inside
    /// one registered pinned buffer.
    pub fn pinned_span(&self, ptr: usize, len: usize) -> Option<(Handle, u64)> {
        let (base, region) = self.host_region_of(ptr)?;
        let pinned = region.pinned.as_ref()?;
        let offset = ptr - base;
        let end = offset.checked_add(len)?;
        (end <= region.size).then_some((pinned.region, offset as u64))
    }

    /// The device of the current context, which calls that work in a context
    /// need: `CUDA_ERROR_INVALID_CONTEXT` when none is current, as NVIDIA's
    /// driver answers.
    pub fn context_device(&self) -> CuResult<u32> {
        let ctx = current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        self.contexts
            .get(&ctx)
            .map(|c| c.device)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// The device of the current context (device 0 when none is current).
    pub fn current_device(&self) -> u32 {
        current_context()
            .and_then(|ctx| self.contexts.get(&ctx))
            .map_or(0, |c| c.device)
    }

    /// The primary context of a device, created (under the handle `mint`
    /// gives) on first use.
    pub fn primary_context(&mut self, device: u32, mint: impl FnOnce() -> usize) -> usize {
        if let Some(p) = self.primary.get(&device) {
            return p.handle;
        }
        let handle = handles::context(mint(), device);
        let context = Context {
            device,
            primary: true,
            flags: 0,
            limits: HashMap::new(),
        };
        self.contexts.insert(handle, context);
        let primary = PrimaryContext {
            handle,
            refs: 0,
            flags: 0,
        };
        self.primary.insert(device, primary);
        handle
    }

    pub fn function(&self, f: Handle) -> CuResult<&Function> {
        self.functions.get(&f).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    pub fn function_mut(&mut self, f: Handle) -> CuResult<&mut Function> {
        self.functions.get_mut(&f).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// `CUDA_ERROR_INVALID_HANDLE` unless `stream` is the default stream or
    /// one the program created.
    pub fn check_stream(&self, stream: Handle) -> CuResult<()> {
        if stream == DEFAULT_STREAM || self.streams.contains_key(&stream) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_HANDLE)
        }
    }

    pub fn check_event(&self, event: Handle) -> CuResult<()> {
        if self.events.contains_key(&event) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_HANDLE)
        }
    }

    /// The module a program's module handle names: a server module's, or a
    /// library's (loaded, or with no code: an empty module).
    pub fn module(&self, program: usize) -> CuResult<&Module> {
        let found = match handles::wire(program as *mut c_void) {
            Some(wire) => self.modules.get(&wire),
            None => match self.libraries.get(&program) {
                Some(Library::Loaded(wire)) => self.modules.get(wire),
                Some(Library::Codeless) => Some(&CODELESS),
                _ => None,
            },
        };
        found.ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    /// The handle the program knows a server module by: its library's if it
    /// was loaded for one.
    pub fn program_module(&self, wire: Handle) -> usize {
        match self.modules.get(&wire).and_then(|m| m.library) {
            Some(library) => library,
            None => handles::to_program(wire) as usize,
        }
    }

    /// Registers a module the server loaded and its functions (and the
    /// library it was loaded for as loaded).
    pub fn add_module(&mut self, info: ModuleInfo, library: Option<usize>) {
        if let Some(library) = library {
            let device = cumux_protocol::device_of_handle(info.module);
            match self.libraries.get(&library) {
                Some(Library::Loaded(first))
                    if cumux_protocol::device_of_handle(*first) != device =>
                {
                    self.library_copies.insert((library, device), info.module);
                }
                _ => {
                    self.libraries.insert(library, Library::Loaded(info.module));
                }
            }
        }
        let mut functions = Vec::with_capacity(info.functions.len());
        for f in info.functions {
            functions.push(f.handle);
            let function = Function {
                module: info.module,
                name: CString::new(f.name).unwrap_or_default(),
                params: f.params,
                attrs: f.attrs,
                settings: FunctionSettings::default(),
                cluster_answers: HashMap::new(),
            };
            self.functions.insert(f.handle, function);
        }
        let module = Module {
            functions,
            globals: info.globals,
            library,
        };
        self.modules.insert(info.module, module);
    }

    /// The server module of library `library` on `device`, if loaded there.
    pub fn library_module_on(&self, library: usize, device: u32) -> Option<Handle> {
        match self.libraries.get(&library) {
            Some(Library::Loaded(first)) if cumux_protocol::device_of_handle(*first) == device => {
                Some(*first)
            }
            Some(Library::Loaded(_)) => self.library_copies.get(&(library, device)).copied(),
            _ => None,
        }
    }

    /// Forgets a module or library (by the program's handle) and its
    /// functions: the server modules to unload (a library's on each device).
    pub fn remove_module(&mut self, program: usize) -> CuResult<Vec<Handle>> {
        let mut wires = match handles::wire(program as *mut c_void) {
            Some(wire) => vec![wire],
            None => match self.libraries.remove(&program) {
                Some(Library::Loaded(wire)) => vec![wire],
                Some(_) => Vec::new(),
                None => return Err(CUDA_ERROR_INVALID_HANDLE),
            },
        };
        self.library_sources.remove(&program);
        self.library_copies.retain(|(library, _), wire| {
            let copy = *library == program;
            if copy {
                wires.push(*wire);
            }
            !copy
        });
        for wire in &wires {
            let m = self.modules.remove(wire).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
            for f in &m.functions {
                self.functions.remove(f);
            }
        }
        Ok(wires)
    }

    /// Whether `[ptr, ptr + len)` lies inside one device allocation of the
    /// program that is not managed memory: device work on it can only fail
    /// with the device, so the client may send it unanswered and wait for it
    /// without asking (`transport::quiet`).
    pub fn plain_device_span(&self, ptr: u64, len: u64) -> bool {
        self.allocation_of(ptr).is_some_and(|(base, size)| {
            !self.is_managed(base) && (ptr - base).checked_add(len) <= Some(size)
        })
    }

    /// Whether `stream` is being captured into a graph.
    /// Whether the allocation at `base` is managed memory (either kind).
    pub fn is_managed(&self, base: u64) -> bool {
        self.managed.contains_key(&base) || self.managed_reached.contains_key(&base)
    }

    /// The program's streams on `device` (the default stream not among them).
    pub fn streams_on(&self, device: u32) -> Vec<Handle> {
        self.streams
            .keys()
            .copied()
            .filter(|s| cumux_protocol::device_of_handle(*s) == device)
            .collect()
    }

    pub fn capturing(&self, stream: Handle) -> bool {
        self.capture_origin(stream).is_some()
    }

    /// The capturing stream whose graph `stream`'s work goes to: itself, or
    /// the one it joined.
    pub fn capture_origin(&self, stream: Handle) -> Option<Handle> {
        if self.capture.contains_key(&stream) {
            return Some(stream);
        }
        let origin = *self.capture_joined.get(&stream)?;
        self.capture.contains_key(&origin).then_some(origin)
    }

    /// The capture (its capturing stream) whose graph `graph` is, while the
    /// graph is only a name for it (not one it adds to).
    pub fn capture_of_graph(&self, graph: usize) -> Option<Handle> {
        self.capture_graph
            .iter()
            .find(|(s, g)| **g == graph && !self.capture_into.contains(*s))
            .map(|(s, _)| *s)
    }

    /// Ends `origin`'s capture: what it recorded (joined streams' work too).
    pub fn end_capture(&mut self, origin: Handle) -> Option<Vec<GraphOp>> {
        let ops = self.capture.remove(&origin)?;
        self.capture_joined.retain(|_, o| *o != origin);
        self.capture_events.retain(|_, o| *o != origin);
        Some(ops)
    }

    /// Records `op` if `stream` is being captured; gives it back otherwise.
    pub fn capture(&mut self, stream: Handle, op: GraphOp) -> Option<GraphOp> {
        let origin = self.capture_origin(stream).unwrap_or(stream);
        match self.capture.get_mut(&origin) {
            Some(ops) => {
                ops.push(op);
                None
            }
            None => Some(op),
        }
    }

    /// Records a stream-ordered call if its stream is being captured; gives
    /// it back to be sent otherwise.
    pub fn capture_call(&mut self, call: Call) -> Option<Call> {
        let Some(stream) = stream_of_call(&call) else {
            return Some(call);
        };
        match call {
            // In a capture an event only orders the capture's streams (the
            // replay runs them in issue order): it makes no node, so the
            // graph never names it (programs destroy such events before
            // launching). `record_external` makes the node the flag asks for.
            Call::EventRecord { event, stream } => {
                if let Some(origin) = self.capture_origin(stream) {
                    self.capture_events.insert(event, origin);
                    return None;
                }
            }
            Call::StreamWaitEvent { stream, event }
                if self.capturing(stream)
                    && self.capture_events.get(&event) == self.capture_origin(stream).as_ref() =>
            {
                return None;
            }
            // Waiting on an event of a capture forks that capture onto this stream.
            Call::StreamWaitEvent { stream, event } if !self.capturing(stream) => {
                if let Some(&origin) = self.capture_events.get(&event) {
                    if self.capture.contains_key(&origin) {
                        self.capture_joined.insert(stream, origin);
                        return None;
                    }
                }
            }
            _ => {}
        }
        self.capture_node(stream, call)
    }

    /// Records `call` as a node of `stream`'s capture if it is being
    /// captured; gives it back to be sent otherwise.
    pub fn capture_node(&mut self, stream: Handle, call: Call) -> Option<Call> {
        match self.capture(stream, GraphOp::Call(call)) {
            Some(GraphOp::Call(call)) => Some(call),
            _ => None,
        }
    }

    /// Whether host functions queued on `stream` have yet to run.
    pub fn host_fns_pending(&self, stream: Handle) -> bool {
        self.host_fns.get(&stream).is_some_and(|q| q.pending > 0)
    }

    /// Whether host functions queued on any stream have yet to run.
    pub fn any_host_fns_pending(&self) -> bool {
        self.host_fns.values().any(|q| q.pending > 0)
    }

    /// Before device work on `stream` (`None`: a copy, which may read any):
    /// the managed allocations the host may have written and the work may
    /// use (`crate::managed_guard::Attach`), marked as pushed
    /// (`crate::managed::push` sends them).
    pub fn managed_to_push(&mut self, stream: Option<Handle>) -> Vec<(u64, u64)> {
        if self.managed.is_empty() {
            return Vec::new();
        }
        self.managed
            .iter_mut()
            .filter(|(p, m)| {
                m.host_newer && stream.is_none_or(|s| crate::managed_guard::used_by(**p, s))
            })
            .map(|(p, m)| {
                m.host_newer = false;
                (*p, m.size)
            })
            .collect()
    }

    /// After synchronisation: the managed allocations the device may have
    /// written, marked as pulled (`crate::managed::pull` fetches them).
    pub fn managed_to_pull(&mut self) -> Vec<(u64, u64)> {
        if self.managed.is_empty() {
            return Vec::new();
        }
        self.managed
            .iter_mut()
            .filter(|(_, m)| !m.host_newer)
            .map(|(p, m)| {
                m.host_newer = true;
                (*p, m.size)
            })
            .collect()
    }

    /// Lends the staging buffer to one copy on `device`: `None` while
    /// another copy has it, where there is none, or where it is another
    /// device's.
    pub fn borrow_staging(&mut self, device: u32) -> Option<StagingLoan> {
        match std::mem::replace(&mut self.staging, StagingSlot::Lent) {
            StagingSlot::Untried => Some(StagingLoan::ToMake),
            StagingSlot::Ready(buffer) if buffer.device != device => {
                self.staging = StagingSlot::Ready(buffer);
                None
            }
            StagingSlot::Ready(buffer) => Some(StagingLoan::Ready(buffer)),
            other => {
                self.staging = other;
                None
            }
        }
    }

    /// Gives back a loan a copy did not use.
    pub fn unborrow_staging(&mut self, loan: StagingLoan) {
        self.staging = match loan {
            StagingLoan::Ready(buffer) => StagingSlot::Ready(buffer),
            StagingLoan::ToMake => StagingSlot::Untried,
        };
    }

    /// Gives the staging buffer back (`None`: it could not be made).
    pub fn return_staging(&mut self, buffer: Option<StagingBuffer>) {
        self.staging = match buffer {
            Some(buffer) => StagingSlot::Ready(buffer),
            None => StagingSlot::Unavailable,
        };
    }
}
