//! Which of the program's devices each allocation lies on, so that a call
//! named by a pointer alone (a free, a copy) goes to that device's session.
//! Kept apart from `State`, under a lock of its own, because calls are routed
//! after the state lock is let go.

use std::collections::BTreeMap;
use std::sync::RwLock;

/// Allocations (and mappings) by base: their size and device.
#[derive(Default)]
pub struct Placements {
    by_base: RwLock<BTreeMap<u64, (u64, u32)>>,
}

impl Placements {
    /// Records `[base, base + size)` as device `device`'s. Where it
    /// overlaps an allocation of another device (devices of two servers,
    /// whose addresses nothing keeps apart), it is not recorded: `Err` names
    /// that device.
    pub fn place(&self, base: u64, size: u64, device: u32) -> Result<(), u32> {
        let size = size.max(1);
        let mut map = self.by_base.write().unwrap_or_else(|p| p.into_inner());
        let before = map
            .range(..=base)
            .next_back()
            .filter(|(&b, &(s, _))| base - b < s);
        let after = map.range(base..).next().filter(|(&b, _)| b - base < size);
        if let Some((_, &(_, other))) = before.or(after).filter(|(_, &(_, d))| d != device) {
            return Err(other);
        }
        map.insert(base, (size, device));
        Ok(())
    }

    /// Forgets the allocation at `base`.
    pub fn remove(&self, base: u64) {
        let mut map = self.by_base.write().unwrap_or_else(|p| p.into_inner());
        map.remove(&base);
    }

    /// The device whose allocation holds `ptr`, if one does.
    pub fn device_of(&self, ptr: u64) -> Option<u32> {
        let map = self.by_base.read().unwrap_or_else(|p| p.into_inner());
        let (&base, &(size, device)) = map.range(..=ptr).next_back()?;
        (ptr - base < size).then_some(device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_finds_the_device_of_its_allocation() {
        let p = Placements::default();
        p.place(0x1000, 0x100, 0).unwrap();
        p.place(0x2000, 0x100, 1).unwrap();
        assert_eq!(p.device_of(0x1000), Some(0));
        assert_eq!(p.device_of(0x10ff), Some(0));
        assert_eq!(p.device_of(0x1100), None);
        assert_eq!(p.device_of(0x2080), Some(1));
        p.remove(0x2000);
        assert_eq!(p.device_of(0x2080), None);
        assert_eq!(p.device_of(0x10), None);
    }

    #[test]
    fn an_allocation_overlapping_another_devices_is_not_recorded() {
        let p = Placements::default();
        p.place(0x1000, 0x100, 0).unwrap();
        assert_eq!(p.place(0x1080, 0x100, 1), Err(0));
        assert_eq!(p.place(0x0f80, 0x100, 1), Err(0));
        assert_eq!(p.place(0x1000, 0x10, 1), Err(0));
        assert_eq!(p.device_of(0x1080), Some(0));
        p.place(0x1100, 0x100, 1).unwrap();
        // The same device's memory again (a mapping of it) is recorded.
        p.place(0x1000, 0x100, 0).unwrap();
    }
}
