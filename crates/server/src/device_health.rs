//! Each device's health (issue 17): failed by an admin, or by a call that got
//! an error only a broken device gives; and the failover policy that says
//! where a failed device's sessions go ([`crate::failover`] moves them).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::locking::lock;

/// What the server does with the sessions of a device that fails
/// (`on_device_failure`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnFailure {
    /// They stay (their calls fail as the device fails them); the device
    /// takes no new programs.
    #[default]
    Stay,
    /// They move to the healthy device with the most memory free, else to
    /// the reserve device, if the server has one.
    Migrate,
    /// They move to the server's reserve CPU device.
    MigrateToCpu,
}

impl OnFailure {
    /// The policy's names, as the config and `--on-device-failure` write them.
    pub const NAMES: [&'static str; 3] = ["stay", "migrate", "migrate-to-cpu"];

    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "stay" => Ok(OnFailure::Stay),
            "migrate" => Ok(OnFailure::Migrate),
            "migrate-to-cpu" => Ok(OnFailure::MigrateToCpu),
            other => Err(format!(
                "on_device_failure {other:?}: expected one of {}",
                Self::NAMES.join(", ")
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OnFailure::Stay => "stay",
            OnFailure::Migrate => "migrate",
            OnFailure::MigrateToCpu => "migrate-to-cpu",
        }
    }
}

/// A server's failover setting: its policy, and the device kept for moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Failover {
    pub on_failure: OnFailure,
    /// The position of the device kept as a move target (the CPU device of
    /// `migrate-to-cpu`): offered to no program.
    pub reserve: Option<u32>,
}

/// Why a device is failed.
#[derive(Debug, Clone)]
pub struct Failure {
    pub reason: String,
    pub since: Instant,
    /// An admin said so (`cumux device fail`), rather than a call's error.
    pub by_admin: bool,
}

/// The health of a server's devices, by position.
#[derive(Debug, Default)]
pub struct DeviceHealth {
    failover: Failover,
    failed: Mutex<BTreeMap<u32, Failure>>,
}

impl DeviceHealth {
    pub fn new(failover: Failover) -> Self {
        DeviceHealth {
            failover,
            failed: Mutex::default(),
        }
    }

    pub fn failover(&self) -> Failover {
        self.failover
    }

    pub fn is_reserve(&self, device: u32) -> bool {
        self.failover.reserve == Some(device)
    }

    pub fn failure(&self, device: u32) -> Option<Failure> {
        lock(&self.failed).get(&device).cloned()
    }

    pub fn is_failed(&self, device: u32) -> bool {
        lock(&self.failed).contains_key(&device)
    }

    /// Whether new programs may be given `device`: healthy, not the reserve.
    pub fn offered(&self, device: u32) -> bool {
        !self.is_reserve(device) && !self.is_failed(device)
    }

    /// Marks `device` failed; `false` if it was already (its first reason stays).
    pub fn fail(&self, device: u32, reason: String, by_admin: bool) -> bool {
        let mut failed = lock(&self.failed);
        if failed.contains_key(&device) {
            return false;
        }
        failed.insert(
            device,
            Failure {
                reason,
                since: Instant::now(),
                by_admin,
            },
        );
        true
    }

    /// Marks `device` healthy again: what it had failed with, if it had.
    pub fn recover(&self, device: u32) -> Option<Failure> {
        lock(&self.failed).remove(&device)
    }

    /// What `cumux status` says of `device`'s health.
    pub fn describe(&self, device: u32) -> String {
        if let Some(failure) = self.failure(device) {
            let by = if failure.by_admin {
                "by an admin"
            } else {
                "by a call's error"
            };
            return format!(
                "failed {:.0?} ago ({by}): {}",
                failure.since.elapsed(),
                failure.reason
            );
        }
        match self.is_reserve(device) {
            true => "reserve".into(),
            false => "ok".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_device_is_offered_again_once_it_recovers_and_keeps_its_first_reason() {
        let health = DeviceHealth::new(Failover {
            on_failure: OnFailure::Migrate,
            reserve: Some(2),
        });
        assert!(health.offered(0) && health.offered(1) && !health.offered(2));
        assert_eq!(health.describe(2), "reserve");
        assert!(health.fail(1, "ECC".into(), false));
        assert!(!health.fail(1, "again".into(), true));
        assert!(!health.offered(1));
        let said = health.describe(1);
        assert!(said.starts_with("failed ") && said.ends_with("(by a call's error): ECC"));
        assert_eq!(health.recover(1).map(|f| f.reason), Some("ECC".into()));
        assert!(health.offered(1) && health.recover(1).is_none());
        assert_eq!(health.describe(1), "ok");
    }

    #[test]
    fn policies_parse_by_their_names_and_a_typo_is_refused() {
        for name in OnFailure::NAMES {
            assert_eq!(OnFailure::parse(name).unwrap().name(), name);
        }
        let e = OnFailure::parse("migrate_to_cpu").unwrap_err();
        assert!(e.contains("stay, migrate, migrate-to-cpu"), "{e}");
    }
}
