//! The scheduling gate of one device: a launch asks it first and waits until the
//! device's [`Scheduler`] (policy `fair` or `priority`) lets it go. Dispatch happens
//! inline under the gate's mutex whenever an item arrives, completes or is cancelled,
//! and waiters time their waits to `next_wakeup`. Two ways to finish an item: a stream
//! thread runs the launch synchronously and reports it ([`GateSession::run`]), or the
//! launch is queued on the device with a completion signal ([`GateSession::admit`],
//! [`GateSession::watch`]) that a watcher thread polls. Under `fifo` the server builds
//! no gate at all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use cumux_scheduler::{
    FairConfig, KernelId, Nanos, Policy, PriorityConfig, SchedError, Scheduler, SchedulerConfig,
    StreamId, TenantClass as SchedClass, TenantConfig, TenantId, WorkId, WorkItem,
};

use crate::device::signals::SignalArea;
use crate::device::StreamWork;
use crate::locking::{lock, wait_timeout};
use crate::tenants::{counted_key, TenantClass, TenantSettings};

/// The scheduler's names for copies and memsets, by kind (launches are named by
/// module and kernel, far below these): each kind's cost is learnt apart.
const TO_DEVICE: KernelId = KernelId(u64::MAX - 1);
const TO_HOST: KernelId = KernelId(u64::MAX - 2);
const DEVICE_COPY: KernelId = KernelId(u64::MAX - 3);
const MEMSET: KernelId = KernelId(u64::MAX - 4);

/// The scheduler's name of `work`: a launch by its device module and kernel
/// (kernels of one tenant cost alike across its sessions; module ids are unique
/// per device), a graph as a kernel of its own, copies and memsets by kind.
/// `None`: work the gate does not schedule (event records and waits, signals, marks).
pub fn kernel_id_of(work: &StreamWork) -> Option<KernelId> {
    Some(match work {
        StreamWork::Launch(l) => KernelId((l.module << 16) ^ l.kernel as u64),
        StreamWork::Graph { graph } => KernelId(graph << 16),
        StreamWork::Write { .. } | StreamWork::HostToDevice { .. } => TO_DEVICE,
        StreamWork::DeviceToHost { .. } => TO_HOST,
        StreamWork::Copy { .. } => DEVICE_COPY,
        StreamWork::Fill(_) => MEMSET,
        StreamWork::Record { .. }
        | StreamWork::Wait { .. }
        | StreamWork::Signal { .. }
        | StreamWork::SignalTo { .. }
        | StreamWork::Mark { .. } => return None,
    })
}

/// The scheduler's name of a device-to-host read.
pub const READ_KERNEL_ID: KernelId = TO_HOST;

/// The gate's name of a synchronous write to the device (as queued writes).
pub const WRITE_KERNEL_ID: KernelId = TO_DEVICE;

/// Source of the scheduler's stream ids. Ids only need to differ among streams
/// with work at the gate at once; wrapping after 2^32 streams is harmless.
static NEXT_SCHED_STREAM: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The scheduler's names of one session's streams, each made at its first use:
/// unique server-wide.
#[derive(Default)]
pub struct SchedStreams(HashMap<cumux_protocol::Handle, StreamId>);

impl SchedStreams {
    pub fn of(&mut self, stream: cumux_protocol::Handle) -> StreamId {
        *self
            .0
            .entry(stream)
            .or_insert_with(|| StreamId(NEXT_SCHED_STREAM.fetch_add(1, Ordering::Relaxed)))
    }

    pub fn forget(&mut self, stream: cumux_protocol::Handle) {
        self.0.remove(&stream);
    }
}

/// Launches a CPU-side device (the CPU reference device, the model) runs at once under
/// `fair` and `priority`: one launch already uses every core, so one loses nothing.
pub const CPU_CONCURRENCY: u32 = 1;
/// Launches a GPU runs at once under `fair` and `priority`: enough in flight to overlap
/// kernels of different streams, few enough that a latency-critical kernel finds little
/// batch work ahead of it (the policy caps batch further while such work is pending).
pub const GPU_CONCURRENCY: u32 = 4;
/// How long a tenant with nothing queued keeps its place under `fair`: longer than a
/// closed-loop client's round trip between two launches (launch, synchronize, launch)
/// on a busy host, so such a client is not treated as gone between its kernels.
pub const IDLE_GRACE_NS: Nanos = 5_000_000;
/// The longest a waiter sleeps before it looks again, whatever the scheduler says: a
/// safety net, never needed for progress.
const MAX_WAIT: Duration = Duration::from_millis(50);
/// How often the watcher looks at the completion signals of queued launches while
/// any is on the device (it sleeps on the gate's condvar while none is).
const WATCH_INTERVAL: Duration = Duration::from_micros(20);
/// Items of one stream queued on a GPU at once under `fair` and `priority`: deep
/// enough that tiny kernels keep the GPU busy, while the policy holds back whoever
/// is ahead.
pub const GPU_STREAM_DEPTH: u32 = 64;
/// Launches queued on a GPU at once under `fair` and `priority`.
pub const GPU_QUEUED_CONCURRENCY: u32 = 1024;
/// Batch launches on a GPU while latency-critical work is active under `priority`:
/// one running and one queued behind it, so the batch stream never waits for a
/// round trip, and a latency-critical kernel (on a high-priority stream) finds at
/// most one batch kernel running beside it.
pub const GPU_BATCH_WHILE_LC: u32 = 2;

/// The names `--policy` and the config's `policy` (global or `[devices.N]`) accept.
pub const POLICIES: [&str; 3] = ["fifo", "fair", "priority"];
/// [`POLICIES`] in a sentence.
pub const POLICY_NAMES: &str = "fifo, fair or priority";

/// A policy by name, with its default parameters.
pub fn parse_policy(name: &str) -> Result<Policy, String> {
    match name.trim() {
        "fifo" => Ok(Policy::Fifo),
        "fair" => Ok(Policy::Fair(FairConfig::default())),
        "priority" => Ok(Policy::Priority(PriorityConfig::default())),
        other => Err(format!(
            "unknown scheduling policy {other:?}: expected {POLICY_NAMES}"
        )),
    }
}

/// The name of a policy, as `cumux status` shows it.
pub fn policy_name(policy: &Policy) -> &'static str {
    match policy {
        Policy::Fifo => "fifo",
        Policy::Fair(_) => "fair",
        Policy::Priority(_) => "priority",
    }
}

/// Launches a device of `backend` may run at once (see the constants).
pub fn concurrency_for(backend: &str) -> u32 {
    if backend == "cuda" {
        GPU_CONCURRENCY
    } else {
        CPU_CONCURRENCY
    }
}

/// The scheduler configuration of a device: the policy, its concurrency, the server's
/// idle grace, and limits wide enough for every stream a session may open (each stream
/// worker, and each session's connection, has at most one item waiting in the gate, so
/// queues never grow past the streams).
pub fn scheduler_config(policy: Policy, concurrency: u32) -> SchedulerConfig {
    let mut config = SchedulerConfig::new(policy, concurrency);
    config.idle_grace_ns = IDLE_GRACE_NS;
    config.limits.max_streams_per_tenant = 8192;
    config.limits.max_queued_per_tenant = 8192;
    config
}

/// The configuration for a device whose launches are queued on it with completion
/// signals (a GPU behind a worker): GPU-like streams ([`GPU_STREAM_DEPTH`]). With
/// `time_sliced` (each session in a context of its own, which the GPU time-slices),
/// `fair` gives tenants the device in turns ([`cumux_scheduler::TurnConfig`]): the
/// GPU's own slicer starves a tenant that keeps little work queued beside tenants
/// that keep much (H200, four tenants, launch-and-wait pacing: the 5 µs tenant got
/// 0.000–0.004 of its alone rate natively and under `fair` without turns).
pub fn queued_scheduler_config(policy: Policy, time_sliced: bool) -> SchedulerConfig {
    let policy = match policy {
        Policy::Priority(mut p) => {
            p.batch_in_flight_while_lc_active = GPU_BATCH_WHILE_LC;
            Policy::Priority(p)
        }
        other => other,
    };
    let mut config = scheduler_config(policy, GPU_QUEUED_CONCURRENCY);
    config.stream_depth = GPU_STREAM_DEPTH;
    // A kernel that fills the GPU runs before the ones queued after it; charging
    // all of a tick to the launch that became ready first bills the kernel that
    // runs (see `Charging::Oldest`; measured on the H100, splitting the tick among
    // everything in flight let a 2 ms tenant keep 97 % of the GPU under `fair`).
    config.charging = cumux_scheduler::Charging::Oldest;
    if time_sliced {
        config.turns = Some(turn_config_from_env());
    }
    config.limits.max_queued_total = 65536;
    config
}

/// `fair`'s turns on a time-sliced GPU: the defaults, or the quantum and the
/// longest idle hold `CUMUX_TURN_QUANTUM_US` and `CUMUX_TURN_HOLD_US` give.
/// A value that is not a number keeps the default, one out of range is
/// clamped; both with a warning that says so.
fn turn_config_from_env() -> cumux_scheduler::TurnConfig {
    let micros = |name: &str| {
        let value = std::env::var(name).ok()?;
        let (us, problem) = turn_micros(&value);
        if let Some(problem) = problem {
            tracing::warn!("{name}={value:?}: {problem}");
        }
        us.map(|us| us * 1_000)
    };
    let mut turns = cumux_scheduler::TurnConfig::default();
    if let Some(ns) = micros("CUMUX_TURN_QUANTUM_US") {
        turns.quantum_ns = ns;
    }
    if let Some(ns) = micros("CUMUX_TURN_HOLD_US") {
        turns.hold_idle_max_ns = ns;
    }
    turns
}

/// The bounds of a turn setting, in microseconds.
const TURN_MICROS: std::ops::RangeInclusive<u64> = 10..=1_000_000;

/// A turn setting's microseconds, if usable, and what was wrong with it.
fn turn_micros(value: &str) -> (Option<u64>, Option<String>) {
    let Ok(us) = value.trim().parse::<u64>() else {
        return (
            None,
            Some("not a whole number of microseconds; the default stays".into()),
        );
    };
    let (lo, hi) = (*TURN_MICROS.start(), *TURN_MICROS.end());
    let kept = us.clamp(lo, hi);
    let problem = (kept != us).then(|| format!("outside {lo}..={hi} µs; {kept} µs is used"));
    (Some(kept), problem)
}

/// A monotonic clock in nanoseconds.
pub type Clock = Box<dyn Fn() -> Nanos + Send + Sync>;

/// The real clock: nanoseconds since the gate was made.
pub fn monotonic_clock() -> Clock {
    let base = Instant::now();
    Box::new(move || u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// Where a held item stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ticket {
    Queued,
    /// Dispatched by the scheduler: the waiter may run it.
    Granted,
    /// Its session ended while it waited: the waiter skips it.
    Cancelled,
}

#[derive(Debug)]
struct Held {
    item: WorkItem,
    session: u64,
    ticket: Ticket,
}

/// A launch queued on the device: done once counter `slot` of `area` reaches `value`.
struct Watched {
    id: WorkId,
    session: u64,
    area: Arc<SignalArea>,
    slot: u32,
    value: u64,
}

/// What [`GateSession::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Dispatched: queue the launch, then [`GateSession::watch`] it. With the cost
    /// the scheduler expects of it (nanoseconds).
    Go(WorkId, Nanos),
    /// The session ended while it waited: skip the launch.
    Skip,
    /// The scheduler refused it (not reachable): run it unscheduled rather than lose it.
    Ungated,
}

#[derive(Debug)]
struct Member {
    id: TenantId,
    sessions: u32,
}

struct GateState {
    scheduler: Scheduler,
    tenants: HashMap<String, Member>,
    next_tenant: u32,
    next_work: u64,
    held: HashMap<WorkId, Held>,
    /// Queued launches on the device, in dispatch order.
    watching: Vec<Watched>,
    /// Launches completed by their signal so far.
    signalled: u64,
    /// The counters one pass of the watcher has read (area address, slot →
    /// value); kept between passes so a pass, under the lock every 20 µs,
    /// allocates nothing.
    seen: Vec<((usize, u32), u64)>,
    watcher_started: bool,
    /// The charge of tenants that left the gate, by name (see
    /// [`DeviceGate::charged_total_ns`]; kept under [`counted_key`]).
    retired: HashMap<String, Nanos>,
}

impl GateState {
    /// Completes the watched items whose signal arrived (or, with `session`, every
    /// item of that session), in dispatch order, so each is the oldest of its stream.
    fn complete_watched(&mut self, now: Nanos, session: Option<u64>) -> bool {
        let mut any = false;
        let GateState {
            scheduler,
            watching,
            signalled,
            seen,
            ..
        } = self;
        // Each counter is read once per pass: the device may raise it meanwhile, and
        // a later item of a stream must not look done while an earlier one did not.
        seen.clear();
        watching.retain(|w| {
            let done = match session {
                Some(s) => w.session == s,
                None => {
                    let key = (Arc::as_ptr(&w.area) as usize, w.slot);
                    let value = match seen.iter().find(|(k, _)| *k == key) {
                        Some((_, v)) => *v,
                        None => {
                            let v = w.area.load(w.slot);
                            seen.push((key, v));
                            v
                        }
                    };
                    value >= w.value
                }
            };
            if done && session.is_none() {
                *signalled += 1;
            }
            if done {
                if let Err(e) = scheduler.completed(now, w.id, Nanos::MAX) {
                    tracing::error!(session = w.session, "scheduling gate: {e}");
                }
                any = true;
            }
            !done
        });
        any
    }

    /// Grants what the scheduler dispatches now; whether it granted an item
    /// other than `mine` (the caller's own, which needs no wake-up): waking
    /// waiters for nothing cost a latency-critical launch two futex wake-ups
    /// of the batch sessions parked here, and their scramble for the lock.
    fn pump(&mut self, now: Nanos, mine: Option<WorkId>) -> bool {
        let mut granted_other = false;
        while let Some(id) = self.scheduler.poll(now) {
            let held = self
                .held
                .get_mut(&id)
                .expect("the gate holds what it submits");
            held.ticket = Ticket::Granted;
            granted_other |= Some(id) != mine;
        }
        granted_other
    }
}

/// The gate of one device. See the module docs.
pub struct DeviceGate {
    state: Mutex<GateState>,
    changed: Condvar,
    clock: Clock,
    policy: Policy,
}

/// A session's membership of a gate: its tenant is registered while any of the
/// tenant's sessions holds one. Dropping it (after [`cancel_queued`](Self::cancel_queued)
/// and once none of the session's items is in flight) ends it.
pub struct GateSession {
    gate: Arc<DeviceGate>,
    tenant_name: String,
    tenant: TenantId,
    session: u64,
    /// Set (under the gate's lock) by `cancel_queued`: later launches skip the gate.
    ended: AtomicBool,
    /// The scheduler dispatches this tenant's work as it comes (latency-critical
    /// under `priority`).
    never_held: bool,
}

fn to_sched_config(settings: &TenantSettings) -> TenantConfig {
    TenantConfig {
        weight: settings.weight.max(1),
        class: match settings.class {
            TenantClass::LatencyCritical => SchedClass::LatencyCritical,
            TenantClass::Batch => SchedClass::Batch,
        },
    }
}

impl DeviceGate {
    /// A gate over a scheduler of `config`, on `clock`.
    pub fn new(config: SchedulerConfig, clock: Clock) -> Result<Arc<Self>, SchedError> {
        Ok(Arc::new(DeviceGate {
            policy: config.policy,
            state: Mutex::new(GateState {
                scheduler: Scheduler::new(config)?,
                tenants: HashMap::new(),
                next_tenant: 0,
                next_work: 0,
                held: HashMap::new(),
                watching: Vec::new(),
                signalled: 0,
                seen: Vec::new(),
                watcher_started: false,
                retired: HashMap::new(),
            }),
            changed: Condvar::new(),
            clock,
        }))
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        lock(&self.state)
    }

    /// Items waiting for the device (for tests and status).
    pub fn queued(&self) -> u32 {
        self.lock().scheduler.queued_total()
    }

    /// Items running on the device.
    pub fn in_flight(&self) -> u32 {
        self.lock().scheduler.in_flight_count()
    }

    /// The GPU time the scheduler has charged tenant `name` (while it is registered).
    pub fn charged_ns(&self, name: &str) -> Option<Nanos> {
        let state = self.lock();
        let id = state.tenants.get(name)?.id;
        state.scheduler.tenant_stats(id).map(|t| t.gpu_time_ns)
    }

    /// The GPU time the gate has charged `name` over the server's life: what
    /// its earlier registrations were charged, and its present one's.
    pub fn charged_total_ns(&self, name: &str) -> Nanos {
        let live = self.charged_ns(name).unwrap_or(0);
        live.saturating_add(self.lock().retired.get(name).copied().unwrap_or(0))
    }

    /// Launches completed by their signal so far (see [`GateSession::watch`]).
    pub fn signalled(&self) -> u64 {
        self.lock().signalled
    }

    /// What `fair`'s turns have done on this device (zeros without turns).
    pub fn turn_stats(&self) -> cumux_scheduler::TurnStats {
        self.lock().scheduler.turn_stats()
    }

    /// Registers `session` of tenant `name` (the tenant itself at its first session).
    pub fn join(
        self: &Arc<Self>,
        name: &str,
        settings: &TenantSettings,
        session: u64,
    ) -> Result<GateSession, SchedError> {
        let mut state = self.lock();
        let tenant = match state.tenants.get_mut(name) {
            Some(member) => {
                member.sessions += 1;
                member.id
            }
            None => {
                let id = TenantId(state.next_tenant);
                let now = (self.clock)();
                state
                    .scheduler
                    .register_tenant(now, id, to_sched_config(settings))?;
                state.next_tenant = state.next_tenant.wrapping_add(1);
                state
                    .tenants
                    .insert(name.to_string(), Member { id, sessions: 1 });
                id
            }
        };
        Ok(GateSession {
            gate: Arc::clone(self),
            tenant_name: name.to_string(),
            tenant,
            session,
            ended: AtomicBool::new(false),
            never_held: matches!(self.policy, Policy::Priority(_))
                && settings.class == TenantClass::LatencyCritical,
        })
    }
}

/// The watcher of a gate's queued launches: while any is on the device it looks at
/// their signals every [`WATCH_INTERVAL`], completes those done and lets the next
/// items go; otherwise it sleeps on the gate's condvar. Ends with the gate.
fn watch_loop(gate: Weak<DeviceGate>) {
    set_fine_timer_slack();
    loop {
        let Some(gate) = gate.upgrade() else { return };
        let mut state = gate.lock();
        if state.watching.is_empty() {
            drop(wait_timeout(&gate.changed, state, MAX_WAIT));
            continue;
        }
        let now = (gate.clock)();
        if state.complete_watched(now, None) {
            state.pump(now, None);
            drop(state);
            gate.changed.notify_all();
        } else {
            drop(state);
        }
        drop(gate);
        std::thread::sleep(WATCH_INTERVAL);
    }
}

/// Lets this thread's short sleeps end on time (the default slack is 50 µs).
fn set_fine_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes a nanosecond count and only affects the
    // calling thread.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong) };
}

impl GateSession {
    pub fn gate(&self) -> &Arc<DeviceGate> {
        &self.gate
    }

    /// Whether the scheduler lets this session's launches go as they come (a
    /// latency-critical tenant under `priority`): such a launch may be queued on
    /// the device before [`admit`](Self::admit), which then only accounts for it.
    pub fn never_held(&self) -> bool {
        self.never_held
    }

    /// Runs `work` (one launch) once the scheduler dispatches it, and reports its
    /// duration on the gate's clock. `None`: the session ended while the item waited,
    /// and `work` did not run. A full queue is backpressure: the caller waits.
    pub fn run<R>(
        &self,
        stream: StreamId,
        kernel: KernelId,
        cost_hint_ns: Option<Nanos>,
        work: impl FnOnce() -> R,
    ) -> Option<R> {
        let id = match self.admit(stream, kernel, cost_hint_ns, || {}) {
            Admission::Go(id, _) => id,
            Admission::Skip => return None,
            Admission::Ungated => return Some(work()),
        };
        let gate = &*self.gate;
        let started = (gate.clock)();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let mut state = gate.lock();
        let now = (gate.clock)();
        let measured = now.saturating_sub(started);
        if let Err(e) = state.scheduler.completed(now, id, measured) {
            tracing::error!(session = self.session, "scheduling gate: {e}");
        }
        state.pump(now, None);
        drop(state);
        gate.changed.notify_all();
        match result {
            Ok(r) => Some(r),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Offers one launch of `stream` and waits until the scheduler dispatches it. From
    /// [`Admission::Go`] on it is in flight: the caller runs it and reports it, or
    /// queues it on the device and [`watch`](Self::watch)es it. A full queue is
    /// backpressure: the caller waits. `before_wait` runs (once, without the gate's
    /// lock) before the first wait: the caller's launches on the device must be
    /// able to complete while it waits.
    pub fn admit(
        &self,
        stream: StreamId,
        kernel: KernelId,
        cost_hint_ns: Option<Nanos>,
        before_wait: impl FnOnce(),
    ) -> Admission {
        let mut before_wait = Some(before_wait);
        let gate = &*self.gate;
        let mut state = gate.lock();
        if self.ended.load(Ordering::Relaxed) {
            return Admission::Skip;
        }
        let id = WorkId(state.next_work);
        state.next_work = state.next_work.wrapping_add(1);
        let item = WorkItem {
            id,
            tenant: self.tenant,
            stream,
            kernel,
            cost_hint_ns,
            after: None,
        };
        loop {
            let now = (gate.clock)();
            match state.scheduler.submit(now, item) {
                Ok(()) => break,
                Err(
                    SchedError::TenantQueueFull(_)
                    | SchedError::QueueFull
                    | SchedError::TooManyStreams(_),
                ) => {
                    if let Some(f) = before_wait.take() {
                        drop(state);
                        f();
                        state = gate.lock();
                        continue;
                    }
                    // Backpressure: wait for something to complete, then try again.
                    state = wait_timeout(&gate.changed, state, MAX_WAIT);
                }
                Err(e) => {
                    // Not reachable (the tenant is registered, ids are fresh).
                    tracing::error!(
                        session = self.session,
                        "scheduling gate refused a launch: {e}"
                    );
                    return Admission::Ungated;
                }
            }
        }
        state.held.insert(
            id,
            Held {
                item,
                session: self.session,
                ticket: Ticket::Queued,
            },
        );
        let now = (gate.clock)();
        if state.pump(now, Some(id)) {
            gate.changed.notify_all();
        }
        loop {
            match state.held[&id].ticket {
                Ticket::Granted => break,
                Ticket::Cancelled => {
                    state.held.remove(&id);
                    return Admission::Skip;
                }
                Ticket::Queued => {}
            }
            if let Some(f) = before_wait.take() {
                drop(state);
                f();
                state = gate.lock();
                continue;
            }
            let now = (gate.clock)();
            let wait = state
                .scheduler
                .next_wakeup()
                .map_or(MAX_WAIT, |at| {
                    Duration::from_nanos(at.saturating_sub(now)).max(Duration::from_micros(1))
                })
                .min(MAX_WAIT);
            state = wait_timeout(&gate.changed, state, wait);
            let now = (gate.clock)();
            if state.pump(now, Some(id)) {
                gate.changed.notify_all();
            }
        }
        state.held.remove(&id);
        let estimate = state.scheduler.estimate_of(id).unwrap_or(0);
        Admission::Go(id, estimate)
    }

    /// The admitted item `id` is queued on the device, followed by a signal that raises
    /// counter `slot` of `area` to `value`; it completes when the watcher sees that.
    pub fn watch(&self, id: WorkId, area: &Arc<SignalArea>, slot: u32, value: u64) {
        let gate = &self.gate;
        let mut state = gate.lock();
        // Only an idle watcher waits on the condition; a busy one looks anyway.
        let idle = state.watching.is_empty();
        state.watching.push(Watched {
            id,
            session: self.session,
            area: Arc::clone(area),
            slot,
            value,
        });
        if !state.watcher_started {
            let weak = Arc::downgrade(gate);
            let started = std::thread::Builder::new()
                .name("cumux-gate-watch".into())
                .spawn(move || watch_loop(weak));
            match started {
                Ok(_) => state.watcher_started = true,
                Err(e) => tracing::error!("scheduling gate: cannot start its watcher: {e}"),
            }
        }
        drop(state);
        if idle {
            gate.changed.notify_all();
        }
    }

    /// Completes every watched item of this session now: its context is going away
    /// or failed, so their signals may never come.
    pub fn forget_in_flight(&self) {
        let gate = &*self.gate;
        let mut state = gate.lock();
        let now = (gate.clock)();
        if state.complete_watched(now, Some(self.session)) {
            state.pump(now, None);
            drop(state);
            gate.changed.notify_all();
        }
    }

    /// Drops this session's queued items (their waiters skip them), and every launch
    /// it would queue later, for a session that is ending. Items of the tenant's other sessions keep their place in line:
    /// the scheduler cancels per tenant, so they are queued again, in their order.
    pub fn cancel_queued(&self) {
        let gate = &*self.gate;
        let mut state = gate.lock();
        self.ended.store(true, Ordering::Relaxed);
        let now = (gate.clock)();
        let dropped = match state.scheduler.cancel_queued(now, self.tenant) {
            Ok(dropped) => dropped,
            Err(e) => {
                tracing::error!(session = self.session, "scheduling gate: {e}");
                return;
            }
        };
        let GateState {
            scheduler, held, ..
        } = &mut *state;
        for id in dropped {
            let held = held.get_mut(&id).expect("the gate holds what it queued");
            if held.session == self.session {
                held.ticket = Ticket::Cancelled;
            } else if let Err(e) = scheduler.submit(now, held.item) {
                // Cannot happen: the cancel just made room for exactly these.
                tracing::error!(session = held.session, "scheduling gate lost an item: {e}");
                held.ticket = Ticket::Cancelled;
            }
        }
        state.pump(now, None);
        drop(state);
        gate.changed.notify_all();
    }

    /// What the scheduler knows of this session's tenant.
    pub fn tenant_stats(&self) -> Option<cumux_scheduler::TenantStats> {
        self.gate.lock().scheduler.tenant_stats(self.tenant)
    }
}

impl Drop for GateSession {
    fn drop(&mut self) {
        let gate = &*self.gate;
        let mut state = gate.lock();
        let Some(member) = state.tenants.get_mut(&self.tenant_name) else {
            return;
        };
        member.sessions -= 1;
        if member.sessions > 0 {
            return;
        }
        let charged = state
            .scheduler
            .tenant_stats(self.tenant)
            .map_or(0, |t| t.gpu_time_ns);
        match state.scheduler.unregister_tenant(self.tenant) {
            Ok(()) => {
                state.tenants.remove(&self.tenant_name);
                let known = state.retired.contains_key(&self.tenant_name);
                let key = counted_key(&self.tenant_name, known, state.retired.len());
                let total = state.retired.entry(key.to_string()).or_insert(0);
                *total = total.saturating_add(charged);
            }
            // Work of the session still in flight (a stream worker that could not be
            // joined): the tenant stays registered, with no session, and is reused.
            Err(e) => tracing::warn!(
                session = self.session,
                "scheduling gate keeps tenant {:?}: {e}",
                self.tenant_name
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicU64;
    use std::sync::mpsc;

    /// Turn settings: numbers in range as given, out of range clamped, and
    /// anything else left to the default, each wrong one with a reason.
    #[test]
    fn turn_settings_from_the_environment_say_what_was_wrong() {
        assert_eq!(turn_micros(" 4000 "), (Some(4000), None));
        let (us, why) = turn_micros("5");
        assert_eq!(us, Some(10));
        assert!(why.unwrap().contains("10 µs is used"));
        assert_eq!(turn_micros("9000000").0, Some(1_000_000));
        for bad in ["4ms", "", "-1", "1.5"] {
            let (us, why) = turn_micros(bad);
            assert_eq!(us, None, "{bad}");
            assert!(why.unwrap().contains("the default stays"), "{bad}");
        }
    }

    fn fake_clock() -> (Arc<AtomicU64>, Clock) {
        let time = Arc::new(AtomicU64::new(0));
        let read = Arc::clone(&time);
        (time, Box::new(move || read.load(Ordering::SeqCst)))
    }

    fn settings(class: TenantClass) -> TenantSettings {
        TenantSettings {
            class,
            ..TenantSettings::default()
        }
    }

    /// A gate in front of a fake device: the device's clock, and the log of
    /// the launches it ran.
    struct FakeDevice {
        clock: Arc<AtomicU64>,
        gate: Arc<DeviceGate>,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl FakeDevice {
        fn new(config: SchedulerConfig) -> Self {
            let (clock, read) = fake_clock();
            FakeDevice {
                clock,
                gate: DeviceGate::new(config, read).unwrap(),
                log: Arc::new(Mutex::new(Vec::new())),
            }
        }

        /// Session `session` of tenant `name`, of `class`, joining the gate.
        fn member(&self, name: &str, class: TenantClass, session: u64) -> Arc<GateSession> {
            Arc::new(self.gate.join(name, &settings(class), session).unwrap())
        }

        /// A launch: advances the clock by its duration and logs its name;
        /// `hold` keeps it running until the test says so.
        fn launch(
            &self,
            member: &Arc<GateSession>,
            name: &str,
            stream: u32,
            duration: Nanos,
            hold: Option<mpsc::Receiver<()>>,
        ) -> std::thread::JoinHandle<Option<()>> {
            let (member, clock, log, name) = (
                Arc::clone(member),
                Arc::clone(&self.clock),
                Arc::clone(&self.log),
                name.to_string(),
            );
            std::thread::spawn(move || {
                member.run(StreamId(stream), KernelId(1), None, || {
                    if let Some(hold) = hold {
                        hold.recv().unwrap();
                    }
                    clock.fetch_add(duration, Ordering::SeqCst);
                    log.lock().unwrap().push(name);
                })
            })
        }

        /// A launch that runs, the only one on the device, until the
        /// returned sender says; its thread.
        fn running(
            &self,
            member: &Arc<GateSession>,
            name: &str,
            duration: Nanos,
        ) -> (mpsc::Sender<()>, std::thread::JoinHandle<Option<()>>) {
            let (release, hold) = mpsc::channel();
            let launch = self.launch(member, name, 0, duration, Some(hold));
            wait_until(&format!("{name} to run"), || self.gate.in_flight() == 1);
            (release, launch)
        }

        /// The names of the launches that ran, in order.
        fn log(&self) -> Vec<String> {
            self.log.lock().unwrap().clone()
        }
    }

    fn wait_until(what: &str, cond: impl Fn() -> bool) {
        let start = Instant::now();
        while !cond() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn priority_lets_latency_critical_work_pass_queued_batch_work() {
        let priority = Policy::Priority(PriorityConfig::default());
        let device = FakeDevice::new(scheduler_config(priority, 1));
        let gate = &device.gate;
        let batch = device.member("batch", TenantClass::Batch, 1);
        let lc = device.member("lc", TenantClass::LatencyCritical, 2);
        let (release, first) = device.running(&batch, "b0", 1_000_000);
        let mut waiting: Vec<_> = (1..4)
            .map(|s| device.launch(&batch, &format!("b{s}"), s, 1_000_000, None))
            .collect();
        wait_until("three batch items queued", || gate.queued() == 3);
        waiting.push(device.launch(&lc, "lc", 0, 100_000, None));
        wait_until("the latency-critical item queued", || gate.queued() == 4);
        release.send(()).unwrap();
        assert_eq!(first.join().unwrap(), Some(()));
        for w in waiting {
            assert_eq!(w.join().unwrap(), Some(()));
        }
        let log = device.log();
        assert_eq!(log[..2], ["b0", "lc"], "{log:?}");
        assert_eq!(log.len(), 5);
        assert_eq!(lc.tenant_stats().unwrap().gpu_time_ns, 100_000);
        assert_eq!(batch.tenant_stats().unwrap().gpu_time_ns, 4_000_000);
    }

    #[test]
    fn queued_launches_complete_when_their_signals_arrive() {
        // GPU-like streams (depth 2) under priority: batch queues two launches on the
        // device without waiting; each leaves the scheduler only when the device
        // raises its signal, and while the latency-critical tenant has work batch
        // stays within its cap.
        let mut config =
            queued_scheduler_config(Policy::Priority(PriorityConfig::default()), false);
        config.stream_depth = 2;
        let device = FakeDevice::new(config);
        let (clock, gate) = (&device.clock, &device.gate);
        let batch = device.member("batch", TenantClass::Batch, 1);
        let lc = device.member("lc", TenantClass::LatencyCritical, 2);
        let area = Arc::new(SignalArea::create().unwrap());
        let go = |admission: Admission| match admission {
            Admission::Go(id, _) => id,
            other => panic!("{other:?}"),
        };
        // Two on one batch stream go at once: the stream is two deep.
        let b0 = go(batch.admit(StreamId(0), KernelId(1), None, || {}));
        batch.watch(b0, &area, 0, 1);
        let b1 = go(batch.admit(StreamId(0), KernelId(1), None, || {}));
        batch.watch(b1, &area, 0, 2);
        assert_eq!(gate.in_flight(), 2);
        // The latency-critical launch goes past them.
        let l0 = go(lc.admit(StreamId(1), KernelId(2), None, || {}));
        lc.watch(l0, &area, 1, 1);
        // A third batch launch (another stream) waits: no batch goes while
        // latency-critical work is on the device.
        let third = {
            let batch = Arc::clone(&batch);
            std::thread::spawn(move || batch.admit(StreamId(2), KernelId(1), None, || {}))
        };
        wait_until("the third batch launch queued", || gate.queued() == 1);
        clock.fetch_add(1_000_000, Ordering::SeqCst);
        // The device finishes b0 (signal 1 on slot 0): the watcher completes it.
        area.store(0, 1);
        wait_until("b0 completes", || {
            batch.tenant_stats().unwrap().completed == 1
        });
        // b0 ran first and alone for the millisecond: it is charged all of it
        // (`cumux status` shows this as the tenant's GPU time).
        assert_eq!(gate.charged_ns("batch"), Some(1_000_000));
        assert_eq!(gate.charged_ns("nobody"), None);
        assert_eq!(gate.queued(), 1);
        // Once the latency-critical launch is done, batch may have 2 in flight again.
        area.store(1, 1);
        let b2 = go(third.join().unwrap());
        assert_eq!(lc.tenant_stats().unwrap().completed, 1);
        assert_eq!(gate.in_flight(), 2);
        // One store of the stream's latest value completes everything before it.
        area.store(0, 2);
        wait_until("b1 completes", || gate.in_flight() == 1);
        // A session whose context fails forgets what it had on the device.
        batch.watch(b2, &area, 2, 1);
        batch.forget_in_flight();
        assert_eq!(gate.in_flight(), 0);
        assert_eq!(batch.tenant_stats().unwrap().completed, 3);
    }

    #[test]
    fn fair_holds_the_tenant_that_is_too_far_ahead() {
        let fair = Policy::Fair(FairConfig::default());
        let device = FakeDevice::new(scheduler_config(fair, 1));
        let (clock, gate) = (&device.clock, &device.gate);
        let heavy = device.member("heavy", TenantClass::Batch, 1);
        let light = device.member("light", TenantClass::Batch, 2);
        let ms = 1_000_000;
        let (release_l0, l0) = device.running(&light, "l", ms);
        let (release_h1, hold) = mpsc::channel();
        let h1 = device.launch(&heavy, "h", 0, 10 * ms, Some(hold));
        wait_until("h1 queued", || gate.queued() == 1);
        let h2 = device.launch(&heavy, "h", 1, 10 * ms, None);
        wait_until("h2 queued", || gate.queued() == 2);
        release_l0.send(()).unwrap();
        l0.join().unwrap();
        wait_until("h1 to run", || gate.in_flight() == 1 && gate.queued() == 1);
        let l1 = device.launch(&light, "l", 0, ms, None);
        wait_until("l1 queued", || gate.queued() == 2);
        release_h1.send(()).unwrap();
        h1.join().unwrap();
        // heavy is now 10 ms of GPU time ahead of light (more than the 2 ms threshold):
        // its second item waits for light's.
        l1.join().unwrap();
        assert_eq!(device.log(), ["l", "h", "l"]);
        // light, idle, keeps its place for the idle grace; then heavy runs on alone.
        assert_eq!(gate.queued(), 1);
        clock.fetch_add(IDLE_GRACE_NS + 1, Ordering::SeqCst);
        h2.join().unwrap();
        assert_eq!(device.log(), ["l", "h", "l", "h"]);
        let light_time = light.tenant_stats().unwrap().gpu_time_ns;
        assert_eq!(light_time, 2 * ms);
        assert_eq!(heavy.tenant_stats().unwrap().gpu_time_ns, 20 * ms);
        // Once light's last session leaves, its charge stays in the gate's
        // total for the server's life; a new session of it adds to it.
        drop(light);
        assert_eq!(gate.charged_ns("light"), None);
        assert_eq!(gate.charged_total_ns("light"), 2 * ms);
        let again = device.member("light", TenantClass::Batch, 3);
        device.launch(&again, "l", 0, ms, None).join().unwrap();
        assert_eq!(gate.charged_ns("light"), Some(ms));
        assert_eq!(gate.charged_total_ns("light"), 3 * ms);
        assert_eq!(gate.charged_total_ns("heavy"), 20 * ms);
    }

    #[test]
    fn an_ending_session_drops_its_queued_items_and_keeps_its_tenants_others() {
        let mut config = scheduler_config(Policy::Fair(FairConfig::default()), 1);
        config.limits.max_queued_per_tenant = 2;
        let device = FakeDevice::new(config);
        let gate = &device.gate;
        let s1 = device.member("t", TenantClass::Batch, 1);
        let s2 = device.member("t", TenantClass::Batch, 2);
        let (release, running) = device.running(&s1, "s1-run", 1_000);
        let s1_queued = device.launch(&s1, "s1-queued", 1, 1_000, None);
        let s2_queued = device.launch(&s2, "s2-a", 2, 1_000, None);
        wait_until("two queued", || gate.queued() == 2);
        // The tenant's queue is full: a third item waits to be queued (backpressure).
        let s2_more = device.launch(&s2, "s2-b", 3, 1_000, None);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(gate.queued(), 2);
        s1.cancel_queued();
        assert_eq!(s1_queued.join().unwrap(), None, "cancelled, not run");
        let late = device.launch(&s1, "s1-late", 1, 1_000, None);
        assert_eq!(late.join().unwrap(), None, "the session has ended");
        release.send(()).unwrap();
        assert_eq!(running.join().unwrap(), Some(()));
        assert_eq!(s2_queued.join().unwrap(), Some(()));
        assert_eq!(s2_more.join().unwrap(), Some(()));
        assert_eq!(device.log(), ["s1-run", "s2-a", "s2-b"]);
        drop(s1);
        assert!(gate.lock().tenants.contains_key("t"));
        drop(s2);
        assert!(gate.lock().tenants.is_empty());
        assert_eq!(gate.lock().scheduler.queued_total(), 0);
        assert_eq!(parse_policy("fair").map(|p| policy_name(&p)), Ok("fair"));
        assert!(parse_policy("lottery").is_err());
    }

    #[test]
    fn only_latency_critical_work_under_priority_is_never_held() {
        let held = |policy: &str, class: TenantClass| {
            let config = queued_scheduler_config(parse_policy(policy).unwrap(), true);
            let gate = DeviceGate::new(config, monotonic_clock()).unwrap();
            gate.join("t", &settings(class), 1).unwrap().never_held()
        };
        assert!(held("priority", TenantClass::LatencyCritical));
        assert!(!held("priority", TenantClass::Batch));
        // `fair` holds anyone too far ahead, latency-critical or not.
        assert!(!held("fair", TenantClass::LatencyCritical));
    }
}
