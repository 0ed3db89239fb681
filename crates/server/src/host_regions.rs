//! Pinned host memory a client registered: the session's table of regions
//! (checked memfd, mapping, bounds), the spans copies name, and a worker's table.
//!
//! A region is a client's sealed memfd ([`cumux_protocol::pinned`]) mapped
//! here and, for a context in a worker process, there too. Region ids are
//! unique server-wide, so the regions of sessions sharing one worker never
//! collide; a session resolves only ids of its own table, so a client cannot
//! name another session's region.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cumux_protocol::pinned::{check_memfd, HostMapping};
use cumux_protocol::{codes, CuError, Handle};
use serde::{Deserialize, Serialize};

use crate::device::{DeviceContext, StreamWork};

/// Regions one session may hold at once.
pub const MAX_REGIONS: usize = 4096;

/// Source of region ids, unique in this server.
static NEXT_REGION: AtomicU64 = AtomicU64::new(1);

fn invalid(detail: impl Into<String>) -> CuError {
    CuError::new(codes::INVALID_VALUE, detail)
}

/// Part of a registered region that a copy reads or writes. On the wire it is
/// the region's id and the range; where it runs, `mapping` is this process's
/// mapping of the region (filled in by whoever resolved the id).
#[derive(Clone, Serialize, Deserialize)]
pub struct HostSpan {
    pub region: Handle,
    pub offset: u64,
    pub bytes: u64,
    #[serde(skip)]
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
}

struct Region {
    /// The client's address of the region, for logs.
    base: u64,
    mapping: Arc<HostMapping>,
}

/// One session's registered regions.
#[derive(Default)]
pub struct HostRegions {
    regions: HashMap<Handle, Region>,
}

impl HostRegions {
    /// Checks and maps the memfd a client sent as `bytes` at its address
    /// `base`, and registers it with `ctx`; the new region's id.
    pub fn register(
        &mut self,
        ctx: &dyn DeviceContext,
        base: u64,
        bytes: u64,
        fd: Result<OwnedFd, String>,
    ) -> Result<Handle, CuError> {
        let fd = fd.map_err(|why| invalid(format!("no memfd for the region: {why}")))?;
        if self.regions.len() >= MAX_REGIONS {
            return Err(CuError::new(
                codes::OUT_OF_MEMORY,
                format!("a session may register {MAX_REGIONS} host regions"),
            ));
        }
        check_memfd(fd.as_fd(), bytes).map_err(invalid)?;
        let mapping = HostMapping::map(fd.as_fd(), bytes)
            .map_err(|e| CuError::new(codes::OUT_OF_MEMORY, format!("cannot map a region: {e}")))?;
        let mapping = Arc::new(mapping);
        let region = NEXT_REGION.fetch_add(1, Ordering::Relaxed);
        ctx.host_register(region, &mapping, fd.as_fd())?;
        tracing::debug!(
            region,
            base = format_args!("{base:#x}"),
            bytes,
            "host region registered"
        );
        self.regions.insert(region, Region { base, mapping });
        Ok(region)
    }

    /// `[offset, offset + bytes)` of this session's `region`, checked.
    pub fn span(&self, region: Handle, offset: u64, bytes: u64) -> Result<HostSpan, CuError> {
        let r = self
            .regions
            .get(&region)
            .ok_or_else(|| invalid(format!("{region} is no host region of this session")))?;
        if !r.mapping.contains(offset, bytes) {
            return Err(invalid(format!(
                "[{offset}, +{bytes}) is outside host region {region} of {} bytes",
                r.mapping.len()
            )));
        }
        Ok(HostSpan {
            region,
            offset,
            bytes,
            mapping: Some(Arc::clone(&r.mapping)),
        })
    }

    /// Drops `region` (the caller has waited for work that may use it).
    pub fn unregister(&mut self, ctx: &dyn DeviceContext, region: Handle) -> Result<(), CuError> {
        let r = self
            .regions
            .remove(&region)
            .ok_or_else(|| invalid(format!("{region} is no host region of this session")))?;
        ctx.host_unregister(region);
        tracing::debug!(
            region,
            base = format_args!("{:#x}", r.base),
            "host region unregistered"
        );
        Ok(())
    }

    /// Drops every region (at the session's end).
    pub fn clear(&mut self, ctx: &dyn DeviceContext) {
        for (region, _) in self.regions.drain() {
            ctx.host_unregister(region);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}

/// A worker's regions, from every connection to its context, by server id.
#[derive(Default)]
pub struct WorkerRegions {
    regions: Mutex<HashMap<Handle, Arc<HostMapping>>>,
}

impl WorkerRegions {
    fn lock(&self) -> MutexGuard<'_, HashMap<Handle, Arc<HostMapping>>> {
        self.regions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps the memfd the server forwarded as `region` and registers it with `ctx`.
    pub fn insert(
        &self,
        ctx: &dyn DeviceContext,
        region: Handle,
        bytes: u64,
        fd: Option<OwnedFd>,
    ) -> Result<(), CuError> {
        let fd = fd.ok_or_else(|| invalid("no memfd came with the region"))?;
        check_memfd(fd.as_fd(), bytes).map_err(invalid)?;
        if self.lock().contains_key(&region) {
            return Err(invalid(format!("host region {region} exists")));
        }
        let mapping = HostMapping::map(fd.as_fd(), bytes)
            .map_err(|e| CuError::new(codes::OUT_OF_MEMORY, format!("cannot map a region: {e}")))?;
        let mapping = Arc::new(mapping);
        ctx.host_register(region, &mapping, fd.as_fd())?;
        self.lock().insert(region, mapping);
        Ok(())
    }

    pub fn remove(&self, ctx: &dyn DeviceContext, region: Handle) {
        if self.lock().remove(&region).is_some() {
            ctx.host_unregister(region);
        }
    }

    /// Fills in the mapping of the host span `work` names, if it names one;
    /// an unknown region stays unresolved, and the copy fails where it runs.
    pub fn resolve(&self, work: &mut StreamWork) {
        if let StreamWork::HostToDevice { host, .. } | StreamWork::DeviceToHost { host, .. } = work
        {
            host.mapping = self.lock().get(&host.region).cloned();
        }
    }
}
