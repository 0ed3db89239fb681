//! A device that fails (issue 17), end to end: `cumux device fail` on a
//! server with `on_device_failure = "migrate"` (two CPU devices) or
//! `"migrate-to-cpu"` (a worker-served device and the CPU device kept in
//! reserve) moves `tests/cuda/driver/migrate_loop.cu`, unmodified, off the
//! failed device while it runs; it passes, and the failed device takes no new
//! program until `cumux device ok`.

mod common;

use std::time::Duration;

use common::{driver_program, output_text, progressed, stop_and_pass, ServerProc, TempDir};

const LIMIT: Duration = Duration::from_secs(180);

/// The devices of the sessions of `program`, in session order.
fn devices_of(server: &ServerProc, program: &str) -> Vec<u64> {
    let status = server.status_json();
    status["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["program"].as_str().unwrap_or("").contains(program))
        .map(|s| s["device"].as_u64().unwrap())
        .collect()
}

/// Waits until every session of `program` is on `device`.
fn all_on(server: &ServerProc, program: &str, device: u64) {
    server.status_when(
        &format!("every {program} session on device {device}"),
        |s| {
            let on: Vec<u64> = s["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["program"].as_str().unwrap_or("").contains(program))
                .map(|s| s["device"].as_u64().unwrap())
                .collect();
            !on.is_empty() && on.iter().all(|&d| d == device)
        },
    );
}

fn health(server: &ServerProc, device: usize) -> String {
    server.status_json()["devices"][device]["health"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_failed_device_has_its_program_moved_to_the_healthy_one_and_takes_no_new_one() {
    let args = [
        "--device",
        "cpu",
        "--cpu-devices",
        "2",
        "--memory",
        "1G",
        "--on-device-failure",
        "migrate",
    ];
    let server = ServerProc::spawn(TempDir::new("failover"), &args.map(String::from), &[]);
    assert!(
        server.log().contains("on device failure: migrate"),
        "{}",
        server.log()
    );
    let program = driver_program("migrate_loop");
    let stop = server.dir.0.join("stop");
    let run = server.command(&program, &[stop.to_str().unwrap()]);
    let (mut first, lines) = server.start_until(run, "progress 10", LIMIT);
    assert_eq!(devices_of(&server, "migrate_loop"), [0]);
    assert_eq!(health(&server, 0), "ok");

    // A reason past its bound is refused, and changes nothing.
    let long = "x".repeat(4096);
    let out = server.cumux(&["device", "fail", "0", "--reason", &long]);
    assert!(!out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("at most 512"),
        "{}",
        output_text(&out)
    );
    assert_eq!(health(&server, 0), "ok");
    let out = server.cumux(&["device", "fail", "7"]);
    assert!(
        output_text(&out).contains("the server has no device 7"),
        "{}",
        output_text(&out)
    );

    let out = server.cumux(&["device", "fail", "0", "--reason", "fan stopped (test)"]);
    assert!(out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("its 1 session(s) are being moved off it"),
        "{}",
        output_text(&out)
    );
    // The server moves the program itself; it carries on there.
    all_on(&server, "migrate_loop", 1);
    progressed(&lines, LIMIT, &|| server.log());
    let said = health(&server, 0);
    assert!(
        said.starts_with("failed") && said.contains("(by an admin): fan stopped (test)"),
        "{said}"
    );
    let table = server.status_table();
    assert!(
        table.contains("device 0 failed") && table.contains("fan stopped (test)"),
        "{table}"
    );
    assert!(
        server.log().contains("off the failed device"),
        "{}",
        server.log()
    );

    // A new program gets the healthy device; a move back is refused.
    let stop2 = server.dir.0.join("stop2");
    let run = server.command(&program, &[stop2.to_str().unwrap()]);
    let (mut second, lines2) = server.start_until(run, "progress 10", LIMIT);
    assert_eq!(devices_of(&server, "migrate_loop"), [1, 1]);
    let session = server.status_json()["sessions"][0]["session"]
        .as_u64()
        .unwrap()
        .to_string();
    let out = server.cumux(&["migrate", &session, "--to", "0"]);
    assert!(!out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("device 0 has failed: fan stopped (test)"),
        "{}",
        output_text(&out)
    );

    // Healthy again: it takes moves and programs.
    let out = server.cumux(&["device", "ok", "0"]);
    assert!(
        output_text(&out).contains("device 0 takes programs again"),
        "{}",
        output_text(&out)
    );
    assert_eq!(health(&server, 0), "ok");
    let out = server.cumux(&["migrate", &session, "--to", "0"]);
    assert!(out.status.success(), "{}", output_text(&out));

    stop_and_pass(&stop, &mut first, &lines, LIMIT, &|| server.log());
    stop_and_pass(&stop2, &mut second, &lines2, LIMIT, &|| server.log());
}

#[test]
fn migrate_to_cpu_moves_a_failed_devices_program_to_the_reserve_cpu_device() {
    let args = [
        "--device",
        "worker-cpu",
        "--memory",
        "1G",
        "--on-device-failure",
        "migrate-to-cpu",
    ];
    let server = ServerProc::spawn(TempDir::new("failover-cpu"), &args.map(String::from), &[]);
    let status = server.status_json();
    let devices = status["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{status:#}");
    assert_eq!(devices[1]["health"], "reserve", "{status:#}");
    assert_eq!(devices[1]["backend"], "cpu", "{status:#}");
    let program = driver_program("migrate_loop");
    // The reserve is offered to no program: the program sees one device.
    let only = server
        .command(&program, &["unused"])
        .env("CUDA_VISIBLE_DEVICES", "1")
        .output()
        .unwrap();
    assert!(!only.status.success(), "{}", output_text(&only));

    let stop = server.dir.0.join("stop");
    let run = server.command(&program, &[stop.to_str().unwrap()]);
    let (mut child, lines) = server.start_until(run, "progress 10", LIMIT);
    assert_eq!(devices_of(&server, "migrate_loop"), [0]);
    let out = server.cumux(&["device", "fail", "0", "--reason", "test"]);
    assert!(out.status.success(), "{}", output_text(&out));
    all_on(&server, "migrate_loop", 1);
    progressed(&lines, LIMIT, &|| server.log());

    // With its one device failed, the server refuses new programs, saying why.
    let refused = server.command(&program, &["unused"]).output().unwrap();
    assert_eq!(refused.status.code(), Some(77), "{}", output_text(&refused));
    assert!(
        output_text(&refused).contains("device 0 has failed: test"),
        "{}",
        output_text(&refused)
    );

    stop_and_pass(&stop, &mut child, &lines, LIMIT, &|| server.log());
}
