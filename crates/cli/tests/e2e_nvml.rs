//! cumux's NVML through `cumux run`: a tool that loads `libnvidia-ml.so.1`
//! sees its tenant's device, memory total = the quota and used = its own,
//! only its own processes and its own utilization, while another tenant holds
//! memory beside it; the rest of NVML comes from NVIDIA's library behind it.

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{wait_bounded, ServerProc};

const MIB: u64 = 1 << 20;

/// `crates/cli/tests/c/NAME.c`, built with the system's C compiler into
/// `dir/output` with `flags`.
fn build_c(dir: &std::path::Path, name: &str, output: &str, flags: &[&str]) -> PathBuf {
    let source = cumux_testkit::workspace_root().join(format!("crates/cli/tests/c/{name}.c"));
    let built_file = dir.join(output);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(cc)
        .args(flags)
        .arg(&source)
        .arg("-o")
        .arg(&built_file)
        .arg("-ldl")
        .status()
        .expect("a C compiler");
    assert!(built.success(), "building {name} failed");
    built_file
}

/// The monitoring tool (`c/nvml_view.c`).
fn nvml_view(dir: &std::path::Path) -> PathBuf {
    build_c(dir, "nvml_view", "nvml_view", &[])
}

/// A stand-in for NVIDIA's NVML (`c/fake_nvidia_nvml.c`).
fn fake_nvidia_nvml(dir: &std::path::Path) -> PathBuf {
    build_c(
        dir,
        "fake_nvidia_nvml",
        "libnvidia-ml.so.1",
        &["-shared", "-fPIC"],
    )
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
    // Its own share: it ran nothing (bob's work is not its own).
    assert_eq!(said("utilization"), ["0 0 0"], "{}", out.stdout);
    // No NVIDIA NVML here: what it would answer is not found.
    assert_eq!(said("temperature"), ["13 0"], "{}", out.stdout);
    assert_eq!(said("power"), ["13"], "{}", out.stdout);
    assert!(said("driver")[0].starts_with("0 cumux-"), "{}", out.stdout);
    assert_eq!(said("other device"), ["6"], "{}", out.stdout);
    assert_eq!(said("private table"), ["13"], "{}", out.stdout);
    let _ = bob.kill();
    let _ = bob.wait();
}

/// A server with one tenant of 256 MiB, and its run of the tool with
/// NVIDIA's NVML (the stand-in) behind cumux's; `extra` adds environment.
fn with_nvidia_behind(name: &str, extra: &[(&str, &str)]) -> common::RunOutput {
    let config = r#"
allow_unknown = false
[tenants.alice]
memory_quota = "256M"
"#;
    let server = ServerProc::start_with_config(name, Some(config));
    let program = nvml_view(&server.dir.0);
    let nvidia = fake_nvidia_nvml(&server.dir.0);
    let mut command = server.command_as("alice", &program, &[&(16 * MIB).to_string()]);
    command
        .env("CUMUX_NVML", "on")
        .env("CUMUX_REAL_NVML", &nvidia);
    for (key, value) in extra {
        command.env(key, value);
    }
    wait_bounded(command.spawn().unwrap(), Duration::from_secs(60))
}

/// What cumux's NVML does not answer goes to NVIDIA's, on NVIDIA's handle
/// for the tenant's device; what it answers never does.
#[test]
fn nvidias_nvml_answers_the_rest_on_the_tenants_devices() {
    let out = with_nvidia_behind("nvml-behind", &[]);
    out.assert_passed();
    let said = |key| values(&out.stdout, key);
    assert_eq!(said("count"), ["1"], "{}", out.stdout);
    assert_eq!(said("total"), [(256 * MIB).to_string()], "{}", out.stdout);
    assert_eq!(said("used"), [(16 * MIB).to_string()], "{}", out.stdout);
    // The stand-in's first device is not the tenant's: the tenant's is 43.
    assert_eq!(said("temperature"), ["0 43"], "{}", out.stdout);
    assert_eq!(said("driver"), ["0 580.99.fake"], "{}", out.stdout);
    // One the stand-in lacks.
    assert_eq!(said("power"), ["13"], "{}", out.stdout);
    // NVIDIA's NVML finds a device the tenant does not have: not found.
    assert_eq!(said("other device"), ["6"], "{}", out.stdout);
    // Every session on the device is the tenant's: NVIDIA's figures for the
    // whole device are its own.
    assert_eq!(said("utilization"), ["0 77 33"], "{}", out.stdout);
}

/// nvidia-smi finds devices and lists processes through NVIDIA's private
/// table: those entries answer for the tenant, the rest stay NVIDIA's.
#[test]
fn nvidia_smis_private_table_answers_for_the_tenant() {
    let out = with_nvidia_behind("nvml-table", &[]);
    out.assert_passed();
    let said = |key| values(&out.stdout, key);
    assert_eq!(said("private table"), ["0"], "{}", out.stdout);
    assert_eq!(said("table device"), ["0 same"], "{}", out.stdout);
    let processes = said("table process");
    assert_eq!(processes.len(), 1, "{}", out.stdout);
    assert!(
        processes[0].ends_with(&format!(" {} nvml_view", 16 * MIB)),
        "{}",
        out.stdout
    );
    assert_eq!(said("table other entry"), ["999"], "{}", out.stdout);
}

/// An NVIDIA NVML that does not know the tenant's devices (they are on
/// another machine) is left out, and says so, rather than being handed
/// handles it never gave.
#[test]
fn an_nvidia_nvml_that_does_not_know_the_devices_is_left_out() {
    let out = with_nvidia_behind("nvml-remote", &[("FAKE_NVML_KNOWS_NONE", "1")]);
    out.assert_passed();
    let said = |key| values(&out.stdout, key);
    assert_eq!(said("total"), [(256 * MIB).to_string()], "{}", out.stdout);
    assert_eq!(said("temperature"), ["13 0"], "{}", out.stdout);
    assert!(said("driver")[0].starts_with("0 cumux-"), "{}", out.stdout);
    assert!(
        out.stderr.contains("is not used") && out.stderr.contains("does not know"),
        "{}",
        out.describe()
    );
}

/// With `CUMUX_NVML=off`, cumux's NVML stays out (NVIDIA's, none on this
/// machine, shows through).
#[test]
fn with_cumux_nvml_off_the_program_finds_none_here() {
    let server = ServerProc::start("nvml-off");
    let program = nvml_view(&server.dir.0);
    let child = server
        .command(&program, &[])
        .env("CUMUX_NVML", "off")
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

/// While a tenant's program keeps the device busy, its NVML (there by
/// default) reports a share of the last second above zero; the server
/// measured it.
#[test]
fn a_busy_tenant_sees_its_own_utilization() {
    let config = r#"
allow_unknown = false
[tenants.alice]
memory_quota = "256M"
"#;
    let server = ServerProc::start_with_config("nvml-busy", Some(config));
    let tool = nvml_view(&server.dir.0);
    let looping = common::test_program("loop_launches");
    let mut busy = server
        .command_as("alice", &looping, &["20"])
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(busy.stdout.take().unwrap()).lines();
    assert!(
        lines
            .by_ref()
            .map_while(Result::ok)
            .any(|l| l.contains("started")),
        "the looping program did not start"
    );
    std::thread::sleep(Duration::from_millis(1500));
    let child = server
        .command_as("alice", &tool, &[])
        .env_remove("CUMUX_NVML")
        .spawn()
        .unwrap();
    let out = wait_bounded(child, Duration::from_secs(60));
    let _ = busy.kill();
    let _ = busy.wait();
    out.assert_passed();
    let said = values(&out.stdout, "utilization");
    let fields: Vec<u32> = said[0].split(' ').map(|f| f.parse().unwrap()).collect();
    assert_eq!(fields[0], 0, "{}", out.stdout);
    assert!(fields[1] > 0 && fields[1] <= 100, "{}", out.stdout);
}
