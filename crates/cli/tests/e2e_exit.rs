//! A program's end is clean through the client driver: tests/cuda/driver's
//! `exit_paths` ends in each way a program can (see its header), through
//! `cumux run` on a `cumux serve` over shared memory and over TCP, and the
//! client writes nothing on stderr (no panic, no backtrace, no log line); the
//! server closes each session and serves the next program.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{driver_source, e2e_device, wait_bounded, RunOutput, ServerProc};

const LIMIT: Duration = Duration::from_secs(180);

/// Each way `exit_paths` ends, and the line it prints when its own checks pass.
const MODES: [(&str, &str); 4] = [
    ("live", "live: queued"),
    ("atexit", "atexit: PASS"),
    ("thread-exit", "thread-exit: exiting from the second thread"),
    ("key-dtor", "thread teardown: PASS"),
];

/// `exit_paths`, linked against the client driver itself (`-lcuda`).
fn exit_paths() -> PathBuf {
    let link = format!("-L{}", common::driver_link_folder("cumux-link").display());
    cumux_testkit::compile_program(driver_source("exit_paths"), &[&link, "-lcuda"])
}

/// `exit_paths` on the CUDA runtime as a shared library (`-cudart shared`),
/// as PyTorch loads it: its teardown runs from the library. `None` where
/// `libcudart.so.13` is not installed.
fn exit_paths_on_the_shared_runtime() -> Option<PathBuf> {
    let lib = cumux_testkit::cuda_home().join("lib");
    if !lib.join("libcudart.so.13").is_file() {
        return None;
    }
    // PyPI ships only libcudart.so.13; `-lcudart` wants the unversioned name.
    let cudart = common::linked_folder(
        "cumux-cudart13",
        "libcudart.so",
        &lib.join("libcudart.so.13"),
    );
    let driver = format!("-L{}", common::driver_link_folder("cumux-link").display());
    let runtime = format!("-L{}", cudart.display());
    Some(cumux_testkit::compile_program(
        driver_source("exit_paths"),
        &[
            "-cudart",
            "shared",
            &runtime,
            "-Xlinker",
            "-rpath",
            "-Xlinker",
            lib.to_str().unwrap(),
            &driver,
            "-lcuda",
        ],
    ))
}

/// A `cumux run` command with the client's default log level, and
/// backtraces on, so that a panic would show as the issue saw it.
fn quiet_but_for_panics(mut run: Command) -> Command {
    run.env("CUMUX_LOG", "warn").env("RUST_BACKTRACE", "1");
    run
}

/// Fails the test unless `out` exited 0, printed `line` and no FAIL, and
/// left stderr empty.
fn assert_clean_exit(out: &RunOutput, what: &str, line: &str) {
    assert_eq!(out.code(), Some(0), "{what}: {}", out.describe());
    assert!(
        out.stdout.lines().any(|l| l == line) && !out.stdout.contains("FAIL"),
        "{what}: {}",
        out.describe()
    );
    for sign in [
        "panicked",
        "AccessError",
        "Thread Local Storage",
        "stack backtrace",
        "ERROR",
        "WARN",
    ] {
        assert!(!out.stderr.contains(sign), "{what}: {}", out.describe());
    }
    assert!(out.stderr.trim().is_empty(), "{what}: {}", out.describe());
}

/// Runs every mode through `run` (a `cumux run` command for the program
/// and its arguments), each to a clean end.
fn every_mode_ends_cleanly(program: &Path, run: impl Fn(&Path, &[&str]) -> Command) {
    for (mode, line) in MODES {
        let child = quiet_but_for_panics(run(program, &[mode]))
            .spawn()
            .expect("cumux run starts");
        let out = wait_bounded(child, LIMIT);
        assert_clean_exit(&out, mode, line);
    }
}

#[test]
fn every_way_to_end_is_clean_over_shared_memory() {
    let program = exit_paths();
    let mut server = ServerProc::start("exit");
    every_mode_ends_cleanly(&program, |p, args| server.command(p, args));
    server.status_when("every session closed", |s| {
        s["sessions"].as_array().is_some_and(Vec::is_empty)
    });
    assert!(server.alive(), "{}", server.log());
    let next = server.run(&common::driver_program("streams_events"), &[], LIMIT);
    next.assert_passed();
}

#[test]
fn every_way_to_end_is_clean_on_the_shared_runtime() {
    let Some(program) = exit_paths_on_the_shared_runtime() else {
        eprintln!("skipped: libcudart.so.13 not installed");
        return;
    };
    let server = ServerProc::start("exitshared");
    every_mode_ends_cleanly(&program, |p, args| server.command(p, args));
}

#[test]
fn every_way_to_end_is_clean_over_tcp() {
    let program = exit_paths();
    let streams_events = common::driver_program("streams_events");
    let device = e2e_device();
    let listen = [
        "--device",
        &device,
        "--memory",
        "2G",
        "--listen",
        "tcp:127.0.0.1:0",
    ];
    let mut server = common::serve_command(&listen)
        .stderr(Stdio::null())
        .spawn()
        .expect("cumux serve starts");
    let lines = common::lines_of(server.stdout.take().unwrap());
    let address = common::tcp_address(&lines);
    every_mode_ends_cleanly(&program, |p, args| {
        common::run_command_at(&address, &[], p, args)
    });
    let next = common::run_command_at(&address, &[], &streams_events, &[])
        .spawn()
        .unwrap();
    let next = wait_bounded(next, LIMIT);
    let _ = server.kill();
    let _ = server.wait();
    next.assert_passed();
}

/// The server goes away before the program's `atexit` handler tears down
/// through the driver: those calls fail, and say nothing.
#[test]
fn calls_at_exit_after_the_server_is_gone_fail_quietly() {
    let program = exit_paths();
    let mut server = ServerProc::start("exitlost");
    let go = server.dir.0.join("go");
    let run = quiet_but_for_panics(server.command(&program, &["lost", go.to_str().unwrap()]));
    let (child, lines) = server.start_until(run, "started", LIMIT);
    server.kill();
    std::fs::write(&go, b"").unwrap();
    let mut out = wait_bounded(child, Duration::from_secs(60));
    // The rest of its stdout, up to the end the exit closed.
    out.stdout = lines.iter().collect::<Vec<_>>().join("\n");
    assert_clean_exit(&out, "lost", "lost: PASS");
}
