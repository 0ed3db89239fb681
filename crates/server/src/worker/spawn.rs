//! Starting and ending worker processes: the command that starts one, the
//! [`Launcher`] that keeps a spare warming up for the next session, reaping
//! workers that exit (or killing those that do not), and the watchdog's reset,
//! which stops a hung context's worker.

use std::ffi::OsString;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cumux_protocol::{codes, CuError};

use super::watchdog::{Reset, Watchdog};
use super::wire::{new_nonce, nonce_to_hex, NONCE_BYTES};
use crate::locking::lock;

/// `0` turns off the spare worker each device keeps warm for the next session.
pub const SPARES_ENV: &str = "CUMUX_WORKER_SPARES";
/// How long a new worker may take to create its context.
pub const READY_WAIT: Duration = Duration::from_secs(120);
/// How long a worker may take to exit once its socket is closed.
const EXIT_GRACE: Duration = Duration::from_secs(10);
/// The driver's number of hardware work queues per context (1 to 32; 8 by default).
const MAX_CONNECTIONS_ENV: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// How to start a worker: a program and its arguments (the nonce is added).
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl WorkerCommand {
    /// `program worker --device KIND --ordinal N [--memory BYTES]`.
    pub fn cumux(program: PathBuf, kind: &str, ordinal: u32, memory: Option<u64>) -> Self {
        let mut args: Vec<OsString> = vec![
            "worker".into(),
            "--device".into(),
            kind.into(),
            "--ordinal".into(),
            ordinal.to_string().into(),
        ];
        if let Some(bytes) = memory {
            args.push("--memory".into());
            args.push(bytes.to_string().into());
        }
        WorkerCommand { program, args }
    }
}

/// A worker started (and perhaps still creating its context) that no session
/// has attached yet.
pub struct Spawned {
    pub child: Child,
    /// The server's end of the worker's socket (the worker's fd 0).
    pub stream: UnixStream,
    /// The read end of the worker's fd 1.
    pub stdout: ChildStdout,
    pub nonce: [u8; NONCE_BYTES],
}

/// Starts a device's workers, keeping one spare warming up (driver loaded,
/// context created) so the next session's first call need not wait for it.
pub struct Launcher {
    command: WorkerCommand,
    keep_spare: bool,
    spare: Mutex<Option<Spawned>>,
    /// Resets contexts whose work stops progressing (`--kernel-timeout`).
    watchdog: OnceLock<Arc<Watchdog>>,
}

impl Launcher {
    /// Workers that `command` starts; one spare is kept warm unless
    /// `CUMUX_WORKER_SPARES=0`.
    pub fn new(command: WorkerCommand) -> Self {
        let keep_spare = std::env::var(SPARES_ENV).map_or(true, |v| v.trim() != "0");
        Launcher {
            command,
            keep_spare,
            spare: Mutex::new(None),
            watchdog: OnceLock::new(),
        }
    }

    /// Has `watchdog` watch the contexts of the workers started from now on
    /// (the first one set stays).
    pub fn set_watchdog(&self, watchdog: Arc<Watchdog>) {
        let _ = self.watchdog.set(watchdog);
    }

    /// The kernel watchdog of this launcher's contexts, if any.
    pub fn watchdog(&self) -> Option<&Arc<Watchdog>> {
        self.watchdog.get()
    }

    /// A worker started now.
    pub fn spawn(&self) -> Result<Spawned, CuError> {
        spawn_worker(&self.command)
    }

    /// The spare if there is a live one (`true`), else a worker started now.
    pub fn take(&self) -> Result<(Spawned, bool), CuError> {
        let spare = lock(&self.spare).take();
        if let Some(mut spare) = spare {
            match spare.child.try_wait() {
                Ok(None) => return Ok((spare, true)),
                _ => reap(spare.child, Duration::ZERO),
            }
        }
        Ok((spawn_worker(&self.command)?, false))
    }

    /// Starts a spare if there is none and waits, at most `wait`, until it has
    /// created its context (its first message, still unread, is waiting).
    pub fn warm_spare(&self, wait: Duration) {
        self.refill();
        let socket = match &*lock(&self.spare) {
            Some(spare) => spare.stream.try_clone(),
            None => return,
        };
        match socket {
            Ok(socket) if !readable_within(&socket, wait) => {
                tracing::warn!("the spare worker was not ready within {wait:?}")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cannot watch the spare worker: {e}"),
        }
    }

    /// Starts a new spare if this launcher keeps one and has none.
    pub fn refill(&self) {
        if !self.keep_spare {
            return;
        }
        let mut spare = lock(&self.spare);
        if spare.is_none() {
            match spawn_worker(&self.command) {
                Ok(s) => *spare = Some(s),
                Err(e) => tracing::warn!("no spare worker: {e}"),
            }
        }
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Some(spare) = lock(&self.spare).take() {
            let Spawned { child, .. } = spare;
            // The socket is closed now; the spare exits on its own.
            reap_in_background(child);
        }
    }
}

/// Whether `socket` has something to read (or hung up) within `wait`.
fn readable_within(socket: &UnixStream, wait: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut pfd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    rc > 0
}

/// Reaps `child` on a thread of its own, killing it after `EXIT_GRACE`.
pub fn reap_in_background(child: Child) {
    let reaper = std::thread::Builder::new()
        .name("cumux-worker-reaper".into())
        .spawn(move || reap(child, EXIT_GRACE));
    if let Err(e) = reaper {
        tracing::warn!("cannot start a reaper thread: {e}");
    }
}

/// Starts a worker: its socket, the read end of its stdout, its nonce.
fn spawn_worker(command: &WorkerCommand) -> Result<Spawned, CuError> {
    let spawn_err = |what: &str, e: io::Error| {
        CuError::new(
            codes::UNKNOWN,
            format!("cannot start a worker: {what}: {e}"),
        )
    };
    let (ours, theirs) = UnixStream::pair().map_err(|e| spawn_err("socketpair", e))?;
    let nonce = new_nonce();
    let mut child = Command::new(&command.program);
    child
        .args(&command.args)
        .arg("--nonce")
        .arg(nonce_to_hex(&nonce))
        .stdin(Stdio::from(OwnedFd::from(theirs)))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    // A shared context holds many tenants' streams; with the driver's default of
    // 8 hardware queues, streams of different tenants share queues and a kernel
    // can wait behind another tenant's kernels (false serialization).
    if std::env::var_os(MAX_CONNECTIONS_ENV).is_none() {
        child.env(MAX_CONNECTIONS_ENV, "32");
    }
    let mut child = child
        .spawn()
        .map_err(|e| spawn_err(&command.program.display().to_string(), e))?;
    match child.stdout.take() {
        Some(pipe) => {
            tracing::debug!(pid = child.id(), "worker started");
            Ok(Spawned {
                child,
                stream: ours,
                stdout: pipe,
                nonce,
            })
        }
        None => {
            reap(child, Duration::ZERO);
            Err(CuError::new(codes::UNKNOWN, "a worker without a stdout"))
        }
    }
}

/// How the watchdog resets a context: its error for every later call, and its
/// worker killed (the waits on it end as the worker's socket closes).
pub fn reset_by_killing(
    sticky: &Arc<Mutex<Option<CuError>>>,
    child: &Arc<Mutex<Option<Child>>>,
) -> Reset {
    let (sticky, child) = (Arc::clone(sticky), Arc::clone(child));
    Box::new(move |why: CuError| {
        lock(&sticky).get_or_insert(why);
        if let Some(child) = lock(&child).as_mut() {
            tracing::warn!(pid = child.id(), "stopping the hung context's worker");
            let _ = child.kill();
        }
    })
}

/// Waits up to `grace` for `child` to exit, then kills it; always reaps it.
pub fn reap(mut child: Child, grace: Duration) {
    let deadline = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                tracing::debug!(pid = child.id(), %status, "worker exited");
                return;
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                tracing::warn!(pid = child.id(), "worker did not exit; killing it");
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            Err(_) => return,
        }
    }
}
