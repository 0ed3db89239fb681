//! Sealed memfds on tmpfs, the only descriptors one side maps from the other
//! (the shared area, pinned regions): creating one, and checking one that the
//! other side sent before anything maps it.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A memfd named `name` of `len` bytes, sealed against shrinking, growing and
/// further seals, so a mapping of it never faults past its end.
pub fn create_sealed(name: &CStr, len: u64) -> io::Result<File> {
    // SAFETY: a NUL-terminated name and valid flags; the result is checked.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(len)?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor this function owns.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// Checks a descriptor the other side sent: a memfd on tmpfs, sealed against
/// shrinking, so nothing its sender does later can make an access to a mapping
/// of it fault. Returns its size in bytes, for the caller to check.
pub fn check_sealed_tmpfs(fd: BorrowedFd<'_>) -> Result<u64, String> {
    // SAFETY: fcntl on a descriptor the caller holds open.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        return Err(format!(
            "not a sealable memfd: {}",
            io::Error::last_os_error()
        ));
    }
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err("the memfd is not sealed against shrinking".into());
    }
    // SAFETY: an all-zero statfs is a valid value for the kernel to overwrite.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes into `fs`, which is valid for writes.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) } < 0 {
        return Err(format!("fstatfs: {}", io::Error::last_os_error()));
    }
    if fs.f_type != libc::TMPFS_MAGIC {
        // hugetlbfs memfds can fault (SIGBUS) when the huge page pool runs dry.
        return Err(format!(
            "the memfd lives on fs type {:#x}, not tmpfs",
            fs.f_type
        ));
    }
    // SAFETY: an all-zero stat is a valid value for the kernel to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `st`, which is valid for writes.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(format!("fstat: {}", io::Error::last_os_error()));
    }
    Ok(st.st_size as u64)
}
