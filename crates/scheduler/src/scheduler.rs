//! The scheduler of one device: bounded per-tenant, per-stream queues, stream order, the
//! in-flight bound, occupancy accounting and virtual time, and the three policies' rules
//! for which ready item goes next. Time is passed in; nothing here sleeps or reads a clock.

use std::collections::{BTreeMap, VecDeque};

mod turns;

use crate::{
    Charging, CostTable, FairConfig, KernelId, Nanos, Policy, PriorityConfig, SchedError,
    SchedulerConfig, StreamId, TenantClass, TenantConfig, TenantId, TurnStats, WorkId, WorkItem,
};

/// Virtual time is GPU nanoseconds divided by weight, kept in fixed point so that weights
/// do not round away: one nanosecond at weight 1 is `VT_SCALE` units.
const VT_SCALE: u128 = 1 << 20;
/// Occupancy is kept in picoseconds so that dividing a tick among co-running items keeps
/// precision.
const PS_PER_NS: u128 = 1000;

#[derive(Debug)]
struct Queued {
    id: WorkId,
    kernel: KernelId,
    hint: Option<Nanos>,
    /// The dependency's id and arrival number, when it was queued at submission: an id
    /// may be reused once its item has left, so the arrival number names the item.
    after: Option<(WorkId, u64)>,
    /// Global arrival order.
    seq: u64,
}

#[derive(Debug)]
struct Stream {
    queue: VecDeque<Queued>,
    /// Its items on the device, oldest first: at most `stream_depth`. The device runs
    /// them in this order, so only the first is running.
    in_flight: VecDeque<WorkId>,
    /// When the head of `queue` became ready (its predecessor completed, or it arrived).
    head_ready_at: Nanos,
}

/// Whether a tenant takes part in the minimum virtual time that others are held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Activity {
    /// Has work queued or in flight.
    Busy,
    /// Went idle at this time; still active during the idle grace.
    IdleSince(Nanos),
    /// Registered and never busy.
    Dormant,
}

#[derive(Debug)]
struct Tenant {
    config: TenantConfig,
    /// Scaled virtual time (see `VT_SCALE`). Never below the sum of the estimates charged
    /// for its items in flight.
    vtime: u128,
    activity: Activity,
    /// Its pause between going idle and submitting again, on average
    /// (`None` before its first): whether its idle grace holds others back.
    pause_ns: Option<Nanos>,
    /// How long its work items run, on average: a tenant that pauses less
    /// than its items run is a closed loop, however slow its round trips
    /// (a loaded host).
    run_ns: Option<Nanos>,
    streams: BTreeMap<StreamId, Stream>,
    queued: u32,
    in_flight: u32,
    /// The cost estimates of its items in flight, summed (wide: a hint may be huge).
    estimated_in_flight_ns: u128,
    dispatched: u64,
    completed: u64,
    gpu_time_ps: u128,
}

/// Under `fair` with turns (`scheduler/turns.rs`), the tenant whose items alone are
/// dispatched.
#[derive(Clone, Copy, Debug)]
struct Turn {
    tenant: TenantId,
    /// When it began; while no other tenant waits, its latest dispatch.
    since: Nanos,
    /// Items dispatched in it (at least one goes, whatever its estimate).
    items: u32,
}

#[derive(Debug)]
struct InFlight {
    tenant: TenantId,
    stream: StreamId,
    kernel: KernelId,
    class: TenantClass,
    dispatched_at: Nanos,
    /// Since when it runs: at dispatch, or once the item before it in its stream
    /// completed; `None` while it waits behind that item on the device.
    running_since: Option<Nanos>,
    /// This item's part of the device while running: each tick divided by the number of
    /// items running during it.
    share_ps: u128,
    /// The estimate charged to the tenant's virtual time at dispatch, corrected at completion.
    charged_vt: u128,
    /// The cost estimated at dispatch, in nanoseconds.
    estimate_ns: Nanos,
}

/// A ready item: the head of a stream with fewer than `stream_depth` items of that
/// stream in flight.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    tenant: TenantId,
    stream: StreamId,
    seq: u64,
    vtime: u128,
    class: TenantClass,
    ready_at: Nanos,
}

/// What the scheduler knows of one tenant, for `cumux status` and for tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantStats {
    /// GPU time charged: the tenant's part of device occupancy (see [`Scheduler::completed`]).
    pub gpu_time_ns: Nanos,
    /// Virtual time in nanoseconds at weight 1.
    pub virtual_time_ns: Nanos,
    pub queued: u32,
    pub in_flight: u32,
    pub dispatched: u64,
    pub completed: u64,
    /// Whether it counts as active at the latest time passed in: work queued or in flight,
    /// or idle for no longer than the idle grace. Derived, never set by the caller.
    pub active: bool,
}

/// The scheduling core of one device. See the crate documentation and [`Policy`].
///
/// Protocol: `register_tenant`, then any interleaving of `submit` (work arrives),
/// `poll` (call until it returns `None` after every event; each returned item goes to
/// the device), `completed` (the device finished an item) and a timer at
/// `next_wakeup`. Every call takes the current time, which must never go backwards.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    tenants: BTreeMap<TenantId, Tenant>,
    in_flight: BTreeMap<WorkId, InFlight>,
    /// Every queued item's arrival number, by id.
    queued_ids: BTreeMap<WorkId, u64>,
    queued_total: u32,
    /// Latency-critical items queued or in flight.
    lc_items: u32,
    /// Since when latency-critical items have been queued or in flight without a break.
    lc_busy_since: Option<Nanos>,
    batch_in_flight: u32,
    /// When the `priority` starvation guard last let a batch item through.
    last_guard_at: Option<Nanos>,
    next_seq: u64,
    now: Nanos,
    costs: CostTable,
    /// Who holds the device under `fair` with turns.
    turn: Option<Turn>,
    turn_stats: TurnStats,
    /// The system's virtual time: the most the least virtual time of the active
    /// tenants has been (it stays while none is active). A tenant that was not active
    /// rejoins there (see [`Scheduler::submit`]).
    vt_floor: u128,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedError> {
        let limits = config.limits;
        let valid_policy = match config.policy {
            Policy::Fifo => true,
            Policy::Fair(fair) => fair.threshold_ns > 0,
            Policy::Priority(priority) => priority.batch_in_flight_while_lc_active >= 1,
        } && config.turns.is_none_or(|t| t.quantum_ns > 0);
        let valid = valid_policy
            && config.concurrency >= 1
            && config.stream_depth >= 1
            && limits.max_tenants >= 1
            && limits.max_streams_per_tenant >= 1
            && limits.max_queued_per_tenant >= 1
            && limits.max_queued_total >= 1;
        if !valid {
            return Err(SchedError::InvalidConfig);
        }
        Ok(Scheduler {
            config,
            tenants: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            queued_ids: BTreeMap::new(),
            queued_total: 0,
            lc_items: 0,
            lc_busy_since: None,
            batch_in_flight: 0,
            last_guard_at: None,
            next_seq: 0,
            now: 0,
            costs: CostTable::new(limits.max_cost_entries),
            turn: None,
            turn_stats: TurnStats::default(),
            vt_floor: 0,
        })
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn register_tenant(
        &mut self,
        now: Nanos,
        tenant: TenantId,
        config: TenantConfig,
    ) -> Result<(), SchedError> {
        self.advance(now);
        if self.tenants.contains_key(&tenant) {
            return Err(SchedError::DuplicateTenant(tenant));
        }
        if self.tenants.len() >= self.config.limits.max_tenants as usize {
            return Err(SchedError::TooManyTenants);
        }
        if config.weight == 0 {
            return Err(SchedError::InvalidConfig);
        }
        self.tenants.insert(
            tenant,
            Tenant {
                config,
                vtime: 0,
                activity: Activity::Dormant,
                pause_ns: None,
                run_ns: None,
                streams: BTreeMap::new(),
                queued: 0,
                in_flight: 0,
                estimated_in_flight_ns: 0,
                dispatched: 0,
                completed: 0,
                gpu_time_ps: 0,
            },
        );
        Ok(())
    }

    /// Removes a tenant that has nothing queued or in flight (see `cancel_queued`).
    pub fn unregister_tenant(&mut self, tenant: TenantId) -> Result<(), SchedError> {
        let state = self
            .tenants
            .get(&tenant)
            .ok_or(SchedError::UnknownTenant(tenant))?;
        if state.queued > 0 || state.in_flight > 0 {
            return Err(SchedError::TenantBusy(tenant));
        }
        assert!(state.streams.is_empty());
        self.tenants.remove(&tenant);
        if self.turn.is_some_and(|turn| turn.tenant == tenant) {
            self.turn = None;
        }
        self.costs.forget(tenant);
        Ok(())
    }

    /// Drops every queued item of a tenant (its client went away) and returns their ids in
    /// arrival order. Items in flight stay until they complete.
    pub fn cancel_queued(
        &mut self,
        now: Nanos,
        tenant: TenantId,
    ) -> Result<Vec<WorkId>, SchedError> {
        self.advance(now);
        let state = self
            .tenants
            .get_mut(&tenant)
            .ok_or(SchedError::UnknownTenant(tenant))?;
        let mut dropped: Vec<(u64, WorkId)> = Vec::with_capacity(state.queued as usize);
        for stream in state.streams.values_mut() {
            dropped.extend(stream.queue.drain(..).map(|item| (item.seq, item.id)));
        }
        state
            .streams
            .retain(|_, stream| !stream.in_flight.is_empty());
        let count = u32::try_from(dropped.len()).expect("bounded by max_queued_per_tenant");
        assert_eq!(count, state.queued);
        state.queued = 0;
        if state.in_flight == 0 && state.activity == Activity::Busy {
            state.activity = Activity::IdleSince(now);
        }
        if state.config.class == TenantClass::LatencyCritical {
            self.lc_items -= count;
            if self.lc_items == 0 {
                self.lc_busy_since = None;
            }
        }
        self.queued_total -= count;
        for (_, id) in &dropped {
            let removed = self.queued_ids.remove(id);
            assert!(removed.is_some());
        }
        dropped.sort_unstable();
        self.check_invariants();
        Ok(dropped.into_iter().map(|(_, id)| id).collect())
    }

    /// Queues one item behind the earlier items of its stream.
    pub fn submit(&mut self, now: Nanos, item: WorkItem) -> Result<(), SchedError> {
        self.advance(now);
        let limits = self.config.limits;
        let state = self
            .tenants
            .get(&item.tenant)
            .ok_or(SchedError::UnknownTenant(item.tenant))?;
        if self.queued_ids.contains_key(&item.id) || self.in_flight.contains_key(&item.id) {
            return Err(SchedError::DuplicateWork(item.id));
        }
        if item.after == Some(item.id) {
            return Err(SchedError::InvalidConfig);
        }
        if state.queued >= limits.max_queued_per_tenant {
            return Err(SchedError::TenantQueueFull(item.tenant));
        }
        if self.queued_total >= limits.max_queued_total {
            return Err(SchedError::QueueFull);
        }
        if !state.streams.contains_key(&item.stream)
            && state.streams.len() >= limits.max_streams_per_tenant as usize
        {
            return Err(SchedError::TooManyStreams(item.tenant));
        }
        // A tenant that was not active rejoins at the system's virtual time: no earlier
        // (idle time banks no credit), and at most the fair threshold later (the device
        // it had to itself while others were away is no debt: kept, a tenant that ran
        // alone, or whose last session is still closing, would be held back for all of
        // that time when others come).
        let rejoins = !self.is_active(state, now);
        let floor = if rejoins {
            let active = self.min_active_vtime(now, Some(item.tenant));
            Some(active.map_or(self.vt_floor, |min| min.max(self.vt_floor)))
        } else {
            None
        };

        let after = item
            .after
            .and_then(|id| self.queued_ids.get(&id).map(|&seq| (id, seq)));
        let seq = self.next_seq;
        self.next_seq += 1;
        let most_debt = u128::from(self.rejoin_lead_ns()) * VT_SCALE;
        let state = self.tenants.get_mut(&item.tenant).expect("checked above");
        if let Some(floor) = floor {
            state.vtime = state.vtime.clamp(floor, floor.saturating_add(most_debt));
        }
        if let Activity::IdleSince(since) = state.activity {
            // Its pauses between finishing and asking again, on average
            // (a long sleep counts as a long pause, no more).
            let pause = (now - since).min(4 * self.config.idle_grace_ns);
            state.pause_ns = Some(state.pause_ns.map_or(pause, |p| (3 * p + pause) / 4));
        }
        state.activity = Activity::Busy;
        let depth = self.config.stream_depth as usize;
        let stream = state.streams.entry(item.stream).or_insert_with(|| Stream {
            queue: VecDeque::new(),
            in_flight: VecDeque::new(),
            head_ready_at: now,
        });
        if stream.queue.is_empty() && stream.in_flight.len() < depth {
            stream.head_ready_at = now;
        }
        stream.queue.push_back(Queued {
            id: item.id,
            kernel: item.kernel,
            hint: item.cost_hint_ns,
            after,
            seq,
        });
        state.queued += 1;
        assert!(state.queued <= limits.max_queued_per_tenant);
        if state.config.class == TenantClass::LatencyCritical {
            if self.lc_items == 0 {
                self.lc_busy_since = Some(now);
            }
            self.lc_items += 1;
        }
        self.queued_total += 1;
        assert!(self.queued_total <= limits.max_queued_total);
        let previous = self.queued_ids.insert(item.id, seq);
        assert!(previous.is_none());
        self.check_invariants();
        Ok(())
    }

    /// The next item that may go to the device now, if any. Call until `None` after every
    /// submit, completion and wakeup; each returned item is in flight from now on.
    pub fn poll(&mut self, now: Nanos) -> Option<WorkId> {
        self.advance(now);
        if self.in_flight.len() >= self.config.concurrency as usize || self.queued_total == 0 {
            return None;
        }
        let chosen = match self.config.policy {
            Policy::Fifo => self.candidates().min_by_key(|c| c.seq),
            Policy::Fair(_) if let Some(turns) = self.config.turns => self.choose_turn(now, turns),
            Policy::Fair(fair) => {
                let min = self
                    .min_active_vtime(now, None)
                    .expect("a tenant with queued work is active");
                let limit = min + u128::from(fair.threshold_ns) * VT_SCALE;
                self.candidates()
                    .filter(|c| c.vtime <= limit)
                    .min_by_key(|c| (c.vtime, c.seq))
            }
            Policy::Priority(priority) => self.choose_priority(now, priority),
        };
        let chosen = chosen?;
        let guarded = chosen.class == TenantClass::Batch && self.lc_items > 0;
        if guarded && matches!(self.config.policy, Policy::Priority(_)) {
            self.last_guard_at = Some(now);
        }
        Some(self.dispatch(now, chosen))
    }

    /// The device finished `work`, which must be the oldest item of its stream in flight
    /// (the device keeps stream order). `measured_ns` is its duration on the device (e.g.
    /// from events around it); it is capped at the wall time it ran (since dispatch, or
    /// since its stream's previous item completed), so a device that gives no timing
    /// passes `Nanos::MAX` and the item is charged its whole share.
    ///
    /// Charging: concurrent kernels overlap on a shared device, so charging each its full
    /// duration would bill a tenant for the slowdown others inflict on it (a flood of tiny
    /// kernels stretches a big kernel, and the big kernel's owner would pay for it), and
    /// the charges would add up to more than the device's time. Instead each tick of
    /// wall time is divided equally among the items in flight during it, and an item is
    /// charged its part, scaled by `measured / wall` to drop time it spent queued in the
    /// driver. The charges of all tenants then add up to the device's busy time, so shares
    /// of charged time are shares of the device.
    pub fn completed(
        &mut self,
        now: Nanos,
        work: WorkId,
        measured_ns: Nanos,
    ) -> Result<(), SchedError> {
        self.advance(now);
        let first_of_stream = self.in_flight.get(&work).is_some_and(|item| {
            self.tenants[&item.tenant].streams[&item.stream]
                .in_flight
                .front()
                == Some(&work)
        });
        if !first_of_stream {
            return Err(SchedError::UnknownWork(work));
        }
        let done = self.in_flight.remove(&work).expect("checked above");
        let wall = now - done.running_since.unwrap_or(done.dispatched_at);
        let measured = measured_ns.min(wall);
        let charge_ps = if wall == 0 {
            0
        } else {
            done.share_ps * u128::from(measured) / u128::from(wall)
        };
        let charge_ns = Nanos::try_from(charge_ps / PS_PER_NS).expect("bounded by wall time");
        self.costs.record(done.tenant, done.kernel, charge_ns);

        let state = self
            .tenants
            .get_mut(&done.tenant)
            .expect("a tenant with work in flight stays registered");
        state.run_ns = Some(state.run_ns.map_or(measured, |r| (3 * r + measured) / 4));
        let weight = u128::from(state.config.weight);
        assert!(
            state.vtime >= done.charged_vt,
            "virtual time covers the estimates in flight"
        );
        state.vtime = state.vtime - done.charged_vt + u128::from(charge_ns) * VT_SCALE / weight;
        state.gpu_time_ps += charge_ps;
        state.in_flight -= 1;
        state.estimated_in_flight_ns -= u128::from(done.estimate_ns);
        state.completed += 1;
        let stream = state
            .streams
            .get_mut(&done.stream)
            .expect("an in-flight item's stream exists");
        assert_eq!(stream.in_flight.pop_front(), Some(work));
        if let Some(next) = stream.in_flight.front() {
            let next = self.in_flight.get_mut(next).expect("in flight");
            next.running_since = Some(now);
        }
        if stream.in_flight.len() + 1 == self.config.stream_depth as usize {
            stream.head_ready_at = now;
        }
        if stream.queue.is_empty() && stream.in_flight.is_empty() {
            state.streams.remove(&done.stream);
        }
        if state.queued == 0 && state.in_flight == 0 {
            state.activity = Activity::IdleSince(now);
        }
        if let Some(min) = self.min_active_vtime(now, None) {
            self.vt_floor = self.vt_floor.max(min);
        }
        match done.class {
            TenantClass::LatencyCritical => {
                self.lc_items -= 1;
                if self.lc_items == 0 {
                    self.lc_busy_since = None;
                }
            }
            TenantClass::Batch => self.batch_in_flight -= 1,
        }
        self.check_invariants();
        Ok(())
    }

    /// The earliest future time at which the passing of time alone may let a held item go
    /// (an idle tenant's grace running out, the batch starvation guard). The caller polls
    /// again then; a spurious wakeup is harmless.
    pub fn next_wakeup(&self) -> Option<Nanos> {
        if self.queued_total == 0 {
            return None;
        }
        let grace = self.config.idle_grace_ns;
        let times = match self.config.policy {
            Policy::Fifo => Vec::new(),
            Policy::Fair(_) => {
                let mut times: Vec<Nanos> = self
                    .tenants
                    .values()
                    .filter_map(|t| match t.activity {
                        Activity::IdleSince(since) => {
                            Some(since.saturating_add(grace).saturating_add(1))
                        }
                        _ => None,
                    })
                    .collect();
                if let Some(turns) = self.config.turns {
                    times.extend(self.turn_wakeups(turns));
                }
                times
            }
            Policy::Priority(priority) => {
                let mut times: Vec<Nanos> = self
                    .tenants
                    .values()
                    .filter(|t| t.config.class == TenantClass::LatencyCritical)
                    .filter_map(|t| match t.activity {
                        Activity::IdleSince(since) => Some(
                            since
                                .saturating_add(priority.lc_linger_ns)
                                .saturating_add(1),
                        ),
                        _ => None,
                    })
                    .collect();
                if let Some(since) = self.guard_since() {
                    if self.candidates().any(|c| c.class == TenantClass::Batch) {
                        times.push(since.saturating_add(priority.batch_hold_max_ns));
                    }
                }
                times
            }
        };
        times.into_iter().filter(|&t| t > self.now).min()
    }

    /// The cost estimated for an item in flight when it was dispatched.
    pub fn estimate_of(&self, work: WorkId) -> Option<Nanos> {
        self.in_flight.get(&work).map(|item| item.estimate_ns)
    }

    pub fn tenant_stats(&self, tenant: TenantId) -> Option<TenantStats> {
        self.tenants.get(&tenant).map(|t| TenantStats {
            gpu_time_ns: Nanos::try_from(t.gpu_time_ps / PS_PER_NS).unwrap_or(Nanos::MAX),
            virtual_time_ns: Nanos::try_from(t.vtime / VT_SCALE).unwrap_or(Nanos::MAX),
            queued: t.queued,
            in_flight: t.in_flight,
            dispatched: t.dispatched,
            completed: t.completed,
            active: self.is_active(t, self.now),
        })
    }

    /// What turns have done so far (all zeros without turns).
    pub fn turn_stats(&self) -> TurnStats {
        self.turn_stats
    }

    pub fn queued_total(&self) -> u32 {
        self.queued_total
    }

    pub fn in_flight_count(&self) -> u32 {
        u32::try_from(self.in_flight.len()).expect("bounded by concurrency")
    }

    /// The latest time passed in.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// The `priority` rules, in order:
    /// 1. Starvation guard: once latency-critical work has been pending without a break for
    ///    `batch_hold_max_ns`, the batch item ready longest goes first, within the batch cap;
    ///    then one more per further `batch_hold_max_ns` of the same busy period. A floor
    ///    under batch progress that costs latency-critical tenants at most one batch kernel
    ///    per period, and nothing while their work leaves gaps shorter than the period.
    /// 2. Latency-critical items, least virtual time first, then arrival order.
    /// 3. Batch items, only while no latency-critical item is queued or in flight, and at
    ///    most `batch_in_flight_while_lc_active` of them in flight while a latency-critical
    ///    tenant is active; least virtual time first, then arrival order.
    fn choose_priority(&self, now: Nanos, config: PriorityConfig) -> Option<Candidate> {
        let lc_active = self.tenants.values().any(|t| {
            t.config.class == TenantClass::LatencyCritical
                && match t.activity {
                    Activity::Busy => true,
                    Activity::IdleSince(since) => now - since <= config.lc_linger_ns,
                    Activity::Dormant => false,
                }
        });
        let batch_cap = if lc_active {
            config.batch_in_flight_while_lc_active
        } else {
            self.config.concurrency
        };
        let batch_allowed = self.batch_in_flight < batch_cap;
        let batch = || self.candidates().filter(|c| c.class == TenantClass::Batch);
        if let Some(since) = self.guard_since() {
            if batch_allowed && now - since >= config.batch_hold_max_ns {
                let starving = batch().min_by_key(|c| (c.ready_at, c.seq));
                if starving.is_some() {
                    return starving;
                }
            }
            return self
                .candidates()
                .filter(|c| c.class == TenantClass::LatencyCritical)
                .min_by_key(|c| (c.vtime, c.seq));
        }
        if !batch_allowed {
            return None;
        }
        batch().min_by_key(|c| (c.vtime, c.seq))
    }

    /// While latency-critical work is pending: since when batch has been held without the
    /// guard letting an item through (the later of the start of the latency-critical busy
    /// period and the last guarded dispatch).
    fn guard_since(&self) -> Option<Nanos> {
        self.lc_busy_since
            .map(|since| since.max(self.last_guard_at.unwrap_or(0)))
    }

    fn dispatch(&mut self, now: Nanos, chosen: Candidate) -> WorkId {
        let state = self
            .tenants
            .get_mut(&chosen.tenant)
            .expect("candidate's tenant");
        let stream = state
            .streams
            .get_mut(&chosen.stream)
            .expect("candidate's stream");
        assert!(
            stream.in_flight.len() < self.config.stream_depth as usize,
            "stream order: at most stream_depth items of a stream in flight"
        );
        let item = stream
            .queue
            .pop_front()
            .expect("candidate's stream has a head");
        assert_eq!(item.seq, chosen.seq);
        let running_since = stream.in_flight.is_empty().then_some(now);
        stream.in_flight.push_back(item.id);
        let estimate = self.costs.estimate(
            chosen.tenant,
            item.kernel,
            item.hint,
            self.config.default_cost_ns,
        );
        let charged_vt = u128::from(estimate) * VT_SCALE / u128::from(state.config.weight);
        state.vtime += charged_vt;
        state.queued -= 1;
        state.in_flight += 1;
        state.estimated_in_flight_ns += u128::from(estimate);
        state.dispatched += 1;
        self.queued_total -= 1;
        let removed = self.queued_ids.remove(&item.id);
        assert_eq!(removed, Some(item.seq));
        if chosen.class == TenantClass::Batch {
            self.batch_in_flight += 1;
        }
        let previous = self.in_flight.insert(
            item.id,
            InFlight {
                tenant: chosen.tenant,
                stream: chosen.stream,
                kernel: item.kernel,
                class: chosen.class,
                dispatched_at: now,
                running_since,
                share_ps: 0,
                charged_vt,
                estimate_ns: estimate,
            },
        );
        assert!(previous.is_none());
        assert!(self.in_flight.len() <= self.config.concurrency as usize);
        self.check_invariants();
        item.id
    }

    fn candidates(&self) -> impl Iterator<Item = Candidate> + '_ {
        let depth = self.config.stream_depth as usize;
        self.tenants
            .iter()
            .filter(|(_, t)| t.queued > 0)
            .flat_map(move |(&tenant, t)| {
                t.streams
                    .iter()
                    .filter(move |(_, s)| s.in_flight.len() < depth)
                    .filter_map(move |(&stream, s)| {
                        let head = s.queue.front()?;
                        // A cross-stream dependency still queued holds the head back.
                        let waits = head
                            .after
                            .is_some_and(|(id, seq)| self.queued_ids.get(&id) == Some(&seq));
                        (!waits).then_some(Candidate {
                            tenant,
                            stream,
                            seq: head.seq,
                            vtime: t.vtime,
                            class: t.config.class,
                            ready_at: s.head_ready_at,
                        })
                    })
            })
    }

    /// Busy, or idle within the grace after a tenant whose pauses are
    /// short: a closed loop's synchronization round trip keeps its place, a
    /// tenant that pauses longer (on average, than `anticipate_pause_ns` and
    /// than twice its items run) does not hold the others back while it
    /// waits, so the device never idles for it.
    fn is_active(&self, tenant: &Tenant, now: Nanos) -> bool {
        let grace = self.config.idle_grace_ns;
        let short = self
            .config
            .anticipate_pause_ns
            .max(2 * tenant.run_ns.unwrap_or(0));
        match tenant.activity {
            Activity::Busy => true,
            Activity::IdleSince(since) => {
                now - since <= grace && tenant.pause_ns.is_none_or(|p| p <= short)
            }
            Activity::Dormant => false,
        }
    }

    /// How far ahead of the system's virtual time a rejoining tenant may stay: the fair
    /// threshold (under `priority`, the default one).
    fn rejoin_lead_ns(&self) -> Nanos {
        match self.config.policy {
            Policy::Fair(fair) => fair.threshold_ns,
            _ => FairConfig::default().threshold_ns,
        }
    }

    fn min_active_vtime(&self, now: Nanos, except: Option<TenantId>) -> Option<u128> {
        self.tenants
            .iter()
            .filter(|(&id, t)| Some(id) != except && self.is_active(t, now))
            .map(|(_, t)| t.vtime)
            .min()
    }

    /// Moves time forward, giving each running item its part of the elapsed time.
    fn advance(&mut self, now: Nanos) {
        assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        let elapsed = now - self.now;
        // (nothing without a turn: only `fair` with turns gives one)
        self.charge_idle_turn(elapsed);
        let running = self
            .in_flight
            .values()
            .filter(|item| item.running_since.is_some())
            .count() as u128;
        if elapsed > 0 && running > 0 {
            match self.config.charging {
                Charging::Shared => {
                    let part = u128::from(elapsed) * PS_PER_NS / running;
                    for item in self.in_flight.values_mut() {
                        if item.running_since.is_some() {
                            item.share_ps += part;
                        }
                    }
                }
                Charging::Oldest => {
                    let oldest = self
                        .in_flight
                        .iter_mut()
                        .filter_map(|(id, item)| Some(((item.running_since?, *id), item)))
                        .min_by_key(|(key, _)| *key);
                    if let Some((_, item)) = oldest {
                        item.share_ps += u128::from(elapsed) * PS_PER_NS;
                    }
                }
            }
        }
        self.now = now;
    }

    fn check_invariants(&self) {
        assert!(self.in_flight.len() <= self.config.concurrency as usize);
        assert_eq!(self.queued_ids.len(), self.queued_total as usize);
        if cfg!(debug_assertions) {
            let mut queued = 0;
            let mut lc = 0;
            let mut batch_in_flight = 0;
            for (&id, t) in &self.tenants {
                let estimated: u128 = self
                    .in_flight
                    .values()
                    .filter(|item| item.tenant == id)
                    .map(|item| u128::from(item.estimate_ns))
                    .sum();
                assert_eq!(estimated, t.estimated_in_flight_ns);
                let in_flight: usize = t.streams.values().map(|s| s.in_flight.len()).sum();
                let queued_here: usize = t.streams.values().map(|s| s.queue.len()).sum();
                assert_eq!(in_flight, t.in_flight as usize);
                assert_eq!(queued_here, t.queued as usize);
                assert!(t.streams.len() <= self.config.limits.max_streams_per_tenant as usize);
                assert!(t
                    .streams
                    .values()
                    .all(|s| !s.in_flight.is_empty() || !s.queue.is_empty()));
                assert!(t
                    .streams
                    .values()
                    .all(|s| s.in_flight.len() <= self.config.stream_depth as usize));
                assert_eq!(t.activity == Activity::Busy, t.queued + t.in_flight > 0);
                queued += t.queued;
                match t.config.class {
                    TenantClass::LatencyCritical => lc += t.queued + t.in_flight,
                    TenantClass::Batch => batch_in_flight += t.in_flight,
                }
            }
            assert_eq!(queued, self.queued_total);
            assert_eq!(lc, self.lc_items);
            assert_eq!(batch_in_flight, self.batch_in_flight);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FairConfig, Limits};

    const T0: TenantId = TenantId(0);
    const T1: TenantId = TenantId(1);

    fn item(id: u64, tenant: TenantId, stream: u32, hint: Option<Nanos>) -> WorkItem {
        WorkItem {
            after: None,
            id: WorkId(id),
            tenant,
            stream: StreamId(stream),
            kernel: KernelId(0),
            cost_hint_ns: hint,
        }
    }

    fn scheduler(policy: Policy, concurrency: u32, classes: &[TenantClass]) -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig::new(policy, concurrency)).unwrap();
        for (i, &class) in classes.iter().enumerate() {
            s.register_tenant(0, TenantId(i as u32), TenantConfig { weight: 1, class })
                .unwrap();
        }
        s
    }

    fn drain(s: &mut Scheduler, now: Nanos) -> Vec<u64> {
        std::iter::from_fn(|| s.poll(now)).map(|w| w.0).collect()
    }

    /// Submits `items` at `now`, in order.
    fn submit_all(s: &mut Scheduler, now: Nanos, items: impl IntoIterator<Item = WorkItem>) {
        for w in items {
            s.submit(now, w).unwrap();
        }
    }

    /// Submits unhinted items `(id, tenant, stream)` at `now`, in order.
    fn submit_plain(s: &mut Scheduler, now: Nanos, items: &[(u64, TenantId, u32)]) {
        submit_all(
            s,
            now,
            items
                .iter()
                .map(|&(id, t, stream)| item(id, t, stream, None)),
        );
    }

    /// Completes item `id` at `now` after `ran_ns` on the device, and drains
    /// what that lets go.
    fn complete(s: &mut Scheduler, now: Nanos, id: u64, ran_ns: Nanos) -> Vec<u64> {
        s.completed(now, WorkId(id), ran_ns).unwrap();
        drain(s, now)
    }

    #[test]
    fn fifo_keeps_arrival_order_and_stream_order() {
        let mut s = scheduler(Policy::Fifo, 2, &[TenantClass::Batch, TenantClass::Batch]);
        submit_plain(&mut s, 0, &[(1, T0, 0), (2, T0, 0), (3, T1, 0), (4, T1, 1)]);
        // 2 waits for 1 (same stream), so 3 goes next; the device is then full.
        assert_eq!(drain(&mut s, 0), vec![1, 3]);
        assert_eq!(complete(&mut s, 10, 3, 10), vec![4]);
        assert_eq!(complete(&mut s, 20, 1, 20), vec![2]);
        assert_eq!(s.queued_total(), 0);
    }

    #[test]
    fn a_cross_stream_dependency_waits_for_its_item_to_be_dispatched() {
        let waiting = |id, on, stream| WorkItem {
            after: Some(WorkId(on)),
            ..item(id, T0, stream, None)
        };
        let mut s = scheduler(Policy::Fifo, 4, &[TenantClass::Batch]);
        let items = [
            item(1, T0, 0, None),
            item(2, T0, 0, None), // records the event
            waiting(3, 2, 1),     // waits for it
            waiting(4, 99, 2),    // names an item not held: no constraint
        ];
        submit_all(&mut s, 0, items);
        assert_eq!(drain(&mut s, 0), vec![1, 4]);
        assert_eq!(complete(&mut s, 5, 1, 5), vec![2, 3]);
        for id in [2, 3, 4] {
            s.completed(6, WorkId(id), 1).unwrap();
        }
        // Ids may be reused once their item has left. Item 15 named the old item 11,
        // which is gone; the new item 11 queued behind 15 in its stream must not hold it.
        let items = [
            item(13, T0, 7, None),
            waiting(14, 13, 8),
            waiting(15, 11, 8),
            item(11, T0, 8, None),
        ];
        submit_all(&mut s, 6, items);
        // 14 may go as soon as 13 is on the device.
        assert_eq!(drain(&mut s, 6), vec![13, 14]);
        assert_eq!(complete(&mut s, 8, 14, 1), vec![15]);
        assert_eq!(complete(&mut s, 9, 15, 1), vec![11]);
        assert_eq!(
            s.submit(9, waiting(7, 7, 4)),
            Err(SchedError::InvalidConfig)
        );
    }

    #[test]
    fn errors_leave_the_state_unchanged() {
        let mut config = SchedulerConfig::new(Policy::Fifo, 1);
        config.limits = Limits {
            max_tenants: 1,
            max_streams_per_tenant: 1,
            max_queued_per_tenant: 2,
            max_queued_total: 2,
            max_cost_entries: 1,
        };
        let mut s = Scheduler::new(config).unwrap();
        s.register_tenant(0, T0, TenantConfig::default()).unwrap();
        assert_eq!(
            s.register_tenant(0, T0, TenantConfig::default()),
            Err(SchedError::DuplicateTenant(T0))
        );
        assert_eq!(
            s.register_tenant(0, T1, TenantConfig::default()),
            Err(SchedError::TooManyTenants)
        );
        // Submissions in order, each accepted or refused by the limit it meets.
        let submissions = [
            (item(1, T1, 0, None), Err(SchedError::UnknownTenant(T1))),
            (item(1, T0, 0, None), Ok(())),
            (
                item(1, T0, 0, None),
                Err(SchedError::DuplicateWork(WorkId(1))),
            ),
            (item(2, T0, 1, None), Err(SchedError::TooManyStreams(T0))),
            (item(2, T0, 0, None), Ok(())),
            (item(3, T0, 0, None), Err(SchedError::TenantQueueFull(T0))),
        ];
        for (work, expected) in submissions {
            assert_eq!(s.submit(0, work), expected);
        }
        assert_eq!(
            s.completed(0, WorkId(1), 0),
            Err(SchedError::UnknownWork(WorkId(1)))
        );
        assert_eq!(s.unregister_tenant(T0), Err(SchedError::TenantBusy(T0)));
        assert_eq!(drain(&mut s, 0), vec![1]);
        assert_eq!(s.cancel_queued(5, T0), Ok(vec![WorkId(2)]));
        assert_eq!(s.unregister_tenant(T0), Err(SchedError::TenantBusy(T0)));
        s.completed(9, WorkId(1), 9).unwrap();
        s.unregister_tenant(T0).unwrap();
        assert!(Scheduler::new(SchedulerConfig::new(Policy::Fifo, 0)).is_err());
    }

    #[test]
    fn overlapping_items_are_charged_their_part_of_the_device() {
        let mut s = scheduler(
            Policy::Fair(FairConfig::default()),
            2,
            &[TenantClass::Batch, TenantClass::Batch],
        );
        s.submit(0, item(1, T0, 0, None)).unwrap();
        s.submit(0, item(2, T1, 0, None)).unwrap();
        assert_eq!(drain(&mut s, 0), vec![1, 2]);
        // Both run during [0, 100); T0's item alone during [100, 300).
        s.completed(100, WorkId(2), 100).unwrap();
        s.completed(300, WorkId(1), 300).unwrap();
        assert_eq!(s.tenant_stats(T0).unwrap().gpu_time_ns, 250);
        assert_eq!(s.tenant_stats(T1).unwrap().gpu_time_ns, 50);
        // The measured time drops queueing: T0 measured 150 of 300 wall.
        s.submit(300, item(3, T0, 0, None)).unwrap();
        assert_eq!(drain(&mut s, 300), vec![3]);
        s.completed(600, WorkId(3), 150).unwrap();
        assert_eq!(s.tenant_stats(T0).unwrap().gpu_time_ns, 400);
    }

    #[test]
    fn fair_holds_the_tenant_too_far_ahead_until_the_other_catches_up() {
        let threshold = 1_000;
        let mut s = scheduler(
            Policy::Fair(FairConfig {
                threshold_ns: threshold,
            }),
            4,
            &[TenantClass::Batch, TenantClass::Batch],
        );
        // T1 has a long item in flight; T0 floods hinted 600 ns items on 4 streams.
        s.submit(0, item(100, T1, 0, Some(5_000))).unwrap();
        assert_eq!(drain(&mut s, 0), vec![100]);
        for i in 0..4 {
            s.submit(0, item(i, T0, i as u32, Some(600))).unwrap();
        }
        // T1 was charged its hint (5000) at dispatch. T0 joins level with it and runs freely
        // while within the threshold: 5000 and 5600 are, 6200 is not.
        assert_eq!(drain(&mut s, 0), vec![0, 1]);
        // The estimate is corrected at completion: T1 held a third of the device for 2000 ns.
        s.completed(2_000, WorkId(100), 2_000).unwrap();
        let t1 = s.tenant_stats(T1).unwrap();
        assert_eq!(t1.gpu_time_ns, 666);
        // T1 is idle but within its grace, and T0 is far ahead: T0's last item is held.
        assert!(s.tenant_stats(T0).unwrap().virtual_time_ns > t1.virtual_time_ns + threshold);
        assert_eq!(drain(&mut s, 2_000), Vec::<u64>::new());
        let grace_end = 2_000 + s.config().idle_grace_ns + 1;
        assert_eq!(s.next_wakeup(), Some(grace_end));
        // When T1's grace runs out, nothing holds T0 back: work-conserving.
        assert_eq!(drain(&mut s, grace_end), vec![2, 3]);
    }

    /// T0 has the device to itself: 100 items of 1 ms, back to back from 0; the time
    /// at the end.
    fn t0_alone_for_100_ms(s: &mut Scheduler) -> Nanos {
        let mut now = 0;
        for i in 0..100 {
            s.submit(now, item(i, T0, 0, None)).unwrap();
            assert_eq!(drain(s, now), vec![i]);
            now += 1_000_000;
            s.completed(now, WorkId(i), 1_000_000).unwrap();
        }
        now
    }

    #[test]
    fn an_idle_tenant_rejoins_at_the_least_virtual_time_of_the_active_ones() {
        let mut s = scheduler(
            Policy::Fair(FairConfig::default()),
            1,
            &[TenantClass::Batch, TenantClass::Batch],
        );
        let now = t0_alone_for_100_ms(&mut s);
        assert!(!s.tenant_stats(T1).unwrap().active);
        assert!(s.tenant_stats(T0).unwrap().active);
        // T1 slept through 100 ms of T0's work; it rejoins level with T0, not 100 ms behind.
        let t0 = s.tenant_stats(T0).unwrap().virtual_time_ns;
        s.submit(now, item(1_000, T0, 0, None)).unwrap();
        s.submit(now, item(1_001, T1, 0, None)).unwrap();
        assert_eq!(s.tenant_stats(T1).unwrap().virtual_time_ns, t0);
        // Ties go by arrival.
        assert_eq!(drain(&mut s, now), vec![1_000]);
    }

    #[test]
    fn a_tenant_that_had_the_device_alone_is_not_held_back_when_others_come() {
        let mut s = scheduler(
            Policy::Fair(FairConfig::default()),
            1,
            &[TenantClass::Batch, TenantClass::Batch, TenantClass::Batch],
        );
        let t2 = TenantId(2);
        // T0 has the device to itself for 100 ms, then goes away for longer than its
        // grace (a program that ended while its tenant stays registered).
        let mut now = t0_alone_for_100_ms(&mut s);
        now += 50_000_000;
        assert_eq!(s.poll(now), None);
        assert!(!s.tenant_stats(T0).unwrap().active);
        // T1 and T2 come (nobody is active), then T0 again: all level.
        s.submit(now, item(1_000, T1, 0, None)).unwrap();
        s.submit(now, item(2_000, t2, 0, None)).unwrap();
        s.submit(now, item(3_000, T0, 0, None)).unwrap();
        let vt = |s: &Scheduler, t| s.tenant_stats(t).unwrap().virtual_time_ns;
        assert_eq!(
            vt(&s, T1),
            vt(&s, T0),
            "T1 starts at the system's virtual time"
        );
        assert_eq!(vt(&s, t2), vt(&s, T0));
        // Served in turn, T0 no later than its third item, not after 100 ms of others.
        let mut order = Vec::new();
        for next in 1..10 {
            let id = s.poll(now).expect("an item is ready");
            order.push(id.0);
            now += 1_000_000;
            s.completed(now, id, 1_000_000).unwrap();
            let tenant = [T0, T1, t2][(id.0 / 1_000) as usize % 3];
            s.submit(now, item(id.0 + next * 10_000, tenant, 0, None))
                .unwrap();
        }
        let t0_first = order
            .iter()
            .position(|&id| id % 10_000 == 3_000 || id < 100);
        assert!(
            matches!(t0_first, Some(i) if i < 3),
            "T0 served among the first three: {order:?}"
        );
    }

    #[test]
    fn priority_holds_batch_while_latency_critical_work_is_pending() {
        let config = PriorityConfig {
            batch_hold_max_ns: 1_000,
            batch_in_flight_while_lc_active: 1,
            lc_linger_ns: 500,
        };
        let mut s = scheduler(
            Policy::Priority(config),
            4,
            &[TenantClass::LatencyCritical, TenantClass::Batch],
        );
        submit_plain(&mut s, 0, &[(1, T1, 0), (2, T1, 1), (3, T0, 0), (4, T0, 0)]);
        // Latency-critical first; batch held while its items are pending or running.
        assert_eq!(drain(&mut s, 0), vec![3]);
        assert_eq!(complete(&mut s, 100, 3, 100), vec![4]);
        // Starvation guard: 1000 ns into the latency-critical busy period, one batch item.
        assert_eq!(s.next_wakeup(), Some(1_000));
        assert_eq!(drain(&mut s, 1_000), vec![1]);
        s.completed(1_200, WorkId(4), 1_100).unwrap();
        // The tenant lingers as active: batch stays capped at one item in flight.
        assert_eq!(drain(&mut s, 1_200), Vec::<u64>::new());
        assert_eq!(complete(&mut s, 1_300, 1, 300), vec![2]);
    }
}
