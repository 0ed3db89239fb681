//! The CPU reference device: device memory and kernels from `cumux-ptx`, module
//! images unpacked with `cumux-fatbin`. Each context has an address space of its
//! own under one device-wide memory budget. It runs the PTX nvcc embeds in every
//! fat binary; a cubin-only image cannot run here (CUDA_ERROR_NO_BINARY_FOR_GPU).

use std::collections::{HashMap, HashSet};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cumux_fatbin::{Classified, ImageKind};
use cumux_protocol::pinned::HostMapping;
use cumux_protocol::{codes, CuError, DeviceInfo, DevicePtr, FunctionAttrs, Handle, ParamInfo};
use cumux_ptx::{
    DeviceMemory, Engine, HostBytes, KernelInfo, LaunchConfig, LaunchLimits, MemError, Program,
    SharedAllocation, Space, DEFAULT_PRINTF_FIFO,
};

use super::attributes::{
    cpu_device_attributes, AttributeInputs, COMPUTE_CAPABILITY, SHARED_PER_BLOCK,
};
use super::ipc_table::HandleTable;
use super::limits::{self, LimitSetting, RefusedShrinks};
use super::memory_use;
use super::socket_bytes::{self, FillBytes, SendBytes};
use super::{
    Device, DeviceContext, GlobalDesc, HostRegion, KernelDesc, KernelLaunch, LaunchOutcome,
    LoadedModule, ModuleId, MovableContext, MovableDevice, VmmOp,
};
use crate::locking::lock;

/// The CPU device. Its contexts share nothing but the memory budget: a kernel
/// of one session runs against that session's own [`DeviceMemory`], so it
/// cannot reach another's allocations, and one session's long kernel never
/// holds up another's allocations or frees.
pub struct CpuDevice {
    info: DeviceInfo,
    budget: Arc<Budget>,
    /// Instructions a launch may execute, its blocks together (and so any
    /// one block), before it fails with CUDA_ERROR_LAUNCH_TIMEOUT (702), like
    /// the driver's watchdog.
    launch_budget: u64,
    /// Its number among the CPU devices of one server: its addresses lie in
    /// a window of its own (`DeviceMemory::numbered`).
    number: u32,
    /// Host threads a launch's blocks run on (its multiprocessors); 0: one
    /// per host core.
    threads: usize,
}

pub use super::DEFAULT_LAUNCH_BUDGET;

/// Device memory in use across contexts, against the device's capacity.
struct Budget {
    capacity: u64,
    used: AtomicU64,
}

impl Budget {
    fn reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|total| *total <= self.capacity)
            })
            .is_ok()
    }

    fn release(&self, bytes: u64) {
        memory_use::release(&self.used, bytes);
    }
}

/// One session's address space and modules on the CPU device.
pub struct CpuContext {
    mem: DeviceMemory,
    /// The address window of `mem` (`DeviceMemory::numbered`).
    window: u32,
    launch_budget: u64,
    /// Host threads a launch's blocks run on (0: one per host core).
    threads: usize,
    /// Set when the session ends: its running launch stops at its next check.
    cancelled: AtomicBool,
    /// `CU_LIMIT_PRINTF_FIFO_SIZE`: the printf text a block keeps.
    printf_fifo: AtomicU64,
    /// The malloc heap's size when the context was made.
    start_heap: u64,
    refused_shrinks: RefusedShrinks,
    budget: Arc<Budget>,
    /// What this context has charged to the budget.
    charged: AtomicU64,
    modules: Mutex<Modules>,
    /// The pinned host regions its kernels reach, by id: where each is.
    host_regions: Mutex<HashMap<Handle, u64>>,
}

#[derive(Default)]
struct Modules {
    next: ModuleId,
    loaded: HashMap<ModuleId, Arc<Program>>,
    /// Kernels whose first launch logged that they run on the interpreter.
    interpreted: HashSet<(ModuleId, usize)>,
}

fn mem_err(e: MemError) -> CuError {
    CuError::new(e.cu_code(), e.to_string())
}

impl CpuDevice {
    /// A CPU device with `capacity` bytes of device memory, one
    /// multiprocessor per host core and the default launch budget
    /// ([`DEFAULT_LAUNCH_BUDGET`]).
    pub fn new(capacity: u64) -> Self {
        Self::with_launch_budget(capacity, DEFAULT_LAUNCH_BUDGET)
    }

    /// Like [`CpuDevice::new`], but a launch that executes more than
    /// `launch_budget` instructions, its blocks together, fails with
    /// CUDA_ERROR_LAUNCH_TIMEOUT (702) instead of running forever; a single
    /// block past it fails at that very instruction. 0 means no limit.
    pub fn with_launch_budget(capacity: u64, launch_budget: u64) -> Self {
        let pci = [0, 0xc0, 0];
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        CpuDevice {
            info: DeviceInfo {
                ordinal: 0,
                name: "cumux CPU reference device".into(),
                uuid: device_uuid(host.trim()),
                pci,
                total_mem: capacity,
                attributes: cpu_device_attributes(AttributeInputs {
                    multiprocessors: host_cores(),
                    pci,
                }),
                backend: "cpu".into(),
                peers: Vec::new(),
                vmm_granularity: Some((cumux_ptx::VMM_GRANULARITY, cumux_ptx::VMM_GRANULARITY)),
            },
            budget: Arc::new(Budget {
                capacity,
                used: AtomicU64::new(0),
            }),
            launch_budget: if launch_budget == 0 {
                u64::MAX
            } else {
                launch_budget
            },
            number: 0,
            threads: 0,
        }
    }

    /// The same device running a launch's blocks on `threads` host threads
    /// and saying it has that many multiprocessors (0: one per host core).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self.info.attributes = cpu_device_attributes(AttributeInputs {
            multiprocessors: self.multiprocessors(),
            pci: self.info.pci,
        });
        self
    }

    /// Its multiprocessors: its threads, else one per host core.
    fn multiprocessors(&self) -> i32 {
        match self.threads {
            0 => host_cores(),
            n => i32::try_from(n).unwrap_or(i32::MAX),
        }
    }

    /// The same device as device `number` of several on one server: that
    /// ordinal, a PCI bus and UUID of its own, and its addresses in a window
    /// of its own, so a program's pointers of two devices never alias. At
    /// most `ptx::MAX_WINDOWS` devices.
    pub fn numbered(mut self, number: u32) -> Result<Self, String> {
        if number >= cumux_ptx::MAX_WINDOWS {
            return Err(format!(
                "at most {} CPU devices fit in the device address window",
                cumux_ptx::MAX_WINDOWS
            ));
        }
        let pci = [0, 0xc0 + number, 0];
        self.info.ordinal = number;
        self.info.pci = pci;
        self.info.uuid[15] ^= number as u8;
        self.info.attributes = cpu_device_attributes(AttributeInputs {
            multiprocessors: self.multiprocessors(),
            pci,
        });
        self.number = number;
        Ok(self)
    }

    /// The same device as the server's device `ordinal`, its addresses in
    /// the window it was numbered with.
    pub fn with_ordinal(mut self, ordinal: u32) -> Self {
        self.info.ordinal = ordinal;
        self
    }
}

impl CpuContext {
    /// Brings the budget in line with this context's memory after a change.
    fn settle(&self) {
        let now = self.mem.used();
        let before = self.charged.swap(now, Ordering::AcqRel);
        if now >= before {
            self.budget.used.fetch_add(now - before, Ordering::AcqRel);
        } else {
            self.budget.release(before - now);
        }
    }

    fn program(&self, module: ModuleId) -> Option<Arc<Program>> {
        let modules = lock(&self.modules);
        modules.loaded.get(&module).cloned()
    }
}

/// A stable uuid per host, marked as cumux's (version nibble 8, "custom").
/// One multiprocessor per host core.
fn host_cores() -> i32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    i32::try_from(cores).unwrap_or(i32::MAX)
}

fn device_uuid(host: &str) -> [u8; 16] {
    let mut uuid = *b"cumux-cpu-device";
    for (i, b) in host.bytes().enumerate() {
        uuid[i % 16] ^= b.rotate_left((i / 16) as u32);
    }
    uuid[6] = (uuid[6] & 0x0f) | 0x80;
    uuid
}

/// `CU_LIMIT_MALLOC_HEAP_SIZE`.
const MALLOC_HEAP_LIMIT: u32 = 2;
/// `CU_LIMIT_PRINTF_FIFO_SIZE`.
const PRINTF_FIFO_LIMIT: u32 = 1;

/// The largest printf FIFO a context may ask for: its text is held in the
/// server's memory until the launch ends.
pub const MAX_PRINTF_FIFO: u64 = 256 << 20;

/// The largest malloc heap a context may ask for: the heap is host memory
/// outside the tenant's allocations (charged to the device's budget once a
/// kernel made it), so it stays bounded, like a launch's own memory.
pub const MAX_MALLOC_HEAP: u64 = 1 << 30;

/// The device's compute capability as one number (75 for 7.5).
fn device_sm() -> u32 {
    let (major, minor) = COMPUTE_CAPABILITY;
    (major * 10 + minor) as u32
}

/// The PTX text inside a module image, or the error the driver would give. Of
/// a fat binary's PTX, the one the device's compute capability runs, as the
/// driver picks it (else the lowest newer one, whose features the
/// interpreter handles).
pub fn ptx_of_image(image: &[u8]) -> Result<String, CuError> {
    match cumux_fatbin::classify(image) {
        Classified::Fatbin => {
            let images = cumux_fatbin::images(image).map_err(|e| {
                CuError::new(codes::INVALID_IMAGE, format!("malformed fat binary: {e}"))
            })?;
            if !images.iter().any(|i| i.kind == ImageKind::Ptx) {
                let archs: Vec<String> = images.iter().map(|i| format!("sm_{}", i.sm)).collect();
                return Err(CuError::new(
                    codes::NO_BINARY_FOR_GPU,
                    format!(
                        "the fat binary holds only cubins ({}) and no PTX; the CPU device runs PTX \
                         (build with -gencode arch=compute_XX,code=compute_XX)",
                        archs.join(", ")
                    ),
                ));
            }
            cumux_fatbin::ptx_for(image, device_sm()).ok_or_else(|| {
                CuError::new(codes::INVALID_PTX, "the fat binary's PTX is not UTF-8")
            })
        }
        Classified::Ptx => {
            let end = image.iter().position(|b| *b == 0).unwrap_or(image.len());
            String::from_utf8(image[..end].to_vec())
                .map_err(|_| CuError::new(codes::INVALID_PTX, "PTX text is not UTF-8"))
        }
        Classified::Elf => Err(CuError::new(
            codes::NO_BINARY_FOR_GPU,
            "a cubin (ELF) image cannot run on the CPU device, which needs PTX",
        )),
        Classified::FatbinWrapper => Err(CuError::new(
            codes::INVALID_IMAGE,
            "a fat binary wrapper reached the server; the client must send the fat binary itself",
        )),
        Classified::Unknown => Err(CuError::new(
            codes::INVALID_IMAGE,
            "the image is neither a fat binary, a cubin nor PTX text",
        )),
    }
}

impl Device for CpuDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_used(&self) -> u64 {
        self.budget.used.load(Ordering::Acquire)
    }

    fn mem_total(&self) -> u64 {
        self.budget.capacity
    }

    fn create_context(&self) -> Result<Arc<dyn DeviceContext>, CuError> {
        self.context_in_window(self.number)
    }

    fn movable(&self) -> Option<&dyn MovableDevice> {
        Some(self)
    }
}

impl MovableDevice for CpuDevice {
    /// A context has an address space of its own, so one in another
    /// device's window aliases nobody: the window only keeps one program's
    /// devices apart, and a moved session's program is on one device.
    fn create_context_in_window(&self, window: u32) -> Result<Arc<dyn DeviceContext>, CuError> {
        self.context_in_window(window)
    }
}

impl CpuDevice {
    fn context_in_window(&self, window: u32) -> Result<Arc<dyn DeviceContext>, CuError> {
        let mem = DeviceMemory::numbered(self.budget.capacity, window)
            .ok_or_else(|| CuError::new(codes::INVALID_DEVICE, "no address window"))?;
        Ok(Arc::new(CpuContext {
            start_heap: mem.heap_limit(),
            refused_shrinks: RefusedShrinks::default(),
            mem,
            window,
            launch_budget: self.launch_budget,
            threads: self.threads,
            cancelled: AtomicBool::new(false),
            printf_fifo: AtomicU64::new(DEFAULT_PRINTF_FIFO as u64),
            budget: Arc::clone(&self.budget),
            charged: AtomicU64::new(0),
            modules: Mutex::new(Modules {
                next: 1,
                ..Modules::default()
            }),
            host_regions: Mutex::default(),
        }))
    }
}

impl Drop for CpuContext {
    fn drop(&mut self) {
        self.budget.release(*self.charged.get_mut());
    }
}

impl DeviceContext for CpuContext {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn movable(&self) -> Option<&dyn MovableContext> {
        Some(self)
    }

    fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, CuError> {
        let oom = || {
            CuError::new(
                codes::OUT_OF_MEMORY,
                format!("cannot allocate {bytes} bytes: device memory is full"),
            )
        };
        // Hold the bytes against other contexts while allocating.
        if !self.budget.reserve(bytes) {
            return Err(oom());
        }
        let result = self.mem.alloc(bytes).map_err(mem_err);
        self.budget.release(bytes);
        self.settle();
        result
    }

    fn mem_free(&self, ptr: DevicePtr, _bytes: u64) -> Result<(), CuError> {
        let result = self.mem.free(ptr).map_err(mem_err);
        self.settle();
        result
    }

    fn mem_read(&self, src: DevicePtr, buf: &mut [u8]) -> Result<(), CuError> {
        self.mem.read(src, buf).map_err(mem_err)
    }

    fn mem_write(&self, dst: DevicePtr, data: &[u8]) -> Result<(), CuError> {
        self.mem.write(dst, data).map_err(mem_err)
    }

    fn mem_write_filled(
        &self,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> Result<(), CuError> {
        let filled = self
            .mem
            .write_with(dst, len as u64, fill)
            .map_err(mem_err)?;
        filled.map_err(socket_bytes::not_arrived)?;
        socket_bytes::count_in_place(len);
        Ok(())
    }

    fn mem_read_sent(
        &self,
        src: DevicePtr,
        len: usize,
        send: &mut dyn SendBytes,
    ) -> Result<(), CuError> {
        let sent = self
            .mem
            .read_with(src, len as u64, |piece| send.send(piece))
            .map_err(mem_err)?;
        sent.map_err(socket_bytes::not_sent)?;
        socket_bytes::count_in_place(len);
        Ok(())
    }

    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), CuError> {
        self.mem.copy(dst, src, bytes).map_err(mem_err)
    }

    fn mem_fill(&self, dst: DevicePtr, pattern: &[u8], count: u64) -> Result<(), CuError> {
        self.mem.fill(dst, pattern, count).map_err(mem_err)
    }

    fn module_load(&self, image: &[u8]) -> Result<LoadedModule, CuError> {
        self.load_placed(image, None)
    }

    fn module_unload(&self, module: ModuleId) {
        let program = lock(&self.modules).loaded.remove(&module);
        match program.map(Arc::try_unwrap) {
            Some(Ok(program)) => program.unload(&self.mem),
            // A launch still holds it (the session syncs before unloading, so
            // this is a bug): free the globals; the code goes with the last Arc.
            Some(Err(shared)) => {
                tracing::error!(module, "module unloaded while a launch holds it");
                for g in shared.globals() {
                    let _ = self.mem.free(g.ptr);
                }
            }
            None => {}
        }
        self.settle();
    }

    /// The printf FIFO and the malloc heap, from their values at the start
    /// ([`CpuContext::set_own_limit`]); other limits are met as they are.
    fn apply_limit(&self, limit: u32, setting: LimitSetting) -> Result<(), CuError> {
        let (current, start) = match limit {
            PRINTF_FIFO_LIMIT => (
                self.printf_fifo.load(Ordering::Relaxed),
                DEFAULT_PRINTF_FIFO as u64,
            ),
            MALLOC_HEAP_LIMIT => (self.mem.heap_limit(), self.start_heap),
            _ => return Ok(()),
        };
        let refused = &self.refused_shrinks;
        limits::apply(limit, setting, (current, Some(start)), refused, |value| {
            self.set_own_limit(limit, value)
        })
    }

    fn reset_limits(&self) -> Result<(), CuError> {
        let fifo = self.apply_limit(PRINTF_FIFO_LIMIT, LimitSetting::AtLeastStart(0));
        fifo.and(self.apply_limit(MALLOC_HEAP_LIMIT, LimitSetting::AtLeastStart(0)))
    }

    fn launch(&self, launch: &KernelLaunch) -> LaunchOutcome {
        self.run(launch)
    }

    fn cancel_launches(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Kernels, memsets and copies reach a pinned region at the program's
    /// own address, as a GPU with unified addressing does: its pages (this
    /// process's mapping of the client's memfd, the same pages as the
    /// program's) are placed there in the context's memory. Where something
    /// is there already it serves copies only.
    fn host_register(&self, region: HostRegion<'_>) -> Result<bool, CuError> {
        let pages = Arc::new(PinnedPages(Arc::clone(region.mapping)));
        match self.mem.map_host(region.client_base, pages) {
            Ok(()) => {
                lock(&self.host_regions).insert(region.id, region.client_base);
                Ok(true)
            }
            Err(e) => {
                tracing::debug!(
                    region = region.id,
                    "a pinned region kernels cannot reach: {e}"
                );
                Ok(false)
            }
        }
    }

    fn host_unregister(&self, region: Handle) {
        if let Some(at) = lock(&self.host_regions).remove(&region) {
            let _ = self.mem.unmap_host(at);
        }
    }

    /// Emulated in the context's own address space: a reservation is a range
    /// of it, physical memory is host memory, and mappings of it sit side by
    /// side, so kernels and copies run across them. Access is not enforced
    /// by the device (the session refuses copies without it; a kernel may
    /// still touch a mapping whose access was never set).
    fn vmm(&self, op: &VmmOp) -> Result<u64, CuError> {
        self.vmm_op(op)
    }

    /// A handle naming the allocation at `base` for a context of another
    /// program on this server (its server process: the in-process CPU
    /// devices, or one worker process's).
    fn ipc_export(&self, base: DevicePtr) -> Result<Vec<u8>, CuError> {
        let shared = self.mem.share(base).map_err(mem_err)?;
        OPENABLE.issue(shared)
    }

    /// Opens another context's allocation at a new address of this one. Its
    /// bytes stay the exporter's (charged to it); an allocation freed since
    /// opens nothing.
    fn ipc_open(&self, handle: &[u8], _flags: u32) -> Result<(DevicePtr, u64), CuError> {
        let shared = OPENABLE.find(handle).ok_or_else(|| {
            CuError::new(
                codes::INVALID_VALUE,
                "the handle names no live allocation of a CPU device in this process",
            )
        })?;
        let base = self.mem.open_shared(&shared).map_err(|e| match e {
            MemError::OutOfMemory => mem_err(e),
            _ => CuError::new(codes::INVALID_VALUE, "the handle's allocation was freed"),
        })?;
        Ok((base, shared.size()))
    }

    fn ipc_close(&self, base: DevicePtr) -> Result<(), CuError> {
        self.mem.close_shared(base).map_err(mem_err)
    }

    /// A physical allocation made shareable, as a file descriptor another
    /// program imports: a sealed memfd holding the handle that names it
    /// ([`OPENABLE`]); it maps nothing, as the driver's descriptors are
    /// only passed on.
    fn vmm_export(&self, physical: u64) -> Result<OwnedFd, CuError> {
        let shared = self.mem.share_physical(physical).map_err(mem_err)?;
        let handle = OPENABLE.issue(shared)?;
        let os = |e: std::io::Error| {
            CuError::new(
                codes::OUT_OF_MEMORY,
                format!("no descriptor for the allocation: {e}"),
            )
        };
        let file = cumux_protocol::memfd::create_sealed(c"cumux-cpu-physical", handle.len() as u64)
            .map_err(os)?;
        file.write_all_at(&handle, 0).map_err(os)?;
        Ok(OwnedFd::from(file))
    }

    /// Imports what [`CpuContext::vmm_export`] gave (another context's
    /// physical allocation, still allocated): its id here.
    fn vmm_import(&self, fd: BorrowedFd<'_>) -> Result<u64, CuError> {
        let refused = |why: &str| {
            CuError::new(
                codes::INVALID_VALUE,
                format!("not a CPU device's shareable allocation: {why}"),
            )
        };
        let file = std::fs::File::from(
            fd.try_clone_to_owned()
                .map_err(|e| refused(&e.to_string()))?,
        );
        let mut handle = [0u8; cumux_protocol::IPC_HANDLE_BYTES];
        file.read_exact_at(&mut handle, 0)
            .map_err(|e| refused(&e.to_string()))?;
        let shared = OPENABLE
            .find(&handle)
            .ok_or_else(|| refused("it names no live allocation in this process"))?;
        self.mem
            .import_physical(&shared)
            .map_err(|_| refused("the allocation was released"))
    }
}

/// The allocations of this process's CPU-device contexts that were given a
/// handle (`cuIpcGetMemHandle`). One table for the process, so that a context
/// of any CPU device here may open a handle, as the driver lets a context
/// open memory of a peer device.
static OPENABLE: std::sync::LazyLock<HandleTable<SharedAllocation>> =
    std::sync::LazyLock::new(HandleTable::default);

/// A pinned region's pages in this process, as the CPU device's kernels
/// reach them.
struct PinnedPages(Arc<HostMapping>);

// SAFETY: a `HostMapping` stays mapped at one place, readable and writable,
// until it drops, which this `Arc` holds off; the program writes the same
// pages, as a GPU's kernels and its host share pinned memory.
unsafe impl HostBytes for PinnedPages {
    fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }
    fn size(&self) -> u64 {
        self.0.len() as u64
    }
}

impl MovableContext for CpuContext {
    fn window(&self) -> u32 {
        self.window
    }

    fn alloc_at(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError> {
        if !self.budget.reserve(bytes) {
            return Err(CuError::new(
                codes::OUT_OF_MEMORY,
                format!("cannot allocate {bytes} bytes at {ptr:#x}: device memory is full"),
            ));
        }
        let result = self.mem.alloc_at(ptr, bytes).map_err(mem_err);
        self.budget.release(bytes);
        self.settle();
        result
    }

    fn module_blocks(&self, module: ModuleId) -> Vec<DevicePtr> {
        self.program(module)
            .map(|p| p.allocations().to_vec())
            .unwrap_or_default()
    }

    /// No blocks: a module from a GPU, whose driver placed its memory itself
    /// (its globals land where this device puts them, aliased by the session).
    fn module_load_at(&self, image: &[u8], blocks: &[DevicePtr]) -> Result<LoadedModule, CuError> {
        self.load_placed(image, (!blocks.is_empty()).then_some(blocks))
    }

    /// The malloc heap's blocks are the program's (pointers to them live in
    /// its memory) and no image carries them yet.
    fn unmovable(&self) -> Option<String> {
        self.mem
            .heap_in_use()
            .then(|| "its kernels used the device malloc heap (malloc or new in a kernel)".into())
    }

    fn limits(&self) -> Vec<(u32, u64)> {
        vec![
            (MALLOC_HEAP_LIMIT, self.mem.heap_limit()),
            (PRINTF_FIFO_LIMIT, self.printf_fifo.load(Ordering::Relaxed)),
        ]
    }
}

impl CpuContext {
    /// Sets the printf FIFO or the malloc heap to `value`: past
    /// [`MAX_PRINTF_FIFO`] or [`MAX_MALLOC_HEAP`] refused, and the heap's size
    /// once a kernel of this context used the heap, as the driver refuses it.
    fn set_own_limit(&self, limit: u32, value: u64) -> Result<(), CuError> {
        if limit == PRINTF_FIFO_LIMIT {
            if value > MAX_PRINTF_FIFO {
                return Err(CuError::new(
                    codes::INVALID_VALUE,
                    format!("the CPU device's printf FIFO is at most {MAX_PRINTF_FIFO} bytes"),
                ));
            }
            self.printf_fifo.store(value, Ordering::Relaxed);
            return Ok(());
        }
        if limit != MALLOC_HEAP_LIMIT {
            return Ok(());
        }
        if value > MAX_MALLOC_HEAP {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("the CPU device's malloc heap is at most {MAX_MALLOC_HEAP} bytes"),
            ));
        }
        self.mem.set_heap_limit(value).map_err(|_| {
            CuError::new(
                codes::INVALID_VALUE,
                "the malloc heap's size cannot change once a kernel used the heap",
            )
        })
    }

    /// Loads `image`; with `blocks`, its loading must allocate exactly those
    /// addresses, in order.
    fn load_placed(
        &self,
        image: &[u8],
        blocks: Option<&[DevicePtr]>,
    ) -> Result<LoadedModule, CuError> {
        let ptx = ptx_of_image(image)?;
        if let Some(blocks) = blocks {
            self.mem.place_next(blocks);
        }
        let loaded = catch_unwind(AssertUnwindSafe(|| Program::load(&ptx, &self.mem)));
        let unplaced = blocks.map(|_| self.mem.place_next(&[]));
        let loaded = match (loaded, blocks, unplaced) {
            (Ok(Ok(program)), Some(blocks), Some(left))
                if left != 0 || program.allocations() != blocks =>
            {
                program.unload(&self.mem);
                self.settle();
                return Err(CuError::new(
                    codes::INVALID_IMAGE,
                    "the module's globals did not come back where they were",
                ));
            }
            (loaded, ..) => loaded,
        };
        self.settle();
        let program = loaded
            .map_err(|_| CuError::new(codes::INVALID_PTX, "the PTX loader crashed on this module"))?
            .map_err(|e| CuError::new(e.cu_code(), e.to_string()))?;
        let const_bytes: u64 = program
            .globals()
            .iter()
            .filter(|g| g.space == Space::Const)
            .map(|g| g.size)
            .sum();
        let kernels = program
            .kernels()
            .iter()
            .map(|k| {
                let static_shared = clamp_i32(k.static_shared_bytes.into());
                KernelDesc {
                    name: k.name.clone(),
                    params: k
                        .params
                        .iter()
                        .map(|p| ParamInfo {
                            offset: p.offset,
                            size: p.size,
                        })
                        .collect(),
                    attrs: FunctionAttrs {
                        max_threads_per_block: clamp_i32(k.max_threads_per_block.into()),
                        shared_size_bytes: static_shared,
                        const_size_bytes: clamp_i32(const_bytes),
                        local_size_bytes: clamp_i32(k.local_bytes.into()),
                        num_regs: clamp_i32(registers_reported(k).into()),
                        // the virtual architecture the PTX was built for
                        // (75 for compute_75), as the driver reports it and
                        // CUB reads it (`cub::PtxVersion`), not the ISA's
                        // `.version`; the binary is the device's own
                        ptx_version: clamp_i32(k.target_sm.into()),
                        binary_version: clamp_i32(k.target_sm.max(device_sm()).into()),
                        max_dynamic_shared_size_bytes: (SHARED_PER_BLOCK - static_shared).max(0),
                    },
                }
            })
            .collect();
        let globals = program
            .globals()
            .iter()
            .map(|g| GlobalDesc {
                name: g.name.clone(),
                ptr: g.ptr,
                size: g.size,
            })
            .collect();
        let mut modules = lock(&self.modules);
        let id = modules.next;
        modules.next += 1;
        modules.loaded.insert(id, Arc::new(program));
        Ok(LoadedModule {
            id,
            kernels,
            globals,
        })
    }

    /// Logs, once a kernel, that it runs on the interpreter and why (the
    /// compiler does not take it): the interpreter is many times slower, so
    /// a slow program's log says which kernel to look at.
    fn log_interpreted(&self, module: ModuleId, kernel: usize, program: &Program, name: &str) {
        if program.engine() != Engine::Compiler {
            return;
        }
        let Err(why) = program.compiled(name) else {
            return;
        };
        if lock(&self.modules).interpreted.insert((module, kernel)) {
            tracing::info!(kernel = name, %why, "the kernel runs on the interpreter");
        }
    }

    fn run(&self, launch: &KernelLaunch) -> LaunchOutcome {
        let Some(program) = self.program(launch.module) else {
            return LaunchOutcome::failed(CuError::new(codes::INVALID_HANDLE, "module not loaded"));
        };
        let kernels = program.kernels();
        let Some(name) = kernels.get(launch.kernel).map(|k| k.name.clone()) else {
            return LaunchOutcome::failed(CuError::new(codes::INVALID_HANDLE, "no such kernel"));
        };
        let geometry = &launch.geometry;
        if geometry
            .cluster()
            .is_some_and(|c| c.iter().product::<u32>() > 1)
        {
            return LaunchOutcome::failed(CuError::new(
                codes::NOT_SUPPORTED,
                format!("{name}: the CPU device runs no thread-block clusters"),
            ));
        }
        let config = LaunchConfig {
            grid: geometry.grid,
            block: geometry.block,
            dynamic_shared_bytes: geometry.dynamic_shared_bytes,
        };
        let limits = LaunchLimits {
            per_block: self.launch_budget,
            per_launch: self.launch_budget,
            cancel: Some(&self.cancelled),
            workers: self.threads,
            printf_fifo: self.printf_fifo.load(Ordering::Relaxed) as usize,
        };
        self.log_interpreted(launch.module, launch.kernel, &program, &name);
        let report = if geometry.cooperative() {
            program.launch_cooperative(&self.mem, &name, &config, &launch.params, &limits)
        } else {
            program.launch_with(&self.mem, &name, &config, &launch.params, &limits)
        };
        // a launch may have made the malloc heap
        self.settle();
        LaunchOutcome {
            stdout: report.stdout,
            result: report
                .result
                .map_err(|fault| CuError::new(fault.cu_code(), format!("{name}: {fault}"))),
        }
    }

    fn vmm_op(&self, op: &VmmOp) -> Result<u64, CuError> {
        let result = match *op {
            VmmOp::Granularity { .. } => Ok(cumux_ptx::VMM_GRANULARITY),
            VmmOp::Reserve { size, alignment } => self.mem.reserve(size, alignment),
            // Addresses are never handed out twice: nothing to give back.
            VmmOp::FreeReservation { .. } | VmmOp::SetAccess { .. } => Ok(0),
            VmmOp::Create { size, .. } => {
                if !self.budget.reserve(size) {
                    return Err(CuError::new(
                        codes::OUT_OF_MEMORY,
                        format!("cannot allocate {size} bytes: device memory is full"),
                    ));
                }
                let made = self.mem.create_physical(size);
                self.budget.release(size);
                self.settle();
                made
            }
            VmmOp::Release { physical, .. } => {
                let freed = self.mem.release_physical(physical).map(|()| 0);
                self.settle();
                freed
            }
            VmmOp::Map {
                ptr,
                size,
                physical,
            } => self.mem.map(ptr, size, physical).map(|()| 0),
            VmmOp::Unmap { ptr, .. } => self.mem.unmap(ptr).map(|()| 0),
            // The CPU device compresses nothing: asked, it grants no compression.
            VmmOp::Compressed { .. } => Ok(0),
        };
        result.map_err(mem_err)
    }
}

/// Registers a block may hold on the CPU device, as the attributes say
/// (`MAX_REGISTERS_PER_BLOCK`, `MAX_REGISTERS_PER_MULTIPROCESSOR`).
const REGISTERS_PER_BLOCK: u32 = 65536;

/// The registers a thread of `kernel` is said to use: its PTX registers,
/// which are virtual (one per value) and may be thousands, capped where its
/// largest block still fits, as a GPU's compiler caps them. The CPU device
/// has no register file to run out of; counted in full, the occupancy API
/// said no block of a large kernel fits, and a cooperative launch of the
/// grid it sized (0 blocks) failed.
fn registers_reported(kernel: &KernelInfo) -> u32 {
    let threads = kernel.max_threads_per_block.clamp(1, REGISTERS_PER_BLOCK);
    kernel.num_regs.min(REGISTERS_PER_BLOCK / threads)
}

fn clamp_i32(v: u64) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_that_are_not_ptx_are_refused_with_the_drivers_codes() {
        let elf = [0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
        assert_eq!(
            ptx_of_image(&elf).unwrap_err().code,
            codes::NO_BINARY_FOR_GPU
        );
        assert_eq!(
            ptx_of_image(b"garbage").unwrap_err().code,
            codes::INVALID_IMAGE
        );
        let ptx = ptx_of_image(b"//\n.version 9.0\n.target sm_75\n\0\0").unwrap();
        assert!(ptx.ends_with("sm_75\n"));
    }

    #[test]
    fn a_kernels_registers_leave_its_largest_block_room() {
        // 400 values live at once: 400 virtual registers
        let mut body = String::new();
        for i in 1..=400 {
            body.push_str(&format!("    add.u32 %r{i}, %r{}, {i};\n", i - 1));
        }
        let mut sum = String::new();
        for i in 1..=400 {
            sum.push_str(&format!("    add.u32 %r0, %r0, %r{i};\n"));
        }
        let ptx = format!(
            ".version 7.5\n.target sm_75\n.address_size 64\n\
             .visible .entry big(.param .u64 out)\n{{\n    .reg .b32 %r<401>;\n    .reg .b64 %rd<2>;\n\
             ld.param.u64 %rd1, [out];\n    mov.u32 %r0, %tid.x;\n{body}{sum}    st.global.u32 [%rd1], %r0;\n    ret;\n}}\n"
        );
        let device = CpuDevice::new(1 << 30);
        let ctx = device.create_context().unwrap();
        let mut image = ptx.into_bytes();
        image.push(0);
        let module = ctx.module_load(&image).unwrap();
        let regs = module.kernels[0].attrs.num_regs;
        let threads = module.kernels[0].attrs.max_threads_per_block;
        assert!(regs > 0, "{regs} registers");
        assert!(
            regs * threads <= REGISTERS_PER_BLOCK as i32,
            "{regs} registers × {threads} threads"
        );
    }

    #[test]
    fn the_malloc_heap_limit_is_kept_up_to_its_bound() {
        let device = CpuDevice::new(1 << 30);
        let ctx = device.create_context().unwrap();
        ctx.set_limit(MALLOC_HEAP_LIMIT, 16 << 20).unwrap();
        let cpu = ctx.as_any().downcast_ref::<CpuContext>().unwrap();
        assert_eq!(cpu.mem.heap_limit(), 16 << 20);
        let too_big = ctx.set_limit(MALLOC_HEAP_LIMIT, MAX_MALLOC_HEAP + 1);
        assert_eq!(too_big.unwrap_err().code, codes::INVALID_VALUE);
        // other limits are the client's to keep
        ctx.set_limit(0, 1 << 40).unwrap();
    }

    #[test]
    fn the_printf_fifo_is_kept_up_to_its_bound() {
        let device = CpuDevice::new(1 << 30);
        let ctx = device.create_context().unwrap();
        ctx.set_limit(PRINTF_FIFO_LIMIT, 6 << 20).unwrap();
        let movable = ctx.movable().unwrap();
        assert!(movable.limits().contains(&(PRINTF_FIFO_LIMIT, 6 << 20)));
        let too_big = ctx.set_limit(PRINTF_FIFO_LIMIT, MAX_PRINTF_FIFO + 1);
        assert_eq!(too_big.unwrap_err().code, codes::INVALID_VALUE);
        assert!(movable.limits().contains(&(PRINTF_FIFO_LIMIT, 6 << 20)));
    }
}
