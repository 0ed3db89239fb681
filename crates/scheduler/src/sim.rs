//! Deterministic simulation of one device shared by tenants under a [`Scheduler`]: a virtual
//! clock, a model device with slots and a sharing slowdown, seeded tenant generators, and the
//! figures the tests assert (GPU-time shares, Jain's index, latency percentiles).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::{
    KernelId, Nanos, Policy, SchedError, Scheduler, SchedulerConfig, StreamId, TenantClass,
    TenantConfig, TenantId, WorkId, WorkItem,
};

/// A small, fast, seedable generator (SplitMix64); the same seed gives the same run.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// `value` moved by a uniform amount within ±`percent` %.
    pub fn jitter(&mut self, value: Nanos, percent: u32) -> Nanos {
        assert!(percent < 100);
        if percent == 0 {
            return value;
        }
        let p = u64::from(percent);
        let factor = 100 - p + self.below(2 * p + 1);
        (u128::from(value) * u128::from(factor) / 100) as Nanos
    }
}

/// The model device: `slots` kernels run at once (the scheduler's concurrency is set to
/// the same), and with `k` running each progresses at `1 / (1 + sharing·(k−1))` of its
/// standalone speed. `sharing` = 1 models kernels that each fill the GPU (processor sharing:
/// total throughput is constant); 0 models small kernels that overlap perfectly.
///
/// `favours_latency_critical` models CUDA stream priorities with latency-critical work on
/// high-priority streams: while any latency-critical kernel runs, only latency-critical
/// kernels progress (their blocks are scheduled first) and batch kernels wait, still
/// holding their slots. An assumption about the hardware (block drain time is ignored),
/// to be checked on the GPU.
#[derive(Clone, Copy, Debug)]
pub struct DeviceModel {
    pub slots: u32,
    pub sharing: f64,
    pub favours_latency_critical: bool,
    /// Only the running kernel that started first progresses, at full speed: a GPU
    /// whose kernels each fill it, so the next one waits for its blocks to drain.
    pub in_order: bool,
    /// Each tenant a context of its own, time-sliced as a GPU does: only the kernels
    /// of the context holding the slice progress; the slice passes (round robin among
    /// the contexts with running kernels) after this long, or at once when its
    /// context has nothing running. Within a context, `in_order` still applies.
    pub time_slice_ns: Option<Nanos>,
    /// On a time-sliced device, how long it does no work when the slice passes
    /// from one context to another (the switch, and the new context's work
    /// reaching it): what each change of turns costs.
    pub switch_ns: Nanos,
}

impl DeviceModel {
    fn slowdown(&self, running: usize) -> f64 {
        assert!(running >= 1);
        1.0 + self.sharing * (running - 1) as f64
    }

    /// Which running kernels progress now, and the slowdown each of them sees.
    fn progress(&self, running: &[Running]) -> (bool, f64) {
        let urgent = running.iter().filter(|r| r.urgent).count();
        if self.favours_latency_critical && urgent > 0 {
            (true, self.slowdown(urgent))
        } else {
            (false, self.slowdown(running.len()))
        }
    }
}

/// The cost hint a tenant's items carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostHint {
    None,
    /// The kernel's standalone duration.
    True,
    /// Always this value: a tenant lying about its costs.
    Fixed(Nanos),
}

/// One kind of kernel a tenant launches, with its standalone duration.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    pub kernel: KernelId,
    pub duration_ns: Nanos,
}

/// A tenant as a work generator, closed or open loop.
///
/// Closed loop (`period_ns` = `None`): each of its `streams` keeps up to `depth` items
/// outstanding (submitted, not completed): depth 1 is launch, wait, launch; a large depth
/// a flood. After each completion the stream waits `think_ns` before submitting the next
/// item; a submission refused for a full queue is retried.
///
/// Open loop (`period_ns` = `Some(p)`): every `p` each stream submits a burst of `depth`
/// items whether or not earlier ones completed; refused submissions are dropped.
///
/// Think times, periods and kernel durations vary by ±`jitter_pct` %. Submission runs from
/// `start_ns` to `stop_ns`, which also models sleep-then-burst.
#[derive(Clone, Debug)]
pub struct TenantSpec {
    pub config: TenantConfig,
    pub streams: u32,
    pub depth: u32,
    /// Each item picks one uniformly.
    pub kernels: Vec<KernelSpec>,
    pub think_ns: Nanos,
    pub period_ns: Option<Nanos>,
    pub jitter_pct: u32,
    pub start_ns: Nanos,
    pub stop_ns: Nanos,
    pub hint: CostHint,
}

impl TenantSpec {
    /// A batch tenant with weight 1: one stream, closed loop, one kernel of this duration.
    pub fn closed_loop(duration_ns: Nanos) -> Self {
        TenantSpec {
            config: TenantConfig::default(),
            streams: 1,
            depth: 1,
            kernels: vec![KernelSpec {
                kernel: KernelId(0),
                duration_ns,
            }],
            think_ns: 0,
            period_ns: None,
            jitter_pct: 10,
            start_ns: 0,
            stop_ns: Nanos::MAX,
            hint: CostHint::None,
        }
    }

    pub fn streams(mut self, streams: u32, depth: u32) -> Self {
        self.streams = streams;
        self.depth = depth;
        self
    }

    /// Makes the tenant open loop: a burst of `depth` items per stream every `period_ns`.
    pub fn every(mut self, period_ns: Nanos) -> Self {
        assert!(period_ns > 0);
        self.period_ns = Some(period_ns);
        self
    }

    pub fn think(mut self, think_ns: Nanos) -> Self {
        self.think_ns = think_ns;
        self
    }

    pub fn weight(mut self, weight: u32) -> Self {
        self.config.weight = weight;
        self
    }

    pub fn class(mut self, class: TenantClass) -> Self {
        self.config.class = class;
        self
    }

    pub fn active(mut self, start_ns: Nanos, stop_ns: Nanos) -> Self {
        self.start_ns = start_ns;
        self.stop_ns = stop_ns;
        self
    }

    pub fn kernels(mut self, kernels: Vec<KernelSpec>) -> Self {
        self.kernels = kernels;
        self
    }
}

/// One simulated run.
///
/// With the scheduler's `stream_depth` at 1 its `concurrency` is replaced by the
/// device's slots. With deeper streams the device queues each stream's items and runs
/// the oldest of every stream at once (a GPU's streams), `slots` only shaping the
/// slowdown, and the scheduler's own `concurrency` bounds what is in flight.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub scheduler: SchedulerConfig,
    pub device: DeviceModel,
    pub tenants: Vec<TenantSpec>,
    pub seed: u64,
    pub horizon_ns: Nanos,
    /// Figures cover `[measure_from_ns, horizon_ns)`, to skip the warm-up.
    pub measure_from_ns: Nanos,
}

/// Figures of one tenant over the measured window.
#[derive(Clone, Debug)]
pub struct TenantReport {
    pub weight: u32,
    /// Its part of device occupancy (each instant divided among the kernels running).
    pub gpu_time_ns: f64,
    /// `gpu_time_ns` over all tenants' GPU time.
    pub share: f64,
    pub completed: u64,
    /// Standalone duration of the kernels it completed: useful work done.
    pub work_ns: Nanos,
    /// Submit → complete latency percentiles (nearest rank), 0 when nothing completed.
    pub p50_ns: Nanos,
    pub p99_ns: Nanos,
    pub max_ns: Nanos,
    /// Submissions refused for a full queue (retried later).
    pub rejected: u64,
    /// What the scheduler charged it over the whole run.
    pub charged_ns: Nanos,
}

/// Figures of one run.
#[derive(Clone, Debug)]
pub struct SimReport {
    pub tenants: Vec<TenantReport>,
    pub window_ns: Nanos,
    /// Time with at least one kernel running.
    pub busy_ns: f64,
    /// Time with a free slot and a ready item that the scheduler held back.
    pub held_ns: Nanos,
    pub max_queued: u32,
    pub dispatches: u64,
}

impl SimReport {
    /// Jain's fairness index of the weighted GPU times of `tenants`:
    /// `(Σx)² / (n·Σx²)` with `x = gpu_time / weight`; 1 is perfectly fair.
    pub fn jain(&self, tenants: &[usize]) -> f64 {
        assert!(!tenants.is_empty());
        let xs: Vec<f64> = tenants
            .iter()
            .map(|&i| self.tenants[i].gpu_time_ns / f64::from(self.tenants[i].weight))
            .collect();
        let sum: f64 = xs.iter().sum();
        let squares: f64 = xs.iter().map(|x| x * x).sum();
        if squares == 0.0 {
            return 1.0;
        }
        sum * sum / (xs.len() as f64 * squares)
    }

    /// Useful work done per unit of window, over all tenants (1.0 = one standalone kernel
    /// always running).
    pub fn throughput(&self) -> f64 {
        let work: Nanos = self.tenants.iter().map(|t| t.work_ns).sum();
        work as f64 / self.window_ns as f64
    }
}

#[derive(Debug)]
struct ItemInfo {
    tenant: usize,
    stream: usize,
    submitted_at: Nanos,
    duration_ns: Nanos,
}

#[derive(Debug)]
struct Running {
    id: WorkId,
    /// Of a latency-critical tenant.
    urgent: bool,
    /// Standalone nanoseconds of work left.
    remaining: f64,
    started_at: Nanos,
}

#[derive(Debug, Default)]
struct StreamMirror {
    /// Submitted, not dispatched, in submission order: what stream order allows next.
    pending: VecDeque<WorkId>,
    /// On the device, oldest first; the oldest is running.
    in_flight: VecDeque<WorkId>,
}

#[derive(Debug)]
struct TenantRun {
    spec: TenantSpec,
    rng: Rng,
    streams: Vec<StreamMirror>,
    gpu_time_ns: f64,
    completed: u64,
    work_ns: Nanos,
    latencies: Vec<Nanos>,
    rejected: u64,
}

/// Latency samples kept per tenant at most; a run that would exceed it is a test bug.
const MAX_SAMPLES: usize = 1 << 22;
/// A refused submission is retried after this long.
const RETRY_NS: Nanos = 1_000;
/// Work below this (standalone ns) counts as finished, absorbing floating-point rounding.
const DONE_EPSILON: f64 = 1e-3;

/// Runs one simulation. Panics when any invariant breaks: stream order, fifo arrival
/// order, the in-flight bound, or a queue bound.
pub fn run(config: &SimConfig) -> SimReport {
    let mut sched_config = config.scheduler;
    let pipelined = sched_config.stream_depth > 1;
    if !pipelined {
        sched_config.concurrency = config.device.slots;
    }
    let depth = sched_config.stream_depth as usize;
    let limits = sched_config.limits;
    let is_fifo = sched_config.policy == Policy::Fifo;
    let mut sched = Scheduler::new(sched_config).expect("valid scheduler configuration");
    let mut tenants: Vec<TenantRun> = Vec::with_capacity(config.tenants.len());
    // (time, order, tenant, stream): the next submissions; for an open-loop tenant, the
    // next burst.
    let mut arrivals: BinaryHeap<Reverse<(Nanos, u64, usize, usize)>> = BinaryHeap::new();
    let mut arrival_order = 0u64;
    for (index, spec) in config.tenants.iter().enumerate() {
        assert!(spec.streams >= 1 && spec.depth >= 1 && !spec.kernels.is_empty());
        sched
            .register_tenant(0, tenant_id(index), spec.config)
            .expect("tenant registers");
        let mut rng =
            Rng::new(config.seed ^ (index as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03));
        let first_arrivals = if spec.period_ns.is_some() {
            1
        } else {
            spec.depth
        };
        for stream in 0..spec.streams as usize {
            for _ in 0..first_arrivals {
                if spec.start_ns < spec.stop_ns {
                    // Spread the first submissions a little so seeds matter.
                    let at = spec.start_ns + rng.below(1_000);
                    arrivals.push(Reverse((at, arrival_order, index, stream)));
                    arrival_order += 1;
                }
            }
        }
        tenants.push(TenantRun {
            spec: spec.clone(),
            rng,
            streams: (0..spec.streams).map(|_| StreamMirror::default()).collect(),
            gpu_time_ns: 0.0,
            completed: 0,
            work_ns: 0,
            latencies: Vec::new(),
            rejected: 0,
        });
    }

    let window = (config.measure_from_ns, config.horizon_ns);
    assert!(window.0 < window.1);
    let mut items: Vec<ItemInfo> = Vec::new();
    let mut running: Vec<Running> = Vec::new();
    let mut now: Nanos = 0;
    let mut busy_ns = 0.0;
    let mut held_ns: Nanos = 0;
    let mut held = false;
    let mut max_queued = 0;
    let mut dispatches = 0u64;
    // The context holding the slice and when its slice ends (`time_slice_ns`).
    let mut slice: Option<(usize, Nanos)> = None;
    // No kernel progresses before this (a context switch, `switch_ns`).
    let mut stalled_until: Nanos = 0;

    loop {
        let next_arrival = arrivals.peek().map(|Reverse((at, ..))| *at);
        let tenant_of = |r: &Running| items[r.id.0 as usize].tenant;
        if let Some(length) = config.device.time_slice_ns {
            let before = slice.map(|(owner, _)| owner);
            slice = next_slice(slice, now, length, running.iter().map(tenant_of));
            let after = slice.map(|(owner, _)| owner);
            if before.is_some() && after.is_some() && before != after {
                stalled_until = now + config.device.switch_ns;
            }
        }
        let sliced_to = slice.map(|(owner, _)| owner);
        let in_slice = |r: &Running| sliced_to.is_none_or(|owner| tenant_of(r) == owner);
        // With `only_urgent`, only latency-critical kernels progress.
        let (only_urgent, slowdown) = if running.is_empty() || config.device.in_order {
            (false, 1.0)
        } else {
            config.device.progress(&running)
        };
        // On an in-order device, only the kernel that started first (of the context
        // holding the slice, on a time-sliced one).
        let first = running
            .iter()
            .filter(|r| in_slice(r))
            .min_by_key(|r| (r.started_at, r.id))
            .map(|r| r.id)
            .filter(|_| config.device.in_order);
        let stalled = now < stalled_until;
        let progressing = |r: &&Running| {
            !stalled && (!only_urgent || r.urgent) && first.is_none_or(|f| f == r.id) && in_slice(r)
        };
        let next_completion = running
            .iter()
            .filter(progressing)
            .map(|r| r.remaining)
            .min_by(f64::total_cmp)
            .map(|left| now + (left * slowdown).max(0.0).ceil() as Nanos);
        let next_wakeup = sched.next_wakeup();
        // A slice ending matters only where another context has kernels waiting.
        let slice_end = slice
            .filter(|&(owner, _)| running.iter().any(|r| tenant_of(r) != owner))
            .map(|(_, end)| end.max(now + 1));
        let stall_end = stalled.then_some(stalled_until);
        let Some(next) = [
            next_arrival,
            next_completion,
            next_wakeup,
            slice_end,
            stall_end,
        ]
        .into_iter()
        .flatten()
        .min() else {
            break;
        };
        assert!(next >= now);
        let next = next.min(config.horizon_ns);

        // Advance the device and the accounting over [now, next).
        let elapsed = next - now;
        let clipped = overlap((now, next), window);
        if !running.is_empty() && elapsed > 0 && !stalled {
            let count = running.iter().filter(progressing).count();
            let part = clipped as f64 / count as f64;
            for r in running
                .iter_mut()
                .filter(|r| (!only_urgent || r.urgent) && first.is_none_or(|f| f == r.id))
                .filter(|r| in_slice(r))
            {
                r.remaining -= elapsed as f64 / slowdown;
                tenants[items[r.id.0 as usize].tenant].gpu_time_ns += part;
            }
            busy_ns += clipped as f64;
        }
        if held {
            held_ns += clipped;
        }
        now = next;
        if now >= config.horizon_ns {
            break;
        }

        // Completions first, in id order for determinism.
        let mut done: Vec<Running> = Vec::new();
        let mut index = 0;
        while index < running.len() {
            if running[index].remaining <= DONE_EPSILON {
                done.push(running.swap_remove(index));
            } else {
                index += 1;
            }
        }
        done.sort_by_key(|r| r.id);
        for r in done {
            let info = &items[r.id.0 as usize];
            sched
                .completed(now, r.id, now - r.started_at)
                .expect("in-flight item completes");
            let tenant = &mut tenants[info.tenant];
            let stream = &mut tenant.streams[info.stream];
            assert_eq!(
                stream.in_flight.pop_front(),
                Some(r.id),
                "stream order at completion"
            );
            if let Some(&next) = stream.in_flight.front() {
                let urgent = tenant.spec.config.class == TenantClass::LatencyCritical;
                running.push(Running {
                    id: next,
                    urgent,
                    remaining: items[next.0 as usize].duration_ns as f64,
                    started_at: now,
                });
            }
            if now >= window.0 {
                tenant.completed += 1;
                tenant.work_ns += info.duration_ns;
                assert!(tenant.latencies.len() < MAX_SAMPLES);
                tenant.latencies.push(now - info.submitted_at);
            }
            let think = tenant
                .rng
                .jitter(tenant.spec.think_ns, tenant.spec.jitter_pct);
            if tenant.spec.period_ns.is_none() && now + think < tenant.spec.stop_ns {
                arrivals.push(Reverse((
                    now + think,
                    arrival_order,
                    info.tenant,
                    info.stream,
                )));
                arrival_order += 1;
            }
        }

        // Arrivals due now.
        while let Some(&Reverse((at, _, t, s))) = arrivals.peek() {
            if at > now {
                break;
            }
            arrivals.pop();
            let tenant = &mut tenants[t];
            match tenant.spec.period_ns {
                None => {
                    if !submit_one(&mut sched, tenant, &mut items, now, t, s) {
                        arrivals.push(Reverse((now + RETRY_NS, arrival_order, t, s)));
                        arrival_order += 1;
                    }
                }
                Some(period) => {
                    for _ in 0..tenant.spec.depth {
                        submit_one(&mut sched, tenant, &mut items, now, t, s);
                    }
                    let next = now + tenant.rng.jitter(period, tenant.spec.jitter_pct).max(1);
                    if next < tenant.spec.stop_ns {
                        arrivals.push(Reverse((next, arrival_order, t, s)));
                        arrival_order += 1;
                    }
                }
            }
        }
        assert!(sched.queued_total() <= limits.max_queued_total);
        max_queued = max_queued.max(sched.queued_total());

        // Dispatch whatever the scheduler lets go.
        while let Some(id) = sched.poll(now) {
            let in_flight: usize = tenants
                .iter()
                .flat_map(|t| t.streams.iter())
                .map(|s| s.in_flight.len())
                .sum();
            assert!(
                in_flight < sched.config().concurrency as usize,
                "in-flight bound"
            );
            let info = &items[id.0 as usize];
            if is_fifo {
                let earliest = tenants
                    .iter()
                    .flat_map(|t| t.streams.iter())
                    .filter(|s| s.in_flight.len() < depth)
                    .filter_map(|s| s.pending.front())
                    .min()
                    .expect("the dispatched item is ready");
                assert_eq!(*earliest, id, "fifo: the earliest ready item goes first");
            }
            let stream = &mut tenants[info.tenant].streams[info.stream];
            assert!(
                stream.in_flight.len() < depth,
                "stream order: too many of the stream in flight"
            );
            assert_eq!(
                stream.pending.pop_front(),
                Some(id),
                "stream order: not the stream's head"
            );
            stream.in_flight.push_back(id);
            if stream.in_flight.len() == 1 {
                let urgent = tenants[info.tenant].spec.config.class == TenantClass::LatencyCritical;
                running.push(Running {
                    id,
                    urgent,
                    remaining: info.duration_ns as f64,
                    started_at: now,
                });
            }
            dispatches += 1;
        }
        let in_flight: usize = tenants
            .iter()
            .flat_map(|t| t.streams.iter())
            .map(|s| s.in_flight.len())
            .sum();
        assert_eq!(sched.in_flight_count() as usize, in_flight);
        let room = if pipelined {
            in_flight < sched.config().concurrency as usize
        } else {
            running.len() < config.device.slots as usize
        };
        held = room
            && tenants
                .iter()
                .flat_map(|t| t.streams.iter())
                .any(|s| s.in_flight.len() < depth && !s.pending.is_empty());
        if is_fifo {
            assert!(!held, "fifo is work-conserving");
        }
    }

    let total_gpu: f64 = tenants.iter().map(|t| t.gpu_time_ns).sum();
    let reports = tenants
        .into_iter()
        .enumerate()
        .map(|(index, mut t)| {
            t.latencies.sort_unstable();
            let charged_ns = sched
                .tenant_stats(tenant_id(index))
                .expect("registered")
                .gpu_time_ns;
            TenantReport {
                weight: t.spec.config.weight,
                gpu_time_ns: t.gpu_time_ns,
                share: if total_gpu > 0.0 {
                    t.gpu_time_ns / total_gpu
                } else {
                    0.0
                },
                completed: t.completed,
                work_ns: t.work_ns,
                p50_ns: percentile(&t.latencies, 0.50),
                p99_ns: percentile(&t.latencies, 0.99),
                max_ns: t.latencies.last().copied().unwrap_or(0),
                rejected: t.rejected,
                charged_ns,
            }
        })
        .collect();
    SimReport {
        tenants: reports,
        window_ns: window.1 - window.0,
        busy_ns,
        held_ns,
        max_queued,
        dispatches,
    }
}

/// Offers one new item of tenant `t`, stream `s`; false when a full queue refused it.
fn submit_one(
    sched: &mut Scheduler,
    tenant: &mut TenantRun,
    items: &mut Vec<ItemInfo>,
    now: Nanos,
    t: usize,
    s: usize,
) -> bool {
    let kind = tenant.spec.kernels[tenant.rng.below(tenant.spec.kernels.len() as u64) as usize];
    let duration_ns = tenant
        .rng
        .jitter(kind.duration_ns, tenant.spec.jitter_pct)
        .max(1);
    let id = WorkId(items.len() as u64);
    let item = WorkItem {
        id,
        tenant: tenant_id(t),
        stream: StreamId(s as u32),
        kernel: kind.kernel,
        cost_hint_ns: match tenant.spec.hint {
            CostHint::None => None,
            CostHint::True => Some(kind.duration_ns),
            CostHint::Fixed(hint) => Some(hint),
        },
        after: None,
    };
    match sched.submit(now, item) {
        Ok(()) => {
            items.push(ItemInfo {
                tenant: t,
                stream: s,
                submitted_at: now,
                duration_ns,
            });
            tenant.streams[s].pending.push_back(id);
            true
        }
        Err(SchedError::TenantQueueFull(_) | SchedError::QueueFull) => {
            tenant.rejected += 1;
            false
        }
        Err(error) => panic!("submit refused: {error}"),
    }
}

/// The time slice after `now` on a device that time-slices contexts: kept while its
/// context has kernels running and its time lasts (or no other context has any),
/// else passed to the next context, round robin by index, that has kernels running.
fn next_slice(
    slice: Option<(usize, Nanos)>,
    now: Nanos,
    length: Nanos,
    running: impl Iterator<Item = usize>,
) -> Option<(usize, Nanos)> {
    let mut contexts: Vec<usize> = running.collect();
    contexts.sort_unstable();
    contexts.dedup();
    let Some((owner, end)) = slice else {
        return contexts.first().map(|&c| (c, now + length));
    };
    let owner_runs = contexts.contains(&owner);
    let others = contexts.iter().any(|&c| c != owner);
    match (owner_runs, now >= end, others) {
        (true, false, _) => Some((owner, end)),
        (true, true, false) => Some((owner, now + length)),
        (_, _, true) => {
            let next = contexts
                .iter()
                .copied()
                .find(|&c| c > owner)
                .or_else(|| contexts.iter().copied().find(|&c| c != owner))
                .expect("another context runs");
            Some((next, now + length))
        }
        (false, _, false) => None,
    }
}

fn tenant_id(index: usize) -> TenantId {
    TenantId(u32::try_from(index).expect("few tenants"))
}

fn overlap(a: (Nanos, Nanos), b: (Nanos, Nanos)) -> Nanos {
    let start = a.0.max(b.0);
    let end = a.1.min(b.1);
    end.saturating_sub(start)
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Nanos], q: f64) -> Nanos {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
