//! [`WorkerRegions`]: a worker's table of the pinned host regions the server
//! forwarded (every connection's, by the server's region id), which resolves
//! the host spans of queued copies to this process's mappings.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use cumux_protocol::pinned::HostMapping;
use cumux_protocol::{codes, CuError, Handle};

use crate::device::host_span::map_region;
use crate::device::{DeviceContext, HostRegion, StreamWork};
use crate::locking::lock;

/// A worker's regions, from every connection to its context, by server id.
#[derive(Default)]
pub struct WorkerRegions {
    regions: Mutex<HashMap<Handle, Arc<HostMapping>>>,
}

impl WorkerRegions {
    fn lock(&self) -> MutexGuard<'_, HashMap<Handle, Arc<HostMapping>>> {
        lock(&self.regions)
    }

    /// Maps the memfd the server forwarded as `region` and registers it with
    /// `ctx`; whether the device reaches it at `client_base` too.
    pub fn insert(
        &self,
        ctx: &dyn DeviceContext,
        region: Handle,
        bytes: u64,
        client_base: u64,
        fd: Option<OwnedFd>,
    ) -> Result<bool, CuError> {
        let fd =
            fd.ok_or_else(|| CuError::new(codes::INVALID_VALUE, "no memfd came with the region"))?;
        let mapping = map_region(fd.as_fd(), bytes)?;
        if self.lock().contains_key(&region) {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("host region {region} exists"),
            ));
        }
        let reached = ctx.host_register(HostRegion {
            id: region,
            mapping: &mapping,
            fd: fd.as_fd(),
            client_base,
        })?;
        self.lock().insert(region, mapping);
        Ok(reached)
    }

    pub fn remove(&self, ctx: &dyn DeviceContext, region: Handle) {
        if self.lock().remove(&region).is_some() {
            ctx.host_unregister(region);
        }
    }

    /// Fills in the mapping of the host span `work` names, if it names one;
    /// an unknown region stays unresolved, and the copy fails where it runs.
    pub fn resolve(&self, work: &mut StreamWork) {
        if let StreamWork::HostToDevice { host, .. }
        | StreamWork::DeviceToHost { host, .. }
        | StreamWork::Mark { host, .. } = work
        {
            host.mapping = self.lock().get(&host.region).cloned();
        }
    }
}
