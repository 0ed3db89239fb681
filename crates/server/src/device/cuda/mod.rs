//! The `cuda` backend: real GPUs through the system's `libcuda.so.1`
//! (`cumux-cuda-driver`). Each session gets a CUDA context of its own (its own
//! address space and sticky error) and each calling thread a stream in it.
//!
//! Every [`DeviceContext`] method makes the context current, queues its work on
//! the calling thread's stream and waits for that stream before returning.
//! Device `printf` reaches the session, not the server's stdout: contexts whose
//! modules can print run their flushing calls inside a stdout capture window
//! (`cumux_cuda_driver::capture`), and the captured text rides on the next
//! [`crate::device::LaunchOutcome`]. `CUMUX_CUDA_CONTEXT=primary` shares each GPU's primary
//! context between sessions instead (faster to start, no isolation).
//!
//! Map: this file is the device ([`CudaDevice`]); [`context`] a session's
//! context and its synchronous calls; [`ordered`] its streams, events and
//! graphs; [`convert`] the conversions between the driver's types and cumux's;
//! [`arrays`] CUDA arrays, texture and surface objects; [`green_streams`] a
//! shared context's capped sessions' streams.

pub mod arrays;
pub mod context;
pub mod convert;
mod exported;
mod green_streams;
pub mod ordered;
pub mod placed;
mod write_staging;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cumux_cuda_driver::capture::StdoutCapture;
use cumux_cuda_driver::{self as cu, CudaError, DeviceId, Driver};
use cumux_protocol::{CuError, DeviceInfo};

use self::context::CudaContext;
use self::convert::cu_err;
use super::{Device, DeviceContext};
use crate::locking::lock;

/// Selects how sessions map to CUDA contexts (`session` or `primary`).
pub const CONTEXT_MODE_ENV: &str = "CUMUX_CUDA_CONTEXT";
/// `passthrough` leaves device printf on the server's stdout (no capture).
pub const PRINTF_ENV: &str = "CUMUX_CUDA_PRINTF";

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
            attributes: crate::device::attributes::as_served(driver.device_attributes(dev)?),
            backend: "cuda".into(),
            peers: Vec::new(),
            vmm_granularity: driver.vmm_granularity(dev).ok(),
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

    /// GPU `ordinal` as a worker process serves it (and as the server
    /// describes a GPU it serves through workers): a context per session,
    /// printf left on the process's stdout.
    pub fn per_session(driver: &Arc<Driver>, ordinal: u32) -> Result<CudaDevice, CudaError> {
        CudaDevice::new(driver, ordinal, ContextMode::PerSession, false)
    }

    /// GPU `ordinal` as a `shared` worker serves it: every session in the
    /// device's primary context, which the green contexts of capped
    /// sessions' streams share modules and memory with.
    pub fn primary(driver: &Arc<Driver>, ordinal: u32) -> Result<CudaDevice, CudaError> {
        CudaDevice::new(driver, ordinal, ContextMode::Primary, false)
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

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    fn create_context(&self) -> Result<Arc<dyn DeviceContext>, CuError> {
        let capture = if self.capture_printf {
            StdoutCapture::install()
                .inspect_err(|e| {
                    tracing::warn!("device printf will go to the server's stdout: {e}")
                })
                .ok()
        } else {
            None
        };
        let ctx = self.context().map_err(cu_err)?;
        // A shared context shares one printf buffer: if any of its
        // sessions prints, every session's flushes need windows.
        let prints = match self.mode {
            ContextMode::PerSession => Arc::new(AtomicBool::new(false)),
            ContextMode::Primary => Arc::clone(&self.primary_prints),
        };
        Ok(Arc::new(CudaContext::new(
            ctx,
            self.sm,
            Arc::clone(&self.used),
            Arc::clone(&self.next_module),
            capture,
            prints,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::signals::SignalArea;
    use crate::device::{KernelLaunch, LaunchGeometry, StreamWork, SyncTarget};
    use cumux_cuda_driver::sys::CU_STREAM_NON_BLOCKING;
    use cumux_protocol::{
        codes, LaunchAttribute, ParamInfo, TensorMapLayout, TensorMapRequest, DEFAULT_STREAM,
    };
    use cumux_testkit::fake_gpu::{f32_bytes, f32s, fake_libcuda, fixture_fatbin, scale_params};

    #[test]
    fn context_mode_defaults_to_a_context_per_session() {
        assert_eq!(ContextMode::parse(None), ContextMode::PerSession);
        assert_eq!(ContextMode::parse(Some("session")), ContextMode::PerSession);
        assert_eq!(ContextMode::parse(Some("primary")), ContextMode::Primary);
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
        let Some(out) = fake_libcuda("server", true) else {
            eprintln!("no C compiler: skipping the fake-driver test");
            return None;
        };
        let driver = Driver::open(out.as_os_str()).ok()?;
        driver.init().ok()?;
        let _ = std::fs::remove_file(&out);
        Some(Arc::new(driver))
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

        let a = ctx.mem_alloc(16).unwrap();
        assert_eq!(device.mem_used(), 16);
        ctx.mem_write(a, &f32_bytes(&[1.0, 2.0, 3.0, 4.0])).unwrap();

        let loaded = ctx.module_load(&fixture_fatbin()).unwrap();
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
        let params = scale_params(a, 2.0, 3);
        let geometry = LaunchGeometry {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            dynamic_shared_bytes: 0,
            attributes: Vec::new(),
        };
        let launch_of = |module, kernel, geometry: &LaunchGeometry, params: &[u8]| KernelLaunch {
            module,
            kernel,
            geometry: geometry.clone(),
            params: params.to_vec(),
        };
        let worker = Arc::clone(&ctx);
        let on_thread = launch_of(loaded.id, 1, &geometry, &params);
        let outcome = std::thread::spawn(move || worker.launch(&on_thread))
            .join()
            .unwrap();
        assert_eq!(outcome.result, Ok(()));
        assert!(outcome.stdout.is_empty());
        let mut back = vec![0u8; 16];
        ctx.mem_read(a, &mut back).unwrap();
        assert_eq!(f32s(&back), [3.0, 6.0, 9.0, 4.0]);

        let b = ctx.mem_alloc(16).unwrap();
        ctx.mem_fill(b, &1.5f32.to_le_bytes(), 4).unwrap();
        ctx.mem_copy(a, b, 8).unwrap();
        ctx.mem_read(a, &mut back).unwrap();
        assert_eq!(f32s(&back), [1.5, 1.5, 9.0, 4.0]);
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
        let one = scale_params(a, 1.0, 1);
        let refused = ctx.launch(&launch_of(loaded.id, 1, &clustered(2, 1), &one));
        assert_eq!(refused.result.unwrap_err().code, 912);
        assert_eq!(
            ctx.launch(&launch_of(loaded.id, 1, &clustered(2, 2), &one))
                .result,
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

        let bad = ctx.launch(&launch_of(loaded.id + 100, 0, &geometry, &[]));
        assert_eq!(bad.result.unwrap_err().code, codes::INVALID_HANDLE);
        let bad = ctx.launch(&launch_of(loaded.id, 7, &geometry, &[]));
        assert_eq!(bad.result.unwrap_err().code, codes::INVALID_HANDLE);

        ctx.module_unload(loaded.id);
        assert_eq!(device.mem_used(), 32);
        ctx.mem_free(b, 16).unwrap();
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
        one.mem_free(p, 8).unwrap();
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
