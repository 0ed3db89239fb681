//! `cumux run`: checks that a server answers and would let the program in,
//! then starts it with cumux's client driver as its `libcuda.so.1` (links in a
//! private temporary folder put first on `LD_LIBRARY_PATH`), passes on the
//! signals sent to stop it, and hands back its exit status.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use cumux_protocol::{visible_devices, ClientRole};
use cumux_server::Address;

use crate::pool;

use crate::probe::{self, ProbeError};
use crate::signals::Forwarder;

/// File name of the client driver cargo builds next to the `cumux` binary.
pub const DRIVER_FILE: &str = "libcumux_client.so";

/// `cumux run`'s own exit codes; any other is the program's (128 + N: it
/// was killed by signal N).
pub mod exit {
    /// No server answers at the address (`EX_UNAVAILABLE`).
    pub const NO_SERVER: i32 = 69;
    /// The server refused the program's tenant, or is full or shutting
    /// down (`EX_NOPERM`).
    pub const REFUSED: i32 = 77;
    /// `cumux run` itself failed: a bad `--server`, no client driver, no
    /// temporary folder (as `env` does).
    pub const FAILED: i32 = 125;
    /// The program exists but cannot be executed (as shells do).
    pub const CANNOT_EXECUTE: i32 = 126;
    /// No such program (as shells do).
    pub const NOT_FOUND: i32 = 127;
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub server: Option<String>,
    /// A pool file: the program goes where `gpus` devices with `memory`
    /// free each are (see [`crate::pool`]).
    pub pool: Option<std::path::PathBuf>,
    pub gpus: Option<u32>,
    pub memory: Option<u64>,
    pub tenant: Option<String>,
    pub program: OsString,
    pub args: Vec<OsString>,
}

/// Why `cumux run` did not run the program to its end: what to tell the
/// user, and the exit code.
#[derive(Debug)]
pub struct RunError {
    pub code: i32,
    pub message: String,
}

impl RunError {
    fn new(code: i32, message: impl Into<String>) -> Self {
        RunError {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RunError {}

/// Where an installed client driver may lie, for a `cumux` in `exe_dir`:
/// beside it (a cargo build), then `../lib/cumux/` and `../lib/` (an install
/// into a prefix such as `/usr/local`).
pub fn driver_candidates(exe_dir: &Path) -> Vec<PathBuf> {
    let mut candidates = vec![exe_dir.join(DRIVER_FILE)];
    if let Some(prefix) = exe_dir.parent() {
        candidates.push(prefix.join("lib/cumux").join(DRIVER_FILE));
        candidates.push(prefix.join("lib").join(DRIVER_FILE));
    }
    candidates
}

/// The client driver this `cumux` runs programs with: `$CUMUX_DRIVER`, else
/// the first of [`driver_candidates`] that exists.
pub fn find_driver() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("CUMUX_DRIVER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            return Err(format!(
                "CUMUX_DRIVER={} is not a file: point it at libcumux_client.so",
                path.display()
            ));
        }
        return Ok(path);
    }
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot locate the cumux executable: {e}"))?;
    let dir = exe.parent().ok_or("the cumux executable has no folder")?;
    let candidates = driver_candidates(dir);
    if let Some(found) = candidates.iter().find(|c| c.is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
    Err(format!(
        "cannot find cumux's client driver ({DRIVER_FILE}); looked at {}. Set \
         CUMUX_DRIVER=/path/to/{DRIVER_FILE}, or install it beside cumux or in \
         <prefix>/lib/cumux/ (in a cumux checkout, `cargo build` builds it beside \
         target/<profile>/cumux)",
        looked.join(", ")
    ))
}

/// Finds `program` as `execvp` would (a name with a `/` as it is, else on
/// `PATH`), so a missing or unrunnable one is reported as shells do, before
/// a server is asked anything.
pub fn locate(program: &OsStr, path_var: Option<&OsStr>) -> Result<PathBuf, RunError> {
    let shown = Path::new(program).display();
    if program.is_empty() {
        return Err(RunError::new(exit::NOT_FOUND, "an empty program name"));
    }
    let candidates: Vec<PathBuf> = if program.as_bytes().contains(&b'/') {
        vec![PathBuf::from(program)]
    } else {
        let path = path_var.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
        std::env::split_paths(path)
            .map(|d| d.join(program))
            .collect()
    };
    let mut unrunnable = None;
    for candidate in &candidates {
        match std::fs::metadata(candidate) {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => {
                return Ok(candidate.clone())
            }
            Ok(meta) if meta.is_dir() => {
                unrunnable.get_or_insert(format!("{}: is a folder", candidate.display()));
            }
            Ok(_) => {
                unrunnable.get_or_insert(format!(
                    "{}: permission denied (not executable)",
                    candidate.display()
                ));
            }
            Err(_) => {}
        }
    }
    match unrunnable {
        Some(why) => Err(RunError::new(exit::CANNOT_EXECUTE, why)),
        None if candidates.len() == 1 && program.as_bytes().contains(&b'/') => Err(RunError::new(
            exit::NOT_FOUND,
            format!("{shown}: no such file"),
        )),
        None => Err(RunError::new(
            exit::NOT_FOUND,
            format!("{shown}: command not found (searched PATH)"),
        )),
    }
}

/// Asks the server whether the program would be let in; warns when its
/// `CUDA_VISIBLE_DEVICES` leaves it fewer devices than it lists.
fn preflight(
    address: &Address,
    tenant: Option<&str>,
    program: &str,
    one_of_several: bool,
) -> Result<(), RunError> {
    let not_started = format!("{program} was not started");
    let conn = match probe::connect_as(address, ClientRole::Preflight, "cumux run", tenant) {
        Ok(conn) => conn,
        Err(ProbeError::Unreachable(why)) => {
            return Err(RunError::new(
                exit::NO_SERVER,
                format!(
                    "{why}\nStart one with `cumux serve`, or name a running one with --server \
                     or CUMUX_SERVER; {not_started}."
                ),
            ))
        }
        Err(ProbeError::Refused(why)) => {
            return Err(RunError::new(
                exit::REFUSED,
                format!(
                    "{why}\n{not_started}. (--tenant or CUMUX_TENANT names the tenant; the \
                     server's config lists those it admits.)"
                ),
            ))
        }
        Err(ProbeError::Insecure(why)) => {
            return Err(RunError::new(exit::REFUSED, format!("{why}\n{not_started}.")))
        }
        Err(ProbeError::Broken(e)) => {
            return Err(RunError::new(
                exit::NO_SERVER,
                format!("the server at {address} did not answer as a cumux server does: {e:#}; {not_started}"),
            ))
        }
    };
    // With several servers the client applies the list to all their devices.
    if let (Ok(text), false) = (std::env::var("CUDA_VISIBLE_DEVICES"), one_of_several) {
        let uuids: Vec<[u8; 16]> = conn.devices.iter().map(|d| d.uuid).collect();
        let selection = visible_devices::select(&text, &uuids);
        if let Some(why) = &selection.stopped {
            eprintln!(
                "cumux run: warning: CUDA_VISIBLE_DEVICES={text:?}: {why}; as with NVIDIA's \
                 driver the list ends there, and {program} sees {} of the {} device(s) the server \
                 offers",
                selection.chosen.len(),
                uuids.len()
            );
        }
    }
    Ok(())
}

/// cumux's NVML (`crates/nvml`), whose file lies beside the client driver.
pub const NVML_FILE: &str = "libcumux_nvml.so";

/// The NVML the program gets in front of NVIDIA's: cumux's, beside the client
/// driver, unless `$CUMUX_NVML` says `off` (NVIDIA's shows through) or names
/// another. Where cumux's was not built or installed, none (said in the log).
fn find_nvml(driver: &Path) -> Result<Option<PathBuf>, String> {
    let beside = driver.with_file_name(NVML_FILE);
    match std::env::var_os("CUMUX_NVML").filter(|p| !p.is_empty()) {
        Some(v) if v == "off" => Ok(None),
        Some(v) if v == "on" => match beside.exists() {
            true => Ok(Some(beside)),
            false => Err(format!(
                "CUMUX_NVML=on, but there is no {} beside the client driver",
                beside.display()
            )),
        },
        Some(path) => Ok(Some(PathBuf::from(path))),
        None if beside.exists() => Ok(Some(beside)),
        None => {
            tracing::debug!(
                "no {} beside the client driver: programs see NVIDIA's NVML",
                beside.display()
            );
            Ok(None)
        }
    }
}

/// The start of the name of `cumux run`'s folders: the pid of the `cumux run`
/// that made it follows.
const FOLDER_PREFIX: &str = "cumux-run-";

/// Removes the folders in `tmp` that a `cumux run` of this user left when it
/// was killed outright (SIGKILL leaves no chance to clean up): those whose
/// maker's pid no longer runs.
fn sweep_left_folders(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(FOLDER_PREFIX))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let ours = entry
            .metadata()
            .is_ok_and(|m| m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == uid);
        if ours && !Path::new(&format!("/proc/{pid}")).exists() {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => tracing::debug!(
                    "removed {}, left by a killed cumux run",
                    entry.path().display()
                ),
                Err(e) => tracing::debug!("cannot remove {}: {e}", entry.path().display()),
            }
        }
    }
}

/// A private folder holding `libcuda.so.1` and `libcuda.so`, both links to
/// the driver, and `libnvidia-ml.so.1` and `libnvidia-ml.so` to cumux's NVML
/// where there is one; removed when dropped. Folders that killed runs left
/// are removed first.
fn driver_folder(driver: &Path) -> Result<tempfile::TempDir, String> {
    let driver = driver
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", driver.display()))?;
    sweep_left_folders(&std::env::temp_dir());
    let dir = tempfile::Builder::new()
        .prefix(&format!("{FOLDER_PREFIX}{}-", std::process::id()))
        .tempdir()
        .map_err(|e| {
            format!(
                "cannot make a folder in {}: {e}",
                std::env::temp_dir().display()
            )
        })?;
    let link = |target: &Path, name: &str| {
        std::os::unix::fs::symlink(target, dir.path().join(name))
            .map_err(|e| format!("cannot link {name} in {}: {e}", dir.path().display()))
    };
    for name in ["libcuda.so.1", "libcuda.so"] {
        link(&driver, name)?;
    }
    if let Some(nvml) = find_nvml(&driver)? {
        for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
            link(&nvml, name)?;
        }
    }
    Ok(dir)
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

/// The exit code of a finished program: its own, or 128 + the signal that
/// killed it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    }
}

/// The servers `--server` (else `CUMUX_SERVER`, else the default socket) names.
fn servers_named(server: Option<&str>) -> Result<Vec<Address>, RunError> {
    let failed = |message: String| RunError::new(exit::FAILED, message);
    match server {
        Some(text) => Address::parse_list(text).map_err(|e| failed(format!("--server: {e}"))),
        None => match std::env::var("CUMUX_SERVER") {
            Ok(text) if !text.is_empty() => {
                Address::parse_list(&text).map_err(|e| failed(format!("CUMUX_SERVER: {e}")))
            }
            _ => Ok(vec![Address::default_unix()]),
        },
    }
}

/// Where `--pool` puts the program. The pool's fingerprints join
/// `CUMUX_TLS_FINGERPRINT`, for the questions asked here and for the program.
fn place_in_pool(path: &Path, options: &RunOptions) -> Result<pool::Placement, RunError> {
    let failed = |message: String| RunError::new(exit::FAILED, message);
    if options.server.is_some() {
        return Err(failed("--pool and --server: give one or the other".into()));
    }
    let pool = pool::read(path).map_err(|e| failed(format!("{e:#}")))?;
    if !pool.fingerprints.is_empty() {
        let mut prints = pool.fingerprints.clone();
        if let Ok(own) = std::env::var(cumux_protocol::tls::FINGERPRINT_VAR) {
            prints.insert(0, own);
        }
        // `cumux run` has no other thread yet.
        std::env::set_var(cumux_protocol::tls::FINGERPRINT_VAR, prints.join(","));
    }
    let gpus = options.gpus.unwrap_or(1).max(1) as usize;
    pool::place(
        &pool,
        options.tenant.as_deref(),
        gpus,
        options.memory.unwrap_or(0),
    )
    .map_err(|e| {
        RunError::new(
            exit::NO_SERVER,
            format!(
                "--pool {}: {e:#}; the program was not started",
                path.display()
            ),
        )
    })
}

/// `CUMUX_SERVER` for the program: the addresses, comma-separated.
fn server_list(addresses: &[Address]) -> String {
    addresses
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Tells each server a program was placed on that it is starting (`pid`), so
/// that placements made before it connects count it; held until dropped.
/// A server that cannot be told is only warned about: the program runs.
fn hold_placement(
    claims: &[(Address, String)],
    tenant: Option<&str>,
    pid: u32,
) -> Vec<probe::Connection> {
    claims
        .iter()
        .filter_map(|(address, visible)| {
            probe::claim(address, tenant, pid, visible)
                .map_err(|e| {
                    eprintln!(
                        "cumux run: warning: {address} was not told of the placement (the next \
                         placements may not count it): {e}"
                    )
                })
                .ok()
        })
        .collect()
}

/// Runs the program; returns the exit code `cumux run` should exit with
/// (the program's, or 128 + signal), or why it did not run it.
pub fn run(options: RunOptions) -> Result<i32, RunError> {
    let failed = |message: String| RunError::new(exit::FAILED, message);
    let (addresses, placed) = match &options.pool {
        Some(path) => {
            let placement = place_in_pool(path, &options)?;
            eprintln!("cumux run: placed on {}", placement.described);
            for server in &placement.left_out {
                eprintln!("cumux run: warning: the pool's server {server} was left out");
            }
            let claims = placement
                .servers
                .iter()
                .cloned()
                .zip(placement.visible_per_server);
            let claims: Vec<(Address, String)> = claims.collect();
            (placement.servers, Some((placement.visible, claims)))
        }
        None if options.gpus.is_some() || options.memory.is_some() => {
            return Err(failed(
                "--gpus and --memory choose devices of a --pool".into(),
            ))
        }
        None => (servers_named(options.server.as_deref())?, None),
    };
    let driver = find_driver().map_err(failed)?;
    let shown = Path::new(&options.program).display().to_string();
    locate(&options.program, std::env::var_os("PATH").as_deref())?;
    for address in &addresses {
        preflight(
            address,
            options.tenant.as_deref(),
            &shown,
            addresses.len() > 1 || placed.is_some(),
        )?;
    }
    // From here on the signals that stop a program are the program's.
    let forwarder = Forwarder::start().map_err(|e| failed(format!("cannot watch signals: {e}")))?;
    let dir = driver_folder(&driver).map_err(failed)?;
    if let Some(signal) = forwarder.arrived_early() {
        return Ok(128 + signal);
    }
    let mut library_path = OsString::from(dir.path().as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        library_path.push(":");
        library_path.push(old);
    }
    let mut command = Command::new(&options.program);
    command
        .args(&options.args)
        .env("LD_LIBRARY_PATH", library_path)
        .env("CUMUX_SERVER", server_list(&addresses));
    if let Some(tenant) = &options.tenant {
        command.env("CUMUX_TENANT", tenant);
    }
    if let Some((visible, _)) = &placed {
        command.env("CUDA_VISIBLE_DEVICES", visible);
    }
    die_with_parent(&mut command);
    let mut child = command.spawn().map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => exit::NOT_FOUND,
            _ => exit::CANNOT_EXECUTE,
        };
        RunError::new(code, format!("cannot start {shown}: {e}"))
    })?;
    let _held = placed
        .as_ref()
        .map(|(_, claims)| hold_placement(claims, options.tenant.as_deref(), child.id()));
    let status = forwarder
        .wait_for(&mut child)
        .map_err(|e| failed(format!("cannot wait for {shown}: {e}")))?;
    drop(dir);
    Ok(exit_code(status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_as_shells_find_them() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("prog");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([Path::new("/nonexistent"), dir.path()]).unwrap();
        assert_eq!(locate(OsStr::new("prog"), Some(&path)).unwrap(), script);
        assert_eq!(locate(script.as_os_str(), None).unwrap(), script);
        let code = |name: &OsStr| locate(name, Some(&path)).unwrap_err().code;
        assert_eq!(code(OsStr::new("nope")), exit::NOT_FOUND);
        assert_eq!(code(dir.path().join("nope").as_os_str()), exit::NOT_FOUND);
        assert_eq!(code(OsStr::new("")), exit::NOT_FOUND);
        assert_eq!(code(OsStr::new("plain")), exit::CANNOT_EXECUTE);
        assert_eq!(code(plain.as_os_str()), exit::CANNOT_EXECUTE);
        assert_eq!(code(dir.path().as_os_str()), exit::CANNOT_EXECUTE);
        let e = locate(OsStr::new("nope"), Some(&path)).unwrap_err();
        assert!(e.message.contains("command not found"), "{e}");
    }

    #[test]
    fn an_installed_cumux_looks_beside_itself_then_in_lib() {
        let found = driver_candidates(Path::new("/usr/local/bin"));
        assert_eq!(
            found,
            [
                PathBuf::from("/usr/local/bin/libcumux_client.so"),
                PathBuf::from("/usr/local/lib/cumux/libcumux_client.so"),
                PathBuf::from("/usr/local/lib/libcumux_client.so"),
            ]
        );
    }

    #[test]
    fn exit_codes_follow_the_program() {
        use std::process::ExitStatus;
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGINT)), 130);
    }
}
