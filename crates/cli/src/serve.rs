//! `cumux serve`: picks the devices, binds the address and serves forever.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cumux_server::device::backends::{cpu_device, default_memory_bytes};
use cumux_server::device::model::ModelDevice;
use cumux_server::device::DEFAULT_LAUNCH_BUDGET;
use cumux_server::worker::device::{cpu_worker_device, cuda_worker_devices, Sharing};
use cumux_server::{listener, Address, Device, Server};

use crate::config::{self, ServerSettings};
use crate::status::human_bytes;

/// What `cumux serve` was asked for (flags win over the config file).
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ServeOptions {
    #[command(flatten)]
    pub settings: ServerSettings,
    /// A TOML config file: device, listen, memory, policy (also per device, in
    /// [devices.N] tables), and the tenant table.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Listen on a TCP address other hosts can reach, although TCP is not
    /// encrypted yet: tenants' tokens and data cross the network in the
    /// clear. Needed for `--listen tcp:` on a non-loopback address.
    #[arg(long)]
    pub insecure: bool,
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

fn choose_devices(
    kind: &str,
    memory: u64,
    launch_budget: u64,
    sharing: Sharing,
    kernel_timeout: Option<Duration>,
) -> Result<Vec<Arc<dyn Device>>> {
    let cpu = || -> Result<Vec<Arc<dyn Device>>> {
        if kernel_timeout.is_some() {
            tracing::warn!("--kernel-timeout applies to devices served by workers (GPUs, worker-cpu); the CPU device stops a kernel by its --launch-budget");
        }
        Ok(vec![
            cpu_device(memory, launch_budget).map_err(anyhow::Error::msg)?
        ])
    };
    match kind {
        "cpu" => cpu(),
        // The model device of the server's tests: no kernels of real programs.
        "model" => Ok(vec![Arc::new(ModelDevice::new(memory))]),
        // The CPU device in worker processes: the cuda backend's machinery, testable without a GPU.
        "worker-cpu" => {
            let exe = std::env::current_exe().context("cannot find the cumux executable")?;
            Ok(vec![cpu_worker_device(
                exe,
                memory,
                launch_budget,
                sharing,
                kernel_timeout,
            )])
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

pub fn serve(options: ServeOptions) -> Result<()> {
    let file = match &options.config {
        Some(path) => config::read(path)?,
        None => config::FileConfig::default(),
    };
    let settings = options.settings.or(file.settings);
    let kind = settings.device.unwrap_or_else(|| "auto".into());
    let memory = settings.memory.unwrap_or_else(default_memory_bytes);
    let launch_budget = settings.launch_budget.unwrap_or(DEFAULT_LAUNCH_BUDGET);
    let address = match settings.listen {
        Some(text) => Address::parse(&text).map_err(anyhow::Error::msg)?,
        None => Address::default_unix(),
    };
    if let Address::Tcp(host_port) = &address {
        if !options.insecure && !loopback_only(host_port)? {
            bail!(
                "--listen {address}: TCP is not encrypted yet, so tenants' tokens and data \
                 would cross the network in the clear; listen on a loopback address \
                 (tcp:127.0.0.1:PORT) or the unix socket, or pass --insecure to accept that"
            );
        }
    }
    // Every device's policy unless its `[devices.N]` table gives its own.
    let default_policy_name = settings.policy.unwrap_or_else(|| "fifo".into());
    let default_policy =
        cumux_server::gate::parse_policy(&default_policy_name).map_err(anyhow::Error::msg)?;
    let sharing_name = settings.sharing.unwrap_or_else(|| "isolated".into());
    let sharing = Sharing::parse(&sharing_name).map_err(anyhow::Error::msg)?;
    if sharing == Sharing::Shared && !matches!(kind.as_str(), "auto" | "cuda" | "worker-cpu") {
        bail!("--sharing shared applies to GPUs (and worker-cpu); the {kind} device gives each session its own context");
    }
    let kernel_timeout = settings.kernel_timeout;
    let devices = choose_devices(&kind, memory, launch_budget, sharing, kernel_timeout)?;
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
    let policies = file.devices.policies(default_policy, devices.len())?;
    // Workers and their contexts start now, not while tenants run.
    std::thread::scope(|scope| {
        for device in &devices {
            scope.spawn(|| device.warm_up());
        }
    });
    let server = Server::with_policies(devices, file.tenants, policies);
    let bound = listener::bind(&address).with_context(|| format!("cannot listen on {address}"))?;
    let mut line = format!("cumux serve: listening on {}", bound.address());
    for (i, (d, policy)) in server.devices().iter().zip(server.policies()).enumerate() {
        let info = d.info();
        line += &format!(
            "; device {i}: {} ({}, {}, {}, {sharing_name})",
            info.name,
            info.backend,
            human_bytes(d.mem_total()),
            cumux_server::gate::policy_name(policy)
        );
    }
    // Worker-backed devices only (the CPU device warned that it has none).
    let watched =
        server.devices().iter().any(|d| d.info().backend == "cuda") || kind == "worker-cpu";
    if let (Some(t), true) = (kernel_timeout, watched) {
        line += &format!("; kernel timeout {}", humantime::format_duration(t));
    }
    println!("{line}");
    let _ = std::io::stdout().flush();
    tracing::info!("{line}");
    bound.serve(server).context("the accept loop failed")
}
