//! `cumux device-plugin`: the kubelet's device plugin for cumux. It offers a
//! node's GPUs as units of a resource: memory (`cumux.io/gpu-memory`, one
//! unit per GiB by default), or shares (`cumux.io/gpu-share`, ten a GPU by
//! default, each a tenth of its memory and of its time under `fair`). For
//! each container it is given units of, it lists a tenant on the cumux server
//! (`Call::TenantPut`: the units' memory as its quota on those GPUs, for
//! shares their count as its weight, a fresh token) and hands the container
//! the token, the server's socket and the client driver. A tenant whose units
//! no pod holds any more (the kubelet's pod-resources API says) is taken off
//! the table.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use cumux_protocol::{Call, ClientRole, TenantSpec};
use cumux_server::Address;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::config::memory_arg;
use crate::probe;

/// The API, generated from `proto/deviceplugin.proto`.
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The kubelet's pod-resources API, generated from `proto/podresources.proto`.
pub mod podresources {
    tonic::include_proto!("v1");
}

use v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use v1beta1::registration_client::RegistrationClient;
use v1beta1::*;

/// The API version the kubelet is told.
pub const API_VERSION: &str = "v1beta1";
/// The plugin's socket, in the kubelet's folder, offering memory.
pub const PLUGIN_SOCKET: &str = "cumux.sock";
/// The plugin's socket offering shares (so both plugins can run side by side).
pub const SHARE_PLUGIN_SOCKET: &str = "cumux-gpu-share.sock";

/// What the plugin offers a GPU as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Offer {
    /// Units of device memory (`--unit` bytes each); a tenant's weight is 1.
    Memory,
    /// `--shares` units a GPU, each that fraction of its memory and, under
    /// the server's `fair` policy, of its time (the units are the weight).
    Share,
}
/// The kubelet's registration socket, in its folder.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// What `cumux device-plugin` was asked for.
#[derive(Debug, Clone, clap::Args)]
pub struct PluginOptions {
    /// The cumux server (default: $CUMUX_SERVER, else the default socket);
    /// the plugin must be its admin (its user or root on its unix socket).
    #[arg(long)]
    pub server: Option<String>,
    /// The kubelet's device-plugin folder.
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    pub kubelet_dir: PathBuf,
    /// What a GPU is offered as.
    #[arg(long, value_enum, default_value_t = Offer::Memory)]
    pub offer: Offer,
    /// The resource offered (default: cumux.io/gpu-memory, or
    /// cumux.io/gpu-share with `--offer share`).
    #[arg(long)]
    pub resource: Option<String>,
    /// Device memory per unit of the resource (bytes, or K/M/G/T), with
    /// `--offer memory`.
    #[arg(long, default_value = "1G", value_parser = memory_arg)]
    pub unit: u64,
    /// Units a GPU is split into, with `--offer share`.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub shares: u64,
    /// The host folder holding the client driver (libcumux_client.so and a
    /// libcuda.so.1 link to it), mounted read-only into containers.
    #[arg(long, default_value = "/usr/local/lib/cumux")]
    pub driver_dir: PathBuf,
    /// Where containers find the client driver.
    #[arg(long, default_value = "/usr/local/cumux/lib")]
    pub container_driver_dir: PathBuf,
    /// Where containers find the server's socket folder.
    #[arg(long, default_value = "/run/cumux")]
    pub container_socket_dir: PathBuf,
    /// The kubelet's pod-resources socket, which says which units pods hold.
    #[arg(long, default_value = "/var/lib/kubelet/pod-resources/kubelet.sock")]
    pub pod_resources: PathBuf,
    /// How often tenants whose units no pod holds are taken off the table
    /// (one at least this old); 0 keeps them.
    #[arg(long, default_value = "30s", value_parser = interval_arg)]
    pub gc_interval: std::time::Duration,
}

/// A collection interval on the command line (zero allowed: off).
fn interval_arg(text: &str) -> Result<std::time::Duration, String> {
    crate::config::parse_drain_timeout(text).map_err(|e| format!("{e:#}"))
}

/// One unit of the resource: `gpu<ordinal>-<index>`.
fn unit_id(ordinal: u32, index: u64) -> String {
    format!("gpu{ordinal}-{index}")
}

/// The GPU a unit id names.
fn unit_gpu(id: &str) -> Option<u32> {
    let (gpu, index) = id.strip_prefix("gpu")?.split_once('-')?;
    index.parse::<u64>().ok()?;
    gpu.parse().ok()
}

/// A tenant name for the set of units `ids` of `resource`: the same units,
/// the same name (so a later container given them replaces the earlier one's
/// entry).
fn tenant_for(resource: &str, ids: &BTreeSet<String>) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    resource.hash(&mut hasher);
    ids.hash(&mut hasher);
    format!("pod-{:016x}", hasher.finish())
}

/// A fresh token: 32 random bytes, in hex.
fn fresh_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The plugin: the units it offers and how it lists their tenants.
struct Plugin {
    address: Address,
    options: PluginOptions,
    resource: String,
    /// Each unit offered, with its device memory.
    units: BTreeMap<String, u64>,
    /// The tenants it listed: name → (their units, when).
    listed: std::sync::Mutex<BTreeMap<String, (BTreeSet<String>, std::time::Instant)>>,
}

impl Plugin {
    /// Lists the tenant of a container given `ids`; the container's answer.
    fn allocate_one(&self, ids: &[String]) -> Result<ContainerAllocateResponse, Status> {
        let ids: BTreeSet<String> = ids.iter().cloned().collect();
        let mut gpus = BTreeSet::new();
        let mut memory: u64 = 0;
        for id in &ids {
            let Some(&bytes) = self.units.get(id) else {
                return Err(Status::invalid_argument(format!(
                    "unit {id:?} is not offered here"
                )));
            };
            memory = memory.saturating_add(bytes);
            gpus.extend(unit_gpu(id));
        }
        let name = tenant_for(&self.resource, &ids);
        let token = fresh_token().map_err(|e| Status::internal(format!("no random token: {e}")))?;
        let weight = match self.options.offer {
            Offer::Memory => 1,
            Offer::Share => u32::try_from(ids.len()).unwrap_or(u32::MAX),
        };
        let spec = TenantSpec {
            memory_quota: Some(memory),
            weight,
            devices: Some(gpus.into_iter().collect()),
            token: Some(token.clone()),
            ..TenantSpec::default()
        };
        let put = Call::TenantPut {
            name: name.clone(),
            spec,
        };
        admin_connection(&self.address)
            .map_err(|e| Status::unavailable(e.to_string()))?
            .call(put)
            .map_err(|e| Status::failed_precondition(format!("the cumux server refused: {e:#}")))?;
        tracing::info!(
            tenant = name,
            units = ids.len(),
            memory,
            weight,
            "listed a container's tenant"
        );
        self.listed_lock()
            .insert(name.clone(), (ids.clone(), std::time::Instant::now()));
        let (server, mounts) = self.server_for_containers();
        let mut envs = BTreeMap::from([
            ("CUMUX_TENANT".to_string(), name),
            ("CUMUX_TOKEN".to_string(), token),
            ("CUMUX_SERVER".to_string(), server),
        ]);
        let driver_dir = self.options.container_driver_dir.display().to_string();
        envs.insert("LD_LIBRARY_PATH".into(), driver_dir.clone());
        let mut mounts = mounts;
        mounts.push(Mount {
            container_path: driver_dir,
            host_path: self.options.driver_dir.display().to_string(),
            read_only: true,
        });
        Ok(ContainerAllocateResponse {
            envs: envs.into_iter().collect(),
            mounts,
            ..ContainerAllocateResponse::default()
        })
    }

    fn listed_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<String, (BTreeSet<String>, std::time::Instant)>> {
        self.listed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes off the table the tenants it listed at least `age` ago whose
    /// units no pod holds (`held`, this resource's units of every pod).
    fn forget_unheld(&self, held: &BTreeSet<String>, age: std::time::Duration) {
        let stale: Vec<String> = self
            .listed_lock()
            .iter()
            .filter(|(_, (ids, when))| when.elapsed() >= age && ids.is_disjoint(held))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            let removed = admin_connection(&self.address)
                .map_err(anyhow::Error::from)
                .and_then(|mut c| c.call(Call::TenantRemove { name: name.clone() }));
            match removed {
                Ok(_) => {
                    tracing::info!(tenant = name, "no pod holds its units: taken off the table");
                    self.listed_lock().remove(&name);
                }
                Err(e) => {
                    tracing::warn!(tenant = name, "cannot take the tenant off the table: {e:#}")
                }
            }
        }
    }

    /// The server's address as a container sees it, and the mount that
    /// makes it so (a unix socket's folder; nothing for TCP).
    fn server_for_containers(&self) -> (String, Vec<Mount>) {
        match &self.address {
            Address::Unix(path) => {
                let folder = path.parent().unwrap_or(Path::new("/"));
                let file = path
                    .file_name()
                    .map(|f| f.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let inside = self.options.container_socket_dir.join(file);
                let mount = Mount {
                    container_path: self.options.container_socket_dir.display().to_string(),
                    host_path: folder.display().to_string(),
                    read_only: false,
                };
                (format!("unix:{}", inside.display()), vec![mount])
            }
            other => (other.to_string(), Vec::new()),
        }
    }
}

type Devices = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Arc<Plugin> {
    type ListAndWatchStream = Devices;

    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    /// Every unit, healthy, once; the stream then stays open.
    async fn list_and_watch(&self, _: Request<Empty>) -> Result<Response<Devices>, Status> {
        let devices = self
            .units
            .keys()
            .map(|id| Device {
                id: id.clone(),
                health: "Healthy".into(),
                topology: None,
            })
            .collect();
        let first = tokio_stream::iter([Ok(ListAndWatchResponse { devices })]);
        let stream = tokio_stream::StreamExt::chain(first, tokio_stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }

    /// Units of one GPU where they suffice: the must-have ones' GPU first,
    /// else the GPU with the most units available.
    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| ContainerPreferredAllocationResponse {
                device_i_ds: prefer(
                    &r.available_device_i_ds,
                    &r.must_include_device_i_ds,
                    r.allocation_size.max(0) as usize,
                ),
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let plugin = Arc::clone(self);
        let requests = request.into_inner().container_requests;
        let answers = tokio::task::spawn_blocking(move || {
            requests
                .iter()
                .map(|r| plugin.allocate_one(&r.devices_ids))
                .collect::<Result<Vec<_>, Status>>()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(AllocateResponse {
            container_responses: answers,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// `size` units from `available`, `must` first, then from one GPU where it can.
fn prefer(available: &[String], must: &[String], size: usize) -> Vec<String> {
    let mut chosen: Vec<String> = must.to_vec();
    let mut by_gpu: BTreeMap<u32, Vec<&String>> = BTreeMap::new();
    for id in available.iter().filter(|id| !must.contains(id)) {
        by_gpu
            .entry(unit_gpu(id).unwrap_or(u32::MAX))
            .or_default()
            .push(id);
    }
    let first = must.first().and_then(|id| unit_gpu(id));
    let mut gpus: Vec<(u32, Vec<&String>)> = by_gpu.into_iter().collect();
    gpus.sort_by_key(|(gpu, ids)| (Some(*gpu) != first, std::cmp::Reverse(ids.len())));
    for (_, ids) in gpus {
        for id in ids {
            if chosen.len() >= size {
                return chosen;
            }
            chosen.push(id.clone());
        }
    }
    chosen
}

/// Connects a gRPC client to the unix socket `path` (the kubelet's, or a
/// plugin's).
pub async fn unix_channel(path: PathBuf) -> Result<tonic::transport::Channel> {
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    Ok(tonic::transport::Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(connector)
        .await?)
}

/// Every `every`, asks the kubelet which units of `resource` pods hold, and
/// takes off the table the tenants listed at least `every` ago that hold
/// none; the kubelet unreachable, it keeps everything.
async fn collect(
    plugin: Arc<Plugin>,
    socket: PathBuf,
    resource: String,
    every: std::time::Duration,
) {
    use podresources::pod_resources_lister_client::PodResourcesListerClient;
    let mut ticks = tokio::time::interval(every);
    loop {
        ticks.tick().await;
        let listed = async {
            let mut client = PodResourcesListerClient::new(unix_channel(socket.clone()).await?);
            let pods = client
                .list(podresources::ListPodResourcesRequest {})
                .await?
                .into_inner();
            anyhow::Ok(pods)
        }
        .await;
        let pods = match listed {
            Ok(pods) => pods,
            Err(e) => {
                tracing::warn!("cannot ask the kubelet which units pods hold: {e:#}");
                continue;
            }
        };
        let held: BTreeSet<String> = pods
            .pod_resources
            .iter()
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource_name == resource)
            .flat_map(|d| d.device_ids.iter().cloned())
            .collect();
        let plugin = Arc::clone(&plugin);
        let _ = tokio::task::spawn_blocking(move || plugin.forget_unheld(&held, every)).await;
    }
}

/// A connection to the cumux server as the plugin (its admin, where it runs
/// as the server's user or root).
fn admin_connection(address: &Address) -> Result<probe::Connection, probe::ProbeError> {
    probe::connect_as(address, ClientRole::Status, "cumux device-plugin", None)
}

/// The units a server offers, each with its device memory: `--unit` bytes at
/// a time of each device's memory, or each device in `--shares` parts.
fn units_of(address: &Address, options: &PluginOptions) -> Result<BTreeMap<String, u64>> {
    let unit = options.unit;
    if unit == 0 {
        bail!("--unit must be more than 0 bytes");
    }
    let status = admin_connection(address)?.status()?;
    if status.shown != "all" {
        bail!(
            "the cumux server at {address} does not take this plugin for an admin: run it as \
             the server's user or root, on the server's unix socket"
        );
    }
    let per_device = |total: u64| match options.offer {
        Offer::Memory => (total / unit, unit),
        Offer::Share => (options.shares, total / options.shares),
    };
    Ok(status
        .devices
        .iter()
        .flat_map(|d| {
            let (count, bytes) = per_device(d.total_mem);
            (0..count).map(move |i| (unit_id(d.ordinal, i), bytes))
        })
        .collect())
}

/// Serves the plugin until it fails: offers the server's memory, registers
/// with the kubelet, answers its calls.
pub fn run(options: PluginOptions) -> Result<()> {
    let address = options
        .server
        .as_deref()
        .map_or_else(Address::from_env_or_default, Address::parse)
        .map_err(anyhow::Error::msg)?;
    let units = units_of(&address, &options)?;
    let (default_resource, endpoint) = match options.offer {
        Offer::Memory => ("cumux.io/gpu-memory", PLUGIN_SOCKET),
        Offer::Share => ("cumux.io/gpu-share", SHARE_PLUGIN_SOCKET),
    };
    let socket = options.kubelet_dir.join(endpoint);
    let kubelet = options.kubelet_dir.join(KUBELET_SOCKET);
    let resource = options
        .resource
        .clone()
        .unwrap_or_else(|| default_resource.into());
    let count = units.len();
    let gc = options.gc_interval;
    let pod_resources = options.pod_resources.clone();
    let plugin = Arc::new(Plugin {
        address,
        options,
        resource: resource.clone(),
        units,
        listed: Default::default(),
    });
    let collector = Arc::clone(&plugin);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("the plugin's runtime")?;
    runtime.block_on(async move {
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)
            .with_context(|| format!("cannot listen on {}", socket.display()))?;
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let serving = tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming(incoming);
        let serving = tokio::spawn(serving);
        if !gc.is_zero() {
            tokio::spawn(collect(collector, pod_resources, resource.clone(), gc));
        }
        let mut kubelet_client = RegistrationClient::new(
            unix_channel(kubelet.clone())
                .await
                .with_context(|| format!("cannot reach the kubelet at {}", kubelet.display()))?,
        );
        kubelet_client
            .register(RegisterRequest {
                version: API_VERSION.into(),
                endpoint: endpoint.into(),
                resource_name: resource.clone(),
                options: Some(DevicePluginOptions {
                    pre_start_required: false,
                    get_preferred_allocation_available: true,
                }),
            })
            .await
            .context("the kubelet refused the registration")?;
        println!(
            "cumux device-plugin: {count} units of {resource} registered with the kubelet at {}",
            kubelet.display()
        );
        serving.await??;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_ids_name_their_gpu() {
        assert_eq!(unit_id(3, 7), "gpu3-7");
        assert_eq!(unit_gpu("gpu3-7"), Some(3));
        assert_eq!(unit_gpu("gpu3"), None);
        assert_eq!(unit_gpu("gpux-1"), None);
    }

    #[test]
    fn preferred_units_come_from_one_gpu() {
        let ids = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let available = ids(&["gpu0-0", "gpu1-0", "gpu1-1", "gpu1-2", "gpu0-1"]);
        assert_eq!(prefer(&available, &[], 2), ids(&["gpu1-0", "gpu1-1"]));
        let must = ids(&["gpu0-1"]);
        assert_eq!(prefer(&available, &must, 2), ids(&["gpu0-1", "gpu0-0"]));
    }

    #[test]
    fn the_same_units_name_the_same_tenant() {
        let a: BTreeSet<String> = ["gpu0-1", "gpu0-0"].map(String::from).into();
        let b: BTreeSet<String> = ["gpu0-0", "gpu0-1"].map(String::from).into();
        let memory = "cumux.io/gpu-memory";
        assert_eq!(tenant_for(memory, &a), tenant_for(memory, &b));
        assert!(tenant_for(memory, &a).starts_with("pod-"));
        let c: BTreeSet<String> = ["gpu0-2"].map(String::from).into();
        assert_ne!(tenant_for(memory, &a), tenant_for(memory, &c));
        // The same ids of another resource are other units.
        assert_ne!(tenant_for(memory, &a), tenant_for("cumux.io/gpu-share", &a));
    }
}
