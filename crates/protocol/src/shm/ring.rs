//! One byte ring of an area as one side sees it: where its bytes lie, which
//! header words publish its positions, the checks of the peer's position and
//! the copies in and out that stay inside the ring whatever the peer writes.

use std::sync::atomic::Ordering;

use super::area::ShmArea;
use super::layout::{read_position_offset, write_position_offset, ShmError, ShmLayout};

/// One byte ring as seen from one side: where its data lies and which header
/// words hold its positions.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ring {
    pub(super) data: usize,
    pub(super) cap: u64,
    pub(super) write_word: usize,
    pub(super) read_word: usize,
}

impl Ring {
    pub(super) fn new(layout: &ShmLayout, i: usize) -> Ring {
        Ring {
            data: layout.ring_offset(i),
            cap: layout.rings()[i] as u64,
            write_word: write_position_offset(i),
            read_word: read_position_offset(i),
        }
    }

    /// Free bytes of a ring this side has written up to `written`; an
    /// impossible read position of the peer is a violation.
    #[inline]
    pub(super) fn free(&self, area: &ShmArea, written: u64) -> Result<u64, ShmError> {
        let peer_read = area.word64(self.read_word).load(Ordering::Acquire);
        let used = self.span(peer_read, written, || {
            format!("read position {peer_read} of a ring written to {written}")
        })?;
        Ok(self.cap - used)
    }

    /// Bytes waiting in a ring this side has read up to `read`; an impossible
    /// write position of the peer is a violation.
    #[inline]
    pub(super) fn available(&self, area: &ShmArea, read: u64) -> Result<u64, ShmError> {
        let peer_write = area.word64(self.write_word).load(Ordering::Acquire);
        self.span(read, peer_write, || {
            format!("write position {peer_write} of a ring read to {read}")
        })
    }

    /// The bytes between the read position `from` and the write position `to`
    /// (positions count up and wrap); more than the ring holds is a violation,
    /// told by `violation`.
    #[inline]
    fn span(
        &self,
        from: u64,
        to: u64,
        violation: impl FnOnce() -> String,
    ) -> Result<u64, ShmError> {
        let span = to.wrapping_sub(from);
        if span > self.cap {
            return Err(ShmError::Violation(violation()));
        }
        Ok(span)
    }

    /// Publishes this side's write position to the peer.
    #[inline]
    pub(super) fn publish_write(&self, area: &ShmArea, written: u64) {
        area.word64(self.write_word)
            .store(written, Ordering::Release);
    }

    /// Publishes this side's read position to the peer.
    #[inline]
    pub(super) fn publish_read(&self, area: &ShmArea, read: u64) {
        area.word64(self.read_word).store(read, Ordering::Release);
    }

    /// Copies `bytes` (at most the free space) into the ring at position `written`.
    #[inline]
    pub(super) fn copy_in(&self, area: &ShmArea, written: u64, bytes: &[u8]) {
        let at = (written & (self.cap - 1)) as usize;
        let first = bytes.len().min(self.cap as usize - at);
        let base = area.base();
        // SAFETY: `at + first <= cap` and the wrapped rest is `<= cap - first`
        // (callers pass at most the free space, itself at most `cap`), so both
        // copies stay inside the ring, which lies inside the mapping. The bytes
        // between the peer's read position and ours are ours alone to write; a
        // peer that writes them anyway only garbles its own messages.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(self.data + at), first);
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr().add(first),
                base.add(self.data),
                bytes.len() - first,
            );
        }
    }

    /// Where `n` bytes (at most the ring's size) from position `at` lie: up
    /// to the ring's end, then (the rest, maybe none) from its start.
    #[inline]
    pub(super) fn pieces(&self, area: &ShmArea, at: u64, n: usize) -> [(*mut u8, usize); 2] {
        let at = (at & (self.cap - 1)) as usize;
        let first = n.min(self.cap as usize - at);
        let base = area.base();
        // SAFETY: `at + first <= cap` and `n - first <= cap - first` (callers
        // pass at most the free or available bytes, at most `cap`): both
        // pieces lie inside the ring, inside the mapping.
        unsafe {
            [
                (base.add(self.data + at), first),
                (base.add(self.data), n - first),
            ]
        }
    }

    /// Copies `n` bytes (at most the available ones) out of the ring from
    /// position `read` to `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for `n` bytes of writes.
    #[inline]
    pub(super) unsafe fn copy_out(&self, area: &ShmArea, read: u64, dst: *mut u8, n: usize) {
        let at = (read & (self.cap - 1)) as usize;
        let first = n.min(self.cap as usize - at);
        let base = area.base();
        // SAFETY: both source ranges lie inside the ring (as in `copy_in`); the
        // caller vouches for `dst`. The peer may be writing these bytes as we
        // copy them (it should not): the copy then holds garbage, which the
        // decoder rejects like any other.
        unsafe {
            std::ptr::copy_nonoverlapping(base.add(self.data + at), dst, first);
            std::ptr::copy_nonoverlapping(base.add(self.data), dst.add(first), n - first);
        }
    }
}
