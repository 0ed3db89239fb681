//! A mapped area: creating the sealed memfd a client hands over, checking and
//! mapping one a client sent, and the atomic header words both sides share.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};

use super::layout::{ShmLayout, AREA_MAGIC, HEADER_BYTES, OFF_MAGIC};
use crate::memfd;

/// A mapped area. The mapping is shared with the payloads held in it
/// ([`super::HeldBulk`]), so it stays mapped while one is still read.
pub struct ShmArea {
    map: Arc<MmapRaw>,
    layout: ShmLayout,
}

impl std::fmt::Debug for ShmArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmArea")
            .field("layout", &self.layout)
            .finish()
    }
}

impl ShmArea {
    /// Creates a sealed memfd of `layout`'s size and maps it; the descriptor is
    /// what the server gets. Sealed against shrinking, so a mapping of it never
    /// faults past its end.
    pub fn create(layout: ShmLayout) -> io::Result<(ShmArea, OwnedFd)> {
        layout
            .check()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let file = memfd::create_sealed(c"cumux-shm", layout.total_bytes() as u64)?;
        let area = ShmArea::map(&file, layout)?;
        area.word64(OFF_MAGIC).store(AREA_MAGIC, Ordering::Relaxed);
        Ok((area, file.into()))
    }

    /// Maps an area a client sent. The descriptor must be a memfd on tmpfs,
    /// sealed against shrinking and at least as large as `layout` says, so
    /// nothing the client does later can make an access to it fault.
    pub fn attach(fd: OwnedFd, layout: ShmLayout) -> Result<ShmArea, String> {
        layout.check()?;
        let size = memfd::check_sealed_tmpfs(fd.as_fd())?;
        if size < layout.total_bytes() as u64 {
            return Err(format!(
                "the memfd holds {size} bytes, the layout needs {}",
                layout.total_bytes()
            ));
        }
        let file = File::from(fd);
        ShmArea::map(&file, layout).map_err(|e| format!("mmap: {e}"))
    }

    fn map(file: &File, layout: ShmLayout) -> io::Result<ShmArea> {
        let map = MmapOptions::new().len(layout.total_bytes()).map_raw(file)?;
        Ok(ShmArea {
            map: Arc::new(map),
            layout,
        })
    }

    pub fn layout(&self) -> ShmLayout {
        self.layout
    }

    /// The start of the mapping and its length: for a pin of the whole area
    /// (a worker's device copies), and for tests that play a hostile peer.
    pub fn raw_parts(&self) -> (*mut u8, usize) {
        (self.map.as_mut_ptr(), self.map.len())
    }

    /// The start of the mapping, for the rings' copies.
    #[inline]
    pub(super) fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The mapping itself, for a payload that outlives a borrow of the area.
    pub(super) fn mapping(&self) -> Arc<MmapRaw> {
        Arc::clone(&self.map)
    }

    /// The u64 header word at `offset` (one of the `OFF_*` words).
    pub fn word64(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= HEADER_BYTES);
        // SAFETY: `offset` is an aligned header word inside the mapping (asserted),
        // which lives as long as `self`; the peer touches these words only
        // atomically, and any value it leaves there is a valid u64.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The u32 header word at `offset` (one of the `OFF_*` words).
    pub fn word32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= HEADER_BYTES);
        // SAFETY: as in `word64`, for an aligned 4-byte header word.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU32>() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::layout::MAX_RING_BYTES;
    use crate::shm::test_data::SMALL;
    use std::os::fd::FromRawFd;

    #[test]
    fn only_sealed_tmpfs_memfds_of_the_right_size_attach() {
        let (_, fd) = ShmArea::create(SMALL).unwrap();
        let big = ShmLayout {
            request_bulk: MAX_RING_BYTES,
            ..SMALL
        };
        let err = ShmArea::attach(fd, big).unwrap_err();
        assert!(err.contains("needs"), "{err}");

        // SAFETY: a NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: just created, owned by nobody else.
        let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
        File::from(unsealed.try_clone().unwrap())
            .set_len(SMALL.total_bytes() as u64)
            .unwrap();
        let err = ShmArea::attach(unsealed, SMALL).unwrap_err();
        assert!(err.contains("seal"), "{err}");

        let path = std::env::temp_dir().join(format!("cumux-shm-test-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        file.set_len(SMALL.total_bytes() as u64).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(ShmArea::attach(file.into(), SMALL).is_err());

        let odd = ShmLayout {
            reply_ring: 5000,
            ..SMALL
        };
        assert!(ShmArea::create(odd).is_err());
    }
}
