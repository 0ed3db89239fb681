//! `cumux run` at its edges: with no server, or a server that refuses the
//! tenant, it says why and starts nothing (exit 69, 77); a missing or
//! unrunnable program exits 127 or 126 as in a shell; SIGINT, SIGTERM and
//! SIGHUP reach the program as themselves and `cumux run` waits for it; its
//! temporary folder is gone after every one of these; a copied `cumux` finds
//! its driver through CUMUX_DRIVER; CUDA_VISIBLE_DEVICES picks devices.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// A folder for `cumux run`'s temporary files (its TMPDIR) and a marker the
/// program would make.
struct Scratch {
    dir: TempDir,
}

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        std::fs::create_dir(dir.0.join("tmp")).unwrap();
        Scratch { dir }
    }

    fn tmp(&self) -> PathBuf {
        self.dir.0.join("tmp")
    }

    fn marker(&self) -> PathBuf {
        self.dir.0.join("marker")
    }

    /// `cumux run --server ADDRESS OPTIONS -- sh -c SCRIPT`, in this TMPDIR.
    fn run(&self, address: &str, options: &[&str], script: &str) -> Command {
        let mut run = run_command_at(address, options, Path::new("sh"), &["-c", script]);
        run.env("TMPDIR", self.tmp());
        run
    }

    /// A script that would leave the marker.
    fn touch(&self) -> String {
        format!("touch {}", self.marker().display())
    }

    /// Fails the test unless `cumux run` left nothing in its TMPDIR.
    fn assert_clean(&self) {
        let left: Vec<_> = std::fs::read_dir(self.tmp())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left behind in TMPDIR: {left:?}");
    }
}

/// A `cumux run` killed outright leaves its folder; the next run removes it,
/// and leaves the folder of a run still alive.
#[test]
fn folders_of_killed_runs_are_swept_by_the_next() {
    ensure_driver();
    let server = ServerProc::start("run-sweep");
    let scratch = Scratch::new("run-sweep");
    let mut live = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let alive = scratch.tmp().join(format!("cumux-run-{}-live", live.id()));
    std::fs::create_dir(&alive).unwrap();
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let _ = gone.wait();
    let left = scratch
        .tmp()
        .join(format!("cumux-run-{}-Ab12Cd", gone.id()));
    std::fs::create_dir(&left).unwrap();
    std::os::unix::fs::symlink("/nowhere", left.join("libcuda.so.1")).unwrap();
    let out = wait_bounded(
        scratch
            .run(&server.address, &[], &scratch.touch())
            .spawn()
            .unwrap(),
        LIMIT,
    );
    let _ = live.kill();
    let _ = live.wait();
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    assert!(scratch.marker().exists(), "the program did not run");
    assert!(!left.exists(), "the killed run's folder is still there");
    assert!(alive.exists(), "a live run's folder was removed");
    std::fs::remove_dir(&alive).unwrap();
    scratch.assert_clean();
}

#[test]
fn with_no_server_it_says_so_and_starts_nothing() {
    ensure_driver();
    let scratch = Scratch::new("run-no-server");
    let nowhere = format!("unix:{}", scratch.dir.0.join("none.sock").display());
    let out = wait_bounded(
        scratch
            .run(&nowhere, &[], &scratch.touch())
            .spawn()
            .unwrap(),
        LIMIT,
    );
    assert_eq!(out.code(), Some(69), "{}", out.describe());
    assert!(
        out.stderr.contains("no cumux server answers at")
            && out.stderr.contains("cumux serve")
            && out.stderr.contains("was not started"),
        "{}",
        out.describe()
    );
    assert!(!scratch.marker().exists(), "the program ran");
    scratch.assert_clean();
}

#[test]
fn a_refused_tenant_reads_as_a_refusal_and_starts_nothing() {
    let server = ServerProc::start_with_config(
        "run-refused",
        Some("allow_unknown = false\n[tenants.alice]\n"),
    );
    let scratch = Scratch::new("run-refused-tmp");
    for options in [&["--tenant", "mallory"][..], &[]] {
        let mut run = scratch.run(&server.address, options, &scratch.touch());
        if options.is_empty() {
            run.env("CUMUX_TENANT", "mallory");
        }
        let out = wait_bounded(run.spawn().unwrap(), LIMIT);
        assert_eq!(out.code(), Some(77), "{}", out.describe());
        assert!(
            out.stderr.contains("refused tenant \"mallory\"")
                && out
                    .stderr
                    .contains("unknown tenant \"mallory\": this server admits only")
                && !out.stderr.contains("protocol"),
            "{}",
            out.describe()
        );
        assert!(!scratch.marker().exists(), "the program ran");
        scratch.assert_clean();
    }
    // The admitted tenant runs.
    let out = wait_bounded(
        scratch
            .run(&server.address, &["--tenant", "alice"], &scratch.touch())
            .spawn()
            .unwrap(),
        LIMIT,
    );
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    assert!(scratch.marker().exists());
    scratch.assert_clean();
}

#[test]
fn missing_and_unrunnable_programs_exit_as_in_a_shell() {
    ensure_driver();
    let scratch = Scratch::new("run-missing");
    // Reported before any server is asked: none listens here.
    let nowhere = format!("unix:{}", scratch.dir.0.join("none.sock").display());
    let run = |program: &Path| {
        let mut run = run_command_at(&nowhere, &[], program, &[]);
        run.env("TMPDIR", scratch.tmp());
        wait_bounded(run.spawn().unwrap(), LIMIT)
    };
    let out = run(Path::new("cumux-no-such-program"));
    assert_eq!(out.code(), Some(127), "{}", out.describe());
    assert!(
        out.stderr.contains("command not found"),
        "{}",
        out.describe()
    );
    let out = run(&scratch.dir.0.join("absent"));
    assert_eq!(out.code(), Some(127), "{}", out.describe());
    let plain = scratch.dir.0.join("plain");
    std::fs::write(&plain, "echo hi\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&plain);
    assert_eq!(out.code(), Some(126), "{}", out.describe());
    assert!(out.stderr.contains("not executable"), "{}", out.describe());
    let out = run(&scratch.dir.0);
    assert_eq!(out.code(), Some(126), "{}", out.describe());
    scratch.assert_clean();
}

/// Starts a program that reports which signal it got, waits until it is
/// ready, and sends `cumux run` that signal.
fn signalled(server: &ServerProc, scratch: &Scratch, signal: &str) -> (Child, u32) {
    let got = scratch.dir.0.join("got");
    let _ = std::fs::remove_file(&got);
    // Each trap takes a moment before exiting, so `cumux run` must wait.
    let script = format!(
        "for s in INT TERM HUP; do trap \"sleep 0.3; echo $s > {got}; exit 3\" $s; done; \
         echo ready; while :; do sleep 0.05; done",
        got = got.display()
    );
    let mut run = scratch.run(&server.address, &[], &script);
    run.stdout(Stdio::piped());
    let (child, _lines) = server.start_until(run, "ready", LIMIT);
    let pid = child.id();
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    (child, pid)
}

#[test]
fn signals_reach_the_program_as_themselves_and_run_waits_for_it() {
    let server = ServerProc::start("run-signals");
    let scratch = Scratch::new("run-signals-tmp");
    for signal in ["INT", "TERM", "HUP"] {
        let (child, _) = signalled(&server, &scratch, signal);
        let out = wait_bounded(child, LIMIT);
        assert_eq!(out.code(), Some(3), "{signal}: {}", out.describe());
        let got = std::fs::read_to_string(scratch.dir.0.join("got")).unwrap();
        assert_eq!(got.trim(), signal);
        scratch.assert_clean();
    }
    // A program the signal kills: 128 + its number.
    let mut run = scratch.run(&server.address, &[], "echo ready; exec sleep 60");
    run.stdout(Stdio::piped());
    let (child, _lines) = server.start_until(run, "ready", LIMIT);
    std::thread::sleep(Duration::from_millis(100));
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let out = wait_bounded(child, LIMIT);
    assert_eq!(out.code(), Some(128 + 15), "{}", out.describe());
    scratch.assert_clean();
}

#[test]
fn a_copied_cumux_finds_its_driver_through_cumux_driver() {
    ensure_driver();
    let scratch = Scratch::new("run-copied");
    let copy = scratch.dir.0.join("cumux");
    if std::fs::hard_link(CUMUX, &copy).is_err() {
        std::fs::copy(CUMUX, &copy).unwrap();
    }
    let nowhere = format!("unix:{}", scratch.dir.0.join("none.sock").display());
    let run = |driver: Option<&Path>| {
        let mut run = Command::new(&copy);
        run.args(["run", "--server", &nowhere, "--", "true"])
            .env("TMPDIR", scratch.tmp())
            .env_remove("CUMUX_DRIVER")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(driver) = driver {
            run.env("CUMUX_DRIVER", driver);
        }
        wait_bounded(run.spawn().unwrap(), LIMIT)
    };
    let out = run(None);
    assert_eq!(out.code(), Some(125), "{}", out.describe());
    assert!(
        out.stderr.contains("CUMUX_DRIVER") && out.stderr.contains("lib/cumux"),
        "{}",
        out.describe()
    );
    // With the driver named it gets as far as the (absent) server.
    let driver = Path::new(CUMUX).with_file_name("libcumux_client.so");
    let out = run(Some(&driver));
    assert_eq!(out.code(), Some(69), "{}", out.describe());
    scratch.assert_clean();
}

#[test]
fn cuda_visible_devices_picks_the_devices_a_program_sees() {
    let server = ServerProc::start("run-visible");
    let scratch = Scratch::new("run-visible-tmp");
    // cumux run warns when the list names a device the server does not offer.
    let mut run = scratch.run(&server.address, &[], "true");
    run.env("CUDA_VISIBLE_DEVICES", "0,3");
    let out = wait_bounded(run.spawn().unwrap(), LIMIT);
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    assert!(
        out.stderr.contains("CUDA_VISIBLE_DEVICES=\"0,3\"")
            && out.stderr.contains("entry 2 (\"3\") names no device")
            && out.stderr.contains("sees 1 of the 1"),
        "{}",
        out.describe()
    );
    let query = driver_program("device_query");
    let count = |visible: &str| {
        let mut run = server.command(&query, &[]);
        run.env("CUDA_VISIBLE_DEVICES", visible)
            .env("TMPDIR", scratch.tmp());
        let out = wait_bounded(run.spawn().unwrap(), Duration::from_secs(300));
        (out.code(), out.stdout)
    };
    let (code, stdout) = count("0");
    assert_eq!(code, Some(0), "{stdout}\n{}", server.log());
    assert!(stdout.contains("device_count: 1"), "{stdout}");
    // Device 1 does not exist here, and an empty list hides every device.
    for hidden in ["1", ""] {
        let (code, stdout) = count(hidden);
        assert_ne!(code, Some(0), "{hidden:?}: {stdout}");
        assert!(!stdout.contains("device_count: 1"), "{hidden:?}: {stdout}");
    }
    scratch.assert_clean();
}
