//! End-to-end harness: a `cumux serve --device cpu` child on a private unix
//! socket, `cumux run` of compiled CUDA programs with a bounded wait, and the
//! client driver built if it is missing.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

pub const CUMUX: &str = env!("CARGO_BIN_EXE_cumux");

/// A folder removed at drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cumux-e2e-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The client driver `cumux run` uses, built on first need (it is a cdylib
/// that `cargo test -p cumux-cli` alone would not build).
pub fn ensure_driver() {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let driver = Path::new(CUMUX).with_file_name("libcumux_client.so");
        if driver.is_file() {
            return;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "cumux-client"]);
        if Path::new(CUMUX).parent().and_then(Path::file_name) == Some("release".as_ref()) {
            build.arg("--release");
        }
        let status = build
            .current_dir(cumux_testkit::workspace_root())
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the client driver failed");
        assert!(driver.is_file(), "{} still missing", driver.display());
    });
}

/// A compiled corpus program.
pub fn corpus_program(name: &str) -> PathBuf {
    cumux_testkit::compile_program(cumux_testkit::corpus_source(name), &[])
}

/// A compiled program of this crate's own tests (tests/cuda).
/// A program of `tests/cuda/tenants`, built by nvcc.
pub fn tenant_program(name: &str) -> PathBuf {
    let source = cumux_testkit::workspace_root()
        .join("tests/cuda/tenants")
        .join(format!("{name}.cu"));
    cumux_testkit::compile_program(source, &[])
}

pub fn test_program(name: &str) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/cuda")
        .join(format!("{name}.cu"));
    cumux_testkit::compile_program(source, &[])
}

/// The device the e2e servers use: `cpu`, or what `CUMUX_E2E_DEVICE` names
/// (`worker-cpu` runs the same programs through worker processes, where the
/// device keeps stream order, as the GPU backend does).
pub fn e2e_device() -> String {
    std::env::var("CUMUX_E2E_DEVICE").unwrap_or_else(|_| "cpu".into())
}

/// A `cumux serve --device cpu` child (see [`e2e_device`]); killed at drop.
pub struct ServerProc {
    pub child: Child,
    pub address: String,
    pub dir: TempDir,
}

impl ServerProc {
    pub fn start(tag: &str) -> Self {
        Self::start_with_config(tag, None)
    }

    /// A server reading `config` (TOML text) as its `--config` file.
    pub fn start_with_config(tag: &str, config: Option<&str>) -> Self {
        ensure_driver();
        let dir = TempDir::new(tag);
        let socket = dir.0.join("s.sock");
        let address = format!("unix:{}", socket.display());
        let log = std::fs::File::create(dir.0.join("server.log")).unwrap();
        let mut args: Vec<String> = ["serve", "--device", &e2e_device(), "--memory", "2G"]
            .map(String::from)
            .to_vec();
        args.extend(["--listen".to_string(), address.clone()]);
        if let Some(text) = config {
            let path = dir.0.join("cumux.toml");
            std::fs::write(&path, text).unwrap();
            args.extend(["--config".to_string(), path.display().to_string()]);
        }
        let child = Command::new(CUMUX)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("cumux serve starts");
        let mut server = ServerProc {
            child,
            address,
            dir,
        };
        let started = Instant::now();
        while UnixStream::connect(&socket).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("cumux serve exited with {status}: {}", server.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the server never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("server.log")).unwrap_or_default()
    }

    /// Whether the server process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `cumux run --server <this> -- program args…`, with piped output.
    pub fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(CUMUX);
        c.args(["run", "--server", &self.address, "--"])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// `cumux run --server <this> --tenant NAME -- program args…`.
    pub fn command_as(&self, tenant: &str, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new(CUMUX);
        c.args(["run", "--server", &self.address, "--tenant", tenant, "--"])
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Runs a program through cumux to completion, failing the test after `limit`.
    pub fn run(&self, program: &Path, args: &[&str], limit: Duration) -> RunOutput {
        let child = self
            .command(program, args)
            .spawn()
            .expect("cumux run starts");
        wait_bounded(child, limit)
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `cumux status --json` of this server.
    pub fn status_json(&self) -> serde_json::Value {
        let out = Command::new(CUMUX)
            .args(["status", "--json", "--server", &self.address])
            .output()
            .expect("cumux status runs");
        assert!(
            out.status.success(),
            "cumux status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status prints JSON")
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Debug)]
pub struct RunOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl RunOutput {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    pub fn describe(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Waits for a child with piped stdout/stderr, killing it and failing the test
/// if it runs past `limit` (a hang is a failure, never a stuck test run).
pub fn wait_bounded(mut child: Child, limit: Duration) -> RunOutput {
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait works") {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the program hung for {limit:?}\n--- stdout\n{}\n--- stderr\n{}",
                stdout.join().unwrap_or_default(),
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    RunOutput {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// Streams a child's stdout lines over a channel, so a test can wait for one
/// with a deadline.
pub fn lines_of(pipe: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for `line` among `lines`; the lines seen on failure.
pub fn wait_for_line(
    lines: &std::sync::mpsc::Receiver<String>,
    line: &str,
    limit: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l.trim_end() == line => return Ok(()),
            Ok(l) => seen.push(l),
            Err(_) => return Err(format!("never saw {line:?}; got {seen:?}")),
        }
    }
}
