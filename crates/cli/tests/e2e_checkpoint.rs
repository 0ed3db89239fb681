//! Checkpoints streamed to disk end to end (issue 17):
//! `tests/cuda/driver/checkpoint_rollback.cu`, unmodified, checkpointed by
//! `cumux checkpoint` (the server writes the file the CLI passes), its state
//! changed, then restored by `cumux restore` — on the same server, and on a
//! restarted one — and checked; truncated, corrupt, foreign and older files
//! refused with the session unchanged; a checkpoint that fails mid-write
//! (past the server's file-size limit) leaving no file, the session running on.

mod common;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use common::{
    driver_program, e2e_device, ensure_driver, output_text, poll, rest, session_of, wait_for_line,
    ServerProc, TempDir, CUMUX,
};

const LIMIT: Duration = Duration::from_secs(180);

fn server(tag: &str) -> ServerProc {
    let args = ["--device", &e2e_device(), "--memory", "1G"];
    ServerProc::spawn(TempDir::new(tag), &args.map(String::from), &[])
}

/// The program started on `server` (`args` after its prefix), waiting for
/// `PREFIX.taken` once ready: it, its further lines and its session.
fn started(server: &ServerProc, prefix: &Path, args: &[&str]) -> (Child, Receiver<String>, String) {
    let program = driver_program("checkpoint_rollback");
    let mut all = vec![prefix.to_str().unwrap()];
    all.extend_from_slice(args);
    let run = server.command(&program, &all);
    let (child, lines) = server.start_until(run, "ready", LIMIT);
    let session = session_of(&server.status_json(), "checkpoint_rollback")["session"]
        .as_u64()
        .unwrap()
        .to_string();
    (child, lines, session)
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut name = prefix.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Lets the program go on to its next stage (`taken` or `restored`).
fn go_on(prefix: &Path, stage: &str, lines: &Receiver<String>, expect: &str, server: &ServerProc) {
    std::fs::write(with_suffix(prefix, stage), b"").unwrap();
    if let Err(e) = wait_for_line(lines, expect, LIMIT) {
        panic!("{e}\n--- server log\n{}", server.log());
    }
}

fn checkpoint(server: &ServerProc, session: &str, file: &Path) -> Output {
    server.cumux(&["checkpoint", session, file.to_str().unwrap()])
}

fn restore(server: &ServerProc, session: &str, file: &Path) -> Output {
    server.cumux(&["restore", file.to_str().unwrap(), "--session", session])
}

/// Asserts that a `cumux` command succeeded.
fn succeeded(out: &Output, server: &ServerProc) {
    assert!(
        out.status.success(),
        "{}\n{}",
        output_text(out),
        server.log()
    );
}

fn assert_passes(mut child: Child, lines: &Receiver<String>, server: &ServerProc) {
    let tail = rest(lines, LIMIT);
    let status = child.wait().unwrap();
    assert!(
        status.success() && tail.iter().any(|l| l == "PASS"),
        "{status:?} {tail:?}\n--- server log\n{}",
        server.log()
    );
}

/// The figures of `cumux checkpoint`'s summary (`in T s, R GB/s of memory
/// (waiting on device reads …)`): its seconds and rate, then each stage's.
fn stage_split_is_sane(said: &str) {
    let numbers = |text: &str| -> Vec<f64> {
        text.split([' ', ',', '(', ')', ';'])
            .filter_map(|w| w.parse::<f64>().ok())
            .collect()
    };
    let summary = said
        .split_once(" bytes written in ")
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no summary in {said}"));
    let (head, split) = summary
        .split_once("(waiting on device reads ")
        .unwrap_or_else(|| panic!("no stage split in {said}"));
    let (seconds, rate) = match numbers(head)[..] {
        [seconds, rate] => (seconds, rate),
        _ => panic!("{said}"),
    };
    assert!(seconds > 0.0 && rate > 0.0, "{said}");
    let split = split
        .split_once(" threads)")
        .map(|(s, _)| s)
        .unwrap_or_else(|| panic!("{said}"));
    let stages = numbers(split);
    let [read_wait, pack_wait, write, sync, device, pool, threads] = stages[..] else {
        panic!("{stages:?} in {said}");
    };
    // The writing thread's waits, writing and syncing fit in its time; the
    // device side and the pool did work.
    assert!(
        read_wait + pack_wait + write + sync <= seconds + 0.002,
        "{said}"
    );
    assert!(device > 0.0 && pool >= 0.0 && threads >= 1.0, "{said}");
    for stage in [read_wait, pack_wait, write, sync] {
        assert!(stage >= 0.0, "{said}");
    }
    assert!(said.contains("synced and named here in "), "{said}");
}

#[test]
fn a_checkpoint_brings_its_state_back_and_bad_files_are_refused() {
    let server = server("ckpt-stream");
    let prefix = server.dir.0.join("stage");
    let (child, lines, session) = started(&server, &prefix, &[]);
    let file = server.dir.0.join("rollback.ckpt");
    let out = checkpoint(&server, &session, &file);
    succeeded(&out, &server);
    // Its second half is one value: the 4 MiB chunk wholly in it (8-12 MiB
    // of its 12) is stored as a fill.
    let said = output_text(&out);
    let filled: u64 = said
        .split(" one value repeated")
        .next()
        .and_then(|before| before.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(filled >= 4 << 20, "{said}");
    stage_split_is_sane(&said);
    assert!(!with_suffix(&file, ".partial").exists());
    let bytes = std::fs::read(&file).unwrap();
    assert!(bytes.starts_with(b"CUMUXCKP"));
    // Its buffer's noise is stored as it is: the file holds it.
    assert!(bytes.len() > 6 << 20, "{} bytes", bytes.len());
    // The program zeroes its buffer.
    go_on(&prefix, ".taken", &lines, "changed", &server);
    let bad = server.dir.0.join("bad.ckpt");
    let mut corrupt = bytes.clone();
    corrupt[bytes.len() / 2] ^= 0x40;
    let mut older = bytes.clone();
    older[8] = 2;
    for (what, broken, said) in [
        (
            "truncated",
            bytes[..bytes.len() - 100].to_vec(),
            "truncated",
        ),
        (
            "truncated early",
            bytes[..bytes.len() / 3].to_vec(),
            "truncated",
        ),
        ("corrupt", corrupt, "does not match its checksum"),
        (
            "foreign",
            b"not a checkpoint at all".to_vec(),
            "not a cumux checkpoint",
        ),
        ("older", older, "format 2; this cumux reads format 3"),
    ] {
        std::fs::write(&bad, broken).unwrap();
        let out = restore(&server, &session, &bad);
        assert!(!out.status.success(), "{what}: {}", output_text(&out));
        assert!(
            output_text(&out).contains(said),
            "{what}: {}",
            output_text(&out)
        );
    }
    // Refused, each left the session as it was; the checkpoint restores.
    let out = restore(&server, &session, &file);
    succeeded(&out, &server);
    std::fs::write(with_suffix(&prefix, ".restored"), b"").unwrap();
    assert_passes(child, &lines, &server);
}

#[test]
fn a_checkpoint_restores_into_the_program_run_again_on_a_restarted_server() {
    let first = server("ckpt-restart-1");
    let file = first.dir.0.join("kept.ckpt");
    {
        let prefix = first.dir.0.join("stage");
        let (mut child, _lines, session) = started(&first, &prefix, &[]);
        let out = checkpoint(&first, &session, &file);
        assert!(out.status.success(), "{}", output_text(&out));
        let _ = child.kill();
        let _ = child.wait();
    }
    // A new server process; the program starts again, zeroes its buffer,
    // and finds the first run's state after the restore.
    let mut first = first;
    first.kill();
    let second = server("ckpt-restart-2");
    let prefix = second.dir.0.join("stage");
    let (child, lines, session) = started(&second, &prefix, &[]);
    go_on(&prefix, ".taken", &lines, "changed", &second);
    let out = restore(&second, &session, &file);
    succeeded(&out, &second);
    std::fs::write(with_suffix(&prefix, ".restored"), b"").unwrap();
    assert_passes(child, &lines, &second);
}

/// A server whose file writes stop at 1 MiB (a soft `RLIMIT_FSIZE`).
fn limited_server(tag: &str) -> ServerProc {
    ensure_driver();
    let dir = TempDir::new(tag);
    let socket = dir.0.join("s.sock");
    let address = format!("unix:{}", socket.display());
    let log = std::fs::File::create(dir.0.join("server.log")).unwrap();
    let child = Command::new("bash")
        .args([
            "-c",
            r#"ulimit -S -f 1024 && exec "$0" "$@""#,
            CUMUX,
            "serve",
        ])
        .args(["--device", &e2e_device(), "--memory", "1G"])
        .args(["--listen", &address])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("bash runs");
    let server = ServerProc {
        child,
        address,
        dir,
    };
    poll("the server to listen", LIMIT, || {
        UnixStream::connect(&socket).ok()
    });
    server
}

#[test]
fn a_checkpoint_failing_mid_write_leaves_no_file_and_the_session_runs_on() {
    let server = limited_server("ckpt-fail");
    let prefix = server.dir.0.join("stage");
    let (mut child, lines, session) = started(&server, &prefix, &[]);
    let file = server.dir.0.join("limited.ckpt");
    // Past 1 MiB of its 6 MiB and more, the server's write fails.
    let out = checkpoint(&server, &session, &file);
    assert!(!out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("cannot write the checkpoint"),
        "{}",
        output_text(&out)
    );
    assert!(
        !file.exists(),
        "a failed checkpoint left {}",
        file.display()
    );
    assert!(!with_suffix(&file, ".partial").exists());
    // The server and the session carry on.
    go_on(&prefix, ".taken", &lines, "changed", &server);
    let _ = child.kill();
    let _ = child.wait();
}

/// The admin token of [`tcp_server`]: over TCP only a token makes an admin.
const ADMIN_TOKEN: &str = "checkpoint-admin-token-0123456789abcdef";

/// A server on loopback TCP, where no descriptor can pass.
fn tcp_server(tag: &str) -> ServerProc {
    let config = format!("admin_token = \"{ADMIN_TOKEN}\"\n");
    ServerProc::spawn_tcp(TempDir::new(tag), &e2e_device(), &config)
}

#[test]
fn over_tcp_a_checkpoint_travels_in_pieces_and_restores() {
    let server = tcp_server("ckpt-tcp");
    let prefix = server.dir.0.join("stage");
    // 40 MiB of noise: a stream past a piece (32 MiB).
    let (child, lines, session) = started(&server, &prefix, &["80"]);
    let file = server.dir.0.join("tcp.ckpt");
    let as_admin = |args: &[&str]| {
        Command::new(CUMUX)
            .args(args)
            .args(["--server", &server.address])
            .env("CUMUX_TOKEN", ADMIN_TOKEN)
            .output()
            .expect("cumux runs")
    };
    let out = as_admin(&["checkpoint", &session, file.to_str().unwrap()]);
    succeeded(&out, &server);
    assert!(
        output_text(&out).contains("in pieces over TCP"),
        "{}",
        output_text(&out)
    );
    assert!(std::fs::metadata(&file).unwrap().len() > 40 << 20);
    go_on(&prefix, ".taken", &lines, "changed", &server);
    let out = as_admin(&["restore", file.to_str().unwrap(), "--session", &session]);
    succeeded(&out, &server);
    std::fs::write(with_suffix(&prefix, ".restored"), b"").unwrap();
    assert_passes(child, &lines, &server);
}
