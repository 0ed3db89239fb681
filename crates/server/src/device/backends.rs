//! The backends this build has, as `cumux serve` makes them: the CPU reference
//! device, the system's GPUs, and the memory a CPU-side device gets by default.

use std::sync::Arc;

use super::Device;

/// How many CPU devices one server can number (each an address window of its own).
pub const MAX_CPU_DEVICES: u32 = cumux_ptx::MAX_WINDOWS;

/// What a CPU reference device is made with.
#[derive(Debug, Clone, Copy)]
pub struct CpuSpec {
    /// Bytes of device memory.
    pub memory: u64,
    /// Instructions a launch may execute, its blocks together, before it
    /// fails with CUDA_ERROR_LAUNCH_TIMEOUT (702); 0 means no limit.
    pub launch_budget: u64,
    /// Host threads a launch's blocks run on, and the multiprocessors the
    /// device reports; 0: one per host core.
    pub threads: usize,
}

/// CPU reference device `number` of a server as `spec` says, if this build
/// has it, its addresses in a window of its own.
pub fn numbered_cpu_device(number: u32, spec: &CpuSpec) -> Result<Arc<dyn Device>, String> {
    #[cfg(feature = "cpu")]
    return Ok(Arc::new(
        super::cpu::CpuDevice::with_launch_budget(spec.memory, spec.launch_budget)
            .with_threads(spec.threads)
            .numbered(number)?,
    ));
    #[cfg(not(feature = "cpu"))]
    return Err(format!(
        "this build of cumux-server has no CPU device (feature `cpu`); cannot serve device {number} ({spec:?})"
    ));
}

/// A CPU reference device as `spec` says, in address window `window`,
/// that is the server's device `position` (a reserve for moves off a failed
/// device, after the server's other devices).
pub fn reserve_cpu_device(
    position: u32,
    window: u32,
    spec: &CpuSpec,
) -> Result<Arc<dyn Device>, String> {
    #[cfg(feature = "cpu")]
    return Ok(Arc::new(
        super::cpu::CpuDevice::with_launch_budget(spec.memory, spec.launch_budget)
            .with_threads(spec.threads)
            .numbered(window)?
            .with_ordinal(position),
    ));
    #[cfg(not(feature = "cpu"))]
    return Err(format!(
        "this build of cumux-server has no CPU device (feature `cpu`); cannot keep device {position} in reserve ({spec:?}, window {window})"
    ));
}

/// Every GPU of the system's CUDA driver, if this build has the `cuda` backend
/// (feature `cuda`); an error says why there are none (no driver, no GPU).
pub fn cuda_devices() -> Result<Vec<Arc<dyn Device>>, String> {
    #[cfg(feature = "cuda")]
    return super::cuda::load_devices();
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
