//! Pinned host memory shared by client, server and worker: sealed memfds the
//! client maps as the program's pinned buffers, their checks, and mappings.
//!
//! A client's `cuMemHostAlloc` memory is a memfd it maps `MAP_SHARED`; the
//! server (and a worker behind it) map the same pages, so a copy between
//! device memory and a pinned buffer names a region and an offset instead of
//! carrying the bytes. The rules are the shared area's ([`crate::shm`]): the
//! memfd must live on tmpfs and be sealed against shrinking, so no later
//! `ftruncate` by the client can make an access by the server fault.

use std::fs::File;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::{MmapOptions, MmapRaw};

use crate::memfd;

/// The byte the client sends with a region's memfd on the socket
/// (`SCM_RIGHTS`), right after its `HostRegister` call.
pub const FD_TAG: u8 = b'P';

/// The largest region a client may register (1 TiB): a bound, not a quota.
pub const MAX_REGION_BYTES: u64 = 1 << 40;

/// Mappings of this process alive now (for clean-up tests).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// How many [`HostMapping`]s this process holds.
pub fn live_mappings() -> usize {
    LIVE.load(Ordering::Acquire)
}

/// A memfd of `len` bytes sealed against shrinking, growing and further seals.
pub fn create_memfd(len: u64) -> io::Result<OwnedFd> {
    memfd::create_sealed(c"cumux-pinned", len).map(OwnedFd::from)
}

/// Checks a descriptor a client sent as a region of `len` bytes: a memfd on
/// tmpfs, sealed against shrinking, holding at least `len` bytes.
pub fn check_memfd(fd: BorrowedFd<'_>, len: u64) -> Result<(), String> {
    if len == 0 || len > MAX_REGION_BYTES {
        return Err(format!("a region of {len} bytes"));
    }
    let size = memfd::check_sealed_tmpfs(fd)?;
    if size < len {
        return Err(format!(
            "the memfd holds {size} bytes, the region needs {len}"
        ));
    }
    Ok(())
}

/// A `MAP_SHARED` read-write mapping of a region's memfd in this process.
///
/// The pages are shared with the client, which may write them at any time:
/// readers copy bytes out and never rely on them staying put, as with the
/// shared area.
pub struct HostMapping {
    map: Backing,
}

/// Where a [`HostMapping`]'s pages are: where the kernel chose, or at an
/// address asked for.
enum Backing {
    Chosen(MmapRaw),
    At(FixedMapping),
}

impl std::fmt::Debug for HostMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMapping")
            .field("len", &self.len())
            .finish()
    }
}

impl HostMapping {
    /// Maps `len` bytes of `fd` (checked by [`check_memfd`] first where the
    /// descriptor comes from someone else).
    pub fn map(fd: BorrowedFd<'_>, len: u64) -> io::Result<HostMapping> {
        let len = usize::try_from(len).map_err(|_| io::Error::other("region too large"))?;
        let file = File::from(fd.try_clone_to_owned()?);
        let map = MmapOptions::new().len(len).map_raw(&file)?;
        LIVE.fetch_add(1, Ordering::AcqRel);
        Ok(HostMapping {
            map: Backing::Chosen(map),
        })
    }

    /// Maps `len` bytes of `fd` at `at` ([`FixedMapping::map`]'s rules):
    /// for a region another process must map at the same address, tried
    /// again elsewhere where that one has the address taken.
    pub fn map_at(fd: BorrowedFd<'_>, len: u64, at: u64) -> io::Result<HostMapping> {
        let map = FixedMapping::map(fd, len, at)?;
        LIVE.fetch_add(1, Ordering::AcqRel);
        Ok(HostMapping {
            map: Backing::At(map),
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        match &self.map {
            Backing::Chosen(map) => map.as_mut_ptr(),
            Backing::At(map) => map.as_ptr(),
        }
    }

    pub fn len(&self) -> usize {
        match &self.map {
            Backing::Chosen(map) => map.len(),
            Backing::At(map) => map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `[offset, offset + len)` lies inside the mapping.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= self.len() as u64)
    }

    /// The bytes at `[offset, offset + len)`, if inside the mapping.
    pub fn bytes(&self, offset: u64, len: u64) -> Option<&[u8]> {
        if !self.contains(offset, len) {
            return None;
        }
        // SAFETY: the range lies inside a live mapping of a memfd sealed against
        // shrinking (so it never faults); every bit pattern is a valid `u8`,
        // and a concurrent write by the client only changes the values copied.
        Some(unsafe {
            std::slice::from_raw_parts(self.as_ptr().add(offset as usize), len as usize)
        })
    }

    /// The bytes at `[offset, offset + len)` for writing, if inside the mapping.
    ///
    /// # Safety
    /// No other reference to the range may be used while the slice lives
    /// (stream order keeps copies into one range apart).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self, offset: u64, len: u64) -> Option<&mut [u8]> {
        if !self.contains(offset, len) {
            return None;
        }
        // SAFETY: as in `bytes`; exclusivity within this process is the caller's.
        Some(unsafe {
            std::slice::from_raw_parts_mut(self.as_ptr().add(offset as usize), len as usize)
        })
    }
}

impl Drop for HostMapping {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A second `MAP_SHARED` mapping of a region's memfd, at the address the
/// client has it: a device that reaches host memory by its address (a GPU's
/// unified addressing) then reaches the region where the client's kernels
/// look for it. Only where nothing is mapped there already in this process.
pub struct FixedMapping {
    at: usize,
    len: usize,
}

impl FixedMapping {
    /// Maps `len` bytes of `fd` at `at`; an error where `at` is not page
    /// aligned, outside user space, or where anything is mapped in the way.
    pub fn map(fd: BorrowedFd<'_>, len: u64, at: u64) -> io::Result<FixedMapping> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let end = at.checked_add(len).filter(|&e| e <= USER_SPACE_END);
        if len == 0 || at == 0 || !at.is_multiple_of(page) || end.is_none() {
            return Err(io::Error::other(format!(
                "no mapping of {len} bytes at {at:#x}"
            )));
        }
        let (at, len) = (at as usize, len as usize);
        // SAFETY: MAP_FIXED_NOREPLACE maps only where nothing is mapped (the
        // kernel refuses otherwise), so no mapping of this process is replaced;
        // `fd` is a memfd the caller checked to hold `len` bytes, sealed against
        // shrinking, so the pages never fault.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        if p as usize != at {
            // A kernel without MAP_FIXED_NOREPLACE takes the address as a hint.
            // SAFETY: `p` is the mapping of `len` bytes just made.
            unsafe { libc::munmap(p, len) };
            return Err(io::Error::other(format!("{at:#x} is taken")));
        }
        Ok(FixedMapping { at, len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.at as *mut u8
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for FixedMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping `map` made, unmapped once.
        unsafe { libc::munmap(self.at as *mut libc::c_void, self.len) };
    }
}

/// The end of user space on x86-64 and aarch64 (47-bit addresses).
const USER_SPACE_END: u64 = 1 << 47;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, FromRawFd};

    #[test]
    fn a_sealed_memfd_maps_and_shares_its_pages() {
        let fd = create_memfd(8192).unwrap();
        check_memfd(fd.as_fd(), 8192).unwrap();
        assert!(check_memfd(fd.as_fd(), 8193).is_err());
        assert!(check_memfd(fd.as_fd(), 0).is_err());
        let a = HostMapping::map(fd.as_fd(), 8192).unwrap();
        let b = HostMapping::map(fd.as_fd(), 8192).unwrap();
        // SAFETY: nothing else uses the range.
        unsafe { a.bytes_mut(100, 3).unwrap() }.copy_from_slice(&[1, 2, 3]);
        assert_eq!(b.bytes(100, 3).unwrap(), &[1, 2, 3]);
        assert!(b.bytes(8190, 3).is_none());
        assert!(b.bytes(u64::MAX, 2).is_none());
        assert!(b.contains(0, 8192));
    }

    #[test]
    fn a_fixed_mapping_lands_where_asked_and_nowhere_taken() {
        let fd = create_memfd(8192).unwrap();
        let a = HostMapping::map(fd.as_fd(), 8192).unwrap();
        // SAFETY: nothing else uses the range.
        unsafe { a.bytes_mut(0, 4).unwrap() }.copy_from_slice(&[9, 8, 7, 6]);
        // A free address: far from where the kernel places mappings (one it
        // just gave out and took back could go to another test's thread).
        let at = (1u64 << 45) + ((u64::from(std::process::id()) % 4096) << 24);
        let fixed = FixedMapping::map(fd.as_fd(), 8192, at).unwrap();
        assert_eq!(fixed.as_ptr() as u64, at);
        // SAFETY: the fixed mapping holds 8192 bytes at `at`.
        let seen = unsafe { std::slice::from_raw_parts(fixed.as_ptr(), 4) };
        assert_eq!(seen, &[9, 8, 7, 6]);
        // Where something is mapped, and at odd or absurd addresses: refused.
        assert!(FixedMapping::map(fd.as_fd(), 8192, at).is_err());
        assert!(FixedMapping::map(fd.as_fd(), 8192, a.as_ptr() as u64).is_err());
        assert!(FixedMapping::map(fd.as_fd(), 8192, at + 1).is_err());
        assert!(FixedMapping::map(fd.as_fd(), 8192, 0).is_err());
        assert!(FixedMapping::map(fd.as_fd(), 8192, u64::MAX - 4095).is_err());
        drop(fixed);
        // Unmapped at its drop: the address is free again.
        assert!(FixedMapping::map(fd.as_fd(), 8192, at).is_ok());
        // A host mapping at an address asked for: the same pages there.
        let placed = HostMapping::map_at(fd.as_fd(), 8192, at + (1 << 20)).unwrap();
        assert_eq!(placed.as_ptr() as u64, at + (1 << 20));
        assert_eq!(placed.len(), 8192);
        assert_eq!(placed.bytes(0, 4).unwrap(), &[9, 8, 7, 6]);
        assert!(HostMapping::map_at(fd.as_fd(), 8192, at + (1 << 20)).is_err());
        drop(placed);
        assert!(HostMapping::map_at(fd.as_fd(), 8192, at + (1 << 20)).is_ok());
    }

    #[test]
    fn unsealed_or_foreign_descriptors_are_refused() {
        // SAFETY: a NUL-terminated name and valid flags.
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: just created, owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        File::from(fd.try_clone().unwrap()).set_len(4096).unwrap();
        let why = check_memfd(fd.as_fd(), 4096).unwrap_err();
        assert!(why.contains("seal"), "{why}");
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(check_memfd(a.as_fd(), 4096).is_err());
    }
}
