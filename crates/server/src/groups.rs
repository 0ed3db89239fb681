//! Programs as groups of sessions: a program's first connection opens a group
//! and its welcome carries the group's key; the connections it opens for its
//! other devices name that key ([`cumux_protocol::Join`]) and, being of the
//! same tenant, join, so their contexts are kept together
//! ([`crate::device::ContextGroup`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

use cumux_protocol::pinned::HostMapping;
use cumux_protocol::{DevicePtr, Handle};

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
    /// The server's devices (positions) in the program's numbering, as its
    /// first connection saw them: a device that fails later keeps its
    /// number for the program.
    devices: Vec<u32>,
    /// The pinned host regions the program registered with any of its
    /// sessions: a copy on another of its devices may name them (its
    /// contexts share one process, where the region is mapped).
    regions: Mutex<HashMap<Handle, Arc<HostMapping>>>,
    /// The device memory and address reservations of its sessions: one
    /// device's work may name another's memory (NCCL and XLA do), and map
    /// into another's reservation, as in one process natively.
    ranges: Mutex<ProgramRanges>,
}

/// Ranges of a program's sessions: base → (size, session id).
#[derive(Default)]
struct ProgramRanges {
    memory: BTreeMap<DevicePtr, (u64, u64)>,
    reserved: BTreeMap<DevicePtr, (u64, u64)>,
}

/// The range of `table` holding `[ptr, ptr + bytes)`: (base, size).
fn holding(
    table: &BTreeMap<DevicePtr, (u64, u64)>,
    ptr: DevicePtr,
    bytes: u64,
) -> Option<(DevicePtr, u64)> {
    let (base, (size, _)) = table.range(..=ptr).next_back()?;
    (ptr - base < *size && bytes <= size - (ptr - base)).then_some((*base, *size))
}

impl ProgramGroup {
    /// The key the program's further connections name.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The server's device (its position) that is the program's device `local`.
    pub fn device(&self, local: u32) -> Option<u32> {
        self.devices.get(local as usize).copied()
    }

    /// How many devices the program sees.
    pub fn device_count(&self) -> usize {
        self.devices.len()
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

    /// Session `session` holds device memory `[base, base + size)`
    /// (`reservation`: an address reservation instead).
    pub fn publish_range(&self, session: u64, base: DevicePtr, size: u64, reservation: bool) {
        let mut ranges = lock(&self.ranges);
        let table = if reservation {
            &mut ranges.reserved
        } else {
            &mut ranges.memory
        };
        table.insert(base, (size, session));
    }

    /// The range at `base` is gone.
    pub fn withdraw_range(&self, base: DevicePtr, reservation: bool) {
        let mut ranges = lock(&self.ranges);
        let table = if reservation {
            &mut ranges.reserved
        } else {
            &mut ranges.memory
        };
        table.remove(&base);
    }

    /// Everything `session` published is gone (its end).
    pub fn withdraw_session(&self, session: u64) {
        let mut ranges = lock(&self.ranges);
        ranges.memory.retain(|_, (_, s)| *s != session);
        ranges.reserved.retain(|_, (_, s)| *s != session);
    }

    /// Whether `[ptr, ptr + bytes)` is memory of one of the program's
    /// sessions other than `asking` (whose own tables say what it may reach).
    pub fn holds_memory(&self, asking: u64, ptr: DevicePtr, bytes: u64) -> bool {
        let ranges = lock(&self.ranges);
        let Some((base, _)) = holding(&ranges.memory, ptr, bytes) else {
            return false;
        };
        ranges.memory.get(&base).is_some_and(|(_, s)| *s != asking)
    }

    /// The program's reservation holding `[ptr, ptr + size)`: (base, size).
    pub fn reservation(&self, ptr: DevicePtr, size: u64) -> Option<(DevicePtr, u64)> {
        holding(&lock(&self.ranges).reserved, ptr, size)
    }
}

/// The server's live groups, by key; a group goes with its last session.
#[derive(Default)]
pub struct Groups {
    live: Mutex<HashMap<u64, Weak<ProgramGroup>>>,
}

impl Groups {
    /// A new group for a program of `tenant`, under a key no one can guess;
    /// `devices` are the server's devices (positions) in the program's
    /// numbering.
    pub fn open(&self, tenant: &str, devices: Vec<u32>) -> Arc<ProgramGroup> {
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
            ranges: Mutex::default(),
            members: Mutex::default(),
            devices,
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
        let alice = groups.open("alice", vec![0]);
        let joined = groups.join(alice.key(), "alice").unwrap();
        assert!(Arc::ptr_eq(&alice, &joined));
        assert!(groups.join(alice.key(), "bob").is_err());
        assert!(groups.join(alice.key() ^ 1, "alice").is_err());
        let key = alice.key();
        drop((alice, joined));
        assert!(groups.join(key, "alice").is_err());
        assert_ne!(
            groups.open("alice", vec![0]).key(),
            groups.open("alice", vec![0]).key()
        );
    }

    #[test]
    fn a_program_s_ranges_are_seen_by_its_sessions_until_withdrawn() {
        let groups = Groups::default();
        let g = groups.open("alice", vec![0]);
        g.publish_range(1, 0x10_000, 0x1000, false);
        g.publish_range(2, 0x40_000, 0x8000, true);
        assert!(g.holds_memory(2, 0x10_800, 0x800));
        assert!(!g.holds_memory(2, 0x10_800, 0x801), "past its end");
        assert!(!g.holds_memory(1, 0x10_800, 0x800), "its own tables decide");
        assert_eq!(g.reservation(0x42_000, 0x2000), Some((0x40_000, 0x8000)));
        assert_eq!(
            g.reservation(0x10_000, 0x10),
            None,
            "memory is no reservation"
        );
        g.withdraw_range(0x10_000, false);
        assert!(!g.holds_memory(2, 0x10_000, 1));
        g.withdraw_session(2);
        assert_eq!(g.reservation(0x42_000, 0x2000), None);
    }
}
