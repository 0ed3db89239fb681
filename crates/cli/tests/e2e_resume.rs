//! Resuming a program's session elsewhere, end to end (issue 17):
//! `tests/cuda/driver/migrate_loop.cu`, unmodified and run with
//! `CUMUX_RESUME=1`, checkpointed with its call held, its server killed and
//! started again with `--restore`; and moved between two servers many times
//! mid-run. It checks its results all along and passes as an unmoved run does.

mod common;

use std::io::Write;
use std::process::{Command, Output};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::{
    driver_program, e2e_device, output_text, progressed, rest, session_of, stop_and_pass,
    ServerProc, TempDir, CUMUX,
};
use cumux_protocol::{ClientRole, Hello, HelloReply, MAGIC, PROTOCOL_VERSION};

const LIMIT: Duration = Duration::from_secs(180);

fn cpu_server(dir: TempDir, extra: &[&str]) -> ServerProc {
    let device = e2e_device();
    let mut args = vec!["--device", &device, "--memory", "1G"];
    args.extend_from_slice(extra);
    let args: Vec<String> = args.into_iter().map(String::from).collect();
    ServerProc::spawn(dir, &args, &[])
}

/// The admin token of [`tcp_cpu_server`]: over TCP only a token makes an admin.
const ADMIN_TOKEN: &str = "resume-admin-token-0123456789abcdef";

/// A CPU-device server on loopback TCP, its log in `dir`.
fn tcp_cpu_server(dir: TempDir) -> ServerProc {
    ServerProc::spawn_tcp(dir, "cpu", &format!("admin_token = \"{ADMIN_TOKEN}\"\n"))
}

/// `cumux ARGS --server <server>`.
fn cumux(server: &ServerProc, args: &[&str]) -> Output {
    Command::new(CUMUX)
        .args(args)
        .args(["--server", &server.address])
        .env("CUMUX_TOKEN", ADMIN_TOKEN)
        .output()
        .expect("cumux runs")
}

/// Whether `server` lists a session of migrate_loop.
fn running_there(server: &ServerProc) -> bool {
    let status = server.status_json();
    status["sessions"].as_array().is_some_and(|all| {
        all.iter().any(|s| {
            s["program"]
                .as_str()
                .is_some_and(|p| p.contains("migrate_loop"))
        })
    })
}

fn session_id(server: &ServerProc) -> String {
    session_of(&server.status_json(), "migrate_loop")["session"]
        .as_u64()
        .unwrap()
        .to_string()
}

/// A resumable run of migrate_loop on `server`, until its first progress.
fn start_loop(
    server: &ServerProc,
    stop: &std::path::Path,
) -> (std::process::Child, Receiver<String>) {
    start_loop_over(server, stop, "shm")
}

/// The same, its calls going `transport` (`shm` or `socket`).
fn start_loop_over(
    server: &ServerProc,
    stop: &std::path::Path,
    transport: &str,
) -> (std::process::Child, Receiver<String>) {
    start_loop_with(server, &[stop.to_str().unwrap()], transport)
}

/// migrate_loop with `args`, resumable, its calls going `transport`.
fn start_loop_with(
    server: &ServerProc,
    args: &[&str],
    transport: &str,
) -> (std::process::Child, Receiver<String>) {
    let program = driver_program("migrate_loop");
    let mut run = server.command(&program, args);
    run.env("CUMUX_RESUME", "1")
        .env("CUMUX_TRANSPORT", transport);
    server.start_until(run, "progress 10", LIMIT)
}

/// What a server at `socket` answers a driver's hello naming `resume`.
fn resume_hello(socket: &std::path::Path, program: &str, resume: u64) -> HelloReply {
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    let hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        pid: std::process::id(),
        role: ClientRole::Driver,
        program: program.into(),
        tenant: None,
        token: None,
        shm: false,
        visible_devices: None,
        join: None,
        resume: Some(resume),
        lane: None,
    };
    let bytes = cumux_protocol::encode(&hello).unwrap();
    cumux_protocol::write_frame(&mut s, &bytes).unwrap();
    s.flush().unwrap();
    let mut buf = Vec::new();
    cumux_protocol::read_frame(&mut s, &mut buf).unwrap();
    cumux_protocol::decode(&buf).unwrap()
}

fn refusal(reply: HelloReply) -> String {
    match reply {
        HelloReply::Rejected { reason, .. } => reason,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_checkpoint_survives_a_server_restart() {
    let mut server = cpu_server(TempDir::new("resume"), &[]);
    let stop = server.dir.0.join("stop");
    // On the socket here; the moves between servers go through shared memory.
    let (mut child, lines) = start_loop_over(&server, &stop, "socket");
    let session = session_id(&server);
    let file = server.dir.0.join("held.ckpt");
    let out = cumux(
        &server,
        &["checkpoint", &session, file.to_str().unwrap(), "--hold"],
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        output_text(&out),
        server.log()
    );
    assert!(
        output_text(&out).contains("--restore"),
        "{}",
        output_text(&out)
    );
    // Status says it is held, at which call.
    let held = session_of(&server.status_json(), "migrate_loop");
    let moving = held["moving"].as_str().unwrap_or_default().to_string();
    assert!(moving.starts_with("held at call"), "{held}");
    // A checkpoint without the hold cannot be resumed: refused at start.
    let plain = server.dir.0.join("plain.ckpt");
    let other = cpu_server(TempDir::new("resume-other"), &[]);
    let (mut other_child, _other_lines) = start_loop(&other, &other.dir.0.join("stop"));
    let out = cumux(
        &other,
        &["checkpoint", &session_id(&other), plain.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", output_text(&out));
    std::fs::write(other.dir.0.join("stop"), b"").unwrap();
    assert!(other_child.wait().unwrap().success());
    let socket = server.dir.0.join("refused.sock");
    let out = Command::new(CUMUX)
        .args(["serve", "--device", "cpu", "--memory", "1G", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .arg("--restore")
        .arg(&plain)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("without --hold"),
        "{}",
        output_text(&out)
    );

    // A third server holding the image answers only its own program.
    let image = cumux_cli::checkpoint_file::read(&file).unwrap();
    let key = cumux_server::session::image_stream::verified(&image[..])
        .unwrap()
        .resume
        .expect("a held checkpoint says where to resume")
        .key;
    let third = cpu_server(
        TempDir::new("resume-third"),
        &["--restore", file.to_str().unwrap()],
    );
    let third_socket = third.dir.0.join("s.sock");
    let why = refusal(resume_hello(&third_socket, "another_program", key));
    assert!(why.contains("is of program"), "{why}");
    let why = refusal(resume_hello(&third_socket, "migrate_loop", key ^ 1));
    assert!(why.contains("holds no checkpoint"), "{why}");
    drop(third);

    // The server goes (no goodbye), and comes back with the checkpoint.
    server.kill();
    let dir = std::mem::replace(&mut server.dir, TempDir::new("resume-gone"));
    let file_arg = file.to_str().unwrap().to_string();
    let server = cpu_server(dir, &["--restore", &file_arg]);
    let log = || server.log();
    progressed(&lines, LIMIT, &log);
    progressed(&lines, LIMIT, &log);
    std::fs::write(&stop, b"").unwrap();
    let tail = rest(&lines, LIMIT);
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert!(
        status.success() && tail.iter().any(|l| l == "PASS"),
        "{status:?} {tail:?}\n{stderr}\n{}",
        server.log()
    );
    assert!(stderr.contains("resumed the program's session"), "{stderr}");
}

#[test]
fn a_program_whose_server_has_no_checkpoint_for_it_fails_clearly() {
    let mut server = cpu_server(TempDir::new("resume-none"), &[]);
    let stop = server.dir.0.join("stop");
    let (mut child, _lines) = start_loop(&server, &stop);
    // No checkpoint: the server restarted knows nothing of the program.
    server.kill();
    let dir = std::mem::replace(&mut server.dir, TempDir::new("resume-none-gone"));
    let server = cpu_server(dir, &[]);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < LIMIT, "the program never ended");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("holds no checkpoint"),
        "{stderr}\n{}",
        server.log()
    );
}

#[test]
fn a_running_program_moves_between_two_servers_many_times_and_passes() {
    // Two on unix sockets, one on TCP: the program's calls go through
    // shared memory, then the socket.
    let servers = [
        cpu_server(TempDir::new("move-a"), &[]),
        cpu_server(TempDir::new("move-b"), &[]),
        tcp_cpu_server(TempDir::new("move-c")),
    ];
    let stop = servers[0].dir.0.join("stop");
    let (mut child, lines) = start_loop(&servers[0], &stop);
    let logs = || {
        let each = servers
            .iter()
            .map(|s| format!("--- {}\n{}", s.address, s.log()));
        each.collect::<String>()
    };
    // An unreachable server: refused, the program carries on where it was.
    let session = session_id(&servers[0]);
    let nowhere = format!("unix:{}", servers[0].dir.0.join("nobody.sock").display());
    let out = cumux(&servers[0], &["migrate", &session, "--to", &nowhere]);
    assert!(!out.status.success(), "{}", output_text(&out));
    progressed(&lines, LIMIT, &logs);
    for round in 0..7usize {
        let (from, to) = (&servers[round % 3], &servers[(round + 1) % 3]);
        let session = session_id(from);
        let out = cumux(from, &["migrate", &session, "--to", &to.address]);
        assert!(
            out.status.success(),
            "round {round}: {}\n{}",
            output_text(&out),
            logs()
        );
        assert!(
            output_text(&out).contains("moved to the server at"),
            "{}",
            output_text(&out)
        );
        // It runs there now (once it reads where it went), and nothing of it
        // is left where it was; then it gets on with its work.
        let started = Instant::now();
        while running_there(from) || !running_there(to) {
            assert!(started.elapsed() < LIMIT, "it did not move: {}", logs());
            std::thread::sleep(Duration::from_millis(20));
        }
        progressed(&lines, LIMIT, &logs);
    }
    stop_and_pass(&stop, &mut child, &lines, LIMIT, &logs);
}

#[test]
fn a_program_larger_than_a_frame_moves_between_servers_in_pieces() {
    let servers = [
        cpu_server(TempDir::new("move-big-a"), &[]),
        cpu_server(TempDir::new("move-big-b"), &[]),
    ];
    let stop = servers[0].dir.0.join("stop");
    // 96 MiB more than the loop's own: past the 80 MiB frame limit.
    let (mut child, lines) = start_loop_with(&servers[0], &[stop.to_str().unwrap(), "96"], "shm");
    let logs = || format!("--- a\n{}--- b\n{}", servers[0].log(), servers[1].log());
    for round in 0..2usize {
        let (from, to) = (&servers[round % 2], &servers[(round + 1) % 2]);
        let out = cumux(from, &["migrate", &session_id(from), "--to", &to.address]);
        assert!(
            out.status.success(),
            "round {round}: {}\n{}",
            output_text(&out),
            logs()
        );
        let started = Instant::now();
        while running_there(from) || !running_there(to) {
            assert!(started.elapsed() < LIMIT, "it did not move: {}", logs());
            std::thread::sleep(Duration::from_millis(20));
        }
        progressed(&lines, LIMIT, &logs);
    }
    stop_and_pass(&stop, &mut child, &lines, LIMIT, &logs);
}
