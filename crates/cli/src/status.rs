//! `cumux status`: asks a server for its state (waiting for it to answer, with
//! `--wait`) and prints it as a table or JSON.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use cumux_protocol::{ClientRole, ServerStatus};
use cumux_server::Address;

use crate::probe::{self, Connection, ProbeError};

/// How often `--wait` tries again.
const RETRY: Duration = Duration::from_millis(50);

/// Connects as a status client; with `wait`, tries again while no server
/// answers, for at most that long. A server that answers with a refusal ends
/// the wait.
pub fn connect_waiting(address: &Address, wait: Option<Duration>) -> Result<Connection> {
    let deadline = wait.map(|w| Instant::now() + w);
    loop {
        match probe::connect_as(address, ClientRole::Status, "cumux status", None) {
            Ok(conn) => return Ok(conn),
            Err(ProbeError::Unreachable(why)) => match deadline {
                Some(deadline) if Instant::now() < deadline => std::thread::sleep(RETRY),
                Some(_) => bail!(
                    "{why} (waited {})",
                    humantime::format_duration(wait.unwrap_or_default())
                ),
                None => bail!("{why}"),
            },
            Err(e) => return Err(e.into()),
        }
    }
}

/// `cumux status` of each server of `addresses` in turn (a JSON array of
/// them with `--json`, where there are several); those that could not be
/// asked are named at the end, and fail the command.
pub fn status_of(addresses: &[Address], json: bool, wait: Option<Duration>) -> Result<()> {
    if let [address] = addresses {
        return status(address, json, wait);
    }
    let mut all = Vec::new();
    let mut failed = Vec::new();
    for (i, address) in addresses.iter().enumerate() {
        let asked = connect_waiting(address, wait).and_then(|mut conn| conn.status());
        match asked {
            Ok(status) if json => all.push(status),
            Ok(status) => {
                if i > 0 {
                    println!();
                }
                print!("{}", render(&status, address));
            }
            Err(e) => {
                eprintln!("cumux status: {address}: {e:#}");
                failed.push(address.to_string());
            }
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} servers could not be asked: {}",
            failed.len(),
            addresses.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

pub fn status(address: &Address, json: bool, wait: Option<Duration>) -> Result<()> {
    let mut conn = connect_waiting(address, wait)?;
    let status = conn.status()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", render(&status, address));
    }
    Ok(())
}

/// `1.5 GiB`, `12.0 MiB`, `512 B`.
pub fn human_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let format = humansize::BINARY.decimal_places(1).decimal_zeroes(1);
    humansize::format_size(bytes, format)
}

/// The file name of a program path.
fn program_name(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// `text`, cut to `width` characters with a trailing `…` when longer.
fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// A tenant's utilization of each device where it ran work in the last
/// second (`0: 45%`), `n/a` where the server does not time it; `-` for none.
fn utilization(status: &ServerStatus, tenant: &str) -> String {
    let figures: Vec<String> = status
        .utilization
        .iter()
        .filter(|u| u.tenant == tenant)
        .map(|u| match u.gpu_percent {
            Some(p) => format!("{}: {p}%", u.device),
            None => format!("{}: n/a", u.device),
        })
        .collect();
    match figures.is_empty() {
        true => "-".into(),
        false => figures.join(", "),
    }
}

/// The human table.
pub fn render(status: &ServerStatus, address: &Address) -> String {
    let mut out = format!(
        "{} at {address} (protocol {}), up {:.0} s\n\n",
        status.server, status.version, status.uptime_s
    );
    out += &format!(
        "{:<7} {:<30} {:<8} {:>24} {:<8} {:>8}  {}\n",
        "DEVICE", "NAME", "BACKEND", "USED / TOTAL", "POLICY", "SESSIONS", "HEALTH"
    );
    for d in &status.devices {
        out += &format!(
            "{:<7} {:<30} {:<8} {:>24} {:<8} {:>8}  {}\n",
            d.ordinal,
            clip(&d.name, 30),
            d.backend,
            format!("{} / {}", human_bytes(d.used_mem), human_bytes(d.total_mem)),
            d.policy,
            match d.claims {
                0 => d.sessions.to_string(),
                n => format!("{} (+{n} starting)", d.sessions),
            },
            d.health.split_whitespace().next().unwrap_or("?")
        );
    }
    for d in status
        .devices
        .iter()
        .filter(|d| d.health.starts_with("failed"))
    {
        out += &format!("device {} {}\n", d.ordinal, d.health);
    }
    let l = &status.limits;
    out += &format!(
        "\nconnections {} of {}; at most {} per peer, {} per uid, {} per tenant\n\n",
        l.taken, l.sessions, l.per_peer, l.per_uid, l.per_tenant
    );
    if !status.tenants.is_empty() {
        out += &format!(
            "{:<16} {:>8} {:>24} {:>6} {:<16} {:>5} {:>9} {:>12}  {}\n",
            "TENANT",
            "SESSIONS",
            "MEMORY / QUOTA",
            "WEIGHT",
            "CLASS",
            "SMS",
            "LAUNCHES",
            "GPU TIME",
            "UTIL"
        );
        for t in &status.tenants {
            let quota = t.memory_quota.map_or_else(|| "none".into(), human_bytes);
            out += &format!(
                "{:<16} {:>8} {:>24} {:>6} {:<16} {:>5} {:>9} {:>9.1} ms  {}\n",
                clip(&t.name, 16),
                t.sessions,
                format!("{} / {quota}", human_bytes(t.mem_used)),
                t.weight,
                t.class,
                t.sm_percent
                    .map_or_else(|| "all".into(), |p| format!("{p} %")),
                t.launches,
                t.gpu_time_ms,
                utilization(status, &t.name)
            );
        }
        out += "\n";
    }
    if status.shown != "all" {
        out += &format!(
            "(showing the sessions of {}: everyone's only to the server's own uid and root)\n",
            match status.shown.strip_prefix("tenant ") {
                Some(name) => format!("tenant {name}"),
                None => "no tenant".into(),
            }
        );
    }
    if status.sessions.is_empty() {
        out += "no sessions\n";
        return out;
    }
    out += &format!(
        "{:<8} {:<8} {:<20} {:<12} {:>10} {:>7} {:>9} {:>12} {:<9}\n",
        "SESSION",
        "PID",
        "PROGRAM",
        "TENANT",
        "MEMORY",
        "ALLOCS",
        "LAUNCHES",
        "GPU TIME",
        "TRANSPORT"
    );
    for s in &status.sessions {
        out += &format!(
            "{:<8} {:<8} {:<20} {:<12} {:>10} {:>7} {:>9} {:>9.1} ms {:<9}\n",
            s.session,
            s.pid,
            clip(program_name(&s.program), 20),
            clip(&s.tenant, 12),
            human_bytes(s.mem_used),
            s.allocations,
            s.launches,
            s.gpu_time_ms,
            s.transport
        );
        if let Some(moving) = &s.moving {
            out += &format!("{:<8} {moving}\n", "");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cumux_protocol::{DeviceStatus, LimitsStatus, SessionStatus, TenantStatus};

    #[test]
    fn table_names_devices_and_sessions() {
        let status = ServerStatus {
            server: "cumux 0.1.0".into(),
            version: 1,
            uptime_s: 3.0,
            devices: vec![DeviceStatus {
                ordinal: 0,
                name: "cpu device".into(),
                backend: "cpu".into(),
                uuid: [7; 16],
                total_mem: 1 << 30,
                used_mem: 3 << 20,
                policy: "fair".into(),
                signalled_launches: 12,
                turns: 0,
                turn_idle_held_ns: 0,
                turn_overruns: 0,
                sessions: 1,
                claims: 0,
                health: "ok".into(),
            }],
            sessions: vec![SessionStatus {
                session: 4,
                pid: 99,
                program: "/a/very/long/path/to/a_program_with_a_long_name.bin".into(),
                tenant: "alice".into(),
                device: 0,
                mem_used: 1536,
                allocations: 2,
                launches: 10,
                gpu_time_ms: 1.25,
                transport: "shm".into(),
                moving: Some("move to device 1: rebuilding on device 1: 4096 of 8192 bytes".into()),
            }],
            tenants: vec![TenantStatus {
                name: "alice".into(),
                sessions: 1,
                mem_used: 1536,
                memory_quota: Some(1 << 30),
                weight: 2,
                class: "latency-critical".into(),
                sm_percent: Some(25),
                launches: 10,
                gpu_time_ms: 1234.5,
            }],
            shown: "all".into(),
            utilization: vec![cumux_protocol::TenantUtilization {
                tenant: "alice".into(),
                device: 0,
                gpu_percent: Some(45),
            }],
            limits: LimitsStatus {
                taken: 2,
                sessions: 512,
                per_peer: 64,
                per_uid: 256,
                per_tenant: 256,
            },
        };
        let table = render(&status, &Address::Unix("/tmp/s.sock".into()));
        assert!(table.contains("3.0 MiB / 1.0 GiB"), "{table}");
        assert!(
            table.contains("SESSIONS") && table.contains("fair            1"),
            "{table}"
        );
        assert!(table.contains("a_program_with_a_lo…"), "{table}");
        assert!(
            table.contains("alice") && table.contains("1.5 KiB") && table.contains("1.2 ms"),
            "{table}"
        );
        assert!(table.contains("1.5 KiB / 1.0 GiB"), "{table}");
        assert!(
            table
                .contains("connections 2 of 512; at most 64 per peer, 256 per uid, 256 per tenant"),
            "{table}"
        );
        assert!(table.contains("fair"), "{table}");
        assert!(table.contains("1234.5 ms  0: 45%"), "{table}");
        assert!(table.contains("latency-critical  25 %"), "{table}");
        assert!(table.contains("ms shm"), "{table}");
        assert!(
            table.contains("\n         move to device 1: rebuilding"),
            "{table}"
        );
        assert_eq!(human_bytes(512), "512 B");
    }
}
