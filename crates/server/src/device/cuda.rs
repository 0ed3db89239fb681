//! The `cuda` backend: real GPUs through the system's `libcuda.so.1`
//! (`cumux-cuda-driver`). Each session gets a CUDA context of its own (its own
//! address space and sticky error) and each calling thread a stream in it.
//!
//! Every [`DeviceContext`] method makes the context current, queues its work on
//! the calling thread's stream and waits for that stream before returning.
//! Device `printf` reaches the session, not the server's stdout: contexts whose
//! modules can print run their flushing calls inside a stdout capture window
//! (`cumux_cuda_driver::capture`), and the captured text rides on the next
//! [`LaunchOutcome`]. `CUMUX_CUDA_CONTEXT=primary` shares each GPU's primary
//! context between sessions instead (faster to start, no isolation).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use cumux_cuda_driver::capture::{image_may_print, StdoutCapture};
use cumux_cuda_driver::sys::{CU_MEMHOSTREGISTER_DEVICEMAP, CU_STREAM_NON_BLOCKING};
use cumux_cuda_driver::{
    self as cu, CudaError, DeviceId, Driver, Event, Function, FunctionAttributes, GraphExec,
    HostRegistration, LaunchAttr, LaunchConfig, Module, Stream,
};
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::pinned::HostMapping;
use cumux_protocol::{
    codes, CuError, DeviceInfo, DevicePtr, FunctionAttrs, Handle, LaunchAttribute, ParamInfo,
    TensorMapLayout, TensorMapRequest, DEFAULT_STREAM,
};

use super::{
    Device, DeviceContext, GlobalDesc, KernelDesc, LaunchGeometry, LaunchOutcome, LoadedModule,
    ModuleId, StreamOrdered, StreamWork, SyncTarget,
};
use crate::device::signals::SignalArea;

/// Selects how sessions map to CUDA contexts (`session` or `primary`).
pub const CONTEXT_MODE_ENV: &str = "CUMUX_CUDA_CONTEXT";
/// `passthrough` leaves device printf on the server's stdout (no capture).
pub const PRINTF_ENV: &str = "CUMUX_CUDA_PRINTF";

/// Static shared memory a block may use without opting in.
const DEFAULT_SHARED_LIMIT: u64 = 48 << 10;
/// Blocks a cluster may hold without opting in (CUDA's portable size).
const PORTABLE_CLUSTER_BLOCKS: u32 = 8;
/// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`.
const FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: i32 = 14;

/// A launch attribute as the driver takes it (`CUlaunchAttributeID`, value).
pub fn launch_attr(a: &LaunchAttribute) -> LaunchAttr {
    let (id, value) = match *a {
        LaunchAttribute::Cooperative(v) => (2, [v, 0, 0]),
        LaunchAttribute::ClusterDim(dims) => (4, dims),
        LaunchAttribute::ClusterSchedulingPolicy(v) => (5, [v, 0, 0]),
        LaunchAttribute::ProgrammaticSerialization(v) => (6, [v, 0, 0]),
        LaunchAttribute::Priority(v) => (8, [v as u32, 0, 0]),
        LaunchAttribute::MemSyncDomain(v) => (10, [v, 0, 0]),
    };
    LaunchAttr { id, value }
}

/// How sessions map to CUDA contexts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextMode {
    /// A context per session: isolated memory and faults (the default).
    PerSession,
    /// The GPU's primary context, shared: one fault poisons every session.
    Primary,
}

impl ContextMode {
    /// The mode `value` names (`session`, `primary`); anything else is the default.
    pub fn parse(value: Option<&str>) -> ContextMode {
        match value.map(str::trim) {
            Some("primary") => ContextMode::Primary,
            _ => ContextMode::PerSession,
        }
    }
}

fn cu_err(e: CudaError) -> CuError {
    CuError::new(e.code, e.to_string())
}

/// Every GPU of the system's CUDA driver, as cumux devices.
pub fn load_devices() -> Result<Vec<Arc<dyn Device>>, String> {
    let driver = Driver::load().map_err(|e| e.to_string())?;
    let devices = devices(&driver).map_err(|e| e.to_string())?;
    if devices.is_empty() {
        return Err(format!(
            "the CUDA driver {} reports no GPU",
            driver.library()
        ));
    }
    Ok(devices)
}

/// One [`CudaDevice`] per GPU the driver reports.
pub fn devices(driver: &Arc<Driver>) -> Result<Vec<Arc<dyn Device>>, CudaError> {
    let mode = ContextMode::parse(std::env::var(CONTEXT_MODE_ENV).ok().as_deref());
    let capture = std::env::var(PRINTF_ENV).map_or(true, |v| v.trim() != "passthrough");
    let count = driver.device_count()?;
    tracing::info!(
        library = %driver
            .library_file()
            .map_or_else(|| driver.library().to_string(), |p| p.display().to_string()),
        version = driver.version().unwrap_or(0),
        gpus = count,
        contexts = ?mode,
        printf_capture = capture,
        "cuda: driver loaded"
    );
    let mut out: Vec<Arc<dyn Device>> = Vec::new();
    for ordinal in 0..count {
        let device = CudaDevice::new(driver, ordinal, mode, capture)?;
        tracing::info!(
            ordinal,
            name = %device.info.name,
            sm = device.sm,
            memory = device.info.total_mem,
            attributes = device.info.attributes.len(),
            "cuda: GPU"
        );
        out.push(Arc::new(device));
    }
    Ok(out)
}

/// One GPU.
pub struct CudaDevice {
    driver: Arc<Driver>,
    dev: DeviceId,
    /// Compute capability, major × 10 + minor.
    sm: u32,
    info: DeviceInfo,
    mode: ContextMode,
    capture_printf: bool,
    /// Bytes allocated by all of this device's contexts.
    used: Arc<AtomicU64>,
    next_module: Arc<AtomicU64>,
    primary: Mutex<Option<Arc<cu::Context>>>,
    /// Whether a module loaded into the shared primary context can print.
    primary_prints: Arc<AtomicBool>,
}

impl CudaDevice {
    pub fn new(
        driver: &Arc<Driver>,
        ordinal: u32,
        mode: ContextMode,
        capture_printf: bool,
    ) -> Result<CudaDevice, CudaError> {
        let dev = driver.device(ordinal)?;
        let info = DeviceInfo {
            ordinal,
            name: driver.device_name(dev)?,
            uuid: driver.device_uuid(dev)?,
            pci: driver.device_pci(dev)?,
            total_mem: driver.device_total_mem(dev)?,
            attributes: driver.device_attributes(dev)?,
            backend: "cuda".into(),
        };
        Ok(CudaDevice {
            driver: Arc::clone(driver),
            dev,
            sm: driver.device_sm(dev)?,
            info,
            mode,
            capture_printf,
            used: Arc::new(AtomicU64::new(0)),
            next_module: Arc::new(AtomicU64::new(1)),
            primary: Mutex::new(None),
            primary_prints: Arc::new(AtomicBool::new(false)),
        })
    }

    fn context(&self) -> Result<Arc<cu::Context>, CudaError> {
        match self.mode {
            ContextMode::PerSession => self.driver.create_context(self.dev, 0),
            ContextMode::Primary => {
                let mut primary = lock(&self.primary);
                if let Some(ctx) = &*primary {
                    return Ok(Arc::clone(ctx));
                }
                let ctx = self.driver.primary_context(self.dev)?;
                *primary = Some(Arc::clone(&ctx));
                Ok(ctx)
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    fn create_context(&self) -> Result<Arc<dyn DeviceContext>, CuError> {
        let capture = if self.capture_printf {
            match StdoutCapture::install() {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!("device printf will go to the server's stdout: {e}");
                    None
                }
            }
        } else {
            None
        };
        let ctx = self.context().map_err(cu_err)?;
        Ok(Arc::new(CudaContext {
            ctx: Some(ctx),
            sm: self.sm,
            used: Arc::clone(&self.used),
            next_module: Arc::clone(&self.next_module),
            allocations: Mutex::new(HashMap::new()),
            modules: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            capture,
            // A shared context shares one printf buffer: if any of its
            // sessions prints, every session's flushes need windows.
            prints: match self.mode {
                ContextMode::PerSession => Arc::new(AtomicBool::new(false)),
                ContextMode::Primary => Arc::clone(&self.primary_prints),
            },
            pending_stdout: Mutex::new(Vec::new()),
            ordered: Mutex::new(OrderedState::default()),
        }))
    }
}

/// A kernel as the backend keeps it.
struct Kernel {
    function: Function,
    params_bytes: usize,
    static_shared: u64,
}

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
    used: Arc<AtomicU64>,
    next_module: Arc<AtomicU64>,
    /// This context's allocations: base → bytes.
    allocations: Mutex<HashMap<DevicePtr, u64>>,
    modules: Mutex<HashMap<ModuleId, CudaModule>>,
    /// The stream of each thread that has called in.
    streams: Mutex<HashMap<ThreadId, Arc<Stream>>>,
    capture: Option<&'static StdoutCapture>,
    /// A module that can print was loaded: flushing calls need capture windows.
    prints: Arc<AtomicBool>,
    /// Captured printf text not yet handed out with a launch.
    pending_stdout: Mutex<Vec<u8>>,
    /// The session's own streams and events ([`StreamOrdered`]).
    ordered: Mutex<OrderedState>,
}

/// The streams and events of a [`CudaContext`] used as [`StreamOrdered`].
#[derive(Default)]
struct OrderedState {
    streams: HashMap<Handle, Arc<Stream>>,
    events: HashMap<Handle, Arc<Event>>,
    /// The first failure of queued work, for the next waiting call.
    pending: Option<CuError>,
    /// Pinned host regions: the worker's mapping, page-locked where the
    /// driver allowed it (else copies from it are staged, still correct).
    pins: HashMap<Handle, (Option<HostRegistration>, Arc<HostMapping>)>,
    /// Graphs of launches, captured once ([`StreamOrdered::graph_create`]).
    graphs: HashMap<Handle, Arc<GraphExec>>,
}

impl CudaContext {
    fn ctx(&self) -> Result<&Arc<cu::Context>, CuError> {
        self.ctx
            .as_ref()
            .ok_or_else(|| CuError::new(codes::INVALID_CONTEXT, "the context is being destroyed"))
    }

    /// The capture to use for flushing calls, if this context can print.
    fn capture(&self) -> Option<&'static StdoutCapture> {
        self.capture.filter(|_| self.prints.load(Ordering::Acquire))
    }

    /// The calling thread's stream, with the context current.
    fn stream(&self) -> Result<Arc<Stream>, CuError> {
        let ctx = self.ctx()?;
        ctx.make_current().map_err(cu_err)?;
        let id = std::thread::current().id();
        let mut streams = lock(&self.streams);
        if let Some(s) = streams.get(&id) {
            return Ok(Arc::clone(s));
        }
        let stream = Arc::new(Stream::new(ctx, CU_STREAM_NON_BLOCKING, 0).map_err(cu_err)?);
        streams.insert(id, Arc::clone(&stream));
        Ok(stream)
    }

    /// Keeps captured printf text for the next launch's outcome.
    fn keep_stdout(&self, bytes: Vec<u8>) {
        if !bytes.is_empty() {
            lock(&self.pending_stdout).extend_from_slice(&bytes);
        }
    }

    /// Finishes `stream`'s work and keeps what it printed.
    fn finish(&self, stream: &Stream) -> Result<(), CuError> {
        let (result, out) = stream.finish(self.capture());
        self.keep_stdout(out);
        result.map_err(cu_err)
    }

    /// Runs a call that may flush printf in a capture window when needed.
    fn flushing<T>(&self, f: impl FnOnce() -> T) -> T {
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

    fn launch_inner(
        &self,
        module: ModuleId,
        index: usize,
        geometry: &LaunchGeometry,
        params: &[u8],
    ) -> Result<(), CuError> {
        let stream = self.stream()?;
        self.launch_on(&stream, module, index, geometry, params)?;
        self.finish(&stream)
    }

    /// Queues a launch on `stream` without waiting for it.
    fn launch_on(
        &self,
        stream: &Stream,
        module: ModuleId,
        index: usize,
        geometry: &LaunchGeometry,
        params: &[u8],
    ) -> Result<(), CuError> {
        let kernel = self.kernel(module, index)?;
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
        let config = LaunchConfig {
            grid: geometry.grid,
            block: geometry.block,
            dynamic_shared_bytes: geometry.dynamic_shared_bytes,
            attributes: geometry.attributes.iter().map(launch_attr).collect(),
        };
        hop_trace::mark(Hop::Step, "configured");
        // A launch flushes printf of earlier kernels of this context.
        self.flushing(|| {
            kernel
                .function
                .launch(stream, &config, params, kernel.params_bytes)
        })
        .map_err(cu_err)
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
}

/// The protocol's view of a kernel's attributes.
pub fn function_attrs(a: &FunctionAttributes) -> FunctionAttrs {
    FunctionAttrs {
        max_threads_per_block: a.max_threads_per_block,
        shared_size_bytes: a.shared_size_bytes,
        const_size_bytes: a.const_size_bytes,
        local_size_bytes: a.local_size_bytes,
        num_regs: a.num_regs,
        ptx_version: a.ptx_version,
        binary_version: a.binary_version,
        max_dynamic_shared_size_bytes: a.max_dynamic_shared_size_bytes,
    }
}

/// The protocol's view of a parameter layout.
pub fn param_infos(layout: &[(u32, u32)]) -> Vec<ParamInfo> {
    layout
        .iter()
        .map(|&(offset, size)| ParamInfo { offset, size })
        .collect()
}

/// The 1-, 2- or 4-byte value a fill pattern repeats.
pub fn fill_value(pattern: &[u8]) -> Option<Fill> {
    match *pattern {
        [a] => Some(Fill::D8(a)),
        [a, b] => Some(Fill::D16(u16::from_le_bytes([a, b]))),
        [a, b, c, d] => Some(Fill::D32(u32::from_le_bytes([a, b, c, d]))),
        _ => None,
    }
}

/// A memset of one element width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    D8(u8),
    D16(u16),
    D32(u32),
}

impl DeviceContext for CudaContext {
    fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, CuError> {
        let ptr = self.ctx()?.mem_alloc(bytes).map_err(cu_err)?;
        lock(&self.allocations).insert(ptr, bytes);
        self.used.fetch_add(bytes, Ordering::AcqRel);
        Ok(ptr)
    }

    fn mem_free(&self, ptr: DevicePtr) -> Result<(), CuError> {
        self.ctx()?.mem_free(ptr).map_err(cu_err)?;
        if let Some(bytes) = lock(&self.allocations).remove(&ptr) {
            release(&self.used, bytes);
        }
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
        let fill = fill_value(pattern).ok_or_else(|| {
            CuError::new(codes::INVALID_VALUE, "a fill pattern is 1, 2 or 4 bytes")
        })?;
        let stream = self.stream()?;
        match fill {
            Fill::D8(v) => stream.memset_d8(dst, v, count),
            Fill::D16(v) => stream.memset_d16(dst, v, count),
            Fill::D32(v) => stream.memset_d32(dst, v, count),
        }
        .map_err(cu_err)?;
        self.finish(&stream)
    }

    fn module_load(&self, image: &[u8]) -> Result<LoadedModule, CuError> {
        let ctx = self.ctx()?;
        if self.capture.is_some() && image_may_print(image) {
            self.prints.store(true, Ordering::Release);
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
        self.used.fetch_add(globals_bytes, Ordering::AcqRel);
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
            release(&self.used, m.globals_bytes);
            // cuModuleUnload flushes printf.
            self.flushing(|| drop(m));
        }
    }

    fn launch(
        &self,
        module: ModuleId,
        kernel: usize,
        geometry: &LaunchGeometry,
        params: &[u8],
    ) -> LaunchOutcome {
        let result = self.launch_inner(module, kernel, geometry, params);
        self.outcome(result)
    }

    fn stream_ordered(&self) -> Option<&dyn StreamOrdered> {
        Some(self)
    }

    fn host_register(
        &self,
        region: Handle,
        mapping: &Arc<HostMapping>,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<(), CuError> {
        let ctx = self.ctx()?;
        // SAFETY: the mapping is kept next to the registration, which is
        // dropped (after the context's work) before the mapping is.
        let pinned = unsafe { HostRegistration::new(ctx, mapping.as_ptr(), mapping.len(), 0) };
        let pinned = pinned
            .inspect_err(|e| tracing::debug!(region, "cuda: host region left pageable: {e}"))
            .ok();
        lock(&self.ordered)
            .pins
            .insert(region, (pinned, Arc::clone(mapping)));
        Ok(())
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
}

impl CudaContext {
    /// `result` with the captured printf text.
    fn outcome(&self, result: Result<(), CuError>) -> LaunchOutcome {
        LaunchOutcome {
            stdout: std::mem::take(&mut *lock(&self.pending_stdout)),
            result,
        }
    }

    /// A session stream, the legacy default stream for [`DEFAULT_STREAM`].
    fn ordered_stream(&self, stream: Handle) -> Result<Arc<Stream>, CuError> {
        let ctx = self.ctx()?;
        let mut state = lock(&self.ordered);
        if let Some(s) = state.streams.get(&stream) {
            return Ok(Arc::clone(s));
        }
        if stream != DEFAULT_STREAM {
            return Err(CuError::new(
                codes::INVALID_HANDLE,
                format!("unknown stream {stream:#x}"),
            ));
        }
        let legacy = Arc::new(Stream::legacy_default(ctx));
        state.streams.insert(DEFAULT_STREAM, Arc::clone(&legacy));
        Ok(legacy)
    }

    fn ordered_event(&self, event: Handle) -> Result<Arc<Event>, CuError> {
        lock(&self.ordered)
            .events
            .get(&event)
            .cloned()
            .ok_or_else(|| CuError::new(codes::INVALID_HANDLE, format!("unknown event {event:#x}")))
    }

    fn run_work(&self, stream: &Stream, work: StreamWork) -> Result<(), CuError> {
        match work {
            StreamWork::Write { dst, data } => {
                stream.copy_htod_pageable(dst, &data).map_err(cu_err)
            }
            StreamWork::Copy { dst, src, bytes } => {
                stream.copy_dtod(dst, src, bytes).map_err(cu_err)
            }
            StreamWork::Fill {
                dst,
                pattern,
                count,
                pitch,
                height,
            } => {
                let fill = fill_value(&pattern).ok_or_else(|| {
                    CuError::new(codes::INVALID_VALUE, "a fill pattern is 1, 2 or 4 bytes")
                })?;
                (0..height).try_for_each(|row| {
                    let at = dst.wrapping_add(row.wrapping_mul(pitch));
                    match fill {
                        Fill::D8(v) => stream.memset_d8(at, v, count),
                        Fill::D16(v) => stream.memset_d16(at, v, count),
                        Fill::D32(v) => stream.memset_d32(at, v, count),
                    }
                    .map_err(cu_err)
                })
            }
            StreamWork::Launch {
                module,
                kernel,
                geometry,
                params,
            } => self.launch_on(stream, module, kernel, &geometry, &params),
            StreamWork::Record { event } => {
                self.ordered_event(event)?.record(stream).map_err(cu_err)
            }
            StreamWork::Wait { event } => stream
                .wait_event(&*self.ordered_event(event)?)
                .map_err(cu_err),
            StreamWork::SignalTo { area, slot, value } => {
                let addr = area.device_addr(slot).ok_or_else(|| {
                    CuError::new(codes::INVALID_VALUE, format!("signal slot {slot}"))
                })?;
                stream.write_value64(addr, value).map_err(cu_err)
            }
            StreamWork::Signal { .. } => Err(CuError::new(
                codes::INVALID_VALUE,
                "a signal without an area",
            )),
            // SAFETY (both): the region stays mapped until it is unregistered,
            // which waits for the context's work first; stream order keeps
            // the program's copies into one span apart.
            StreamWork::HostToDevice { dst, host } => {
                unsafe { stream.copy_htod_async(dst, host.read()?) }.map_err(cu_err)
            }
            StreamWork::DeviceToHost { src, host } => {
                unsafe { stream.copy_dtoh_async(host.write()?, src) }.map_err(cu_err)
            }
            StreamWork::Graph { graph } => {
                let exec = lock(&self.ordered).graphs.get(&graph).cloned();
                let exec = exec.ok_or_else(|| {
                    CuError::new(codes::INVALID_HANDLE, format!("unknown graph {graph:#x}"))
                })?;
                stream.launch_graph(&exec).map_err(cu_err)
            }
        }
    }

    /// `result`, unless queued work failed first.
    fn with_pending(&self, result: Result<(), CuError>) -> Result<(), CuError> {
        match lock(&self.ordered).pending.take() {
            Some(e) => Err(e),
            None => result,
        }
    }
}

impl StreamOrdered for CudaContext {
    /// Captures the launches on a stream of its own into one CUDA graph.
    fn graph_create(&self, graph: Handle, launches: Vec<StreamWork>) -> Result<(), CuError> {
        if !launches
            .iter()
            .all(|l| matches!(l, StreamWork::Launch { .. }))
        {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                "a graph of launches only",
            ));
        }
        let stream = Stream::new(self.ctx()?, CU_STREAM_NON_BLOCKING, 0).map_err(cu_err)?;
        let exec = stream.capture(
            |s| launches.into_iter().try_for_each(|l| self.run_work(s, l)),
            cu_err,
        )?;
        lock(&self.ordered).graphs.insert(graph, Arc::new(exec));
        Ok(())
    }

    fn graph_destroy(&self, graph: Handle) {
        lock(&self.ordered).graphs.remove(&graph);
    }

    fn stream_create(&self, stream: Handle, flags: u32, priority: i32) -> Result<(), CuError> {
        let ctx = self.ctx()?;
        if stream == DEFAULT_STREAM || lock(&self.ordered).streams.contains_key(&stream) {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("stream {stream:#x} exists"),
            ));
        }
        // The driver clamps a priority outside the device's range.
        let created = Arc::new(Stream::new(ctx, flags, priority).map_err(cu_err)?);
        lock(&self.ordered).streams.insert(stream, created);
        Ok(())
    }

    fn stream_destroy(&self, stream: Handle) -> Result<(), CuError> {
        // cuStreamDestroy lets queued work finish first, as the session expects.
        match lock(&self.ordered).streams.remove(&stream) {
            Some(_) if stream != DEFAULT_STREAM => Ok(()),
            _ => Err(CuError::new(
                codes::INVALID_HANDLE,
                format!("unknown stream {stream:#x}"),
            )),
        }
    }

    fn event_create(&self, event: Handle, flags: u32) -> Result<(), CuError> {
        let created = Arc::new(Event::new(self.ctx()?, flags).map_err(cu_err)?);
        lock(&self.ordered).events.insert(event, created);
        Ok(())
    }

    fn event_destroy(&self, event: Handle) -> Result<(), CuError> {
        match lock(&self.ordered).events.remove(&event) {
            Some(_) => Ok(()),
            None => Err(CuError::new(
                codes::INVALID_HANDLE,
                format!("unknown event {event:#x}"),
            )),
        }
    }

    fn enqueue(&self, stream: Handle, work: StreamWork) -> bool {
        let result = self
            .ordered_stream(stream)
            .and_then(|s| self.run_work(&s, work));
        match result {
            Ok(()) => true,
            Err(e) => {
                lock(&self.ordered).pending.get_or_insert(e);
                false
            }
        }
    }

    fn read(&self, stream: Handle, src: DevicePtr, buf: &mut [u8]) -> LaunchOutcome {
        let result = self.ordered_stream(stream).and_then(|s| {
            let (result, out) = s.copy_dtoh_sync(buf, src, self.capture());
            self.keep_stdout(out);
            result.map_err(cu_err)
        });
        let result = self.with_pending(result);
        self.outcome(result)
    }

    fn synchronize(&self, target: SyncTarget) -> LaunchOutcome {
        let result = match target {
            SyncTarget::Stream(s) => self.ordered_stream(s).and_then(|s| self.finish(&s)),
            SyncTarget::Event(e) => self
                .ordered_event(e)
                .and_then(|e| self.flushing(|| e.synchronize()).map_err(cu_err)),
            SyncTarget::Context => self
                .ctx()
                .and_then(|c| self.flushing(|| c.synchronize()).map_err(cu_err)),
        };
        let result = self.with_pending(result);
        self.outcome(result)
    }

    fn query(&self, target: SyncTarget) -> Result<bool, CuError> {
        let done = match target {
            SyncTarget::Stream(s) => self.ordered_stream(s)?.is_idle(),
            SyncTarget::Event(e) => self.ordered_event(e)?.is_done(),
            SyncTarget::Context => Ok(false),
        };
        let done = done.map_err(cu_err);
        match lock(&self.ordered).pending.take() {
            Some(e) => Err(e),
            None => done,
        }
    }

    fn elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, CuError> {
        let (start, end) = (self.ordered_event(start)?, self.ordered_event(end)?);
        start.elapsed_ms(&end).map_err(cu_err)
    }

    fn prepare_signals(&self, area: &Arc<SignalArea>) -> Result<(), CuError> {
        let (ptr, len) = area.host_range();
        // SAFETY: the registration is dropped by the area's drop hook, before the
        // area unmaps the range.
        let registration = unsafe {
            HostRegistration::new(
                self.ctx()?,
                ptr as *mut u8,
                len,
                CU_MEMHOSTREGISTER_DEVICEMAP,
            )
        }
        .map_err(cu_err)?;
        area.set_device_base(registration.device_ptr().map_err(cu_err)?);
        area.on_drop(Box::new(move || drop(registration)));
        Ok(())
    }
}

fn release(used: &AtomicU64, bytes: u64) {
    let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        Some(u.saturating_sub(bytes))
    });
}

impl Drop for CudaContext {
    fn drop(&mut self) {
        let allocations: Vec<(DevicePtr, u64)> = lock(&self.allocations).drain().collect();
        let modules: Vec<CudaModule> = lock(&self.modules).drain().map(|(_, m)| m).collect();
        let mut streams: Vec<Arc<Stream>> = lock(&self.streams).drain().map(|(_, s)| s).collect();
        let ordered = std::mem::take(&mut *lock(&self.ordered));
        streams.extend(ordered.streams.into_values());
        let events = ordered.events;
        let pins = ordered.pins;
        let ctx = self.ctx.take();
        let total: u64 = allocations.iter().map(|(_, b)| b).sum::<u64>()
            + modules.iter().map(|m| m.globals_bytes).sum::<u64>();
        release(&self.used, total);
        // Destroying a context flushes its printf buffer; the session is gone,
        // so whatever is captured is dropped rather than reaching our stdout.
        let teardown = move || {
            drop(events);
            drop(streams);
            // Copies into pinned regions end before they are unregistered.
            if let (false, Some(ctx)) = (pins.is_empty(), &ctx) {
                let _ = ctx.synchronize();
            }
            drop(pins);
            drop(modules);
            if let Some(ctx) = ctx {
                if ctx.is_primary() {
                    // A shared context outlives the session: free what it held.
                    for (ptr, _) in &allocations {
                        let _ = ctx.mem_free(*ptr);
                    }
                }
                drop(ctx);
            }
        };
        match self.capture() {
            Some(capture) => drop(capture.window(teardown)),
            None => teardown(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_patterns_map_to_memset_widths() {
        assert_eq!(fill_value(&[7]), Some(Fill::D8(7)));
        assert_eq!(fill_value(&[1, 2]), Some(Fill::D16(0x0201)));
        assert_eq!(fill_value(&[1, 2, 3, 4]), Some(Fill::D32(0x0403_0201)));
        assert_eq!(fill_value(&[1, 2, 3]), None);
        assert_eq!(fill_value(&[]), None);
    }

    #[test]
    fn context_mode_defaults_to_a_context_per_session() {
        assert_eq!(ContextMode::parse(None), ContextMode::PerSession);
        assert_eq!(ContextMode::parse(Some("session")), ContextMode::PerSession);
        assert_eq!(ContextMode::parse(Some("primary")), ContextMode::Primary);
    }

    #[test]
    fn layouts_and_attributes_convert_to_the_protocol() {
        let infos = param_infos(&[(0, 8), (8, 4), (16, 8)]);
        assert_eq!(
            infos[2],
            ParamInfo {
                offset: 16,
                size: 8
            }
        );
        let attrs = function_attrs(&FunctionAttributes {
            max_threads_per_block: 1024,
            num_regs: 32,
            binary_version: 90,
            ..FunctionAttributes::default()
        });
        assert_eq!(attrs.max_threads_per_block, 1024);
        assert_eq!(attrs.num_regs, 32);
        assert_eq!(attrs.binary_version, 90);
    }

    #[test]
    fn the_device_attribute_range_covers_the_cpu_devices_table() {
        let cpu: Vec<u32> = super::super::attributes::cpu_device_attributes(
            super::super::attributes::AttributeInputs {
                multiprocessors: 1,
                pci: [0, 0, 0],
            },
        )
        .iter()
        .map(|(a, _)| *a)
        .collect();
        let queried = cu::driver::collect_attributes(|a| Ok(Some(a as i32))).unwrap();
        for attr in cpu {
            assert!(
                queried.iter().any(|(a, _)| *a == attr),
                "attribute {attr} is never queried"
            );
        }
    }

    /// The fake driver of `cumux-cuda-driver`'s tests, built with the system C
    /// compiler, or `None` where there is none.
    fn fake_driver() -> Option<Arc<Driver>> {
        let src = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../cuda-driver/tests/fake_libcuda.c"
        );
        let out = std::env::temp_dir().join(format!(
            "cumux-server-fake-libcuda-{}.so",
            std::process::id()
        ));
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-DFAKE_QUIET", "-o"])
            .arg(&out)
            .arg(src)
            .status()
            .is_ok_and(|s| s.success());
        if !built {
            eprintln!("no C compiler: skipping the fake-driver test");
            return None;
        }
        let driver = Driver::open(out.as_os_str()).ok()?;
        driver.init().ok()?;
        let _ = std::fs::remove_file(&out);
        Some(Arc::new(driver))
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn a_session_runs_on_the_fake_gpu() {
        let Some(driver) = fake_driver() else {
            return;
        };
        let device = CudaDevice::new(&driver, 0, ContextMode::PerSession, false).unwrap();
        let info = device.info();
        assert_eq!(info.name, "Fake GPU 80GB");
        assert_eq!(info.backend, "cuda");
        assert_eq!(info.total_mem, 80 << 30);
        assert_eq!(info.attributes.len(), 144);
        let ctx = device.create_context().unwrap();

        let input: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let a = ctx.mem_alloc(16).unwrap();
        assert_eq!(device.mem_used(), 16);
        ctx.mem_write(a, &input).unwrap();

        let image = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fatbin/tests/fixtures/default.fatbin"
        ))
        .unwrap();
        let loaded = ctx.module_load(&image).unwrap();
        let names: Vec<&str> = loaded.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["add", "scale"]);
        assert_eq!(loaded.kernels[0].params_bytes(), 28);
        assert_eq!(
            loaded.kernels[1].params[1],
            ParamInfo { offset: 8, size: 4 }
        );
        assert_eq!(loaded.kernels[1].attrs.binary_version, 90);
        assert_eq!(loaded.globals.len(), 1);
        assert_eq!(
            (loaded.globals[0].name.as_str(), loaded.globals[0].size),
            ("g_val", 16)
        );
        assert_eq!(device.mem_used(), 32);

        // scale(a, 2.0, 3) on another thread: its own stream, same memory.
        let mut params = a.to_le_bytes().to_vec();
        params.extend_from_slice(&2.0f32.to_le_bytes());
        params.extend_from_slice(&3i32.to_le_bytes());
        let geometry = LaunchGeometry {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            dynamic_shared_bytes: 0,
            attributes: Vec::new(),
        };
        let worker = Arc::clone(&ctx);
        let id = loaded.id;
        let on_thread = geometry.clone();
        let outcome = std::thread::spawn(move || worker.launch(id, 1, &on_thread, &params))
            .join()
            .unwrap();
        assert_eq!(outcome.result, Ok(()));
        assert!(outcome.stdout.is_empty());
        let mut back = vec![0u8; 16];
        ctx.mem_read(a, &mut back).unwrap();
        assert_eq!(floats(&back), [3.0, 6.0, 9.0, 4.0]);

        let b = ctx.mem_alloc(16).unwrap();
        ctx.mem_fill(b, &1.5f32.to_le_bytes(), 4).unwrap();
        ctx.mem_copy(a, b, 8).unwrap();
        ctx.mem_read(a, &mut back).unwrap();
        assert_eq!(floats(&back), [1.5, 1.5, 9.0, 4.0]);
        assert_eq!(
            ctx.mem_fill(b, &[1, 2, 3], 1).unwrap_err().code,
            codes::INVALID_VALUE
        );

        // Launch attributes reach cuLaunchKernelEx: a cluster that does not
        // divide the grid is the driver's error, one that does runs.
        let clustered = |x: u32, grid: u32| LaunchGeometry {
            grid: [grid, 1, 1],
            attributes: vec![
                LaunchAttribute::ClusterDim([x, 1, 1]),
                LaunchAttribute::ProgrammaticSerialization(1),
            ],
            ..geometry.clone()
        };
        let mut one = vec![0u8; 16];
        one[..8].copy_from_slice(&a.to_le_bytes());
        one[8..12].copy_from_slice(&1.0f32.to_le_bytes());
        one[12..16].copy_from_slice(&1i32.to_le_bytes());
        let refused = ctx.launch(loaded.id, 1, &clustered(2, 1), &one);
        assert_eq!(refused.result.unwrap_err().code, 912);
        assert_eq!(
            ctx.launch(loaded.id, 1, &clustered(2, 2), &one).result,
            Ok(())
        );

        // Tensor maps come from the driver, for the context's memory.
        let request = TensorMapRequest {
            data_type: 7,
            rank: 2,
            global_address: a,
            global_dim: vec![4, 1],
            global_strides: vec![16],
            element_strides: vec![1, 1],
            interleave: 0,
            swizzle: 0,
            l2_promotion: 0,
            oob_fill: 0,
            layout: TensorMapLayout::Tiled {
                box_dim: vec![4, 1],
            },
        };
        let map = ctx.tensor_map_encode(&request).unwrap();
        assert_eq!(map.len(), 128);
        assert_eq!(map[..8], a.to_le_bytes());
        assert_eq!(map[8..12], 2u32.to_le_bytes());
        assert_eq!(map[24..28], 4u32.to_le_bytes());
        let bad_rank = TensorMapRequest {
            rank: 9,
            ..request.clone()
        };
        assert!(ctx.tensor_map_encode(&bad_rank).is_err());

        let bad = ctx.launch(loaded.id + 100, 0, &geometry, &[]);
        assert_eq!(bad.result.unwrap_err().code, codes::INVALID_HANDLE);
        let bad = ctx.launch(loaded.id, 7, &geometry, &[]);
        assert_eq!(bad.result.unwrap_err().code, codes::INVALID_HANDLE);

        ctx.module_unload(loaded.id);
        assert_eq!(device.mem_used(), 32);
        ctx.mem_free(b).unwrap();
        assert_eq!(device.mem_used(), 16);
        drop(ctx);
        assert_eq!(device.mem_used(), 0);
        assert_eq!(
            ContextMode::parse(Some("primary")),
            ContextMode::Primary,
            "the shared mode stays selectable"
        );
        let shared = CudaDevice::new(&driver, 0, ContextMode::Primary, false).unwrap();
        let one = shared.create_context().unwrap();
        let two = shared.create_context().unwrap();
        let p = one.mem_alloc(8).unwrap();
        two.mem_alloc(8).unwrap();
        one.mem_free(p).unwrap();
        drop(two);
        assert_eq!(shared.mem_used(), 0);
    }

    #[test]
    fn signals_reach_registered_host_memory_in_stream_order() {
        let Some(driver) = fake_driver() else {
            return;
        };
        let device = CudaDevice::new(&driver, 0, ContextMode::PerSession, false).unwrap();
        let ctx = device.create_context().unwrap();
        let ordered = ctx
            .stream_ordered()
            .expect("a GPU context keeps stream order");
        let area = Arc::new(SignalArea::create().unwrap());
        ordered.prepare_signals(&area).unwrap();
        ordered.stream_create(5, CU_STREAM_NON_BLOCKING, 0).unwrap();
        let signal = |slot, value| StreamWork::SignalTo {
            area: Arc::clone(&area),
            slot,
            value,
        };
        ordered.enqueue(5, signal(3, 7));
        ordered.enqueue(DEFAULT_STREAM, signal(4, 1));
        assert!(ordered.synchronize(SyncTarget::Context).result.is_ok());
        assert_eq!((area.load(3), area.load(4)), (7, 1));
        // A slot past the area fails the stream's next wait, and writes nothing.
        ordered.enqueue(5, signal(1 << 20, 1));
        let failed = ordered
            .synchronize(SyncTarget::Stream(5))
            .result
            .unwrap_err();
        assert_eq!(failed.code, codes::INVALID_VALUE);
        // A signal that never met an area is refused the same way.
        ordered.enqueue(5, StreamWork::Signal { slot: 1, value: 1 });
        assert!(ordered.synchronize(SyncTarget::Stream(5)).result.is_err());
        assert_eq!(area.load(1), 0);
    }

    #[test]
    fn loading_without_a_driver_is_an_error() {
        // The default build machine has no GPU; where one exists this still
        // must not panic.
        let _ = load_devices();
    }
}
