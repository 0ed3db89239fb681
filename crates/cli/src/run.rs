//! `cumux run`: starts an unmodified program with cumux's client driver as its
//! `libcuda.so.1` (through a private folder of symlinks put first on
//! `LD_LIBRARY_PATH`), pointed at a server, and hands back its exit status.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use cumux_protocol::ClientRole;
use cumux_server::Address;

use crate::probe;

/// File name of the client driver cargo builds next to the `cumux` binary.
pub const DRIVER_FILE: &str = "libcumux_client.so";

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub server: Option<String>,
    pub tenant: Option<String>,
    pub program: OsString,
    pub args: Vec<OsString>,
}

/// The client driver this `cumux` was built with: `$CUMUX_DRIVER`, else
/// `libcumux_client.so` beside the executable (`target/<profile>/`).
pub fn find_driver() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("CUMUX_DRIVER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("CUMUX_DRIVER={} does not exist", path.display());
        }
        return Ok(path);
    }
    let exe = std::env::current_exe().context("cannot locate the cumux executable")?;
    let dir = exe.parent().context("the cumux executable has no folder")?;
    let driver = dir.join(DRIVER_FILE);
    if !driver.is_file() {
        bail!(
            "the cumux client driver {} is missing: build it with `cargo build` \
             (or `cargo build --release`) in the cumux checkout",
            driver.display()
        );
    }
    Ok(driver)
}

/// A folder holding `libcuda.so.1` and `libcuda.so`, both links to the driver;
/// removed when dropped.
struct DriverDir(PathBuf);

impl DriverDir {
    fn new(driver: &Path) -> Result<Self> {
        let driver = driver
            .canonicalize()
            .context("cannot resolve the driver's path")?;
        let base = std::env::temp_dir();
        let mut n = 0u32;
        let dir = loop {
            let candidate = base.join(format!("cumux-run-{}-{n}", std::process::id()));
            match std::fs::create_dir(&candidate) {
                Ok(()) => break candidate,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => n += 1,
                Err(e) => return Err(e).context("cannot make the driver folder"),
            }
        };
        let made = DriverDir(dir);
        for name in ["libcuda.so.1", "libcuda.so"] {
            std::os::unix::fs::symlink(&driver, made.0.join(name))
                .with_context(|| format!("cannot link {name} in {}", made.0.display()))?;
        }
        Ok(made)
    }
}

impl Drop for DriverDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Makes the program get SIGTERM if `cumux run` dies first (killed, say), so
/// it never lives on unwatched.
fn die_with_parent(command: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the hook runs in the forked child before exec and calls only
    // async-signal-safe functions (prctl, getppid); it touches no shared state.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::other(
                    "cumux run exited before the program started",
                ));
            }
            Ok(())
        });
    }
}

/// Runs the program; returns the exit code `cumux run` should exit with
/// (the program's, or 128 + signal).
pub fn run(options: RunOptions) -> Result<i32> {
    let driver = find_driver()?;
    let address = match &options.server {
        Some(text) => Address::parse(text).map_err(anyhow::Error::msg)?,
        None => Address::from_env_or_default().map_err(anyhow::Error::msg)?,
    };
    if let Err(e) = probe::connect(&address, ClientRole::Status, "cumux run") {
        eprintln!(
            "cumux run: warning: {e:#}; starting {} anyway (it will see the CUDA errors)",
            Path::new(&options.program).display()
        );
    }
    let dir = DriverDir::new(&driver)?;
    let mut library_path = OsString::from(dir.0.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        library_path.push(":");
        library_path.push(old);
    }
    let mut command = Command::new(&options.program);
    command
        .args(&options.args)
        .env("LD_LIBRARY_PATH", library_path)
        .env("CUMUX_SERVER", address.to_string());
    if let Some(tenant) = &options.tenant {
        command.env("CUMUX_TENANT", tenant);
    }
    die_with_parent(&mut command);
    let status = command
        .status()
        .with_context(|| format!("cannot start {}", Path::new(&options.program).display()))?;
    drop(dir);
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    })
}
