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
    /// Records `[base, base + size)` as device `device`'s.
    pub fn place(&self, base: u64, size: u64, device: u32) {
        let mut map = self.by_base.write().unwrap_or_else(|p| p.into_inner());
        map.insert(base, (size.max(1), device));
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
        p.place(0x1000, 0x100, 0);
        p.place(0x2000, 0x100, 1);
        assert_eq!(p.device_of(0x1000), Some(0));
        assert_eq!(p.device_of(0x10ff), Some(0));
        assert_eq!(p.device_of(0x1100), None);
        assert_eq!(p.device_of(0x2080), Some(1));
        p.remove(0x2000);
        assert_eq!(p.device_of(0x2080), None);
        assert_eq!(p.device_of(0x10), None);
    }
}
