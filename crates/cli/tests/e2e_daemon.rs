//! `cumux serve` as a daemon: SIGTERM or SIGINT drains it (running sessions
//! finish, new connections are told it is shutting down, the socket goes,
//! exit 0), `--drain-timeout` bounds the drain and a second signal ends it,
//! `cumux status --wait` returns once it listens, it tells a service manager
//! READY=1 and STOPPING=1, its logs are plain (or JSON) when redirected, the
//! socket takes its mode and group from the config, and config mistakes read
//! as such.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;
use cumux_protocol::{
    decode, encode, read_frame, write_frame, Hello, HelloReply, MAGIC, PROTOCOL_VERSION,
};

/// The program name the raw sessions of these tests give.
const PROGRAM: &str = "e2e-daemon";

fn socket_path(server: &ServerProc) -> PathBuf {
    PathBuf::from(server.address.strip_prefix("unix:").expect("a unix server"))
}

/// Says a driver's hello on a fresh connection: the answer, and the socket
/// (a welcomed session stays open while it lives).
fn hello(server: &ServerProc) -> (HelloReply, UnixStream) {
    let mut s = UnixStream::connect(socket_path(server)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // Written as JSON: optional fields the hello gains later stay `None`.
    let hello: Hello = serde_json::from_value(serde_json::json!({
        "magic": MAGIC,
        "version": PROTOCOL_VERSION,
        "pid": std::process::id(),
        "role": "Driver",
        "program": PROGRAM,
        "shm": false,
    }))
    .unwrap();
    write_frame(&mut s, &encode(&hello).unwrap()).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut s, &mut buf).unwrap();
    (decode(&buf).unwrap(), s)
}

/// A session open on `server`, as a program's driver holds one.
fn open_session(server: &ServerProc) -> UnixStream {
    match hello(server) {
        (HelloReply::Welcome { .. }, socket) => socket,
        (other, _) => panic!("not welcomed: {other:?}\n{}", server.log()),
    }
}

/// Sends `signal` (`TERM`, `INT`, …) to `pid`.
fn signal(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// The server's exit status, failing the test after `limit`.
fn exit_within(server: &mut ServerProc, limit: Duration) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            started.elapsed() < limit,
            "the server still runs after {limit:?}\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The refusal a new connection gets once the drain has begun.
fn refusal_while_draining(server: &ServerProc) -> String {
    poll(
        "new connections were never refused",
        Duration::from_secs(10),
        || match hello(server) {
            (HelloReply::Rejected { reason, .. }, _) => Some(reason),
            _ => None,
        },
    )
}

fn serve_args(extra: &[&str]) -> Vec<String> {
    ["--device", "cpu", "--memory", "64M"]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn sigterm_lets_the_running_session_finish_then_exits_cleanly() {
    let mut server = ServerProc::spawn(TempDir::new("drain"), &serve_args(&[]), &[]);
    let socket = socket_path(&server);
    let held = open_session(&server);
    signal(server.child.id(), "TERM");
    let reason = refusal_while_draining(&server);
    assert!(reason.contains("shutting down"), "{reason}");
    // `cumux run` reads it as a refusal and starts nothing.
    let out = wait_bounded(
        run_command_at(&server.address, &[], "true".as_ref(), &[])
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
    );
    assert_eq!(out.code(), Some(77), "{}", out.describe());
    assert!(out.stderr.contains("shutting down"), "{}", out.describe());
    std::thread::sleep(Duration::from_millis(300));
    assert!(server.alive(), "it must wait for the open session");
    assert!(socket.exists());
    drop(held);
    let status = exit_within(&mut server, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", server.log());
    assert!(!socket.exists(), "the socket file is left behind");
    let log = server.log();
    assert!(log.contains("SIGTERM: draining"), "{log}");
    assert!(
        log.contains("stopped: every session had ended") && log.contains("nothing left open"),
        "{log}"
    );
}

#[test]
fn a_looping_program_finishes_within_the_grace_period() {
    let mut server = ServerProc::spawn(TempDir::new("drain-program"), &serve_args(&[]), &[]);
    let program = test_program("loop_launches");
    let (child, _lines) = server.start_until(
        server.command(&program, &["2"]),
        "started",
        Duration::from_secs(120),
    );
    signal(server.child.id(), "INT");
    let out = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(out.code(), Some(0), "{}\n{}", out.describe(), server.log());
    let status = exit_within(&mut server, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", server.log());
    assert!(
        server.log().contains("SIGINT: draining"),
        "{}",
        server.log()
    );
    assert!(!socket_path(&server).exists());
}

#[test]
fn the_drain_timeout_ends_what_is_left_and_says_what() {
    let mut server = ServerProc::spawn(
        TempDir::new("drain-timeout"),
        &serve_args(&["--drain-timeout", "1s"]),
        &[],
    );
    let _held = open_session(&server);
    let asked = Instant::now();
    signal(server.child.id(), "TERM");
    let status = exit_within(&mut server, Duration::from_secs(15));
    assert!(asked.elapsed() >= Duration::from_millis(900));
    assert_eq!(status.code(), Some(0), "{}", server.log());
    let log = server.log();
    let line = log
        .lines()
        .find(|l| l.contains("stopped:"))
        .unwrap_or_else(|| panic!("no summary line: {log}"));
    assert!(
        line.contains("drain timeout passed")
            && line.contains("1 connection(s) left open")
            && line.contains(PROGRAM),
        "{line}"
    );
    assert!(!socket_path(&server).exists());
}

#[test]
fn a_second_signal_stops_at_once() {
    let mut server = ServerProc::spawn(TempDir::new("drain-twice"), &serve_args(&[]), &[]);
    let _held = open_session(&server);
    signal(server.child.id(), "TERM");
    refusal_while_draining(&server);
    let asked = Instant::now();
    signal(server.child.id(), "INT");
    let status = exit_within(&mut server, Duration::from_secs(10));
    assert!(asked.elapsed() < Duration::from_secs(5));
    assert_eq!(status.code(), Some(0), "{}", server.log());
    assert!(
        server.log().contains("a second signal ended the drain"),
        "{}",
        server.log()
    );
}

#[test]
fn status_wait_returns_once_the_server_listens() {
    let dir = TempDir::new("status-wait");
    let address = format!("unix:{}", dir.0.join("s.sock").display());
    // Nothing listens: --wait gives up after its timeout, saying so.
    let started = Instant::now();
    let gave_up = status_output(&address, &["--wait", "300ms"]);
    assert_eq!(gave_up.status.code(), Some(1));
    assert!(started.elapsed() >= Duration::from_millis(300));
    let why = String::from_utf8_lossy(&gave_up.stderr);
    assert!(
        why.contains("no cumux server answers") && why.contains("waited"),
        "{why}"
    );
    // A status that waits, then the server.
    let waiting = Command::new(CUMUX)
        .args(["status", "--json", "--wait", "60s", "--server", &address])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut server = serve_command(&["--device", "cpu", "--memory", "64M", "--listen", &address])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = wait_bounded(waiting, Duration::from_secs(60));
    // `--wait` without a value, once it listens, answers at once.
    let at_once = status_output(&address, &["--wait"]);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    let status: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(status["devices"][0]["backend"], "cpu");
    assert!(
        at_once.status.success(),
        "{}",
        String::from_utf8_lossy(&at_once.stderr)
    );
}

#[test]
fn the_service_manager_hears_ready_and_stopping() {
    let dir = TempDir::new("notify");
    let notify = dir.0.join("notify.sock");
    let manager = UnixDatagram::bind(&notify).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let notify_env = notify.display().to_string();
    let mut server = ServerProc::spawn(
        dir,
        &serve_args(&[]),
        &[("NOTIFY_SOCKET", notify_env.as_str())],
    );
    let mut buf = [0u8; 512];
    let n = manager.recv(&mut buf).expect("READY=1 arrives");
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready}");
    assert!(ready.contains(&server.address), "{ready}");
    signal(server.child.id(), "TERM");
    let n = manager.recv(&mut buf).expect("STOPPING=1 arrives");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    let status = exit_within(&mut server, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", server.log());
}

#[test]
fn logs_are_plain_text_or_json_when_redirected() {
    let mut server = ServerProc::spawn(TempDir::new("plain-log"), &serve_args(&[]), &[]);
    drop(open_session(&server));
    signal(server.child.id(), "TERM");
    exit_within(&mut server, Duration::from_secs(10));
    let log = server.log();
    assert!(log.contains("listening on"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a redirected log: {log:?}"
    );
    let mut server = ServerProc::spawn(
        TempDir::new("json-log"),
        &serve_args(&["--log-format", "json"]),
        &[],
    );
    drop(open_session(&server));
    signal(server.child.id(), "TERM");
    exit_within(&mut server, Duration::from_secs(10));
    let log = server.log();
    let events: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(
        events.iter().any(
            |e| e["fields"]["message"] == "session opened" && e["fields"]["program"] == PROGRAM
        ),
        "{log}"
    );
    assert!(events.iter().all(|e| e["level"].is_string()), "{log}");
}

#[test]
fn the_socket_takes_its_mode_and_group_from_the_config() {
    let dir = TempDir::new("socket-mode");
    let gid = std::fs::metadata(&dir.0).unwrap().gid();
    let config = config_file(
        &dir,
        &format!("socket_mode = \"0660\"\nsocket_group = \"{gid}\"\n"),
    );
    let config = config.display().to_string();
    let server = ServerProc::spawn(dir, &serve_args(&["--config", &config]), &[]);
    let meta = std::fs::symlink_metadata(socket_path(&server)).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), gid);
    assert!(!server.log().contains("nobody else"), "{}", server.log());
    drop(server);
    // In a private folder the mode opens nothing: it says so.
    let dir = TempDir::new("socket-private");
    let private = dir.0.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let address = format!("unix:{}", private.join("s.sock").display());
    let mut serve = serve_command(&[
        "--device",
        "cpu",
        "--memory",
        "64M",
        "--socket-mode",
        "0666",
        "--listen",
        &address,
    ])
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let stderr = serve.stderr.take().unwrap();
    let warned = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.contains("lets nobody else reach it"));
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(warned.is_some());
}

/// `cumux serve --config` of `text`, which must fail: its stderr.
fn config_error(tag: &str, text: &str) -> String {
    let dir = TempDir::new(tag);
    let config = config_file(&dir, text);
    let out = wait_bounded(
        Command::new(CUMUX)
            .args(["serve", "--device", "cpu", "--config"])
            .arg(&config)
            .arg("--listen")
            .arg(format!("unix:{}", dir.0.join("s.sock").display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(30),
    );
    assert_eq!(out.code(), Some(1), "{}", out.describe());
    out.stderr
}

/// A device, policy or sharing mode that does not exist is refused before
/// anything starts, with the choices; the help lists them too.
#[test]
fn flags_with_choices_name_them() {
    for (flag, value, choices) in [
        ("--device", "gpu", "auto, cpu, cuda, worker-cpu"),
        ("--policy", "lottery", "fifo, fair, priority"),
        ("--sharing", "mps", "isolated, shared, fenced"),
    ] {
        let out = Command::new(CUMUX)
            .args(["serve", flag, value])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("[possible values: {choices}]")),
            "{flag}: {err}"
        );
    }
    let help = Command::new(CUMUX)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("[possible values: fifo, fair, priority]"),
        "{help}"
    );
    assert!(!help.contains("model"), "{help}");
}

#[test]
fn config_mistakes_read_as_such() {
    let e = config_error("negative", "[tenants.alice]\nmemory_quota = -5\n");
    assert!(
        e.contains("cannot be negative") && e.contains("memory_quota") && !e.contains("untagged"),
        "{e}"
    );
    let e = config_error("unit", "[tenants.alice]\nmemory_quota = \"12X\"\n");
    assert!(
        e.contains("[tenants.alice]: memory_quota") && e.contains("\"12X\" is not a byte count"),
        "{e}"
    );
    let e = config_error("mode", "socket_mode = 660\n");
    assert!(e.contains("socket_mode") && e.contains("octal"), "{e}");
    // 1.5G is a size; a quota past the device's memory is a warning naming
    // the tenant and both sizes.
    let dir = TempDir::new("quota-warning");
    let config = config_file(
        &dir,
        "[tenants.alice]\nmemory_quota = \"100G\"\n[tenants.bob]\nmemory_quota = \"1.5G\"\n",
    );
    let args: Vec<String> = ["--device", "cpu", "--memory", "1G", "--config"]
        .iter()
        .map(|s| s.to_string())
        .chain([config.display().to_string()])
        .collect();
    let server = ServerProc::spawn(dir, &args, &[]);
    let log = server.log();
    let warning = log
        .lines()
        .find(|l| l.contains("tenant \"alice\""))
        .unwrap_or_else(|| panic!("no warning for alice: {log}"));
    assert!(
        warning.contains("100.0 GiB") && warning.contains("1.0 GiB") && warning.contains("WARN"),
        "{warning}"
    );
    let warning = log
        .lines()
        .find(|l| l.contains("tenant \"bob\""))
        .unwrap_or_else(|| panic!("no warning for bob: {log}"));
    assert!(warning.contains("1.5 GiB"), "{warning}");
}
