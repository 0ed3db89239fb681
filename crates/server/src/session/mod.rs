//! One client's session: its handle tables (streams, events, modules, functions)
//! and allocations, the check of every handle and pointer it sends, the execution
//! of its calls through one stream order, its sticky errors and printf output,
//! and its clean-up. Each child module holds one part of the calls' work.

mod aliases;
mod array_tables;
mod arrays;
mod checkpoints;
mod core;
mod file_writeback;
mod graphs;
pub mod image;
mod image_pipeline;
pub mod image_stream;
mod ipc;
mod memory;
mod memory_pipe;
mod modules;
mod moving;
mod order;
mod preparing;
mod resuming;
mod signalling;
mod stage_times;
mod staged;
mod streams;
mod submit;
mod vmm;
mod vmm_tables;
mod waits;
pub mod window;

use crate::sm_parts::SmPart;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cumux_protocol::{codes, Call, CuError, DevicePtr, GraphLaunch, Handle, Hello, ReplyBody};

use self::core::{err, release_failed, SessionCore};
use self::signalling::SIGNAL_EVERY;
use crate::device::signals::StreamSignals;
use crate::device::socket_bytes::{FillBytes, SendBytes};
use crate::device::{
    Device, DeviceContext, KernelDesc, KernelLaunch, MemFill, ModuleId, StreamOrdered,
};
use crate::gate::{GateSession, SchedStreams};
use crate::host_regions::HostRegions;
use crate::moves::Action;
use crate::server_status;
use crate::status::{SessionEntry, SessionStats, StatusScope};
use crate::tenants::{AccountHold, TenantClass, TenantSettings};
use crate::threads::{LaunchMeter, ThreadedStreams};
use crate::Server;
use cumux_protocol::launch_checks::LaunchLimits;

pub use self::core::MAX_STDOUT_BYTES;

/// The first handle a program's first session issues
/// ([`cumux_protocol::first_handle`]): a confused client gets
/// CUDA_ERROR_INVALID_HANDLE rather than somebody's stream.
pub const FIRST_HANDLE: Handle = cumux_protocol::first_handle(0);
pub use self::order::STREAM_THREADS_ENV;
pub use self::preparing::{room_to_grow, ROOM_TO_GROW};
pub use cumux_protocol::MAX_STREAMS;

/// The longest an admin's order waits for its session's next call.
const MAX_ORDER_WAIT_MS: u64 = 60_000;

/// The longest reason an admin may give for a device's failure, in bytes.
const MAX_REASON_BYTES: usize = 512;

/// The most urgent stream priority (the device clamps it to its own range).
const HIGHEST_PRIORITY: i32 = -1000;

type CallResult = Result<ReplyBody, CuError>;

struct ModuleEntry {
    id: ModuleId,
    functions: Vec<Handle>,
    globals: Vec<DevicePtr>,
    /// The image it was loaded from, to load it again where the session moves.
    image: Arc<Vec<u8>>,
}

/// What a hang-up cancels: the session's context and gate of the moment.
type CancelTarget = Arc<std::sync::Mutex<(Arc<dyn DeviceContext>, Option<Arc<GateSession>>)>>;

struct FunctionEntry {
    module: ModuleId,
    index: usize,
    desc: KernelDesc,
}

/// A large copy's bytes where the device takes or gives them in place.
pub enum SocketCopy<'a> {
    /// A `MemcpyHtoD` sent with empty `data`: its bytes, this many, still on
    /// the client's socket, read by the function (piece after piece).
    Incoming(usize, &'a mut FillBytes<'a>),
    /// Where a `MemcpyDtoH`'s bytes go (the client's socket, after the
    /// reply's header), for a read that succeeds.
    Outgoing(&'a mut dyn SendBytes),
}

/// One client connection's view of the server.
pub struct Session {
    server: Arc<Server>,
    device: Arc<dyn Device>,
    /// The session's own address space and modules on the device.
    ctx: Arc<dyn DeviceContext>,
    /// Stream order over `ctx` where the context keeps none of its own (the
    /// in-process CPU device) or cannot signal completions to a gate.
    threads: Option<ThreadedStreams>,
    /// Module globals a move put elsewhere: the program's addresses of them.
    aliases: aliases::Aliases,
    /// A move whose target is being made ready while the session runs on.
    preparing: Option<preparing::Preparing>,
    core: SessionCore,
    entry: Option<Arc<SessionEntry>>,
    /// The tenant's memory account; `None` for status queries, which may make
    /// no other call.
    account: Option<AccountHold>,
    /// Bytes of module globals charged to the tenant, by module handle.
    module_bytes: HashMap<Handle, u64>,
    /// The session's streams, besides the default one: their flags and priority.
    streams: HashMap<Handle, (u32, i32)>,
    /// The session's events and their `CU_EVENT_*` flags.
    events: HashMap<Handle, u32>,
    /// Whether queuing failed at once since the device was last asked to
    /// synchronize (the failure waits there): then synchronizes ask it.
    enqueue_failed: Cell<bool>,
    /// Whether its stream order holds posted work back for the next call that
    /// waits ([`Session::hold_posts`]).
    posts_held: Cell<bool>,
    /// The worker's error counter ([`ERROR_SLOT`](crate::device::signals::ERROR_SLOT))
    /// when last looked at.
    worker_errors_seen: Cell<u64>,
    /// How long a synchronize waits for completion signals before it asks the
    /// device; zero where the signals do not answer synchronizes.
    signal_wait: std::time::Duration,
    /// Whether stream-ordered work was queued since the last context
    /// synchronize that succeeded: if not, the next one has nothing to wait for.
    queued_since_sync: Cell<bool>,
    next_handle: Handle,
    /// The device this session is for, numbered as its program numbers its
    /// devices (of every server): its handles and calls name it so.
    index: u32,
    /// The program's group (driver sessions).
    group: Option<Arc<crate::groups::ProgramGroup>>,
    /// Allocations made by this session: base → size.
    allocations: BTreeMap<DevicePtr, u64>,
    /// Module globals of this session: base → size.
    globals: BTreeMap<DevicePtr, u64>,
    /// Other programs' allocations this session opened (`cuIpcOpenMemHandle`):
    /// base → size. Its calls may name them; its tenant is not charged.
    ipc_opened: BTreeMap<DevicePtr, u64>,
    /// Reservations, physical allocations and mappings (`cuMemMap` …).
    vmm: vmm_tables::VmmTables,
    /// CUDA arrays, mipmapped arrays, texture and surface objects.
    arrays: array_tables::ArrayTables,
    modules: HashMap<Handle, ModuleEntry>,
    functions: HashMap<Handle, FunctionEntry>,
    /// The device's launch limits, looked up once (every launch is checked against them).
    limits: LaunchLimits,
    /// Graphs of launches ([`Call::GraphCreate`]), checked.
    graphs: HashMap<Handle, Vec<KernelLaunch>>,
    /// The session's place at its device's scheduling gate; `None` under `fifo`
    /// and for status queries.
    gate: Option<Arc<GateSession>>,
    /// The scheduler's name of each stream that has launched: unique server-wide.
    sched_streams: SchedStreams,
    /// The completion signals of the session's queued work: they tell the gate
    /// when each launch is done, and answer synchronizes without the device.
    signals: Option<StreamSignals>,
    /// The priority the session's streams get on the device under `priority`
    /// (latency-critical first), instead of the one the client asked for.
    forced_priority: Option<i32>,
    /// Launches per signal (see [`SIGNAL_EVERY`]); 1 for a latency-critical tenant.
    signal_every: u64,
    /// Whether the tenant's class is latency-critical.
    latency_critical: bool,
    /// Whether a kernel watchdog reads the session's signals for progress: its
    /// streams are then signalled every [`SIGNAL_EVERY`] launches under `fifo` too.
    watched: bool,
    /// Set when the client hangs up ([`Session::canceller`]): a launch held
    /// back by the launch window stops waiting.
    hung_up: Arc<std::sync::atomic::AtomicBool>,
    /// The key its client resumes it by (`Hello::resume`); 0: its client
    /// cannot resume.
    resume_key: u64,
    /// The `seq` of the call being handled (the connection sets it).
    seq: u64,
    /// Set when the session ends after the call's reply (it moved away).
    leaving: bool,
    /// An admin connection's checkpoint image, read in pieces (`staged`).
    staged_out: std::cell::RefCell<Vec<u8>>,
    /// An image an admin connection writes in pieces (`staged`).
    staged_in: std::cell::RefCell<Vec<u8>>,
    /// The client's pinned host regions.
    host: HostRegions,
    /// The memfd that came with the call being handled (`HostRegister`).
    incoming_fd: Option<Result<OwnedFd, String>>,
    /// The descriptor the reply to the call being handled carries
    /// (`VmmCall::Export`).
    outgoing_fd: Option<OwnedFd>,
    /// Whose sessions and tenants this client's status calls show.
    status_scope: StatusScope,
    /// The tenant's name and settings (`None` for status queries).
    tenant: Option<(String, TenantSettings)>,
    /// What a hang-up cancels ([`Session::canceller`]); a move changes it.
    cancel_target: CancelTarget,
}

/// Tells the session's statistics, and its tenant's account where no gate
/// charges the tenant for the launch already (`gated`), the device time of each
/// launch that the server's own stream threads time.
fn launch_meter(
    stats: &Arc<SessionStats>,
    account: Option<&AccountHold>,
    gated: bool,
) -> LaunchMeter {
    stats.timed.store(true, Ordering::Relaxed);
    let stats = Arc::clone(stats);
    let account = account
        .filter(|_| !gated)
        .map(|hold| Arc::clone(hold.account()));
    Box::new(move |ns| {
        stats.gpu_time_ns.fetch_add(ns, Ordering::Relaxed);
        if let Some(account) = &account {
            account.record_gpu_time(ns);
        }
    })
}

/// A session's one stream order: its own threads over the context, else the
/// context's own order.
fn stream_order<'a>(
    threads: &'a Option<ThreadedStreams>,
    ctx: &'a Arc<dyn DeviceContext>,
) -> Result<&'a dyn StreamOrdered, CuError> {
    match threads {
        Some(threads) => Ok(threads),
        None => ctx
            .stream_ordered()
            .ok_or_else(|| err(codes::UNKNOWN, "the device keeps no stream order")),
    }
}

/// The server's device that is device `local` of `group`'s program, unless
/// it has failed since the program started.
fn joined_device(
    server: &Server,
    group: &crate::groups::ProgramGroup,
    local: u32,
) -> Result<Arc<dyn Device>, CuError> {
    let position = group.device(local).ok_or_else(|| {
        err(
            codes::INVALID_DEVICE,
            format!(
                "device {local} of a program that sees {} here",
                group.device_count()
            ),
        )
    })?;
    if let Some(failure) = server.health().failure(position) {
        return Err(err(
            codes::DEVICE_UNAVAILABLE,
            format!(
                "the program's device {local} (the server's device {position}) has failed: {}",
                failure.reason
            ),
        ));
    }
    server
        .devices()
        .get(position as usize)
        .cloned()
        .ok_or_else(|| {
            err(
                codes::INVALID_DEVICE,
                format!("the server has no device {position}"),
            )
        })
}

impl Session {
    /// Opens a session for a client that said `hello`, admitted as `tenant`
    /// (name and settings; `None` for a status query). Driver sessions appear
    /// in `cumux status`; status queries do not. The session's device is the
    /// first the tenant may see.
    pub fn open(
        server: Arc<Server>,
        hello: &Hello,
        tenant: Option<(String, TenantSettings)>,
    ) -> Result<Self, CuError> {
        // The program's first connection is for its first device; a further
        // one names the device it is for (as this server numbers them, and
        // as the program does) and the program's group here.
        let (local, index) = hello
            .join
            .map_or((0, 0), |join| (join.device, join.ordinal));
        let (device, account, group) = match &tenant {
            Some((name, settings)) => {
                let (device, group) = match hello.join {
                    Some(join) if join.group != cumux_protocol::NEW_GROUP => {
                        let group = server
                            .groups()
                            .join(join.group, name)
                            .map_err(|why| err(codes::INVALID_VALUE, why))?;
                        (joined_device(&server, &group, local)?, group)
                    }
                    _ => {
                        let (seen, stopped) =
                            server.devices_seen(settings, hello.visible_devices.as_deref());
                        let positions = seen
                            .iter()
                            .filter_map(|(d, _)| server.position_of(d))
                            .collect();
                        let count = seen.len();
                        let (device, _) = seen.into_iter().nth(local as usize).ok_or_else(|| {
                            let why = match hello.visible_devices.as_deref() {
                                _ if count > 0 => format!(
                                    "device {local} of a program that sees {count} here (tenant {name:?})"
                                ),
                                Some(text) => format!(
                                    "CUDA_VISIBLE_DEVICES={text:?} shows tenant {name:?} none of its devices{}",
                                    stopped.map_or_else(String::new, |why| format!(": {why}"))
                                ),
                                None => format!("tenant {name:?} may use no device of this server{}", server.failed_devices_note()),
                            };
                            let code = if count > 0 { codes::INVALID_DEVICE } else { codes::NO_DEVICE };
                            err(code, why)
                        })?;
                        (device, server.groups().open(name, positions))
                    }
                };
                (
                    device,
                    Some(server.accounts().join(name, settings)),
                    Some(group),
                )
            }
            None => (
                server
                    .devices()
                    .first()
                    .cloned()
                    .ok_or_else(|| err(codes::NO_DEVICE, "the server has no device"))?,
                None,
                None,
            ),
        };
        let ctx = match &group {
            Some(group) => {
                let ctx = device.create_context_in(&group.contexts)?;
                group.add_member(index, &ctx);
                ctx
            }
            None => device.create_context()?,
        };
        if let Some((name, settings)) = &tenant {
            ctx.set_tenant(name, settings.trusted);
            if let Some(percent) = settings.sm_percent {
                let policy = server.tenants();
                let placed = crate::sm_parts::SmPlacement::of(&policy);
                let part = placed.part_of(&policy, name).unwrap_or(SmPart {
                    from: 0,
                    to: percent,
                });
                ctx.set_sm_cap(part).map_err(|e| {
                    err(
                        e.code,
                        format!("tenant {name:?} has sm_percent = {percent}: {}", e.detail),
                    )
                })?;
            }
        }
        let id = server.next_session_id();
        let gate = match (&tenant, server.gate_of(&device)) {
            (Some((name, settings)), Some(gate)) => {
                Some(Arc::new(gate.join(name, settings, id).map_err(|e| {
                    err(codes::OUT_OF_MEMORY, format!("scheduler: {e}"))
                })?))
            }
            _ => None,
        };
        let stats = Arc::new(SessionStats::default());
        let entry = (hello.role == cumux_protocol::ClientRole::Driver).then(|| {
            Arc::new(SessionEntry {
                session: id,
                pid: hello.pid,
                program: hello.program.clone(),
                tenant: tenant
                    .as_ref()
                    .map_or_else(|| crate::tenants::DEFAULT_TENANT.into(), |t| t.0.clone()),
                device: device.info().ordinal,
                stats: Arc::clone(&stats),
                context: Arc::downgrade(&ctx),
            })
        });
        let forced_priority = match (&gate, &tenant) {
            (Some(g), Some((_, settings)))
                if matches!(g.gate().policy(), cumux_scheduler::Policy::Priority(_)) =>
            {
                Some(match settings.class {
                    TenantClass::LatencyCritical => HIGHEST_PRIORITY,
                    TenantClass::Batch => 0,
                })
            }
            _ => None,
        };
        let latency_critical = tenant
            .as_ref()
            .is_some_and(|(_, s)| s.class == TenantClass::LatencyCritical);
        let order::Order {
            threads,
            signals,
            watched,
            signal_wait,
        } = order::stream_order(
            &ctx,
            id,
            entry.is_some(),
            gate.as_ref(),
            || launch_meter(&stats, account.as_ref(), gate.is_some()),
            forced_priority,
            latency_critical,
        )?;
        // A driver sees its own tenant in status until the connection says
        // it may see more (`Session::set_status_scope`).
        let status_scope = match &tenant {
            Some((name, _)) => StatusScope::Tenant(name.clone()),
            None => StatusScope::Devices,
        };
        // Under `fair` every launch is signalled: a completion seen late bills its
        // tenant for the kernels that ran meanwhile (`Charging::Oldest`), which
        // starved tenants of 5 µs kernels on the H100.
        let fair = gate
            .as_ref()
            .is_some_and(|g| matches!(g.gate().policy(), cumux_scheduler::Policy::Fair(_)));
        let signal_every = if latency_critical || fair {
            1
        } else {
            SIGNAL_EVERY
        };
        let limits = LaunchLimits::of(&device.info().attributes);
        if let Some(entry) = &entry {
            server.registry().insert(Arc::clone(entry));
        }
        let cancel_target = Arc::new(std::sync::Mutex::new((Arc::clone(&ctx), gate.clone())));
        Ok(Session {
            server,
            device,
            ctx,
            threads,
            aliases: aliases::Aliases::default(),
            preparing: None,
            core: SessionCore::new(
                id,
                stats,
                account.as_ref().map(|h| Arc::clone(h.account().counters())),
            ),
            entry,
            account,
            module_bytes: HashMap::new(),
            streams: HashMap::new(),
            events: HashMap::new(),
            next_handle: cumux_protocol::first_handle(index),
            index,
            group,
            allocations: BTreeMap::new(),
            ipc_opened: BTreeMap::new(),
            globals: BTreeMap::new(),
            vmm: vmm_tables::VmmTables::default(),
            arrays: array_tables::ArrayTables::default(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            limits,
            graphs: HashMap::new(),
            gate,
            sched_streams: SchedStreams::default(),
            signals,
            forced_priority,
            signal_every,
            queued_since_sync: Cell::new(false),
            enqueue_failed: Cell::new(false),
            posts_held: Cell::new(false),
            worker_errors_seen: Cell::new(0),
            signal_wait,
            latency_critical,
            watched,
            hung_up: Arc::default(),
            resume_key: Session::resume_key_for(hello, id),
            seq: 0,
            leaving: false,
            staged_out: Default::default(),
            staged_in: Default::default(),
            host: HostRegions::default(),
            incoming_fd: None,
            outgoing_fd: None,
            status_scope,
            cancel_target,
            tenant,
        })
    }

    /// Whether the session's tenant is latency-critical (its calls are polled for
    /// longer, so the threads that serve them do not sleep between them).
    pub fn latency_critical(&self) -> bool {
        self.latency_critical
    }

    pub fn id(&self) -> u64 {
        self.core.id
    }

    /// The key of the session's program group (0 for status queries).
    pub fn group_key(&self) -> u64 {
        self.group.as_ref().map_or(0, |g| g.key())
    }

    /// Launches run so far and the device time they took, in ms.
    pub fn totals(&self) -> (u64, f64) {
        let stats = &self.core.stats;
        (
            stats.launches.load(Ordering::Relaxed),
            stats.gpu_time_ns.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }

    /// Bytes copied to or from pinned host regions without crossing the wire.
    pub fn zero_copy_bytes(&self) -> u64 {
        self.core.stats.zero_copy_bytes.load(Ordering::Relaxed)
    }

    /// The descriptor (or why there is none) that came with the next call,
    /// a `HostRegister`.
    pub fn give_fd(&mut self, fd: Result<OwnedFd, String>) {
        self.incoming_fd = Some(fd);
    }

    /// The descriptor that came with the call being handled, or why none did.
    fn take_incoming_fd(&mut self) -> Result<OwnedFd, String> {
        self.incoming_fd
            .take()
            .unwrap_or_else(|| Err("none came with the call".into()))
    }

    /// The descriptor the last call's reply carries, if it succeeded with one.
    pub fn take_outgoing_fd(&mut self) -> Option<OwnedFd> {
        self.outgoing_fd.take()
    }

    /// Device printf output gathered since the last call, for the next reply.
    pub fn take_stdout(&self) -> Vec<u8> {
        self.core.take_stdout()
    }

    /// Asks whoever serves the session's calls (its worker) to poll for the
    /// next one for `spin` before it sleeps, as a latency-critical tenant's
    /// session is from its opening: for a caller whose calls come back to
    /// back with little time between (a functions lane).
    pub fn keep_hot(&self, spin: std::time::Duration) {
        if let Ok(ordered) = self.ordered() {
            ordered.keep_hot(spin);
        }
    }

    /// Holds the work the session posts back (`true`) until its next call
    /// that waits for the device, or until `false`, which sends what is held
    /// (`StreamOrdered::hold_posts`): a functions lane's copy in, launches
    /// and read of the outputs reach the worker as one batch, answered once.
    /// Before the session waits on its completion signals (a synchronize
    /// answered from them, the launch window, the gate) what is held goes.
    pub fn hold_posts(&self, on: bool) {
        if self.posts_held.replace(on) != on {
            if let Ok(ordered) = self.ordered() {
                ordered.hold_posts(on);
            }
        }
    }

    /// Sends the work held back ([`Session::hold_posts`]) before a wait that
    /// it may be what ends, holding later work still.
    fn send_held(&self) {
        if self.posts_held.get() {
            if let Ok(ordered) = self.ordered() {
                ordered.hold_posts(false);
                ordered.hold_posts(true);
            }
        }
    }

    /// The session's one stream order (see [`Session::threads`]).
    fn ordered(&self) -> Result<&dyn StreamOrdered, CuError> {
        stream_order(&self.threads, &self.ctx)
    }

    /// The calls about the server rather than the session (a status
    /// connection may make them): their answer; `None` for any other call.
    fn server_call(&self, call: &Call) -> Option<CallResult> {
        Some(match call {
            Call::ServerStatus => Ok(ReplyBody::Status(server_status(
                &self.server,
                &self.status_scope,
            ))),
            Call::TenantPut { name, spec } => self.tenant_put(name, spec.clone()),
            Call::TenantRemove { name } => self.admin().and_then(|()| {
                self.server
                    .remove_tenant(name)
                    .map(|()| ReplyBody::Unit)
                    .map_err(|e| err(codes::INVALID_VALUE, e))
            }),
            Call::SessionMove {
                session,
                device,
                wait_ms,
            } => self.order(*session, Action::MoveTo(*device), *wait_ms),
            Call::SessionCheckpoint {
                session,
                wait_ms,
                hold,
            } => {
                let action = match hold {
                    true => Action::Hold(None),
                    false => Action::Checkpoint(None),
                };
                self.order(*session, action, *wait_ms)
            }
            Call::SessionPark { image } => self.admin().and_then(|()| {
                let image = self.image_or_staged(image)?;
                Session::park(&self.server, image).map(|line| ReplyBody::Data(line.into()))
            }),
            Call::ImageRead { offset, bytes } => {
                self.admin().and_then(|()| self.image_read(*offset, *bytes))
            }
            Call::ImageWrite { offset, data } => {
                self.admin().and_then(|()| self.image_write(*offset, data))
            }
            Call::DeviceHealth { device, failed } => self
                .admin()
                .and_then(|()| self.device_health(*device, failed.clone())),
            Call::SessionRelease { session, moved_to } => self
                .admin()
                .and_then(|()| self.release_held(*session, moved_to.clone())),
            Call::SessionRestore {
                session,
                image,
                wait_ms,
            } => self.admin().and_then(|()| {
                let image = self.image_or_staged(image)?;
                let image = crate::moves::Checkpoint::Bytes(image);
                self.order(*session, Action::Restore(image), *wait_ms)
            }),
            _ => return None,
        })
    }

    /// `Call::SessionMove`, `SessionCheckpoint`, `SessionRestore` (admins
    /// only): the order left for the session, which carries it out at its
    /// next call; waits up to `wait_ms` (at most a minute) for that.
    fn order(&self, session: u64, action: Action, wait_ms: u64) -> CallResult {
        self.admin()?;
        if session == self.id() {
            return Err(err(codes::INVALID_VALUE, "a session cannot order itself"));
        }
        let known = self
            .server
            .registry()
            .entries()
            .iter()
            .any(|e| e.session == session);
        if !known {
            return Err(err(
                codes::INVALID_VALUE,
                format!("no driver session {session} on this server"),
            ));
        }
        let orders = self.server.orders();
        let answer = orders.post(session, action)?;
        let patience = std::time::Duration::from_millis(wait_ms.min(MAX_ORDER_WAIT_MS));
        let said = orders.wait(session, &answer, patience)?;
        // A checkpoint's image (in pieces, when large), or the line saying
        // what was done.
        Ok(self.answer_of(said))
    }

    /// `Call::DeviceHealth` (admins only): device `device` marked failed
    /// (`failed` says why) or healthy again.
    fn device_health(&self, device: u32, failed: Option<String>) -> CallResult {
        let said = match failed {
            Some(reason) if reason.len() > MAX_REASON_BYTES => Err(format!(
                "a reason of {} bytes: at most {MAX_REASON_BYTES}",
                reason.len()
            )),
            Some(reason) => crate::failover::fail_device(&self.server, device, reason, true),
            None => crate::failover::recover_device(&self.server, device),
        };
        said.map(|line| ReplyBody::Data(line.into_bytes()))
            .map_err(|e| err(codes::INVALID_DEVICE, e))
    }

    /// A call of this session got `e`, an error only a broken device
    /// gives: its device is marked failed.
    fn device_failed(&self, e: &CuError) {
        let Some(position) = self.server.position_of(&self.device) else {
            return;
        };
        let reason = format!(
            "session {} got CUDA error {}: {}",
            self.id(),
            e.code,
            e.detail
        );
        if let Err(why) = crate::failover::fail_device(&self.server, position, reason, false) {
            tracing::error!(session = self.id(), "{why}");
        }
    }

    /// `Call::SessionRelease` (admins only): a held session carries on, or
    /// answers that it moved to `moved_to` and ends.
    fn release_held(&self, session: u64, moved_to: Option<String>) -> CallResult {
        let how = match &moved_to {
            Some(address) => crate::moves::Release::MovedTo(address.clone()),
            None => crate::moves::Release::CarryOn,
        };
        self.server.orders().release(session, how)?;
        let line = match moved_to {
            Some(address) => format!("session {session} released: its program goes to {address}"),
            None => format!("session {session} released: it carries on here"),
        };
        Ok(ReplyBody::Data(line.into_bytes()))
    }

    /// Whether this connection is an admin's (it sees every tenant: the
    /// server's own uid, root, or the admin token).
    fn admin(&self) -> Result<(), CuError> {
        match self.status_scope {
            StatusScope::Everything => Ok(()),
            _ => Err(err(
                codes::NOT_PERMITTED,
                "changing tenants needs an admin: the server's own user or root on its unix socket, or its admin_token",
            )),
        }
    }

    /// `Call::TenantPut`: lists or changes a tenant (admins only).
    fn tenant_put(&self, name: &str, spec: cumux_protocol::TenantSpec) -> CallResult {
        self.admin()?;
        let settings = crate::tenants::TenantSettings {
            memory_quota: spec.memory_quota,
            weight: spec.weight,
            class: match spec.latency_critical {
                true => TenantClass::LatencyCritical,
                false => TenantClass::Batch,
            },
            devices: spec.devices,
            uids: spec.uids,
            token: spec.token,
            // The wire's tenant spec carries no trust: only the config file
            // makes a tenant's kernels run unfenced.
            trusted: false,
            // Nor an SM cap: those come with `--sharing isolated`, which
            // the server checks against its config when it starts.
            sm_percent: None,
        };
        self.server
            .put_tenant(name, settings)
            .map_err(|e| err(codes::INVALID_VALUE, e))?;
        tracing::info!(
            session = self.id(),
            tenant = name,
            "tenant listed by an admin"
        );
        Ok(ReplyBody::Unit)
    }

    /// Whose sessions and tenants this client's status calls show.
    pub fn set_status_scope(&mut self, scope: StatusScope) {
        self.status_scope = scope;
    }

    /// What to do when the client is gone while a call may still wait for its
    /// work (run from another thread): the gate drops what the session has
    /// queued there and the context stops its launches (the CPU device's at
    /// its next check; an isolated worker is stopped).
    pub fn canceller(&self) -> impl FnOnce() + Send + 'static {
        let (target, id) = (Arc::clone(&self.cancel_target), self.id());
        let hung_up = Arc::clone(&self.hung_up);
        move || {
            tracing::info!(session = id, "the client hung up: cancelling its work");
            hung_up.store(true, std::sync::atomic::Ordering::Relaxed);
            let (ctx, gate) = crate::locking::lock(&target).clone();
            if let Some(gate) = gate {
                gate.cancel_queued();
            }
            ctx.cancel_launches();
        }
    }

    /// Points the canceller at the session's context and gate of now.
    fn set_cancel_target(&self) {
        *crate::locking::lock(&self.cancel_target) = (Arc::clone(&self.ctx), self.gate.clone());
    }

    /// Lists the session again in status, on its device of now.
    fn reregister(&mut self) {
        if let Some(entry) = &self.entry {
            let moved = Arc::new(SessionEntry {
                session: entry.session,
                pid: entry.pid,
                program: entry.program.clone(),
                tenant: entry.tenant.clone(),
                device: self.device.info().ordinal,
                stats: Arc::clone(&entry.stats),
                context: Arc::downgrade(&self.ctx),
            });
            self.server.registry().insert(Arc::clone(&moved));
            self.entry = Some(moved);
        }
    }

    /// Executes one call. Fire-and-forget calls return `None`: their failures are
    /// sticky and come back from the next synchronizing call.
    pub fn handle(&mut self, call: Call) -> Option<CallResult> {
        self.handle_with(call, None)
    }

    /// [`Session::handle`] of a large copy whose bytes the device takes from
    /// the client's socket, or gives to it, where they lie ([`SocketCopy`]).
    /// Bytes left unread (a call refused before its copy) are the caller's
    /// to skip; bytes sent mean the answer went with them (the call's
    /// result is then `Ok(Unit)`, no reply of its own).
    pub fn handle_socket_copy(&mut self, call: Call, copy: SocketCopy<'_>) -> Option<CallResult> {
        self.handle_with(call, Some(copy))
    }

    fn handle_with(&mut self, call: Call, copy: Option<SocketCopy<'_>>) -> Option<CallResult> {
        if let Some(answer) = self.server_call(&call) {
            return Some(answer);
        }
        if matches!(
            call,
            Call::SessionCheckpointFile { .. } | Call::SessionRestoreFile { .. }
        ) {
            // Server calls too, with the descriptor that came with them.
            return Some(self.file_order(&call));
        }
        if self.account.is_none() {
            // A status connection passed no tenant check: it may only ask for status.
            let refused = err(
                codes::INVALID_CONTEXT,
                "a status connection may only ask for the server's status",
            );
            return (!call.is_fire_and_forget()).then_some(Err(refused));
        }
        if self.entry.is_some() {
            // An admin's order (move, checkpoint, restore) waits for this point.
            if let Some(answer) = self.take_order() {
                return Some(answer);
            }
        }
        let call = match self.aliases.is_empty() {
            true => call,
            false => self.aliases.call(call),
        };
        let fire_and_forget = call.is_fire_and_forget();
        // A settle is unanswered, but waits as a synchronize does.
        let waits = !fire_and_forget || matches!(call, Call::Settle { .. });
        if waits && self.gate.is_some() {
            // Whatever this call waits for, the gate must see the launches finish.
            self.flush_signals();
        }
        let result = match self.core.fatal() {
            Some(fatal) => Err(fatal),
            None => {
                let result = match (call, copy) {
                    (
                        Call::MemcpyHtoD { dst, stream, .. },
                        Some(SocketCopy::Incoming(len, fill)),
                    ) => self.memcpy_htod_filled(dst, len, stream, fill),
                    (Call::MemcpyDtoH { src, bytes, stream }, Some(SocketCopy::Outgoing(send))) => {
                        self.memcpy_dtoh_sent(src, bytes, stream, send)
                    }
                    (call, _) => self.execute(call),
                };
                match &result {
                    Err(e) if codes::is_device_failure(e.code) => self.device_failed(e),
                    _ => {}
                }
                result
            }
        };
        // A memfd that came with a refused call is closed now.
        self.incoming_fd = None;
        if fire_and_forget {
            if let Err(e) = result {
                if self.core.fatal().is_none() {
                    self.core.fail(e);
                }
            }
            None
        } else {
            Some(result)
        }
    }

    fn execute(&mut self, call: Call) -> CallResult {
        match call {
            Call::MemAlloc { device, bytes } => self.mem_alloc(device, bytes),
            Call::MemFree { ptr } => self.mem_free(ptr),
            Call::MemGetInfo { device } => {
                self.check_device(device)?;
                let total = self.device.mem_total();
                let free = total.saturating_sub(self.device.mem_used());
                let (free, total) = match &self.account {
                    Some(hold) => hold.account().mem_info(total, free),
                    None => (free, total),
                };
                Ok(ReplyBody::MemInfo { free, total })
            }
            Call::MemAddressRange { ptr } => self
                .containing(ptr)
                .map(|(base, size)| ReplyBody::Range { base, size })
                .ok_or_else(|| err(codes::NOT_FOUND, format!("{ptr:#x} is in no allocation"))),
            Call::MemcpyHtoD { dst, data, stream } => self.memcpy_htod(dst, data, stream),
            Call::MemcpyDtoH { src, bytes, stream } => self.memcpy_dtoh(src, bytes, stream),
            Call::MemcpyDtoD {
                dst,
                src,
                bytes,
                stream,
            } => self.memcpy_dtod(dst, src, bytes, stream),
            Call::Memset {
                dst,
                value,
                elem_bytes,
                count,
                pitch,
                height,
                stream,
            } => {
                let pattern = self.memset_element(stream, value, elem_bytes)?;
                let fill = MemFill {
                    dst,
                    pattern,
                    count,
                    pitch,
                    height,
                };
                self.memset(fill, stream)
            }
            Call::ModuleLoad { image } => self.module_load(image),
            Call::ModuleUnload { module } => self.module_unload(module),
            Call::Launch {
                function,
                grid,
                block,
                shared_bytes,
                stream,
                params,
                attributes,
            } => {
                let launch = GraphLaunch {
                    function,
                    grid,
                    block,
                    shared_bytes,
                    params,
                    attributes,
                };
                self.launch(stream, launch)
            }
            Call::GraphCreate { launches } => self.graph_create(launches),
            Call::GraphLaunch { graph, stream } => self.graph_launch(graph, stream),
            Call::GraphDestroy { graph } => self.graph_destroy(graph),
            Call::StreamCreate { flags, priority } => self.stream_create(flags, priority, None),
            Call::NewStream {
                handle,
                flags,
                priority,
            } => self.stream_create(flags, priority, Some(handle)),
            Call::StreamDestroy { stream } => self.stream_destroy(stream),
            Call::StreamSynchronize { stream } => self.stream_synchronize(stream),
            Call::StreamQuery { stream } => self.stream_query(stream),
            Call::StreamWaitEvent { stream, event } => self.stream_wait_event(stream, event),
            Call::EventCreate { flags } => self.event_create(flags, None),
            Call::NewEvent { handle, flags } => self.event_create(flags, Some(handle)),
            Call::EventRecord { event, stream } => self.event_record(event, stream),
            Call::Mark {
                event,
                stream,
                region,
                offset,
                value,
            } => self.mark(event, stream, region, offset, value),
            Call::EventQuery { event } => self.event_query(event),
            Call::QueryWithin { query, within_us } => self.query_within(&query, within_us),
            Call::EventSynchronize { event } => self.event_synchronize(event),
            Call::EventElapsed { start, end } => self.event_elapsed(start, end),
            Call::EventDestroy { event } => self.event_destroy(event),
            Call::ContextSynchronize => self.context_synchronize(),
            Call::Settle {
                stream: Some(stream),
            } => self.stream_synchronize(stream),
            Call::Settle { stream: None } => self.context_synchronize(),
            Call::TensorMapEncode { request } => self.tensor_map_encode(request),
            Call::ClusterOccupancy { launch, query } => self.cluster_occupancy(launch, query),
            Call::SetLimit { limit, value } => {
                self.ctx.set_limit(limit, value)?;
                Ok(ReplyBody::Unit)
            }
            call @ (Call::ServerStatus
            | Call::TenantPut { .. }
            | Call::TenantRemove { .. }
            | Call::SessionMove { .. }
            | Call::SessionCheckpoint { .. }
            | Call::SessionPark { .. }
            | Call::SessionRelease { .. }
            | Call::DeviceHealth { .. }
            | Call::ImageRead { .. }
            | Call::ImageWrite { .. }
            | Call::SessionRestore { .. }
            | Call::SessionCheckpointFile { .. }
            | Call::SessionRestoreFile { .. }) => self
                .server_call(&call)
                .unwrap_or_else(|| Err(err(codes::UNKNOWN, "a server call the session took"))),
            // Calls are handled in order: every earlier one is done.
            Call::Fence => Ok(ReplyBody::Unit),
            // The connection takes it where it has lanes.
            Call::Lanes { .. } => Err(err(
                codes::INVALID_VALUE,
                "lanes are for calls on a TCP socket whose welcome offered them",
            )),
            Call::HostRegister {
                base,
                bytes,
                reached,
            } => {
                let fd = self.take_incoming_fd();
                let region = self.host.register(self.ctx.as_ref(), base, bytes, fd)?;
                if reached && self.host.reached_range(base) != Some((base, bytes)) {
                    self.host.unregister(self.ctx.as_ref(), region)?;
                    return Err(CuError::new(
                        codes::NOT_SUPPORTED,
                        format!(
                            "managed memory: the device cannot reach host memory at the \
                             program's address {base:#x} here (a CPU device, or the address is \
                             taken in the worker)"
                        ),
                    ));
                }
                if let (Some(group), Some(mapping)) = (&self.group, self.host.mapping(region)) {
                    group.publish_region(region, mapping);
                }
                Ok(ReplyBody::Handle(region))
            }
            Call::HostUnregister { region } => {
                self.host.span(region, 0, 0)?;
                // Like cuMemFreeHost: work that may still use it finishes first.
                self.drain_all();
                self.host.unregister(self.ctx.as_ref(), region)?;
                if let Some(group) = &self.group {
                    group.withdraw_region(region);
                }
                Ok(ReplyBody::Unit)
            }
            Call::MemcpyHtoDHost {
                dst,
                region,
                offset,
                bytes,
                stream,
            } => self.memcpy_host(dst, region, offset, bytes, stream, true),
            Call::MemcpyDtoHHost {
                src,
                region,
                offset,
                bytes,
                stream,
            } => self.memcpy_host(src, region, offset, bytes, stream, false),
            Call::Vmm(call) => self.vmm_call(call),
            Call::Array(call) => self.array_call(call),
            Call::IpcGetMemHandle { ptr } => self.ipc_get(ptr),
            Call::IpcOpenMemHandle { handle, flags } => self.ipc_open(handle, flags),
            Call::IpcCloseMemHandle { ptr } => self.ipc_close(ptr),
            Call::PeerAccess { peer, enable } => self.peer_access(peer, enable),
            Call::IpcGetEventHandle { event } => self.ipc_get_event(event),
            Call::IpcOpenEventHandle { handle } => self.ipc_open_event(handle),
        }
    }

    fn mint_handle(&mut self) -> Handle {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    fn check_device(&self, device: u32) -> Result<(), CuError> {
        if device == self.index {
            Ok(())
        } else {
            Err(err(
                codes::INVALID_DEVICE,
                format!("device {device} is not this session's device"),
            ))
        }
    }

    /// The result of a synchronizing call: success or the pending error.
    fn sync_result(&self) -> CallResult {
        match self.core.take_error() {
            Some(e) => Err(e),
            None => Ok(ReplyBody::Unit),
        }
    }

    /// Tears the session down: queued work is skipped, running work finishes,
    /// then every module and allocation of the session is released.
    pub fn close(mut self) {
        self.vacate();
    }

    /// Frees everything the session holds, before its connection ends (a
    /// session that moved to another server); [`Session::close`] after it
    /// finds nothing left.
    pub fn vacate(&mut self) {
        // Launches waiting at the gate are dropped, so they hold nobody up; the
        // tenant leaves the scheduler once the session's workers have stopped.
        if let Some(gate) = &self.gate {
            gate.cancel_queued();
            // Its launches on the device may never signal (the context goes away).
            gate.forget_in_flight();
        }
        if let Ok(ordered) = self.ordered() {
            ordered.cancel_queued();
        }
        self.gate = None;
        // The watchdog sees the session's last launches through their signals,
        // so a kernel that never ends cannot hold the teardown forever.
        if self.watched {
            self.flush_signals();
        }
        self.ipc_end();
        if let Some(group) = &self.group {
            group.withdraw_session(self.id());
        }
        if !self.host.is_empty() {
            // Copies into the client's pinned regions end before they go.
            self.drain_all();
            for region in self.host.clear(self.ctx.as_ref()) {
                if let Some(group) = &self.group {
                    group.withdraw_region(region);
                }
            }
        }
        let modules: Vec<ModuleEntry> = self.modules.drain().map(|(_, m)| m).collect();
        let (n_modules, n_allocs) = (modules.len(), self.allocations.len());
        for m in modules {
            self.drop_module(m);
        }
        for (ptr, size) in std::mem::take(&mut self.allocations) {
            if let Err(e) = self.ctx.mem_free(ptr, size) {
                release_failed(self.id(), format_args!("freeing {ptr:#x} at teardown"), &e);
            }
            self.release(size);
        }
        for (_, bytes) in std::mem::take(&mut self.module_bytes) {
            self.release(bytes);
        }
        self.arrays_teardown();
        self.vmm_teardown();
        self.core.stats.mem_used.store(0, Ordering::Relaxed);
        self.core.stats.allocations.store(0, Ordering::Relaxed);
        // Ends this session's hold on the tenant's account.
        self.account = None;
        if let Some(entry) = &self.entry {
            self.server.registry().remove(entry.session);
            self.server.orders().forget(entry.session);
        }
        tracing::debug!(
            session = self.id(),
            modules = n_modules,
            allocations = n_allocs,
            "session closed"
        );
    }
}
