//! The device traits every backend implements: [`Device`] (description, memory
//! totals, contexts), [`DeviceContext`] (one session's memory, modules and
//! launches, all synchronous) and, for backends that order work on streams
//! themselves, [`StreamOrdered`]; and the plain types that cross them.

pub mod arrays;
pub mod attributes;
pub mod backends;
#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host_span;
pub mod imported;
pub mod ipc_table;
pub mod limits;
pub mod memory_use;
pub mod model;
pub mod ordering;
pub mod pieces;
pub mod placed_copy;
pub mod serial;
pub mod signals;
pub mod socket_bytes;
pub mod spin;

use crate::sm_parts::SmPart;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

pub use socket_bytes::{FillBytes, SendBytes};

use cumux_protocol::arrays::{CopyEnd, CopyExtent};
use cumux_protocol::pinned::HostMapping;
use cumux_protocol::{
    ClusterQuery, CuError, DeviceInfo, DevicePtr, FunctionAttrs, Handle, LaunchAttribute,
    ParamInfo, TensorMapRequest,
};
use serde::{Deserialize, Serialize};

use host_span::HostSpan;

/// A backend's own name for a loaded module. Unique per device, never reused.
pub type ModuleId = u64;

/// A kernel of a loaded module, as the client needs to see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelDesc {
    pub name: String,
    /// Byte offset and size of each parameter in the packed parameter buffer.
    pub params: Vec<ParamInfo>,
    pub attrs: FunctionAttrs,
}

impl KernelDesc {
    /// Bytes the packed parameter buffer must hold at least.
    pub fn params_bytes(&self) -> u64 {
        cumux_protocol::launch_checks::params_bytes(&self.params)
    }
}

/// A module-scope variable (`__device__`, `__constant__`) living in device memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GlobalDesc {
    pub name: String,
    pub ptr: DevicePtr,
    pub size: u64,
}

/// What loading an image produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadedModule {
    pub id: ModuleId,
    pub kernels: Vec<KernelDesc>,
    pub globals: Vec<GlobalDesc>,
}

/// Geometry of one launch, and the `cuLaunchKernelEx` attributes it carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchGeometry {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
    pub attributes: Vec<LaunchAttribute>,
}

impl LaunchGeometry {
    /// Blocks per cluster, if the launch asks for clusters.
    pub fn cluster(&self) -> Option<[u32; 3]> {
        self.attributes.iter().find_map(|a| match a {
            LaunchAttribute::ClusterDim(dims) => Some(*dims),
            _ => None,
        })
    }

    /// Whether the launch is cooperative (`cuLaunchCooperativeKernel`, or
    /// the attribute set): its blocks all run at once and may sync the grid.
    pub fn cooperative(&self) -> bool {
        self.attributes
            .iter()
            .any(|a| matches!(a, LaunchAttribute::Cooperative(v) if *v != 0))
    }
}

/// One launch of `kernel` (an index into the module's kernels) with its
/// packed parameter buffer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelLaunch {
    pub module: ModuleId,
    pub kernel: usize,
    pub geometry: LaunchGeometry,
    #[serde(with = "serde_bytes")]
    pub params: Vec<u8>,
}

/// `height` rows of `count` copies of `pattern` (1, 2 or 4 bytes) from `dst`
/// on, `pitch` bytes apart ([`StreamWork::Fill`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemFill {
    pub dst: DevicePtr,
    #[serde(with = "serde_bytes")]
    pub pattern: Vec<u8>,
    pub count: u64,
    pub pitch: u64,
    pub height: u64,
}

/// The granularity the emulating backends (CPU and model devices) give
/// reservations, physical allocations and mappings: 2 MiB, as NVIDIA's GPUs.
pub const VMM_GRANULARITY: u64 = 2 << 20;

/// One virtual memory operation on a context ([`DeviceContext::vmm`]). The
/// session has checked it against its own tables (its reservations, its
/// physical allocations, alignment to the granularity, no mapping over
/// another); a backend still fails cleanly on a bad one. `physical` is the
/// backend's own id, which [`VmmOp::Create`] returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VmmOp {
    /// The minimum (or recommended) granularity of pinned device memory.
    Granularity { recommended: bool },
    /// Reserves `size` bytes of addresses aligned to `alignment` (0: the
    /// granularity): their start.
    Reserve { size: u64, alignment: u64 },
    /// Gives back a reservation with no mapping left in it.
    FreeReservation { ptr: DevicePtr, size: u64 },
    /// A physical allocation of `size` bytes: its id. `shareable`: one
    /// [`DeviceContext::vmm_export`] can give as a file descriptor;
    /// `compressed`: compressible memory asked for, which a device may not
    /// grant ([`VmmOp::Compressed`] says).
    Create {
        size: u64,
        shareable: bool,
        compressed: bool,
    },
    /// Whether physical allocation `physical` is compressible: 1 or 0.
    Compressed { physical: u64 },
    /// Frees a physical allocation that no mapping uses any more.
    Release { physical: u64, size: u64 },
    /// Maps the first `size` bytes of `physical` at `ptr`, in a reservation.
    Map {
        ptr: DevicePtr,
        size: u64,
        physical: u64,
    },
    /// Removes the mapping at `ptr` (one whole mapping).
    Unmap { ptr: DevicePtr, size: u64 },
    /// The device's access (`CU_MEM_ACCESS_FLAGS_PROT_*`) to mapped memory.
    SetAccess {
        ptr: DevicePtr,
        size: u64,
        flags: u64,
    },
}

/// A pin of a link's shared area ([`DeviceContext::pin_link_area`]): the
/// area stays page-locked for the device while it lives.
pub type AreaPin = Box<dyn Send>;

/// A client's pinned host memory as [`DeviceContext::host_register`] takes it.
#[derive(Clone, Copy)]
pub struct HostRegion<'a> {
    /// The region's id, unique in the server; copies name it.
    pub id: Handle,
    /// This process's mapping of the region.
    pub mapping: &'a Arc<HostMapping>,
    /// Its memfd, for a context in another process.
    pub fd: BorrowedFd<'a>,
    /// Where the client has it: a context that maps it there too lets
    /// kernels, memsets and copies reach it by the client's own pointers.
    pub client_base: u64,
}

/// What one launch did.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchOutcome {
    /// Device `printf` output, in order.
    pub stdout: Vec<u8>,
    /// A fault (illegal address, misaligned access, trap…) as the driver's code.
    pub result: Result<(), CuError>,
}

impl LaunchOutcome {
    /// A call that failed before anything ran (so nothing printed).
    pub fn failed(e: CuError) -> Self {
        LaunchOutcome {
            stdout: Vec::new(),
            result: Err(e),
        }
    }
}

/// One device the server owns. Sessions never touch it directly: each gets a
/// [`DeviceContext`] of its own (an address space and module namespace, like a
/// CUDA context), so one tenant's kernels cannot even name another's memory.
pub trait Device: Send + Sync {
    /// The handshake's description: name, uuid, PCI ids, memory, attributes.
    fn info(&self) -> &DeviceInfo;
    /// Bytes of device memory in use (all contexts).
    fn mem_used(&self) -> u64;
    /// Bytes of device memory in total.
    fn mem_total(&self) -> u64 {
        self.info().total_mem
    }
    /// A new context for one session. Dropping it releases whatever it still holds.
    fn create_context(&self) -> Result<Arc<dyn DeviceContext>, CuError>;
    /// A new context for one session of a program that may use several
    /// devices, kept with the program's other contexts (`group`) where the
    /// backend needs them together: a GPU's in one process, so that one
    /// address space holds them all. By default, a context of its own.
    fn create_context_in(&self, group: &ContextGroup) -> Result<Arc<dyn DeviceContext>, CuError> {
        let _ = group;
        self.create_context()
    }
    /// Gets ready, before any session comes, what sessions will need (worker
    /// processes and their contexts), so that none starts while tenants run:
    /// creating a CUDA context stalls the kernels of the GPU's other contexts.
    /// Blocks until done; a failure is only logged (the first session meets it).
    fn warm_up(&self) {}
    /// Contexts in a given address window, for sessions moved here; `None`
    /// where the backend cannot place memory (issue 17).
    fn movable(&self) -> Option<&dyn MovableDevice> {
        None
    }
    /// Whether each session's work runs in a GPU context of its own, which the
    /// GPU time-slices with the others' (not side by side): the gate then
    /// gives tenants the device in turns (`gate::queued_scheduler_config`).
    fn time_slices_sessions(&self) -> bool {
        false
    }
}

/// The process that runs a context's work ([`DeviceContext::process`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkProcess {
    /// A process that runs no other tenant's work: its pid.
    Own(u32),
    /// One of its own, not started yet: the context has run nothing.
    NotStarted,
    /// One that may run other tenants' work too (the server, a shared worker).
    Shared,
}

/// One program's contexts on the devices of a server: what a backend keeps to
/// hold them together ([`Device::create_context_in`]), its own to choose.
#[derive(Default)]
pub struct ContextGroup {
    slot: std::sync::OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
}

impl ContextGroup {
    /// What the backend keeps here, made by `init` the first time; `None` if
    /// another backend's kind is kept already.
    pub fn kept<T: Send + Sync + 'static>(&self, init: impl FnOnce() -> Arc<T>) -> Option<Arc<T>> {
        let any = self.slot.get_or_init(|| init());
        Arc::clone(any).downcast::<T>().ok()
    }
}

/// One session's share of a device: memory, modules and launches.
///
/// Every method is synchronous: when it returns, the work is done. A context
/// that keeps no stream order of its own gets it from `threads::ThreadedStreams` (the server's own stream threads)
/// (a thread per stream calling these methods in stream order, so streams run
/// concurrently and events are timestamps taken by those threads).
///
/// Pointers reaching a context have already been checked by the session against
/// the client's own allocations; a backend still fails cleanly (never panics)
/// on a bad pointer.
pub trait DeviceContext: Send + Sync {
    fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, CuError>;
    /// Frees the allocation at `ptr`, of `bytes` (the size the session
    /// recorded at its allocation: backends count, they keep no table).
    fn mem_free(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError>;
    fn mem_read(&self, src: DevicePtr, buf: &mut [u8]) -> Result<(), CuError>;
    /// Reads `len` bytes from `src` in pieces of at most `piece` bytes,
    /// handing each to `take` in order: its bytes in a buffer from
    /// `buffer(n)`, or one byte value where the device side found the
    /// piece all that value. By default one piece at a time with
    /// [`DeviceContext::mem_read`]; a context reached by requests answers
    /// a span's pieces back to back.
    fn mem_read_pieces(
        &self,
        src: DevicePtr,
        len: u64,
        piece: usize,
        buffer: &mut pieces::Buffer<'_>,
        take: &mut pieces::TakePiece<'_>,
    ) -> Result<(), CuError> {
        pieces::read_one_by_one(
            &mut |at, buf| self.mem_read(at, buf),
            src,
            len,
            piece,
            buffer,
            take,
        )
    }
    fn mem_write(&self, dst: DevicePtr, data: &[u8]) -> Result<(), CuError>;
    /// Writes the `len` bytes `fill` yields at `dst`: where the device can,
    /// `fill` writes them in place (the CPU device's memory), else into a
    /// buffer first. Nothing is written past a failure of `fill`.
    fn mem_write_filled(
        &self,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> Result<(), CuError> {
        self.mem_write(dst, &socket_bytes::gathered(len, fill)?)
    }
    /// Hands the `len` bytes at `src` to `send`, where the device can from
    /// where they lie, else from a buffer; `send` is called only once the
    /// read can no longer fail for the device's sake.
    fn mem_read_sent(
        &self,
        src: DevicePtr,
        len: usize,
        send: &mut dyn SendBytes,
    ) -> Result<(), CuError> {
        let mut data = vec![0u8; len];
        self.mem_read(src, &mut data)?;
        send.send(&data).map_err(socket_bytes::not_sent)
    }
    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), CuError>;
    /// Writes `count` copies of `pattern` (1, 2 or 4 bytes) from `dst` on.
    fn mem_fill(&self, dst: DevicePtr, pattern: &[u8], count: u64) -> Result<(), CuError>;
    /// Loads a fat binary, cubin or PTX image.
    fn module_load(&self, image: &[u8]) -> Result<LoadedModule, CuError>;
    /// Unloads a module and frees its globals.
    fn module_unload(&self, module: ModuleId);
    /// Runs a launch to completion.
    fn launch(&self, launch: &KernelLaunch) -> LaunchOutcome;
    /// At the session's end, before its stream threads are joined: a launch
    /// running now stops at its next check and later ones fail at once, so
    /// nothing waits for a kernel nobody will read (the CPU device; other
    /// contexts' kernels end with their worker process, or finish).
    fn cancel_launches(&self) {}
    /// A session's `cuCtxSetLimit` of `limit` (a `CU_LIMIT_*`) to `value`
    /// (the client reads back what it set). A context of its own sets it
    /// exactly; a shared context's view keeps its session's request, and the
    /// context runs at what its live sessions asked (`worker::shared_limits`).
    fn set_limit(&self, limit: u32, value: u64) -> Result<(), CuError> {
        self.apply_limit(limit, limits::LimitSetting::Exactly(value))
    }
    /// Sets `limit` as `setting` says ([`limits::apply`]). A GPU applies
    /// every limit; a device that has no such limit takes it as met.
    fn apply_limit(&self, limit: u32, setting: limits::LimitSetting) -> Result<(), CuError> {
        let _ = (limit, setting);
        Ok(())
    }
    /// Every limit back to its value at the context's start (a shared
    /// context that has no session left); a refused one is logged.
    fn reset_limits(&self) -> Result<(), CuError> {
        Ok(())
    }
    /// Encodes a tensor-memory-access descriptor for this context's memory
    /// (`cuTensorMapEncode*`); the session has checked the address.
    fn tensor_map_encode(&self, request: &TensorMapRequest) -> Result<Vec<u8>, CuError> {
        let _ = request;
        Err(CuError::new(
            cumux_protocol::codes::NOT_SUPPORTED,
            "this device has no tensor memory access",
        ))
    }
    /// `cuOccupancyMaxActiveClusters` / `cuOccupancyMaxPotentialClusterSize`
    /// for a launch of `kernel` of `module` shaped as `geometry`, asked of
    /// the device's driver; the session has checked the kernel and shape.
    fn cluster_occupancy(
        &self,
        module: ModuleId,
        kernel: usize,
        geometry: &LaunchGeometry,
        query: ClusterQuery,
    ) -> Result<i32, CuError> {
        let _ = (module, kernel, geometry, query);
        Err(CuError::new(
            cumux_protocol::codes::NOT_SUPPORTED,
            "this device has no driver to ask about clusters (the client answers for it)",
        ))
    }
    /// The context's own stream ordering, if it has one (a GPU, or a worker
    /// process in front of one): then the session hands it stream-ordered work
    /// in the client's order and does not wait for it.
    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        None
    }
    /// Takes a client's pinned host memory. Copies name the region in
    /// [`StreamWork::HostToDevice`] and [`StreamWork::DeviceToHost`]. Whether
    /// the device also reaches it at the client's address (as a GPU with
    /// unified addressing does pinned memory), so that device work may name
    /// it there. By default it needs nothing, and reaches none.
    fn host_register(&self, region: HostRegion<'_>) -> Result<bool, CuError> {
        let _ = region;
        Ok(false)
    }
    /// Forgets `region`; the caller has waited for the work that used it.
    fn host_unregister(&self, region: Handle) {
        let _ = region;
    }
    /// Pins `len` bytes at `ptr`, this process's mapping of a link's shared
    /// area, so that copies between its rings and the device run as DMA
    /// instead of staging through the driver's own buffer; for as long as
    /// what it returns lives. `None` where the device takes no such pin
    /// (copies then stage as before): by default.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay mapped until what is returned is dropped.
    unsafe fn pin_link_area(&self, ptr: *mut u8, len: usize) -> Option<AreaPin> {
        let _ = (ptr, len);
        None
    }
    /// Runs one virtual memory operation: its number (a granularity, an
    /// address, a physical id), else 0. The session frees what it made here
    /// at its end, as its allocations (mappings first, then physical memory,
    /// then reservations).
    fn vmm(&self, op: &VmmOp) -> Result<u64, CuError> {
        let _ = op;
        Err(CuError::new(
            cumux_protocol::codes::NOT_SUPPORTED,
            "this device has no virtual memory management",
        ))
    }
    /// Runs one array operation ([`arrays::ArrayOp`]): the id of what it
    /// made, else 0. The session destroys what it made here at its end.
    fn array(&self, op: &arrays::ArrayOp) -> Result<u64, CuError> {
        let _ = op;
        Err(arrays::no_arrays())
    }
    /// Copies `extent` from `src` to `dst`, at least one an array (by its
    /// backend id), synchronously; a host source's bytes are `from_host`, a
    /// host destination's go to `to_host` (each the packed box).
    fn array_copy(
        &self,
        src: &CopyEnd,
        dst: &CopyEnd,
        extent: &CopyExtent,
        from_host: &[u8],
        to_host: &mut [u8],
    ) -> Result<(), CuError> {
        let _ = (src, dst, extent, from_host, to_host);
        Err(arrays::no_arrays())
    }
    /// A physical allocation made `shareable` as a file descriptor another
    /// process imports ([`DeviceContext::vmm_import`]): the driver's own.
    fn vmm_export(&self, physical: u64) -> Result<OwnedFd, CuError> {
        let _ = physical;
        Err(no_sharing())
    }
    /// Imports a physical allocation another process exported: its id here.
    fn vmm_import(&self, fd: BorrowedFd<'_>) -> Result<u64, CuError> {
        let _ = fd;
        Err(no_sharing())
    }
    /// Copies each `(ptr, bytes)` of this context into another's placed
    /// memory that this one imported as `chunks`: mapped here, copied,
    /// unmapped, and the imports released, whatever happens (a move's
    /// device-to-device copy, [`placed_copy`]). A worker's context does it
    /// in one request.
    fn copy_into_imported(
        &self,
        chunks: &[imported::ImportedChunk],
        copies: &[(DevicePtr, u64)],
    ) -> Result<u64, CuError> {
        let mapped = self.map_imported(chunks)?;
        let copied = self.copy_into_mapped(&mapped, copies);
        self.unmap_imported(&mapped);
        copied
    }
    /// Maps the imported `chunks` here, readable and writable, in one
    /// reservation; on failure the imports are released.
    fn map_imported(
        &self,
        chunks: &[imported::ImportedChunk],
    ) -> Result<imported::MappedChunks, CuError> {
        let _ = chunks;
        Err(no_sharing())
    }
    /// Copies each `(ptr, bytes)` of this context into the mapped chunk
    /// that holds it.
    fn copy_into_mapped(
        &self,
        mapped: &imported::MappedChunks,
        copies: &[(DevicePtr, u64)],
    ) -> Result<u64, CuError> {
        let _ = (mapped, copies);
        Err(no_sharing())
    }
    /// Undoes [`DeviceContext::map_imported`]: the mappings, the
    /// reservation, the imports.
    fn unmap_imported(&self, mapped: &imported::MappedChunks) {
        let _ = mapped;
    }
    /// Reads each `(ptr, bytes)` into a buffer of its own, in order (a
    /// moved session's globals); a worker's context reads them in one request.
    fn mem_read_spans(&self, spans: &[(DevicePtr, u64)]) -> Result<Vec<Vec<u8>>, CuError> {
        read_spans_one_by_one(self, spans)
    }
    /// Writes each `(ptr, bytes)`, in order; a worker's context writes them
    /// in one request.
    fn mem_write_spans(&self, writes: &[(DevicePtr, &[u8])]) -> Result<(), CuError> {
        writes
            .iter()
            .try_for_each(|&(ptr, data)| self.mem_write(ptr, data))
    }
    /// The context as `Any`, so a backend can tell its own contexts among
    /// others (peer access needs the peer's own handle).
    fn as_any(&self) -> &dyn std::any::Any;

    /// The process that runs this context's work, as NVIDIA's per-process
    /// figures see it.
    fn process(&self) -> WorkProcess {
        WorkProcess::Shared
    }

    /// Tells the context whose session it serves: a `shared`-mode view fences
    /// an untrusted tenant's kernels and memory ([`crate::worker::fencing`]).
    fn set_tenant(&self, _tenant: &str, _trusted: bool) {}
    /// Limits the context's kernels to the stretch `part` of its device's
    /// SMs, before its first use (a tenant's `sm_percent`, placed by
    /// [`crate::sm_parts`]). Devices without SM partitions refuse.
    fn set_sm_cap(&self, part: SmPart) -> Result<(), CuError> {
        Err(CuError::new(
            cumux_protocol::codes::NOT_SUPPORTED,
            format!(
                "an SM cap ({} %) needs a GPU context in a worker of its own; this device has none",
                part.percent()
            ),
        ))
    }
    /// A fresh context of the same device whose kernels run on the stretch
    /// `part` of its SMs, and the SMs it got; asked of an unused context.
    fn capped(&self, part: SmPart) -> Result<(Arc<dyn DeviceContext>, u32), CuError> {
        Err(CuError::new(
            cumux_protocol::codes::NOT_SUPPORTED,
            format!(
                "this device cannot cap a context's SMs ({} % asked)",
                part.percent()
            ),
        ))
    }
    /// In a context sessions share: makes the streams the calling thread
    /// makes from now on run on the stretch `part` of the device's SMs (a
    /// capped tenant's session, served on a thread of its own); the SMs.
    fn cap_streams(&self, part: SmPart) -> Result<u32, CuError> {
        Err(CuError::new(
            cumux_protocol::codes::NOT_SUPPORTED,
            format!(
                "this device cannot cap a session's SMs ({} % asked)",
                part.percent()
            ),
        ))
    }
    /// How the context's memory is laid out again elsewhere when its session
    /// moves; `None` where it cannot be (issue 17).
    fn movable(&self) -> Option<&dyn MovableContext> {
        None
    }
    /// What stands for this context when another names it as a peer: the
    /// context itself, or the connection a view of a shared context wraps.
    fn peer_any(&self) -> &dyn std::any::Any {
        self.as_any()
    }
    /// Lets this context's kernels reach `peer`'s memory (`enable`), or no
    /// longer: `peer` is a context of the same program on another device,
    /// in the same process (`Device::create_context_in`).
    fn peer_access(&self, peer: &dyn DeviceContext, enable: bool) -> Result<(), CuError> {
        let _ = (peer, enable);
        Err(CuError::new(
            cumux_protocol::codes::PEER_ACCESS_UNSUPPORTED,
            "this device reaches no other device's memory",
        ))
    }
    /// Memory handles between processes (`cuIpc*MemHandle`): a handle for the
    /// allocation at `base`, which another context may open.
    fn ipc_export(&self, base: DevicePtr) -> Result<Vec<u8>, CuError> {
        let _ = base;
        Err(no_ipc())
    }
    /// Opens a handle [`DeviceContext::ipc_export`] gave (another context's):
    /// the allocation's base here and its size.
    fn ipc_open(&self, handle: &[u8], flags: u32) -> Result<(DevicePtr, u64), CuError> {
        let _ = (handle, flags);
        Err(no_ipc())
    }
    /// Closes memory opened at `base`.
    fn ipc_close(&self, base: DevicePtr) -> Result<(), CuError> {
        let _ = base;
        Err(no_ipc())
    }
}

fn no_sharing() -> CuError {
    CuError::new(
        cumux_protocol::codes::NOT_SUPPORTED,
        "this device shares no physical memory between processes",
    )
}

fn no_ipc() -> CuError {
    CuError::new(
        cumux_protocol::codes::NOT_SUPPORTED,
        "this device shares no memory between processes (cuIpc*MemHandle)",
    )
}

/// Stream-ordered work for [`StreamOrdered::enqueue`]. It lives in one
/// process: what travels to a worker is the worker wire's own form of it.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamWork {
    Write {
        dst: DevicePtr,
        data: Vec<u8>,
    },
    Copy {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    },
    Fill(MemFill),
    Launch(KernelLaunch),
    /// Records `event` at this point of the stream.
    Record {
        event: Handle,
    },
    /// Later work of the stream waits for `event`'s latest record.
    Wait {
        event: Handle,
    },
    /// Raises counter `slot` of the connection's signal area to `value` once the
    /// stream's earlier work is done ([`StreamOrdered::attach_signals`]).
    Signal {
        slot: u32,
        value: u64,
    },
    /// Copies a span of a registered host region to `dst` (pinned memory).
    HostToDevice {
        dst: DevicePtr,
        host: HostSpan,
    },
    /// Copies from `src` into a span of a registered host region.
    DeviceToHost {
        src: DevicePtr,
        host: HostSpan,
    },
    /// Runs the launches of a graph made by [`StreamOrdered::graph_create`], in order.
    Graph {
        graph: Handle,
    },
    /// Stores `value` in the 8 bytes of a client's pinned region that `host`
    /// names (an aligned span of 8 bytes) once `event`, recorded just before
    /// on the stream, is reached and none of the work before it failed
    /// (`Call::Mark`). A GPU stores it from a stream of its own that waits
    /// for the event, so the stream's next kernel does not wait for the
    /// store. Without an event (a synchronize's mark) it is stored in the
    /// stream's own order, once the work before it is done.
    Mark {
        event: Option<Handle>,
        host: HostSpan,
        value: u64,
    },
    /// [`StreamWork::Signal`] as a worker hands it to its context: with the area.
    SignalTo {
        area: Arc<signals::SignalArea>,
        slot: u32,
        value: u64,
    },
}

/// What a synchronizing call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncTarget {
    Stream(Handle),
    Event(Handle),
    Context,
}

/// A context that keeps CUDA's stream semantics itself: streams (the session's
/// handles; [`cumux_protocol::DEFAULT_STREAM`] is the legacy default stream,
/// always there), events, and work queued without waiting.
///
/// A failure of queued work, when queued or when it runs, comes back from the
/// next call that waits ([`StreamOrdered::read`], [`StreamOrdered::synchronize`])
/// or asks ([`StreamOrdered::query`]); device `printf` output comes back with
/// the waiting calls, as the driver flushes it at synchronization points.
pub trait StreamOrdered: Send + Sync {
    /// `flags` are `CU_STREAM_*` (0 blocking, 1 non-blocking); `priority` as
    /// CUDA's (lower is more urgent; clamped to the device's range).
    fn stream_create(&self, stream: Handle, flags: u32, priority: i32) -> Result<(), CuError>;
    /// Destroys a stream once its queued work is done.
    fn stream_destroy(&self, stream: Handle) -> Result<(), CuError>;
    /// `flags` are `CU_EVENT_*`.
    fn event_create(&self, event: Handle, flags: u32) -> Result<(), CuError>;
    fn event_destroy(&self, event: Handle) -> Result<(), CuError>;
    /// The driver's handle of `event` (made interprocess), which another
    /// process opens as an event of its own ([`StreamOrdered::event_open_ipc`]).
    fn event_ipc_handle(&self, event: Handle) -> Result<Vec<u8>, CuError> {
        let _ = event;
        Err(CuError::new(
            cumux_protocol::codes::NOT_SUPPORTED,
            "this device shares no events between processes",
        ))
    }
    /// Opens another process's event by its `handle` as `event` here.
    fn event_open_ipc(&self, event: Handle, handle: &[u8]) -> Result<(), CuError> {
        let _ = (event, handle);
        Err(CuError::new(
            cumux_protocol::codes::NOT_SUPPORTED,
            "this device shares no events between processes",
        ))
    }
    /// Queues `work` on `stream` and returns without waiting for it; false when
    /// it failed at once (the failure is kept for the next waiting call).
    fn enqueue(&self, stream: Handle, work: StreamWork) -> bool;
    /// Returns once the device has taken the work queued so far: after the
    /// record of an event other processes may wait for, which they may do as
    /// soon as the program's call returns. Nothing to do where queueing is
    /// taking (the server's own stream threads).
    fn taken(&self) -> Result<(), CuError> {
        Ok(())
    }
    /// Runs `work` in `stream`'s order and waits for it (a synchronous copy).
    fn run_now(&self, stream: Handle, work: StreamWork) -> LaunchOutcome {
        self.enqueue(stream, work);
        self.synchronize(SyncTarget::Stream(stream))
    }
    /// [`StreamOrdered::run_now`] of a write of the `len` bytes `fill`
    /// yields: in place where the order can (its stream idle, the CPU
    /// device), else through a buffer.
    fn run_now_filled(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> LaunchOutcome {
        self.run_now_buffered(stream, dst, len, fill)
    }
    /// [`StreamOrdered::enqueue`] of a write of the `len` bytes `fill`
    /// yields: taken in place where the order can (into a worker's ring),
    /// else into a buffer. False also when `fill` failed.
    fn enqueue_filled(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> bool {
        self.enqueue_buffered(stream, dst, len, fill)
    }
    /// [`StreamOrdered::run_now_filled`] through a buffer (what an order
    /// that cannot take the bytes in place falls back to).
    fn run_now_buffered(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> LaunchOutcome {
        match socket_bytes::gathered(len, fill) {
            Ok(data) => self.run_now(stream, StreamWork::Write { dst, data }),
            Err(e) => LaunchOutcome::failed(e),
        }
    }
    /// [`StreamOrdered::enqueue_filled`] through a buffer.
    fn enqueue_buffered(
        &self,
        stream: Handle,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> bool {
        match socket_bytes::gathered(len, fill) {
            Ok(data) => self.enqueue(stream, StreamWork::Write { dst, data }),
            Err(_) => false,
        }
    }
    /// Reads `buf.len()` bytes at `src` once `stream`'s earlier work is done.
    fn read(&self, stream: Handle, src: DevicePtr, buf: &mut [u8]) -> LaunchOutcome;
    /// [`StreamOrdered::read`] of `len` bytes handed to `send` from where
    /// they lie where the order can, else from a buffer; `send` is called
    /// only for a read that succeeded. A failure of earlier work that the
    /// read did not wait for is kept for the next waiting call, so that bytes
    /// sent are never followed by a failure of the same call.
    fn read_sent(
        &self,
        stream: Handle,
        src: DevicePtr,
        len: usize,
        send: &mut dyn SendBytes,
    ) -> LaunchOutcome {
        self.read_sent_buffered(stream, src, len, send)
    }
    /// [`StreamOrdered::read_sent`] through a buffer (what an order that
    /// cannot send from where the bytes lie falls back to).
    fn read_sent_buffered(
        &self,
        stream: Handle,
        src: DevicePtr,
        len: usize,
        send: &mut dyn SendBytes,
    ) -> LaunchOutcome {
        let mut data = vec![0u8; len];
        let outcome = self.read(stream, src, &mut data);
        match outcome.result {
            Ok(()) => LaunchOutcome {
                result: send.send(&data).map_err(socket_bytes::not_sent),
                ..outcome
            },
            Err(_) => outcome,
        }
    }
    /// Waits for `target`: a stream's work so far, an event's latest record,
    /// or all of the context's work.
    fn synchronize(&self, target: SyncTarget) -> LaunchOutcome;
    /// Whether `target` is done (a stream or an event; never waits).
    fn query(&self, target: SyncTarget) -> Result<bool, CuError>;
    /// Milliseconds between two recorded events.
    fn elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, CuError>;
    /// Lets later [`StreamWork::Signal`] work reach the [`signals::SignalArea`] at
    /// `path` (created by the server; opened by whoever runs the streams). Not
    /// every context can.
    fn attach_signals(&self, path: &std::path::Path) -> Result<(), CuError> {
        let _ = path;
        Err(CuError::new(
            cumux_protocol::codes::NOT_SUPPORTED,
            "this context cannot signal completions",
        ))
    }
    /// The priority of the streams the context creates for its own use (a shared
    /// context's per-session default stream), from now on; ignored where none.
    fn set_own_stream_priority(&self, priority: i32) {
        let _ = priority;
    }
    /// Holds posted work back from the doorbell of whoever runs the streams
    /// (`true`): it is handed over as it comes (taken at once by a runner
    /// that polls), but a sleeping runner is woken only by the next call that
    /// waits, so that it wakes once to a batch of work (a function's copy in,
    /// launches and read of its outputs) and answers once. `false` rings for
    /// what is held. Ignored where work is not posted to another process.
    /// The session rings before it waits on its own signals ([`crate::session`]).
    fn hold_posts(&self, _on: bool) {}
    /// Asks whoever serves this context's calls to poll for the next one for
    /// `spin` instead of sleeping (a latency-critical tenant); ignored where none.
    fn keep_hot(&self, spin: std::time::Duration) {
        let _ = spin;
    }
    /// Makes `graph` of `launches` ([`StreamWork::Launch`] each), for
    /// [`StreamWork::Graph`]: a GPU captures them into a CUDA graph once.
    fn graph_create(&self, graph: Handle, launches: Vec<StreamWork>) -> Result<(), CuError>;
    /// Drops a graph (work queued with it still runs).
    fn graph_destroy(&self, graph: Handle);
    /// Whether a kernel watchdog reads this context's signals for progress
    /// ([`crate::worker::watchdog`]): sessions then signal their streams every few launches.
    fn watched(&self) -> bool {
        false
    }
    /// Whether device printf of the session's finished work waits here for
    /// its next wait to take it (a shared context's printing launches are
    /// waited for as they are queued): a synchronize must then ask this
    /// order, not answer from completion signals, or the text would reach
    /// the program only after its wait returned.
    fn printf_waiting(&self) -> bool {
        false
    }
    /// At the session's end: work queued and not started is dropped, running
    /// work finishes (a launch on a context that can stop one stops:
    /// [`DeviceContext::cancel_launches`]), before this returns; waits return
    /// at once from then on.
    fn cancel_queued(&self) {}
    /// Readies an area for [`StreamWork::SignalTo`] work (a GPU registers it).
    fn prepare_signals(&self, area: &Arc<signals::SignalArea>) -> Result<(), CuError> {
        let _ = area;
        Ok(())
    }
}

/// [`DeviceContext::mem_read_spans`] by one read a span.
pub fn read_spans_one_by_one<C: DeviceContext + ?Sized>(
    ctx: &C,
    spans: &[(DevicePtr, u64)],
) -> Result<Vec<Vec<u8>>, CuError> {
    spans
        .iter()
        .map(|&(ptr, bytes)| {
            let len = usize::try_from(bytes).map_err(|_| {
                CuError::new(
                    cumux_protocol::codes::OUT_OF_MEMORY,
                    "a read past the address space",
                )
            })?;
            let mut buf = vec![0; len];
            ctx.mem_read(ptr, &mut buf)?;
            Ok(buf)
        })
        .collect()
}

/// The default instruction budget of a launch on the CPU device, of its
/// blocks together and so of any one block (`cumux serve --launch-budget`):
/// minutes of interpretation.
pub const DEFAULT_LAUNCH_BUDGET: u64 = 20_000_000_000;

// Moving a session's state to another context (issue 17): allocations and
// module globals placed at the addresses the program holds, in the address
// window the session started in.

/// A context whose memory can be laid out again elsewhere at the same
/// addresses: the CPU device (its addresses its own), a GPU (reserving the
/// addresses with the driver's virtual memory calls) and a worker process's
/// context (asking its worker).
pub trait MovableContext: Send + Sync {
    /// The address window the context hands out addresses in: a context
    /// made for the moved session on another device takes the same one.
    fn window(&self) -> u32;
    /// Allocates `bytes` at `ptr` (zero-filled).
    fn alloc_at(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError>;
    /// Allocates each `(ptr, bytes)` at its address (zero-filled), at once
    /// where the backend places memory in larger pieces than allocations.
    fn place_all(&self, allocations: &[(DevicePtr, u64)]) -> Result<(), CuError> {
        allocations
            .iter()
            .try_for_each(|&(ptr, bytes)| self.alloc_at(ptr, bytes))
    }
    /// Keeps `[ptr, ptr + bytes)` of each range unused here (reserved, not
    /// mapped): addresses a program still holds for memory now elsewhere,
    /// which must fault rather than reach memory allocated later. A backend
    /// that places module memory itself never needs it.
    fn hold(&self, ranges: &[(DevicePtr, u64)]) -> Result<(), CuError> {
        let _ = ranges;
        Ok(())
    }
    /// Keeps what it can of each `[lo, hi)` span free of the backend's own
    /// memory (reserved, unmapped) until memory is placed there: a move's
    /// target made ready beforehand, whose modules must not take the
    /// addresses its session allocates next. The bytes kept; a backend
    /// that places module memory itself keeps none and needs none.
    fn keep_free(&self, spans: &[(u64, u64)]) -> Result<u64, CuError> {
        let _ = spans;
        Ok(0)
    }
    /// The device memory loading `module` allocated, in the order it did.
    fn module_blocks(&self, module: ModuleId) -> Vec<DevicePtr>;
    /// [`MovableContext::module_blocks`] of each of `modules`, in order; a
    /// worker's context asks once.
    fn modules_blocks(&self, modules: &[ModuleId]) -> Vec<Vec<DevicePtr>> {
        modules.iter().map(|&m| self.module_blocks(m)).collect()
    }
    /// Loads `image` so that its loading allocates exactly `blocks`, in
    /// order (its globals where the source context had them); a load that
    /// allocates otherwise fails and leaves nothing behind. A backend that
    /// places module memory itself (a GPU's driver) loads it as it does any
    /// module: the session aliases globals that land elsewhere.
    fn module_load_at(&self, image: &[u8], blocks: &[DevicePtr]) -> Result<LoadedModule, CuError>;
    /// Why the context's state cannot be taken as it is, if it cannot
    /// (state of the backend's own that an image does not carry).
    fn unmovable(&self) -> Option<String> {
        None
    }
    /// The limits (`CUlimit`, value) the context keeps, to set again on the
    /// target ([`DeviceContext::set_limit`]).
    fn limits(&self) -> Vec<(u32, u64)> {
        Vec::new()
    }
    /// The placed memory that holds allocation `ptr` ([`MovableContext::place_all`]):
    /// its start, its size, and a descriptor another process maps it by, so
    /// that a move copies into it device to device ([`placed_copy`]).
    fn export_placed(&self, ptr: DevicePtr) -> Result<(u64, u64, OwnedFd), CuError> {
        let _ = ptr;
        Err(no_sharing())
    }
}

/// A device that can make a context in a given address window.
pub trait MovableDevice {
    /// A new context whose addresses lie in `window` (another device's, the
    /// one a moved session's program holds pointers in).
    fn create_context_in_window(&self, window: u32) -> Result<Arc<dyn DeviceContext>, CuError>;
}
