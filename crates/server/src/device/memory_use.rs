//! Device memory accounting the backends share: the bytes all of a device's
//! contexts hold ([`release`] never takes the count below zero), and one
//! context's part of that count ([`ContextMemory`]), given back at its end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Takes `bytes` off `used`, stopping at zero.
pub fn release(used: &AtomicU64, bytes: u64) {
    let _ = used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        Some(u.saturating_sub(bytes))
    });
}

/// One context's bytes within its device's count: a counter, not a table.
/// The session is the one that knows each allocation's size (it passes it to
/// `DeviceContext::mem_free`); the context only counts, and at its drop gives
/// back whatever it still holds.
pub struct ContextMemory {
    used: Arc<AtomicU64>,
    held: AtomicU64,
}

impl ContextMemory {
    /// A context's share of `used`, the device's count.
    pub fn new(used: Arc<AtomicU64>) -> Self {
        ContextMemory {
            used,
            held: AtomicU64::new(0),
        }
    }

    /// The device's count.
    pub fn device_used(&self) -> &Arc<AtomicU64> {
        &self.used
    }

    /// The bytes this context holds now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }

    /// Counts `bytes` the context took (an allocation, a module's globals).
    pub fn charge(&self, bytes: u64) {
        self.held.fetch_add(bytes, Ordering::AcqRel);
        self.used.fetch_add(bytes, Ordering::AcqRel);
    }

    /// Gives back `bytes` counted by [`ContextMemory::charge`]: never more
    /// than the context holds, so a wrong size cannot take another
    /// context's bytes off the device's count.
    pub fn release(&self, bytes: u64) {
        let mut taken = 0;
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                taken = bytes.min(h);
                Some(h - taken)
            });
        release(&self.used, taken);
    }
}

impl Drop for ContextMemory {
    fn drop(&mut self) {
        release(&self.used, *self.held.get_mut());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_gives_back_what_it_holds_and_no_more() {
        let used = Arc::new(AtomicU64::new(0));
        let other = ContextMemory::new(Arc::clone(&used));
        other.charge(100);
        let one = ContextMemory::new(Arc::clone(&used));
        one.charge(40);
        one.charge(2);
        assert_eq!(used.load(Ordering::Acquire), 142);
        one.release(40);
        assert_eq!(one.held(), 2);
        // A size larger than it holds takes only its own bytes back.
        one.release(1_000);
        assert_eq!(one.held(), 0);
        assert_eq!(used.load(Ordering::Acquire), 100);
        one.charge(7);
        drop(one);
        assert_eq!(used.load(Ordering::Acquire), 100);
        drop(other);
        assert_eq!(used.load(Ordering::Acquire), 0);
    }
}
