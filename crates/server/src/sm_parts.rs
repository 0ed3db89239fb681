//! Where each SM-capped tenant's kernels run: a stretch of every GPU's SMs,
//! latency-critical tenants from the front, batch tenants after them.
//!
//! Stretches are laid end to end in percent of the device, so two capped
//! tenants never share an SM while their caps add up to at most 100 %
//! (the worker rounds each stretch to whole groups of the driver's split,
//! and stretches that meet round to groups that meet). Caps that add up
//! to more start again from the front, overlapping, and `serve` says so.
//! Every tenant the table does not list shares the `defaults` stretch,
//! placed last. Uncapped tenants run on the whole device.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::tenants::{TenantClass, TenantPolicy, ANONYMOUS_TENANT};

/// A stretch of a device's SMs: `from..to`, in percent from its front.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SmPart {
    pub from: u8,
    pub to: u8,
}

impl SmPart {
    pub fn percent(&self) -> u8 {
        self.to - self.from
    }
}

impl std::fmt::Display for SmPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{} %", self.from, self.to)
    }
}

/// Every capped tenant's stretch, and which ones overlap others'.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SmPlacement {
    pub parts: BTreeMap<String, SmPart>,
    /// Tenants whose stretch starts again from the front (the caps before
    /// them took the whole device).
    pub overlapping: Vec<String>,
}

impl SmPlacement {
    /// The stretches of `policy`'s capped tenants.
    pub fn of(policy: &TenantPolicy) -> SmPlacement {
        let mut capped: Vec<(&str, TenantClass, u8)> = policy
            .tenants
            .iter()
            .filter_map(|(name, s)| s.sm_percent.map(|p| (name.as_str(), s.class, p)))
            .collect();
        capped.sort_by_key(|(name, class, _)| (*class != TenantClass::LatencyCritical, *name));
        if let Some(p) = policy.defaults.sm_percent {
            capped.push((ANONYMOUS_TENANT, policy.defaults.class, p));
        }
        let mut placement = SmPlacement::default();
        let mut at = 0u8;
        for (name, _, percent) in capped {
            let percent = percent.clamp(1, 100);
            if u16::from(at) + u16::from(percent) > 100 {
                at = 0;
                placement.overlapping.push(name.to_string());
            }
            let part = SmPart {
                from: at,
                to: at + percent,
            };
            placement.parts.insert(name.to_string(), part);
            at = part.to;
        }
        placement
    }

    /// The stretch of tenant `name` (an unlisted name: the `defaults` one).
    pub fn part_of(&self, policy: &TenantPolicy, name: &str) -> Option<SmPart> {
        let listed = policy.tenants.contains_key(name);
        let key = if listed { name } else { ANONYMOUS_TENANT };
        self.parts.get(key).copied()
    }

    /// A line an operator reads at `serve`'s start; `None` with no caps.
    pub fn describe(&self) -> Option<String> {
        if self.parts.is_empty() {
            return None;
        }
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|(name, part)| format!("{name} {part}"))
            .collect();
        Some(format!("SM parts of capped tenants: {}", parts.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::TenantSettings;

    fn capped(percent: u8, class: TenantClass) -> TenantSettings {
        TenantSettings {
            sm_percent: Some(percent),
            class,
            ..TenantSettings::default()
        }
    }

    fn policy(tenants: &[(&str, TenantSettings)]) -> TenantPolicy {
        TenantPolicy {
            tenants: tenants
                .iter()
                .map(|(n, s)| (n.to_string(), s.clone()))
                .collect(),
            ..TenantPolicy::default()
        }
    }

    #[test]
    fn latency_critical_tenants_come_first_and_stretches_meet() {
        let p = policy(&[
            ("a-batch", capped(50, TenantClass::Batch)),
            ("b-batch", capped(25, TenantClass::Batch)),
            ("lc", capped(25, TenantClass::LatencyCritical)),
            ("free", TenantSettings::default()),
        ]);
        let placed = SmPlacement::of(&p);
        let part = |n| placed.part_of(&p, n);
        assert_eq!(part("lc"), Some(SmPart { from: 0, to: 25 }));
        assert_eq!(part("a-batch"), Some(SmPart { from: 25, to: 75 }));
        assert_eq!(part("b-batch"), Some(SmPart { from: 75, to: 100 }));
        assert_eq!(part("free"), None);
        assert!(placed.overlapping.is_empty());
    }

    #[test]
    fn caps_over_the_whole_device_start_again_and_are_named() {
        let p = policy(&[
            ("a", capped(60, TenantClass::Batch)),
            ("b", capped(60, TenantClass::Batch)),
        ]);
        let placed = SmPlacement::of(&p);
        assert_eq!(placed.part_of(&p, "b"), Some(SmPart { from: 0, to: 60 }));
        assert_eq!(placed.overlapping, ["b"]);
    }

    #[test]
    fn unlisted_tenants_share_the_defaults_stretch_after_the_listed() {
        let mut p = policy(&[("a", capped(30, TenantClass::Batch))]);
        p.defaults.sm_percent = Some(20);
        let placed = SmPlacement::of(&p);
        assert_eq!(placed.part_of(&p, "a"), Some(SmPart { from: 0, to: 30 }));
        let anyone = Some(SmPart { from: 30, to: 50 });
        assert_eq!(placed.part_of(&p, "x"), anyone);
        assert_eq!(placed.part_of(&p, ANONYMOUS_TENANT), anyone);
        assert!(placed.describe().unwrap().contains("a 0-30 %"));
    }
}
