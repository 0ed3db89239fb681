//! The device's global address space: allocations in a fixed virtual window,
//! host-backed, accessed by host copies and by kernels through aligned atomics.
//! Launches hold a read lock for their whole run so `free` never races a kernel;
//! `alloc` never waits for a launch (new blocks park in a side table until then).
//! Virtual memory management: physical allocations mapped into reserved ranges,
//! side by side, so host copies may span contiguous blocks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::sync::{Mutex, RwLock, RwLockReadGuard};

use crate::heap::{Heap, HeapSlot};

/// First device address; all allocations lie above it.
pub const DEVICE_VA_BASE: u64 = 0x2000_0000_0000;
/// End of the device window (exclusive).
pub const DEVICE_VA_END: u64 = 0x3000_0000_0000;
/// The part of the window each device numbered on one server takes: device
/// `n` hands out addresses in `[DEVICE_VA_BASE + n * DEVICE_WINDOW_BYTES, …)`,
/// so one program's pointers of two devices never alias (16 devices fit).
pub const DEVICE_WINDOW_BYTES: u64 = 1 << 40;
/// How many devices' windows fit in the device window.
pub const MAX_WINDOWS: u32 = ((DEVICE_VA_END - DEVICE_VA_BASE) / DEVICE_WINDOW_BYTES) as u32;
/// The lowest address of a block moved in from a GPU ([`DeviceMemory::alloc_at`]).
const FOREIGN_MIN: u64 = 1 << 32;
const ALLOC_ALIGN: u64 = 256;
/// Unmapped gap kept after each allocation so small overruns fault.
const GUARD_GAP: u64 = 4096;
/// The granularity of reservations, physical allocations and mappings
/// (`cuMemGetAllocationGranularity`): 2 MiB, as on NVIDIA's GPUs.
pub const VMM_GRANULARITY: u64 = 2 << 20;

/// Errors of the memory API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemError {
    OutOfMemory,
    InvalidAddress(u64),
    OutOfRange { addr: u64, len: u64 },
    InvalidSize,
}

impl MemError {
    /// The CUDA driver error code for this error.
    pub fn cu_code(&self) -> u32 {
        match self {
            MemError::OutOfMemory => 2,
            _ => 1,
        }
    }
}

impl fmt::Display for MemError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemError::OutOfMemory => write!(f, "out of device memory"),
            MemError::InvalidAddress(a) => write!(f, "invalid device address {a:#x}"),
            MemError::OutOfRange { addr, len } => {
                write!(f, "range {addr:#x}+{len} is outside any allocation")
            }
            MemError::InvalidSize => write!(f, "invalid size"),
        }
    }
}

impl std::error::Error for MemError {}

/// Host bytes: 16-byte aligned, zero-filled, freed at drop.
struct Backing {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain bytes owned by this Backing; all concurrent
// access goes through atomics or through host copies ordered by the caller.
unsafe impl Send for Backing {}
// SAFETY: see above; shared access never creates `&mut` to the bytes.
unsafe impl Sync for Backing {}

impl Backing {
    /// `bytes` (> 0) zero-filled bytes, rounded up to `round`.
    fn zeroed(bytes: u64, round: u64) -> Result<Backing, MemError> {
        let rounded = bytes.checked_add(round - 1).ok_or(MemError::OutOfMemory)? & !(round - 1);
        let size = usize::try_from(rounded).map_err(|_| MemError::OutOfMemory)?;
        let layout =
            std::alloc::Layout::from_size_align(size, 16).map_err(|_| MemError::OutOfMemory)?;
        // SAFETY: layout has non-zero size (bytes > 0).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(MemError::OutOfMemory);
        }
        Ok(Backing { ptr, layout })
    }

    fn bytes(&self) -> u64 {
        self.layout.size() as u64
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        // SAFETY: ptr was returned by alloc_zeroed with this exact layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Who owns a block's bytes.
enum Owner {
    /// An allocation: the block's own (shared with the contexts that opened
    /// it, [`DeviceMemory::share`]).
    Own(Arc<Backing>),
    /// A mapping of a physical allocation, which lives on while mapped.
    Mapped { _physical: Arc<Backing> },
    /// Host memory that is not the device's (`map_host`), kept alive while
    /// addressable.
    Host { _bytes: Arc<dyn HostBytes> },
    /// Another memory's allocation, opened here ([`DeviceMemory::open_shared`]):
    /// its bytes live while open.
    Opened { _backing: Arc<Backing> },
}

/// An allocation of one [`DeviceMemory`] that another may open
/// ([`DeviceMemory::share`]): it names the bytes without keeping them, so once
/// the allocation is freed (and no opening holds it) it opens nothing.
#[derive(Clone)]
pub struct SharedAllocation {
    backing: std::sync::Weak<Backing>,
    size: u64,
}

impl SharedAllocation {
    /// Whether the allocation's bytes still live.
    pub fn is_live(&self) -> bool {
        self.backing.strong_count() > 0
    }

    /// The allocation's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// Host memory that kernels may reach at an address of the program's
/// (pinned host memory, which a GPU with unified addressing reaches by the
/// host's own pointer).
///
/// # Safety
/// `as_ptr()` must point to `size()` bytes that stay mapped, readable and
/// writable, at the same place, for as long as the value lives; others may
/// read and write them at any time (through atomics, or at moments the
/// program orders).
pub unsafe trait HostBytes: Send + Sync {
    fn as_ptr(&self) -> *mut u8;
    /// How many bytes `as_ptr` points to.
    fn size(&self) -> u64;
}

/// One addressable range: its host bytes and their owner.
pub(crate) struct Block {
    ptr: *mut u8,
    size: u64,
    owner: Owner,
}

// SAFETY: `ptr` points into the bytes `owner` keeps alive (see Backing).
unsafe impl Send for Block {}
// SAFETY: as for Send.
unsafe impl Sync for Block {}

type Blocks = BTreeMap<u64, Block>;

/// Address assignment, accounting, blocks allocated while the main table
/// was locked by a launch, and physical allocations by id.
struct AllocState {
    next: u64,
    used: u64,
    pending: Blocks,
    physical: HashMap<u64, Arc<Backing>>,
    /// Physical allocations of another memory's, imported: not charged here.
    imported: std::collections::HashSet<u64>,
    next_physical: u64,
    /// Addresses the next allocations must take, in order
    /// ([`DeviceMemory::place_next`]).
    placements: VecDeque<u64>,
}

/// The device's global memory. `Sync + Send`; every method takes `&self`.
pub struct DeviceMemory {
    space: RwLock<Blocks>,
    state: Mutex<AllocState>,
    /// The heap of device-side `malloc`, made at the first launch that needs it.
    heap: Mutex<HeapSlot>,
    capacity: u64,
    /// The addresses this memory hands out: `[window.0, window.1)`.
    window: (u64, u64),
}

fn lookup(blocks: &Blocks, addr: u64, len: u64) -> Option<(u64, u64, *mut u8)> {
    let (base, b) = blocks.range(..=addr).next_back()?;
    let off = addr - base;
    if off.checked_add(len)? <= b.size {
        Some((*base, b.size, b.ptr))
    } else {
        None
    }
}

/// Whether any block of `blocks` meets `[addr, addr + len)`.
fn overlaps(blocks: &Blocks, addr: u64, len: u64) -> bool {
    let end = addr.saturating_add(len);
    let before = blocks
        .range(..addr)
        .next_back()
        .is_some_and(|(base, b)| base.saturating_add(b.size.max(1)) > addr);
    before || blocks.range(addr..end).next().is_some()
}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceMemory({} of {} bytes used)",
            self.used(),
            self.capacity
        )
    }
}

/// A view of device memory for the duration of a launch (or one host call).
/// While it lives no block can be freed (free needs the write lock).
pub(crate) struct MemView<'a> {
    guard: RwLockReadGuard<'a, Blocks>,
    state: &'a Mutex<AllocState>,
}

impl MemView<'_> {
    /// Host pointer for `[addr, addr+len)` if it lies inside one allocation.
    #[inline]
    pub(crate) fn resolve(&self, addr: u64, len: u64) -> Option<(u64, u64, *mut u8)> {
        lookup(&self.guard, addr, len).or_else(|| {
            let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            lookup(&st.pending, addr, len)
        })
    }
}

impl DeviceMemory {
    /// Creates an empty memory of `capacity_bytes`, its addresses anywhere in
    /// the device window.
    pub fn new(capacity_bytes: u64) -> Self {
        Self::in_window(capacity_bytes, DEVICE_VA_BASE, DEVICE_VA_END)
    }

    /// Creates an empty memory of `capacity_bytes` for device `number` of a
    /// server: its addresses in that device's part of the window
    /// ([`DEVICE_WINDOW_BYTES`]); `None` past [`MAX_WINDOWS`].
    pub fn numbered(capacity_bytes: u64, number: u32) -> Option<Self> {
        let base = DEVICE_VA_BASE + u64::from(number) * DEVICE_WINDOW_BYTES;
        (number < MAX_WINDOWS)
            .then(|| Self::in_window(capacity_bytes, base, base + DEVICE_WINDOW_BYTES))
    }

    fn in_window(capacity_bytes: u64, base: u64, end: u64) -> Self {
        DeviceMemory {
            window: (base, end),
            space: RwLock::new(BTreeMap::new()),
            state: Mutex::new(AllocState {
                next: base,
                used: 0,
                pending: BTreeMap::new(),
                physical: HashMap::new(),
                imported: Default::default(),
                next_physical: 1,
                placements: VecDeque::new(),
            }),
            capacity: capacity_bytes,
            heap: Mutex::new(HeapSlot::default()),
        }
    }

    /// The size of the device-side `malloc` heap (`CU_LIMIT_MALLOC_HEAP_SIZE`).
    pub fn heap_limit(&self) -> u64 {
        self.heap.lock().unwrap_or_else(|e| e.into_inner()).limit
    }

    /// Whether a kernel made the device-side `malloc` heap.
    pub fn heap_in_use(&self) -> bool {
        self.heap
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .heap
            .is_some()
    }

    /// Sets the heap's size; refused (`InvalidSize`) once a kernel that calls
    /// `malloc` ran, as the driver refuses it.
    pub fn set_heap_limit(&self, bytes: u64) -> Result<(), MemError> {
        let mut slot = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        if slot.heap.is_some() {
            return Err(MemError::InvalidSize);
        }
        slot.limit = bytes;
        Ok(())
    }

    /// Makes the heap (one allocation of its limit) if it is not there yet.
    pub(crate) fn ensure_heap(&self) -> Result<(), MemError> {
        let mut slot = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        if slot.heap.is_none() {
            let bytes = slot.limit.max(ALLOC_ALIGN);
            let base = self.alloc(bytes)?;
            slot.heap = Some(Heap::new(base, bytes));
        }
        Ok(())
    }

    /// Device `malloc(bytes)`: a block of the heap, or 0 (NULL).
    pub(crate) fn heap_malloc(&self, bytes: u64) -> u64 {
        let mut slot = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        slot.heap.as_mut().map_or(0, |h| h.malloc(bytes))
    }

    /// Device `free(ptr)`: false for a pointer the heap did not hand out.
    pub(crate) fn heap_free(&self, ptr: u64) -> bool {
        let mut slot = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        match slot.heap.as_mut() {
            Some(h) => h.free(ptr).is_ok(),
            None => ptr == 0,
        }
    }

    pub(crate) fn view(&self) -> MemView<'_> {
        MemView {
            guard: self.space.read().unwrap_or_else(|e| e.into_inner()),
            state: &self.state,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, AllocState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The address a block of `rounded` bytes would take next, and where the
    /// one after it would start (a guard gap between): not yet taken.
    fn following(&self, s: &AllocState, rounded: u64) -> Result<(u64, u64), MemError> {
        let addr = s.next;
        let next = addr
            .checked_add(rounded)
            .and_then(|v| v.checked_add(GUARD_GAP))
            .filter(|next| *next <= self.window.1)
            .ok_or(MemError::OutOfMemory)?;
        Ok((addr, next))
    }

    /// Allocates `bytes` zero-filled bytes; returns a 256-byte aligned address.
    pub fn alloc(&self, bytes: u64) -> Result<u64, MemError> {
        if bytes == 0 {
            return Err(MemError::InvalidSize);
        }
        let rounded = bytes
            .checked_next_multiple_of(ALLOC_ALIGN)
            .ok_or(MemError::OutOfMemory)?;
        let mut s = self.state();
        if let Some(addr) = s.placements.pop_front() {
            drop(s);
            return self.alloc_at(addr, bytes).map(|()| addr);
        }
        if s.used.saturating_add(rounded) > self.capacity {
            return Err(MemError::OutOfMemory);
        }
        let (addr, next) = self.following(&s, rounded)?;
        let backing = Backing::zeroed(bytes, ALLOC_ALIGN)?;
        s.next = next;
        s.used += backing.bytes();
        let block = Block {
            ptr: backing.ptr,
            size: bytes,
            owner: Owner::Own(Arc::new(backing)),
        };
        self.insert(&mut s, addr, block);
        Ok(addr)
    }

    /// Allocates `bytes` zero-filled bytes at `addr` (256-byte aligned, over
    /// no other block), as a moved session's allocations come back where its
    /// program holds them; later allocations go above it. `addr` lies in this
    /// memory's window, or (a session moved in from a GPU, whose driver chose
    /// its addresses) outside every range the CPU device gives a meaning to.
    /// Waits for running launches.
    pub fn alloc_at(&self, addr: u64, bytes: u64) -> Result<(), MemError> {
        if bytes == 0 {
            return Err(MemError::InvalidSize);
        }
        let rounded = bytes
            .checked_next_multiple_of(ALLOC_ALIGN)
            .ok_or(MemError::OutOfMemory)?;
        let end = addr
            .checked_add(rounded)
            .ok_or(MemError::OutOfRange { addr, len: bytes })?;
        let in_window = addr >= self.window.0 && end <= self.window.1;
        if !addr.is_multiple_of(ALLOC_ALIGN) || !(in_window || foreign(addr, end)) {
            return Err(MemError::OutOfRange { addr, len: bytes });
        }
        // The table first, then the state, as `free` takes them.
        let mut blocks = self.space.write().unwrap_or_else(|e| e.into_inner());
        let mut s = self.state();
        blocks.append(&mut s.pending);
        if overlaps(&blocks, addr, rounded) {
            return Err(MemError::OutOfRange { addr, len: bytes });
        }
        if s.used.saturating_add(rounded) > self.capacity {
            return Err(MemError::OutOfMemory);
        }
        let backing = Backing::zeroed(bytes, ALLOC_ALIGN)?;
        s.used += backing.bytes();
        if in_window {
            s.next = s.next.max(end.saturating_add(GUARD_GAP));
        }
        let block = Block {
            ptr: backing.ptr,
            size: bytes,
            owner: Owner::Own(Arc::new(backing)),
        };
        blocks.insert(addr, block);
        Ok(())
    }

    /// Makes the next allocations ([`DeviceMemory::alloc`]) take `addrs`, in
    /// order (a module's globals loaded again where they were); an empty list
    /// ends it. Returns how many of the previous list were not taken.
    pub fn place_next(&self, addrs: &[u64]) -> usize {
        let mut s = self.state();
        let left = s.placements.len();
        s.placements = addrs.iter().copied().collect();
        left
    }

    /// The first and last-plus-one address this memory hands out.
    pub fn window(&self) -> (u64, u64) {
        self.window
    }

    /// Inserts `block` at `addr` now unless a launch holds the table; then
    /// parks it until later.
    fn insert(&self, s: &mut AllocState, addr: u64, block: Block) {
        match self.space.try_write() {
            Ok(mut blocks) => {
                blocks.append(&mut s.pending);
                blocks.insert(addr, block);
            }
            Err(_) => {
                s.pending.insert(addr, block);
            }
        }
    }

    /// Frees the allocation that starts at `ptr`; waits for running launches.
    pub fn free(&self, ptr: u64) -> Result<(), MemError> {
        let mut blocks = self.space.write().unwrap_or_else(|e| e.into_inner());
        let mut s = self.state();
        blocks.append(&mut s.pending);
        match blocks.get(&ptr).map(|b| &b.owner) {
            Some(Owner::Own(_)) => {}
            _ => return Err(MemError::InvalidAddress(ptr)),
        }
        if let Some(Block {
            owner: Owner::Own(backing),
            ..
        }) = blocks.remove(&ptr)
        {
            s.used = s.used.saturating_sub(backing.bytes());
        }
        Ok(())
    }

    /// The allocation that starts at `base`, for another memory to open
    /// ([`DeviceMemory::open_shared`]).
    pub fn share(&self, base: u64) -> Result<SharedAllocation, MemError> {
        let v = self.view();
        let pending;
        let block = match v.guard.get(&base) {
            Some(b) => b,
            None => {
                pending = self.state();
                pending
                    .pending
                    .get(&base)
                    .ok_or(MemError::InvalidAddress(base))?
            }
        };
        match &block.owner {
            Owner::Own(backing) => Ok(SharedAllocation {
                backing: Arc::downgrade(backing),
                size: block.size,
            }),
            _ => Err(MemError::InvalidAddress(base)),
        }
    }

    /// Makes `shared` (another memory's allocation) addressable here at a new
    /// address, which it returns. Its bytes count for nothing in `used`: they
    /// are the exporter's. Refused once the allocation is gone.
    pub fn open_shared(&self, shared: &SharedAllocation) -> Result<u64, MemError> {
        let backing = shared.backing.upgrade().ok_or(MemError::InvalidSize)?;
        let rounded = shared
            .size
            .checked_next_multiple_of(ALLOC_ALIGN)
            .ok_or(MemError::OutOfMemory)?;
        let mut s = self.state();
        let (addr, next) = self.following(&s, rounded)?;
        s.next = next;
        let block = Block {
            ptr: backing.ptr,
            size: shared.size,
            owner: Owner::Opened { _backing: backing },
        };
        self.insert(&mut s, addr, block);
        Ok(addr)
    }

    /// Closes what [`DeviceMemory::open_shared`] opened at `addr`; waits for
    /// running launches.
    pub fn close_shared(&self, addr: u64) -> Result<(), MemError> {
        self.remove_block(addr, |o| matches!(o, Owner::Opened { .. }))
    }

    /// Reserves `size` bytes of addresses (rounded up to [`VMM_GRANULARITY`]),
    /// aligned to `alignment` (a power of two, or 0) and to the granularity,
    /// for [`DeviceMemory::map`]. Addresses are never handed out twice, so
    /// giving a reservation back needs nothing here.
    pub fn reserve(&self, size: u64, alignment: u64) -> Result<u64, MemError> {
        if size == 0 || (alignment != 0 && !alignment.is_power_of_two()) {
            return Err(MemError::InvalidSize);
        }
        let align = alignment.max(VMM_GRANULARITY);
        let mut s = self.state();
        let addr = s
            .next
            .checked_next_multiple_of(align)
            .ok_or(MemError::OutOfMemory)?;
        let next = size
            .checked_next_multiple_of(VMM_GRANULARITY)
            .and_then(|r| addr.checked_add(r))
            .and_then(|v| v.checked_add(GUARD_GAP))
            .ok_or(MemError::OutOfMemory)?;
        if next > self.window.1 {
            return Err(MemError::OutOfMemory);
        }
        s.next = next;
        Ok(addr)
    }

    /// A physical allocation of `bytes` (> 0) zero-filled bytes, not yet
    /// addressable: its id, for [`DeviceMemory::map`].
    pub fn create_physical(&self, bytes: u64) -> Result<u64, MemError> {
        if bytes == 0 {
            return Err(MemError::InvalidSize);
        }
        let mut s = self.state();
        let rounded = bytes
            .checked_next_multiple_of(ALLOC_ALIGN)
            .ok_or(MemError::OutOfMemory)?;
        if s.used.saturating_add(rounded) > self.capacity {
            return Err(MemError::OutOfMemory);
        }
        let backing = Backing::zeroed(bytes, ALLOC_ALIGN)?;
        s.used += backing.bytes();
        let id = s.next_physical;
        s.next_physical += 1;
        s.physical.insert(id, Arc::new(backing));
        Ok(id)
    }

    /// Physical allocation `id`, for another memory to import
    /// ([`DeviceMemory::import_physical`]).
    pub fn share_physical(&self, id: u64) -> Result<SharedAllocation, MemError> {
        let s = self.state();
        let backing = s.physical.get(&id).ok_or(MemError::InvalidAddress(id))?;
        Ok(SharedAllocation {
            backing: Arc::downgrade(backing),
            size: backing.bytes(),
        })
    }

    /// Another memory's physical allocation as one of this memory's: its id
    /// here, for [`DeviceMemory::map`]. Its bytes count for nothing in `used`.
    /// Refused once the allocation is gone.
    pub fn import_physical(&self, shared: &SharedAllocation) -> Result<u64, MemError> {
        let backing = shared.backing.upgrade().ok_or(MemError::InvalidSize)?;
        let mut s = self.state();
        let id = s.next_physical;
        s.next_physical += 1;
        s.physical.insert(id, backing);
        s.imported.insert(id);
        Ok(id)
    }

    /// Gives a physical allocation back: its bytes go once no mapping holds them.
    pub fn release_physical(&self, id: u64) -> Result<(), MemError> {
        let mut s = self.state();
        let backing = s.physical.remove(&id).ok_or(MemError::InvalidAddress(id))?;
        if s.imported.remove(&id) {
            return Ok(());
        }
        s.used = s.used.saturating_sub(backing.bytes());
        Ok(())
    }

    /// Makes the first `size` bytes of physical allocation `id` addressable at
    /// `[addr, addr + size)`, which no block may meet. The same allocation
    /// may be mapped at several places: they alias.
    pub fn map(&self, addr: u64, size: u64, id: u64) -> Result<(), MemError> {
        let end = addr.checked_add(size).ok_or(MemError::InvalidSize)?;
        if size == 0 || addr < self.window.0 || end > self.window.1 {
            return Err(MemError::OutOfRange { addr, len: size });
        }
        // The table's read lock before the state's, as `free` takes them.
        let taken = overlaps(&self.view().guard, addr, size);
        let mut s = self.state();
        if taken || overlaps(&s.pending, addr, size) {
            return Err(MemError::OutOfRange { addr, len: size });
        }
        let backing = s.physical.get(&id).ok_or(MemError::InvalidAddress(id))?;
        if size > backing.bytes() {
            return Err(MemError::InvalidSize);
        }
        let block = Block {
            ptr: backing.ptr,
            size,
            owner: Owner::Mapped {
                _physical: Arc::clone(backing),
            },
        };
        self.insert(&mut s, addr, block);
        Ok(())
    }

    /// Makes the host memory `bytes` addressable at `[addr, addr +
    /// bytes.size())`, outside every device's window, where no block is. It is
    /// not device memory: it counts for nothing in `used`, and `free` refuses
    /// it.
    pub fn map_host(&self, addr: u64, bytes: Arc<dyn HostBytes>) -> Result<(), MemError> {
        let size = bytes.size();
        let end = addr.checked_add(size).ok_or(MemError::InvalidSize)?;
        if size == 0 || (addr < DEVICE_VA_END && end > DEVICE_VA_BASE) {
            return Err(MemError::OutOfRange { addr, len: size });
        }
        // The table's read lock before the state's, as `free` takes them.
        let taken = overlaps(&self.view().guard, addr, size);
        let mut s = self.state();
        if taken || overlaps(&s.pending, addr, size) {
            return Err(MemError::OutOfRange { addr, len: size });
        }
        let block = Block {
            ptr: bytes.as_ptr(),
            size,
            owner: Owner::Host { _bytes: bytes },
        };
        self.insert(&mut s, addr, block);
        Ok(())
    }

    /// Removes the host memory `map_host` placed at `addr`; waits for
    /// running launches.
    pub fn unmap_host(&self, addr: u64) -> Result<(), MemError> {
        self.remove_block(addr, |o| matches!(o, Owner::Host { .. }))
    }

    /// Removes the mapping at `addr`; waits for running launches.
    pub fn unmap(&self, addr: u64) -> Result<(), MemError> {
        self.remove_block(addr, |o| matches!(o, Owner::Mapped { .. }))
    }

    /// Removes the block at `addr` if its owner is of the kind `kind` says;
    /// waits for running launches (the table's write lock).
    fn remove_block(&self, addr: u64, kind: fn(&Owner) -> bool) -> Result<(), MemError> {
        let mut blocks = self.space.write().unwrap_or_else(|e| e.into_inner());
        let mut s = self.state();
        blocks.append(&mut s.pending);
        match blocks.get(&addr) {
            Some(b) if kind(&b.owner) => {
                blocks.remove(&addr);
                Ok(())
            }
            _ => Err(MemError::InvalidAddress(addr)),
        }
    }

    /// `(base, size)` of the allocation containing `ptr`.
    pub fn range(&self, ptr: u64) -> Option<(u64, u64)> {
        let v = self.view();
        let (base, size, _) = v.resolve(ptr, 1)?;
        Some((base, size))
    }

    fn host_ptr(v: &MemView<'_>, addr: u64, len: u64) -> Result<*mut u8, MemError> {
        let (base, _, p) = v
            .resolve(addr, len)
            .ok_or(MemError::OutOfRange { addr, len })?;
        // pointer arithmetic only; the range was checked above
        Ok(p.wrapping_add((addr - base) as usize))
    }

    /// The host spans of `[addr, addr + len)` over blocks that follow each
    /// other with no gap (mappings side by side in a reservation): (host
    /// pointer, offset in the range, bytes) each. All or nothing.
    fn spans(
        v: &MemView<'_>,
        addr: u64,
        len: u64,
    ) -> Result<Vec<(*mut u8, usize, usize)>, MemError> {
        let mut out = Vec::new();
        let mut done = 0u64;
        while done < len {
            let at = addr + done;
            let (base, size, p) = v.resolve(at, 1).ok_or(MemError::OutOfRange { addr, len })?;
            let n = (size - (at - base)).min(len - done);
            out.push((
                p.wrapping_add((at - base) as usize),
                done as usize,
                n as usize,
            ));
            done += n;
        }
        Ok(out)
    }

    /// Copies host bytes into device memory.
    pub fn write(&self, dst: u64, data: &[u8]) -> Result<(), MemError> {
        if data.is_empty() {
            return Ok(());
        }
        let v = self.view();
        let len = data.len() as u64;
        if let Ok(p) = Self::host_ptr(&v, dst, len) {
            // SAFETY: [p, p+len) lies inside a live allocation (checked by resolve) that
            // cannot be freed while we hold the read lock; kernels racing on the same
            // bytes get unspecified values, as on a GPU.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
            return Ok(());
        }
        for (p, at, n) in Self::spans(&v, dst, len)? {
            // SAFETY: [p, p+n) lies inside a live block (checked by resolve) that
            // cannot be freed while we hold the read lock; kernels racing on the
            // same bytes get unspecified values, as on a GPU.
            unsafe { std::ptr::copy_nonoverlapping(data[at..].as_ptr(), p, n) };
        }
        Ok(())
    }

    /// Copies device bytes to the host.
    pub fn read(&self, src: u64, out: &mut [u8]) -> Result<(), MemError> {
        if out.is_empty() {
            return Ok(());
        }
        let v = self.view();
        let len = out.len() as u64;
        if let Ok(p) = Self::host_ptr(&v, src, len) {
            // SAFETY: range checked against a live allocation held by the read lock.
            unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
            return Ok(());
        }
        for (p, at, n) in Self::spans(&v, src, len)? {
            // SAFETY: range checked against a live block held by the read lock.
            unsafe { std::ptr::copy_nonoverlapping(p, out[at..].as_mut_ptr(), n) };
        }
        Ok(())
    }

    /// Hands the host spans of `[dst, dst + len)` to `fill` in order, which
    /// writes them itself (a copy's bytes as they arrive from a socket): no
    /// buffer between. The whole range is checked before the first span goes
    /// out; outer error: the range, inner: what `fill` said (it stops there).
    pub fn write_with<E>(
        &self,
        dst: u64,
        len: u64,
        mut fill: impl FnMut(&mut [u8]) -> Result<(), E>,
    ) -> Result<Result<(), E>, MemError> {
        if len == 0 {
            return Ok(Ok(()));
        }
        let v = self.view();
        for (p, _, n) in Self::spans(&v, dst, len)? {
            // SAFETY: [p, p+n) lies inside a live block (checked by resolve)
            // that cannot be freed while we hold the read lock; kernels racing
            // on the same bytes get unspecified values, as on a GPU.
            let span = unsafe { std::slice::from_raw_parts_mut(p, n) };
            if let Err(e) = fill(span) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// Hands the host spans of `[src, src + len)` to `send` in order, where
    /// they lie (a copy's bytes written to a socket). As
    /// [`DeviceMemory::write_with`]: checked first, then `send` until it fails.
    pub fn read_with<E>(
        &self,
        src: u64,
        len: u64,
        mut send: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<Result<(), E>, MemError> {
        if len == 0 {
            return Ok(Ok(()));
        }
        let v = self.view();
        for (p, _, n) in Self::spans(&v, src, len)? {
            // SAFETY: range checked against a live block held by the read lock.
            let span = unsafe { std::slice::from_raw_parts(p, n) };
            if let Err(e) = send(span) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// Device-to-device copy; the ranges may overlap.
    pub fn copy(&self, dst: u64, src: u64, len: u64) -> Result<(), MemError> {
        if len == 0 {
            return Ok(());
        }
        let v = self.view();
        if let (Ok(d), Ok(s)) = (Self::host_ptr(&v, dst, len), Self::host_ptr(&v, src, len)) {
            // SAFETY: both ranges checked inside live blocks; `copy` allows overlap.
            unsafe { std::ptr::copy(s, d, len as usize) };
            return Ok(());
        }
        // Across mappings side by side: through a buffer, which also keeps
        // overlapping ranges right.
        let (from, to) = (Self::spans(&v, src, len)?, Self::spans(&v, dst, len)?);
        let mut buf = vec![0u8; usize::try_from(len).map_err(|_| MemError::InvalidSize)?];
        for (p, at, n) in from {
            // SAFETY: each span lies inside a live block held by the read lock.
            unsafe { std::ptr::copy_nonoverlapping(p, buf[at..].as_mut_ptr(), n) };
        }
        for (p, at, n) in to {
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(buf[at..].as_ptr(), p, n) };
        }
        Ok(())
    }

    /// Writes `count` copies of `pattern` (1, 2 or 4 bytes) at `dst`.
    pub fn fill(&self, dst: u64, pattern: &[u8], count: u64) -> Result<(), MemError> {
        if !matches!(pattern.len(), 1 | 2 | 4) {
            return Err(MemError::InvalidSize);
        }
        let len = count
            .checked_mul(pattern.len() as u64)
            .ok_or(MemError::InvalidSize)?;
        if len == 0 {
            return Ok(());
        }
        let v = self.view();
        if let Ok(d) = Self::host_ptr(&v, dst, len) {
            // SAFETY: the whole range was checked inside one live allocation.
            let bytes = unsafe { std::slice::from_raw_parts_mut(d, len as usize) };
            if pattern.len() == 1 {
                bytes.fill(pattern[0]);
            } else {
                for chunk in bytes.chunks_exact_mut(pattern.len()) {
                    chunk.copy_from_slice(pattern);
                }
            }
            return Ok(());
        }
        for (p, at, n) in Self::spans(&v, dst, len)? {
            // SAFETY: the span was checked inside one live block.
            let bytes = unsafe { std::slice::from_raw_parts_mut(p, n) };
            // A span may start anywhere in the pattern.
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = pattern[(at + i) % pattern.len()];
            }
        }
        Ok(())
    }

    /// Bytes currently allocated (rounded to allocation granularity).
    pub fn used(&self) -> u64 {
        self.state().used
    }

    /// Total capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

/// Loads `size` bytes (1, 2, 4, 8) from an aligned host pointer.
///
/// # Safety
/// `p` must point into a live allocation with `size` bytes available and be
/// aligned to `size`.
#[inline]
pub(crate) unsafe fn atomic_load(p: *mut u8, size: u32) -> u64 {
    // SAFETY: guaranteed by the caller (aligned, in bounds, live).
    unsafe {
        match size {
            1 => AtomicU8::from_ptr(p).load(Ordering::Relaxed) as u64,
            2 => AtomicU16::from_ptr(p as *mut u16).load(Ordering::Relaxed) as u64,
            4 => AtomicU32::from_ptr(p as *mut u32).load(Ordering::Relaxed) as u64,
            _ => AtomicU64::from_ptr(p as *mut u64).load(Ordering::Relaxed),
        }
    }
}

/// Stores the low `size` bytes of `v` to an aligned host pointer.
///
/// # Safety
/// As for [`atomic_load`].
#[inline]
pub(crate) unsafe fn atomic_store(p: *mut u8, size: u32, v: u64) {
    // SAFETY: guaranteed by the caller (aligned, in bounds, live).
    unsafe {
        match size {
            1 => AtomicU8::from_ptr(p).store(v as u8, Ordering::Relaxed),
            2 => AtomicU16::from_ptr(p as *mut u16).store(v as u16, Ordering::Relaxed),
            4 => AtomicU32::from_ptr(p as *mut u32).store(v as u32, Ordering::Relaxed),
            _ => AtomicU64::from_ptr(p as *mut u64).store(v, Ordering::Relaxed),
        }
    }
}

/// Atomic read-modify-write of 4 or 8 bytes: `f(old) -> Some(new)` applied
/// with a compare-exchange loop; returns the old value.
///
/// # Safety
/// As for [`atomic_load`], with `size` 4 or 8.
#[inline]
pub(crate) unsafe fn atomic_rmw(
    p: *mut u8,
    size: u32,
    mut f: impl FnMut(u64) -> Option<u64>,
) -> u64 {
    // SAFETY: guaranteed by the caller.
    unsafe {
        if size == 8 {
            let a = AtomicU64::from_ptr(p as *mut u64);
            match a.fetch_update(Ordering::AcqRel, Ordering::Acquire, &mut f) {
                Ok(o) | Err(o) => o,
            }
        } else if size == 4 {
            let a = AtomicU32::from_ptr(p as *mut u32);
            match a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                f(o as u64).map(|n| n as u32)
            }) {
                Ok(o) | Err(o) => o as u64,
            }
        } else {
            let a = AtomicU16::from_ptr(p as *mut u16);
            match a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                f(o as u64).map(|n| n as u16)
            }) {
                Ok(o) | Err(o) => o as u64,
            }
        }
    }
}

/// Whether `[addr, end)` lies outside every range the CPU device gives a
/// meaning to: its devices' windows and the local, shared and param windows
/// of generic addresses (below [`DEVICE_VA_BASE`], from
/// [`crate::LOCAL_WINDOW`] on), and above the first 4 GiB.
fn foreign(addr: u64, end: u64) -> bool {
    addr >= FOREIGN_MIN && (end <= crate::LOCAL_WINDOW || addr >= DEVICE_VA_END)
}

#[cfg(test)]
mod tests;
