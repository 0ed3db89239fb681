//! What the shared-memory tests share: the smallest layout, so rings wrap
//! quickly, and byte patterns that show where a copy went wrong.

use super::layout::{ShmLayout, MIN_RING_BYTES};

pub(super) const SMALL: ShmLayout = ShmLayout {
    request_ring: MIN_RING_BYTES,
    reply_ring: MIN_RING_BYTES,
    request_bulk: MIN_RING_BYTES,
    reply_bulk: MIN_RING_BYTES,
};

pub(super) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
