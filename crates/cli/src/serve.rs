//! `cumux serve`: picks the devices, binds the address (then the socket's mode
//! and group), tells a service manager it is ready, and serves until SIGTERM
//! or SIGINT, then drains: running sessions may finish, new ones are refused.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cumux_server::device::backends::{
    default_memory_bytes, numbered_cpu_device, reserve_cpu_device, CpuSpec, MAX_CPU_DEVICES,
};
use cumux_server::device::model::ModelDevice;
use cumux_server::device::DEFAULT_LAUNCH_BUDGET;
use cumux_server::device_health::{Failover, OnFailure};
use cumux_server::shutdown::Shutdown;
use cumux_server::tenants::TenantPolicy;
use cumux_server::tls::ServerTls;
use cumux_server::worker::device::{cpu_worker_device, cuda_worker_devices, Sharing};
use cumux_server::{listener, Address, Device, Server};

use crate::config::{self, ServerSettings};
use crate::logging::LogFormat;
use crate::status::human_bytes;
use crate::{notify, self_signed, signals};

/// How long running sessions may go on after SIGTERM or SIGINT, by default.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What `cumux serve` was asked for (flags win over the config file).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeOptions {
    #[command(flatten)]
    pub settings: ServerSettings,
    /// A TOML config file: device, listen, memory, policy (also per device, in
    /// [devices.N] tables), and the tenant table.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Serve plain TCP (no TLS) on an address other hosts can reach, and
    /// metrics there: tenants' tokens and data cross the network in the clear.
    #[arg(long)]
    pub insecure: bool,
    /// How log lines are written: text (plain unless stderr is a terminal)
    /// or json (one object per line). Default: $CUMUX_LOG_FORMAT, else text.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Checkpoints taken with `cumux checkpoint --hold` (on this or another
    /// server, before it stopped): each waits for its program to reconnect
    /// (CUMUX_RESUME=1) and resume its session here.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    pub restore: Vec<PathBuf>,
}

/// Whether every address `host_port` names is a loopback one.
fn loopback_only(host_port: &str) -> Result<bool> {
    use std::net::ToSocketAddrs;
    let addresses: Vec<_> = host_port
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {host_port}"))?
        .collect();
    Ok(!addresses.is_empty() && addresses.iter().all(|a| a.ip().is_loopback()))
}

/// A warning for each tenant whose memory quota is more than the memory of a
/// device it may use (there it gets at most the device's memory): `devices`
/// are each device's total memory, in server order.
pub fn quota_warnings(tenants: &TenantPolicy, devices: &[u64]) -> Vec<String> {
    let defaults = ("[defaults]".to_string(), &tenants.defaults);
    let listed = tenants
        .tenants
        .iter()
        .map(|(n, s)| (format!("tenant {n:?}"), s));
    std::iter::once(defaults)
        .chain(listed)
        .filter_map(|(who, settings)| {
            let quota = settings.memory_quota?;
            let smaller: Vec<String> = devices
                .iter()
                .enumerate()
                .filter(|&(i, &total)| settings.allows_device(i as u32) && quota > total)
                .map(|(i, &total)| format!("device {i} ({})", human_bytes(total)))
                .collect();
            (!smaller.is_empty()).then(|| {
                format!(
                    "{who}: memory_quota {} is more than the memory of {}; there it can use \
                     at most the device's memory",
                    human_bytes(quota),
                    smaller.join(", ")
                )
            })
        })
        .collect()
}

/// The group id `group` names: a number, or a group name.
pub fn group_id(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group).context("a group name with a NUL byte")?;
    let mut entry: libc::group = unsafe_zeroed_group();
    let mut buf = vec![0 as libc::c_char; 16 << 10];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: `name` is NUL-terminated,
    // `entry` and `found` are writable, `buf` is writable for its length.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut entry,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        bail!(
            "cannot look up group {group:?}: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
    if found.is_null() {
        bail!("no group {group:?} on this host (socket_group)");
    }
    Ok(entry.gr_gid)
}

fn unsafe_zeroed_group() -> libc::group {
    // SAFETY: `group` is a plain C struct of an id and pointers; all-zero
    // (null pointers) is a valid value, filled in by getgrnam_r.
    unsafe { std::mem::zeroed() }
}

/// Whether this machine shows an NVIDIA GPU to the kernel.
fn gpu_present() -> bool {
    std::path::Path::new("/dev/nvidiactl").exists() || std::path::Path::new("/dev/nvidia0").exists()
}

/// Every GPU, each session's context in a `cumux worker` process of its own:
/// a GPU fault poisons every context of its process, so the server holds none.
fn cuda_devices(
    sharing: Sharing,
    kernel_timeout: Option<Duration>,
) -> Result<Vec<Arc<dyn Device>>, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find the cumux executable for workers: {e}"))?;
    cuda_worker_devices(exe, sharing, kernel_timeout)
}

/// `devices`, and the failover setting for `on_failure`: `migrate-to-cpu`
/// adds a CPU device as `spec` says, in the first address window the
/// server's own CPU devices leave, kept in reserve for moves off a failed
/// device.
fn with_reserve(
    mut devices: Vec<Arc<dyn Device>>,
    on_failure: OnFailure,
    spec: &CpuSpec,
) -> Result<(Vec<Arc<dyn Device>>, Failover)> {
    let mut failover = Failover {
        on_failure,
        reserve: None,
    };
    if on_failure != OnFailure::MigrateToCpu {
        return Ok((devices, failover));
    }
    let windows: Vec<u32> = devices
        .iter()
        .filter(|d| d.info().backend != "cuda")
        .map(|d| d.info().ordinal)
        .collect();
    let window = (0..MAX_CPU_DEVICES)
        .find(|w| !windows.contains(w))
        .context("on_device_failure = \"migrate-to-cpu\": every CPU address window is taken by the server's CPU devices; serve fewer")?;
    let position = devices.len() as u32;
    let reserve = reserve_cpu_device(position, window, spec)
        .map_err(anyhow::Error::msg)
        .context("on_device_failure = \"migrate-to-cpu\" needs a CPU device")?;
    devices.push(reserve);
    failover.reserve = Some(position);
    Ok((devices, failover))
}

fn choose_devices(
    kind: &str,
    cpu_devices: u32,
    cpu_window: u32,
    spec: &CpuSpec,
    sharing: Sharing,
    kernel_timeout: Option<Duration>,
) -> Result<Vec<Arc<dyn Device>>> {
    if cpu_devices == 0 || cpu_devices > MAX_CPU_DEVICES {
        bail!("--cpu-devices {cpu_devices}: serve 1 to {MAX_CPU_DEVICES} CPU devices");
    }
    if cpu_window + cpu_devices > MAX_CPU_DEVICES {
        bail!(
            "--cpu-window {cpu_window} with {cpu_devices} CPU device(s): the windows are 0 to {}",
            MAX_CPU_DEVICES - 1
        );
    }
    let numbers = cpu_window..cpu_window + cpu_devices;
    let cpu = || -> Result<Vec<Arc<dyn Device>>> {
        if kernel_timeout.is_some() {
            tracing::warn!("--kernel-timeout applies to devices served by workers (GPUs, worker-cpu); the CPU device stops a kernel by its --launch-budget");
        }
        numbers
            .clone()
            .map(|n| numbered_cpu_device(n, spec).map_err(anyhow::Error::msg))
            .collect()
    };
    match kind {
        "cpu" => cpu(),
        // The model device of the server's tests: no kernels of real programs.
        "model" => Ok(vec![Arc::new(ModelDevice::new(spec.memory))]),
        // The CPU device in worker processes: the cuda backend's machinery, testable without a GPU.
        "worker-cpu" => {
            let exe = std::env::current_exe().context("cannot find the cumux executable")?;
            numbers
                .clone()
                .map(|n| {
                    cpu_worker_device(exe.clone(), n, spec, sharing, kernel_timeout)
                        .map_err(anyhow::Error::msg)
                })
                .collect()
        }
        "auto" => {
            if !gpu_present() {
                tracing::info!("no GPU found; serving the CPU reference device");
                return cpu();
            }
            match cuda_devices(sharing, kernel_timeout) {
                Ok(devices) if !devices.is_empty() => Ok(devices),
                Ok(_) => {
                    tracing::warn!(
                        "the CUDA driver reports no GPU; serving the CPU reference device"
                    );
                    cpu()
                }
                Err(e) => {
                    tracing::warn!("a GPU is present but cannot be used ({e}); serving the CPU reference device");
                    cpu()
                }
            }
        }
        "cuda" => match cuda_devices(sharing, kernel_timeout).map_err(anyhow::Error::msg)? {
            devices if devices.is_empty() => bail!("--device cuda: the CUDA driver reports no GPU"),
            devices => Ok(devices),
        },
        other => bail!("unknown device kind {other:?}: expected auto, cpu or cuda"),
    }
}

/// Binds `at` for `/metrics` (with the metrics of `functions`, if served)
/// and serves it from a thread of its own; the address bound (port 0 picks one).
fn serve_metrics(
    at: &str,
    insecure: bool,
    server: &Arc<Server>,
    functions: Option<Arc<cumux_functions::Functions>>,
) -> Result<std::net::SocketAddr> {
    if !insecure && !loopback_only(at)? {
        bail!(
            "--metrics {at}: the metrics name tenants and programs, and anyone who reaches \
             the address can read them; use a loopback address (127.0.0.1:PORT) behind \
             a scraper on this host, or pass --insecure to accept that"
        );
    }
    let listener =
        std::net::TcpListener::bind(at).with_context(|| format!("cannot serve metrics on {at}"))?;
    let bound = listener.local_addr()?;
    crate::metrics_http::start(listener, Arc::clone(server), functions)?;
    Ok(bound)
}

/// The TLS a listener at `address` speaks: the configured certificate, else
/// on a non-loopback TCP address a self-signed one (plain TCP there only with
/// `--insecure`); loopback TCP and unix sockets are plain unless configured.
fn listener_tls(
    address: &Address,
    settings: &ServerSettings,
    insecure: bool,
) -> Result<Option<ServerTls>> {
    let load = |cert: &std::path::Path, key: &std::path::Path| {
        ServerTls::load(cert, key, settings.tls_client_ca.as_deref()).map_err(anyhow::Error::msg)
    };
    let host_port = match address {
        Address::Tcp(host_port) => host_port,
        // Its clients are on this host; tls_cert is for TCP listeners (the
        // functions API's too).
        Address::Unix(_) => return Ok(None),
    };
    match (&settings.tls_cert, &settings.tls_key) {
        (Some(cert), Some(key)) => return load(cert, key).map(Some),
        (None, None) => {}
        _ => bail!("tls_cert and tls_key go together"),
    }
    if settings.tls_client_ca.is_some() {
        bail!("tls_client_ca needs tls_cert and tls_key");
    }
    if loopback_only(host_port)? {
        return Ok(None);
    }
    if insecure {
        tracing::warn!(
            "--listen {address} --insecure: plain TCP, so tenants' tokens and data cross \
             the network in the clear"
        );
        return Ok(None);
    }
    let (cert, key) = self_signed::ensure(
        &self_signed::state_dir()?,
        &self_signed::names_for(host_port),
    )?;
    load(&cert, &key).map(Some)
}

/// Binds `at` for the functions API and serves it from a thread of its own;
/// the address bound (port 0 picks one).
fn serve_functions(
    at: &str,
    tls: Option<ServerTls>,
    server: &Arc<Server>,
    max_body: Option<u64>,
    lanes: Option<u32>,
) -> Result<(std::net::SocketAddr, Arc<cumux_functions::Functions>)> {
    let mut limits = cumux_functions::Limits::default();
    if let Some(n) = lanes {
        limits.lanes_per_device = n as usize;
    }
    if let Some(bytes) = max_body {
        limits.max_body_bytes = usize::try_from(bytes).context("--functions-max-body")?;
    }
    let listener = std::net::TcpListener::bind(at)
        .with_context(|| format!("cannot serve functions on {at}"))?;
    let bound = listener.local_addr()?;
    let functions = Arc::new(cumux_functions::Functions::new(Arc::clone(server), limits));
    let tls = tls.map(|t| Arc::clone(t.config()));
    crate::functions_http::start(listener, Arc::clone(&functions), tls)?;
    Ok((bound, functions))
}

pub fn serve(options: ServeOptions) -> Result<()> {
    crate::signals::survive_file_size_limit().context("cannot catch SIGXFSZ")?;
    cumux_server::freed_memory::keep_thresholds_fixed();
    // Read before anything starts: a bad file is told at once.
    let restores = options
        .restore
        .iter()
        .map(|path| crate::checkpoint_file::read(path).map(|image| (path, image)))
        .collect::<Result<Vec<_>>>()?;
    let file = match &options.config {
        Some(path) => config::read(path)?,
        None => config::FileConfig::default(),
    };
    let settings = options.settings.or(file.settings);
    let tls_settings = settings.clone();
    let kind = settings.device.unwrap_or_else(|| "auto".into());
    let memory = settings.memory.unwrap_or_else(default_memory_bytes);
    let launch_budget = settings.launch_budget.unwrap_or(DEFAULT_LAUNCH_BUDGET);
    let address = match settings.listen {
        Some(text) => Address::parse(&text).map_err(anyhow::Error::msg)?,
        None => Address::default_unix(),
    };
    let uses_tls_cert = matches!(address, Address::Tcp(_)) || settings.functions.is_some();
    if tls_settings.tls_cert.is_some() && !uses_tls_cert {
        bail!(
            "tls_cert: nothing here speaks TLS with it: it is for a TCP listener \
             (--listen tcp:HOST:PORT) or the functions API (--functions)"
        );
    }
    let tls = listener_tls(&address, &tls_settings, options.insecure)?;
    // Every device's policy unless its `[devices.N]` table gives its own.
    let default_policy_name = settings.policy.unwrap_or_else(|| "fifo".into());
    let default_policy =
        cumux_server::gate::parse_policy(&default_policy_name).map_err(anyhow::Error::msg)?;
    let sharing_name = settings.sharing.unwrap_or_else(|| "isolated".into());
    let sharing = Sharing::parse(&sharing_name).map_err(anyhow::Error::msg)?;
    if sharing.one_context() && !matches!(kind.as_str(), "auto" | "cuda" | "worker-cpu") {
        bail!("--sharing shared applies to GPUs (and worker-cpu); the {kind} device gives each session its own context");
    }
    let placed = cumux_server::sm_parts::SmPlacement::of(&file.tenants);
    if let Some(line) = placed.describe() {
        tracing::info!("{line}");
    }
    if !placed.overlapping.is_empty() {
        tracing::warn!(
            "SM caps add up to more than 100 %: {} share SMs with tenants placed before them",
            placed.overlapping.join(", ")
        );
    }
    let kernel_timeout = settings.kernel_timeout;
    let cpu_devices = settings.cpu_devices.unwrap_or(1);
    let threads = match settings.threads {
        None => 0,
        Some(0) => bail!("--threads 0: a CPU device needs at least one thread"),
        Some(_) if !matches!(kind.as_str(), "cpu" | "worker-cpu") => bail!(
            "--threads sets a CPU device's threads; the {kind} device has none to set \
             (serve --device cpu or worker-cpu)"
        ),
        Some(n) => n as usize,
    };
    let cpu = CpuSpec {
        memory,
        launch_budget,
        threads,
    };
    let devices = choose_devices(
        &kind,
        cpu_devices,
        settings.cpu_window.unwrap_or(0),
        &cpu,
        sharing,
        kernel_timeout,
    )?;
    for (name, t) in &file.tenants.tenants {
        if let Some(bad) = t
            .devices
            .iter()
            .flatten()
            .find(|d| **d as usize >= devices.len())
        {
            tracing::warn!(
                "tenant {name:?} is allowed device {bad}, which this server does not have"
            );
        }
    }
    for ordinal in file.devices.beyond(devices.len()) {
        tracing::warn!(
            "the config has a [devices.{ordinal}] table, but this server has no device {ordinal}"
        );
    }
    let totals: Vec<u64> = devices.iter().map(|d| d.mem_total()).collect();
    for warning in quota_warnings(&file.tenants, &totals) {
        tracing::warn!("{warning}");
    }
    let on_failure = OnFailure::parse(settings.on_device_failure.as_deref().unwrap_or("stay"))
        .map_err(anyhow::Error::msg)?;
    let (devices, failover) = with_reserve(devices, on_failure, &cpu)?;
    let policies = file.devices.policies(default_policy, devices.len())?;
    // Workers and their contexts start now, not while tenants run.
    std::thread::scope(|scope| {
        for device in &devices {
            scope.spawn(|| device.warm_up());
        }
    });
    let socket_gid = settings
        .socket_group
        .as_deref()
        .map(group_id)
        .transpose()
        .context("socket_group")?;
    // From here on SIGTERM and SIGINT drain the server (a second stops it).
    let shutdown = Shutdown::new().context("cannot make the shutdown handle")?;
    let pull = shutdown.clone();
    // The functions API, once it serves: it stops taking requests too.
    let functions_slot: Arc<OnceLock<Arc<cumux_functions::Functions>>> = Arc::default();
    let functions_stop = Arc::clone(&functions_slot);
    signals::on_stop_signals(move |count, signal| {
        let name = if signal == libc::SIGINT {
            "SIGINT"
        } else {
            "SIGTERM"
        };
        if count == 1 {
            tracing::info!("{name}: draining; another SIGTERM or SIGINT stops at once");
            notify::tell("STOPPING=1\nSTATUS=draining");
        } else {
            tracing::warn!("{name} again: stopping now");
        }
        if let Some(functions) = functions_stop.get() {
            functions.stop_taking(count > 1);
        }
        pull.request();
    })
    .context("cannot watch SIGTERM and SIGINT")?;
    let drain_timeout = settings.drain_timeout.unwrap_or(DEFAULT_DRAIN_TIMEOUT);
    let server = Server::with_failover(devices, file.tenants, policies, failover);
    for (path, image) in restores {
        cumux_server::session::Session::park(&server, image)
            .map_err(|e| anyhow::anyhow!("{} is refused: {}", path.display(), e.detail))?;
    }
    let mut bound =
        listener::bind(&address).with_context(|| format!("cannot listen on {address}"))?;
    if let Some(tls) = tls {
        bound = bound.with_tls(tls)?;
    }
    let access = bound
        .set_access(settings.socket_mode, socket_gid)
        .with_context(|| format!("cannot set the access of {address}"))?;
    if let Some(warning) = access {
        tracing::warn!("{warning}");
    }
    // The functions API speaks HTTPS as the TCP listener speaks TLS.
    let mut functions_tls = None;
    let functions = match settings.functions.as_deref() {
        Some(at) => {
            let tls = listener_tls(
                &Address::Tcp(at.to_string()),
                &tls_settings,
                options.insecure,
            )
            .context("--functions")?;
            functions_tls = tls.as_ref().map(|t| t.fingerprint().to_string());
            Some(serve_functions(
                at,
                tls,
                &server,
                settings.functions_max_body,
                settings.functions_lanes,
            )?)
        }
        None => None,
    };
    if let Some((_, f)) = &functions {
        let _ = functions_slot.set(Arc::clone(f));
    }
    let metrics = match settings.metrics.as_deref() {
        Some(at) => Some(serve_metrics(
            at,
            options.insecure,
            &server,
            functions.as_ref().map(|(_, f)| Arc::clone(f)),
        )?),
        None => None,
    };
    let mut line = format!("cumux serve: listening on {}", bound.address());
    if let Some(tls) = bound.tls() {
        line += &format!(" (TLS, certificate {})", tls.fingerprint());
    }
    for (i, (d, policy)) in server.devices().iter().zip(server.policies()).enumerate() {
        let info = d.info();
        let role = match failover.reserve == Some(i as u32) {
            true => ", reserve for moves off a failed device",
            false => "",
        };
        line += &format!(
            "; device {i}: {} ({}, {}, {}, {sharing_name}{role})",
            info.name,
            info.backend,
            human_bytes(d.mem_total()),
            cumux_server::gate::policy_name(policy)
        );
    }
    if on_failure != OnFailure::Stay {
        line += &format!("; on device failure: {}", on_failure.name());
    }
    // Worker-backed devices only (the CPU device warned that it has none).
    let watched =
        server.devices().iter().any(|d| d.info().backend == "cuda") || kind == "worker-cpu";
    if let (Some(t), true) = (kernel_timeout, watched) {
        line += &format!("; kernel timeout {}", humantime::format_duration(t));
    }
    if let Some(at) = metrics {
        line += &format!("; metrics on http://{at}/metrics");
    }
    if let Some((at, _)) = &functions {
        match &functions_tls {
            Some(print) => {
                line += &format!("; functions on https://{at}/v1/functions (certificate {print})")
            }
            None => line += &format!("; functions on http://{at}/v1/functions"),
        }
    }
    println!("{line}");
    let _ = std::io::stdout().flush();
    tracing::info!("{line}");
    notify::tell(&format!("READY=1\nSTATUS=listening on {}", bound.address()));
    let drained = bound
        .serve_until(Arc::clone(&server), &shutdown, drain_timeout)
        .context("the accept loop failed")?;
    // `bound` is gone: the socket file with it.
    // Function requests in flight may finish too, within the same grace.
    if let Some((_, f)) = &functions {
        match f.wait_idle(drain_timeout) {
            0 => {}
            left => tracing::warn!("cumux serve: {left} function requests still running at exit"),
        }
    }
    let summary = format!("cumux serve: {}", drained.summary());
    if drained.open == 0 {
        tracing::info!("{summary}");
    } else {
        tracing::warn!("{summary}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cumux_server::tenants::TenantSettings;

    #[test]
    fn quotas_past_a_devices_memory_are_named_with_both_sizes() {
        let mut tenants = TenantPolicy::default();
        let quota = |q: u64, devices: Option<Vec<u32>>| TenantSettings {
            memory_quota: Some(q),
            devices,
            ..TenantSettings::default()
        };
        tenants
            .tenants
            .insert("alice".into(), quota(100 << 30, None));
        tenants.tenants.insert("bob".into(), quota(512 << 20, None));
        tenants
            .tenants
            .insert("carol".into(), quota(8 << 30, Some(vec![1])));
        tenants.defaults = quota(2 << 30, None);
        let warnings = quota_warnings(&tenants, &[1 << 30, 16 << 30]);
        assert_eq!(
            warnings,
            [
                "[defaults]: memory_quota 2.0 GiB is more than the memory of device 0 (1.0 GiB); \
                 there it can use at most the device's memory",
                "tenant \"alice\": memory_quota 100.0 GiB is more than the memory of device 0 \
                 (1.0 GiB), device 1 (16.0 GiB); there it can use at most the device's memory",
            ]
        );
    }

    #[test]
    fn groups_by_number_or_name() {
        assert_eq!(group_id("4321").unwrap(), 4321);
        assert_eq!(group_id("root").unwrap(), 0);
        let e = group_id("cumux-no-such-group").unwrap_err();
        assert!(format!("{e:#}").contains("no group"), "{e:#}");
    }

    #[test]
    fn the_packaged_service_and_config_are_ones_serve_takes() {
        let config = config::parse(include_str!("../../../packaging/cumux.toml")).unwrap();
        assert_eq!(config.settings.socket_mode, Some(0o660));
        assert_eq!(config.settings.socket_group.as_deref(), Some("cumux"));
        let unit = include_str!("../../../packaging/cumux.service");
        let exec = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .expect("the unit has an ExecStart");
        let mut words = exec.split_whitespace();
        assert!(words.next().unwrap().ends_with("/cumux"));
        assert_eq!(words.next(), Some("serve"));
        #[derive(clap::Parser)]
        struct Serve {
            #[command(flatten)]
            options: ServeOptions,
        }
        let parsed =
            <Serve as clap::Parser>::try_parse_from(std::iter::once("serve").chain(words)).unwrap();
        assert!(parsed.options.config.is_some());
        for line in ["Type=notify", "KillMode=mixed", "RuntimeDirectoryMode=0750"] {
            assert!(unit.lines().any(|l| l == line), "{line}");
        }
    }
}
