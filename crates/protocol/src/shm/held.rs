//! A bulk payload held where it lies in a ring: the peer cannot write over it
//! until it is dropped, so its bytes can be sent on from another thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use memmap2::MmapRaw;

/// A received bulk payload still in the ring ([`super::Endpoint::recv_bulk_held`]).
/// The endpoint gives its room back to the peer once this is dropped, at its
/// next receive, send or wait (no one is woken for it: a hold keeps at most
/// half the ring, so a writer always has room to stream through to a reader
/// that waits); the mapping stays while this lives, whatever becomes of the
/// endpoint.
pub struct HeldBulk {
    map: Arc<MmapRaw>,
    /// (offset into the mapping, length) of its one or two pieces.
    pieces: [(usize, usize); 2],
    done: Arc<AtomicBool>,
}

impl HeldBulk {
    /// A payload of `pieces` (offsets into `map`, inside it), whose `done`
    /// flag is raised when it is dropped.
    pub(super) fn new(
        map: Arc<MmapRaw>,
        pieces: [(usize, usize); 2],
    ) -> (HeldBulk, Arc<AtomicBool>) {
        assert!(pieces.iter().all(|&(at, n)| at + n <= map.len()));
        let done = Arc::new(AtomicBool::new(false));
        let held = HeldBulk {
            map,
            pieces,
            done: Arc::clone(&done),
        };
        (held, done)
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.pieces[0].1 + self.pieces[1].1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its bytes, in order, in one or two pieces (the second may be empty).
    pub fn pieces(&self) -> [&[u8]; 2] {
        self.pieces.map(|(at, n)| {
            // SAFETY: `[at, at + n)` lies inside the mapping (asserted in
            // `new`), which `self.map` keeps mapped. The peer published these
            // bytes and writes no more there until the endpoint republishes
            // its read position past them, which it does only once `self`
            // is dropped (a peer that writes them anyway only garbles what
            // its own reader gets, as in `Endpoint::read_visited`).
            unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(at), n) }
        })
    }
}

impl Drop for HeldBulk {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
    }
}

impl std::fmt::Debug for HeldBulk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBulk")
            .field("pieces", &self.pieces)
            .finish()
    }
}
