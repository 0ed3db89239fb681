//! Pinned host memory a client registered: the session's table of regions
//! (checked memfd, mapping, bounds) and the spans its copies name.
//!
//! A region is a client's sealed memfd ([`cumux_protocol::pinned`]) mapped
//! here and, for a context in a worker process, there too. Region ids are
//! unique server-wide, so the regions of sessions sharing one worker never
//! collide; a session resolves only ids of its own table, so a client cannot
//! name another session's region.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cumux_protocol::pinned::HostMapping;
use cumux_protocol::{codes, CuError, Handle};

use crate::device::host_span::{map_region, HostSpan};
use crate::device::{DeviceContext, HostRegion};

/// Regions one session may hold at once.
pub const MAX_REGIONS: usize = 4096;

/// Source of region ids, unique in this server.
static NEXT_REGION: AtomicU64 = AtomicU64::new(1);

fn invalid(detail: impl Into<String>) -> CuError {
    CuError::new(codes::INVALID_VALUE, detail)
}

struct Region {
    /// The client's address of the region.
    base: u64,
    mapping: Arc<HostMapping>,
    /// The client's memfd, to register the region again with another
    /// context when the session moves; kept for the first
    /// [`KEPT_DESCRIPTORS`] regions only, so that no client holds many of
    /// the server's descriptors.
    fd: Option<OwnedFd>,
}

/// Regions of a session whose memfd is kept open for a move.
pub const KEPT_DESCRIPTORS: usize = 64;

/// `[offset, offset + bytes)` of `region`, mapped by `mapping`, checked.
pub fn span_of(
    region: Handle,
    mapping: &Arc<HostMapping>,
    offset: u64,
    bytes: u64,
) -> Result<HostSpan, CuError> {
    if !mapping.contains(offset, bytes) {
        return Err(invalid(format!(
            "[{offset}, +{bytes}) is outside host region {region} of {} bytes",
            mapping.len()
        )));
    }
    Ok(HostSpan {
        region,
        offset,
        bytes,
        mapping: Some(Arc::clone(mapping)),
    })
}

/// One session's registered regions.
#[derive(Default)]
pub struct HostRegions {
    regions: HashMap<Handle, Region>,
    /// The regions the device reaches at the client's address: base → bytes.
    /// Device work may name them there as it names device memory.
    reached: BTreeMap<u64, u64>,
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
        let mapping = map_region(fd.as_fd(), bytes)?;
        let region = NEXT_REGION.fetch_add(1, Ordering::Relaxed);
        // A region overlapping one the device reaches already is not reached
        // again: the client cannot have two regions at one address.
        let reached = ctx.host_register(HostRegion {
            id: region,
            mapping: &mapping,
            fd: fd.as_fd(),
            client_base: base,
        })? && self.reached_range(base).is_none();
        tracing::debug!(
            region,
            base = format_args!("{base:#x}"),
            bytes,
            reached,
            "host region registered"
        );
        if reached {
            self.reached.insert(base, bytes);
        }
        let kept = self.regions.values().filter(|r| r.fd.is_some()).count();
        let fd = (kept < KEPT_DESCRIPTORS).then_some(fd);
        self.regions.insert(region, Region { base, mapping, fd });
        Ok(region)
    }

    /// Registers every region with `ctx` as it was with the session's
    /// context (a moved session's new one): each reached, or not, as before.
    pub fn register_again(&self, ctx: &dyn DeviceContext) -> Result<(), CuError> {
        for (&id, r) in &self.regions {
            let fd = r.fd.as_ref().ok_or_else(|| {
                CuError::new(
                    codes::NOT_SUPPORTED,
                    format!(
                        "the session holds more than {KEPT_DESCRIPTORS} pinned host regions: \
                         region {id} cannot be registered again"
                    ),
                )
            })?;
            let reached = ctx.host_register(HostRegion {
                id,
                mapping: &r.mapping,
                fd: fd.as_fd(),
                client_base: r.base,
            })?;
            let was = self.reached.get(&r.base) == Some(&(r.mapping.len() as u64));
            if reached != was {
                return Err(CuError::new(
                    codes::NOT_SUPPORTED,
                    format!(
                        "host region {id} at {:#x} is {} by the target device at the program's \
                         address",
                        r.base,
                        if reached {
                            "now reached"
                        } else {
                            "no longer reached"
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `[offset, offset + bytes)` of this session's `region`, checked.
    pub fn span(&self, region: Handle, offset: u64, bytes: u64) -> Result<HostSpan, CuError> {
        let r = self
            .regions
            .get(&region)
            .ok_or_else(|| invalid(format!("{region} is no host region of this session")))?;
        span_of(region, &r.mapping, offset, bytes)
    }

    /// Drops `region` (the caller has waited for work that may use it).
    pub fn unregister(&mut self, ctx: &dyn DeviceContext, region: Handle) -> Result<(), CuError> {
        let r = self
            .regions
            .remove(&region)
            .ok_or_else(|| invalid(format!("{region} is no host region of this session")))?;
        ctx.host_unregister(region);
        if self.reached.get(&r.base) == Some(&(r.mapping.len() as u64)) {
            self.reached.remove(&r.base);
        }
        tracing::debug!(
            region,
            base = format_args!("{:#x}", r.base),
            "host region unregistered"
        );
        Ok(())
    }

    /// The region the device reaches at the client's address that holds
    /// `ptr`: (base, bytes).
    pub fn reached_range(&self, ptr: u64) -> Option<(u64, u64)> {
        let (&base, &bytes) = self.reached.range(..=ptr).next_back()?;
        (ptr - base < bytes).then_some((base, bytes))
    }

    /// The mapping of this session's `region`.
    pub fn mapping(&self, region: Handle) -> Option<Arc<HostMapping>> {
        self.regions.get(&region).map(|r| Arc::clone(&r.mapping))
    }

    /// Drops every region (at the session's end); their ids.
    pub fn clear(&mut self, ctx: &dyn DeviceContext) -> Vec<Handle> {
        let mut gone = Vec::with_capacity(self.regions.len());
        for (region, _) in self.regions.drain() {
            ctx.host_unregister(region);
            gone.push(region);
        }
        self.reached.clear();
        gone
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}
