//! A session's virtual memory tables: its reservations, physical
//! allocations (with their references and mappings) and mappings (with the
//! device's access), and the questions the session's checks ask of them.

use std::collections::{BTreeMap, HashMap};

use cumux_protocol::{codes, CuError, DevicePtr, Handle};

use super::core::err;

/// A physical allocation (`cuMemCreate`).
pub(super) struct Physical {
    pub(super) size: u64,
    /// The backend's id for it.
    pub(super) backend: u64,
    /// The program's references: its `cuMemCreate` and each
    /// `cuMemRetainAllocationHandle`; each `cuMemRelease` drops one. At 0 the
    /// handle is gone for the program, though its memory lives while mapped.
    pub(super) refs: u32,
    /// Its mappings: the memory is freed when there are none and no reference.
    pub(super) mappings: u32,
    pub(super) handle_types: u64,
    /// Compressible, as asked and as the device granted.
    pub(super) compressed: bool,
    /// Imported from another program (`cuMemImportFromShareableHandle`):
    /// its memory is the exporter's, and its size the driver's to check.
    pub(super) imported: bool,
}

/// A mapping of a whole physical allocation's first `size` bytes.
pub(super) struct Mapping {
    pub(super) size: u64,
    pub(super) handle: Handle,
    /// The session device's `CU_MEM_ACCESS_FLAGS_PROT_*` (none at first).
    pub(super) access: u64,
    /// The access the program's other devices were given (device → flags).
    pub(super) peer_access: Vec<(u32, u64)>,
}

impl Mapping {
    /// The access `device` has: the session's own, or a peer's as set.
    pub(super) fn access_of(&self, own: u32, device: u32) -> u64 {
        match device == own {
            true => self.access,
            false => self
                .peer_access
                .iter()
                .find(|(d, _)| *d == device)
                .map_or(0, |(_, f)| *f),
        }
    }

    /// Records `flags` as `device`'s access.
    pub(super) fn set_access(&mut self, own: u32, device: u32, flags: u64) {
        if device == own {
            self.access = flags;
            return;
        }
        self.peer_access.retain(|(d, _)| *d != device);
        self.peer_access.push((device, flags));
    }
}

/// A session's virtual memory tables.
#[derive(Default)]
pub(super) struct VmmTables {
    /// The backend's minimum granularity, asked once.
    pub(super) granularity: Option<u64>,
    /// base → size, as reserved.
    pub(super) reservations: BTreeMap<DevicePtr, u64>,
    /// base → size: reservations of the program's other sessions this one
    /// mapped into (never freed by this one).
    pub(super) borrowed: BTreeMap<DevicePtr, u64>,
    pub(super) physical: HashMap<Handle, Physical>,
    pub(super) mappings: BTreeMap<DevicePtr, Mapping>,
}

impl VmmTables {
    /// Whether the session holds no reservation or physical allocation.
    pub(super) fn is_empty(&self) -> bool {
        self.reservations.is_empty() && self.physical.is_empty() && self.mappings.is_empty()
    }
}

impl VmmTables {
    /// The mapping holding `ptr`: (base, mapping).
    pub(super) fn mapping_of(&self, ptr: DevicePtr) -> Option<(DevicePtr, &Mapping)> {
        let (&base, m) = self.mappings.range(..=ptr).next_back()?;
        (ptr - base < m.size).then_some((base, m))
    }

    /// The mappings that cover `[ptr, ptr + size)` side by side, the first
    /// starting at `ptr` and the last ending at its end: their bases.
    pub(super) fn whole_mappings(&self, ptr: DevicePtr, size: u64) -> Option<Vec<DevicePtr>> {
        let end = ptr.checked_add(size)?;
        let mut bases = Vec::new();
        let mut at = ptr;
        while at < end {
            let m = self.mappings.get(&at)?;
            bases.push(at);
            at = at.checked_add(m.size)?;
        }
        (size > 0 && at == end).then_some(bases)
    }

    /// The mappings inside `[ptr, ptr + size)`, a range inside one
    /// reservation that cuts no mapping: their bases.
    pub(super) fn mappings_within(&self, ptr: DevicePtr, size: u64) -> Option<Vec<DevicePtr>> {
        let end = ptr.checked_add(size)?;
        if size == 0 || !self.reserved(ptr, size) {
            return None;
        }
        if self.mapping_of(ptr).is_some_and(|(base, _)| base < ptr) {
            return None;
        }
        let mut bases = Vec::new();
        for (&base, m) in self.mappings.range(ptr..end) {
            if base.checked_add(m.size)? > end {
                return None;
            }
            bases.push(base);
        }
        Some(bases)
    }

    /// Whether `[ptr, ptr + bytes)` lies in mappings side by side whose
    /// access includes `need` (bytes 0: `ptr` in an accessible mapping).
    pub(super) fn covers(&self, ptr: DevicePtr, bytes: u64, need: u64) -> bool {
        let Some(end) = ptr.checked_add(bytes.max(1)) else {
            return false;
        };
        let Some((mut base, mut m)) = self.mapping_of(ptr) else {
            return false;
        };
        loop {
            if m.access & need != need {
                return false;
            }
            let next = base + m.size;
            if next >= end {
                return true;
            }
            match self.mappings.get(&next) {
                Some(following) => (base, m) = (next, following),
                None => return false,
            }
        }
    }

    /// Whether `[ptr, ptr + size)` lies inside one reservation.
    pub(super) fn reserved(&self, ptr: DevicePtr, size: u64) -> bool {
        [&self.reservations, &self.borrowed]
            .into_iter()
            .any(|table| {
                table
                    .range(..=ptr)
                    .next_back()
                    .is_some_and(|(base, len)| ptr - base < *len && size <= len - (ptr - base))
            })
    }

    /// Whether any mapping meets `[ptr, ptr + size)`.
    pub(super) fn mapped_in(&self, ptr: DevicePtr, size: u64) -> bool {
        let end = ptr.saturating_add(size);
        self.mapping_of(ptr).is_some() || self.mappings.range(ptr..end).next().is_some()
    }

    /// The physical allocation `handle` names for the program (one it holds
    /// a reference to).
    pub(super) fn held(&mut self, handle: Handle) -> Result<&mut Physical, CuError> {
        self.physical
            .get_mut(&handle)
            .filter(|p| p.refs > 0)
            .ok_or_else(|| {
                err(
                    codes::INVALID_VALUE,
                    format!("{handle:#x} is not a memory handle of this session"),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    /// A reservation of 8 granules at 0x1000_0000 with granules 0 and 1
    /// mapped read-write and 3 read-only.
    fn tables() -> VmmTables {
        let mut t = VmmTables::default();
        t.reservations.insert(0x1000_0000, 8 * G);
        for (i, access) in [(0, 3), (1, 3), (3, 1)] {
            let m = Mapping {
                size: G,
                handle: 0x100 + i,
                access,
                peer_access: Vec::new(),
            };
            t.mappings.insert(0x1000_0000 + i * G, m);
        }
        t
    }

    #[test]
    fn ranges_over_mappings_side_by_side() {
        let t = tables();
        let base = 0x1000_0000;
        assert!(t.covers(base + G - 4, 8, 3), "across the boundary");
        assert!(!t.covers(base + 2 * G - 4, 8, 1), "into a hole");
        assert!(t.covers(base + 3 * G, G, 1) && !t.covers(base + 3 * G, 1, 3));
        assert!(!t.covers(u64::MAX - 1, 8, 1));
        assert_eq!(t.whole_mappings(base, 2 * G), Some(vec![base, base + G]));
        assert_eq!(t.whole_mappings(base, G + 1), None);
        assert_eq!(t.whole_mappings(base + G, 3 * G), None, "a hole");
        // Unmapping: whole mappings, holes allowed, inside the reservation.
        assert_eq!(
            t.mappings_within(base, 4 * G),
            Some(vec![base, base + G, base + 3 * G])
        );
        assert_eq!(t.mappings_within(base + 2 * G, G), Some(vec![]));
        assert_eq!(t.mappings_within(base + G / 2, G), None);
        assert_eq!(t.mappings_within(base, G / 2), None);
        assert_eq!(t.mappings_within(base, 9 * G), None);
        assert!(t.mapped_in(base + 2 * G, 2 * G) && !t.mapped_in(base + 4 * G, 4 * G));
    }

    #[test]
    fn a_peer_s_access_is_its_own() {
        let mut t = tables();
        let m = t.mappings.get_mut(&0x1000_0000).unwrap();
        assert_eq!(m.access_of(0, 1), 0, "a peer has none until given");
        m.set_access(0, 1, 3);
        m.set_access(0, 1, 1);
        assert_eq!((m.access_of(0, 0), m.access_of(0, 1)), (3, 1));
        assert_eq!(m.peer_access.len(), 1);
    }
}
