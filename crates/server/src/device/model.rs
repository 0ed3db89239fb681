//! A model device for tests: plain host memory and a handful of built-in kernels
//! with known behaviour (sleep, scale-add, print, fault, panic), so sessions,
//! streams and events are tested deterministically without the PTX interpreter.
//!
//! A model image is text: `model:KERNEL,KERNEL…[;GLOBAL:BYTES,…]`. Kernels:
//! `scale_add(u64 ptr, u32 mul, u32 add, u32 sleep_ms)` does `*ptr = *ptr*mul+add`
//! on a u32 after sleeping; `print(u32 n)` prints `model n`; `fault` fails with
//! an illegal address; `panic` panics.
//!
//! [`ModelDevice::serial`] runs one launch at a time, in the order launches reach
//! the device, like a GPU's hardware queue: the device the scheduler tests use.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cumux_protocol::{codes, CuError, DeviceInfo, DevicePtr, FunctionAttrs, ParamInfo};

use super::attributes::{cpu_device_attributes, AttributeInputs};
use super::{
    Device, DeviceContext, GlobalDesc, KernelDesc, KernelLaunch, LaunchOutcome, LoadedModule,
    ModuleId, VmmOp, VMM_GRANULARITY,
};
use crate::locking::{lock, wait};

const BASE: u64 = 0x7f00_0000_0000;
const ALIGN: u64 = 256;

/// The model device. All its contexts share one address space (the model is
/// for testing the server, not for isolating kernels).
pub struct ModelDevice {
    info: DeviceInfo,
    shared: Arc<ModelMemory>,
}

/// Memory, modules and kernels of the model, shared by its contexts.
pub struct ModelMemory {
    capacity: u64,
    state: Mutex<State>,
    /// `Some` on a serial device: launches take turns, first come first served.
    turns: Option<Turns>,
}

/// A ticket lock: launches run one at a time in arrival order.
#[derive(Default)]
struct Turns {
    /// (next ticket to hand out, ticket now served)
    tickets: Mutex<(u64, u64)>,
    next: Condvar,
}

impl Turns {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, u64)> {
        lock(&self.tickets)
    }

    fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        let mut t = self.lock();
        let mine = t.0;
        t.0 += 1;
        while t.1 != mine {
            t = wait(&self.next, t);
        }
        drop(t);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        self.lock().1 += 1;
        self.next.notify_all();
        result.unwrap_or_else(|p| std::panic::resume_unwind(p))
    }
}

#[derive(Default)]
struct State {
    next: u64,
    used: u64,
    allocations: BTreeMap<DevicePtr, Vec<u8>>,
    modules: HashMap<ModuleId, Vec<String>>,
    module_globals: HashMap<ModuleId, Vec<DevicePtr>>,
    next_module: ModuleId,
    /// Physical allocations not mapped now, by id ([`VmmOp::Create`]).
    physical: HashMap<u64, Vec<u8>>,
    /// Mapped physical allocations: their bytes sit in `allocations` at the
    /// mapping's address, which names the id here.
    mapped: HashMap<DevicePtr, u64>,
    next_physical: u64,
}

impl State {
    /// The allocation holding `[ptr, ptr+len)`, with the offset of `ptr` in it.
    fn locate(&mut self, ptr: DevicePtr, len: u64) -> Option<(&mut Vec<u8>, usize)> {
        let (base, block) = self.allocations.range_mut(..=ptr).next_back()?;
        let offset = ptr - base;
        let end = offset.checked_add(len)?;
        (end <= block.len() as u64).then_some((block, offset as usize))
    }

    /// The blocks holding `[ptr, ptr+len)`, side by side (mappings next to
    /// each other): (base, offset in the block, bytes) each.
    fn spans(&self, ptr: DevicePtr, len: u64) -> Option<Vec<(DevicePtr, usize, usize)>> {
        let mut out = Vec::new();
        let mut done = 0u64;
        while done < len {
            let at = ptr.checked_add(done)?;
            let (base, block) = self.allocations.range(..=at).next_back()?;
            let offset = at - base;
            let n = (block.len() as u64)
                .checked_sub(offset)
                .filter(|n| *n > 0)?;
            let n = n.min(len - done);
            out.push((*base, offset as usize, n as usize));
            done += n;
        }
        Some(out)
    }

    /// A virtual memory operation, emulated: a physical allocation's bytes
    /// move into the address space where it is mapped and out again. One
    /// mapping of a whole physical allocation at a time (what XLA and
    /// PyTorch's expandable segments do); anything else is not supported.
    fn vmm(&mut self, op: &VmmOp, capacity: u64) -> Result<u64, CuError> {
        let invalid =
            |why: &str| CuError::new(codes::INVALID_VALUE, format!("model device: {why}"));
        match *op {
            VmmOp::Granularity { .. } => Ok(VMM_GRANULARITY),
            VmmOp::Reserve { size, alignment } => {
                let align = alignment.max(VMM_GRANULARITY);
                let start = self.next.checked_next_multiple_of(align);
                let end = size
                    .checked_next_multiple_of(VMM_GRANULARITY)
                    .zip(start)
                    .and_then(|(size, start)| start.checked_add(size));
                let (Some(start), Some(end)) = (start, end) else {
                    return Err(CuError::new(
                        codes::OUT_OF_MEMORY,
                        "model device: no addresses left",
                    ));
                };
                self.next = end;
                Ok(start)
            }
            VmmOp::FreeReservation { .. } | VmmOp::SetAccess { .. } => Ok(0),
            VmmOp::Compressed { .. } => Ok(0),
            VmmOp::Create { size, .. } => {
                let len = usize::try_from(size)
                    .ok()
                    .filter(|_| size > 0 && self.used.saturating_add(size) <= capacity);
                let len = len.ok_or_else(|| {
                    CuError::new(codes::OUT_OF_MEMORY, "model device: out of memory")
                })?;
                let id = self.next_physical;
                self.next_physical += 1;
                self.used += size;
                self.physical.insert(id, vec![0; len]);
                Ok(id)
            }
            VmmOp::Release { physical, .. } => {
                let bytes = self
                    .physical
                    .remove(&physical)
                    .ok_or_else(|| invalid("not an unmapped physical allocation"))?;
                self.used -= bytes.len() as u64;
                Ok(0)
            }
            VmmOp::Map {
                ptr,
                size,
                physical,
            } => {
                if self.mapped.values().any(|id| *id == physical) {
                    return Err(CuError::new(
                        codes::NOT_SUPPORTED,
                        "model device: a physical allocation is mapped at one place at a time",
                    ));
                }
                let whole = self.physical.get(&physical).map(|b| b.len() as u64);
                match whole {
                    None => return Err(invalid("no such physical allocation")),
                    Some(len) if len != size => {
                        return Err(CuError::new(
                            codes::NOT_SUPPORTED,
                            "model device: only whole physical allocations are mapped",
                        ))
                    }
                    Some(_) => {}
                }
                if self.spans(ptr, 1).is_some()
                    || self
                        .allocations
                        .range(ptr..ptr.saturating_add(size))
                        .next()
                        .is_some()
                {
                    return Err(invalid("the range is taken"));
                }
                let bytes = self.physical.remove(&physical).unwrap_or_default();
                self.allocations.insert(ptr, bytes);
                self.mapped.insert(ptr, physical);
                Ok(0)
            }
            VmmOp::Unmap { ptr, .. } => {
                let physical = self
                    .mapped
                    .remove(&ptr)
                    .ok_or_else(|| invalid("not a mapping"))?;
                let bytes = self.allocations.remove(&ptr).unwrap_or_default();
                self.physical.insert(physical, bytes);
                Ok(0)
            }
        }
    }
}

fn illegal(ptr: DevicePtr) -> CuError {
    CuError::new(
        codes::ILLEGAL_ADDRESS,
        format!("model device: bad address {ptr:#x}"),
    )
}

impl ModelDevice {
    /// A model whose launches run side by side.
    pub fn new(capacity: u64) -> Self {
        Self::build(capacity, false)
    }

    /// A model that runs one launch at a time, in arrival order.
    pub fn serial(capacity: u64) -> Self {
        Self::build(capacity, true)
    }

    /// The same model, said to reach `peers`' memory (server ordinals, with
    /// their peer attributes), as a GPU of an NVLink machine is.
    pub fn with_peers(mut self, peers: Vec<(u32, [i32; 4])>) -> Self {
        self.info.peers = peers;
        self
    }

    fn build(capacity: u64, serial: bool) -> Self {
        let pci = [0, 0x42, 0];
        ModelDevice {
            info: DeviceInfo {
                ordinal: 0,
                name: "cumux model device".into(),
                uuid: *b"cumux-model-dev!",
                pci,
                total_mem: capacity,
                attributes: cpu_device_attributes(AttributeInputs {
                    multiprocessors: 2,
                    pci,
                }),
                backend: "model".into(),
                peers: Vec::new(),
                vmm_granularity: None,
            },
            shared: Arc::new(ModelMemory {
                capacity,
                state: Mutex::new(State {
                    next: BASE,
                    next_module: 1,
                    ..State::default()
                }),
                turns: serial.then(Turns::default),
            }),
        }
    }
}

impl ModelMemory {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn kernel_desc(name: &str) -> Option<KernelDesc> {
        let params: &[(u32, u32)] = match name {
            "scale_add" => &[(0, 8), (8, 4), (12, 4), (16, 4)],
            "print" => &[(0, 4)],
            "fault" | "panic" => &[],
            _ => return None,
        };
        Some(KernelDesc {
            name: name.to_string(),
            params: params
                .iter()
                .map(|&(offset, size)| ParamInfo { offset, size })
                .collect(),
            attrs: FunctionAttrs {
                max_threads_per_block: 1024,
                ptx_version: 90,
                binary_version: 75,
                max_dynamic_shared_size_bytes: 48 << 10,
                ..FunctionAttrs::default()
            },
        })
    }

    fn scale_add(&self, params: &[u8]) -> Result<(), CuError> {
        let word = |at: usize| -> u32 {
            params
                .get(at..at + 4)
                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let ptr = u64::from(word(0)) | (u64::from(word(4)) << 32);
        std::thread::sleep(Duration::from_millis(u64::from(word(16))));
        let mut state = self.lock();
        let (block, at) = state.locate(ptr, 4).ok_or_else(|| illegal(ptr))?;
        let cell = &mut block[at..at + 4];
        let old = u32::from_le_bytes([cell[0], cell[1], cell[2], cell[3]]);
        let new = old.wrapping_mul(word(8)).wrapping_add(word(12));
        cell.copy_from_slice(&new.to_le_bytes());
        Ok(())
    }
}

impl Device for ModelDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn mem_used(&self) -> u64 {
        self.shared.lock().used
    }

    fn create_context(&self) -> Result<Arc<dyn DeviceContext>, CuError> {
        Ok(Arc::clone(&self.shared) as Arc<dyn DeviceContext>)
    }
}

impl DeviceContext for ModelMemory {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn mem_alloc(&self, bytes: u64) -> Result<DevicePtr, CuError> {
        let mut state = self.lock();
        let oom = || CuError::new(codes::OUT_OF_MEMORY, "model device: out of memory");
        if bytes == 0 || state.used.saturating_add(bytes) > self.capacity {
            return Err(oom());
        }
        let ptr = state.next;
        let len = usize::try_from(bytes).map_err(|_| oom())?;
        state.next = ptr + bytes.div_ceil(ALIGN) * ALIGN;
        state.used += bytes;
        state.allocations.insert(ptr, vec![0; len]);
        Ok(ptr)
    }

    fn mem_free(&self, ptr: DevicePtr, _bytes: u64) -> Result<(), CuError> {
        let mut state = self.lock();
        if state.mapped.contains_key(&ptr) {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                "model device: a mapping, not an allocation",
            ));
        }
        let block = state
            .allocations
            .remove(&ptr)
            .ok_or_else(|| CuError::new(codes::INVALID_VALUE, "model device: not an allocation"))?;
        state.used -= block.len() as u64;
        Ok(())
    }

    fn mem_read(&self, src: DevicePtr, buf: &mut [u8]) -> Result<(), CuError> {
        let state = self.lock();
        let spans = state
            .spans(src, buf.len() as u64)
            .ok_or_else(|| illegal(src))?;
        let mut done = 0;
        for (base, at, n) in spans {
            if let Some(block) = state.allocations.get(&base) {
                buf[done..done + n].copy_from_slice(&block[at..at + n]);
            }
            done += n;
        }
        Ok(())
    }

    fn mem_write(&self, dst: DevicePtr, data: &[u8]) -> Result<(), CuError> {
        let mut state = self.lock();
        let spans = state
            .spans(dst, data.len() as u64)
            .ok_or_else(|| illegal(dst))?;
        let mut done = 0;
        for (base, at, n) in spans {
            if let Some(block) = state.allocations.get_mut(&base) {
                block[at..at + n].copy_from_slice(&data[done..done + n]);
            }
            done += n;
        }
        Ok(())
    }

    fn mem_copy(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), CuError> {
        let mut buf = vec![0; usize::try_from(bytes).map_err(|_| illegal(src))?];
        self.mem_read(src, &mut buf)?;
        self.mem_write(dst, &buf)
    }

    fn mem_fill(&self, dst: DevicePtr, pattern: &[u8], count: u64) -> Result<(), CuError> {
        let len = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(pattern.len()))
            .ok_or_else(|| illegal(dst))?;
        let data: Vec<u8> = pattern.iter().copied().cycle().take(len).collect();
        self.mem_write(dst, &data)
    }

    fn module_load(&self, image: &[u8]) -> Result<LoadedModule, CuError> {
        let bad = || CuError::new(codes::INVALID_IMAGE, "not a model image");
        let text = std::str::from_utf8(image).map_err(|_| bad())?;
        let text = text
            .trim_end_matches('\0')
            .strip_prefix("model:")
            .ok_or_else(bad)?;
        let (kernel_list, global_list) = text.split_once(';').unwrap_or((text, ""));
        let kernels = kernel_list
            .split(',')
            .filter(|k| !k.is_empty())
            .map(|k| Self::kernel_desc(k).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()?;
        // The whole list is read before anything is allocated, and a failed
        // allocation gives back the ones before it: a refused image holds no memory.
        let sizes = global_list
            .split(',')
            .filter(|g| !g.is_empty())
            .map(|entry| {
                let (name, size) = entry.split_once(':')?;
                Some((name, size.parse::<u64>().ok()?))
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        let mut globals: Vec<GlobalDesc> = Vec::new();
        for (name, size) in sizes {
            let ptr = self.mem_alloc(size).inspect_err(|_| {
                for g in &globals {
                    let _ = self.mem_free(g.ptr, g.size);
                }
            })?;
            globals.push(GlobalDesc {
                name: name.to_string(),
                ptr,
                size,
            });
        }
        let mut state = self.lock();
        let id = state.next_module;
        state.next_module += 1;
        state
            .modules
            .insert(id, kernels.iter().map(|k| k.name.clone()).collect());
        state
            .module_globals
            .insert(id, globals.iter().map(|g| g.ptr).collect());
        Ok(LoadedModule {
            id,
            kernels,
            globals,
        })
    }

    fn module_unload(&self, module: ModuleId) {
        let globals = {
            let mut state = self.lock();
            state.modules.remove(&module);
            state.module_globals.remove(&module).unwrap_or_default()
        };
        for ptr in globals {
            let _ = self.mem_free(ptr, 0);
        }
    }

    fn vmm(&self, op: &VmmOp) -> Result<u64, CuError> {
        self.lock().vmm(op, self.capacity)
    }

    fn launch(&self, launch: &KernelLaunch) -> LaunchOutcome {
        let run = || self.run_kernel(launch.module, launch.kernel, &launch.params);
        match &self.turns {
            Some(turns) => turns.run(run),
            None => run(),
        }
    }
}

impl ModelMemory {
    fn run_kernel(&self, module: ModuleId, kernel: usize, params: &[u8]) -> LaunchOutcome {
        let name = self
            .lock()
            .modules
            .get(&module)
            .and_then(|k| k.get(kernel).cloned());
        let mut stdout = Vec::new();
        let result = match name.as_deref() {
            Some("scale_add") => self.scale_add(params),
            Some("print") => {
                let n = params
                    .get(..4)
                    .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                stdout.extend_from_slice(format!("model {n}\n").as_bytes());
                Ok(())
            }
            Some("fault") => Err(illegal(0)),
            Some("panic") => panic!("model device: the panic kernel ran"),
            _ => Err(CuError::new(
                codes::INVALID_HANDLE,
                "model device: no such kernel",
            )),
        };
        LaunchOutcome { stdout, result }
    }
}
