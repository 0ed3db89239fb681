//! The server's registry of live sessions and their counters, and the
//! `ServerStatus` snapshot that `cumux status` shows (devices, sessions and
//! tenants), made from what the server hands it ([`ServerView`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use cumux_protocol::{
    DeviceStatus, LimitsStatus, ServerStatus, SessionStatus, TenantStatus, PROTOCOL_VERSION,
};
use cumux_scheduler::Policy;

use crate::admission::Seats;
use crate::device::{Device, DeviceContext};
use crate::gate::{policy_name, DeviceGate};
use crate::locking::lock;
use crate::moves::Orders;
use crate::tenants::{Accounts, TenantClass};
use crate::utilization::Utilization;

/// Counters a session's threads update as work runs.
#[derive(Debug, Default)]
pub struct SessionStats {
    pub launches: AtomicU64,
    pub gpu_time_ns: AtomicU64,
    pub mem_used: AtomicU64,
    pub allocations: AtomicU64,
    /// Bytes copied to or from pinned host regions, not through the wire.
    pub zero_copy_bytes: AtomicU64,
    /// Whether the server's own threads time the session's work (so that
    /// `gpu_time_ns` is all of it).
    pub timed: AtomicBool,
}

/// Who a session is, for status and logs.
#[derive(Debug)]
pub struct SessionEntry {
    pub session: u64,
    pub pid: u32,
    pub program: String,
    pub tenant: String,
    /// The server's ordinal of the session's device.
    pub device: u32,
    pub stats: Arc<SessionStats>,
    /// The session's context (its process, for NVIDIA's per-process samples).
    pub context: Weak<dyn DeviceContext>,
}

/// Live driver sessions, by id.
#[derive(Debug, Default)]
pub struct Registry {
    sessions: Mutex<BTreeMap<u64, Arc<SessionEntry>>>,
    /// How each session's calls travel (`shm`, `unix`, `tcp`), set by its connection.
    transports: Mutex<BTreeMap<u64, &'static str>>,
    /// Placements held by `cumux run --pool` (`ClientRole::Claim`), by id.
    claims: Mutex<BTreeMap<u64, Claim>>,
    next_claim: AtomicU64,
}

/// A program placed on some devices that may not have connected yet.
#[derive(Debug, Clone)]
struct Claim {
    /// The program's pid, as its sessions' hellos will give it.
    pid: u32,
    /// Server ordinals of the devices it was placed on.
    devices: Vec<u32>,
}

impl Registry {
    pub fn insert(&self, entry: Arc<SessionEntry>) {
        self.lock().insert(entry.session, entry);
    }

    pub fn remove(&self, session: u64) {
        self.lock().remove(&session);
        self.transports_lock().remove(&session);
    }

    /// Records how `session`'s calls travel (while it is registered).
    pub fn set_transport(&self, session: u64, transport: &'static str) {
        if self.lock().contains_key(&session) {
            self.transports_lock().insert(session, transport);
        }
    }

    /// How `session`'s calls travel; `-` before its connection has said.
    pub fn transport(&self, session: u64) -> &'static str {
        self.transports_lock().get(&session).copied().unwrap_or("-")
    }

    fn transports_lock(&self) -> MutexGuard<'_, BTreeMap<u64, &'static str>> {
        lock(&self.transports)
    }

    /// Holds `devices` for the program `pid` until [`Registry::release`].
    pub fn claim(&self, pid: u32, devices: Vec<u32>) -> u64 {
        let id = self.next_claim.fetch_add(1, Ordering::Relaxed);
        lock(&self.claims).insert(id, Claim { pid, devices });
        id
    }

    pub fn release(&self, claim: u64) {
        lock(&self.claims).remove(&claim);
    }

    /// Whether a program `pid` has a session here now.
    pub fn has_session_of(&self, pid: u32) -> bool {
        self.lock().values().any(|e| e.pid == pid)
    }

    /// Claims on device `ordinal` whose program has no session here now.
    fn claims_waiting(&self, ordinal: u32, entries: &[Arc<SessionEntry>]) -> u32 {
        lock(&self.claims)
            .values()
            .filter(|c| c.devices.contains(&ordinal))
            .filter(|c| !entries.iter().any(|e| e.pid == c.pid))
            .count() as u32
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn entries(&self) -> Vec<Arc<SessionEntry>> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<SessionEntry>>> {
        lock(&self.sessions)
    }
}

/// What a status snapshot reads of the server.
/// Whose sessions and tenants a status shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusScope {
    /// Everyone's: the server's own uid, or root, on the unix socket.
    Everything,
    /// One tenant's own.
    Tenant(String),
    /// Devices and limits only.
    Devices,
}

impl StatusScope {
    fn shows(&self, tenant: &str) -> bool {
        match self {
            StatusScope::Everything => true,
            StatusScope::Tenant(own) => own == tenant,
            StatusScope::Devices => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            StatusScope::Everything => "all".into(),
            StatusScope::Tenant(name) => format!("tenant {name}"),
            StatusScope::Devices => "none".into(),
        }
    }
}

pub struct ServerView<'a> {
    pub name: &'a str,
    pub uptime: Duration,
    pub devices: &'a [Arc<dyn Device>],
    /// Each device's scheduling policy, in device order.
    pub policies: &'a [Policy],
    /// Each device's scheduling gate, if its policy has one, in device order.
    pub gates: &'a [Option<Arc<DeviceGate>>],
    pub registry: &'a Registry,
    pub accounts: &'a Accounts,
    pub seats: &'a Seats,
    pub scope: &'a StatusScope,
    pub utilization: &'a Utilization,
    /// Admins' orders under way (moves, checkpoints, restores).
    pub orders: &'a Orders,
    pub health: &'a crate::device_health::DeviceHealth,
}

/// A snapshot of the server for `cumux status`.
pub fn snapshot(server: ServerView<'_>) -> ServerStatus {
    let gates = || server.gates.iter().flatten();
    let entries = server.registry.entries();
    ServerStatus {
        server: server.name.to_string(),
        version: PROTOCOL_VERSION,
        uptime_s: server.uptime.as_secs_f64(),
        devices: server
            .devices
            .iter()
            .zip(server.policies)
            .zip(server.gates)
            .enumerate()
            .map(|(position, ((d, policy), gate))| {
                let info = d.info();
                let turns = gate.as_ref().map(|g| g.turn_stats()).unwrap_or_default();
                DeviceStatus {
                    ordinal: info.ordinal,
                    name: info.name.clone(),
                    uuid: info.uuid,
                    backend: info.backend.clone(),
                    total_mem: d.mem_total(),
                    used_mem: d.mem_used(),
                    policy: policy_name(policy).into(),
                    signalled_launches: gate.as_ref().map_or(0, |g| g.signalled()),
                    turns: turns.turns,
                    turn_idle_held_ns: turns.idle_held_ns,
                    turn_overruns: turns.overruns,
                    sessions: entries.iter().filter(|e| e.device == info.ordinal).count() as u32,
                    claims: server.registry.claims_waiting(info.ordinal, &entries),
                    health: server.health.describe(position as u32),
                }
            })
            .collect(),
        sessions: server
            .registry
            .entries()
            .iter()
            .filter(|e| server.scope.shows(&e.tenant))
            .map(|e| SessionStatus {
                session: e.session,
                pid: e.pid,
                program: e.program.clone(),
                tenant: e.tenant.clone(),
                device: e.device,
                mem_used: e.stats.mem_used.load(Ordering::Relaxed),
                allocations: e.stats.allocations.load(Ordering::Relaxed),
                launches: e.stats.launches.load(Ordering::Relaxed),
                gpu_time_ms: e.stats.gpu_time_ns.load(Ordering::Relaxed) as f64 / 1e6,
                transport: server.registry.transport(e.session).to_string(),
                moving: server.orders.noted(e.session),
            })
            .collect(),
        tenants: server
            .accounts
            .all()
            .iter()
            .filter(|a| server.scope.shows(&a.name))
            .map(|a| TenantStatus {
                name: a.name.clone(),
                sessions: a.sessions(),
                mem_used: a.mem_used(),
                memory_quota: a.memory_quota(),
                weight: a.settings.weight,
                class: match a.settings.class {
                    TenantClass::LatencyCritical => "latency-critical",
                    TenantClass::Batch => "batch",
                }
                .into(),
                sm_percent: a.settings.sm_percent,
                launches: a.launches(),
                // Queued launches are timed by the gate (charged time), the
                // others by the threads that ran them.
                gpu_time_ms: (a.gpu_time_ns()
                    + gates().filter_map(|g| g.charged_ns(&a.name)).sum::<u64>())
                    as f64
                    / 1e6,
            })
            .collect(),
        utilization: server
            .utilization
            .all()
            .into_iter()
            .filter(|u| server.scope.shows(&u.tenant))
            .collect(),
        shown: server.scope.describe(),
        limits: {
            let limits = server.seats.limits();
            LimitsStatus {
                taken: server.seats.taken(),
                sessions: limits.total,
                per_peer: limits.per_peer,
                per_uid: limits.per_uid,
                per_tenant: limits.per_tenant,
            }
        },
    }
}
