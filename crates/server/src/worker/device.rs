//! [`WorkerDevice`]: a device whose contexts live in worker processes, one per
//! session ([`Sharing::Isolated`]) or one for all ([`Sharing::Shared`], each
//! session a [`SharedView`] of it); and the worker-backed devices `cumux serve`
//! makes: the CPU reference device (for tests of this machinery) and the GPUs.

#[cfg(any(feature = "cpu", feature = "cuda"))]
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cumux_protocol::{codes, CuError, DeviceInfo};

use super::colocation::Colocation;
use super::context::WorkerContext;
use super::fencing::Claims;
#[cfg(any(feature = "cpu", feature = "cuda"))]
use super::process::image_print_detector;
use super::shared::{FenceSetup, PrintRoute, SharedView};
use super::shared_limits::LimitBook;
use super::spawn::{Launcher, WorkerCommand, READY_WAIT};
use super::watchdog::Watchdog;
#[cfg(feature = "cuda")]
use crate::device::cuda::CudaDevice;
use crate::device::{ContextGroup, Device, DeviceContext, MovableContext, MovableDevice};
use crate::locking::lock;

/// The context of a `shared` device, and what its sessions' views share.
#[derive(Clone)]
struct SharedContext {
    ctx: Arc<WorkerContext>,
    /// The route of its device printf.
    route: Arc<PrintRoute>,
    /// The address ranges its fenced sessions claim.
    claims: Arc<Claims>,
    /// Its live sessions' limit requests.
    limits: Arc<LimitBook>,
}

/// How a worker device gives sessions their contexts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// A context per session, each in a worker process of its own: a fault
    /// or a stray pointer stays with its session; the GPU time-slices
    /// between the contexts.
    Isolated,
    /// One context (one worker) for every session, each on streams of its
    /// own ([`SharedView`]): kernels of different tenants run side by side;
    /// a fault fails every session of the context.
    Shared,
    /// Shared, and every tenant not marked `trusted` fenced: its memory in a
    /// partition of its own, its kernels loaded from PTX rewritten so that
    /// every global access stays there (`worker::fencing`); cubin-only
    /// modules refused. Not yet the default: its GPU side awaits a GPU run.
    Fenced,
}

impl Sharing {
    /// The names [`Sharing::parse`] takes.
    pub const NAMES: [&'static str; 3] = ["isolated", "shared", "fenced"];

    /// `isolated`, `shared` or `fenced`.
    pub fn parse(text: &str) -> Result<Sharing, String> {
        match text {
            "isolated" => Ok(Sharing::Isolated),
            "shared" => Ok(Sharing::Shared),
            "fenced" => Ok(Sharing::Fenced),
            other => Err(format!(
                "unknown sharing {other:?}: expected isolated, shared or fenced"
            )),
        }
    }

    /// Whether every session shares one context (shared or fenced).
    pub fn one_context(self) -> bool {
        self != Sharing::Isolated
    }
}

/// A device whose contexts live in worker processes: one per session, or one
/// for all ([`Sharing`]).
pub struct WorkerDevice {
    info: DeviceInfo,
    launcher: Arc<Launcher>,
    used: Arc<AtomicU64>,
    next_module: Arc<AtomicU64>,
    sharing: Sharing,
    /// The context sessions share (`Shared`), replaced once it dies, the
    /// route of its device printf, and its sessions' fenced ranges.
    shared: Mutex<Option<SharedContext>>,
    next_view: AtomicU64,
    /// Whether a module image can print through the driver (which then
    /// writes it wherever the context's next wait flushes it).
    may_print: fn(&[u8]) -> bool,
}

impl WorkerDevice {
    /// A device described by `info` whose sessions run in workers that
    /// `command` starts; one spare is kept warm unless `CUMUX_WORKER_SPARES=0`
    /// ([`super::spawn::SPARES_ENV`]).
    pub fn new(info: DeviceInfo, command: WorkerCommand) -> Self {
        WorkerDevice {
            info,
            launcher: Arc::new(Launcher::new(command)),
            used: Arc::new(AtomicU64::new(0)),
            next_module: Arc::new(AtomicU64::new(1)),
            sharing: Sharing::Isolated,
            shared: Mutex::new(None),
            next_view: AtomicU64::new(1),
            may_print: |_| false,
        }
    }

    /// The same device, its workers' printing images told by `may_print`
    /// (see [`super::process::image_print_detector`]).
    pub fn with_print_detector(mut self, may_print: fn(&[u8]) -> bool) -> Self {
        self.may_print = may_print;
        self
    }

    /// The same device, giving sessions contexts as `sharing` says.
    pub fn with_sharing(mut self, sharing: Sharing) -> Self {
        self.sharing = sharing;
        self
    }

    /// The same device, resetting a context whose queued work makes no progress
    /// for `timeout` ([`Watchdog`]); `None`: never.
    pub fn with_kernel_timeout(self, timeout: Option<Duration>) -> Self {
        if let Some(timeout) = timeout {
            self.launcher.set_watchdog(Watchdog::new(timeout));
        }
        self
    }

    /// A session's view of the shared context, and that context.
    fn shared_view(&self) -> Result<(Arc<dyn DeviceContext>, Arc<WorkerContext>), CuError> {
        let tag = self.next_view.fetch_add(1, Ordering::Relaxed);
        let SharedContext {
            ctx: primary,
            route,
            claims,
            limits,
        } = self.shared_context();
        let conn = primary.open_connection()?;
        let attribute = |n: u32| {
            let found = self.info.attributes.iter().find(|(a, _)| *a == n);
            found.map_or(0, |(_, v)| (*v).max(0) as u32)
        };
        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR.
        let setup = FenceSetup {
            enabled: self.sharing == Sharing::Fenced,
            claims,
            partition_bytes: self.info.total_mem,
            sm: attribute(75) * 10 + attribute(76),
        };
        let view = SharedView::new(
            Arc::clone(&primary),
            conn,
            tag,
            route,
            self.may_print,
            setup,
            limits,
        );
        Ok((Arc::new(view), primary))
    }

    /// The shared context and its printf route, started anew if there is none
    /// or it died.
    fn shared_context(&self) -> SharedContext {
        let mut slot = lock(&self.shared);
        match &*slot {
            Some(shared) if !shared.ctx.is_dead() => shared.clone(),
            _ => {
                if slot.is_some() {
                    tracing::warn!("the shared context died; new sessions get a fresh one");
                }
                let ctx = Arc::new(WorkerContext::new(
                    Some(Arc::clone(&self.launcher)),
                    Arc::clone(&self.used),
                    Arc::clone(&self.next_module),
                ));
                let shared = SharedContext {
                    ctx,
                    route: Arc::default(),
                    claims: Arc::default(),
                    limits: Arc::default(),
                };
                *slot = Some(shared.clone());
                shared
            }
        }
    }
}

impl Device for WorkerDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The worker starts at the context's first call, so a session that never
    /// touches the device (a `cumux status` query) costs no process.
    fn create_context(&self) -> Result<Arc<dyn DeviceContext>, CuError> {
        if self.sharing.one_context() {
            return Ok(self.shared_view()?.0);
        }
        Ok(Arc::new(
            WorkerContext::new(
                Some(Arc::clone(&self.launcher)),
                Arc::clone(&self.used),
                Arc::clone(&self.next_module),
            )
            .in_own_process(),
        ))
    }

    /// A context kept with the program's others in one process: in shared
    /// mode the first is a view of this device's shared context, whose
    /// process then hosts the program's contexts on other devices; in
    /// isolated mode, whichever starts first hosts the rest ([`Colocation`]).
    fn create_context_in(&self, group: &ContextGroup) -> Result<Arc<dyn DeviceContext>, CuError> {
        let colocation = group.kept(Colocation::new).ok_or_else(|| {
            CuError::new(
                codes::INVALID_DEVICE,
                "the program's devices are of different kinds",
            )
        })?;
        if self.sharing.one_context() {
            let mut host = colocation.starting();
            if host.is_none() {
                let (view, primary) = self.shared_view()?;
                *host = Some(primary.as_host()?);
                return Ok(view);
            }
        }
        let member = WorkerContext::member(
            Arc::clone(&self.launcher),
            Arc::clone(&self.used),
            Arc::clone(&self.next_module),
            colocation,
            self.info.ordinal,
        );
        // Isolated: the program's process, which runs no one else's work.
        Ok(Arc::new(if self.sharing.one_context() {
            member
        } else {
            member.in_own_process()
        }))
    }

    fn time_slices_sessions(&self) -> bool {
        !self.sharing.one_context()
    }

    /// Isolated sessions move here, each into a worker of its own; a shared
    /// context's sessions do not (its process holds every tenant's memory).
    fn movable(&self) -> Option<&dyn MovableDevice> {
        (self.sharing == Sharing::Isolated).then_some(self as &dyn MovableDevice)
    }

    /// Shared: the shared context's worker, then the spare; isolated: the spare
    /// the first session will take. Measured on the H100: a spare creating its
    /// context while a tenant ran stretched that tenant's 50 µs kernels to
    /// 0.5-0.7 ms for ~50 ms (2 % of a 3 s run, its whole p99 tail).
    fn warm_up(&self) {
        let started = Instant::now();
        let ordinal = self.info.ordinal;
        tracing::info!(
            ordinal,
            "starting the device's workers (each creates its context)"
        );
        if self.sharing.one_context() {
            if let Err(e) = self.shared_context().ctx.start_now() {
                tracing::warn!(ordinal, "the shared worker did not start: {e}");
                return;
            }
        }
        self.launcher.warm_spare(READY_WAIT);
        let ms = started.elapsed().as_millis();
        tracing::info!(ordinal, ms, "the device's workers are ready");
    }
}

/// The GPUs whose memory GPU `ordinal`'s kernels may reach, of `count`,
/// with their peer attributes; a query that fails counts as no access.
#[cfg(feature = "cuda")]
fn peers_of(
    driver: &Arc<cumux_cuda_driver::Driver>,
    ordinal: u32,
    count: u32,
) -> Vec<(u32, [i32; 4])> {
    let Ok(dev) = driver.device(ordinal) else {
        return Vec::new();
    };
    (0..count)
        .filter(|&peer| peer != ordinal)
        .filter_map(|peer| {
            let attrs = driver
                .peer_attributes(dev, driver.device(peer).ok()?)
                .ok()?;
            (attrs[1] != 0).then_some((peer, attrs))
        })
        .collect()
}

/// CPU reference device `number` served by workers (for tests of this machinery).
#[cfg(feature = "cpu")]
pub fn cpu_worker_device(
    program: PathBuf,
    number: u32,
    spec: &crate::device::backends::CpuSpec,
    sharing: Sharing,
    kernel_timeout: Option<Duration>,
) -> Result<Arc<dyn Device>, String> {
    let mut info = crate::device::cpu::CpuDevice::new(spec.memory)
        .with_threads(spec.threads)
        .numbered(number)?
        .info()
        .clone();
    crate::device::attributes::cpu_in_workers(&mut info.attributes);
    let mut command = WorkerCommand::cumux(program, "cpu", number, Some(spec.memory));
    command.args.push("--launch-budget".into());
    command.args.push(spec.launch_budget.to_string().into());
    if spec.threads > 0 {
        command.args.push("--threads".into());
        command.args.push(spec.threads.to_string().into());
    }
    Ok(Arc::new(
        WorkerDevice::new(info, command)
            .with_sharing(sharing)
            .with_kernel_timeout(kernel_timeout)
            .with_print_detector(image_print_detector()),
    ))
}

/// Every GPU of the system's CUDA driver, each served by workers that
/// `program` starts. The driver is initialised here to read the devices'
/// descriptions, but no context is created in this process.
#[cfg(feature = "cuda")]
pub fn cuda_worker_devices(
    program: PathBuf,
    sharing: Sharing,
    kernel_timeout: Option<Duration>,
) -> Result<Vec<Arc<dyn Device>>, String> {
    let driver = cumux_cuda_driver::Driver::load().map_err(|e| e.to_string())?;
    let count = driver.device_count().map_err(|e| e.to_string())?;
    if count == 0 {
        return Err(format!(
            "the CUDA driver {} reports no GPU",
            driver.library()
        ));
    }
    let mut out: Vec<Arc<dyn Device>> = Vec::new();
    for ordinal in 0..count {
        let device = CudaDevice::per_session(&driver, ordinal).map_err(|e| e.to_string())?;
        let mut info = device.info().clone();
        info.peers = peers_of(&driver, ordinal, count);
        tracing::info!(ordinal, name = %info.name, memory = info.total_mem, ?sharing, "cuda: GPU, served by worker processes");
        let mut command = WorkerCommand::cumux(program.clone(), "cuda", ordinal, None);
        if sharing.one_context() {
            // Capped sessions' green contexts share the primary context's
            // modules and memory, and no other context's.
            command.args.push("--primary-context".into());
        }
        out.push(Arc::new(
            WorkerDevice::new(info, command)
                .with_sharing(sharing)
                .with_kernel_timeout(kernel_timeout)
                .with_print_detector(image_print_detector()),
        ));
    }
    Ok(out)
}

impl MovableDevice for WorkerDevice {
    /// A context in a worker of its own, whose device hands out addresses
    /// in `window` (a GPU's are all window 0; a CPU worker's, its ordinal).
    fn create_context_in_window(&self, window: u32) -> Result<Arc<dyn DeviceContext>, CuError> {
        // Only isolated devices take moved sessions: a process of its own.
        let ctx = WorkerContext::new(
            Some(Arc::clone(&self.launcher)),
            Arc::clone(&self.used),
            Arc::clone(&self.next_module),
        )
        .in_own_process();
        ctx.take_window(window).map_err(|e| {
            CuError::new(
                e.code,
                format!(
                    "device {} cannot take the session's addresses: {}",
                    self.info.ordinal, e.detail
                ),
            )
        })?;
        if let Some(why) = ctx.unmovable() {
            return Err(CuError::new(codes::NOT_SUPPORTED, why));
        }
        Ok(Arc::new(ctx))
    }
}
