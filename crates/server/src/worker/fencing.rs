//! Fencing for `shared` mode: each untrusted session's memory in one
//! partition of the shared context's addresses, its modules' PTX fenced into it.
//!
//! A [`Partition`] is a power-of-two range of device addresses, aligned to its
//! size, reserved through the device's virtual memory (`cuMemAddressReserve`
//! on a GPU): the session's allocations are physical memory mapped inside it
//! (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`), and so are the ranges the
//! program reserves itself. A module is loaded from its PTX, rewritten by
//! `cumux-ptx-fence`, and its fence variable filled after the load; an image
//! with no PTX cannot be fenced and is refused. [`Claims`] keeps every
//! partition and fenced module's globals window of a context, so no window
//! may take in another session's memory.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cumux_fatbin::Classified;
use cumux_protocol::{codes, CuError, DevicePtr};
use cumux_ptx_fence::{fence_ptx, Fence, FENCE_SYMBOL};

use crate::device::{DeviceContext, LoadedModule, VmmOp};
use crate::locking::lock;

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const READ_WRITE: u64 = 3;

/// The address ranges of one shared context that belong to someone: each
/// view's partition and its fenced modules' globals, by view tag.
#[derive(Default)]
pub struct Claims {
    ranges: Mutex<Vec<(u64, u64, u64)>>,
}

impl Claims {
    /// Claims `[lo, hi)` for `tag`, unless it meets another view's range.
    fn claim(&self, tag: u64, lo: u64, hi: u64) -> Result<(), CuError> {
        let mut ranges = lock(&self.ranges);
        if let Some(&(other, a, b)) = ranges
            .iter()
            .find(|&&(other, a, b)| other != tag && a < hi && lo < b)
        {
            return Err(CuError::new(
                codes::NOT_SUPPORTED,
                format!(
                    "fencing: [{lo:#x}, {hi:#x}) meets view {other}'s [{a:#x}, {b:#x}); the module cannot be fenced"
                ),
            ));
        }
        ranges.push((tag, lo, hi));
        Ok(())
    }

    fn release(&self, tag: u64, lo: u64) {
        lock(&self.ranges).retain(|&(t, a, _)| !(t == tag && a == lo));
    }

    fn release_all(&self, tag: u64) {
        lock(&self.ranges).retain(|&(t, _, _)| t != tag);
    }
}

/// Free address ranges of a partition, first fit, neighbours merged.
struct Ranges {
    free: BTreeMap<u64, u64>,
}

impl Ranges {
    fn new(base: u64, size: u64) -> Ranges {
        Ranges {
            free: BTreeMap::from([(base, size)]),
        }
    }

    /// `size` bytes aligned to `align` (a power of two).
    fn take(&mut self, size: u64, align: u64) -> Option<u64> {
        let (start, len, at) = self.free.iter().find_map(|(&start, &len)| {
            let at = start.checked_next_multiple_of(align)?;
            (at.checked_add(size)? <= start + len).then_some((start, len, at))
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let end = at + size;
        if end < start + len {
            self.free.insert(end, start + len - end);
        }
        Some(at)
    }

    fn give(&mut self, mut at: u64, mut size: u64) {
        if let Some((&prev, &len)) = self.free.range(..at).next_back() {
            if prev + len == at {
                self.free.remove(&prev);
                at = prev;
                size += len;
            }
        }
        if let Some(len) = self.free.remove(&(at + size)) {
            size += len;
        }
        self.free.insert(at, size);
    }
}

/// One untrusted session's partition of a shared context.
pub struct Partition {
    tenant: String,
    tag: u64,
    base: u64,
    size: u64,
    granularity: u64,
    claims: Arc<Claims>,
    state: Mutex<PartitionState>,
}

struct PartitionState {
    ranges: Ranges,
    /// The session's allocations: address → (physical id, mapped bytes).
    allocations: BTreeMap<DevicePtr, (u64, u64)>,
    /// Ranges the program reserved itself: address → bytes.
    reservations: BTreeMap<DevicePtr, u64>,
    /// Each fenced module's globals window's start.
    windows: BTreeMap<u64, u64>,
}

impl Partition {
    /// Reserves a partition of at least `min_size` bytes (rounded up to a
    /// power of two) in `ctx` for view `tag` of `tenant`.
    pub fn reserve(
        ctx: &dyn DeviceContext,
        tenant: &str,
        tag: u64,
        min_size: u64,
        claims: Arc<Claims>,
    ) -> Result<Partition, CuError> {
        let granularity = ctx.vmm(&VmmOp::Granularity { recommended: false })?.max(1);
        let size = min_size.max(granularity).next_power_of_two();
        let base = ctx.vmm(&VmmOp::Reserve {
            size,
            alignment: size,
        })?;
        if !base.is_multiple_of(size) {
            let _ = ctx.vmm(&VmmOp::FreeReservation { ptr: base, size });
            return Err(CuError::new(
                codes::OUT_OF_MEMORY,
                format!(
                    "fencing: the device gave a partition at {base:#x}, not aligned to {size:#x}"
                ),
            ));
        }
        claims.claim(tag, base, base + size)?;
        tracing::debug!(tenant, base, size, "fencing: partition reserved");
        Ok(Partition {
            tenant: tenant.to_string(),
            tag,
            base,
            size,
            granularity,
            claims,
            state: Mutex::new(PartitionState {
                ranges: Ranges::new(base, size),
                allocations: BTreeMap::new(),
                reservations: BTreeMap::new(),
                windows: BTreeMap::new(),
            }),
        })
    }

    fn out_of_room(&self, bytes: u64) -> CuError {
        CuError::new(
            codes::OUT_OF_MEMORY,
            format!(
                "fencing: no room for {bytes} bytes in tenant {:?}'s partition of {} bytes",
                self.tenant, self.size
            ),
        )
    }

    /// An allocation of `bytes`: physical memory mapped in the partition.
    pub fn alloc(&self, ctx: &dyn DeviceContext, bytes: u64) -> Result<DevicePtr, CuError> {
        let size = bytes
            .max(1)
            .checked_next_multiple_of(self.granularity)
            .ok_or_else(|| self.out_of_room(bytes))?;
        let ptr = lock(&self.state)
            .ranges
            .take(size, self.granularity)
            .ok_or_else(|| self.out_of_room(bytes))?;
        let mapped = (|| {
            let physical = ctx.vmm(&VmmOp::Create {
                size,
                shareable: false,
                compressed: false,
            })?;
            let map = ctx.vmm(&VmmOp::Map {
                ptr,
                size,
                physical,
            });
            if let Err(e) = map {
                let _ = ctx.vmm(&VmmOp::Release { physical, size });
                return Err(e);
            }
            let access = ctx.vmm(&VmmOp::SetAccess {
                ptr,
                size,
                flags: READ_WRITE,
            });
            if let Err(e) = access {
                let _ = ctx.vmm(&VmmOp::Unmap { ptr, size });
                let _ = ctx.vmm(&VmmOp::Release { physical, size });
                return Err(e);
            }
            Ok(physical)
        })();
        let mut state = lock(&self.state);
        match mapped {
            Ok(physical) => {
                state.allocations.insert(ptr, (physical, size));
                Ok(ptr)
            }
            Err(e) => {
                state.ranges.give(ptr, size);
                Err(e)
            }
        }
    }

    /// Whether `ptr` is an allocation of [`Partition::alloc`].
    pub fn owns(&self, ptr: DevicePtr) -> bool {
        lock(&self.state).allocations.contains_key(&ptr)
    }

    /// Frees an allocation of [`Partition::alloc`] (scrubbed by the caller).
    pub fn free(&self, ctx: &dyn DeviceContext, ptr: DevicePtr) -> Result<(), CuError> {
        let (physical, size) = lock(&self.state)
            .allocations
            .remove(&ptr)
            .ok_or_else(|| CuError::new(codes::INVALID_VALUE, "fencing: not an allocation"))?;
        ctx.vmm(&VmmOp::Unmap { ptr, size })?;
        ctx.vmm(&VmmOp::Release { physical, size })?;
        lock(&self.state).ranges.give(ptr, size);
        Ok(())
    }

    /// A program's own `cuMemAddressReserve` / `cuMemAddressFree`, answered
    /// inside the partition: `Some` when `op` is one of them.
    pub fn reservation(&self, op: &VmmOp) -> Option<Result<u64, CuError>> {
        let mut state = lock(&self.state);
        match *op {
            VmmOp::Reserve { size, alignment } => {
                let align = alignment.max(self.granularity);
                let size = size.checked_next_multiple_of(self.granularity)?;
                let at = state.ranges.take(size, align);
                Some(match at {
                    Some(at) => {
                        state.reservations.insert(at, size);
                        Ok(at)
                    }
                    None => Err(self.out_of_room(size)),
                })
            }
            VmmOp::FreeReservation { ptr, .. } => {
                let size = state.reservations.remove(&ptr)?;
                state.ranges.give(ptr, size);
                Some(Ok(0))
            }
            _ => None,
        }
    }

    /// Loads `image` fenced: its PTX rewritten, loaded, its fence filled
    /// with this partition and the module's globals; the fence variable is
    /// left out of the module's globals, so no API call can reach it.
    pub fn module_load(
        &self,
        ctx: &dyn DeviceContext,
        image: &[u8],
        sm: u32,
    ) -> Result<LoadedModule, CuError> {
        let ptx = ptx_of(image, sm).map_err(|why| {
            tracing::warn!(
                tenant = %self.tenant,
                module = %describe(image),
                "shared mode refused a module: {why}"
            );
            CuError::new(
                codes::NOT_SUPPORTED,
                format!(
                    "shared mode fences every kernel through its PTX, and this module ({}) {why}; \
                     mark tenant {:?} trusted or serve it with --sharing isolated",
                    describe(image),
                    self.tenant
                ),
            )
        })?;
        let fenced = fence_ptx(&ptx).map_err(|e| {
            tracing::warn!(tenant = %self.tenant, module = %describe(image), "shared mode refused a module: {e}");
            CuError::new(
                codes::NOT_SUPPORTED,
                format!("shared mode cannot fence this module ({}): {e}", describe(image)),
            )
        })?;
        let mut text = fenced.ptx.into_bytes();
        text.push(0);
        let mut module = ctx.module_load(&text)?;
        let filled = self.fill(ctx, &module, &fenced.globals);
        if let Err(e) = filled {
            ctx.module_unload(module.id);
            return Err(e);
        }
        module.globals.retain(|g| g.name != FENCE_SYMBOL);
        Ok(module)
    }

    fn fill(
        &self,
        ctx: &dyn DeviceContext,
        module: &LoadedModule,
        globals: &[String],
    ) -> Result<(), CuError> {
        let Some(var) = module.globals.iter().find(|g| g.name == FENCE_SYMBOL) else {
            // No function reads a fence: nothing of the module touches memory.
            return Ok(());
        };
        let mut window = (u64::MAX, 0u64);
        for g in module.globals.iter().filter(|g| globals.contains(&g.name)) {
            window = (window.0.min(g.ptr), window.1.max(g.ptr + g.size));
        }
        let (lo, hi) = if window.0 < window.1 { window } else { (0, 0) };
        let fence = Fence::new(self.base, self.size, lo, hi)
            .ok_or_else(|| CuError::new(codes::INVALID_VALUE, "fencing: bad partition"))?;
        if fence.guards(var.ptr, var.size.max(32)) {
            return Err(CuError::new(
                codes::NOT_SUPPORTED,
                format!(
                    "fencing: the device put the fence at {:#x}, inside the module's globals [{lo:#x}, {hi:#x}); the module cannot be fenced",
                    var.ptr
                ),
            ));
        }
        if hi > lo {
            // An access that starts in the window may end a little past it.
            self.claims.claim(self.tag, lo, fence.window_end())?;
            lock(&self.state).windows.insert(module.id, lo);
        }
        ctx.mem_write(var.ptr, &fence.to_bytes())
    }

    /// Forgets module `module`'s globals window.
    pub fn module_unloaded(&self, module: u64) {
        if let Some(lo) = lock(&self.state).windows.remove(&module) {
            self.claims.release(self.tag, lo);
        }
    }

    /// Gives back what is left of the partition at the view's end (the
    /// session has freed its allocations by then).
    pub fn release(&self, ctx: &dyn DeviceContext) {
        let leftovers: Vec<DevicePtr> = lock(&self.state).allocations.keys().copied().collect();
        for ptr in leftovers {
            let _ = self.free(ctx, ptr);
        }
        let _ = ctx.vmm(&VmmOp::FreeReservation {
            ptr: self.base,
            size: self.size,
        });
        self.claims.release_all(self.tag);
    }
}

/// The PTX of `image` a device of compute capability `sm` runs, or why none.
fn ptx_of(image: &[u8], sm: u32) -> Result<String, String> {
    match cumux_fatbin::classify(image) {
        Classified::Ptx => {
            let end = image.iter().position(|b| *b == 0).unwrap_or(image.len());
            String::from_utf8(image[..end].to_vec()).map_err(|_| "has PTX that is not UTF-8".into())
        }
        Classified::Fatbin => cumux_fatbin::ptx_for(image, sm).ok_or_else(|| {
            "holds only cubins, no PTX (cubin-only modules cannot be fenced)".into()
        }),
        Classified::Elf => {
            Err("is a cubin, with no PTX (cubin-only modules cannot be fenced)".into())
        }
        _ => Err("is not PTX or a fat binary".into()),
    }
}

/// A module image in a log line: its kind, size and first kernel names.
fn describe(image: &[u8]) -> String {
    let kind = match cumux_fatbin::classify(image) {
        Classified::Ptx => "PTX",
        Classified::Fatbin => "fat binary",
        Classified::Elf => "cubin",
        _ => "image",
    };
    format!("{kind} of {} bytes", image.len())
}

#[cfg(test)]
mod tests {
    use super::{ptx_of, Ranges};

    #[test]
    fn images_without_ptx_are_refused_with_the_reason() {
        let cubin = b"\x7fELF\x02\x01\x01\x00rest of a cubin";
        let why = ptx_of(cubin, 90).unwrap_err();
        assert!(
            why.contains("cubin") && why.contains("cannot be fenced"),
            "{why}"
        );
        let ptx = b".version 8.0\n.target sm_90\n.address_size 64\n\0";
        assert!(ptx_of(ptx, 90).unwrap().starts_with(".version"));
        assert!(ptx_of(b"nonsense", 90).is_err());
    }

    #[test]
    fn ranges_take_aligned_and_merge_on_give() {
        let mut r = Ranges::new(0x1000, 0x10000);
        let a = r.take(0x1000, 0x4000).unwrap();
        assert_eq!(a, 0x4000);
        let b = r.take(0x3000, 0x1000).unwrap();
        assert_eq!(b, 0x1000);
        assert!(r.take(0x20000, 1).is_none());
        r.give(a, 0x1000);
        r.give(b, 0x3000);
        assert_eq!(r.free.len(), 1);
        assert_eq!(r.take(0x10000, 0x1000), Some(0x1000));
    }
}
