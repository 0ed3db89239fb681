//! The scheduler of one device: bounded per-tenant, per-stream queues, stream order, the
//! in-flight bound, occupancy accounting and virtual time, and the three policies' rules
//! for which ready item goes next. The caller passes time in; nothing here sleeps or reads a clock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::{
    CostTable, KernelId, Nanos, Policy, SchedError, SchedulerConfig, StreamId, TenantClass,
    TenantConfig, TenantId, WorkId, WorkItem,
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
    /// Global arrival order.
    seq: u64,
}

#[derive(Debug)]
struct Stream {
    queue: VecDeque<Queued>,
    /// Stream order: at most one item of a stream is on the device at a time.
    in_flight: Option<WorkId>,
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
    streams: BTreeMap<StreamId, Stream>,
    queued: u32,
    in_flight: u32,
    dispatched: u64,
    completed: u64,
    gpu_time_ps: u128,
}

#[derive(Debug)]
struct InFlight {
    tenant: TenantId,
    stream: StreamId,
    kernel: KernelId,
    class: TenantClass,
    dispatched_at: Nanos,
    /// This item's part of the device since dispatch: each tick divided by the number of
    /// items in flight during it.
    share_ps: u128,
    /// The estimate charged to the tenant's virtual time at dispatch, corrected at completion.
    charged_vt: u128,
}

/// A ready item: the head of a stream with nothing of that stream in flight.
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
    queued_ids: BTreeSet<WorkId>,
    queued_total: u32,
    /// Latency-critical items queued or in flight.
    lc_items: u32,
    batch_in_flight: u32,
    next_seq: u64,
    now: Nanos,
    costs: CostTable,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedError> {
        let limits = config.limits;
        let valid_policy = match config.policy {
            Policy::Fifo => true,
            Policy::Fair(fair) => fair.threshold_ns > 0,
            Policy::Priority(priority) => priority.batch_in_flight_while_lc_active >= 1,
        };
        let valid = valid_policy
            && config.concurrency >= 1
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
            queued_ids: BTreeSet::new(),
            queued_total: 0,
            lc_items: 0,
            batch_in_flight: 0,
            next_seq: 0,
            now: 0,
            costs: CostTable::new(limits.max_cost_entries),
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
                streams: BTreeMap::new(),
                queued: 0,
                in_flight: 0,
                dispatched: 0,
                completed: 0,
                gpu_time_ps: 0,
            },
        );
        Ok(())
    }

    /// Removes a tenant that has nothing queued or in flight (see `cancel_queued`).
    pub fn unregister_tenant(&mut self, tenant: TenantId) -> Result<(), SchedError> {
        let state = self.tenants.get(&tenant).ok_or(SchedError::UnknownTenant(tenant))?;
        if state.queued > 0 || state.in_flight > 0 {
            return Err(SchedError::TenantBusy(tenant));
        }
        assert!(state.streams.is_empty());
        self.tenants.remove(&tenant);
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
        let state = self.tenants.get_mut(&tenant).ok_or(SchedError::UnknownTenant(tenant))?;
        let mut dropped: Vec<(u64, WorkId)> = Vec::with_capacity(state.queued as usize);
        for stream in state.streams.values_mut() {
            dropped.extend(stream.queue.drain(..).map(|item| (item.seq, item.id)));
        }
        state.streams.retain(|_, stream| stream.in_flight.is_some());
        let count = u32::try_from(dropped.len()).expect("bounded by max_queued_per_tenant");
        assert_eq!(count, state.queued);
        state.queued = 0;
        if state.in_flight == 0 && state.activity == Activity::Busy {
            state.activity = Activity::IdleSince(now);
        }
        if state.config.class == TenantClass::LatencyCritical {
            self.lc_items -= count;
        }
        self.queued_total -= count;
        for (_, id) in &dropped {
            let removed = self.queued_ids.remove(id);
            assert!(removed);
        }
        dropped.sort_unstable();
        self.check_invariants();
        Ok(dropped.into_iter().map(|(_, id)| id).collect())
    }

    /// Queues one item behind the earlier items of its stream.
    pub fn submit(&mut self, now: Nanos, item: WorkItem) -> Result<(), SchedError> {
        self.advance(now);
        let limits = self.config.limits;
        let state = self.tenants.get(&item.tenant).ok_or(SchedError::UnknownTenant(item.tenant))?;
        if self.queued_ids.contains(&item.id) || self.in_flight.contains_key(&item.id) {
            return Err(SchedError::DuplicateWork(item.id));
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
        // No banked credit: a tenant that was idle rejoins no earlier than the least-served
        // tenant that stayed active.
        let rejoins = !self.is_active(state, now);
        let floor = if rejoins { self.min_active_vtime(now, Some(item.tenant)) } else { None };

        let seq = self.next_seq;
        self.next_seq += 1;
        let state = self.tenants.get_mut(&item.tenant).expect("checked above");
        if let Some(floor) = floor {
            state.vtime = state.vtime.max(floor);
        }
        state.activity = Activity::Busy;
        let stream = state.streams.entry(item.stream).or_insert_with(|| Stream {
            queue: VecDeque::new(),
            in_flight: None,
            head_ready_at: now,
        });
        if stream.queue.is_empty() && stream.in_flight.is_none() {
            stream.head_ready_at = now;
        }
        stream.queue.push_back(Queued { id: item.id, kernel: item.kernel, hint: item.cost_hint_ns, seq });
        state.queued += 1;
        assert!(state.queued <= limits.max_queued_per_tenant);
        if state.config.class == TenantClass::LatencyCritical {
            self.lc_items += 1;
        }
        self.queued_total += 1;
        assert!(self.queued_total <= limits.max_queued_total);
        let inserted = self.queued_ids.insert(item.id);
        assert!(inserted);
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
            Policy::Fair(fair) => {
                let min = self.min_active_vtime(now, None).expect("a tenant with queued work is active");
                let limit = min + u128::from(fair.threshold_ns) * VT_SCALE;
                self.candidates().filter(|c| c.vtime <= limit).min_by_key(|c| (c.vtime, c.seq))
            }
            Policy::Priority(priority) => self.choose_priority(now, priority.batch_hold_max_ns, priority.batch_in_flight_while_lc_active),
        };
        let chosen = chosen?;
        Some(self.dispatch(now, chosen))
    }

    /// The device finished `work`. `measured_ns` is its duration on the device (e.g. from
    /// events around it); it is capped at the wall time since dispatch.
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
        let done = self.in_flight.remove(&work).ok_or(SchedError::UnknownWork(work))?;
        let wall = now - done.dispatched_at;
        let measured = measured_ns.min(wall);
        let charge_ps = if wall == 0 {
            0
        } else {
            done.share_ps * u128::from(measured) / u128::from(wall)
        };
        let charge_ns = Nanos::try_from(charge_ps / PS_PER_NS).expect("bounded by wall time");
        self.costs.record(done.tenant, done.kernel, charge_ns);

        let state = self.tenants.get_mut(&done.tenant).expect("a tenant with work in flight stays registered");
        let weight = u128::from(state.config.weight);
        assert!(state.vtime >= done.charged_vt, "virtual time covers the estimates in flight");
        state.vtime = state.vtime - done.charged_vt + u128::from(charge_ns) * VT_SCALE / weight;
        state.gpu_time_ps += charge_ps;
        state.in_flight -= 1;
        state.completed += 1;
        let stream = state.streams.get_mut(&done.stream).expect("an in-flight item's stream exists");
        assert_eq!(stream.in_flight, Some(work));
        stream.in_flight = None;
        stream.head_ready_at = now;
        if stream.queue.is_empty() {
            state.streams.remove(&done.stream);
        }
        if state.queued == 0 && state.in_flight == 0 {
            state.activity = Activity::IdleSince(now);
        }
        match done.class {
            TenantClass::LatencyCritical => self.lc_items -= 1,
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
        let grace_ends = |class: Option<TenantClass>| {
            self.tenants
                .values()
                .filter(|t| class.is_none_or(|c| t.config.class == c))
                .filter_map(|t| match t.activity {
                    Activity::IdleSince(since) => Some(since.saturating_add(grace).saturating_add(1)),
                    _ => None,
                })
                .collect::<Vec<_>>()
        };
        let times = match self.config.policy {
            Policy::Fifo => Vec::new(),
            Policy::Fair(_) => grace_ends(None),
            Policy::Priority(priority) => {
                let mut times = grace_ends(Some(TenantClass::LatencyCritical));
                if self.lc_items > 0 {
                    times.extend(
                        self.candidates()
                            .filter(|c| c.class == TenantClass::Batch)
                            .map(|c| c.ready_at.saturating_add(priority.batch_hold_max_ns)),
                    );
                }
                times
            }
        };
        times.into_iter().filter(|&t| t > self.now).min()
    }

    pub fn tenant_stats(&self, tenant: TenantId) -> Option<TenantStats> {
        self.tenants.get(&tenant).map(|t| TenantStats {
            gpu_time_ns: Nanos::try_from(t.gpu_time_ps / PS_PER_NS).unwrap_or(Nanos::MAX),
            virtual_time_ns: Nanos::try_from(t.vtime / VT_SCALE).unwrap_or(Nanos::MAX),
            queued: t.queued,
            in_flight: t.in_flight,
            dispatched: t.dispatched,
            completed: t.completed,
        })
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

    fn choose_priority(&self, now: Nanos, hold_max: Nanos, batch_cap_lc: u32) -> Option<Candidate> {
        let urgent = self
            .candidates()
            .filter(|c| c.class == TenantClass::LatencyCritical)
            .min_by_key(|c| (c.vtime, c.seq));
        if urgent.is_some() {
            return urgent;
        }
        let lc_active = self
            .tenants
            .values()
            .any(|t| t.config.class == TenantClass::LatencyCritical && self.is_active(t, now));
        let batch_cap = if lc_active { batch_cap_lc } else { self.config.concurrency };
        if self.batch_in_flight >= batch_cap {
            return None;
        }
        let batch = self.candidates().filter(|c| c.class == TenantClass::Batch);
        if self.lc_items == 0 {
            batch.min_by_key(|c| (c.vtime, c.seq))
        } else {
            // Starvation guard: latency-critical work is pending or running, so batch is
            // held at the kernel boundary, except an item held for `hold_max` already.
            batch.filter(|c| now - c.ready_at >= hold_max).min_by_key(|c| (c.ready_at, c.seq))
        }
    }

    fn dispatch(&mut self, now: Nanos, chosen: Candidate) -> WorkId {
        let state = self.tenants.get_mut(&chosen.tenant).expect("candidate's tenant");
        let stream = state.streams.get_mut(&chosen.stream).expect("candidate's stream");
        assert!(stream.in_flight.is_none(), "stream order: one item of a stream in flight");
        let item = stream.queue.pop_front().expect("candidate's stream has a head");
        assert_eq!(item.seq, chosen.seq);
        stream.in_flight = Some(item.id);
        let estimate = self.costs.estimate(chosen.tenant, item.kernel, item.hint, self.config.default_cost_ns);
        let charged_vt = u128::from(estimate) * VT_SCALE / u128::from(state.config.weight);
        state.vtime += charged_vt;
        state.queued -= 1;
        state.in_flight += 1;
        state.dispatched += 1;
        self.queued_total -= 1;
        let removed = self.queued_ids.remove(&item.id);
        assert!(removed);
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
                share_ps: 0,
                charged_vt,
            },
        );
        assert!(previous.is_none());
        assert!(self.in_flight.len() <= self.config.concurrency as usize);
        self.check_invariants();
        item.id
    }

    fn candidates(&self) -> impl Iterator<Item = Candidate> + '_ {
        self.tenants
            .iter()
            .filter(|(_, t)| t.queued > 0)
            .flat_map(|(&tenant, t)| {
                t.streams.iter().filter(|(_, s)| s.in_flight.is_none()).filter_map(move |(&stream, s)| {
                    s.queue.front().map(|head| Candidate {
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

    fn is_active(&self, tenant: &Tenant, now: Nanos) -> bool {
        match tenant.activity {
            Activity::Busy => true,
            Activity::IdleSince(since) => now - since <= self.config.idle_grace_ns,
            Activity::Dormant => false,
        }
    }

    fn min_active_vtime(&self, now: Nanos, except: Option<TenantId>) -> Option<u128> {
        self.tenants
            .iter()
            .filter(|(&id, t)| Some(id) != except && self.is_active(t, now))
            .map(|(_, t)| t.vtime)
            .min()
    }

    /// Moves time forward, giving each item in flight its part of the elapsed time.
    fn advance(&mut self, now: Nanos) {
        assert!(now >= self.now, "time went backwards: {now} < {}", self.now);
        let elapsed = now - self.now;
        let running = self.in_flight.len() as u128;
        if elapsed > 0 && running > 0 {
            let part = u128::from(elapsed) * PS_PER_NS / running;
            for item in self.in_flight.values_mut() {
                item.share_ps += part;
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
            for t in self.tenants.values() {
                let in_flight = t.streams.values().filter(|s| s.in_flight.is_some()).count();
                let queued_here: usize = t.streams.values().map(|s| s.queue.len()).sum();
                assert_eq!(in_flight, t.in_flight as usize);
                assert_eq!(queued_here, t.queued as usize);
                assert!(t.streams.len() <= self.config.limits.max_streams_per_tenant as usize);
                assert!(t.streams.values().all(|s| s.in_flight.is_some() || !s.queue.is_empty()));
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
