//! Prometheus metrics of the server (`cumux serve --metrics ADDR`): devices,
//! tenants and sessions, in the text format. Names follow dcgm-exporter's
//! where one fits (`DCGM_FI_DEV_FB_USED`), else `cumux_*`; tenant counters
//! run for the server's whole life, past their tenant's last session.

use std::sync::atomic::Ordering;

use prometheus::core::Collector;
use prometheus::{CounterVec, Encoder, Gauge, GaugeVec, Opts, Registry, TextEncoder};

use crate::status::StatusScope;
use crate::{server_status, Server};

const MIB: f64 = (1u64 << 20) as f64;

/// A gauge (or counter) family with `labels`, registered in `registry`.
fn family<C: Collector + Clone + 'static>(
    registry: &Registry,
    make: impl FnOnce(Opts, &[&str]) -> prometheus::Result<C>,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<C> {
    let family = make(Opts::new(name, help), labels)?;
    registry.register(Box::new(family.clone()))?;
    Ok(family)
}

fn gauges(r: &Registry, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
    family(r, GaugeVec::new, name, help, labels)
}

fn counters(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::Result<CounterVec> {
    family(r, CounterVec::new, name, help, labels)
}

/// The server's metrics now, in Prometheus' text format.
pub fn render(server: &Server) -> prometheus::Result<String> {
    let r = Registry::new();
    let status = server_status(server, &StatusScope::Everything);

    let uptime = Gauge::with_opts(Opts::new(
        "cumux_uptime_seconds",
        "Seconds since the server started",
    ))?;
    r.register(Box::new(uptime.clone()))?;
    uptime.set(status.uptime_s);
    let connections = gauges(
        &r,
        "cumux_connections",
        "Connections the server holds now, and its limit",
        &["kind"],
    )?;
    connections
        .with_label_values(&["open"])
        .set(f64::from(status.limits.taken));
    connections
        .with_label_values(&["limit"])
        .set(f64::from(status.limits.sessions));

    let lanes = counters(
        &r,
        "cumux_lane_bytes_total",
        "Bytes the sessions' lanes (further TCP connections for large copies) carried",
        &["direction"],
    )?;
    let (to_server, from_server) = server.lanes().carried();
    lanes.with_label_values(&["in"]).inc_by(to_server as f64);
    lanes.with_label_values(&["out"]).inc_by(from_server as f64);

    let fb_used = gauges(
        &r,
        "DCGM_FI_DEV_FB_USED",
        "Device memory used (MiB), as dcgm-exporter names it",
        &["gpu", "modelName"],
    )?;
    let fb_free = gauges(
        &r,
        "DCGM_FI_DEV_FB_FREE",
        "Device memory free (MiB), as dcgm-exporter names it",
        &["gpu", "modelName"],
    )?;
    let total = gauges(
        &r,
        "cumux_device_memory_total_bytes",
        "Device memory cumux shares out",
        &["device", "backend"],
    )?;
    let used = gauges(
        &r,
        "cumux_device_memory_used_bytes",
        "Device memory held by sessions",
        &["device", "backend"],
    )?;
    let signalled = counters(
        &r,
        "cumux_device_signalled_launches_total",
        "Launches the scheduler saw finish by their completion signal",
        &["device"],
    )?;
    let turns = counters(
        &r,
        "cumux_device_turns_total",
        "Turns given under fair on a time-sliced GPU (one tenant's work on it at a time)",
        &["device"],
    )?;
    let idle_held = counters(
        &r,
        "cumux_device_turn_idle_held_seconds_total",
        "Time holders kept an idle turn while others had work queued (the GPU idle)",
        &["device"],
    )?;
    let overruns = counters(
        &r,
        "cumux_device_turn_overruns_total",
        "Turns ended by an item running past the quantum and the overrun",
        &["device"],
    )?;
    for d in &status.devices {
        let gpu = d.ordinal.to_string();
        turns.with_label_values(&[&gpu]).inc_by(d.turns as f64);
        idle_held
            .with_label_values(&[&gpu])
            .inc_by(d.turn_idle_held_ns as f64 / 1e9);
        overruns
            .with_label_values(&[&gpu])
            .inc_by(d.turn_overruns as f64);
        fb_used
            .with_label_values(&[&gpu, &d.name])
            .set(d.used_mem as f64 / MIB);
        fb_free
            .with_label_values(&[&gpu, &d.name])
            .set(d.total_mem.saturating_sub(d.used_mem) as f64 / MIB);
        total
            .with_label_values(&[&gpu, &d.backend])
            .set(d.total_mem as f64);
        used.with_label_values(&[&gpu, &d.backend])
            .set(d.used_mem as f64);
        signalled
            .with_label_values(&[&gpu])
            .inc_by(d.signalled_launches as f64);
    }

    let live = gauges(
        &r,
        "cumux_tenant_sessions",
        "Live sessions of the tenant",
        &["tenant"],
    )?;
    let mem = gauges(
        &r,
        "cumux_tenant_memory_used_bytes",
        "Device memory the tenant holds",
        &["tenant"],
    )?;
    let quota = gauges(
        &r,
        "cumux_tenant_memory_quota_bytes",
        "The tenant's memory quota (absent: none)",
        &["tenant"],
    )?;
    let charged = gauges(&r, "cumux_tenant_charged_gpu_seconds", "Device time the scheduler has charged the tenant while it has sessions (fair and priority)", &["tenant"])?;
    for t in &status.tenants {
        live.with_label_values(&[&t.name]).set(t.sessions as f64);
        mem.with_label_values(&[&t.name]).set(t.mem_used as f64);
        if let Some(q) = t.memory_quota {
            quota.with_label_values(&[&t.name]).set(q as f64);
        }
        let charged_ns: u64 = server
            .gates
            .iter()
            .flatten()
            .filter_map(|g| g.charged_ns(&t.name))
            .sum();
        charged
            .with_label_values(&[&t.name])
            .set(charged_ns as f64 / 1e9);
    }
    let opened = counters(
        &r,
        "cumux_tenant_sessions_total",
        "Sessions the tenant opened",
        &["tenant"],
    )?;
    let launches = counters(
        &r,
        "cumux_tenant_launches_total",
        "Kernel launches of the tenant",
        &["tenant"],
    )?;
    let gpu = counters(
        &r,
        "cumux_tenant_gpu_seconds_total",
        "Device time of the tenant's launches: charged by the scheduler under fair and priority, measured by the server's threads under fifo",
        &["tenant"],
    )?;
    let refusals = counters(
        &r,
        "cumux_tenant_quota_refusals_total",
        "Allocations refused at the tenant's quota",
        &["tenant"],
    )?;
    let faults = counters(
        &r,
        "cumux_tenant_faults_total",
        "Sessions of the tenant whose context a fatal device error made unusable",
        &["tenant"],
    )?;
    let queued = counters(
        &r,
        "cumux_tenant_queue_delay_seconds_total",
        "Time the tenant's launches waited for the scheduler to let them go",
        &["tenant"],
    )?;
    let throttled = counters(
        &r,
        "cumux_tenant_throttled_seconds_total",
        "Time the tenant's launches waited because their stream had the most it may have unfinished",
        &["tenant"],
    )?;
    let charged = |name: &str| -> f64 {
        let gates = server.gates.iter().flatten();
        gates.map(|g| g.charged_total_ns(name)).sum::<u64>() as f64
    };
    for (name, c) in server.accounts().counters() {
        let load = |v: &std::sync::atomic::AtomicU64| v.load(Ordering::Relaxed) as f64;
        opened
            .with_label_values(&[&name])
            .inc_by(load(&c.sessions_opened));
        launches
            .with_label_values(&[&name])
            .inc_by(load(&c.launches));
        gpu.with_label_values(&[&name])
            .inc_by((load(&c.gpu_time_ns) + charged(&name)) / 1e9);
        refusals
            .with_label_values(&[&name])
            .inc_by(load(&c.quota_refusals));
        faults.with_label_values(&[&name]).inc_by(load(&c.faults));
        queued
            .with_label_values(&[&name])
            .inc_by(load(&c.gate_wait_ns) / 1e9);
        throttled
            .with_label_values(&[&name])
            .inc_by(load(&c.window_wait_ns) / 1e9);
    }

    let utilization = gauges(
        &r,
        "cumux_tenant_gpu_utilization_ratio",
        "Share of the device's last second that ran the tenant's work (where the server times it)",
        &["tenant", "device"],
    )?;
    for u in &status.utilization {
        if let Some(percent) = u.gpu_percent {
            utilization
                .with_label_values(&[&u.tenant, &u.device.to_string()])
                .set(f64::from(percent) / 100.0);
        }
    }
    let orders = counters(
        &r,
        "cumux_migrations_total",
        "Admins' orders to sessions (move, checkpoint, hold, restore) answered, done or refused",
        &["kind", "outcome"],
    )?;
    for (kind, outcome, n) in server.orders().answered() {
        orders.with_label_values(&[kind, outcome]).inc_by(n as f64);
    }

    let labels = ["session", "tenant", "program"];
    let s_mem = gauges(
        &r,
        "cumux_session_memory_used_bytes",
        "Device memory the session holds",
        &labels,
    )?;
    let s_launches = counters(
        &r,
        "cumux_session_launches_total",
        "Kernel launches of the session",
        &labels,
    )?;
    for s in &status.sessions {
        let values = [s.session.to_string(), s.tenant.clone(), s.program.clone()];
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        s_mem.with_label_values(&values).set(s.mem_used as f64);
        s_launches
            .with_label_values(&values)
            .inc_by(s.launches as f64);
    }

    let mut text = Vec::new();
    TextEncoder::new().encode(&r.gather(), &mut text)?;
    String::from_utf8(text).map_err(|e| prometheus::Error::Msg(e.to_string()))
}
