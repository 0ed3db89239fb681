//! The device traits every backend implements: [`Device`] (description, memory
//! totals, contexts) and [`DeviceContext`] (one session's memory, modules and
//! launches, all synchronous), and the plain types that cross them.

pub mod attributes;
#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod model;
pub mod worker;

use std::sync::Arc;

use cumux_protocol::{CuError, DeviceInfo, DevicePtr, FunctionAttrs, ParamInfo};

/// A backend's own name for a loaded module. Unique per device, never reused.
pub type ModuleId = u64;

/// A kernel of a loaded module, as the client needs to see it.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelDesc {
    pub name: String,
    /// Byte offset and size of each parameter in the packed parameter buffer.
    pub params: Vec<ParamInfo>,
    pub attrs: FunctionAttrs,
}

impl KernelDesc {
    /// Bytes the packed parameter buffer must hold at least.
    pub fn params_bytes(&self) -> u64 {
        self.params
            .iter()
            .map(|p| u64::from(p.offset) + u64::from(p.size))
            .max()
            .unwrap_or(0)
    }
}

/// A module-scope variable (`__device__`, `__constant__`) living in device memory.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalDesc {
    pub name: String,
    pub ptr: DevicePtr,
    pub size: u64,
}

/// What loading an image produced.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedModule {
    pub id: ModuleId,
    pub kernels: Vec<KernelDesc>,
    pub globals: Vec<GlobalDesc>,
}

/// Geometry of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchGeometry {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

/// What one launch did.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchOutcome {
    /// Device `printf` output, in order.
    pub stdout: Vec<u8>,
    /// A fault (illegal address, misaligned access, trap…) as the driver's code.
    pub result: Result<(), CuError>,
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
}

/// One session's share of a device: memory, modules and launches.
///
/// Every method is synchronous: when it returns, the work is done. The server
/// gives each client stream a worker thread of its own (`streams.rs`) that calls
/// these methods in stream order, so streams run concurrently and events are
/// timestamps taken by those workers. A backend over real GPUs (the `cuda`
/// backend) implements the same methods on a CUDA stream per calling thread and
/// synchronizes it before returning; the trait needs no notion of streams.
///
/// Pointers reaching a context have already been checked by the session against
/// the client's own allocations; a backend still fails cleanly (never panics)
/// on a bad pointer.
pub trait DeviceContext: Send + Sync {
    fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, CuError>;
    fn mem_free(&self, ptr: DevicePtr) -> Result<(), CuError>;
    fn mem_read(&self, src: DevicePtr, buf: &mut [u8]) -> Result<(), CuError>;
    fn mem_write(&self, dst: DevicePtr, data: &[u8]) -> Result<(), CuError>;
    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), CuError>;
    /// Writes `count` copies of `pattern` (1, 2 or 4 bytes) from `dst` on.
    fn mem_fill(&self, dst: DevicePtr, pattern: &[u8], count: u64) -> Result<(), CuError>;
    /// Loads a fat binary, cubin or PTX image.
    fn module_load(&self, image: &[u8]) -> Result<LoadedModule, CuError>;
    /// Unloads a module and frees its globals.
    fn module_unload(&self, module: ModuleId);
    /// Runs `kernel` (an index into the module's kernels) to completion.
    fn launch(
        &self,
        module: ModuleId,
        kernel: usize,
        geometry: &LaunchGeometry,
        params: &[u8],
    ) -> LaunchOutcome;
}

/// The default per-block instruction budget of a launch on the CPU device
/// (`cumux serve --launch-budget`): minutes of interpretation.
pub const DEFAULT_LAUNCH_BUDGET: u64 = 20_000_000_000;

/// The CPU reference device with `capacity` bytes of memory, if this build has
/// it. A block of a launch that executes more than `launch_budget` instructions
/// fails it with CUDA_ERROR_LAUNCH_TIMEOUT (702); 0 means no limit.
pub fn cpu_device(capacity: u64, launch_budget: u64) -> Result<Arc<dyn Device>, String> {
    #[cfg(feature = "cpu")]
    return Ok(Arc::new(cpu::CpuDevice::with_launch_budget(
        capacity,
        launch_budget,
    )));
    #[cfg(not(feature = "cpu"))]
    return Err(format!(
        "this build of cumux-server has no CPU device (feature `cpu`); cannot serve {capacity} bytes (launch budget {launch_budget})"
    ));
}

/// Every GPU of the system's CUDA driver, if this build has the `cuda` backend
/// (feature `cuda`); an error says why there are none (no driver, no GPU).
pub fn cuda_devices() -> Result<Vec<Arc<dyn Device>>, String> {
    #[cfg(feature = "cuda")]
    return cuda::load_devices();
    #[cfg(not(feature = "cuda"))]
    return Err("this build of cumux-server has no cuda backend (feature `cuda`)".into());
}

/// The default memory of a CPU-side device: a quarter of host RAM, at most 16 GiB.
pub fn default_memory_bytes() -> u64 {
    let quarter = host_memory_bytes().unwrap_or(4 << 30) / 4;
    quarter.clamp(64 << 20, 16 << 30)
}

/// Total host RAM from `/proc/meminfo`, if readable.
pub fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
