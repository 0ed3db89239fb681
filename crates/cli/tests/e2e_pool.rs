//! Programs on the devices of several servers at once (`CUMUX_SERVER=a,b`):
//! the devices of each, numbered one server after another, used together as
//! two GPUs of one machine are; a server killed mid-run fails its programs
//! within seconds and leaves the other server and its programs unharmed.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(180);

/// A `cumux serve` of one device (in address window `window`) on a unix
/// socket.
fn unix_server(tag: &str, window: u32) -> ServerProc {
    let window = window.to_string();
    let args: Vec<String> = [
        "--device",
        &e2e_device(),
        "--memory",
        "1G",
        "--cpu-window",
        &window,
    ]
    .map(String::from)
    .to_vec();
    ServerProc::spawn(TempDir::new(tag), &args, &[])
}

/// A `cumux serve` of one device in window 1 on a loopback TCP port; the
/// child and its address.
fn tcp_server(dir: &TempDir) -> (Child, String) {
    let log = std::fs::File::create(dir.0.join("tcp-server.log")).unwrap();
    let mut serve = serve_command(&[
        "--device",
        &e2e_device(),
        "--memory",
        "1G",
        "--cpu-window",
        "1",
        "--listen",
        "tcp:127.0.0.1:0",
    ]);
    serve.stderr(log);
    let mut child = serve.spawn().unwrap();
    let address = tcp_address(&lines_of(child.stdout.take().unwrap()));
    (child, address)
}

#[test]
fn one_program_uses_the_devices_of_two_servers() {
    let first = unix_server("pool-a", 0);
    let second = unix_server("pool-b", 1);
    let both = format!("{},{}", first.address, second.address);
    let program = driver_program("two_devices");
    let mut run = run_command_at(&both, &[], &program, &[]);
    let out = wait_bounded(run.spawn().unwrap(), LIMIT);
    assert!(
        out.code() == Some(0) && out.stdout.contains("PASS"),
        "{}\n--- first server\n{}\n--- second server\n{}",
        out.describe(),
        first.log(),
        second.log()
    );
    // Devices of two servers reach each other only through the client.
    assert!(out.stdout.contains("can_access_peer: 0"), "{}", out.stdout);
    for server in [&first, &second] {
        assert!(
            server.log().contains("two_devices"),
            "a session on each server: {}",
            server.log()
        );
    }
    // CUDA_VISIBLE_DEVICES orders the devices of both servers together:
    // here the program's device 0 is the second server's.
    let mut run = run_command_at(&both, &[], &program, &[]);
    run.env("CUDA_VISIBLE_DEVICES", "1,0");
    let out = wait_bounded(run.spawn().unwrap(), LIMIT);
    out.assert_passed();
    let mut run = run_command_at(&both, &[], &driver_program("device_query"), &[]);
    run.env("CUDA_VISIBLE_DEVICES", "1");
    let out = wait_bounded(run.spawn().unwrap(), LIMIT);
    out.assert_passed();
    assert!(
        second.log().matches("device_query").count() >= 1 && !first.log().contains("device_query"),
        "device_query should run on the second server alone:\n{}\n---\n{}",
        first.log(),
        second.log()
    );
}

#[test]
fn the_same_address_twice_is_refused() {
    let server = unix_server("pool-twice", 0);
    let twice = format!("{0},{0}", server.address);
    let mut run = run_command_at(&twice, &[], &driver_program("two_devices"), &[]);
    let out = wait_bounded(run.spawn().unwrap(), LIMIT);
    assert_ne!(out.code(), Some(0));
    assert!(out.stderr.contains("listed twice"), "{}", out.describe());
}

#[test]
fn a_killed_server_fails_its_programs_within_seconds_and_spares_the_other() {
    let first = unix_server("pool-kill-a", 0);
    let dir = TempDir::new("pool-kill-b");
    let (mut second, tcp) = tcp_server(&dir);
    let both = format!("{},{}", first.address, tcp);
    let program = driver_program("lost_connection");
    // One program works on the second server's device, another on the first's.
    let (on_second, second_lines) = first.start_until(
        run_command_at(&both, &[], &program, &["1"]),
        "started",
        LIMIT,
    );
    let (mut on_first, first_lines) =
        first.start_until(first.command(&program, &["0"]), "started", LIMIT);
    let killed = Instant::now();
    let _ = second.kill();
    let _ = second.wait();
    let out = wait_bounded(on_second, Duration::from_secs(30));
    let took = killed.elapsed();
    let rest: Vec<String> = second_lines.try_iter().collect();
    assert!(
        out.code() == Some(0) && rest.iter().any(|l| l == "PASS"),
        "{rest:?}\n{}",
        out.describe()
    );
    assert!(took < Duration::from_secs(5), "errors only after {took:?}");
    // The first server and its program carry on until it goes.
    std::thread::sleep(Duration::from_millis(300));
    let mut first = first;
    assert!(first.alive());
    assert!(
        on_first.try_wait().unwrap().is_none(),
        "the first server's program ended with the second server"
    );
    first.kill();
    let out = wait_bounded(on_first, Duration::from_secs(30));
    let rest: Vec<String> = first_lines.try_iter().collect();
    assert!(
        rest.iter().any(|l| l == "PASS"),
        "{rest:?}\n{}",
        out.describe()
    );
}

/// A `cumux serve` of `count` CPU devices from address window `window`.
fn server_of(tag: &str, count: u32, window: u32) -> ServerProc {
    let (count, window) = (count.to_string(), window.to_string());
    let args: Vec<String> = [
        "--device",
        &e2e_device(),
        "--memory",
        "1G",
        "--cpu-devices",
        &count,
        "--cpu-window",
        &window,
    ]
    .map(String::from)
    .to_vec();
    ServerProc::spawn(TempDir::new(tag), &args, &[])
}

#[test]
fn a_pool_places_a_program_on_the_fewest_servers_that_fit() {
    let small = server_of("pool-small", 1, 0);
    let large = server_of("pool-large", 2, 1);
    let dir = TempDir::new("pool-file");
    let file = dir.0.join("pool.toml");
    std::fs::write(
        &file,
        format!(
            "[[servers]]\naddress = \"{}\"\n\n[[servers]]\naddress = \"{}\"\n",
            small.address, large.address
        ),
    )
    .unwrap();
    let pool = file.display().to_string();
    let run = |options: &[&str], program: &str| {
        let mut command = std::process::Command::new(CUMUX);
        command
            .args(["run", "--pool", &pool])
            .args(options)
            .arg("--")
            .arg(driver_program(program))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        wait_bounded(command.spawn().unwrap(), LIMIT)
    };
    // Two devices fit on the larger server alone.
    let out = run(&["--gpus", "2", "--memory", "512M"], "two_devices");
    out.assert_passed();
    let placed = format!("placed on {}:", large.address);
    assert!(out.stderr.contains(&placed), "{}", out.describe());
    assert!(!out.stderr.contains(&small.address), "{}", out.describe());
    // Three take both servers.
    let out = run(&["--gpus", "3"], "device_query");
    out.assert_passed();
    assert!(out.stdout.contains("device_count: 3"), "{}", out.describe());
    // Four do not fit anywhere: nothing starts, and the answer says why.
    let out = run(&["--gpus", "4"], "device_query");
    assert_eq!(out.code(), Some(69), "{}", out.describe());
    assert!(
        out.stderr.contains("the pool has 3 device(s)") && out.stderr.contains("not started"),
        "{}",
        out.describe()
    );
    let out = run(&["--gpus", "1", "--memory", "2G"], "device_query");
    assert_eq!(out.code(), Some(69), "{}", out.describe());
    // A server of the pool that does not answer is left out, and said so.
    let gone = dir.0.join("gone.sock");
    std::fs::write(
        &file,
        format!(
            "[[servers]]\naddress = \"unix:{}\"\n\n[[servers]]\naddress = \"{}\"\n",
            gone.display(),
            large.address
        ),
    )
    .unwrap();
    let out = run(&["--gpus", "1"], "device_query");
    out.assert_passed();
    assert!(
        out.stderr.contains("was left out") && out.stderr.contains("gone.sock"),
        "{}",
        out.describe()
    );
}

/// Two one-device servers named `tag-a` and `tag-b` and a pool file of both
/// (in `dir`).
fn two_server_pool(tag: &str) -> (ServerProc, ServerProc, TempDir, std::path::PathBuf) {
    let first = server_of(&format!("{tag}-a"), 1, 0);
    let second = server_of(&format!("{tag}-b"), 1, 1);
    let dir = TempDir::new(tag);
    let file = dir.0.join("pool.toml");
    std::fs::write(
        &file,
        format!(
            "[[servers]]\naddress = \"{}\"\n\n[[servers]]\naddress = \"{}\"\n",
            first.address, second.address
        ),
    )
    .unwrap();
    (first, second, dir, file)
}

/// `cumux run --pool FILE -- ARGS…`, its output piped.
fn run_in_pool(file: &std::path::Path, args: &[&std::ffi::OsStr]) -> Child {
    let mut command = std::process::Command::new(CUMUX);
    command
        .args(["run", "--pool", &file.display().to_string(), "--"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    command.spawn().unwrap()
}

#[test]
fn a_pool_spreads_programs_over_its_least_busy_servers() {
    let (first, second, _dir, file) = two_server_pool("pool-spread");
    let program = test_program("loop_launches");
    let start = || {
        let mut child = run_in_pool(&file, &[program.as_os_str(), "60".as_ref()]);
        let lines = lines_of(child.stdout.take().unwrap());
        wait_for_line(&lines, "started", LIMIT).unwrap();
        child
    };
    // Each program, once running, holds a session: the next goes elsewhere.
    let mut one = start();
    let mut two = start();
    let on = |server: &ServerProc| server.log().matches("loop_launches").count();
    let placed = (on(&first), on(&second));
    for child in [&mut one, &mut two] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(
        placed.0 >= 1 && placed.1 >= 1,
        "both on one server: {placed:?}\n{}\n---\n{}",
        first.log(),
        second.log()
    );
}

/// A program placed by `--pool` counts on its server from the moment it is
/// started, not only once it connects: a second program placed while the
/// first is still starting (here a shell that waits before it runs the CUDA
/// program) goes to the other server, and `cumux status` shows the first as
/// starting there.
#[test]
fn a_program_still_starting_counts_for_the_next_placement() {
    let (first, second, _dir, file) = two_server_pool("pool-claim");
    let program = test_program("loop_launches");
    let slow_start = format!("sleep 3; exec {} 60", program.display());
    let start = || run_in_pool(&file, &["sh".as_ref(), "-c".as_ref(), slow_start.as_ref()]);
    let status = |server: &ServerProc| status_json(&status_output(&server.address, &["--json"]));
    let starting =
        |server: &ServerProc| status(server)["devices"][0]["claims"].as_u64().unwrap_or(0);
    let mut one = start();
    let deadline = Instant::now() + Duration::from_secs(20);
    while starting(&first) + starting(&second) == 0 {
        assert!(
            Instant::now() < deadline,
            "no server counts the starting program"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut two = start();
    let mut lines = Vec::new();
    for child in [&mut one, &mut two] {
        let got = lines_of(child.stdout.take().unwrap());
        lines.push(got);
    }
    for got in &lines {
        wait_for_line(got, "started", LIMIT).unwrap();
    }
    let on = |server: &ServerProc| {
        let log = server.log();
        log.lines()
            .filter(|l| l.contains("session opened") && l.contains("loop_launches"))
            .count()
    };
    let placed = (on(&first), on(&second));
    // Once both run, neither server counts a claim: their sessions count.
    let claims = (starting(&first), starting(&second));
    // And the claim's connection is gone: a running program holds one seat
    // (the other taken one is the status call asking).
    let seats = |server: &ServerProc| {
        status(server)["limits"]["taken"]
            .as_u64()
            .unwrap_or(u64::MAX)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while seats(&first) > 2 || seats(&second) > 2 {
        assert!(
            Instant::now() < deadline,
            "a claim still holds a seat: {} and {} taken",
            seats(&first),
            seats(&second)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for child in [&mut one, &mut two] {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert_eq!(
        placed,
        (1, 1),
        "both on one server\n{}\n---\n{}",
        first.log(),
        second.log()
    );
    assert_eq!(claims, (0, 0));
}

/// `cumux status` with several servers (`--server a,b` or `CUMUX_SERVER`)
/// shows each (a JSON array with `--json`) and names one it could not ask;
/// a command that changes one server is refused such a list, naming them.
#[test]
fn status_shows_every_server_of_a_list_and_admin_commands_want_one() {
    let first = unix_server("status-a", 0);
    let second = unix_server("status-b", 1);
    let both = format!("{},{}", first.address, second.address);
    let out = std::process::Command::new(CUMUX)
        .args(["status", "--server", &both])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&first.address) && text.contains(&second.address),
        "{text}"
    );
    let out = std::process::Command::new(CUMUX)
        .args(["status", "--json"])
        .env("CUMUX_SERVER", &both)
        .output()
        .unwrap();
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all.as_array().map(Vec::len), Some(2), "{all}");
    let gone = format!("{},unix:/nonexistent/cumux.sock", first.address);
    let out = std::process::Command::new(CUMUX)
        .args(["status", "--server", &gone])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("1 of 2 servers could not be asked"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&first.address));
    let out = std::process::Command::new(CUMUX)
        .args(["tenant", "remove", "nobody"])
        .env("CUMUX_SERVER", &both)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("names 2 servers") && err.contains("pass --server"),
        "{err}"
    );
}
