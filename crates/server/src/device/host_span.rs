//! [`HostSpan`]: the part of a client's pinned host region that one copy reads
//! or writes (or a client's mark), resolved to this process's mapping of the region; and
//! [`map_region`], which checks and maps such a region where it is used.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cumux_protocol::pinned::{check_memfd, HostMapping};
use cumux_protocol::{codes, CuError, Handle};

fn invalid(detail: impl Into<String>) -> CuError {
    CuError::new(codes::INVALID_VALUE, detail)
}

/// Part of a registered region that a copy reads or writes: the region's id
/// (unique in the server) and the range; `mapping` is this process's mapping
/// of the region, filled in by whoever resolved the id (`None`: unknown here,
/// and the copy fails where it runs).
#[derive(Clone)]
pub struct HostSpan {
    pub region: Handle,
    pub offset: u64,
    pub bytes: u64,
    pub mapping: Option<Arc<HostMapping>>,
}

impl PartialEq for HostSpan {
    fn eq(&self, other: &Self) -> bool {
        (self.region, self.offset, self.bytes) == (other.region, other.offset, other.bytes)
    }
}

impl std::fmt::Debug for HostSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HostSpan(region {}, [{}, +{}){})",
            self.region,
            self.offset,
            self.bytes,
            if self.mapping.is_some() {
                ""
            } else {
                ", unresolved"
            }
        )
    }
}

impl HostSpan {
    fn mapping(&self) -> Result<&HostMapping, CuError> {
        self.mapping
            .as_deref()
            .ok_or_else(|| invalid(format!("unknown host region {}", self.region)))
    }

    /// The span's bytes, to copy to the device.
    pub fn read(&self) -> Result<&[u8], CuError> {
        self.mapping()?
            .bytes(self.offset, self.bytes)
            .ok_or_else(|| invalid(format!("{self:?} is outside its region")))
    }

    /// The span's bytes, to copy into from the device.
    ///
    /// # Safety
    /// No other reference to the span's bytes may be used meanwhile in this
    /// process; stream order keeps the copies of one program apart.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn write(&self) -> Result<&mut [u8], CuError> {
        // SAFETY: exclusivity is the caller's.
        unsafe { self.mapping()?.bytes_mut(self.offset, self.bytes) }
            .ok_or_else(|| invalid(format!("{self:?} is outside its region")))
    }

    /// Stores `value` in the span (8 aligned bytes of a client's region) as
    /// one atomic store: a client's mark (`Call::Mark`), which the client
    /// reads atomically.
    pub fn store_mark(&self, value: u64) -> Result<(), CuError> {
        // SAFETY: only atomic stores reach the span here, and the client only
        // reads it.
        let bytes = unsafe { self.write()? };
        if bytes.len() != 8 || !(bytes.as_ptr() as usize).is_multiple_of(8) {
            return Err(invalid(format!("{self:?} is not an aligned mark")));
        }
        // SAFETY: 8 aligned bytes of a shared mapping that outlives this
        // store; every other access to them is atomic too.
        let cell = unsafe { AtomicU64::from_ptr(bytes.as_mut_ptr().cast()) };
        cell.fetch_max(value, Ordering::Release);
        Ok(())
    }
}

/// Checks that `fd` is a client's sealed memfd of `bytes` and maps it here.
pub fn map_region(fd: BorrowedFd<'_>, bytes: u64) -> Result<Arc<HostMapping>, CuError> {
    check_memfd(fd, bytes).map_err(invalid)?;
    let mapping = HostMapping::map(fd, bytes)
        .map_err(|e| CuError::new(codes::OUT_OF_MEMORY, format!("cannot map a region: {e}")))?;
    Ok(Arc::new(mapping))
}
