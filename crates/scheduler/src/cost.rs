//! Cost estimates of work items: an exponentially weighted moving average of the measured
//! (occupancy) cost per (tenant, kernel), with a per-tenant average as fallback. Bounded:
//! when the table is full, new kernels are estimated from their tenant's average.

use std::collections::BTreeMap;

use crate::{KernelId, Nanos, TenantId};

/// Weight of a new sample in the average: 1/8 (as TCP's smoothed round-trip time).
const EWMA_SHIFT: u32 = 3;

/// Measured costs, learned at completion and used to charge work at dispatch.
#[derive(Debug)]
pub struct CostTable {
    per_kernel: BTreeMap<(TenantId, KernelId), Nanos>,
    per_tenant: BTreeMap<TenantId, Nanos>,
    max_entries: usize,
}

fn blend(old: Nanos, sample: Nanos) -> Nanos {
    // old + (sample - old) / 8, in signed arithmetic on i128 so it cannot overflow.
    let blended = i128::from(old) + ((i128::from(sample) - i128::from(old)) >> EWMA_SHIFT);
    assert!(blended >= 0);
    Nanos::try_from(blended).expect("an average of u64 values fits in u64")
}

impl CostTable {
    pub fn new(max_entries: u32) -> Self {
        CostTable {
            per_kernel: BTreeMap::new(),
            per_tenant: BTreeMap::new(),
            max_entries: max_entries as usize,
        }
    }

    /// The estimate for one item: the kernel's own average when it was measured before;
    /// else the larger of the caller's hint and the tenant's average, whichever exist; else
    /// `default`. Hints are untrusted: one can raise a new kernel's estimate above the
    /// tenant's average, never lower it, so launching ever new kernels with low hints
    /// gains nothing.
    pub fn estimate(
        &self,
        tenant: TenantId,
        kernel: KernelId,
        hint: Option<Nanos>,
        default: Nanos,
    ) -> Nanos {
        if let Some(&cost) = self.per_kernel.get(&(tenant, kernel)) {
            return cost;
        }
        match (hint, self.per_tenant.get(&tenant).copied()) {
            (Some(hint), Some(average)) => hint.max(average),
            (Some(known), None) | (None, Some(known)) => known,
            (None, None) => default,
        }
    }

    /// Feeds one measured cost.
    pub fn record(&mut self, tenant: TenantId, kernel: KernelId, cost: Nanos) {
        let tenant_cost = self
            .per_tenant
            .get(&tenant)
            .map_or(cost, |&old| blend(old, cost));
        self.per_tenant.insert(tenant, tenant_cost);
        let has_room = self.per_kernel.len() < self.max_entries;
        match self.per_kernel.get_mut(&(tenant, kernel)) {
            Some(old) => *old = blend(*old, cost),
            None if has_room => {
                self.per_kernel.insert((tenant, kernel), cost);
            }
            None => {}
        }
        assert!(self.per_kernel.len() <= self.max_entries);
    }

    /// Forgets a tenant's estimates (when it unregisters).
    pub fn forget(&mut self, tenant: TenantId) {
        self.per_tenant.remove(&tenant);
        self.per_kernel.retain(|&(t, _), _| t != tenant);
    }

    pub fn len(&self) -> usize {
        self.per_kernel.len()
    }

    pub fn is_empty(&self) -> bool {
        self.per_kernel.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_prefers_kernel_then_hint_or_tenant_then_default() {
        let mut table = CostTable::new(1);
        let (t, k1, k2) = (TenantId(1), KernelId(1), KernelId(2));
        assert_eq!(table.estimate(t, k1, None, 7), 7);
        assert_eq!(table.estimate(t, k1, Some(5), 7), 5);
        table.record(t, k1, 800);
        assert_eq!(table.estimate(t, k1, Some(5), 7), 800);
        // The table is full: k2 is not stored, its estimate falls back.
        table.record(t, k2, 80);
        assert_eq!(table.len(), 1);
        let average = 800 - (720 >> 3);
        assert_eq!(table.estimate(t, k2, Some(5), 7), average);
        assert_eq!(table.estimate(t, k2, Some(5_000), 7), 5_000);
        assert_eq!(table.estimate(t, k2, None, 7), average);
    }

    #[test]
    fn average_converges_to_a_steady_cost() {
        let mut table = CostTable::new(8);
        let (t, k) = (TenantId(0), KernelId(0));
        table.record(t, k, 1_000_000);
        for _ in 0..200 {
            table.record(t, k, 10_000);
        }
        let estimate = table.estimate(t, k, None, 0);
        assert!((10_000..10_010).contains(&estimate), "{estimate}");
        table.forget(t);
        assert!(table.is_empty());
    }
}
