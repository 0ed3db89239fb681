//! A launch of a compiled kernel: blocks over host workers, inside a block the
//! threads run warp by warp from resume point to barrier or collective, with
//! the interpreter's scheduling, budgets, cancel flag, deadlocks and faults.

use super::compiled::CompiledKernel;
use super::runtime::{Ctx, GlobalEntry, RET_EXIT, RET_FAULT, STOP_BARRIER, STOP_BITS, STOP_WARP};
use super::warp::{resolve_warp, Lanes, State};
use crate::exec::{launch_progress, on_workers, BlockResults, BLOCK_MEMORY_LIMIT};
use crate::ir::{BarRed, Module, Op, SReg, Src, NONE};
use crate::launch::{Fault, LaunchConfig, LaunchLimits, LaunchReport, LAUNCH_CHECK_INTERVAL};
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
    limits: &'a LaunchLimits<'a>,
    executed: AtomicU64,
    abort: AtomicBool,
}

/// Runs compiled kernel `kernel` of module `m` over the grid (a
/// configuration already checked against the kernel's limits).
pub(crate) fn launch(
    kernel: &CompiledKernel,
    m: &Module,
    mem: &DeviceMemory,
    cfg: &LaunchConfig,
    params: &[u8],
    limits: &LaunchLimits<'_>,
) -> LaunchReport {
    let threads: u64 = cfg.block.iter().map(|&v| v as u64).product();
    let per_thread = kernel.nregs as u64 * 8 + kernel.frame_bytes as u64;
    if per_thread.saturating_mul(threads) > BLOCK_MEMORY_LIMIT as u64 {
        return LaunchReport::failed(Fault::OutOfResources(format!(
            "{threads} threads with {per_thread} bytes of registers and local memory each"
        )));
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
        limits,
        executed: AtomicU64::new(0),
        abort: AtomicBool::new(false),
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
    let next = AtomicU64::new(0);
    let results = BlockResults::default();
    let work = |smid: u32| {
        let mut w = Worker::new(g, smid);
        let mut outs = Vec::new();
        loop {
            if g.abort.load(Ordering::Relaxed) {
                break;
            }
            let id = next.fetch_add(1, Ordering::Relaxed);
            if id >= total {
                break;
            }
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
        }
        results.outputs(outs);
    };
    let threads: u64 = g.cfg.block.iter().map(|&v| v as u64).product();
    let workers = worker_count(g.limits, total, threads);
    on_workers(workers, &work);
    results.report(g.executed.load(Ordering::Relaxed))
}

fn cancelled(g: &Grid<'_>) -> bool {
    g.limits.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
}

/// One worker's buffers, reused block after block.
struct Worker {
    regs: Vec<u64>,
    local: Vec<u64>,
    shared: Vec<u64>,
    /// The global allocation each access site resolved last (kept from
    /// block to block: allocations stay while the launch runs).
    gcache: Vec<GlobalEntry>,
    resume: Vec<u32>,
    state: Vec<State>,
    /// Each thread's `%tid` (x, y, z, 0), and the stop code of its last run.
    tids: Vec<[u32; 4]>,
    codes: Vec<u32>,
    ctaid: [u32; 3],
    /// The worker's index (`%smid`).
    smid: u32,
    /// The running block's `printf` output.
    out: Vec<u8>,
    /// Instructions of the running block, and those already counted.
    instructions: u64,
    counted: u64,
    /// Threads of the running block that exited.
    exited: usize,
}

impl Worker {
    fn new(g: &Grid<'_>, smid: u32) -> Worker {
        let n = g.cfg.block.iter().product::<u32>() as usize;
        let local_words = (g.kernel.frame_bytes as usize).div_ceil(8);
        Worker {
            regs: vec![0; n * g.kernel.nregs as usize],
            local: vec![0; n * local_words],
            shared: vec![0; (g.shared_bytes as usize).div_ceil(8)],
            gcache: vec![GlobalEntry::EMPTY; g.kernel.global_sites as usize],
            resume: vec![0; n],
            state: vec![State::Ready; n],
            tids: (0..n as u32)
                .map(|lin| {
                    let [x, y, _] = g.cfg.block.map(|d| d.max(1));
                    [lin % x, (lin / x) % y, lin / (x * y), 0]
                })
                .collect(),
            codes: vec![0; n],
            ctaid: [0; 3],
            smid,
            out: Vec::new(),
            instructions: 0,
            counted: 0,
            exited: 0,
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
        let (executed, budget) = (&g.executed, g.limits.per_launch);
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

    fn next_check(g: &Grid<'_>, done: u64) -> u64 {
        done.saturating_add(LAUNCH_CHECK_INTERVAL)
            .min(g.limits.per_block)
    }

    /// Runs block `block_id`: every ready thread up to its next stop, round
    /// after round; a barrier all live threads wait at lets them all go on.
    fn run_block(&mut self, g: &Grid<'_>, block_id: u64) -> Result<(), Fault> {
        let [gx, gy, _] = g.cfg.grid;
        self.ctaid = [
            (block_id % gx as u64) as u32,
            ((block_id / gx as u64) % gy as u64) as u32,
            (block_id / (gx as u64 * gy as u64)) as u32,
        ];
        self.instructions = 0;
        self.counted = 0;
        if !g.kernel.fresh_start {
            self.regs.fill(0);
        }
        self.local.fill(0);
        self.shared.fill(0);
        self.resume.fill(0);
        self.state.fill(State::Ready);
        self.exited = 0;
        let n = self.state.len();
        let local_words = (g.kernel.frame_bytes as usize).div_ceil(8);
        let ntid = g.cfg.block;
        let mut ctx = Ctx {
            shared: self.shared.as_mut_ptr() as *mut u8,
            shared_bytes: g.shared_bytes,
            params: g.params.as_ptr() as *const u8,
            params_len: g.params_len,
            gcache: self.gcache.as_mut_ptr(),
            gsites: self.gcache.len() as u64,
            instructions: 0,
            check_at: Self::next_check(g, 0),
            local_bytes: (local_words * 8) as u64,
            yield_line: 0,
            ntid,
            nctaid: g.cfg.grid,
            ctaid: self.ctaid,
            dyn_smem: g.cfg.dynamic_shared_bytes,
            smid: self.smid,
            nwarpid: (n as u32).div_ceil(32),
            total_smem: g.shared_bytes,
            reserved_smem: g.reserved_smem,
            mem: g.mem,
            memory: g.memory,
            fault: None,
            out: std::mem::take(&mut self.out),
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
            let yielded = self.state.contains(&State::Ready);
            let progressed = self.resolve_barrier(g, alive)
                || {
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
        };
        self.instructions = ctx.instructions;
        self.out = std::mem::take(&mut ctx.out);
        result
    }

    /// Runs the ready threads of `lo..hi`, in order, each from its resume
    /// point to its next stop.
    fn run_ready(
        &mut self,
        g: &Grid<'_>,
        ctx: &mut Ctx<'_>,
        lo: usize,
        hi: usize,
    ) -> Result<(), Fault> {
        let mut t = lo;
        while t < hi {
            if self.state[t] != State::Ready {
                t += 1;
                continue;
            }
            let end = (t..hi)
                .find(|&k| self.state[k] != State::Ready)
                .unwrap_or(hi);
            // SAFETY: the compiled kernel gets this block's live context, the
            // register files (`nregs` each) and local memories (`frame_bytes`
            // rounded to words each) of all `n` threads, what it was compiled
            // for, their `%tid`s and resume ids and a code slot each; it
            // touches only threads `t..end`, all below `n`.
            let stop = unsafe {
                (g.kernel.entry)(
                    ctx,
                    self.regs.as_mut_ptr(),
                    self.local.as_mut_ptr() as *mut u8,
                    t as u32,
                    end as u32,
                    self.resume.as_ptr(),
                    self.tids.as_ptr(),
                    self.codes.as_mut_ptr(),
                )
            } as usize;
            let stop = stop.clamp(t + 1, end);
            for k in t..stop {
                self.stopped(g, ctx, k)?;
            }
            t = stop;
        }
        Ok(())
    }

    /// Takes thread `t`'s stop code from its last run.
    fn stopped(&mut self, g: &Grid<'_>, ctx: &mut Ctx<'_>, t: usize) -> Result<(), Fault> {
        match self.codes[t] {
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
                    STOP_BARRIER => self.state[t] = State::AtBarrier,
                    STOP_WARP => {
                        let pc = g.kernel.resumes.get(id as usize).copied().unwrap_or(1);
                        self.state[t] = State::AtWarp(pc.saturating_sub(1));
                    }
                    _ => self.checkpoint(g, ctx)?,
                }
            }
        }
        Ok(())
    }

    /// Lets every thread waiting at the barrier go on once all `alive`
    /// threads wait there, with the interpreter's `bar.red` reduction of
    /// their predicates (the mode of the last waiter's op) written to each
    /// one's destination; whether it did.
    fn resolve_barrier(&mut self, g: &Grid<'_>, alive: usize) -> bool {
        let waiting = self
            .state
            .iter()
            .filter(|&&s| s == State::AtBarrier)
            .count();
        if waiting == 0 || waiting < alive {
            return false;
        }
        if !g.kernel.bar_red {
            for s in self.state.iter_mut() {
                if *s == State::AtBarrier {
                    *s = State::Ready;
                }
            }
            return true;
        }
        let nregs = g.kernel.nregs as usize;
        let bar_of = |w: &Worker, t: usize| {
            let pc = g.kernel.resumes.get(w.resume[t] as usize)?;
            match g.kernel.ops.get(pc.checked_sub(1)? as usize)? {
                &Op::Bar {
                    red, d, p, pneg, ..
                } => Some((red, d, p, pneg)),
                _ => None,
            }
        };
        let get = |w: &Worker, t: usize, s: Src| match s {
            Src::Reg(r) => w.regs.get(t * nregs + r as usize).copied().unwrap_or(0),
            Src::Imm(v) => v,
            Src::Frame(o) => o as u64,
        };
        let waiters: Vec<usize> = (0..self.state.len())
            .filter(|&t| self.state[t] == State::AtBarrier)
            .collect();
        let mut red = BarRed::None;
        for &t in &waiters {
            if let Some((r, ..)) = bar_of(self, t) {
                red = r;
            }
        }
        let (mut popc, mut all, mut any) = (0u64, true, false);
        if red != BarRed::None {
            for &t in &waiters {
                if let Some((_, _, p, pneg)) = bar_of(self, t) {
                    let v = (get(self, t, p) & 1 != 0) != pneg;
                    popc += v as u64;
                    all &= v;
                    any |= v;
                }
            }
        }
        for &t in &waiters {
            if let Some((_, d, ..)) = bar_of(self, t).filter(|b| b.1 != NONE) {
                let v = match red {
                    BarRed::Popc => popc,
                    BarRed::And => all as u64,
                    BarRed::Or => any as u64,
                    BarRed::None => 0,
                };
                if let Some(slot) = self.regs.get_mut(t * nregs + d as usize) {
                    *slot = v;
                }
            }
            self.state[t] = State::Ready;
        }
        true
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

    /// The check of a thread that yielded at a backward branch past
    /// `ctx.check_at`: the block's and launch's budgets and the cancel flag.
    #[cold]
    fn checkpoint(&mut self, g: &Grid<'_>, ctx: &mut Ctx<'_>) -> Result<(), Fault> {
        let done = ctx.instructions;
        let line = ctx.yield_line;
        if done > g.limits.per_block {
            return Err(Fault::Timeout(format!(
                "instruction limit of {} per block exceeded at line {line}",
                g.limits.per_block
            )));
        }
        let ctaid = self.ctaid;
        self.launch_check(g, done, || format!("at line {line} of block {ctaid:?}"))?;
        ctx.check_at = Self::next_check(g, done);
        Ok(())
    }
}
