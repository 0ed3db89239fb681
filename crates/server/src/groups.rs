//! Programs as groups of sessions: a program's first connection opens a group
//! and its welcome carries the group's key; the connections it opens for its
//! other devices name that key ([`cumux_protocol::Join`]) and, being of the
//! same tenant, join, so their contexts are kept together
//! ([`crate::device::ContextGroup`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use cumux_protocol::pinned::HostMapping;
use cumux_protocol::Handle;

use crate::device::{ContextGroup, DeviceContext};
use crate::locking::lock;
use crate::worker::wire::new_nonce;

/// One program's sessions on the server's devices.
pub struct ProgramGroup {
    key: u64,
    tenant: String,
    /// What the devices keep to hold the program's contexts together.
    pub contexts: ContextGroup,
    /// The program's contexts, by the device each is for (its numbering).
    members: Mutex<HashMap<u32, Weak<dyn DeviceContext>>>,
    /// The pinned host regions the program registered with any of its
    /// sessions: a copy on another of its devices may name them (its
    /// contexts share one process, where the region is mapped).
    regions: Mutex<HashMap<Handle, Arc<HostMapping>>>,
}

impl ProgramGroup {
    /// The key the program's further connections name.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Records the program's context for its device `device`.
    pub fn add_member(&self, device: u32, ctx: &Arc<dyn DeviceContext>) {
        lock(&self.members).insert(device, Arc::downgrade(ctx));
    }

    /// The program's context for its device `device`, while its session lives.
    /// How many of the program's contexts are alive.
    pub fn member_count(&self) -> usize {
        lock(&self.members)
            .values()
            .filter(|m| m.strong_count() > 0)
            .count()
    }

    pub fn member(&self, device: u32) -> Option<Arc<dyn DeviceContext>> {
        lock(&self.members).get(&device).and_then(Weak::upgrade)
    }

    /// Lets the program's other sessions name `region`.
    pub fn publish_region(&self, region: Handle, mapping: Arc<HostMapping>) {
        lock(&self.regions).insert(region, mapping);
    }

    /// `region` is gone.
    pub fn withdraw_region(&self, region: Handle) {
        lock(&self.regions).remove(&region);
    }

    /// The mapping of a region one of the program's sessions registered.
    pub fn region(&self, region: Handle) -> Option<Arc<HostMapping>> {
        lock(&self.regions).get(&region).cloned()
    }
}

/// The server's live groups, by key; a group goes with its last session.
#[derive(Default)]
pub struct Groups {
    live: Mutex<HashMap<u64, Weak<ProgramGroup>>>,
}

impl Groups {
    /// A new group for a program of `tenant`, under a key no one can guess.
    pub fn open(&self, tenant: &str) -> Arc<ProgramGroup> {
        let mut live = lock(&self.live);
        live.retain(|_, group| group.strong_count() > 0);
        let key = loop {
            let nonce = new_nonce();
            let key = u64::from_le_bytes(nonce[..8].try_into().unwrap_or_default());
            if key != 0 && !live.contains_key(&key) {
                break key;
            }
        };
        let group = Arc::new(ProgramGroup {
            key,
            tenant: tenant.to_string(),
            contexts: ContextGroup::default(),
            regions: Mutex::default(),
            members: Mutex::default(),
        });
        live.insert(key, Arc::downgrade(&group));
        group
    }

    /// The live group under `key`, for a connection of `tenant`; an unknown
    /// key and another tenant's group get the same answer.
    pub fn join(&self, key: u64, tenant: &str) -> Result<Arc<ProgramGroup>, String> {
        lock(&self.live)
            .get(&key)
            .and_then(Weak::upgrade)
            .filter(|group| group.tenant == tenant)
            .ok_or_else(|| {
                "no program of this tenant has that group key: a further connection names \
                 the key its program's first welcome gave"
                    .to_string()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_joined_by_its_tenant_alone_and_goes_with_its_last_holder() {
        let groups = Groups::default();
        let alice = groups.open("alice");
        let joined = groups.join(alice.key(), "alice").unwrap();
        assert!(Arc::ptr_eq(&alice, &joined));
        assert!(groups.join(alice.key(), "bob").is_err());
        assert!(groups.join(alice.key() ^ 1, "alice").is_err());
        let key = alice.key();
        drop((alice, joined));
        assert!(groups.join(key, "alice").is_err());
        assert_ne!(groups.open("alice").key(), groups.open("alice").key());
    }
}
