//! The device heap behind device-side `malloc`/`free` (and `new`/`delete`):
//! one allocation of `CU_LIMIT_MALLOC_HEAP_SIZE` bytes, carved first fit.

use std::collections::{BTreeMap, HashMap};

/// The heap size a context starts with (the driver's default: 8 MiB).
pub const DEFAULT_HEAP_BYTES: u64 = 8 << 20;

/// Every block the heap hands out is aligned to this (as the driver's).
const HEAP_ALIGN: u64 = 16;

/// A context's heap: its size limit, and the heap once a kernel needed it
/// (from then on its size is fixed, as the driver's).
#[derive(Debug)]
pub(crate) struct HeapSlot {
    pub limit: u64,
    pub heap: Option<Heap>,
}

impl Default for HeapSlot {
    fn default() -> HeapSlot {
        HeapSlot {
            limit: DEFAULT_HEAP_BYTES,
            heap: None,
        }
    }
}

/// Free and used ranges of one heap at `base`.
#[derive(Debug)]
pub(crate) struct Heap {
    /// Free ranges: start address → length.
    free: BTreeMap<u64, u64>,
    /// Blocks handed out: start address → length.
    used: HashMap<u64, u64>,
}

impl Heap {
    /// An empty heap over `[base, base + bytes)`.
    pub(crate) fn new(base: u64, bytes: u64) -> Heap {
        let mut free = BTreeMap::new();
        let bytes = bytes - bytes % HEAP_ALIGN;
        if bytes > 0 {
            free.insert(base, bytes);
        }
        Heap {
            free,
            used: HashMap::new(),
        }
    }

    /// `malloc(bytes)`: the start of a free block of at least `bytes`, or 0
    /// (NULL) when none is left or `bytes` is 0.
    pub(crate) fn malloc(&mut self, bytes: u64) -> u64 {
        let Some(size) = bytes.checked_next_multiple_of(HEAP_ALIGN) else {
            return 0;
        };
        if size == 0 {
            return 0;
        }
        let Some((&at, &len)) = self.free.iter().find(|(_, &len)| len >= size) else {
            return 0;
        };
        self.free.remove(&at);
        if len > size {
            self.free.insert(at + size, len - size);
        }
        self.used.insert(at, size);
        at
    }

    /// `free(ptr)`: gives the block back, merged with free neighbours.
    /// `free(NULL)` does nothing; a pointer the heap never handed out (or
    /// already freed) is refused.
    pub(crate) fn free(&mut self, ptr: u64) -> Result<(), ()> {
        if ptr == 0 {
            return Ok(());
        }
        let mut len = self.used.remove(&ptr).ok_or(())?;
        let mut at = ptr;
        if let Some((&next, &next_len)) = self.free.range(at + len..).next() {
            if next == at + len {
                self.free.remove(&next);
                len += next_len;
            }
        }
        if let Some((&prev, &prev_len)) = self.free.range(..at).next_back() {
            if prev + prev_len == at {
                self.free.remove(&prev);
                at = prev;
                len += prev_len;
            }
        }
        self.free.insert(at, len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_reused_and_merged() {
        let mut h = Heap::new(0x1000, 256);
        let a = h.malloc(1);
        let b = h.malloc(100);
        assert_eq!((a, b), (0x1000, 0x1010));
        assert_eq!(h.malloc(200), 0, "no room left for 200 bytes");
        assert_eq!(h.malloc(0), 0);
        h.free(a).unwrap();
        h.free(b).unwrap();
        assert_eq!(h.free(b), Err(()), "a double free is refused");
        assert_eq!(h.free(0x1008), Err(()), "not a block start");
        h.free(0).unwrap();
        assert_eq!(h.malloc(256), 0x1000, "freed neighbours merge");
        assert_eq!(h.malloc(u64::MAX), 0);
    }
}
