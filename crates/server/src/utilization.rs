//! Each tenant's utilization of each device, as NVML reports a GPU's: the
//! share of the last second in which the device ran the tenant's work, sampled
//! ten times a second from the device time the server measures, else NVIDIA's.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cumux_protocol::TenantUtilization;

use crate::locking::lock;

/// How often the sampler reads the server's counters.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The period a utilization figure covers.
pub const WINDOW: Duration = Duration::from_secs(1);

/// One (tenant, device) pair's device time, as the sampler reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub tenant: String,
    pub device: u32,
    /// Device time so far by each source, keyed by what names the source (a
    /// session, or the device's gate): a source that goes away stops adding.
    pub sources: Vec<(u64, u64)>,
    /// Whether the server times all of this pair's work.
    pub measured: bool,
    /// Where it does not: the pair's share of the last window by NVIDIA's
    /// samples of the processes that run its work alone, if there are any.
    pub sampled: Option<u32>,
}

#[derive(Debug, Default)]
struct Pair {
    /// Device time seen so far, over every source that ever added to it.
    total_ns: u64,
    /// Each source's counter at the last sample.
    last: HashMap<u64, u64>,
    samples: VecDeque<(Instant, u64)>,
    measured: bool,
    sampled: Option<u32>,
}

impl Pair {
    fn percent(&self) -> Option<u32> {
        if !self.measured {
            return self.sampled;
        }
        let (Some(&(t0, ns0)), Some(&(t1, ns1))) = (self.samples.front(), self.samples.back())
        else {
            return Some(0);
        };
        let wall = t1.duration_since(t0).as_nanos() as f64;
        if wall <= 0.0 {
            return Some(0);
        }
        Some(((ns1 - ns0) as f64 / wall * 100.0).round().min(100.0) as u32)
    }
}

/// The samples of every (tenant, device) pair.
#[derive(Debug, Default)]
pub struct Utilization {
    pairs: Mutex<BTreeMap<(String, u32), Pair>>,
}

impl Utilization {
    /// Adds one sample taken at `now`.
    pub fn sample(&self, now: Instant, readings: Vec<Reading>) {
        let mut pairs = lock(&self.pairs);
        let seen: Vec<(String, u32)> = readings
            .iter()
            .map(|r| (r.tenant.clone(), r.device))
            .collect();
        for reading in readings {
            let pair = pairs.entry((reading.tenant, reading.device)).or_default();
            let mut last = HashMap::with_capacity(reading.sources.len());
            for (source, ns) in reading.sources {
                let before = pair.last.get(&source).copied().unwrap_or(0);
                pair.total_ns += ns.saturating_sub(before);
                last.insert(source, ns);
            }
            pair.last = last;
            pair.measured = reading.measured;
            pair.sampled = reading.sampled;
        }
        for (key, pair) in pairs.iter_mut() {
            if !seen.contains(key) {
                pair.last.clear();
                pair.measured = true;
            }
            pair.samples.push_back((now, pair.total_ns));
            while pair
                .samples
                .front()
                .is_some_and(|&(t, _)| now.duration_since(t) > WINDOW + SAMPLE_EVERY)
            {
                pair.samples.pop_front();
            }
        }
        // A pair idle for a whole window says 0 % whether kept or not.
        pairs.retain(|key, pair| {
            seen.contains(key)
                || pair.samples.front().map(|s| s.1) != pair.samples.back().map(|s| s.1)
        });
    }

    /// The tenant's utilization of `device` over the last window, in percent:
    /// `None` where the server does not time the tenant's work there.
    pub fn percent(&self, tenant: &str, device: u32) -> Option<u32> {
        lock(&self.pairs)
            .get(&(tenant.to_string(), device))
            .map_or(Some(0), Pair::percent)
    }

    /// Every pair that has run work in the last window.
    pub fn all(&self) -> Vec<TenantUtilization> {
        lock(&self.pairs)
            .iter()
            .map(|((tenant, device), pair)| TenantUtilization {
                tenant: tenant.clone(),
                device: *device,
                gpu_percent: pair.percent(),
            })
            .collect()
    }

    /// Samples `read`'s readings every [`SAMPLE_EVERY`] on a thread of its own,
    /// for as long as `owner` lives.
    pub fn start<T: Send + Sync + 'static>(
        self: &Arc<Self>,
        owner: Weak<T>,
        read: impl Fn(&T) -> Vec<Reading> + Send + 'static,
    ) {
        let this = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("cumux-utilization".into())
            .spawn(move || loop {
                std::thread::sleep(SAMPLE_EVERY);
                let (Some(owner), Some(this)) = (owner.upgrade(), this.upgrade()) else {
                    return;
                };
                this.sample(Instant::now(), read(&owner));
            });
        if let Err(e) = spawned {
            tracing::error!("no utilization sampler: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(tenant: &str, sources: &[(u64, u64)], measured: bool) -> Reading {
        Reading {
            tenant: tenant.into(),
            device: 0,
            sources: sources.to_vec(),
            measured,
            sampled: None,
        }
    }

    #[test]
    fn utilization_is_device_time_over_the_last_window() {
        let u = Utilization::default();
        let t0 = Instant::now();
        let ms = |n: u64| Duration::from_millis(n);
        // Busy half of each 100 ms for a second.
        for i in 0..=10u64 {
            u.sample(
                t0 + ms(100 * i),
                vec![reading("a", &[(1, i * 50_000_000)], true)],
            );
        }
        assert_eq!(u.percent("a", 0), Some(50));
        assert_eq!(u.percent("b", 0), Some(0), "a tenant with no work");
        // Then idle: the figure falls to 0 within a window.
        for i in 11..=22u64 {
            u.sample(
                t0 + ms(100 * i),
                vec![reading("a", &[(1, 500_000_000)], true)],
            );
        }
        assert_eq!(u.percent("a", 0), Some(0));
    }

    #[test]
    fn sessions_that_end_keep_what_they_added() {
        let u = Utilization::default();
        let t0 = Instant::now();
        let ms = |n: u64| Duration::from_millis(n);
        u.sample(t0, vec![reading("a", &[(1, 0), (2, 0)], true)]);
        u.sample(
            t0 + ms(500),
            vec![reading("a", &[(1, 200_000_000), (2, 200_000_000)], true)],
        );
        // Session 2 ended; session 3 began at 0.
        u.sample(
            t0 + ms(1000),
            vec![reading("a", &[(1, 400_000_000), (3, 100_000_000)], true)],
        );
        assert_eq!(u.percent("a", 0), Some(70));
    }

    #[test]
    fn work_the_server_does_not_time_has_no_figure() {
        let u = Utilization::default();
        u.sample(Instant::now(), vec![reading("a", &[(1, 0)], false)]);
        assert_eq!(u.percent("a", 0), None);
    }

    #[test]
    fn work_the_server_does_not_time_may_have_nvidias_figure() {
        let u = Utilization::default();
        let sampled = Reading {
            sampled: Some(42),
            ..reading("a", &[(1, 0)], false)
        };
        u.sample(Instant::now(), vec![sampled]);
        assert_eq!(u.percent("a", 0), Some(42));
    }

    #[test]
    fn several_cores_of_a_cpu_device_count_as_one_device() {
        let u = Utilization::default();
        let t0 = Instant::now();
        u.sample(t0, vec![reading("a", &[(1, 0)], true)]);
        u.sample(t0 + WINDOW, vec![reading("a", &[(1, 3_000_000_000)], true)]);
        assert_eq!(u.percent("a", 0), Some(100));
    }
}
