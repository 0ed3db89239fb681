//! A launch of a compiled kernel: blocks over host workers, inside a block the
//! threads run warp by warp from resume point to barrier or collective, with
//! the interpreter's scheduling, budgets, cancel flag, deadlocks and faults.

use super::barriers::Waiters;
use super::compiled::CompiledKernel;
use super::hoist::{prepare, LaunchValues, Prepared};
use super::lanes::LANES;
use super::runtime::{
    undo_stores, Budget, Ctx, GlobalEntry, KernelFn, Logged, MAX_HOISTED, RET_EXIT, RET_FAULT,
    RET_PARTED, STOP_BARRIER, STOP_BITS, STOP_WARP,
};
use super::warp::{resolve_warp, Lanes, State};
use crate::exec::{launch_progress, on_workers, resident_memory, BlockResults};
use crate::ir::{Module, Op, SReg};
use crate::launch::{
    next_yield, printf_launch_limit, Fault, LaunchConfig, LaunchLimits, LaunchReport,
    LAUNCH_CHECK_INTERVAL,
};
use crate::memory::{DeviceMemory, MemView};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Reserved shared memory of a block whose module reads
/// `%reserved_smem_offset_*` (as the interpreter gives it).
const RESERVED_SMEM: u64 = 1024;

/// Launch-wide facts every worker reads.
struct Grid<'a> {
    kernel: &'a CompiledKernel,
    mem: &'a MemView<'a>,
    memory: &'a DeviceMemory,
    params: &'a [u64],
    params_len: u64,
    cfg: LaunchConfig,
    shared_bytes: u64,
    /// Where the block's reserved shared memory starts.
    reserved_smem: u64,
    /// The launch's start (ns since the Unix epoch): `%globaltimer` at a
    /// worker's clock 0, as the interpreter gives it.
    start_ns: u64,
    limits: &'a LaunchLimits<'a>,
    executed: AtomicU64,
    abort: AtomicBool,
    /// A block's lanes parted: the launch's later blocks run on the thread
    /// loop only.
    lanes_off: AtomicBool,
    /// A cooperative launch's grid workspace (`%envreg1`/`%envreg2`; 0:
    /// not a cooperative launch).
    grid_workspace: u64,
}

/// Runs compiled kernel `kernel` of module `m` over the grid (a
/// configuration already checked against the kernel's limits). A
/// cooperative launch (`grid_workspace` not 0: its workspace, as
/// `exec::with_grid_workspace` makes it) runs every block at once, each on
/// a host thread of its own, thread by thread (no lane kernel: a block
/// whose lanes part is undone and run again, which blocks that waited for
/// it could not take back), as the interpreter runs one.
pub(crate) fn launch(
    kernel: &CompiledKernel,
    m: &Module,
    mem: &DeviceMemory,
    cfg: &LaunchConfig,
    params: &[u8],
    limits: &LaunchLimits<'_>,
    grid_workspace: u64,
) -> LaunchReport {
    let per_thread = kernel.nregs as u64 * 8 + kernel.frame_bytes as u64;
    if let Err(fault) = resident_memory(cfg, per_thread, grid_workspace != 0) {
        return LaunchReport::failed(fault);
    }
    let uses =
        |wanted: fn(&Op) -> bool| m.funcs.iter().any(|f| f.code.iter().any(|i| wanted(&i.op)));
    let mut shared_bytes = m.dyn_shared_base as u64 + cfg.dynamic_shared_bytes as u64;
    let reserved_smem = shared_bytes.next_multiple_of(16);
    if uses(|op| {
        matches!(
            op,
            Op::Special {
                r: SReg::ReservedSmem(_),
                ..
            }
        )
    }) {
        shared_bytes = reserved_smem + RESERVED_SMEM;
    }
    if uses(|op| matches!(op, Op::Malloc { .. } | Op::Free { .. })) {
        if let Err(e) = mem.ensure_heap() {
            return LaunchReport::failed(Fault::OutOfResources(format!(
                "no room for the device heap of {} bytes: {e}",
                mem.heap_limit()
            )));
        }
    }
    let view = mem.view();
    // padded to what the code loads before its thread loop (it uses those
    // values only when `params_len` covers them)
    let words = params.len().max(kernel.param_extent as usize).div_ceil(8);
    let mut pwords = vec![0u64; words];
    for (k, b) in params.iter().enumerate() {
        pwords[k / 8] |= (*b as u64) << (8 * (k % 8));
    }
    let g = Grid {
        kernel,
        mem: &view,
        memory: mem,
        params: &pwords,
        params_len: params.len() as u64,
        cfg: *cfg,
        shared_bytes,
        reserved_smem,
        start_ns: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
        limits,
        executed: AtomicU64::new(0),
        abort: AtomicBool::new(false),
        lanes_off: AtomicBool::new(grid_workspace != 0),
        grid_workspace,
    };
    run_grid(&g)
}

/// A grid of at most this many threads runs on the launching thread: starting
/// a host thread for it costs more than its work (vadd over 1,024 floats on
/// the 2-core development machine: about 110 µs of a 204 µs invocation).
const INLINE_GRID_THREADS: u64 = 4096;

/// Host workers of a launch, as the interpreter counts them; one for a grid
/// of at most [`INLINE_GRID_THREADS`] threads.
fn worker_count(limits: &LaunchLimits<'_>, blocks: u64, threads: u64) -> usize {
    if blocks.saturating_mul(threads) <= INLINE_GRID_THREADS {
        return 1;
    }
    Some(limits.workers)
        .filter(|&n| n > 0)
        .or_else(|| {
            std::env::var("CUMUX_PTX_THREADS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|&n| n > 0)
        })
        .or_else(|| std::thread::available_parallelism().map(|n| n.get()).ok())
        .unwrap_or(1)
        .min(blocks.max(1) as usize)
        .max(1)
}

fn run_grid(g: &Grid<'_>) -> LaunchReport {
    let total: u64 = g.cfg.grid.iter().map(|&v| v as u64).product();
    let threads: u64 = g.cfg.block.iter().map(|&v| v as u64).product();
    let (workers, chunk) = if g.grid_workspace != 0 {
        // the blocks wait for each other: all run at once
        (total.max(1) as usize, 1)
    } else {
        let workers = worker_count(g.limits, total, threads);
        (workers, claim_chunk(total, workers))
    };
    let next = AtomicU64::new(0);
    let results = BlockResults::default();
    let work = |smid: u32| {
        let own_count = AtomicU64::new(0);
        let mut w = Worker::new(g, smid, &own_count);
        let mut outs = Vec::new();
        let (mut id, mut claimed) = (0, 0);
        loop {
            if g.abort.load(Ordering::Relaxed) {
                break;
            }
            if id == claimed {
                id = next.fetch_add(chunk, Ordering::Relaxed);
                claimed = id.saturating_add(chunk);
            }
            if id >= total {
                break;
            }
            let this = id;
            id += 1;
            let id = this;
            if cancelled(g) {
                results.fault(id, Fault::Cancelled("before a block started".into()));
                g.abort.store(true, Ordering::Relaxed);
                break;
            }
            w.out.clear();
            let r = w.run_block(g, id);
            if !w.out.is_empty() {
                outs.push((id, std::mem::take(&mut w.out)));
            }
            let ctaid = w.ctaid;
            let done = w.instructions;
            let r = r.and(w.launch_check(g, done, || format!("by block {ctaid:?}")));
            if let Err(e) = r {
                let stopped = g.abort.load(Ordering::Relaxed) && matches!(e, Fault::Cancelled(_));
                if !stopped {
                    results.fault(id, e);
                }
                g.abort.store(true, Ordering::Relaxed);
                break;
            }
            if id == claimed - 1 {
                w.flush(g);
            }
        }
        w.flush(g);
        results.outputs(outs);
    };
    on_workers(workers, &work);
    results.report(
        g.executed.load(Ordering::Relaxed),
        printf_launch_limit(g.limits.printf_fifo),
    )
}

/// Blocks a worker takes at a time: one while the grid is small (the
/// interpreter's order of blocks), up to 16 where each worker gets 16 such
/// chunks at least (the counter the workers share is then touched once
/// every 16 blocks, not once a block: a 1 M-element vector add's 4,096
/// short blocks spent a tenth of their time on it).
fn claim_chunk(total: u64, workers: usize) -> u64 {
    (total / (workers as u64 * 16)).clamp(1, 16)
}

/// Blocks of this process that ran through lane kernels, and that were
/// undone and ran again on the thread loop.
static LANE_BLOCKS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Blocks of compiled kernels this process ran, by either loop.
static COMPILED_BLOCKS: AtomicU64 = AtomicU64::new(0);

/// Blocks this process ran as native code so far (lane kernels or thread
/// loops; blocks run again after their lanes parted count once).
pub fn compiled_blocks() -> u64 {
    COMPILED_BLOCKS.load(Ordering::Relaxed)
}

/// Blocks of compiled kernels this process ran through lane kernels so
/// far, and blocks whose lanes parted (undone, run again thread by thread).
pub fn lane_blocks() -> (u64, u64) {
    (
        LANE_BLOCKS[0].load(Ordering::Relaxed),
        LANE_BLOCKS[1].load(Ordering::Relaxed),
    )
}

/// Blocks of this process whose global accesses one check covered (run
/// through the lane kernel's unchecked copy, `jit::hoist`).
static HOISTED_BLOCKS: AtomicU64 = AtomicU64::new(0);

/// Blocks of compiled kernels this process ran with their global accesses'
/// checks hoisted to one a block so far.
pub fn hoisted_blocks() -> u64 {
    HOISTED_BLOCKS.load(Ordering::Relaxed)
}

/// Accesses in a loop whose checks over all its trips a block's check
/// covered (`jit::hoist`), summed over blocks.
static HOISTED_LOOP_SITES: AtomicU64 = AtomicU64::new(0);

/// Accesses in compiled kernels' loops this process ran with their checks
/// hoisted to one a block, over every trip, summed over blocks so far.
pub fn hoisted_loop_sites() -> u64 {
    HOISTED_LOOP_SITES.load(Ordering::Relaxed)
}

/// The `%tid`s of a block of `block` threads as the lane kernel reads them:
/// for each group of [`LANES`], its lanes' x, then y, then z, then zeros
/// (none where the block is not whole groups: lanes never run it).
fn lane_tids(block: [u32; 3]) -> Vec<[u32; 4]> {
    let [x, y, _] = block.map(|d| d.max(1));
    let n = block.iter().product::<u32>();
    if !n.is_multiple_of(LANES) {
        return Vec::new();
    }
    let tid = |lin: u32| [lin % x, (lin / x) % y, lin / (x * y)];
    (0..n / LANES)
        .flat_map(|group| {
            let lanes: Vec<[u32; 3]> = (0..LANES).map(|k| tid(group * LANES + k)).collect();
            let part = |c: usize| [0, 1, 2, 3].map(|k| lanes[k][c]);
            [part(0), part(1), part(2), [0; 4]]
        })
        .collect()
}

/// Why a block's lane kernel gave up (it runs again on the thread loop).
fn parted() -> Fault {
    Fault::Failed("the block's lanes parted".into())
}

fn cancelled(g: &Grid<'_>) -> bool {
    g.limits.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
}

/// One worker's buffers, reused block after block.
struct Worker<'w> {
    regs: Vec<u64>,
    local: Vec<u64>,
    shared: Vec<u64>,
    /// The global allocation each access site resolved last (kept from
    /// block to block: allocations stay while the launch runs).
    gcache: Vec<GlobalEntry>,
    resume: Vec<u32>,
    state: Vec<State>,
    /// Each thread's `%tid` (x, y, z, 0), the same for the lane kernel
    /// (each group's x, y and z of its lanes, then zeros: `KernelFn`), and
    /// the stop code of each thread's last run.
    tids: Vec<[u32; 4]>,
    lane_tids: Vec<[u32; 4]>,
    codes: Vec<u32>,
    ctaid: [u32; 3],
    /// The worker's index (`%smid`).
    smid: u32,
    /// The running block's `printf` output.
    out: Vec<u8>,
    /// Instructions of the running block, and those already counted.
    instructions: u64,
    counted: u64,
    /// Threads of the running block that exited, and that wait at a barrier.
    exited: usize,
    waiting: usize,
    /// The lane kernel's file of narrow registers (`Ctx::lane_file`,
    /// two words a register and group).
    lane_file: Vec<u64>,
    /// Whether the running block runs its groups of threads through the
    /// lane kernel, and the log of its stores (`Ctx::undo`: room for
    /// entries, the first `logged` of them the block's).
    lanes_now: bool,
    /// The lane kernel the running block uses: its copy with hoisted
    /// global checks where the block's check passed.
    lane_code: Option<KernelFn>,
    /// The kernel's hoisted global checks for this launch (`jit::hoist`).
    hoist: Option<Prepared>,
    /// Its accesses' host pointers less their addresses (`Ctx::hoisted`).
    deltas: [u64; MAX_HOISTED],
    undo: Vec<Logged>,
    logged: usize,
    /// Whether the block's lanes failed at a group and the block went on
    /// from it thread by thread ([`super::restart`]).
    restarted: bool,
    /// Whether every thread's state is ready and its resume point 0 (as a
    /// block starts): the block before exited whole in one run, which
    /// left them so.
    clean: bool,
    /// Instructions of this worker's blocks not yet in the launch's count:
    /// where the launch has no budget, each block adds to this one (which
    /// no other worker touches) and a run of blocks to the launch's.
    own_count: &'w AtomicU64,
    /// Whether every thread of the running block is ready at one resume
    /// point (`resume[0]`): at its start, and after the whole block
    /// stopped at once at a barrier that waits for all of it.
    uniform: bool,
    /// Whether the block's last run was all of it passing such a barrier.
    passed: bool,
    /// The instructions this worker ran in the launch's earlier blocks
    /// (`%clock64` of the running block's start).
    clock: u64,
    /// Where the running block's next full check is due (its budgets, the
    /// cancel flag) when its yields come sooner ([`crate::launch::POLL_YIELD_INTERVAL`]).
    full_check_at: u64,
}

impl<'w> Worker<'w> {
    fn new(g: &Grid<'_>, smid: u32, own_count: &'w AtomicU64) -> Worker<'w> {
        let n = g.cfg.block.iter().product::<u32>() as usize;
        let local_words = (g.kernel.frame_bytes as usize).div_ceil(8);
        Worker {
            regs: vec![0; n * g.kernel.nregs as usize],
            local: vec![0; n * local_words],
            // 16 bytes to spare: a lane kernel's 16-byte load from a word
            // near the end (whose other lanes it drops)
            shared: vec![0; (g.shared_bytes as usize).div_ceil(8) + 2],
            gcache: vec![GlobalEntry::EMPTY; g.kernel.global_sites as usize],
            resume: vec![0; n],
            state: vec![State::Ready; n],
            tids: (0..n as u32)
                .map(|lin| {
                    let [x, y, _] = g.cfg.block.map(|d| d.max(1));
                    [lin % x, (lin / x) % y, lin / (x * y), 0]
                })
                .collect(),
            lane_tids: lane_tids(g.cfg.block),
            codes: vec![0; n],
            ctaid: [0; 3],
            smid,
            out: Vec::new(),
            instructions: 0,
            counted: 0,
            exited: 0,
            waiting: 0,
            lane_file: match g.kernel.lanes {
                Some(_) => vec![0; n.div_ceil(LANES as usize) * g.kernel.lane_slots as usize * 2],
                None => Vec::new(),
            },
            lanes_now: false,
            lane_code: None,
            deltas: [0; MAX_HOISTED],
            hoist: g.kernel.hoisted.as_ref().and_then(|(_, sites)| {
                let v = LaunchValues {
                    ntid: g.cfg.block,
                    nctaid: g.cfg.grid,
                    params: g.params,
                    params_len: g.params_len,
                };
                prepare(sites, &v)
            }),
            undo: Vec::new(),
            logged: 0,
            restarted: false,
            clean: true,
            own_count,
            uniform: false,
            passed: false,
            clock: 0,
            full_check_at: 0,
        }
    }

    /// Adds the block's instructions up to `done` to the launch's count and
    /// checks the launch's budget, cancel flag and abort flag.
    fn launch_check(
        &mut self,
        g: &Grid<'_>,
        done: u64,
        place: impl FnOnce() -> String,
    ) -> Result<(), Fault> {
        let cancelled = || cancelled(g);
        let budget = g.limits.per_launch;
        let executed = match budget {
            u64::MAX => self.own_count,
            _ => &g.executed,
        };
        launch_progress(
            executed,
            budget,
            &g.abort,
            cancelled,
            &mut self.counted,
            done,
            place,
        )
    }

    /// The count the running block's instructions go to: the launch's,
    /// or where it has no budget (none to check them against) the
    /// worker's own until [`Self::flush`].
    fn counter<'g>(&self, g: &'g Grid<'_>) -> &'g AtomicU64
    where
        'w: 'g,
    {
        if g.limits.per_launch == u64::MAX {
            self.own_count
        } else {
            &g.executed
        }
    }

    /// Adds the worker's own count to the launch's (between blocks).
    fn flush(&self, g: &Grid<'_>) {
        let n = self.own_count.swap(0, Ordering::Relaxed);
        if n != 0 {
            g.executed.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// The block's first check: where it is due, or sooner where its
    /// threads poll on the thread loop ([`crate::launch::POLL_YIELD_INTERVAL`]).
    fn first_check(&mut self, g: &Grid<'_>) -> u64 {
        self.full_check_at = Self::next_check(g, 0);
        next_yield(0, self.full_check_at, self.polls_briefly(g))
    }

    /// Whether the running block's threads yield every
    /// [`crate::launch::POLL_YIELD_INTERVAL`] instructions: a kernel whose threads may
    /// poll for each other, on the thread loop (a lane kernel's checks are
    /// made in place: they yield no thread).
    fn polls_briefly(&self, g: &Grid<'_>) -> bool {
        g.kernel.waits_in_block && !self.lanes_now
    }

    fn next_check(g: &Grid<'_>, done: u64) -> u64 {
        done.saturating_add(LAUNCH_CHECK_INTERVAL)
            .min(g.limits.per_block)
    }

    /// Runs block `block_id`, its groups of threads through the lane kernel
    /// while the launch's lanes have not parted: where they part, or the
    /// block fails, its stores are undone and it runs again on the thread
    /// loop, which keeps the interpreter's order of threads (its faults,
    /// counts and memory).
    fn run_block(&mut self, g: &Grid<'_>, block_id: u64) -> Result<(), Fault> {
        COMPILED_BLOCKS.fetch_add(1, Ordering::Relaxed);
        // (a block of whole groups only: the thread loop logs no stores)
        let whole = self.state.len().is_multiple_of(LANES as usize);
        let aligned = !g.kernel.lanes_need_aligned || g.cfg.block[0].is_multiple_of(LANES);
        if g.kernel.lanes.is_none() || !whole || !aligned || g.lanes_off.load(Ordering::Relaxed) {
            return self.run_block_once(g, block_id);
        }
        self.lanes_now = true;
        self.restarted = false;
        let r = self.run_block_once(g, block_id);
        self.lanes_now = false;
        if r.is_ok() && !self.restarted {
            LANE_BLOCKS[0].fetch_add(1, Ordering::Relaxed);
            return r;
        }
        LANE_BLOCKS[1].fetch_add(1, Ordering::Relaxed);
        if self.restarted {
            // (its result, fault or not, is the interpreter's)
            return r;
        }
        // SAFETY: the entries are this block's stores, each checked when it
        // ran, into memory that stays while the launch runs.
        unsafe { undo_stores(&self.undo[..self.logged]) };
        g.lanes_off.store(true, Ordering::Relaxed);
        self.counter(g).fetch_sub(self.counted, Ordering::Relaxed);
        self.counted = 0;
        self.out.clear();
        self.run_block_once(g, block_id)
    }

    /// Runs block `block_id` once: every ready thread up to its next stop,
    /// round after round; a barrier all live threads wait at lets them all
    /// go on.
    fn run_block_once(&mut self, g: &Grid<'_>, block_id: u64) -> Result<(), Fault> {
        let [gx, gy, _] = g.cfg.grid;
        self.ctaid = [
            (block_id % gx as u64) as u32,
            ((block_id / gx as u64) % gy as u64) as u32,
            (block_id / (gx as u64 * gy as u64)) as u32,
        ];
        self.instructions = 0;
        self.counted = 0;
        if self.lanes_now {
            // (the copy with hoisted global checks where the block's passes)
            self.lane_code = g.kernel.lanes;
            if let (Some((code, _)), Some(h)) = (&g.kernel.hoisted, &mut self.hoist) {
                if h.block_check(self.ctaid, g.mem, &mut self.deltas) {
                    self.lane_code = Some(*code);
                    HOISTED_BLOCKS.fetch_add(1, Ordering::Relaxed);
                    HOISTED_LOOP_SITES.fetch_add(h.looped(), Ordering::Relaxed);
                }
            }
        }
        if !g.kernel.fresh_start {
            self.regs.fill(0);
        }
        self.local.fill(0);
        self.shared.fill(0);
        if !self.clean {
            self.resume.fill(0);
            self.state.fill(State::Ready);
        }
        // (clean again only where the whole block exits at once)
        self.uniform = true;
        self.passed = false;
        self.clean = false;
        // every thread starts with zeros (or reads none), as does the lane file
        if self.lanes_now && !g.kernel.fresh_start {
            self.lane_file.fill(0);
        }
        self.exited = 0;
        self.waiting = 0;
        let n = self.state.len();
        let local_words = (g.kernel.frame_bytes as usize).div_ceil(8);
        let ntid = g.cfg.block;
        let check_at = self.first_check(g);
        let mut ctx = Ctx {
            shared: self.shared.as_mut_ptr() as *mut u8,
            shared_bytes: g.shared_bytes,
            params: g.params.as_ptr() as *const u8,
            params_len: g.params_len,
            gcache: self.gcache.as_mut_ptr(),
            gsites: self.gcache.len() as u64,
            instructions: 0,
            codes_and: 0,
            codes_or: 0,
            check_at,
            local_bytes: (local_words * 8) as u64,
            yield_line: 0,
            budget: Budget {
                per_block: g.limits.per_block,
                per_launch: g.limits.per_launch,
                executed: self.counter(g),
                abort: &g.abort,
                cancel: g.limits.cancel,
                counted: 0,
                polls: g.kernel.polls,
            },
            ntid,
            nctaid: g.cfg.grid,
            ctaid: self.ctaid,
            dyn_smem: g.cfg.dynamic_shared_bytes,
            smid: self.smid,
            nwarpid: (n as u32).div_ceil(32),
            total_smem: g.shared_bytes,
            reserved_smem: g.reserved_smem,
            clock_base: self.clock,
            start_ns: g.start_ns,
            grid_workspace: g.grid_workspace,
            sleep_ns: 0,
            mem: g.mem,
            memory: g.memory,
            fault: None,
            out: std::mem::take(&mut self.out),
            printf_fifo: g.limits.printf_fifo,
            arrivals: [0; 16],
            lane_file: self.lane_file.as_mut_ptr() as *mut u8,
            log: self.undo.as_mut_ptr(),
            log_len: 0,
            log_cap: if self.lanes_now {
                self.undo.len() as u64
            } else {
                0
            },
            undo: self.lanes_now.then(|| std::mem::take(&mut self.undo)),
            group_count: 0,
            hoisted: self.deltas,
        };
        // as the interpreter schedules: warp by warp, each warp's ready lanes
        // in turn until none of its collectives can be resolved
        let warps = n.div_ceil(32);
        let result = 'block: loop {
            if !g.kernel.collectives {
                // no thread waits at a collective: warp after warp is the
                // block's threads in order
                if let Err(e) = self.run_ready(g, &mut ctx, 0, n) {
                    break 'block Err(e);
                }
                if std::mem::take(&mut self.passed) {
                    continue;
                }
            }
            for w in (0..warps).filter(|_| g.kernel.collectives) {
                loop {
                    if let Err(e) = self.run_ready(g, &mut ctx, w * 32, (w * 32 + 32).min(n)) {
                        break 'block Err(e);
                    }
                    let mut lanes = Lanes {
                        kernel: g.kernel,
                        state: &mut self.state,
                        regs: &mut self.regs,
                        resume: &self.resume,
                    };
                    if !resolve_warp(&mut lanes, w, false) {
                        break;
                    }
                }
            }
            let alive = self.state.len() - self.exited;
            if alive == 0 {
                break Ok(());
            }
            // a thread that yielded in a long loop runs again next round
            // (none is ready when every live one waits at a barrier)
            let yielded = self.waiting < alive && self.state.contains(&State::Ready);
            let mut waiters = Waiters {
                kernel: g.kernel,
                waiting: &mut self.waiting,
                state: &mut self.state,
                resume: &self.resume,
                regs: &mut self.regs,
                arrivals: &mut ctx.arrivals,
            };
            let progressed = waiters.resolve(alive)
                || g.kernel.collectives && {
                    let mut lanes = Lanes {
                        kernel: g.kernel,
                        state: &mut self.state,
                        regs: &mut self.regs,
                        resume: &self.resume,
                    };
                    let mut any = false;
                    for w in 0..warps {
                        any |= resolve_warp(&mut lanes, w, true);
                    }
                    any
                }
                || yielded;
            if !progressed {
                break Err(self.deadlock(g));
            }
            // (after a yield, the whole block together again past a barrier,
            // every thread ready: the next stops can take it at once)
            self.uniform = !g.kernel.collectives
                && self.exited == 0
                && self.waiting == 0
                && self.resume.iter().all(|&r| r == self.resume[0]);
        };
        self.instructions = ctx.instructions;
        self.counted = ctx.budget.counted;
        self.clock = self.clock.wrapping_add(ctx.instructions);
        self.out = std::mem::take(&mut ctx.out);
        self.logged = ctx.log_len as usize;
        if let Some(log) = ctx.undo.take() {
            self.undo = log;
        }
        result
    }

    /// Runs the ready threads of `lo..hi`, in order, each from its resume
    /// point to its next stop: a group of [`LANES`] ready at one resume
    /// point through the lane kernel, the others through the thread loop.
    fn run_ready(
        &mut self,
        g: &Grid<'_>,
        ctx: &mut Ctx<'_>,
        lo: usize,
        hi: usize,
    ) -> Result<(), Fault> {
        let lanes = LANES as usize;
        let mut t = lo;
        while t < hi {
            if self.state[t] != State::Ready {
                t += 1;
                continue;
            }
            let grouped = self.state.len() / lanes * lanes;
            if let (Some(group), true) = (self.lane_code.filter(|_| self.lanes_now), t < grouped) {
                // each group's threads are ready together, at one resume
                // point; mostly every thread of the block at one
                let upto = hi.min(grouped);
                let r = self.resume[t];
                // (a group's threads always stop together: its first one
                // speaks for it)
                let all_ready = self.uniform
                    || self.state[t..upto]
                        .iter()
                        .step_by(lanes)
                        .all(|&s| s == State::Ready)
                        && self.resume[t..upto].iter().step_by(lanes).all(|&x| x == r);
                if all_ready && t.is_multiple_of(lanes) && upto > t {
                    t = self.run_lanes(g, ctx, group, t, upto)?;
                    continue;
                }
                let end = (t..hi.min(grouped))
                    .find(|&k| self.state[k] != State::Ready)
                    .unwrap_or(hi.min(grouped));
                let end = end / lanes * lanes;
                let in_step = (t..end).step_by(lanes).all(|k| self.in_step(k, hi));
                if !t.is_multiple_of(lanes) || end <= t || !in_step {
                    return Err(parted());
                }
                t = self.run_lanes(g, ctx, group, t, end)?;
                continue;
            }
            let end = (t..hi)
                .find(|&k| self.state[k] != State::Ready)
                .unwrap_or(hi);
            t = self.run_single(g, ctx, t, end)?;
        }
        Ok(())
    }

    /// Runs threads `t..end` (all ready) through the thread loop, each to
    /// its next stop; where the run ended (one past a yield or fault).
    fn run_single(
        &mut self,
        g: &Grid<'_>,
        ctx: &mut Ctx<'_>,
        t: usize,
        end: usize,
    ) -> Result<usize, Fault> {
        let stop = self.call(g.kernel.entry, None, ctx, t, end);
        let stop = stop.clamp(t + 1, end);
        self.stops(g, ctx, t, stop, 1)?;
        Ok(stop)
    }

    /// Calls compiled code `f` (the thread loop, or the lane kernel where
    /// `lanes`, the codes its groups OR in before the call) for threads
    /// `t..end`; the thread its run stopped after, as it says.
    fn call(
        &mut self,
        f: KernelFn,
        lanes: Option<u32>,
        ctx: &mut Ctx<'_>,
        t: usize,
        end: usize,
    ) -> usize {
        let tids = if lanes.is_some() {
            &self.lane_tids
        } else {
            &self.tids
        };
        ctx.codes_and = u32::MAX;
        ctx.codes_or = lanes.unwrap_or(0);
        // SAFETY: `f` is the block's thread loop or its lane kernel, both
        // compiled for this kernel: it gets this block's live context, the
        // register files (`nregs` each, or for the lane kernel `nregs`
        // vectors of 16 bytes per group) and local memories (`frame_bytes`
        // rounded to words each) of all `n` threads, their `%tid`s and
        // resume ids and a code slot each; it touches only threads
        // `t..end`, all below `n`.
        let stop = unsafe {
            f(
                ctx,
                self.regs.as_mut_ptr(),
                self.local.as_mut_ptr() as *mut u8,
                t as u32,
                end as u32,
                self.resume.as_ptr(),
                tids.as_ptr(),
                self.codes.as_mut_ptr(),
            )
        };
        stop as usize
    }

    /// Whether the [`LANES`] threads from `t` are in `..hi`, all ready at
    /// one resume point.
    fn in_step(&self, t: usize, hi: usize) -> bool {
        let group = t..t + LANES as usize;
        group.end <= hi
            && group
                .clone()
                .all(|k| self.state[k] == State::Ready && self.resume[k] == self.resume[t])
    }

    /// Runs the groups of threads `t..end` (whole groups, each in step)
    /// through the lane kernel `group`; where the run ended.
    fn run_lanes(
        &mut self,
        g: &Grid<'_>,
        ctx: &mut Ctx<'_>,
        group: KernelFn,
        t: usize,
        end: usize,
    ) -> Result<usize, Fault> {
        // (a restarting lane kernel stores no exit's code: each group it did
        // not return from exited, and the last group's slot says so unless
        // it failed)
        let exits = if g.kernel.restart {
            self.codes[end - LANES as usize] = RET_EXIT;
            RET_EXIT
        } else {
            0
        };
        let stop = self.call(group, Some(exits), ctx, t, end);
        let stop = stop.clamp(t + LANES as usize, end);
        // (the group's first thread's code speaks for it)
        let code = self.codes[stop - LANES as usize];
        if code == RET_PARTED || code == RET_FAULT && g.kernel.restart {
            if g.kernel.restart {
                return Ok(self.restart_group(g, ctx, t, stop - LANES as usize));
            }
            return Err(parted());
        }
        self.stops(g, ctx, t, stop, LANES as usize)?;
        Ok(stop)
    }

    /// Where the group of threads from `failed` failed in a call of a
    /// restarting lane kernel from `t` ([`super::restart`]): its stores are
    /// undone and its count taken back, the groups before it exited, and
    /// the block goes on from it thread by thread (so its fault, count and
    /// memory are the interpreter's); where to go on.
    #[cold]
    #[inline(never)]
    fn restart_group(&mut self, g: &Grid<'_>, ctx: &mut Ctx<'_>, t: usize, failed: usize) -> usize {
        if let Some(log) = &ctx.undo {
            // SAFETY: the entries are the failed group's stores (each group
            // starts the log afresh), each checked when it ran, into
            // memory that stays while the launch runs.
            unsafe { undo_stores(&log[..ctx.log_len as usize]) };
        }
        ctx.log_len = 0;
        ctx.fault = None;
        ctx.instructions = ctx.group_count;
        self.state[t..failed].fill(State::Exited);
        self.exited += failed - t;
        self.uniform = false;
        self.lanes_now = false;
        self.restarted = true;
        g.lanes_off.store(true, Ordering::Relaxed);
        failed
    }

    /// Takes the stop codes of threads `t..stop`, the last call's, which
    /// stop alike `step` by `step` (the first of each `step` has the code):
    /// in bulk where all stopped alike (`Ctx::codes_and` and `codes_or`
    /// equal) and all exited or all wait at one barrier (as a block mostly
    /// does; where that is the whole block at a barrier for all of it, it
    /// passes at once), else one by one.
    fn stops(
        &mut self,
        g: &Grid<'_>,
        ctx: &mut Ctx<'_>,
        t: usize,
        stop: usize,
        step: usize,
    ) -> Result<(), Fault> {
        let same = ctx.codes_and == ctx.codes_or;
        let code = ctx.codes_and;
        let at_barrier =
            code != RET_EXIT && code != RET_FAULT && code & ((1 << STOP_BITS) - 1) == STOP_BARRIER;
        let whole = self.uniform && t == 0 && stop == self.state.len() && !g.kernel.collectives;
        self.uniform = false;
        if same && code == RET_EXIT && whole {
            // the whole block exited at once: nothing reads the states
            // again, which stay ready for the next block (its resume
            // points 0)
            self.exited += stop;
            if self.resume[0] != 0 {
                self.resume.fill(0);
            }
            self.clean = true;
            return Ok(());
        }
        if same && at_barrier && whole && g.kernel.plain_barriers && self.exited == 0 {
            // the whole block waits at a barrier for all of it: it
            // completes at once, every thread ready after it
            self.resume.fill(code >> STOP_BITS);
            self.uniform = true;
            self.passed = true;
            return Ok(());
        }
        if same && code == RET_EXIT {
            self.state[t..stop].fill(State::Exited);
            self.exited += stop - t;
            return Ok(());
        }
        if same && at_barrier {
            self.resume[t..stop].fill(code >> STOP_BITS);
            self.state[t..stop].fill(State::AtBarrier);
            self.waiting += stop - t;
            return Ok(());
        }
        for k in t..stop {
            // (a group's first thread's code is its lanes')
            let code = self.codes[k - (k - t) % step];
            self.stopped(g, ctx, k, code)?;
        }
        Ok(())
    }

    /// Takes thread `t`'s stop code from its last run, `code`.
    fn stopped(
        &mut self,
        g: &Grid<'_>,
        ctx: &mut Ctx<'_>,
        t: usize,
        code: u32,
    ) -> Result<(), Fault> {
        match code {
            RET_EXIT => {
                self.state[t] = State::Exited;
                self.exited += 1;
            }
            RET_FAULT => {
                return Err(ctx.fault.take().unwrap_or_else(|| {
                    Fault::Failed("internal error: compiled code faulted".into())
                }))
            }
            r => {
                let id = r >> STOP_BITS;
                self.resume[t] = id;
                match r & ((1 << STOP_BITS) - 1) {
                    STOP_BARRIER => {
                        self.state[t] = State::AtBarrier;
                        self.waiting += 1;
                    }
                    STOP_WARP => {
                        let pc = g.kernel.resumes.get(id as usize).copied().unwrap_or(1);
                        self.state[t] = State::AtWarp(pc.saturating_sub(1));
                    }
                    _ => self.yielded(g, ctx)?,
                }
            }
        }
        Ok(())
    }

    /// The fault of a block none of whose waiting threads can go on, as the
    /// interpreter words it.
    fn deadlock(&self, g: &Grid<'_>) -> Fault {
        let waiting: Vec<usize> = self
            .state
            .iter()
            .enumerate()
            .filter(|(_, s)| **s != State::Exited)
            .map(|(i, _)| i)
            .take(8)
            .collect();
        let pc_of = |t: usize| match self.state[t] {
            State::AtWarp(pc) => Some(pc),
            State::AtBarrier => g
                .kernel
                .resumes
                .get(self.resume[t] as usize)
                .map(|p| p.saturating_sub(1)),
            _ => g.kernel.resumes.get(self.resume[t] as usize).copied(),
        };
        let line = waiting
            .first()
            .and_then(|&t| pc_of(t))
            .and_then(|pc| g.kernel.lines.get(pc as usize).copied())
            .unwrap_or(0);
        Fault::Failed(format!(
            "deadlock in block {:?}: threads {waiting:?} wait at a barrier or warp op (line {line}) that can never complete",
            self.ctaid
        ))
    }

    /// A thread yielded at a backward branch past `ctx.check_at`: the
    /// block's and launch's budgets and the cancel flag where they are due;
    /// a block whose threads poll yields again soon. A thread that yielded
    /// where no other thread of its block is ready waits for another block,
    /// whose worker may need the core: it takes the `nanosleep` it asked
    /// for, or gives the core away; where others are ready, they run
    /// instead of its sleep (a GPU overlaps them).
    #[cold]
    fn yielded(&mut self, g: &Grid<'_>, ctx: &mut Ctx<'_>) -> Result<(), Fault> {
        let done = ctx.instructions;
        let alone = self.waiting + self.exited + 1 >= self.state.len();
        let sleep = std::mem::take(&mut ctx.sleep_ns);
        if alone && sleep > 0 {
            crate::sleep::nanosleep(sleep);
        }
        if done > self.full_check_at {
            ctx.checkpoint(done, ctx.yield_line)?;
            self.full_check_at = ctx.check_at;
        } else if alone && sleep == 0 {
            std::thread::yield_now();
        }
        ctx.check_at = next_yield(done, self.full_check_at, self.polls_briefly(g));
        Ok(())
    }
}
