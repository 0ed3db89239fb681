//! The launch driver: checks the block's resources and the program, then
//! runs the grid's blocks on host worker threads (`CUMUX_PTX_THREADS` caps
//! them), keeps the first fault in block order and the printf output of
//! every block in block order; a block checks the launch's limits (`watch`)
//! before it starts and at its end.

use super::access::bytes_of;
use super::block::Worker;
use super::blocks::{on_workers, BlockResults};
use super::limits::{
    BLOCK_MEMORY_LIMIT, COOPERATIVE_MEMORY_LIMIT, MAX_COOPERATIVE_BLOCKS, MAX_COOPERATIVE_THREADS,
    RESERVED_SMEM,
};
use super::runtime::{lock, Cdp, Queued};
use super::state::Geo;
use super::watch;
use crate::ir::{Module, Op, SReg};
use crate::launch::{printf_launch_limit, Fault, LaunchConfig, LaunchLimits, LaunchReport};
use crate::memory::DeviceMemory;
use crate::module_info::KernelInfo;
use crate::validate::{check_module, Malformed};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// A lowered module as the interpreter takes it.
#[derive(Debug)]
pub(crate) struct Executable {
    ir: Module,
    /// The interpreter's own check of `ir`, made at its first launch (the
    /// module never changes after that).
    checked: OnceLock<Result<(), Malformed>>,
    /// Whether the module reads `%reserved_smem_offset_*` (its blocks then
    /// get reserved shared memory).
    reserved_smem: bool,
    /// Whether the module calls `malloc`/`free` or the device runtime (its
    /// launches need the heap).
    uses_heap: bool,
    /// Each kernel's description, in kernel order (a device-side launch's
    /// parameter buffer and checks).
    pub(super) kernels: Vec<KernelInfo>,
}

impl Executable {
    pub(crate) fn new(ir: Module) -> Executable {
        let uses = |wanted: fn(&Op) -> bool| {
            ir.funcs
                .iter()
                .any(|f| f.code.iter().any(|i| wanted(&i.op)))
        };
        let reserved_smem = uses(|op| {
            matches!(
                op,
                Op::Special {
                    r: SReg::ReservedSmem(_),
                    ..
                }
            )
        });
        let uses_heap = uses(|op| matches!(op, Op::Malloc { .. } | Op::Free { .. } | Op::Cdp(_)));
        Executable {
            ir,
            checked: OnceLock::new(),
            reserved_smem,
            uses_heap,
            kernels: Vec::new(),
        }
    }

    /// This with each kernel's description, in kernel order.
    pub(crate) fn with_kernels(self, kernels: Vec<KernelInfo>) -> Executable {
        Executable { kernels, ..self }
    }

    /// The lowered module.
    pub(crate) fn ir(&self) -> &Module {
        &self.ir
    }

    /// Runs kernel `k` (a configuration already checked against the
    /// kernel's limits) over all blocks. A `cooperative` launch runs every
    /// block at once, each on a host thread of its own, with a grid
    /// workspace for `this_grid().sync()`.
    pub(crate) fn launch(
        &self,
        mem: &DeviceMemory,
        k: usize,
        cfg: &LaunchConfig,
        params: &[u8],
        limits: &LaunchLimits<'_>,
        cooperative: bool,
    ) -> LaunchReport {
        let pending = AtomicUsize::new(0);
        if !cooperative {
            return self.launch_tree(mem, k, cfg, params, limits, 0, &pending);
        }
        with_grid_workspace(mem, cfg, |workspace| {
            self.launch_tree(mem, k, cfg, params, limits, workspace, &pending)
        })
    }

    /// [`Executable::launch`] with the grid workspace at `grid_workspace`
    /// (0: not a cooperative launch).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_in(
        &self,
        mem: &DeviceMemory,
        k: usize,
        cfg: &LaunchConfig,
        params: &[u8],
        limits: &LaunchLimits<'_>,
        grid_workspace: u64,
        cdp: &Cdp<'_>,
    ) -> LaunchReport {
        // the interpreter's side of the boundary: it runs well-formed modules only
        if let Err(e) = self.checked.get_or_init(|| check_module(&self.ir)) {
            return LaunchReport::failed(Fault::Failed(format!(
                "internal error: the interpreter was handed a malformed module: {e}"
            )));
        }
        debug_assert!(k < self.ir.kernels.len(), "kernel {k} out of range");
        let prog = &self.ir;
        let kernel = prog.kernels[k];
        let threads: u64 = cfg.block.iter().map(|&v| v as u64).product();
        let f = &prog.funcs[kernel as usize];
        let per_thread = f.nregs as u64 * 8 + f.frame_bytes as u64;
        let (resident, memory) = match resident_memory(cfg, per_thread, grid_workspace != 0) {
            Ok(fits) => fits,
            Err(fault) => return LaunchReport::failed(fault),
        };
        let mut shared_bytes = prog.dyn_shared_base as u64 + cfg.dynamic_shared_bytes as u64;
        let reserved_smem = shared_bytes.next_multiple_of(16);
        if self.reserved_smem {
            shared_bytes = reserved_smem + RESERVED_SMEM;
        }
        if self.uses_heap {
            if let Err(e) = mem.ensure_heap() {
                return LaunchReport::failed(Fault::OutOfResources(format!(
                    "no room for the device heap of {} bytes: {e}",
                    mem.heap_limit()
                )));
            }
        }
        let view = mem.view();
        let mut pwords = vec![0u64; params.len().div_ceil(8)];
        bytes_of(&mut pwords)[..params.len()].copy_from_slice(params);
        let start_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let executed = AtomicU64::new(0);
        let abort = AtomicBool::new(false);
        let g = Geo {
            workers: limits.workers,
            prog,
            mem: &view,
            memory: mem,
            params: &pwords,
            params_len: params.len() as u64,
            config: *cfg,
            shared_bytes,
            reserved_smem,
            start_ns,
            kernel,
            budget: limits.per_block,
            launch_budget: limits.per_launch,
            executed: &executed,
            cancel: limits.cancel,
            abort: &abort,
            grid_workspace,
            printf_fifo: limits.printf_fifo,
            lockstep: prog.funcs.iter().enumerate().any(|(i, f)| {
                f.uses_volatile && (i as u32 == kernel || !prog.kernels.contains(&(i as u32)))
            }),
            waits_in_block: watch::waits_in_block(prog, kernel),
            cdp,
            kernels: &self.kernels,
            stack_limit: if grid_workspace != 0 {
                memory / resident.max(1) as usize
            } else {
                (memory / threads.max(1) as usize).max(1 << 20)
            },
        };
        run_grid(&g)
    }
}

/// Whether the registers and local memory of the threads resident at once
/// (a block's; a cooperative launch's, all its blocks') fit their limit,
/// each thread taking `per_thread` bytes: those threads and the limit.
pub(crate) fn resident_memory(
    cfg: &LaunchConfig,
    per_thread: u64,
    cooperative: bool,
) -> Result<(u64, usize), Fault> {
    let threads: u64 = cfg.block.iter().map(|&v| v as u64).product();
    let (resident, memory) = if cooperative {
        let blocks: u64 = cfg.grid.iter().map(|&v| v as u64).product();
        (threads * blocks, COOPERATIVE_MEMORY_LIMIT)
    } else {
        (threads, BLOCK_MEMORY_LIMIT)
    };
    if per_thread.saturating_mul(resident) > memory as u64 {
        return Err(Fault::OutOfResources(format!(
            "{resident} threads with {per_thread} bytes of registers and local memory each"
        )));
    }
    Ok((resident, memory))
}

/// Runs `launch` with a cooperative launch's grid workspace (the driver's
/// `{ u32 size, u32 barrier }` that `this_grid().sync()` counts in, its
/// address in `%envreg1`/`%envreg2`), freed after; a grid larger than can run
/// at once fails with code 720, as on a GPU.
pub(crate) fn with_grid_workspace(
    mem: &DeviceMemory,
    cfg: &LaunchConfig,
    launch: impl FnOnce(u64) -> LaunchReport,
) -> LaunchReport {
    let blocks: u64 = cfg.grid.iter().map(|&v| v as u64).product();
    let threads = blocks * cfg.block.iter().map(|&v| v as u64).product::<u64>();
    if blocks > MAX_COOPERATIVE_BLOCKS || threads > MAX_COOPERATIVE_THREADS {
        return LaunchReport::failed(Fault::CooperativeTooLarge(format!(
            "{blocks} blocks of {threads} threads in all in a cooperative launch; at most \
             {MAX_COOPERATIVE_BLOCKS} blocks and {MAX_COOPERATIVE_THREADS} threads run at once"
        )));
    }
    let workspace = match mem.alloc(8) {
        Ok(w) => w,
        Err(e) => {
            return LaunchReport::failed(Fault::OutOfResources(format!("no grid workspace: {e}")))
        }
    };
    let _ = mem.write(workspace, &8u32.to_le_bytes());
    let report = launch(workspace);
    let _ = mem.free(workspace);
    report
}

/// Runs every block of the grid on host workers, each taking the next block
/// until all ran or one faulted; the fault of the lowest block wins.
fn run_grid(g: &Geo<'_>) -> LaunchReport {
    let total: u64 = g.config.grid.iter().map(|&v| v as u64).product();
    let next = AtomicU64::new(0);
    let abort = g.abort;
    let results = BlockResults::default();
    let workers = Some(g.workers)
        .filter(|&n| n > 0)
        .or_else(|| {
            std::env::var("CUMUX_PTX_THREADS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|&n| n > 0)
        })
        .or_else(|| std::thread::available_parallelism().map(|n| n.get()).ok())
        .unwrap_or(1);
    // a cooperative launch's blocks wait for each other: all run at once
    let workers = if g.grid_workspace != 0 {
        total as usize
    } else {
        workers
    }
    .min(total.max(1) as usize)
    .max(1);
    let work = |smid: u32| {
        let mut w = Worker::new(smid);
        let mut outs = Vec::new();
        loop {
            if abort.load(Ordering::Relaxed) {
                break;
            }
            let id = next.fetch_add(1, Ordering::Relaxed);
            if id >= total {
                break;
            }
            if let Some(cancelled) = watch::cancelled(g) {
                results.fault(id, cancelled);
                abort.store(true, Ordering::Relaxed);
                break;
            }
            w.block.out.clear();
            watch::start_block(g, &mut w.block);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run_block(g, id)));
            let r = match r {
                Ok(r) => r,
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panic".into());
                    // the worker state may be inconsistent: start afresh
                    w.threads.clear();
                    Err(Fault::Failed(format!(
                        "internal error in interpreter: {msg}"
                    )))
                }
            };
            // counted whatever the block's result; its own fault comes first
            let r = r.and(watch::end_block(g, &mut w.block));
            if !w.block.out.is_empty() {
                outs.push((id, std::mem::take(&mut w.block.out)));
            }
            if let Err(e) = r {
                // a block stopped because another faulted leaves that fault
                let stopped = abort.load(Ordering::Relaxed) && matches!(e, Fault::Cancelled(_));
                if !stopped {
                    results.fault(id, e);
                }
                abort.store(true, Ordering::Relaxed);
                break;
            }
        }
        results.outputs(outs);
    };
    on_workers(workers, &work);
    results.report(
        g.executed.load(Ordering::Relaxed),
        printf_launch_limit(g.printf_fifo),
    )
}

impl Executable {
    /// Runs kernel `k`, then the launches its threads queued (tail launches
    /// last), each with its own tree, one at a time, depth first: the whole
    /// tree is one report, its first fault the tree's. A launch stays
    /// pending until its own tree is done, as a grid on a GPU is not
    /// complete before its children; the walk keeps its own stack, so a
    /// chain as deep as the pending limit needs no deeper host stack.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_tree(
        &self,
        mem: &DeviceMemory,
        k: usize,
        cfg: &LaunchConfig,
        params: &[u8],
        limits: &LaunchLimits<'_>,
        grid_workspace: u64,
        pending: &AtomicUsize,
    ) -> LaunchReport {
        let root = self.run_grid(mem, k, cfg, params, limits, grid_workspace, pending);
        let mut stack = vec![root];
        loop {
            let Some(top) = stack.last_mut() else {
                unreachable!("the root is popped last");
            };
            let Some(q) = top.children.pop_front() else {
                let done = stack.pop().expect("a grid on the stack");
                let Some(parent) = stack.last_mut() else {
                    return done.report;
                };
                pending.fetch_sub(1, Ordering::Relaxed);
                parent.report.stdout.extend_from_slice(&done.report.stdout);
                parent.report.instructions += done.report.instructions;
                parent.report.result = done.report.result;
                continue;
            };
            let mut p = vec![0u8; q.params_len];
            let read = mem.read(q.buf, &mut p);
            mem.heap_free(q.buf);
            if top.report.result.is_err() {
                pending.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            if let Err(e) = read {
                top.report.result = Err(Fault::Failed(format!("parameter buffer lost: {e:?}")));
                pending.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            let child = self.run_grid(mem, q.kernel, &q.cfg, &p, limits, 0, pending);
            stack.push(child);
        }
    }

    /// Runs one grid of a launch tree: its report and the launches it queued,
    /// tail launches last.
    #[allow(clippy::too_many_arguments)]
    fn run_grid(
        &self,
        mem: &DeviceMemory,
        k: usize,
        cfg: &LaunchConfig,
        params: &[u8],
        limits: &LaunchLimits<'_>,
        grid_workspace: u64,
        pending: &AtomicUsize,
    ) -> TreeGrid {
        let cdp = Cdp::new(pending);
        let report = self.launch_in(mem, k, cfg, params, limits, grid_workspace, &cdp);
        for buf in lock(&cdp.bufs).keys() {
            mem.heap_free(*buf);
        }
        let mut queue = std::mem::take(&mut *lock(&cdp.queue));
        queue.sort_by_key(|q| q.tail);
        TreeGrid {
            report,
            children: queue.into(),
        }
    }
}

/// A grid of a launch tree that ran: its report so far (its finished
/// children's folded in) and its launches still to run.
struct TreeGrid {
    report: LaunchReport,
    children: std::collections::VecDeque<Queued>,
}
