//! Context limits (`CUlimit`: stack, printf FIFO, malloc heap, ...): how a
//! context is told to set one ([`LimitSetting`]) and the rule every backend sets it by.

use std::sync::atomic::{AtomicU64, Ordering};

use cumux_protocol::{codes, CuError};
use serde::{Deserialize, Serialize};

/// The `CU_LIMIT_*` values a context's start is read for (stack size through
/// `CU_LIMIT_CIG_SHMEM_FALLBACK_ENABLED`); a driver that does not know one
/// leaves it out.
pub const KNOWN_LIMITS: std::ops::RangeInclusive<u32> = 0..=9;

/// How a context sets one of its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LimitSetting {
    /// Exactly this value, smaller or not: a context of one session's own.
    Exactly(u64),
    /// This value, or the limit's value at the context's start (the driver's
    /// default) if that is larger, smaller than now or not: a shared context,
    /// at the largest request of its live sessions
    /// (`worker::shared_limits`). `AtLeastStart(0)` is the start.
    AtLeastStart(u64),
    /// At least this value, never lowering it: a request that grew, in a
    /// shared context; a context other programs may share with no account
    /// kept of their requests (a program's context on another GPU, hosted in
    /// a shared worker).
    AtLeastNow(u64),
}

/// The value to give a limit now at `current`, whose value at the context's
/// start was `start` (`None`: unknown; then it only grows); `None`: none to give.
pub fn target(setting: LimitSetting, current: u64, start: Option<u64>) -> Option<u64> {
    let value = match setting {
        LimitSetting::Exactly(v) => v,
        LimitSetting::AtLeastStart(v) => v.max(start.unwrap_or(current)),
        LimitSetting::AtLeastNow(v) => v.max(current),
    };
    (value != current).then_some(value)
}

/// The limits of one context whose lowering a backend refused, so that
/// each is logged once (the driver refuses a used heap for good).
#[derive(Default)]
pub struct RefusedShrinks(AtomicU64);

impl RefusedShrinks {
    /// Whether `limit`'s refusal is its first.
    fn first(&self, limit: u32) -> bool {
        let bit = 1u64 << limit.min(63);
        self.0.fetch_or(bit, Ordering::Relaxed) & bit == 0
    }
}

/// Sets `limit`, now at `current` (at `start` when the context was made), as
/// `setting` says, through `set`. When a backend refuses to lower it (NVIDIA's
/// driver keeps a malloc heap a kernel used), the context keeps the larger
/// value, which still meets every request: one line says so (the first time,
/// by `refused`), and it is no failure.
pub fn apply(
    limit: u32,
    setting: LimitSetting,
    (current, start): (u64, Option<u64>),
    refused: &RefusedShrinks,
    set: impl FnOnce(u64) -> Result<(), CuError>,
) -> Result<(), CuError> {
    let Some(value) = target(setting, current, start) else {
        return Ok(());
    };
    match set(value) {
        Err(e) if value < current => {
            let why = "a context limit stays larger";
            match refused.first(limit) {
                true => tracing::warn!(limit, value, current, "{why}: {e}"),
                false => tracing::debug!(limit, value, current, "{why}: {e}"),
            }
            Ok(())
        }
        other => other,
    }
}

/// The error for a limit set through a shared context's session view, which
/// keeps its session's requests instead (`DeviceContext::set_limit`).
pub fn not_through_a_view() -> CuError {
    CuError::new(
        codes::NOT_SUPPORTED,
        "a session's view of a shared context sets limits by its session's requests",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_lowers_and_at_least_does_not() {
        assert_eq!(
            target(LimitSetting::Exactly(512), 1024, Some(1024)),
            Some(512)
        );
        assert_eq!(target(LimitSetting::Exactly(1024), 1024, None), None);
        assert_eq!(target(LimitSetting::AtLeastNow(512), 1024, Some(256)), None);
        assert_eq!(
            target(LimitSetting::AtLeastNow(4096), 1024, None),
            Some(4096)
        );
        // The start is the floor; an unknown start keeps what is there.
        assert_eq!(
            target(LimitSetting::AtLeastStart(0), 8192, Some(1024)),
            Some(1024)
        );
        assert_eq!(
            target(LimitSetting::AtLeastStart(512), 8192, Some(1024)),
            Some(1024)
        );
        assert_eq!(
            target(LimitSetting::AtLeastStart(4096), 8192, Some(1024)),
            Some(4096)
        );
        assert_eq!(target(LimitSetting::AtLeastStart(0), 8192, None), None);
    }

    #[test]
    fn a_refused_shrink_keeps_the_larger_value_and_a_refused_growth_fails() {
        let refuse = |_| Err(CuError::new(codes::INVALID_VALUE, "heap in use"));
        let (heap, now, refused) = (2, (64 << 20, None), RefusedShrinks::default());
        let lower = LimitSetting::Exactly(8 << 20);
        assert_eq!(apply(heap, lower, now, &refused, refuse), Ok(()));
        assert!(!refused.first(heap), "the refusal was noted");
        assert!(refused.first(0));
        let grow = LimitSetting::Exactly(128 << 20);
        let grown = apply(heap, grow, now, &refused, refuse);
        assert_eq!(grown.unwrap_err().code, codes::INVALID_VALUE);
        let mut asked = None;
        let set = |v| {
            asked = Some(v);
            Ok(())
        };
        apply(heap, LimitSetting::Exactly(64 << 20), now, &refused, set).unwrap();
        assert_eq!(asked, None, "no call for a limit already there");
    }
}
