//! [`CudaContext`]: one session's CUDA context, and its synchronous calls
//! ([`DeviceContext`]): memory, modules and launches, each on the calling
//! thread's stream, waited for; device printf caught in capture windows.
//! Its stream order of its own is in [`super::ordered`].

use super::green_streams::{green_part, GreenParts};
use crate::sm_parts::SmPart;
use std::collections::HashMap;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cumux_cuda_driver::capture::{image_may_print, image_mentions, StdoutCapture};
use cumux_cuda_driver::sys::CU_STREAM_NON_BLOCKING;
use cumux_cuda_driver::{
    self as cu, CudaError, Event, Function, GraphExec, HostRegistration, LaunchConfig, Module,
    Stream,
};
use cumux_protocol::arrays::{CopyEnd, CopyExtent};
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::pinned::{FixedMapping, HostMapping};
use cumux_protocol::{
    codes, ClusterQuery, CuError, DevicePtr, Handle, TensorMapLayout, TensorMapRequest,
};

use cumux_cuda_driver::sys::{CU_MEMHOSTREGISTER_DEVICEMAP, CU_MEMHOSTREGISTER_PORTABLE};

use super::arrays;
use super::convert::{cu_err, fill_of, function_attrs, launch_attr, memset, param_infos};
use super::exported;
use super::placed::Placed;
use super::write_staging::WriteStaging;
use crate::device::arrays::ArrayOp;
use crate::device::imported::{ImportedChunk, MappedChunks};
use crate::device::limits::{self, LimitSetting, RefusedShrinks, KNOWN_LIMITS};
use crate::device::memory_use::ContextMemory;
use crate::device::placed_copy;
use crate::device::{
    AreaPin, DeviceContext, FillBytes, GlobalDesc, HostRegion, KernelDesc, KernelLaunch,
    LaunchGeometry, LaunchOutcome, LoadedModule, ModuleId, MovableContext, StreamOrdered, VmmOp,
};
use crate::locking::lock;

/// Static shared memory a block may use without opting in.
const DEFAULT_SHARED_LIMIT: u64 = 48 << 10;
/// Blocks a cluster may hold without opting in (CUDA's portable size).
const PORTABLE_CLUSTER_BLOCKS: u32 = 8;
/// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`.
const FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: i32 = 14;

/// A kernel as the backend keeps it.
pub(super) struct Kernel {
    function: Function,
    params_bytes: usize,
    static_shared: u64,
}

/// A stream lent to one synchronous call ([`CudaContext::stream`]).
struct LentStream<'a> {
    stream: Option<Arc<Stream>>,
    home: &'a Mutex<Vec<Arc<Stream>>>,
}

impl std::ops::Deref for LentStream<'_> {
    type Target = Stream;

    fn deref(&self) -> &Stream {
        self.stream.as_deref().expect("lent until dropped")
    }
}

impl Drop for LentStream<'_> {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            lock(self.home).push(stream);
        }
    }
}

/// A loaded module, and what it charged to the device's memory in use.
struct CudaModule {
    /// Kept for its lifetime: the module unloads when this and every
    /// [`Kernel`] of it are gone.
    _module: Module,
    kernels: Vec<Arc<Kernel>>,
    globals_bytes: u64,
}

/// One session's CUDA context.
pub struct CudaContext {
    /// `None` only while dropping.
    ctx: Option<Arc<cu::Context>>,
    sm: u32,
    /// This context's allocations, in the device's bytes in use.
    memory: ContextMemory,
    next_module: Arc<AtomicU64>,
    modules: Mutex<HashMap<ModuleId, CudaModule>>,
    /// Streams for synchronous calls, each lent to one call at a time: as
    /// many as calls ran at once, however many threads came and went (a
    /// shared context's sessions each call in on a thread of their own).
    idle_streams: Mutex<Vec<Arc<Stream>>>,
    capture: Option<&'static StdoutCapture>,
    /// A module that can print was loaded: flushing calls need capture windows.
    prints: Arc<AtomicBool>,
    /// Captured printf text not yet handed out with a launch.
    pending_stdout: Mutex<Vec<u8>>,
    /// The session's own streams and events ([`StreamOrdered`]).
    pub(super) ordered: Mutex<OrderedState>,
    /// Pinned buffers its host-to-device writes pass through, made at the
    /// first ([`WriteStaging`]).
    write_staging: Mutex<Option<WriteStaging>>,
    /// Memory placed at a moved session's addresses ([`MovableContext`]).
    placed: Mutex<Placed>,
    /// A module that may call the device-side `malloc` was loaded: its heap's
    /// blocks would not move with the session.
    mallocs: AtomicBool,
    /// Green contexts for capped sessions' streams (a shared context).
    greens: GreenParts,
    /// Each limit's value when this context was made, before any session
    /// set one (the driver's defaults, in a worker's first context).
    start_limits: Vec<(u32, u64)>,
    refused_shrinks: RefusedShrinks,
}

/// The streams and events of a [`CudaContext`] used as [`StreamOrdered`].
#[derive(Default)]
pub(super) struct OrderedState {
    pub(super) streams: HashMap<Handle, Arc<Stream>>,
    pub(super) events: HashMap<Handle, Arc<Event>>,
    /// The first failure of queued work, for the next waiting call.
    pub(super) pending: Option<CuError>,
    /// Pinned host regions (see [`Pin`]).
    pins: HashMap<Handle, Pin>,
    /// Graphs of launches, captured once ([`StreamOrdered::graph_create`]).
    pub(super) graphs: HashMap<Handle, Arc<GraphExec>>,
    /// Where clients' marks are stored from (`StreamWork::Mark`), made at the first.
    pub(super) mark_stream: Option<Arc<Stream>>,
}

impl OrderedState {
    /// Where the device reaches pinned `region`, if it was device-mapped.
    pub(super) fn device_base(&self, region: Handle) -> Option<u64> {
        self.pins.get(&region).and_then(|p| p.device_base)
    }
}

impl CudaContext {
    /// Queues a write of the `len` bytes `fill` yields to `dst` on `stream`
    /// through the pinned staging buffers, made at the first: `Ok(false)`,
    /// nothing done, where they are not free ([`WriteStaging::write`]).
    pub(super) fn staged_write(
        &self,
        stream: &Stream,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> Result<bool, CuError> {
        let mut staging = lock(&self.write_staging);
        if staging.is_none() {
            *staging = Some(WriteStaging::new(self.ctx()?)?);
        }
        staging
            .as_mut()
            .expect("made above")
            .write(stream, dst, len, fill)
    }

    /// A session's context over `ctx`, counting its memory in `used`; its
    /// printf is captured by `capture` once `prints` says a module can print.
    pub(super) fn new(
        ctx: Arc<cu::Context>,
        sm: u32,
        used: Arc<AtomicU64>,
        next_module: Arc<AtomicU64>,
        capture: Option<&'static StdoutCapture>,
        prints: Arc<AtomicBool>,
    ) -> Self {
        let start_limits = KNOWN_LIMITS
            .filter_map(|limit| Some((limit, ctx.limit(limit).ok()?)))
            .collect();
        CudaContext {
            ctx: Some(ctx),
            sm,
            memory: ContextMemory::new(used),
            next_module,
            modules: Mutex::new(HashMap::new()),
            idle_streams: Mutex::new(Vec::new()),
            capture,
            prints,
            pending_stdout: Mutex::new(Vec::new()),
            ordered: Mutex::new(OrderedState::default()),
            write_staging: Mutex::new(None),
            placed: Mutex::new(Placed::default()),
            mallocs: AtomicBool::new(false),
            greens: GreenParts::default(),
            start_limits,
            refused_shrinks: RefusedShrinks::default(),
        }
    }

    pub(super) fn ctx(&self) -> Result<&Arc<cu::Context>, CuError> {
        self.ctx
            .as_ref()
            .ok_or_else(|| CuError::new(codes::INVALID_CONTEXT, "the context is being destroyed"))
    }

    /// The capture to use for flushing calls, if this context can print.
    pub(super) fn capture(&self) -> Option<&'static StdoutCapture> {
        self.capture.filter(|_| self.prints.load(Ordering::Acquire))
    }

    /// A stream for one synchronous call, with the context current; it goes
    /// back to the idle ones when the call is done with it.
    fn stream(&self) -> Result<LentStream<'_>, CuError> {
        let ctx = self.ctx()?;
        ctx.make_current().map_err(cu_err)?;
        let idle = lock(&self.idle_streams).pop();
        let stream = match idle {
            Some(stream) => stream,
            None => Arc::new(Stream::new(ctx, CU_STREAM_NON_BLOCKING, 0).map_err(cu_err)?),
        };
        Ok(LentStream {
            stream: Some(stream),
            home: &self.idle_streams,
        })
    }

    /// Keeps captured printf text for the next launch's outcome.
    pub(super) fn keep_stdout(&self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            lock(&self.pending_stdout).extend_from_slice(&bytes);
        }
    }

    /// Finishes `stream`'s work and keeps what it printed.
    pub(super) fn finish(&self, stream: &Stream) -> Result<(), CuError> {
        let (result, out) = stream.finish(self.capture());
        self.keep_stdout(out);
        result.map_err(cu_err)
    }

    /// Runs a call that may flush printf in a capture window when needed.
    pub(super) fn flushing<T>(&self, f: impl FnOnce() -> T) -> T {
        match self.capture() {
            Some(capture) => {
                let (result, out) = capture.window(f);
                self.keep_stdout(out);
                result
            }
            None => f(),
        }
    }

    fn kernel(&self, module: ModuleId, index: usize) -> Result<Arc<Kernel>, CuError> {
        let modules = lock(&self.modules);
        let m = modules
            .get(&module)
            .ok_or_else(|| CuError::new(codes::INVALID_HANDLE, "module not loaded"))?;
        m.kernels
            .get(index)
            .cloned()
            .ok_or_else(|| CuError::new(codes::INVALID_HANDLE, "no such kernel"))
    }

    fn launch_inner(&self, launch: &KernelLaunch) -> Result<(), CuError> {
        let stream = self.stream()?;
        self.launch_on(&stream, launch)?;
        self.finish(&stream)
    }

    /// Queues a launch on `stream` without waiting for it.
    pub(super) fn launch_on(&self, stream: &Stream, launch: &KernelLaunch) -> Result<(), CuError> {
        let kernel = self.kernel(launch.module, launch.kernel)?;
        let config = Self::opted_in(&kernel, &launch.geometry)?;
        hop_trace::mark(Hop::Step, "configured");
        // A launch flushes printf of earlier kernels of this context.
        self.flushing(|| {
            kernel
                .function
                .launch(stream, &config, &launch.params, kernel.params_bytes)
        })
        .map_err(cu_err)
    }

    /// `kernel` opted in to what a launch shaped as `geometry` needs beyond
    /// the defaults (shared memory, a non-portable cluster size), as a
    /// native program would have before it; the launch's configuration.
    fn opted_in(kernel: &Kernel, geometry: &LaunchGeometry) -> Result<LaunchConfig, CuError> {
        let dynamic = u64::from(geometry.dynamic_shared_bytes);
        if dynamic + kernel.static_shared > DEFAULT_SHARED_LIMIT {
            // The session has checked the size against the GPU's opt-in limit;
            // opt the kernel in as a native program would have.
            let value = i32::try_from(dynamic).unwrap_or(i32::MAX);
            kernel
                .function
                .set_attribute(
                    cu::sys::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    value,
                )
                .map_err(cu_err)?;
        }
        if geometry
            .cluster()
            .is_some_and(|c| c.iter().product::<u32>() > PORTABLE_CLUSTER_BLOCKS)
        {
            // As for shared memory: the session has checked the size against
            // the GPU; opt the kernel in to a non-portable cluster size.
            kernel
                .function
                .set_attribute(FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
                .map_err(cu_err)?;
        }
        Ok(LaunchConfig {
            grid: geometry.grid,
            block: geometry.block,
            dynamic_shared_bytes: geometry.dynamic_shared_bytes,
            attributes: geometry.attributes.iter().map(launch_attr).collect(),
        })
    }

    /// How the backend keeps `function`, and how the client sees it.
    fn describe(function: &Function) -> Result<(Kernel, KernelDesc), CudaError> {
        let layout = function.param_layout()?;
        let attrs = function.attributes()?;
        let kernel = Kernel {
            function: function.clone(),
            params_bytes: cu::image::params_bytes(&layout),
            static_shared: u64::try_from(attrs.shared_size_bytes).unwrap_or(0),
        };
        let desc = KernelDesc {
            name: function.name()?,
            params: param_infos(&layout),
            attrs: function_attrs(&attrs),
        };
        Ok((kernel, desc))
    }

    /// `result` with the captured printf text.
    pub(super) fn outcome(&self, result: Result<(), CuError>) -> LaunchOutcome {
        LaunchOutcome {
            stdout: std::mem::take(&mut *lock(&self.pending_stdout)),
            result,
        }
    }
}

impl DeviceContext for CudaContext {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, CuError> {
        let ptr = self.ctx()?.mem_alloc(bytes).map_err(cu_err)?;
        self.memory.charge(bytes);
        Ok(ptr)
    }

    fn mem_free(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        let ctx = self.ctx()?;
        let mut placed = lock(&self.placed);
        if placed.holds(ptr) {
            // Work that may use it ends first, as `cuMemFree` waits for it.
            ctx.synchronize().map_err(cu_err)?;
            placed.free(ctx, ptr);
            self.memory.release(bytes);
            return Ok(());
        }
        drop(placed);
        ctx.mem_free(ptr).map_err(cu_err)?;
        exported::forget_memory(ptr);
        self.memory.release(bytes);
        Ok(())
    }

    fn mem_read(&self, src: DevicePtr, buf: &mut [u8]) -> Result<(), CuError> {
        let stream = self.stream()?;
        let (result, out) = stream.copy_dtoh_sync(buf, src, self.capture());
        self.keep_stdout(out);
        result.map_err(cu_err)
    }

    fn mem_write(&self, dst: DevicePtr, data: &[u8]) -> Result<(), CuError> {
        let stream = self.stream()?;
        let (result, out) = stream.copy_htod_sync(dst, data, self.capture());
        self.keep_stdout(out);
        result.map_err(cu_err)
    }

    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), CuError> {
        let stream = self.stream()?;
        stream.copy_dtod(dst, src, bytes).map_err(cu_err)?;
        self.finish(&stream)
    }

    fn mem_fill(&self, dst: DevicePtr, pattern: &[u8], count: u64) -> Result<(), CuError> {
        let fill = fill_of(pattern)?;
        let stream = self.stream()?;
        memset(&stream, dst, fill, count)?;
        self.finish(&stream)
    }

    fn module_load(&self, image: &[u8]) -> Result<LoadedModule, CuError> {
        let ctx = self.ctx()?;
        if self.capture.is_some() && image_may_print(image) {
            self.prints.store(true, Ordering::Release);
        }
        if image_mentions(image, b"malloc") {
            self.mallocs.store(true, Ordering::Release);
        }
        let module = self
            .flushing(|| Module::load(ctx, image, self.sm))
            .map_err(cu_err)?;
        tracing::debug!(
            kind = ?module.kind(),
            code = %module.code(),
            "cuda: module loaded"
        );
        let functions = module.functions().map_err(cu_err)?;
        let mut kernels = Vec::with_capacity(functions.len());
        let mut descs = Vec::with_capacity(functions.len());
        for function in &functions {
            match Self::describe(function) {
                Ok((kernel, desc)) => {
                    descs.push(desc);
                    kernels.push(Arc::new(kernel));
                }
                // A function the driver lists but cannot describe is left
                // out; a dead context fails the load.
                Err(e) if e.code == codes::INVALID_CONTEXT || e.code >= 700 && e.code < 800 => {
                    return Err(cu_err(e))
                }
                Err(e) => tracing::warn!("cuda: a function of the module is left out: {e}"),
            }
        }
        let globals: Vec<GlobalDesc> = module
            .globals()
            .into_iter()
            .map(|(name, ptr, size)| GlobalDesc { name, ptr, size })
            .collect();
        let globals_bytes = globals.iter().map(|g| g.size).sum();
        self.memory.charge(globals_bytes);
        let id = self.next_module.fetch_add(1, Ordering::Relaxed);
        lock(&self.modules).insert(
            id,
            CudaModule {
                _module: module,
                kernels,
                globals_bytes,
            },
        );
        Ok(LoadedModule {
            id,
            kernels: descs,
            globals,
        })
    }

    fn module_unload(&self, module: ModuleId) {
        let removed = lock(&self.modules).remove(&module);
        if let Some(m) = removed {
            self.memory.release(m.globals_bytes);
            // cuModuleUnload flushes printf.
            self.flushing(|| drop(m));
        }
    }

    fn launch(&self, launch: &KernelLaunch) -> LaunchOutcome {
        let result = self.launch_inner(launch);
        self.outcome(result)
    }

    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        Some(self)
    }

    fn movable(&self) -> Option<&dyn MovableContext> {
        Some(self)
    }

    /// A green context of this context's device; the unused context it
    /// replaces is destroyed when its connection lets go of it.
    fn capped(&self, part: SmPart) -> Result<(Arc<dyn DeviceContext>, u32), CuError> {
        if self.memory.held() > 0 || !lock(&self.modules).is_empty() {
            return Err(CuError::new(
                codes::INVALID_CONTEXT,
                "an SM cap comes before a context's first allocation or module",
            ));
        }
        let (green, sms) = green_part(
            self.ctx()?,
            part,
            "a capped session's context runs on part of the GPU",
        )?;
        let capped = CudaContext::new(
            green,
            self.sm,
            Arc::clone(self.memory.device_used()),
            Arc::clone(&self.next_module),
            self.capture,
            Arc::clone(&self.prints),
        );
        Ok((Arc::new(capped), sms))
    }

    fn cap_streams(&self, part: SmPart) -> Result<u32, CuError> {
        self.greens.send_streams(self.ctx()?, part)
    }

    unsafe fn pin_link_area(&self, ptr: *mut u8, len: usize) -> Option<AreaPin> {
        let ctx = self.ctx().ok()?;
        // SAFETY: the caller keeps the range mapped while the pin lives.
        // Portable: the connection's copies may run on the program's other
        // devices' contexts in this process (`worker::colocation`).
        match unsafe { HostRegistration::new(ctx, ptr, len, CU_MEMHOSTREGISTER_PORTABLE) } {
            Ok(pin) => Some(Box::new(pin)),
            Err(e) => {
                tracing::debug!("cuda: the link's area stays pageable: {e}");
                None
            }
        }
    }

    fn host_register(&self, region: HostRegion<'_>) -> Result<bool, CuError> {
        let HostRegion {
            id: region,
            mapping,
            fd,
            client_base,
        } = region;
        let ctx = self.ctx()?;
        // SAFETY: the mapping is kept next to the registration, which is
        // dropped (after the context's work) before the mapping is.
        // Portable: a program's contexts on its other devices share this
        // process (`worker::colocation`), and its copies may name the region.
        // Device-mapped too, for the client's marks (`StreamWork::Mark`),
        // where the driver allows it.
        let register =
            |flags| unsafe { HostRegistration::new(ctx, mapping.as_ptr(), mapping.len(), flags) };
        let pinned = register(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)
            .map(|r| {
                let base = r.device_ptr().ok();
                (r, base)
            })
            .or_else(|_| register(CU_MEMHOSTREGISTER_PORTABLE).map(|r| (r, None)));
        let (pinned, device_base) = match pinned {
            Ok((r, base)) => (Some(r), base),
            Err(e) => {
                tracing::debug!(region, "cuda: host region left pageable: {e}");
                (None, None)
            }
        };
        let at_client = pinned
            .as_ref()
            .and_then(|_| reach_at(ctx, fd, mapping.len(), client_base, region));
        let reached = at_client.is_some();
        let pin = Pin {
            device_base,
            _registration: pinned,
            _mapping: Arc::clone(mapping),
            _at_client: at_client,
        };
        lock(&self.ordered).pins.insert(region, pin);
        Ok(reached)
    }

    fn host_unregister(&self, region: Handle) {
        // Copies that may still use it finish first.
        if let Ok(ctx) = self.ctx() {
            if let Err(e) = self.flushing(|| ctx.synchronize()) {
                lock(&self.ordered).pending.get_or_insert(cu_err(e));
            }
        }
        let pin = lock(&self.ordered).pins.remove(&region);
        drop(pin);
    }

    /// The driver's refusal to grow a limit (a size it cannot give) is the
    /// program's; one to lower it (a heap a kernel used) keeps the larger.
    fn apply_limit(&self, limit: u32, setting: LimitSetting) -> Result<(), CuError> {
        let ctx = self.ctx()?;
        let current = ctx.limit(limit).map_err(cu_err)?;
        let start = self.start_limits.iter().find(|(l, _)| *l == limit);
        let now = (current, start.map(|s| s.1));
        limits::apply(limit, setting, now, &self.refused_shrinks, |value| {
            self.flushing(|| ctx.set_limit(limit, value))
                .map_err(cu_err)
        })
    }

    /// Limits a kernel grew (the stack, to the largest any kernel needed)
    /// go back too, with the device memory the driver reserved for them.
    fn reset_limits(&self) -> Result<(), CuError> {
        let mut result = Ok(());
        for &(limit, start) in &self.start_limits {
            let reset = self.apply_limit(limit, LimitSetting::Exactly(start));
            result = result.and(reset);
        }
        result
    }

    fn cluster_occupancy(
        &self,
        module: ModuleId,
        kernel: usize,
        geometry: &LaunchGeometry,
        query: ClusterQuery,
    ) -> Result<i32, CuError> {
        let kernel = self.kernel(module, kernel)?;
        let config = Self::opted_in(&kernel, geometry)?;
        let function = &kernel.function;
        match query {
            ClusterQuery::MaxActiveClusters => function.max_active_clusters(&config),
            ClusterQuery::MaxPotentialClusterSize { non_portable } => function
                .set_attribute(
                    FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                    i32::from(non_portable),
                )
                .and_then(|()| function.max_potential_cluster_size(&config)),
        }
        .map_err(cu_err)
    }

    fn tensor_map_encode(&self, request: &TensorMapRequest) -> Result<Vec<u8>, CuError> {
        let shape = cu::TensorShape {
            data_type: request.data_type,
            rank: request.rank,
            address: request.global_address,
            dims: &request.global_dim,
            strides: &request.global_strides,
            element_strides: &request.element_strides,
            interleave: request.interleave,
            swizzle: request.swizzle,
            l2_promotion: request.l2_promotion,
            oob_fill: request.oob_fill,
        };
        let tile = match &request.layout {
            TensorMapLayout::Tiled { box_dim } => cu::TensorTile::Tiled { box_dim },
            TensorMapLayout::Im2col {
                lower_corner,
                upper_corner,
                channels_per_pixel,
                pixels_per_column,
            } => cu::TensorTile::Im2col {
                lower: lower_corner,
                upper: upper_corner,
                channels: *channels_per_pixel,
                pixels: *pixels_per_column,
            },
            TensorMapLayout::Im2colWide {
                lower_corner_width,
                upper_corner_width,
                channels_per_pixel,
                pixels_per_column,
                mode,
            } => cu::TensorTile::Im2colWide {
                lower_width: *lower_corner_width,
                upper_width: *upper_corner_width,
                channels: *channels_per_pixel,
                pixels: *pixels_per_column,
                mode: *mode,
            },
        };
        let driver = self.ctx()?.driver();
        driver
            .tensor_map_encode(&shape, &tile)
            .map(|bytes| bytes.to_vec())
            .map_err(cu_err)
    }

    /// Both contexts are this process's: the driver's own peer access.
    fn peer_access(&self, peer: &dyn DeviceContext, enable: bool) -> Result<(), CuError> {
        let peer = peer.as_any().downcast_ref::<CudaContext>().ok_or_else(|| {
            CuError::new(
                codes::INVALID_CONTEXT,
                "the peer is not a GPU context of this process",
            )
        })?;
        let (mine, theirs) = (self.ctx()?, peer.ctx()?);
        let done = match enable {
            true => mine.enable_peer_access(theirs),
            false => mine.disable_peer_access(theirs),
        };
        done.map_err(cu_err)
    }

    fn vmm_export(&self, physical: u64) -> Result<std::os::fd::OwnedFd, CuError> {
        self.ctx()?.vmm_export(physical).map_err(cu_err)
    }

    fn vmm_import(&self, fd: std::os::fd::BorrowedFd<'_>) -> Result<u64, CuError> {
        self.ctx()?.vmm_import(fd).map_err(cu_err)
    }

    fn map_imported(&self, chunks: &[ImportedChunk]) -> Result<MappedChunks, CuError> {
        placed_copy::map_chunks(self, chunks)
    }

    fn copy_into_mapped(
        &self,
        mapped: &MappedChunks,
        copies: &[(DevicePtr, u64)],
    ) -> Result<u64, CuError> {
        placed_copy::copy_chunks(self, mapped, copies)
    }

    fn unmap_imported(&self, mapped: &MappedChunks) {
        placed_copy::unmap_chunks(self, mapped)
    }

    /// The driver's own handles: the other process opens the allocation
    /// itself, so data moves device to device, never through the server.
    fn ipc_export(&self, base: DevicePtr) -> Result<Vec<u8>, CuError> {
        let ctx = self.ctx()?;
        let handle = ctx.ipc_get_mem_handle(base).map_err(cu_err)?;
        let (_, size) = ctx.address_range(base).map_err(cu_err)?;
        exported::note_memory(handle, base, size);
        Ok(handle.to_vec())
    }

    fn ipc_open(&self, handle: &[u8], _flags: u32) -> Result<(DevicePtr, u64), CuError> {
        let handle: [u8; 64] = handle
            .try_into()
            .map_err(|_| CuError::new(codes::INVALID_VALUE, "an IPC handle is 64 bytes"))?;
        // Given out by this very process: the allocation itself.
        if let Some(found) = exported::memory(&handle) {
            return Ok(found);
        }
        let ctx = self.ctx()?;
        let base = ctx.ipc_open_mem_handle(handle).map_err(cu_err)?;
        match ctx.address_range(base) {
            Ok((_, size)) => Ok((base, size)),
            Err(e) => {
                let _ = ctx.ipc_close_mem_handle(base);
                Err(cu_err(e))
            }
        }
    }

    fn ipc_close(&self, base: DevicePtr) -> Result<(), CuError> {
        if exported::is_memory(base) {
            return Ok(());
        }
        self.ctx()?.ipc_close_mem_handle(base).map_err(cu_err)
    }

    /// The driver's own virtual memory: the addresses the session hands the
    /// client are the device's, which kernels dereference.
    fn vmm(&self, op: &VmmOp) -> Result<u64, CuError> {
        let ctx = self.ctx()?;
        let done = match *op {
            VmmOp::Granularity { recommended } => ctx.vmm_granularity(recommended),
            VmmOp::Reserve { size, alignment } => ctx.vmm_reserve(size, alignment),
            VmmOp::FreeReservation { ptr, size } => ctx.vmm_address_free(ptr, size).map(|()| 0),
            VmmOp::Create {
                size,
                shareable,
                compressed,
            } => {
                let handle = ctx
                    .vmm_create(size, shareable, compressed)
                    .map_err(cu_err)?;
                self.memory.charge(size);
                Ok(handle)
            }
            VmmOp::Release { physical, size } => {
                ctx.vmm_release(physical).map_err(cu_err)?;
                self.memory.release(size);
                Ok(0)
            }
            VmmOp::Map {
                ptr,
                size,
                physical,
            } => ctx.vmm_map(ptr, size, physical).map(|()| 0),
            VmmOp::Unmap { ptr, size } => ctx.vmm_unmap(ptr, size).map(|()| 0),
            VmmOp::Compressed { physical } => ctx.vmm_compressed(physical).map(u64::from),
            VmmOp::SetAccess { ptr, size, flags } => {
                let flags = u32::try_from(flags).map_err(|_| {
                    CuError::new(codes::INVALID_VALUE, format!("access flags {flags:#x}"))
                })?;
                ctx.vmm_set_access(ptr, size, flags).map(|()| 0)
            }
        };
        done.map_err(cu_err)
    }

    fn array(&self, op: &ArrayOp) -> Result<u64, CuError> {
        let id = arrays::run(self.ctx()?, op)?;
        match *op {
            ArrayOp::Create { bytes, .. } | ArrayOp::CreateMipmapped { bytes, .. } => {
                self.memory.charge(bytes)
            }
            ArrayOp::Destroy { bytes, .. } | ArrayOp::DestroyMipmapped { bytes, .. } => {
                self.memory.release(bytes)
            }
            _ => {}
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
        // On the calling thread's stream, waited for: a kernel queued after
        // it on another stream finds the copy done.
        let stream = self.stream()?;
        self.flushing(|| arrays::copy(&stream, src, dst, extent, from_host, to_host))
    }
}

/// A GPU context takes a moved session's memory at its addresses
/// ([`Placed`]); its modules load where the driver puts them, so a session
/// whose module globals land elsewhere is refused by the session's check.
impl MovableContext for CudaContext {
    fn window(&self) -> u32 {
        0
    }

    fn alloc_at(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        self.place_all(&[(ptr, bytes)])
    }

    fn place_all(&self, allocations: &[(DevicePtr, u64)]) -> Result<(), CuError> {
        let ctx = self.ctx()?;
        lock(&self.placed).place(ctx, allocations)?;
        self.memory.charge(
            allocations
                .iter()
                .fold(0u64, |sum, a| sum.saturating_add(a.1)),
        );
        Ok(())
    }

    fn hold(&self, ranges: &[(DevicePtr, u64)]) -> Result<(), CuError> {
        lock(&self.placed).hold(self.ctx()?, ranges)
    }

    fn keep_free(&self, spans: &[(u64, u64)]) -> Result<u64, CuError> {
        Ok(lock(&self.placed).keep_free(self.ctx()?, spans))
    }

    fn module_blocks(&self, _module: ModuleId) -> Vec<DevicePtr> {
        Vec::new()
    }

    /// The driver places a module's memory itself: a module from the CPU
    /// device (its `blocks`) has its globals where the driver puts them,
    /// and the session aliases them from where they were.
    fn module_load_at(&self, image: &[u8], _blocks: &[DevicePtr]) -> Result<LoadedModule, CuError> {
        self.module_load(image)
    }

    fn export_placed(&self, ptr: DevicePtr) -> Result<(u64, u64, std::os::fd::OwnedFd), CuError> {
        lock(&self.placed).export(self.ctx()?, ptr)
    }

    fn unmovable(&self) -> Option<String> {
        self.mallocs.load(Ordering::Acquire).then(|| {
            "a module of it may call the device-side malloc, whose heap does not move".into()
        })
    }
}

impl Drop for CudaContext {
    fn drop(&mut self) {
        let modules: Vec<CudaModule> = lock(&self.modules).drain().map(|(_, m)| m).collect();
        let mut streams: Vec<Arc<Stream>> = lock(&self.idle_streams).drain(..).collect();
        let ordered = std::mem::take(&mut *lock(&self.ordered));
        streams.extend(ordered.streams.into_values());
        let events = ordered.events;
        let pins = ordered.pins;
        let staging = lock(&self.write_staging).take();
        let ctx = self.ctx.take();
        let mut placed = std::mem::take(&mut *lock(&self.placed));
        // Destroying a context flushes its printf buffer; the session is gone,
        // so whatever is captured is dropped rather than reaching our stdout.
        let teardown = move || {
            drop(events);
            drop(streams);
            // Copies into pinned regions and out of the staging buffers end
            // before those are unregistered and freed.
            if let (false, Some(ctx)) = (pins.is_empty() && staging.is_none(), &ctx) {
                let _ = ctx.synchronize();
            }
            drop(pins);
            drop(staging);
            drop(modules);
            if let Some(ctx) = &ctx {
                placed.release_all(ctx);
            }
            // In a shared (primary) context the session freed its
            // allocations before its end (`Session`'s teardown); its
            // bytes leave the device's count with `memory`.
            drop(ctx);
        };
        match self.capture() {
            Some(capture) => drop(capture.window(teardown)),
            None => teardown(),
        }
    }
}

/// A pinned host region: the worker's mapping, page-locked (and mapped for
/// the device) where the driver allowed it (else copies from it are staged,
/// still correct, and marks into it left out), and where it
/// could be, its second mapping at the client's address. The registration
/// goes before the mapping (fields drop in order).
struct Pin {
    /// Where the device reaches the worker's mapping, if it was device-mapped.
    device_base: Option<u64>,
    _registration: Option<HostRegistration>,
    _mapping: Arc<HostMapping>,
    _at_client: Option<AtClient>,
}

/// A pinned region mapped and registered a second time at the client's
/// address, so the GPU reaches it by the client's own pointers (unified
/// addressing). The registration goes before the mapping (fields drop in order).
pub(super) struct AtClient {
    _registration: HostRegistration,
    _mapping: FixedMapping,
}

/// Maps `fd` (`len` bytes) at `client_base` and registers it there, where that
/// address is free in this process and the GPU names the memory by it; `None`
/// otherwise (the region then serves copies only).
fn reach_at(
    ctx: &Arc<cu::Context>,
    fd: BorrowedFd<'_>,
    len: usize,
    client_base: u64,
    region: Handle,
) -> Option<AtClient> {
    let unreached = |why: String| {
        tracing::debug!(
            region,
            "cuda: host region not at the client's address: {why}"
        );
    };
    let mapping = FixedMapping::map(fd, len as u64, client_base)
        .inspect_err(|e| unreached(e.to_string()))
        .ok()?;
    // SAFETY: the mapping lives beside the registration in `AtClient` and is
    // dropped after it; the context's work is waited for before either goes.
    let registration = unsafe {
        HostRegistration::new(
            ctx,
            mapping.as_ptr(),
            mapping.len(),
            CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE,
        )
    }
    .inspect_err(|e| unreached(e.to_string()))
    .ok()?;
    match registration.device_ptr() {
        Ok(p) if p == client_base => Some(AtClient {
            _registration: registration,
            _mapping: mapping,
        }),
        Ok(p) => {
            unreached(format!("the device names it {p:#x}"));
            None
        }
        Err(e) => {
            unreached(e.to_string());
            None
        }
    }
}
