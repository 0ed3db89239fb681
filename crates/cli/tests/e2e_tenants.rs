//! Tenants end to end: `cumux serve --config FILE` with a TOML tenant table, an
//! unmodified program run with `cumux run --tenant NAME` that sees its quota as
//! the device's memory and fails with out-of-memory past it, unknown and
//! foreign tenants turned away, and a killed program's quota given back.

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(300);

fn config() -> String {
    let uid = std::fs::metadata("/proc/self").unwrap().uid();
    format!(
        r#"
# cumux serve --config: the server and its tenants
device = "cpu"
allow_unknown = false

[tenants.small]
memory_quota = "8M"
weight = 2
class = "latency-critical"
uids = [{uid}]

[tenants.roomy]
memory_quota = "32MiB"

[tenants.elsewhere]
uids = [{other}]

[tenants.quarter]
sm_percent = 25
"#,
        other = uid.wrapping_add(1)
    )
}

/// The value after `key ` on the line that starts with it.
fn field(stdout: &str, key: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key} ")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key:?} in {stdout}"))
}

#[test]
fn a_program_sees_its_quota_and_cannot_pass_it() {
    let server = ServerProc::start_with_config("tenants-quota", Some(&config()));
    let probe = tenant_program("quota_probe");
    for (tenant, quota) in [("small", 8u64 << 20), ("roomy", 32 << 20)] {
        let child = server.command_as(tenant, &probe, &[]).spawn().unwrap();
        let out = wait_bounded(child, LIMIT);
        assert_eq!(out.code(), Some(0), "{tenant}: {}", out.describe());
        assert_eq!(field(&out.stdout, "total"), quota, "{}", out.stdout);
        assert_eq!(field(&out.stdout, "free"), quota, "{}", out.stdout);
        // Exactly the quota in 1 MiB blocks (the program has no globals), then
        // CUDA_ERROR_OUT_OF_MEMORY (cudaErrorMemoryAllocation is 2 as well).
        assert_eq!(field(&out.stdout, "blocks"), quota >> 20, "{}", out.stdout);
        assert!(
            out.stdout.contains(" error 2\n"),
            "{tenant}: {}",
            out.stdout
        );
        assert_eq!(field(&out.stdout, "free after"), 0, "{}", out.stdout);
    }
    // Unknown names and names bound to another uid are turned away, saying why.
    // A tenant capped to a share of a GPU's SMs cannot run on the CPU
    // device, which has none to give it: its program fails, saying so.
    for (tenant, why) in [
        ("mallory", "unknown tenant \"mallory\""),
        ("elsewhere", "not open to uid"),
        ("quarter", "sm_percent = 25"),
    ] {
        let child = server.command_as(tenant, &probe, &[]).spawn().unwrap();
        let out = wait_bounded(child, LIMIT);
        assert_ne!(out.code(), Some(0), "{tenant}: {}", out.describe());
        assert!(
            out.stderr.contains(why) || server.log().contains(why),
            "{tenant}: {}\n--- server log\n{}",
            out.describe(),
            server.log()
        );
    }
}

#[test]
fn sm_caps_out_of_range_are_refused_when_the_server_starts() {
    let dir = TempDir::new("tenants-sm-range");
    let socket = format!("unix:{}", dir.0.join("s.sock").display());
    // `cumux serve ARGS --config` with `config`, which must fail.
    let refused = |args: &[&str], config: &str| {
        let config = config_file(&dir, config);
        let child = serve_command(args)
            .args(["--listen", &socket, "--config"])
            .arg(&config)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_bounded(child, LIMIT);
        assert_ne!(out.code(), Some(0), "{}", out.describe());
        out
    };
    let out = refused(&["--device", "cpu"], "[tenants.quarter]\nsm_percent = 0\n");
    assert!(out.stderr.contains("1 to 100"), "{}", out.describe());
}

#[test]
fn a_killed_program_gives_its_quota_back() {
    let server = ServerProc::start_with_config("tenants-kill", Some(&config()));
    let probe = tenant_program("quota_probe");
    let holding = server.command_as("small", &probe, &["hold", "300"]);
    let (child, _lines) = server.start_until(holding, "holding", Duration::from_secs(120));
    let status = server.status_json();
    let tenants = status["tenants"].as_array().expect("tenants");
    let small = tenants
        .iter()
        .find(|t| t["name"] == "small")
        .unwrap_or_else(|| panic!("no tenant row in {status:#}"));
    assert_eq!(small["mem_used"].as_u64(), Some(8 << 20), "{status:#}");
    assert_eq!(small["memory_quota"].as_u64(), Some(8 << 20), "{status:#}");
    assert_eq!(small["class"], "latency-critical");
    assert_eq!(small["weight"].as_u64(), Some(2));
    let table = server.status_table();
    assert!(table.contains("8.0 MiB / 8.0 MiB"), "{table}");
    // Kill the program itself (the session's pid), not `cumux run`.
    kill_program(&status["sessions"][0]);
    let out = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(out.code(), Some(128 + 9), "{}", out.describe());
    server.status_when("released", |status| {
        status["sessions"].as_array().unwrap().is_empty()
            && status["tenants"].as_array().unwrap().is_empty()
            && status["devices"][0]["used_mem"].as_u64() == Some(0)
    });
    // The whole quota is there for the next program of the tenant.
    let out = wait_bounded(
        server.command_as("small", &probe, &[]).spawn().unwrap(),
        LIMIT,
    );
    assert_eq!(field(&out.stdout, "blocks"), 8, "{}", out.describe());
}

#[test]
fn a_program_cannot_use_another_tenants_pointer() {
    let server = ServerProc::start_with_config("tenants-steal", Some(&config()));
    let program = tenant_program("foreign_pointer");
    let mut owner = server
        .command_as("small", &program, &["own", "5"])
        .spawn()
        .unwrap();
    let (ptr, lines) = owner_pointer(&mut owner, &server);
    let thief = server
        .command_as("roomy", &program, &["steal", &ptr])
        .spawn()
        .unwrap();
    let out = wait_bounded(thief, LIMIT);
    assert!(
        out.code() == Some(0) && out.stdout.contains("steal: PASS"),
        "{}",
        out.describe()
    );
    // The owner still finds its secret intact.
    let started = Instant::now();
    let mut rest = String::new();
    while started.elapsed() < Duration::from_secs(60) {
        match lines.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => rest += &format!("{line}\n"),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    let done = wait_bounded(owner, Duration::from_secs(60));
    assert!(
        done.code() == Some(0) && rest.contains("own: PASS"),
        "{rest}\n{}",
        done.describe()
    );
}

/// `cumux tenant put|remove` on the running server, by its own user.
fn tenant_command(server: &ServerProc, args: &[&str]) -> std::process::Output {
    std::process::Command::new(CUMUX)
        .args(["tenant", "--server", &server.address])
        .args(args)
        .output()
        .expect("cumux tenant runs")
}

#[test]
fn an_admin_lists_and_removes_tenants_while_the_server_runs() {
    let server = ServerProc::start_with_config("tenants-live", Some(&config()));
    let probe = tenant_program("quota_probe");
    let run_as = |tenant: &str| {
        let child = server.command_as(tenant, &probe, &[]).spawn().unwrap();
        wait_bounded(child, LIMIT)
    };
    // Not listed: turned away.
    assert_ne!(run_as("pod-1").code(), Some(0));
    let put = tenant_command(&server, &["put", "pod-1", "--memory-quota", "16M"]);
    assert!(put.status.success(), "{put:?}");
    let out = run_as("pod-1");
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    assert_eq!(field(&out.stdout, "total"), 16 << 20, "{}", out.stdout);
    // A changed entry holds for the next session.
    let put = tenant_command(&server, &["put", "pod-1", "--memory-quota", "4M"]);
    assert!(put.status.success(), "{put:?}");
    assert_eq!(field(&run_as("pod-1").stdout, "total"), 4 << 20);
    // A mistaken entry is refused, saying why, and changes nothing.
    let bad = tenant_command(&server, &["put", "pod-1", "--weight", "0"]);
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("weight must be at least 1"), "{said}");
    assert_eq!(field(&run_as("pod-1").stdout, "total"), 4 << 20);
    // Removed: turned away again.
    let removed = tenant_command(&server, &["remove", "pod-1"]);
    assert!(removed.status.success(), "{removed:?}");
    assert_ne!(run_as("pod-1").code(), Some(0));
    let again = tenant_command(&server, &["remove", "pod-1"]);
    assert!(!again.status.success());
}
