//! Ordered vector accesses (`ld.relaxed.gpu.v2.u64`, `st.volatile.v4.u32`)
//! in global memory as one atomic access of the whole vector, on both
//! engines: CUB's tile descriptors (status beside value) must not tear.

use portable_atomic::AtomicU128;
use std::sync::atomic::Ordering;

use crate::ir::{MemOrder, Sp};
use crate::memory::{atomic_load, atomic_store};

/// The bytes (2, 4, 8 or 16) that a vector access of `n` elements of
/// `size` bytes, ordered by `order`, in space `sp`, makes as one atomic
/// access; `None`: one access an element. Only ordered accesses in global
/// (or generic) memory need it: other blocks run on other host threads,
/// while shared, local and parameter memory are one host thread's. A
/// 32-byte vector stays element by element (no host makes such an access
/// atomic).
#[inline(always)]
pub(crate) fn whole_width(order: MemOrder, sp: Sp, size: u32, n: u8) -> Option<u32> {
    let bytes = size * n as u32;
    (n > 1 && order != MemOrder::Plain && matches!(sp, Sp::Global | Sp::Generic) && bytes <= 16)
        .then_some(bytes)
}

/// Reads `bytes` (2, 4, 8 or 16) at `p` in one atomic access, as two
/// little-endian words (the second 0 below 16 bytes). Sixteen bytes are
/// one 16-byte atomic load (`portable_atomic`: VMOVDQA where the CPU has
/// AVX, else CMPXCHG16B, else its lock-based fallback) when `p` is aligned
/// to 16, as every global address is (its host bytes are aligned as its
/// device address); else two 8-byte ones (a generic address of shared or
/// local memory, which one host thread owns).
///
/// # Safety
/// `p` points into a live buffer with `bytes` bytes available, aligned to
/// `bytes` (to 8 for 16).
#[inline]
pub(crate) unsafe fn load_whole(p: *mut u8, bytes: u32) -> [u64; 2] {
    if bytes < 16 {
        // SAFETY: the caller's contract.
        return [unsafe { atomic_load(p, bytes) }, 0];
    }
    if (p as usize).is_multiple_of(16) {
        // SAFETY: 16 live bytes aligned to 16 (the caller's contract, checked
        // here); every access racing it is atomic.
        let v = unsafe { AtomicU128::from_ptr(p as *mut u128) }.load(Ordering::SeqCst);
        return [v as u64, (v >> 64) as u64];
    }
    // SAFETY: the caller's contract: 16 live bytes aligned to 8.
    unsafe { [atomic_load(p, 8), atomic_load(p.add(8), 8)] }
}

/// Writes `words` (`bytes` of them: 2, 4, 8 or 16) at `p` in one atomic
/// access, as [`load_whole`] reads them.
///
/// # Safety
/// As for [`load_whole`].
#[inline]
pub(crate) unsafe fn store_whole(p: *mut u8, bytes: u32, words: [u64; 2]) {
    if bytes < 16 {
        // SAFETY: the caller's contract.
        return unsafe { atomic_store(p, bytes, words[0]) };
    }
    if (p as usize).is_multiple_of(16) {
        let v = words[0] as u128 | (words[1] as u128) << 64;
        // SAFETY: as in `load_whole`.
        unsafe { AtomicU128::from_ptr(p as *mut u128) }.store(v, Ordering::SeqCst);
        return;
    }
    // SAFETY: the caller's contract: 16 live bytes aligned to 8.
    unsafe {
        atomic_store(p, 8, words[0]);
        atomic_store(p.add(8), 8, words[1]);
    }
}

/// Element `k` of `size` bytes (zero-extended) of the vector `words` hold.
#[inline]
pub(crate) fn element(words: [u64; 2], size: u32, k: usize) -> u64 {
    let bit = k as u32 * size * 8;
    let word = words[(bit / 64) as usize] >> (bit % 64);
    if size >= 8 {
        word
    } else {
        word & ((1u64 << (size * 8)) - 1)
    }
}

/// The words of a vector of the elements `values` (`size` bytes each,
/// their low bytes taken).
#[inline]
pub(crate) fn pack(values: &[u64], size: u32) -> [u64; 2] {
    let mut words = [0u64; 2];
    for (k, &v) in values.iter().enumerate() {
        let bit = k as u32 * size * 8;
        let v = if size >= 8 {
            v
        } else {
            v & ((1u64 << (size * 8)) - 1)
        };
        words[(bit / 64) as usize] |= v << (bit % 64);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_pack_and_unpack_little_endian() {
        let w = pack(&[0x1_1111_2222, 0x3333, 0xffff_4444, 0x5555], 4);
        assert_eq!(w, [0x3333_1111_2222, 0x5555_ffff_4444]);
        let back: Vec<u64> = (0..4).map(|k| element(w, 4, k)).collect();
        assert_eq!(back, [0x1111_2222, 0x3333, 0xffff_4444, 0x5555]);
        let w = pack(&[7, u64::MAX], 8);
        assert_eq!((element(w, 8, 0), element(w, 8, 1)), (7, u64::MAX));
        let w = pack(&[0xabcd, 0x1_0002, 3, 0xffff], 2);
        assert_eq!(w, [0xffff_0003_0002_abcd, 0]);
        assert_eq!(element(w, 2, 3), 0xffff);
    }

    #[test]
    fn only_ordered_global_vectors_up_to_16_bytes_are_whole() {
        use MemOrder::*;
        assert_eq!(whole_width(Relaxed, Sp::Global, 8, 2), Some(16));
        assert_eq!(whole_width(Volatile, Sp::Generic, 4, 4), Some(16));
        assert_eq!(whole_width(Acquire, Sp::Global, 4, 2), Some(8));
        assert_eq!(whole_width(Release, Sp::Global, 2, 4), Some(8));
        assert_eq!(whole_width(Plain, Sp::Global, 8, 2), None);
        assert_eq!(whole_width(Relaxed, Sp::Shared, 8, 2), None);
        assert_eq!(whole_width(Relaxed, Sp::Global, 8, 1), None);
        assert_eq!(whole_width(Relaxed, Sp::Global, 8, 4), None);
    }

    #[test]
    fn a_16_byte_access_is_whole_at_either_alignment() {
        let mut buf = [0u64; 4];
        let p = buf.as_mut_ptr() as *mut u8;
        for at in [0usize, 8] {
            // SAFETY: 16 of the buffer's 32 bytes, aligned to 8.
            unsafe {
                store_whole(p.add(at), 16, [1, 2]);
                assert_eq!(load_whole(p.add(at), 16), [1, 2]);
            }
        }
    }
}
