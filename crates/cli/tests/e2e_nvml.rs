//! cumux's NVML through `cumux run`: a tool that loads `libnvidia-ml.so.1`
//! sees its tenant's device, memory total = the quota and used = its own,
//! and only its own processes, while another tenant holds memory beside it.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{wait_bounded, ServerProc};

const MIB: u64 = 1 << 20;

/// `crates/cli/tests/c/nvml_view.c`, built with the system's C compiler.
fn nvml_view(dir: &std::path::Path) -> PathBuf {
    let source = cumux_testkit::workspace_root().join("crates/cli/tests/c/nvml_view.c");
    let exe = dir.join("nvml_view");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(cc)
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .status()
        .expect("a C compiler");
    assert!(built.success(), "building nvml_view failed");
    exe
}

/// The `key: value` lines a run printed.
fn values<'a>(stdout: &'a str, key: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix(": "))
        .collect()
}

#[test]
fn a_tenants_nvml_shows_its_own_share() {
    let config = r#"
allow_unknown = false
[tenants.alice]
memory_quota = "256M"
[tenants.bob]
memory_quota = "512M"
"#;
    let server = ServerProc::start_with_config("nvml", Some(config));
    let program = nvml_view(&server.dir.0);

    // bob holds 100 MiB and stays.
    let mut bob = server
        .command_as("bob", &program, &[&(100 * MIB).to_string(), "30"])
        .env("CUMUX_NVML", "on")
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(bob.stdout.take().unwrap()).lines();
    let bob_said: Vec<String> = lines
        .by_ref()
        .map_while(Result::ok)
        .take_while(|l| l != "PASS")
        .collect();
    assert!(
        bob_said.iter().any(|l| l == "used: 104857600"),
        "{bob_said:?}"
    );

    let alice = server
        .command_as("alice", &program, &[&(64 * MIB).to_string()])
        .env("CUMUX_NVML", "on")
        .spawn()
        .unwrap();
    let out = wait_bounded(alice, Duration::from_secs(60));
    out.assert_passed();
    let said = |key| values(&out.stdout, key);
    assert_eq!(said("count"), ["1"], "{}", out.stdout);
    assert_eq!(said("total"), [(256 * MIB).to_string()], "{}", out.stdout);
    assert_eq!(said("used"), [(64 * MIB).to_string()], "{}", out.stdout);
    assert_eq!(said("free"), [(192 * MIB).to_string()], "{}", out.stdout);
    let processes = said("process");
    assert_eq!(processes.len(), 1, "{}", out.stdout);
    assert!(
        processes[0].ends_with(&format!("{} (me)", 64 * MIB)),
        "{}",
        out.stdout
    );
    assert!(said("uuid")[0].starts_with("GPU-"), "{}", out.stdout);
    // Not measured per tenant: NVML_ERROR_NOT_SUPPORTED.
    assert_eq!(said("utilization"), ["3"], "{}", out.stdout);
    let _ = bob.kill();
    let _ = bob.wait();
}

/// Unless asked for, cumux's NVML stays out (NVIDIA's, none on this machine,
/// shows through).
#[test]
fn without_cumux_nvml_the_program_finds_none_here() {
    let server = ServerProc::start("nvml-off");
    let program = nvml_view(&server.dir.0);
    let child = server
        .command(&program, &[])
        .env_remove("CUMUX_NVML")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(out.code(), Some(1), "{}", out.describe());
    assert!(
        out.stdout.contains("libnvidia-ml.so.1"),
        "{}",
        out.describe()
    );
}
