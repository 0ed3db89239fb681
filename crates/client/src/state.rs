//! The client's state: the connection, the device list cached at handshake,
//! and the tables that map the handles given to the program (contexts,
//! modules, functions, streams, events) to the server's, plus what the
//! client tracks itself (allocations, pinned host memory, context stacks).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cumux_protocol::{
    Call, DeviceInfo, FunctionAttrs, GlobalInfo, Handle, ParamInfo, ReplyBody, DEFAULT_STREAM,
};

use crate::errors::*;
use crate::transport::Connection;

/// First device address the server hands out, and the end of its window.
pub const DEVICE_VA_BASE: u64 = 0x2000_0000_0000;
pub const DEVICE_VA_END: u64 = 0x3000_0000_0000;

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: special stream handles.
pub const STREAM_LEGACY: usize = 1;
pub const STREAM_PER_THREAD: usize = 2;

pub struct Context {
    pub device: u32,
    pub primary: bool,
    pub flags: u32,
}

pub struct PrimaryContext {
    pub handle: usize,
    pub refs: u32,
    pub flags: u32,
}

pub struct Module {
    pub server: Handle,
    pub functions: Vec<usize>,
    pub globals: Vec<GlobalInfo>,
}

pub struct Function {
    pub server: Handle,
    pub module: usize,
    pub name: CString,
    pub params: Vec<ParamInfo>,
    pub attrs: FunctionAttrs,
    /// Settings made with `cuFuncSetAttribute` that ride on its launches.
    pub settings: FunctionSettings,
}

/// A function's settable attributes besides its dynamic shared memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FunctionSettings {
    /// `CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH/HEIGHT/DEPTH` (0: not set):
    /// launches that name no cluster run in clusters of this shape.
    pub required_cluster: [i32; 3],
    pub non_portable_cluster_size_allowed: i32,
    pub cluster_scheduling_policy: i32,
    /// -1: the driver's default.
    pub preferred_carveout: i32,
}

pub struct Stream {
    pub server: Handle,
    pub flags: u32,
    pub priority: i32,
}

pub struct Event {
    pub server: Handle,
    pub flags: u32,
}

pub struct HostRegion {
    pub size: usize,
    pub flags: u32,
    /// Allocated by cumux (freed by `cuMemFreeHost`) rather than registered.
    pub owned: bool,
    /// Shared with the server ([`crate::pinned`]): copies name it.
    pub pinned: Option<crate::pinned::PinnedMemory>,
}

#[derive(Default)]
pub struct Tables {
    pub contexts: HashMap<usize, Context>,
    pub primary: HashMap<u32, PrimaryContext>,
    pub modules: HashMap<usize, Module>,
    pub functions: HashMap<usize, Function>,
    pub streams: HashMap<usize, Stream>,
    pub events: HashMap<usize, Event>,
    /// Device allocations: base → size.
    pub allocations: BTreeMap<u64, u64>,
    pub host: BTreeMap<usize, HostRegion>,
    /// Context-local storage of the runtime (dark API): (ctx, key) → value.
    pub ctx_storage: HashMap<(usize, usize), usize>,
    /// `cuLink*` states.
    pub links: HashMap<usize, crate::link::LinkState>,
    /// Streams being captured (server handle) and what they recorded.
    pub capture: HashMap<Handle, Vec<crate::graph::GraphOp>>,
    /// Captured graphs and their instantiations.
    pub graphs: HashMap<usize, crate::graph::Recording>,
    pub graph_execs: HashMap<usize, crate::graph::Recording>,
    /// Instantiated graphs of launches alone that the server keeps as one
    /// graph (`Call::GraphCreate`): exec → the server's graph.
    pub server_graphs: HashMap<usize, Handle>,
    /// The node handles of each graph, one per recorded op, in order.
    pub graph_nodes: HashMap<usize, Vec<usize>>,
    /// Node → (graph, index of its op in the recording).
    pub nodes: HashMap<usize, (usize, usize)>,
    /// Argument storage handed out by `cuGraphKernelNodeGetParams`: node →
    /// (argument bytes, one pointer per argument into them). Lives as long
    /// as the graph, as the driver's does.
    pub kernel_node_args: HashMap<usize, (Vec<u8>, Vec<usize>)>,
    /// Libraries (`cuLibraryLoadData`) with no code this device can run:
    /// loaded, as NVIDIA's lazy loader has them, and failing only when a
    /// kernel, global or module is asked of them.
    pub codeless: std::collections::HashSet<usize>,
    /// Libraries not loaded yet, as NVIDIA's lazy loader has them: handle →
    /// where their image lies, in a file the program mapped (a fat binary
    /// the CUDA runtime registered). Loaded when first asked for a kernel,
    /// global or module (`crate::exports::module`).
    pub lazy_libraries: HashMap<usize, usize>,
    /// Managed allocations (also in `allocations`).
    pub managed: BTreeMap<u64, crate::managed::Managed>,
}

impl Tables {
    /// The allocation containing `ptr`: (base, size).
    pub fn allocation_of(&self, ptr: u64) -> Option<(u64, u64)> {
        let (&base, &size) = self.allocations.range(..=ptr).next_back()?;
        (ptr < base + size.max(1)).then_some((base, size))
    }

    pub fn host_region_of(&self, ptr: usize) -> Option<(usize, &HostRegion)> {
        let (&base, region) = self.host.range(..=ptr).next_back()?;
        (ptr < base + region.size.max(1)).then_some((base, region))
    }

    pub fn function(&self, f: usize) -> CuResult<&Function> {
        self.functions.get(&f).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }

    pub fn stream_server(&self, s: usize) -> CuResult<Handle> {
        match s {
            0 | STREAM_LEGACY | STREAM_PER_THREAD => Ok(DEFAULT_STREAM),
            s => self
                .streams
                .get(&s)
                .map(|st| st.server)
                .ok_or(CUDA_ERROR_INVALID_HANDLE),
        }
    }

    pub fn event_server(&self, e: usize) -> CuResult<Handle> {
        self.events
            .get(&e)
            .map(|ev| ev.server)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}

pub struct Client {
    conn: Mutex<Connection>,
    pub server: String,
    pub session: u64,
    pub devices: Vec<DeviceInfo>,
    tables: Mutex<Tables>,
    next_handle: AtomicUsize,
    /// Host functions waiting on streams, by server stream handle.
    pub gates: crate::host_fn::Gates,
    /// The pinned buffer large pageable copies go through.
    pub staging: crate::staging::StagingSlot,
    /// Held while a lazy library loads, so a thread asking for it meanwhile
    /// waits for it rather than finding it neither lazy nor loaded.
    pub lazy_loading: Mutex<()>,
}

static CLIENT: OnceLock<Arc<Client>> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

thread_local! {
    /// This thread's context stack; the last entry is current.
    static CONTEXT_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Connects to the server once; later calls return the same client.
pub fn init() -> CuResult<&'static Client> {
    if let Some(c) = CLIENT.get() {
        return Ok(c);
    }
    let _guard = lock(&INIT_LOCK);
    if let Some(c) = CLIENT.get() {
        return Ok(c);
    }
    reserve_device_window();
    match Connection::connect() {
        Ok((conn, session)) => {
            tracing::info!(
                "connected to {} (session {}, {} devices)",
                session.server,
                session.session,
                session.devices.len()
            );
            let client = Arc::new(Client {
                conn: Mutex::new(conn),
                server: session.server,
                session: session.session,
                devices: session.devices,
                tables: Mutex::new(Tables::default()),
                next_handle: AtomicUsize::new(0x10_0000),
                gates: Default::default(),
                staging: Default::default(),
                lazy_loading: Mutex::new(()),
            });
            let _ = CLIENT.set(client);
            Ok(CLIENT.get().expect("just set"))
        }
        Err(e) => {
            tracing::warn!("cuInit: {e}");
            Err(CUDA_ERROR_NO_DEVICE)
        }
    }
}

/// The client, once `cuInit` has succeeded.
pub fn client() -> CuResult<&'static Client> {
    CLIENT.get().map(|c| &**c).ok_or(CUDA_ERROR_NOT_INITIALIZED)
}

/// Keeps host allocations out of the server's device window, so a pointer's
/// value alone says whether it is device or host memory.
fn reserve_device_window() {
    let len = (DEVICE_VA_END - DEVICE_VA_BASE) as usize;
    // SAFETY: mapping fresh anonymous PROT_NONE memory at a fixed address that
    // MAP_FIXED_NOREPLACE refuses to take if anything is mapped there already.
    let p = unsafe {
        libc::mmap(
            DEVICE_VA_BASE as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED || p as u64 != DEVICE_VA_BASE {
        tracing::debug!("could not reserve the device address window");
    } else {
        WINDOW_RESERVED.store(true, Ordering::Relaxed);
    }
}

static WINDOW_RESERVED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process holds the device address window (so managed
/// allocations can be mapped at their device addresses).
pub fn device_window_reserved() -> bool {
    WINDOW_RESERVED.load(Ordering::Relaxed)
}

/// Whether `p` lies in the CPU device's address window. Only the CPU device
/// hands out addresses there; a GPU's are wherever its driver put them, so
/// use [`Client::is_device_memory`] to tell device from host pointers.
pub fn is_device_ptr(p: u64) -> bool {
    (DEVICE_VA_BASE..DEVICE_VA_END).contains(&p)
}

impl Client {
    /// Whether `p` is device memory: inside an allocation the server returned
    /// (the GPU's real addresses, anywhere in the address space), or in the
    /// CPU device's window (which never aliases host memory, being reserved).
    pub fn is_device_memory(&self, p: u64) -> bool {
        is_device_ptr(p) || self.tables().allocation_of(p).is_some()
    }

    /// Sends a call, or records it when it is work for a stream being
    /// captured into a graph.
    pub fn call(&self, call: Call) -> CuResult<ReplyBody> {
        if let Some(stream) = crate::graph::stream_of_call(&call) {
            let mut t = self.tables();
            if let Some(ops) = t.capture.get_mut(&stream) {
                ops.push(crate::graph::GraphOp::Call(call));
                return Ok(ReplyBody::Unit);
            }
        }
        lock(&self.conn).call(call)
    }

    /// Sends a call whose byte buffer, left empty in `call`, is `bytes`
    /// (through shared memory it is copied once, straight into the bulk ring).
    pub fn call_with_bytes(&self, mut call: Call, bytes: &[u8]) -> CuResult<ReplyBody> {
        if crate::graph::stream_of_call(&call).is_some() {
            cumux_protocol::shm::put_call_bulk(&mut call, bytes.to_vec())
                .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
            return self.call(call);
        }
        lock(&self.conn).call_with_bytes(call, bytes)
    }

    /// Registers pinned host memory: `call` is a `HostRegister`, `fd` its
    /// memfd, which follows the call on the socket.
    pub fn register_host(
        &self,
        call: Call,
        fd: std::os::fd::BorrowedFd<'_>,
    ) -> CuResult<ReplyBody> {
        lock(&self.conn).register_host(call, fd)
    }

    /// Makes a call answered with exactly `out.len()` bytes of data, received
    /// into `out` (through shared memory straight from the bulk ring).
    pub fn call_into(&self, call: Call, out: &mut [u8]) -> CuResult<()> {
        lock(&self.conn).call_into(call, out)
    }

    /// Records `op` if `stream` is being captured; gives it back otherwise.
    pub fn record(
        &self,
        stream: Handle,
        op: crate::graph::GraphOp,
    ) -> Option<crate::graph::GraphOp> {
        let mut t = self.tables();
        match t.capture.get_mut(&stream) {
            Some(ops) => {
                ops.push(op);
                None
            }
            None => Some(op),
        }
    }

    pub fn tables(&self) -> MutexGuard<'_, Tables> {
        lock(&self.tables)
    }

    /// A fresh handle value for the program: never 0, 1 or 2 (special stream
    /// values), never reused.
    pub fn mint(&self) -> usize {
        self.next_handle.fetch_add(0x10, Ordering::Relaxed)
    }

    pub fn device(&self, ordinal: i32) -> CuResult<&DeviceInfo> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(CUDA_ERROR_INVALID_DEVICE)
    }

    pub fn attribute(&self, ordinal: i32, attr: u32) -> CuResult<i32> {
        let dev = self.device(ordinal)?;
        Ok(dev
            .attributes
            .iter()
            .find(|(a, _)| *a == attr)
            .map(|(_, v)| *v)
            .unwrap_or(0))
    }

    /// The device of the current context, which calls that work in a context
    /// need: `CUDA_ERROR_INVALID_CONTEXT` when none is current, as NVIDIA's
    /// driver answers.
    pub fn context_device(&self) -> CuResult<u32> {
        let ctx = current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        self.tables()
            .contexts
            .get(&ctx)
            .map(|c| c.device)
            .ok_or(CUDA_ERROR_INVALID_CONTEXT)
    }

    /// The device of the current context (device 0 when none is current).
    pub fn current_device(&self) -> u32 {
        match current_context() {
            Some(ctx) => self
                .tables()
                .contexts
                .get(&ctx)
                .map(|c| c.device)
                .unwrap_or(0),
            None => 0,
        }
    }

    /// The primary context of a device, created on first use.
    pub fn primary_context(&self, device: u32) -> usize {
        let mut t = self.tables();
        if let Some(p) = t.primary.get(&device) {
            return p.handle;
        }
        let handle = self.mint();
        t.contexts.insert(
            handle,
            Context {
                device,
                primary: true,
                flags: 0,
            },
        );
        t.primary.insert(
            device,
            PrimaryContext {
                handle,
                refs: 0,
                flags: 0,
            },
        );
        handle
    }

    /// Loads an image on the server and registers its functions and globals.
    pub fn load_module(&self, image: Vec<u8>) -> CuResult<usize> {
        let module = self.mint();
        self.load_module_as(module, image)?;
        Ok(module)
    }

    /// [`Client::load_module`] under a handle minted before (a lazy library's).
    pub fn load_module_as(&self, module: usize, image: Vec<u8>) -> CuResult<()> {
        // Only the CPU device needs PTX; a GPU runs the linked cubin.
        let on_cpu = self
            .devices
            .get(self.current_device() as usize)
            .is_some_and(|d| d.backend == "cpu");
        let image = if on_cpu {
            crate::link::with_ptx(image)
        } else {
            image
        };
        let info = match self.call(Call::ModuleLoad {
            image: image.clone(),
        }) {
            Ok(ReplyBody::Module(info)) => info,
            Ok(_) => return Err(CUDA_ERROR_UNKNOWN),
            // A fat binary of an `-rdc` program holds only the cubin nvlink
            // made (sm_75 by default): a newer GPU needs the program's
            // relocatable PTX, linked, which its driver JIT-compiles.
            Err(CUDA_ERROR_NO_BINARY_FOR_GPU) if !on_cpu => {
                let linked = crate::link::with_ptx(image);
                if cumux_fatbin::classify(&linked) == cumux_fatbin::Classified::Fatbin {
                    return Err(CUDA_ERROR_NO_BINARY_FOR_GPU);
                }
                tracing::debug!("no cubin for this GPU: loading the program's relocatable PTX");
                match self.call(Call::ModuleLoad { image: linked })? {
                    ReplyBody::Module(info) => info,
                    _ => return Err(CUDA_ERROR_UNKNOWN),
                }
            }
            Err(e) => return Err(e),
        };
        let mut functions = Vec::with_capacity(info.functions.len());
        let mut t = self.tables();
        for f in info.functions {
            let handle = self.mint();
            functions.push(handle);
            t.functions.insert(
                handle,
                Function {
                    server: f.handle,
                    module,
                    name: CString::new(f.name).unwrap_or_default(),
                    params: f.params,
                    attrs: f.attrs,
                    settings: FunctionSettings {
                        preferred_carveout: -1,
                        ..FunctionSettings::default()
                    },
                },
            );
        }
        t.modules.insert(
            module,
            Module {
                server: info.module,
                functions,
                globals: info.globals,
            },
        );
        Ok(())
    }

    pub fn unload_module(&self, module: usize) -> CuResult<()> {
        {
            let mut t = self.tables();
            if t.lazy_libraries.remove(&module).is_some() {
                return Ok(());
            }
            if t.codeless.remove(&module) {
                t.modules.remove(&module);
                return Ok(());
            }
        }
        let m = self
            .tables()
            .modules
            .remove(&module)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        {
            let mut t = self.tables();
            for f in &m.functions {
                t.functions.remove(f);
            }
        }
        self.call(Call::ModuleUnload { module: m.server })?;
        Ok(())
    }
}

pub fn current_context() -> Option<usize> {
    CONTEXT_STACK.with(|s| s.borrow().last().copied())
}

pub fn set_current_context(ctx: Option<usize>) {
    CONTEXT_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if let Some(c) = ctx {
            s.push(c);
        }
    });
}

pub fn push_context(ctx: usize) {
    CONTEXT_STACK.with(|s| s.borrow_mut().push(ctx));
}

pub fn pop_context() -> Option<usize> {
    CONTEXT_STACK.with(|s| s.borrow_mut().pop())
}

/// Drops a destroyed context from this thread's stack wherever it is.
pub fn forget_context(ctx: usize) {
    CONTEXT_STACK.with(|s| s.borrow_mut().retain(|c| *c != ctx));
}
