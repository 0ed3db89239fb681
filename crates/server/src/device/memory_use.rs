//! Device memory accounting the backends share: the bytes all of a device's
//! contexts hold ([`release`] never takes the count below zero), and one
//! context's allocations within that count ([`ContextMemory`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cumux_protocol::DevicePtr;

use crate::locking::lock;

/// Takes `bytes` off `used`, stopping at zero.
pub fn release(used: &AtomicU64, bytes: u64) {
    let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        Some(u.saturating_sub(bytes))
    });
}

/// One context's allocations (base → bytes), each counted in its device's
/// bytes in use, and what else the context charges there (modules' globals).
pub struct ContextMemory {
    used: Arc<AtomicU64>,
    allocations: Mutex<HashMap<DevicePtr, u64>>,
}

impl ContextMemory {
    /// A context's share of `used`, the device's count.
    pub fn new(used: Arc<AtomicU64>) -> Self {
        ContextMemory {
            used,
            allocations: Mutex::new(HashMap::new()),
        }
    }

    /// The device's count.
    pub fn device_used(&self) -> &Arc<AtomicU64> {
        &self.used
    }

    /// `bytes` were allocated at `ptr`.
    pub fn allocated(&self, ptr: DevicePtr, bytes: u64) {
        lock(&self.allocations).insert(ptr, bytes);
        self.charge(bytes);
    }

    /// `ptr` was freed: its bytes, if it was this context's, go back.
    pub fn freed(&self, ptr: DevicePtr) {
        if let Some(bytes) = lock(&self.allocations).remove(&ptr) {
            release(&self.used, bytes);
        }
    }

    /// Counts `bytes` that belong to no allocation (a module's globals).
    pub fn charge(&self, bytes: u64) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Gives back bytes counted by [`ContextMemory::charge`].
    pub fn release(&self, bytes: u64) {
        release(&self.used, bytes);
    }

    /// At the context's end: forgets every allocation and gives back their
    /// bytes and `charged` more at once; the allocations it held.
    pub fn release_all(&self, charged: u64) -> Vec<(DevicePtr, u64)> {
        let allocations: Vec<(DevicePtr, u64)> = lock(&self.allocations).drain().collect();
        let total = allocations.iter().map(|(_, b)| b).sum::<u64>() + charged;
        release(&self.used, total);
        allocations
    }
}
