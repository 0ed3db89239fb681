//! End-to-end harness: a `cumux serve --device cpu` child on a private unix
//! socket, `cumux run` of compiled CUDA programs with a bounded wait, and the
//! client driver built if it is missing.

#![allow(dead_code)]

pub mod metrics;

use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

pub const CUMUX: &str = env!("CARGO_BIN_EXE_cumux");

/// A folder removed at drop.
pub use cumux_testkit::TempDir;

/// The client driver `cumux run` uses, built on first need (it is a cdylib
/// that `cargo test -p cumux-cli` alone would not build).
pub fn ensure_driver() {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let driver = Path::new(CUMUX).with_file_name("libcumux_client.so");
        let nvml = Path::new(CUMUX).with_file_name("libcumux_nvml.so");
        if driver.is_file() && nvml.is_file() {
            return;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build.args(["build", "-p", "cumux-client", "-p", "cumux-nvml"]);
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

/// The source of a program of `tests/cuda/driver`.
pub fn driver_source(name: &str) -> PathBuf {
    cumux_testkit::workspace_root()
        .join("tests/cuda/driver")
        .join(format!("{name}.cu"))
}

/// A program of `tests/cuda/driver`, built by nvcc with its default flags.
pub fn driver_program(name: &str) -> PathBuf {
    cumux_testkit::compile_program(driver_source(name), &[])
}

/// A program of `tests/cuda/tenants`, built by nvcc.
pub fn tenant_program(name: &str) -> PathBuf {
    let source = cumux_testkit::workspace_root()
        .join("tests/cuda/tenants")
        .join(format!("{name}.cu"));
    cumux_testkit::compile_program(source, &[])
}

/// A compiled program of this crate's own tests (tests/cuda).
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

/// A folder beside the `cumux` binary named `folder`, holding a link
/// `link_name` to `target` (remade when it points elsewhere). Kept at a fixed
/// place so the compile cache can reuse builds that link against it.
pub fn linked_folder(folder: &str, link_name: &str, target: &Path) -> PathBuf {
    let dir = Path::new(CUMUX).with_file_name(folder);
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join(link_name);
    if std::fs::read_link(&link).ok().as_deref() != Some(target) {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(target, &link).unwrap();
    }
    dir
}

/// A folder (named `folder`, beside `cumux`) where `-lcuda` finds the client
/// driver (its soname is `libcuda.so.1`), so driver-API programs link against
/// cumux itself.
pub fn driver_link_folder(folder: &str) -> PathBuf {
    ensure_driver();
    let driver = Path::new(CUMUX).with_file_name("libcumux_client.so");
    linked_folder(folder, "libcuda.so", &driver)
}

/// The child processes of `parent`: (pid, state letter, command line).
pub fn children_of(parent: u32) -> Vec<(u32, char, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid …: the comm may hold spaces, so split after ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid: u32 = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid != parent {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        out.push((pid, state, cmdline));
    }
    out
}

/// `cumux run --server ADDRESS OPTIONS -- program args…`, with piped output.
pub fn run_command_at(address: &str, options: &[&str], program: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(CUMUX);
    c.args(["run", "--server", address])
        .args(options)
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// `text` as the config file `cumux.toml` in `dir`; its path.
pub fn config_file(dir: &TempDir, text: &str) -> PathBuf {
    let path = dir.0.join("cumux.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `cumux serve ARGS`, its stdout piped (to read where it listens).
pub fn serve_command(args: &[&str]) -> Command {
    let mut serve = Command::new(CUMUX);
    serve.arg("serve").args(args).stdout(Stdio::piped());
    serve
}

/// A `cumux serve --device cpu` child (see [`e2e_device`]); killed at drop.
pub struct ServerProc {
    pub child: Child,
    pub address: String,
    pub dir: TempDir,
}

impl ServerProc {
    /// `cumux ARGS --server <this server>`, run to its end.
    pub fn cumux(&self, args: &[&str]) -> std::process::Output {
        Command::new(CUMUX)
            .args(args)
            .args(["--server", &self.address])
            .output()
            .expect("cumux runs")
    }

    pub fn start(tag: &str) -> Self {
        Self::start_with_config(tag, None)
    }

    /// A server reading `config` (TOML text) as its `--config` file.
    pub fn start_with_config(tag: &str, config: Option<&str>) -> Self {
        let dir = TempDir::new(tag);
        let mut args: Vec<String> = ["--device", &e2e_device(), "--memory", "2G"]
            .map(String::from)
            .to_vec();
        if let Some(text) = config {
            let path = config_file(&dir, text);
            args.extend(["--config".to_string(), path.display().to_string()]);
        }
        Self::spawn(dir, &args, &[])
    }

    /// `cumux serve SERVE_ARGS --listen <a socket in dir>` with `envs` added to
    /// its environment and its log in `dir/server.log`; returns once it listens.
    pub fn spawn(dir: TempDir, serve_args: &[String], envs: &[(&str, &str)]) -> Self {
        ensure_driver();
        let socket = dir.0.join("s.sock");
        let address = format!("unix:{}", socket.display());
        let log = std::fs::File::create(dir.0.join("server.log")).unwrap();
        let child = Command::new(CUMUX)
            .arg("serve")
            .args(serve_args)
            .args(["--listen", address.as_str()])
            .envs(envs.iter().copied())
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

    /// `cumux serve --device DEVICE --memory 1G` on loopback TCP (a port of
    /// its choosing) with `config` (TOML text) as its `--config` file and its
    /// log in `dir/server.log`; returns once it says where it listens.
    pub fn spawn_tcp(dir: TempDir, device: &str, config: &str) -> Self {
        let log = std::fs::File::create(dir.0.join("server.log")).unwrap();
        let config = config_file(&dir, config);
        let mut serve = serve_command(&[
            "--device",
            device,
            "--memory",
            "1G",
            "--listen",
            "tcp:127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ]);
        serve.stderr(log);
        let mut child = serve.spawn().unwrap();
        let address = tcp_address(&lines_of(child.stdout.take().unwrap()));
        ServerProc {
            child,
            address,
            dir,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("server.log")).unwrap_or_default()
    }

    /// Whether the server process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The server's child processes: (pid, state letter, command line).
    pub fn children(&self) -> Vec<(u32, char, String)> {
        children_of(self.child.id())
    }

    /// `cumux run --server <this> -- program args…`, with piped output.
    pub fn command(&self, program: &Path, args: &[&str]) -> Command {
        self.run_command(&[], program, args)
    }

    /// `cumux run --server <this> --tenant NAME -- program args…`.
    pub fn command_as(&self, tenant: &str, program: &Path, args: &[&str]) -> Command {
        self.run_command(&["--tenant", tenant], program, args)
    }

    /// `cumux run --server <this> OPTIONS -- program args…`, with piped output.
    pub fn run_command(&self, options: &[&str], program: &Path, args: &[&str]) -> Command {
        run_command_at(&self.address, options, program, args)
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

    /// Starts `run` (one of this server's `cumux run` commands) and waits
    /// until the program prints `line`; it is killed, and the test fails, if it
    /// does not within `limit`. The child, and its further stdout lines.
    pub fn start_until(
        &self,
        mut run: Command,
        line: &str,
        limit: Duration,
    ) -> (Child, std::sync::mpsc::Receiver<String>) {
        let mut child = run.spawn().expect("cumux run starts");
        let lines = lines_of(child.stdout.take().unwrap());
        if let Err(e) = wait_for_line(&lines, line, limit) {
            let _ = child.kill();
            panic!("{e}\n--- server log\n{}", self.log());
        }
        (child, lines)
    }

    /// Fails the test, with this server's log, unless the corpus program
    /// `name` exited 0 and printed `NAME: PASS`.
    pub fn assert_pass(&self, out: &RunOutput, name: &str) {
        assert!(
            out.code() == Some(0) && out.stdout.contains(&format!("{name}: PASS")),
            "{name}: {}\n--- server log\n{}",
            out.describe(),
            self.log()
        );
    }

    /// `cumux status --json` of this server.
    pub fn status_json(&self) -> serde_json::Value {
        status_json(&self.status_output(&["--json"]))
    }

    /// `cumux status` of this server: the human table.
    pub fn status_table(&self) -> String {
        let out = self.status_output(&[]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn status_output(&self, options: &[&str]) -> std::process::Output {
        status_output(&self.address, options)
    }

    /// Asks for `cumux status --json` until `done` holds of it, failing the
    /// test after 30 s; the status then.
    pub fn status_when(
        &self,
        what: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = self.status_json();
            if done(&status) {
                return status;
            }
            assert!(Instant::now() < deadline, "never {what}: {status:#}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `cumux status OPTIONS --server ADDRESS`, run to its end.
pub fn status_output(address: &str, options: &[&str]) -> std::process::Output {
    Command::new(CUMUX)
        .arg("status")
        .args(options)
        .args(["--server", address])
        .output()
        .expect("cumux status runs")
}

/// What a `cumux status --json` that succeeded printed.
pub fn status_json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "cumux status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status prints JSON")
}

/// The session of `status` whose program's path holds `program`.
pub fn session_of(status: &serde_json::Value, program: &str) -> serde_json::Value {
    status["sessions"]
        .as_array()
        .and_then(|sessions| {
            sessions
                .iter()
                .find(|s| s["program"].as_str().is_some_and(|p| p.contains(program)))
        })
        .cloned()
        .unwrap_or_else(|| panic!("no {program} session in {status:#}"))
}

/// Kills (SIGKILL) the program of `session`, a session of `cumux status`:
/// the program itself, not the `cumux run` in front of it.
pub fn kill_program(session: &serde_json::Value) {
    let pid = session["pid"]
        .as_u64()
        .expect("a session's pid")
        .to_string();
    let killed = Command::new("kill").args(["-9", &pid]).status().unwrap();
    assert!(killed.success());
}

/// The line a `cumux serve` child prints first on its stdout (`lines`, from
/// [`lines_of`]) once it listens: where, and its devices.
pub fn listening_line(lines: &std::sync::mpsc::Receiver<String>) -> String {
    lines
        .recv_timeout(Duration::from_secs(30))
        .expect("serve prints where it listens")
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

    /// Fails the test unless the program exited 0 and printed a `PASS` line.
    pub fn assert_passed(&self) {
        assert_eq!(self.code(), Some(0), "{}", self.describe());
        assert!(
            self.stdout.lines().any(|l| l.trim() == "PASS"),
            "{}",
            self.describe()
        );
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

/// The `tcp:HOST:PORT` address a `cumux serve --listen tcp:…` child prints
/// first on its stdout (`lines`, from [`lines_of`]) once it listens.
pub fn tcp_address(lines: &std::sync::mpsc::Receiver<String>) -> String {
    tcp_address_in(&listening_line(lines))
}

/// The `tcp:HOST:PORT` address in a `cumux serve` listening line.
pub fn tcp_address_in(line: &str) -> String {
    line.split_whitespace()
        .find(|w| w.starts_with("tcp:"))
        .map(|w| w.trim_end_matches(';').to_string())
        .unwrap_or_else(|| panic!("{line}"))
}

/// Polls `probe` every 20 ms until it gives a value; fails the test, saying
/// `what` never happened, after `limit`.
pub fn poll<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
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

/// A server over the fake GPU of `cumux-cuda-driver`'s tests in worker
/// processes (one per session, no spare), for sessions opened in the test's
/// own process; `None` (said on stderr) without a C compiler. It sets the
/// process's environment: only for a test binary of one test.
pub fn fake_gpu_server(tag: &str) -> Option<std::sync::Arc<cumux_server::Server>> {
    use cumux_server::worker::device::{cuda_worker_devices, Sharing};
    let Some(fake) = cumux_testkit::fake_gpu::fake_libcuda(tag, true) else {
        eprintln!("no C compiler: skipping");
        return None;
    };
    std::env::set_var("CUMUX_REAL_LIBCUDA", &fake);
    std::env::set_var("CUMUX_WORKER_SPARES", "0");
    let devices =
        cuda_worker_devices(PathBuf::from(CUMUX), Sharing::Isolated, None).expect("the fake GPU");
    Some(cumux_server::Server::new(devices))
}

/// A session of tenant `t` for `program`, opened in the test's own process.
pub fn driver_session(
    server: &std::sync::Arc<cumux_server::Server>,
    program: &str,
) -> cumux_server::session::Session {
    tenant_session(server, program, "t")
}

/// A driver session of `program` for tenant `tenant` (default settings),
/// opened in the test's own process.
/// A driver client's hello from this process, as `program`, claiming no
/// tenant.
pub fn driver_hello(program: &str) -> cumux_protocol::Hello {
    use cumux_protocol::{ClientRole, Hello, MAGIC, PROTOCOL_VERSION};
    Hello {
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
        resume: None,
        lane: None,
    }
}

pub fn tenant_session(
    server: &std::sync::Arc<cumux_server::Server>,
    program: &str,
    tenant: &str,
) -> cumux_server::session::Session {
    let hello = driver_hello(program);
    let tenant = Some((
        tenant.to_string(),
        cumux_server::tenants::TenantSettings::default(),
    ));
    cumux_server::session::Session::open(std::sync::Arc::clone(server), &hello, tenant)
        .expect("a session")
}

/// Loads the fake GPU's fixture image (`cumux_testkit::fake_gpu::fixture_fatbin`)
/// in `session`: the handle of its `scale` kernel.
pub fn fixture_scale(session: &mut cumux_server::session::Session) -> cumux_protocol::Handle {
    use cumux_protocol::{Call, ReplyBody};
    let loaded = session.handle(Call::ModuleLoad {
        image: cumux_testkit::fake_gpu::fixture_fatbin(),
    });
    let Some(Ok(ReplyBody::Module(module))) = loaded else {
        panic!("the fixture did not load: {loaded:?}")
    };
    let scale = module.functions.iter().find(|f| f.name == "scale");
    scale.expect("the fixture's scale kernel").handle
}

/// A one-thread launch of the fake GPU's fixture `scale` kernel
/// (`function`, from [`fixture_scale`]) on `stream`: `buf`'s first `n`
/// floats times `factor`.
pub fn scale_launch(
    function: cumux_protocol::Handle,
    stream: cumux_protocol::Handle,
    buf: u64,
    factor: f32,
    n: i32,
) -> cumux_protocol::Call {
    cumux_protocol::Call::Launch {
        function,
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
        stream,
        params: cumux_testkit::fake_gpu::scale_params(buf, factor, n),
        attributes: Vec::new(),
    }
}

/// A synchronous one-row memset of `count` bytes of `value` at `dst`.
pub fn memset_call(dst: u64, value: u32, count: u64) -> cumux_protocol::Call {
    cumux_protocol::Call::Memset {
        dst,
        value,
        elem_bytes: 1,
        count,
        pitch: count,
        height: 1,
        stream: None,
    }
}

/// Whether a session's answer is the refusal of a bad argument.
pub fn refused(result: Option<Result<cumux_protocol::ReplyBody, cumux_protocol::CuError>>) -> bool {
    matches!(result, Some(Err(e)) if e.code == cumux_protocol::codes::INVALID_VALUE)
}

/// Waits (at most `limit`) for the program's next `progress` line on
/// `lines`: it got on with its work; a `FAIL` line, or none, fails the test
/// with `log()` (the servers' logs).
pub fn progressed(
    lines: &std::sync::mpsc::Receiver<String>,
    limit: Duration,
    log: &dyn Fn() -> String,
) {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.starts_with("progress") => return,
            Ok(line) if line.starts_with("FAIL") => panic!("{line}\n{}", log()),
            Ok(_) => {}
            Err(e) => panic!("no progress ({e}); server log:\n{}", log()),
        }
    }
}

/// The rest of the program's stdout on `lines`, until it ends (at most `limit`).
pub fn rest(lines: &std::sync::mpsc::Receiver<String>, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        seen.push(line);
    }
    seen
}

/// Makes the file `stop` (a long-running test program's cue to finish),
/// then waits for the program `child` (its stdout on `lines`) to end
/// passing: exit 0 and a `PASS` line; otherwise the test fails with `log()`.
pub fn stop_and_pass(
    stop: &Path,
    child: &mut Child,
    lines: &std::sync::mpsc::Receiver<String>,
    limit: Duration,
    log: &dyn Fn() -> String,
) {
    std::fs::write(stop, b"").unwrap();
    let tail = rest(lines, limit);
    let status = child.wait().unwrap();
    assert!(
        status.success() && tail.iter().any(|l| l == "PASS"),
        "{status:?} {tail:?}\n{}",
        log()
    );
}

/// A finished command's exit status, stdout and stderr, for a failure message.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The pointer a tenant program's owner prints (`ptr 0x…`) before it says
/// `holding`, and its remaining output lines; the owner killed and the
/// test failed if it prints none within 2 minutes.
pub fn owner_pointer(
    owner: &mut Child,
    server: &ServerProc,
) -> (String, std::sync::mpsc::Receiver<String>) {
    let lines = lines_of(owner.stdout.take().unwrap());
    let mut ptr = None;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        match lines.recv_timeout(Duration::from_secs(1)) {
            Ok(line) if line.starts_with("ptr ") => ptr = Some(line[4..].to_string()),
            Ok(line) if line == "holding" => break,
            Ok(_) | Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    let Some(ptr) = ptr else {
        let _ = owner.kill();
        panic!(
            "the owner printed no pointer\n--- server log\n{}",
            server.log()
        );
    };
    (ptr, lines)
}
