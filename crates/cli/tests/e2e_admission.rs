//! Admission end to end, with the `cumux` binary: refused connections leave a
//! rate-limited log line naming the peer and the reason, a program past a
//! session limit fails saying which limit, and the limits show in `cumux status`.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use cumux_protocol::{
    decode, encode, read_frame, write_frame, ClientRole, Hello, HelloReply, MAGIC, PROTOCOL_VERSION,
};

fn socket_of(server: &ServerProc) -> String {
    server
        .address
        .strip_prefix("unix:")
        .expect("a unix server")
        .to_string()
}

fn hello(magic: u32, version: u32, tenant: Option<&str>) -> Hello {
    Hello {
        magic,
        version,
        pid: std::process::id(),
        role: ClientRole::Driver,
        program: "e2e-admission".into(),
        tenant: tenant.map(str::to_string),
        token: None,
        shm: false,
        visible_devices: None,
        join: None,
        resume: None,
        lane: None,
    }
}

/// Sends `hello` on a fresh connection; the server's answer and the socket.
fn say(server: &ServerProc, hello: &Hello) -> (HelloReply, UnixStream) {
    let mut s = UnixStream::connect(socket_of(server)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write_frame(&mut s, &encode(hello).unwrap()).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut s, &mut buf).unwrap();
    (decode(&buf).unwrap(), s)
}

/// `line` without its terminal colour codes.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut in_escape = false;
    for c in line.chars() {
        match (in_escape, c) {
            (false, '\u{1b}') => in_escape = true,
            (false, c) => out.push(c),
            (true, 'm') => in_escape = false,
            (true, _) => {}
        }
    }
    out
}

fn refusals_logged(server: &ServerProc) -> Vec<String> {
    server
        .log()
        .lines()
        .map(plain)
        .filter(|l| l.contains("connection refused"))
        .collect()
}

/// The refusal lines once there are `n` of them (or after 10 s, those there are).
fn logged_at_least(server: &ServerProc, n: usize) -> Vec<String> {
    let started = std::time::Instant::now();
    loop {
        let lines = refusals_logged(server);
        if lines.len() >= n || started.elapsed() > Duration::from_secs(10) {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn refused_connections_are_logged_with_their_peer_and_reason_rate_limited() {
    let server = ServerProc::start("refusals");
    let window_opened = std::time::Instant::now();
    let (bad_magic, _) = say(&server, &hello(0xdead_beef, PROTOCOL_VERSION, None));
    assert!(matches!(bad_magic, HelloReply::Rejected { .. }));
    let _ = say(&server, &hello(MAGIC, PROTOCOL_VERSION + 7, None));
    // A hello that claims 64 MiB is refused from its header.
    let mut huge = UnixStream::connect(socket_of(&server)).unwrap();
    huge.write_all(&(64u32 << 20).to_le_bytes()).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut huge, &mut buf).unwrap();
    // Each line is written as its connection ends, just after the answer.
    let logged = logged_at_least(&server, 3);
    let find = |what: &str| {
        logged
            .iter()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no refusal line with {what:?} in {logged:#?}"))
            .clone()
    };
    let magic = find("bad magic");
    assert!(magic.contains("peer=pid "), "{magic}");
    let version = find("protocol version mismatch");
    assert!(
        version.contains(&format!("version {}", PROTOCOL_VERSION + 7))
            && version.contains(&format!("version {PROTOCOL_VERSION}")),
        "{version}"
    );
    find("exceeds the limit");
    // A flood of refusals is logged at most ten to a window of ten seconds.
    for _ in 0..20 {
        let _ = say(&server, &hello(0xbad, PROTOCOL_VERSION, None));
    }
    logged_at_least(&server, 10);
    std::thread::sleep(Duration::from_millis(300));
    let flood = refusals_logged(&server).len();
    // All in one window unless the host was very slow.
    if window_opened.elapsed() < Duration::from_secs(9) {
        assert_eq!(flood, 10, "refusal lines for 23 refusals in one window");
    }
    // And the server serves.
    let out = server.run(&corpus_program("vector_add"), &[], Duration::from_secs(120));
    server.assert_pass(&out, "vector_add");
}

#[test]
fn a_program_past_a_session_limit_is_told_which() {
    let server = ServerProc::start_with_config(
        "limits",
        Some("[limits]\nsessions = 40\nsessions_per_tenant = 1\n"),
    );
    let (welcome, _held) = say(&server, &hello(MAGIC, PROTOCOL_VERSION, Some("team")));
    assert!(matches!(welcome, HelloReply::Welcome { .. }), "{welcome:?}");
    let refused = server
        .command_as("team", &corpus_program("vector_add"), &[])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("tenant \"team\" holds 1 sessions, the most one tenant may"),
        "{stderr}"
    );
    // Another tenant still runs, and status shows the limits and the seats.
    let out = server.run(&corpus_program("vector_add"), &[], Duration::from_secs(120));
    server.assert_pass(&out, "vector_add");
    let status = server.status_json();
    assert_eq!(status["limits"]["sessions"], 40);
    assert_eq!(status["limits"]["per_tenant"], 1);
    assert!(status["limits"]["taken"].as_u64().unwrap() >= 1);
    let table = server.status_table();
    assert!(table.contains("of 40; at most 64 per peer"), "{table}");
}
