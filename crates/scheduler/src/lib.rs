//! cumux-scheduler: which queued stream-ordered work item may go to a device next.
//! One [`Scheduler`] per device, one policy per scheduler (fifo, fair, priority); no threads
//! and no clock inside, so the same core runs in the server and in the [`sim`] simulator.
//!
//! How the server drives it, per device: register each tenant; `submit` every
//! stream-ordered call (launch, async copy, memset, event record or wait) as a
//! [`WorkItem`]; after every event (a submit, a completion, the timer) call `poll` until it
//! returns `None` and hand each returned item to the device; report each finished item
//! with `completed`; arm a timer at `next_wakeup`. A refused `submit` (full queue) is
//! backpressure: delay the client. Rules of the policies: [`Policy`].
//!
//! ```
//! use cumux_scheduler::*;
//!
//! let mut s = Scheduler::new(SchedulerConfig::new(Policy::Fair(FairConfig::default()), 4))?;
//! let tenant = TenantId(7);
//! s.register_tenant(0, tenant, TenantConfig { weight: 1, class: TenantClass::Batch })?;
//! for i in 0..2 {
//!     let item = WorkItem {
//!         id: WorkId(i),
//!         tenant,
//!         stream: StreamId(0),
//!         kernel: KernelId(42),
//!         cost_hint_ns: None,
//!         after: None,
//!     };
//!     s.submit(1_000, item)?;
//! }
//! // Stream order: the second item waits for the first to complete.
//! assert_eq!(s.poll(1_000), Some(WorkId(0)));
//! assert_eq!(s.poll(1_000), None);
//! s.completed(51_000, WorkId(0), 50_000)?;
//! assert_eq!(s.poll(51_000), Some(WorkId(1)));
//! assert_eq!(s.tenant_stats(tenant).unwrap().gpu_time_ns, 50_000);
//! # Ok::<(), SchedError>(())
//! ```

mod cost;
mod scheduler;
pub mod sim;

pub use cost::CostTable;
pub use scheduler::{Scheduler, TenantStats};

use std::fmt;

/// Time in nanoseconds on the caller's monotonic clock (virtual in the simulator).
pub type Nanos = u64;

/// A tenant: one program or one client identity. Tenants are isolated from each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TenantId(pub u32);

/// A stream of one tenant. Stream ids are scoped to their tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

/// A unit of stream-ordered work (a kernel launch, a copy, a memset), named by the caller.
/// Unique among the items the scheduler currently holds (queued or in flight).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkId(pub u64);

/// What a work item runs, for cost estimates: the same kernel of the same tenant tends to
/// cost the same. The server uses the function handle; copies use a size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KernelId(pub u64);

/// The service class of a tenant under the `priority` policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantClass {
    /// Served first; batch work is held back while its items are pending or running.
    LatencyCritical,
    /// Runs when no latency-critical work is pending, and under the starvation guard.
    Batch,
}

/// How a tenant is treated. `weight` is its relative share under `fair` (at least 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantConfig {
    pub weight: u32,
    pub class: TenantClass,
}

impl Default for TenantConfig {
    fn default() -> Self {
        TenantConfig {
            weight: 1,
            class: TenantClass::Batch,
        }
    }
}

/// Parameters of the `fair` policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FairConfig {
    /// How far (in nanoseconds of GPU time at weight 1) a tenant's virtual time may run
    /// ahead of the least-served active tenant before its work is held back.
    pub threshold_ns: Nanos,
}

impl Default for FairConfig {
    fn default() -> Self {
        FairConfig {
            threshold_ns: 2_000_000,
        }
    }
}

/// Exclusive turns under `fair` ([`SchedulerConfig::turns`]), for a device that
/// time-slices its tenants' contexts (a GPU where each tenant has a context of its
/// own): the device's own slicer gives a context with one small kernel queued a slice
/// only after every other context with work has had one, so a tenant that keeps
/// little work queued (a launch and a wait, a short event window) is starved by
/// tenants that keep much. With turns the scheduler makes the slices itself:
/// - one tenant holds the turn, and only its items are dispatched; the holder is
///   the tenant with work and the least virtual time;
/// - while another tenant waits, the holder gets new items dispatched only while the
///   turn's time so far plus the estimates of its items in flight is below
///   `quantum_ns` (at least one item a turn); alone, it keeps the turn and the
///   device as long as it has work;
/// - the turn passes once the holder's items in flight completed and its quantum is
///   used, or it has nothing queued for longer than its usual pause (up to
///   `hold_idle_max_ns`: a closed loop's round trip keeps its turn; that idle time
///   is charged to it while others wait);
/// - an item running past `quantum_ns + overrun_ns` while others wait ends the turn
///   without waiting for it: the next holder's work joins it on the device (a long
///   kernel then shares the device through its slicer, as natively, instead of
///   stopping everyone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TurnConfig {
    pub quantum_ns: Nanos,
    pub hold_idle_max_ns: Nanos,
    pub overrun_ns: Nanos,
}

/// Turns of 4 ms with idle holds of up to 1 ms: on the H200, four tenants
/// paced five ways kept Jain's index of their own alone rates at 0.93–1.00
/// and summed 0.82–1.15 of them, where turns of 1 ms with holds of 300 µs
/// summed 0.53–0.71 under launch-and-wait pacing (each turn change leaves the
/// GPU idle a while, and short turns change often); 8 ms turns summed less
/// under event windows and streams.
impl Default for TurnConfig {
    fn default() -> Self {
        TurnConfig {
            quantum_ns: 4_000_000,
            hold_idle_max_ns: 1_000_000,
            overrun_ns: 4_000_000,
        }
    }
}

/// What turns have done on a device so far ([`Scheduler::turn_stats`]): where a
/// time-sliced GPU's time goes besides its tenants' kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TurnStats {
    /// Turns given.
    pub turns: u64,
    /// Time holders kept an idle turn while others had work queued (the device idle).
    pub idle_held_ns: u64,
    /// Turns ended by an item running past the quantum and the overrun.
    pub overruns: u64,
}

/// Parameters of the `priority` policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityConfig {
    /// Starvation guard: a batch item ready for longer than this is dispatched even though
    /// latency-critical work is pending (still subject to `batch_in_flight_while_lc_active`).
    pub batch_hold_max_ns: Nanos,
    /// While any latency-critical tenant is active, at most this many batch items are in
    /// flight. Running kernels cannot be preempted, so this caps how much batch work a
    /// latency-critical kernel can find on the device when it arrives. At least 1.
    pub batch_in_flight_while_lc_active: u32,
    /// A latency-critical tenant counts as active while it has work, and for this long after
    /// its last item completed: longer than the pause between its requests, so that batch
    /// does not spread over the device between two of them.
    pub lc_linger_ns: Nanos,
}

impl Default for PriorityConfig {
    fn default() -> Self {
        PriorityConfig {
            batch_hold_max_ns: 20_000_000,
            batch_in_flight_while_lc_active: 1,
            lc_linger_ns: 10_000_000,
        }
    }
}

/// The policy of one device's scheduler.
///
/// Under every policy: items of one stream are dispatched in submission order and
/// complete in that order, with at most `stream_depth` of them in flight (a *ready*
/// item is the head of a stream with fewer in flight); at most `concurrency` items are
/// in flight; every queue is bounded by [`Limits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Pass-through: the ready item that arrived first goes, whenever a slot is free.
    /// Work-conserving.
    Fifo,
    /// Weighted shares of GPU time among active tenants, after Disengaged Fair Queueing:
    /// - each tenant has a virtual time: GPU time charged divided by its weight. An item
    ///   is charged its estimated cost at dispatch (per-kernel moving average of measured
    ///   costs, else the larger of the hint and the tenant's average, else `default_cost_ns`) and
    ///   corrected to its measured occupancy at completion (see [`Scheduler::completed`]);
    /// - a tenant is *active* while it has work queued or in flight and for
    ///   `idle_grace_ns` after; a tenant that was not active rejoins at the system's
    ///   virtual time (the least virtual time of the active tenants, or where it last
    ///   was while none is), or up to `threshold_ns` above it where its own was higher:
    ///   idle time banks no credit, and time it had the device to itself is no debt;
    /// - a ready item may go only if its tenant's virtual time is at most the least
    ///   virtual time among active tenants plus `threshold_ns`; tenants within the bound
    ///   run freely, the one too far ahead is held until the others catch up or go idle.
    ///   A tenant idle within its grace counts as active only if its pauses (between
    ///   going idle and submitting again, on average) are at most `anticipate_pause_ns`:
    ///   a closed loop's round trip keeps its place, a tenant that pauses longer never
    ///   leaves the device idle for it;
    /// - among the items that may go, the tenant with the least virtual time first, then
    ///   arrival order.
    ///
    /// So a tenant's lead over the least-served active tenant stays below `threshold_ns`
    /// plus its estimates in flight (at most `concurrency` items). With one active tenant
    /// nothing is ever held (work-conserving).
    Fair(FairConfig),
    /// Latency-critical tenants first; batch held at kernel boundaries while
    /// latency-critical work is pending or running, with a starvation guard and a cap on
    /// batch in flight (see [`PriorityConfig`]). Within a class: least virtual time first,
    /// then arrival order.
    Priority(PriorityConfig),
}

/// Bounds on every queue and table the scheduler keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_tenants: u32,
    pub max_streams_per_tenant: u32,
    pub max_queued_per_tenant: u32,
    pub max_queued_total: u32,
    /// Entries of the per-(tenant, kernel) cost table; beyond it the per-tenant estimate is used.
    pub max_cost_entries: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tenants: 256,
            max_streams_per_tenant: 256,
            max_queued_per_tenant: 4096,
            max_queued_total: 65536,
            max_cost_entries: 16384,
        }
    }
}

/// How a tick of wall time is charged when several items are running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Charging {
    /// Divided equally among them: a device that runs them side by side at once.
    Shared,
    /// All of it to the one that started running first: a device that runs them in
    /// the order they became ready, as a GPU does kernels that each fill it (the
    /// later ones wait for its blocks to drain). On a GPU whose kernels overlap it
    /// bills the long kernels more than their part, which only makes `fair` hold them
    /// back more, for the short ones.
    Oldest,
}

/// Everything a [`Scheduler`] needs to know about its device and policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub policy: Policy,
    /// The most work items in flight on the device at once (at least 1).
    pub concurrency: u32,
    /// The most items of one stream in flight at once (at least 1). 1: an item goes to
    /// the device only once its predecessor completed. More: the device queues a
    /// stream's items and runs them in order (a GPU stream), so the caller may hand it
    /// the next ones early and keep it busy without a round trip per item; only the
    /// oldest of a stream's items in flight counts as running.
    pub stream_depth: u32,
    /// How the time of running items is charged among them.
    pub charging: Charging,
    /// A tenant with nothing queued or in flight still counts as active for this long,
    /// if its pauses are short (`anticipate_pause_ns`). Covers the synchronisation
    /// round trip of a closed-loop program, so a tenant that launches, waits and
    /// launches again keeps its place instead of losing it each time.
    pub idle_grace_ns: Nanos,
    /// The longest pause (between going idle and submitting again, on average) of a
    /// tenant whose idle grace holds others back: a round trip is far shorter; a
    /// tenant that sleeps between kernels (a latency probe, a service) pauses longer,
    /// and the device does not idle for it.
    pub anticipate_pause_ns: Nanos,
    /// Cost charged at dispatch when nothing is known about an item.
    pub default_cost_ns: Nanos,
    /// Exclusive turns under `fair` (see [`TurnConfig`]); ignored by the other policies.
    pub turns: Option<TurnConfig>,
    pub limits: Limits,
}

impl SchedulerConfig {
    /// A configuration with default limits.
    pub fn new(policy: Policy, concurrency: u32) -> Self {
        SchedulerConfig {
            policy,
            concurrency,
            stream_depth: 1,
            charging: Charging::Shared,
            idle_grace_ns: 1_000_000,
            anticipate_pause_ns: 500_000,
            default_cost_ns: 10_000,
            turns: None,
            limits: Limits::default(),
        }
    }
}

/// One stream-ordered work item offered to the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkItem {
    pub id: WorkId,
    pub tenant: TenantId,
    pub stream: StreamId,
    pub kernel: KernelId,
    /// The caller's guess of the item's cost. Untrusted (a client may lie); it is only
    /// used before the kernel has been measured, and every charge is corrected to the
    /// measured cost at completion.
    pub cost_hint_ns: Option<Nanos>,
    /// An earlier item of another stream of the same tenant that must be dispatched before
    /// this one (`cuStreamWaitEvent` on an event recorded by it). Dispatched, not completed:
    /// the device keeps event order once both are on it. No constraint once that item has
    /// left the queue. Cycles cannot form: it must already have been submitted.
    pub after: Option<WorkId>,
}

/// Why the scheduler refused a request. None of these changes the scheduler's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedError {
    UnknownTenant(TenantId),
    DuplicateTenant(TenantId),
    TooManyTenants,
    /// A weight of zero, or a configuration value out of range.
    InvalidConfig,
    /// The tenant still has work queued or in flight.
    TenantBusy(TenantId),
    DuplicateWork(WorkId),
    UnknownWork(WorkId),
    TooManyStreams(TenantId),
    /// The tenant's queue is full: the caller should delay the client (backpressure).
    TenantQueueFull(TenantId),
    /// All queues together are full.
    QueueFull,
}

impl fmt::Display for SchedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchedError::UnknownTenant(t) => write!(f, "unknown tenant {}", t.0),
            SchedError::DuplicateTenant(t) => write!(f, "tenant {} is already registered", t.0),
            SchedError::TooManyTenants => write!(f, "too many tenants"),
            SchedError::InvalidConfig => write!(f, "invalid configuration"),
            SchedError::TenantBusy(t) => write!(f, "tenant {} still has work", t.0),
            SchedError::DuplicateWork(w) => write!(f, "work item {} is already held", w.0),
            SchedError::UnknownWork(w) => write!(f, "work item {} is not in flight", w.0),
            SchedError::TooManyStreams(t) => write!(f, "tenant {} uses too many streams", t.0),
            SchedError::TenantQueueFull(t) => write!(f, "queue of tenant {} is full", t.0),
            SchedError::QueueFull => write!(f, "scheduler queue is full"),
        }
    }
}

impl std::error::Error for SchedError {}
