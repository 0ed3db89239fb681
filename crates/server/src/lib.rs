//! The cumux server: the single authority over the devices. It accepts client
//! connections, gives each a session with its own handle and allocation tables,
//! runs their stream-ordered work and reports its state for `cumux status`.
//!
//! Map: [`listener`] accepts connections; [`connection`] speaks the wire protocol
//! for one of them; [`session`] checks and executes calls; [`device`] is the
//! backend trait with its backends and the adapters that keep stream order;
//! [`worker`] runs contexts in `cumux worker` processes (both sides of that
//! link); [`status`] keeps the registry of sessions; [`tenants`] says who a
//! connection is and keeps each tenant's memory account; [`gate`] holds launches
//! back until the device's scheduler (`fair`, `priority`) lets them go;
//! [`shutdown`] drains the listener when the server is asked to stop.

pub mod admission;
pub mod connection;
pub mod device;
pub mod device_health;
pub mod failover;
pub mod freed_memory;
pub mod gate;
pub mod groups;
pub mod hangups;
pub mod host_regions;
pub mod ipc;
pub mod lanes;
pub mod listener;
mod locking;
pub mod metrics;
pub mod moves;
pub mod nvml_samples;
pub mod session;
pub mod shutdown;
pub mod sm_parts;
pub mod status;
pub mod tenants;
pub mod threads;
pub mod tls;
pub mod utilization;
pub mod worker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cumux_protocol::{DeviceInfo, ServerStatus};

use tenants::{Accounts, TenantPolicy, TenantSettings};

pub use cumux_scheduler::Policy;
pub use device::Device;
use gate::DeviceGate;
pub use listener::{Address, BoundListener};

/// A device a session may use, with what its handshake says of it.
pub type SeenDevice = (Arc<dyn Device>, DeviceInfo);

/// Everything sessions share: the devices, the registry, the clock.
pub struct Server {
    name: String,
    devices: Vec<Arc<dyn Device>>,
    registry: status::Registry,
    started: Instant,
    next_session: AtomicU64,
    /// The tenant table; an admin may change it while the server runs
    /// ([`Server::put_tenant`]): a hello reads the table as it is then.
    tenants: std::sync::RwLock<Arc<TenantPolicy>>,
    /// What the connections hold against the session limits.
    seats: Arc<admission::Seats>,
    /// Watches connections for their client hanging up; `None` where the
    /// system would not give an epoll set (then a hang-up is seen only when
    /// the connection's thread next reads).
    hangups: Option<Arc<hangups::Hangups>>,
    accounts: Arc<Accounts>,
    /// Each device's scheduling policy, in device order.
    policies: Vec<Policy>,
    /// One per device, in device order; `None` under `fifo`, which needs no gate.
    gates: Vec<Option<Arc<DeviceGate>>>,
    /// Programs' groups of sessions, one per program across its devices.
    groups: groups::Groups,
    /// The memory handles sessions gave out (`cuIpcGetMemHandle`).
    ipc: ipc::IpcHandles,
    /// Orders to move, checkpoint or restore sessions, waiting for them.
    orders: moves::Orders,
    /// Each tenant's utilization of each device, sampled on a thread.
    utilization: Arc<utilization::Utilization>,
    /// NVIDIA's per-process samples, for GPUs whose work the server does not time.
    process_samples: nvml_samples::ProcessSamples,
    /// Which devices failed, and where their sessions go.
    health: device_health::DeviceHealth,
    /// The sessions whose lanes may join them.
    lanes: lanes::LaneRegistry,
}

impl Server {
    /// A server over `devices` (ordinals are their positions) that lets every
    /// tenant in with everything.
    pub fn new(devices: Vec<Arc<dyn Device>>) -> Arc<Self> {
        Self::with_tenants(devices, TenantPolicy::default())
    }

    /// A server over `devices` whose tenants are those `tenants` admits.
    pub fn with_tenants(devices: Vec<Arc<dyn Device>>, tenants: TenantPolicy) -> Arc<Self> {
        Self::with_policy(devices, tenants, Policy::Fifo)
    }

    /// A server over `devices` whose tenants are those `tenants` admits, with a
    /// scheduler of `policy` on every device.
    pub fn with_policy(
        devices: Vec<Arc<dyn Device>>,
        tenants: TenantPolicy,
        policy: Policy,
    ) -> Arc<Self> {
        let policies = vec![policy; devices.len()];
        Self::with_policies(devices, tenants, policies)
    }

    /// A server over `devices` whose tenants are those `tenants` admits, each
    /// device scheduled by its own policy (`policies[i]` for `devices[i]`).
    /// `fifo` builds no scheduler: launches go to the device as their streams
    /// reach them, at no cost.
    pub fn with_policies(
        devices: Vec<Arc<dyn Device>>,
        tenants: TenantPolicy,
        policies: Vec<Policy>,
    ) -> Arc<Self> {
        Self::with_failover(devices, tenants, policies, Default::default())
    }

    /// [`Server::with_policies`], with what it does when a device fails:
    /// `failover.reserve` (a position in `devices`) is offered to no
    /// program, only taken as a move's target.
    pub fn with_failover(
        devices: Vec<Arc<dyn Device>>,
        tenants: TenantPolicy,
        policies: Vec<Policy>,
        failover: device_health::Failover,
    ) -> Arc<Self> {
        assert_eq!(
            policies.len(),
            devices.len(),
            "one scheduling policy per device"
        );
        let gates = devices
            .iter()
            .zip(&policies)
            .map(|(d, &policy)| {
                if policy == Policy::Fifo {
                    return None;
                }
                // A GPU's sessions queue launches on its streams (completion signals
                // tell the gate when they are done); other devices run one at a time.
                let backend = &d.info().backend;
                let config = match backend.as_str() {
                    "cuda" => gate::queued_scheduler_config(policy, d.time_slices_sessions()),
                    _ => gate::scheduler_config(policy, gate::concurrency_for(backend)),
                };
                Some(
                    DeviceGate::new(config, gate::monotonic_clock())
                        .expect("the server's scheduler configuration is valid"),
                )
            })
            .collect();
        let server = Arc::new(Server {
            utilization: Arc::default(),
            process_samples: nvml_samples::ProcessSamples::default(),
            health: device_health::DeviceHealth::new(failover),
            lanes: lanes::LaneRegistry::default(),
            policies,
            gates,
            groups: groups::Groups::default(),
            ipc: ipc::IpcHandles::default(),
            orders: moves::Orders::default(),
            seats: admission::Seats::new(tenants.limits),
            hangups: hangups::Hangups::new()
                .map_err(|e| tracing::error!("no hang-up watcher: {e}"))
                .ok(),
            tenants: std::sync::RwLock::new(Arc::new(tenants)),
            accounts: Arc::new(Accounts::default()),
            name: format!("cumux {}", env!("CARGO_PKG_VERSION")),
            devices,
            registry: status::Registry::default(),
            started: Instant::now(),
            next_session: AtomicU64::new(1),
        });
        let readings = Arc::downgrade(&server);
        server
            .utilization
            .start(readings, Server::utilization_readings);
        server
    }

    /// The device time of each (tenant, device) pair with sessions now: the
    /// gate's charges where the device has a gate, else each session's time
    /// as the server's threads measured it; where they do not time it all (a
    /// GPU under fifo), NVIDIA's samples of the processes that run the
    /// pair's sessions, where each runs only its program's work.
    fn utilization_readings(&self) -> Vec<utilization::Reading> {
        let mut pairs: std::collections::BTreeMap<(String, u32), utilization::Reading> =
            Default::default();
        // Each pair's processes; `None` once one of its sessions shares one.
        let mut processes: std::collections::BTreeMap<(String, u32), Option<Vec<u32>>> =
            Default::default();
        for entry in self.registry.entries() {
            let own = processes
                .entry((entry.tenant.clone(), entry.device))
                .or_insert_with(|| Some(Vec::new()));
            match entry.context.upgrade().map(|c| c.process()) {
                Some(device::WorkProcess::Own(pid)) => {
                    if let Some(pids) = own {
                        pids.push(pid);
                    }
                }
                Some(device::WorkProcess::Shared) => *own = None,
                Some(device::WorkProcess::NotStarted) | None => {}
            }
            let gate = self
                .gates
                .get(entry.device as usize)
                .and_then(Option::as_ref);
            let reading = pairs
                .entry((entry.tenant.clone(), entry.device))
                .or_insert_with(|| utilization::Reading {
                    tenant: entry.tenant.clone(),
                    device: entry.device,
                    // The gate's key never names a session (ids count up from 1).
                    sources: gate
                        .map(|g| vec![(u64::MAX, g.charged_total_ns(&entry.tenant))])
                        .unwrap_or_default(),
                    measured: true,
                    sampled: None,
                });
            if gate.is_some() {
                continue;
            }
            let stats = &entry.stats;
            reading.measured &= stats.timed.load(Ordering::Relaxed);
            let ns = stats.gpu_time_ns.load(Ordering::Relaxed);
            reading.sources.push((entry.session, ns));
        }
        for (key, reading) in pairs.iter_mut().filter(|(_, r)| !r.measured) {
            let Some(Some(pids)) = processes.get(key) else {
                continue;
            };
            let Some(device) = self.devices.get(reading.device as usize) else {
                continue;
            };
            if device.info().backend == "cuda" {
                reading.sampled = self.process_samples.percent(&device.info().uuid, pids);
            }
        }
        pairs.into_values().collect()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devices
    }

    /// The device descriptions a client receives at the handshake.
    pub fn device_infos(&self) -> Vec<DeviceInfo> {
        self.devices
            .iter()
            .enumerate()
            .map(|(ordinal, d)| DeviceInfo {
                ordinal: ordinal as u32,
                ..d.info().clone()
            })
            .collect()
    }

    /// The devices a tenant sees, renumbered from 0 in server order (like
    /// `CUDA_VISIBLE_DEVICES`), each with its total memory cut to the tenant's
    /// quota: (server device, what the handshake says). Failed devices and
    /// the reserve are left out.
    pub fn devices_for(&self, settings: &TenantSettings) -> Vec<(Arc<dyn Device>, DeviceInfo)> {
        self.devices
            .iter()
            .enumerate()
            .filter(|(ordinal, _)| {
                settings.allows_device(*ordinal as u32) && self.health.offered(*ordinal as u32)
            })
            .enumerate()
            .map(|(seen, (_, d))| {
                let total = d.mem_total();
                let share = settings.memory_quota.map_or(total, |q| q.min(total));
                let info = DeviceInfo {
                    ordinal: seen as u32,
                    total_mem: share,
                    ..d.info().clone()
                };
                (Arc::clone(d), info)
            })
            .collect()
    }

    /// The devices a tenant's program sees: [`Server::devices_for`], narrowed
    /// and ordered by the program's `CUDA_VISIBLE_DEVICES` (`visible`, as
    /// NVIDIA's driver reads it) and renumbered from 0; the first is its
    /// session's device. Also why the list ended early, if it did.
    pub fn devices_seen(
        &self,
        settings: &TenantSettings,
        visible: Option<&str>,
    ) -> (Vec<SeenDevice>, Option<String>) {
        let offered = self.devices_for(settings);
        let Some(text) = visible else {
            return (self.peers_as_seen(offered), None);
        };
        let uuids: Vec<[u8; 16]> = offered.iter().map(|(_, info)| info.uuid).collect();
        let selection = cumux_protocol::visible_devices::select(text, &uuids);
        let seen = selection
            .chosen
            .iter()
            .enumerate()
            .map(|(seen, &index)| {
                let (device, info) = &offered[index];
                let info = DeviceInfo {
                    ordinal: seen as u32,
                    ..info.clone()
                };
                (Arc::clone(device), info)
            })
            .collect();
        (self.peers_as_seen(seen), selection.stopped)
    }

    /// `seen` with each device's peers numbered as the program sees its
    /// devices, those it does not see left out.
    fn peers_as_seen(&self, mut seen: Vec<SeenDevice>) -> Vec<SeenDevice> {
        let ordinals: Vec<Option<u32>> = seen.iter().map(|(d, _)| self.position_of(d)).collect();
        for (device, info) in &mut seen {
            info.peers = device
                .info()
                .peers
                .iter()
                .filter_map(|(ordinal, attrs)| {
                    let index = ordinals.iter().position(|o| *o == Some(*ordinal))?;
                    Some((index as u32, *attrs))
                })
                .collect();
        }
        seen
    }

    /// Each device's scheduling policy, in device order.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The scheduling gate of `device` (one of this server's), if its policy has one.
    pub fn gate_of(&self, device: &Arc<dyn Device>) -> Option<&Arc<DeviceGate>> {
        self.position_of(device)
            .and_then(|i| self.gates[i as usize].as_ref())
    }

    pub fn hangups(&self) -> Option<&Arc<hangups::Hangups>> {
        self.hangups.as_ref()
    }

    /// The sessions that take lanes.
    pub fn lanes(&self) -> &lanes::LaneRegistry {
        &self.lanes
    }

    pub fn seats(&self) -> &Arc<admission::Seats> {
        &self.seats
    }

    /// The tenant table now.
    pub fn tenants(&self) -> Arc<TenantPolicy> {
        Arc::clone(&self.tenants.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Lists tenant `name` with `settings` (replacing its entry, if any) while
    /// the server runs. Its memory quota holds for its open sessions too (past
    /// it, allocations are refused; memory held stays); the rest of the entry
    /// (weight, class, devices) for sessions that open from now on. A table this would make
    /// invalid (a weak or reused token, a reserved name) stays as it was.
    pub fn put_tenant(&self, name: &str, settings: TenantSettings) -> Result<(), String> {
        if name.chars().any(char::is_control) {
            return Err(format!("tenant name {name:?} has a control character"));
        }
        let quota = settings.memory_quota;
        self.change_tenants(|t| {
            t.tenants.insert(name.to_string(), settings);
            Ok(())
        })?;
        // The quota is the tenant's, across its sessions: it holds for those
        // open too.
        self.accounts.set_quota(name, quota);
        Ok(())
    }

    /// Takes tenant `name` off the table: its open sessions run on; new
    /// hellos naming it are admitted as an unlisted name would be.
    pub fn remove_tenant(&self, name: &str) -> Result<(), String> {
        self.change_tenants(|t| match t.tenants.remove(name) {
            Some(_) => Ok(()),
            None => Err(format!("no tenant {name:?} is listed")),
        })
    }

    fn change_tenants(
        &self,
        change: impl FnOnce(&mut TenantPolicy) -> Result<(), String>,
    ) -> Result<(), String> {
        let mut table = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        let mut next = TenantPolicy::clone(&table);
        change(&mut next)?;
        next.validate()?;
        *table = Arc::new(next);
        Ok(())
    }

    pub fn accounts(&self) -> &Arc<Accounts> {
        &self.accounts
    }

    pub fn registry(&self) -> &status::Registry {
        &self.registry
    }

    pub fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn groups(&self) -> &groups::Groups {
        &self.groups
    }

    pub fn ipc(&self) -> &ipc::IpcHandles {
        &self.ipc
    }

    pub fn orders(&self) -> &moves::Orders {
        &self.orders
    }

    pub fn health(&self) -> &device_health::DeviceHealth {
        &self.health
    }

    /// " (device N has failed: why; ...)" where devices have failed, for
    /// a refusal that found no device.
    pub fn failed_devices_note(&self) -> String {
        let failed: Vec<String> = (0..self.devices.len() as u32)
            .filter_map(|d| {
                self.health
                    .failure(d)
                    .map(|f| format!("device {d} has failed: {}", f.reason))
            })
            .collect();
        match failed.is_empty() {
            true => String::new(),
            false => format!(" ({})", failed.join("; ")),
        }
    }

    /// The position of `device` among the server's devices.
    pub fn position_of(&self, device: &Arc<dyn Device>) -> Option<u32> {
        self.devices
            .iter()
            .position(|d| Arc::ptr_eq(d, device))
            .map(|i| i as u32)
    }

    fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }
}

/// A snapshot of `server` for `cumux status`.
pub fn server_status(server: &Server, scope: &status::StatusScope) -> ServerStatus {
    status::snapshot(status::ServerView {
        name: &server.name,
        uptime: server.uptime(),
        devices: &server.devices,
        policies: &server.policies,
        gates: &server.gates,
        registry: &server.registry,
        accounts: &server.accounts,
        seats: &server.seats,
        scope,
        orders: &server.orders,
        utilization: &server.utilization,
        health: &server.health,
    })
}
