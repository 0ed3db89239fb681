//! Prometheus metrics of the functions (`cumux serve --metrics` with
//! `--functions`): each function's invocations by HTTP status and the time
//! they took, and each tenant's registered functions, in the text format.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus::{CounterVec, Encoder, GaugeVec, Opts, Registry, TextEncoder};

/// One function's invocations so far.
#[derive(Debug, Default, Clone)]
struct Counts {
    /// Invocations by the HTTP status they got.
    by_status: BTreeMap<u16, u64>,
    seconds: f64,
}

/// Invocation counters by (tenant, function), for the functions registered
/// now (a removed function's go with it).
#[derive(Debug, Default)]
pub struct Stats {
    /// By tenant, then function: an invocation counted finds its entry
    /// without making a key (no allocation once the pair has one).
    counts: Mutex<BTreeMap<String, BTreeMap<String, Counts>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Stats {
    /// Counts one invocation of `function` of `tenant` that got `status`.
    pub fn record(&self, tenant: &str, function: &str, status: u16, took: Duration) {
        let mut counts = lock(&self.counts);
        if !counts.contains_key(tenant) {
            counts.insert(tenant.to_string(), BTreeMap::new());
        }
        let Some(functions) = counts.get_mut(tenant) else {
            return;
        };
        if !functions.contains_key(function) {
            functions.insert(function.to_string(), Counts::default());
        }
        let Some(entry) = functions.get_mut(function) else {
            return;
        };
        *entry.by_status.entry(status).or_default() += 1;
        entry.seconds += took.as_secs_f64();
    }

    /// Forgets a removed function's counters (of every tenant that invoked it).
    pub fn forget(&self, function: &str) {
        let mut counts = lock(&self.counts);
        for functions in counts.values_mut() {
            functions.remove(function);
        }
        counts.retain(|_, functions| !functions.is_empty());
    }

    /// The metrics now, with `registered` functions per tenant, and its
    /// `lanes` (lanes open, jobs queued or running on them) per tenant.
    pub fn render(
        &self,
        registered: &BTreeMap<String, usize>,
        lanes: &BTreeMap<String, (usize, usize)>,
    ) -> prometheus::Result<String> {
        let r = Registry::new();
        let invocations = CounterVec::new(
            Opts::new(
                "cumux_function_invocations_total",
                "Invocations of a function, by the HTTP status they got",
            ),
            &["tenant", "function", "status"],
        )?;
        r.register(Box::new(invocations.clone()))?;
        let seconds = CounterVec::new(
            Opts::new(
                "cumux_function_invocation_seconds_total",
                "Seconds a function's invocations took, queueing included",
            ),
            &["tenant", "function"],
        )?;
        r.register(Box::new(seconds.clone()))?;
        let functions = GaugeVec::new(
            Opts::new("cumux_functions", "Functions a tenant has registered"),
            &["tenant"],
        )?;
        r.register(Box::new(functions.clone()))?;
        let lanes_open = GaugeVec::new(
            Opts::new(
                "cumux_function_lanes",
                "Lanes (sessions running functions) a tenant has open, over its devices",
            ),
            &["tenant"],
        )?;
        r.register(Box::new(lanes_open.clone()))?;
        let lane_jobs = GaugeVec::new(
            Opts::new(
                "cumux_function_lane_jobs",
                "Jobs (invocations among them) queued or running on a tenant's lanes",
            ),
            &["tenant"],
        )?;
        r.register(Box::new(lane_jobs.clone()))?;
        for (tenant, (open, jobs)) in lanes {
            lanes_open
                .with_label_values(&[tenant.as_str()])
                .set(*open as f64);
            lane_jobs
                .with_label_values(&[tenant.as_str()])
                .set(*jobs as f64);
        }
        let all = lock(&self.counts);
        let each = all
            .iter()
            .flat_map(|(tenant, functions)| functions.iter().map(move |f| (tenant, f)));
        for (tenant, (function, counts)) in each {
            for (status, n) in &counts.by_status {
                invocations
                    .with_label_values(&[tenant.as_str(), function, &status.to_string()])
                    .inc_by(*n as f64);
            }
            seconds
                .with_label_values(&[tenant.as_str(), function])
                .inc_by(counts.seconds);
        }
        for (tenant, n) in registered {
            functions
                .with_label_values(&[tenant.as_str()])
                .set(*n as f64);
        }
        let mut out = Vec::new();
        TextEncoder::new().encode(&r.gather(), &mut out)?;
        String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocations_are_counted_by_status_until_forgotten() {
        let stats = Stats::default();
        stats.record("a", "f", 200, Duration::from_millis(500));
        stats.record("a", "f", 200, Duration::from_millis(250));
        stats.record("a", "f", 500, Duration::ZERO);
        let registered = BTreeMap::from([("a".to_string(), 1)]);
        let lanes = BTreeMap::from([("a".to_string(), (2, 3))]);
        let text = stats.render(&registered, &lanes).unwrap();
        assert!(
            text.contains(
                "cumux_function_invocations_total{function=\"f\",status=\"200\",tenant=\"a\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "cumux_function_invocation_seconds_total{function=\"f\",tenant=\"a\"} 0.75"
            ),
            "{text}"
        );
        assert!(text.contains("cumux_functions{tenant=\"a\"} 1"), "{text}");
        assert!(
            text.contains("cumux_function_lanes{tenant=\"a\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("cumux_function_lane_jobs{tenant=\"a\"} 3"),
            "{text}"
        );
        stats.forget("f");
        assert!(!stats
            .render(&registered, &lanes)
            .unwrap()
            .contains("function=\"f\""));
    }
}
