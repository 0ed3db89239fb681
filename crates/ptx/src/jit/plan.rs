//! Which kernels the compiler takes (no tensor ops, indirect or recursive
//! calls) and the shape of one: basic blocks, resume points, the registers
//! live at each.

use super::dirty::{dirty_in, dirty_resumed, stops, RegSet};
use super::inline::{CHECKS, UNCOUNTED};
use super::restart::{final_stores, restartable};
use crate::ir::{Func, MemOrder, Op, Src, NONE};

/// The compiler's view of one kernel.
pub(super) struct Plan {
    /// First pc of each basic block, ascending (block `b` ends where `b + 1` starts).
    pub starts: Vec<u32>,
    /// The pcs a thread resumes at, indexed by resume id: 0, the pc after
    /// each barrier or warp collective, each backward branch's target.
    pub resumes: Vec<u32>,
    /// Registers live on entry to each basic block.
    pub live_in: Vec<Vec<u32>>,
    /// Registers a `shfl` reads as its value: another lane may read them
    /// whenever this one stands still, so every stop and exit stores them.
    pub shuffled: Vec<u32>,
    /// No branch goes back to pc 0: resume id 0 is only a thread's start,
    /// which reads its registers as 0 without the register file.
    pub fresh_start: bool,
    /// Registers possibly changed since the thread resumed, on entry to
    /// each basic block.
    pub dirty_in: Vec<RegSet>,
    /// The same for a run that began at a resume point other than a fresh
    /// thread start (`None`: only a start reaches the block); a stop
    /// stores the rest of `dirty_in` only in a run that began at the start.
    pub dirty_resumed: Vec<Option<RegSet>>,
    /// Whether a lane kernel is built too ([`super::lanes`]).
    pub lanes: bool,
    /// Whether a failed lane group goes on thread by thread from itself
    /// ([`restartable`]), and the stores then logged by none
    /// ([`final_stores`]).
    pub restart: bool,
    pub final_stores: Vec<u32>,
}

impl Plan {
    /// The basic block starting at `pc` (a leader).
    pub(super) fn block_at(&self, pc: u32) -> usize {
        self.starts.partition_point(|&s| s < pc)
    }

    /// The resume id of `pc` (a resume point).
    pub(super) fn resume_id(&self, pc: u32) -> u32 {
        self.resumes.partition_point(|&s| s < pc) as u32
    }
}

/// Why kernel `k` of `m` (`f`, its calls inlined) stays on the
/// interpreter, or its plan.
pub(super) fn plan(f: &Func) -> Result<Plan, String> {
    for inst in &f.code {
        supported(&inst.op).map_err(|why| format!("line {}: {why}", inst.line))?;
    }
    let n = f.code.len() as u32;
    let mut leaders = vec![0u32];
    let mut resumes = vec![0u32];
    // lanes run every kernel without warp collectives (whose lanes would
    // wait for threads of other groups) or ordered accesses (a block that
    // published a flag to other blocks can't be undone)
    let lanes = !lanes_off()
        && !f
            .code
            .iter()
            .any(|i| stops(&i.op) && !matches!(i.op, Op::Bar { .. }) || ordered(&i.op));
    for (pc, inst) in f.code.iter().enumerate() {
        let pc = pc as u32;
        match inst.op {
            Op::Bra { target } => {
                leaders.push(target);
                // where a budget check may stop the thread (`branch_to`)
                if (target <= pc && inst.line & UNCOUNTED == 0) || inst.line & CHECKS != 0 {
                    resumes.push(target);
                }
                leaders.push(pc + 1);
            }
            Op::Ret | Op::Exit | Op::Trap(_) => leaders.push(pc + 1),
            ref op if stops(op) => {
                leaders.push(pc + 1);
                resumes.push(pc + 1);
            }
            _ => {}
        }
    }
    for v in [&mut leaders, &mut resumes] {
        v.retain(|&p| p < n);
        v.sort_unstable();
        v.dedup();
    }
    let live_in = liveness(f, &leaders);
    let mut shuffled: Vec<u32> = f
        .code
        .iter()
        .filter_map(|i| match i.op {
            Op::Shfl { a: Src::Reg(r), .. } => Some(r),
            _ => None,
        })
        .collect();
    shuffled.sort_unstable();
    shuffled.dedup();
    let fresh_start = !f.code.iter().any(|i| matches!(i.op, Op::Bra { target: 0 }));
    let dirty_in = dirty_in(f, &leaders, fresh_start);
    let dirty_resumed = dirty_resumed(f, &leaders, &resumes, fresh_start);
    let restart = lanes && restartable(f, &resumes);
    let final_stores = if restart { final_stores(f) } else { Vec::new() };
    Ok(Plan {
        restart,
        final_stores,
        lanes,
        dirty_in,
        dirty_resumed,
        fresh_start,
        starts: leaders,
        resumes,
        live_in,
        shuffled,
    })
}

/// Whether `op` is a load or store ordered with other threads' accesses
/// (volatile, relaxed, acquire or release).
pub(super) fn ordered(op: &Op) -> bool {
    matches!(op, Op::Ld { order, .. } | Op::St { order, .. } if *order != MemOrder::Plain)
}

/// Whether a kernel of `ops` makes ordered loads (volatile, relaxed,
/// acquire): it may spin on what another thread writes.
pub(super) fn polls(ops: &[Op]) -> bool {
    ops.iter()
        .any(|op| ordered(op) && matches!(op, Op::Ld { .. }))
}

/// Whether `CUMUX_PTX_LANES=0` turns lane kernels off (read once).
fn lanes_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("CUMUX_PTX_LANES").is_ok_and(|v| v == "0"))
}

/// Whether lanes leave `op` to the thread loop, which runs it in thread
/// order as the interpreter does: its output, heap blocks, atomics' old
/// values and faults come in that order.
pub(super) fn one_at_a_time(op: &Op) -> bool {
    matches!(
        op,
        Op::Atom { .. }
            | Op::Printf { .. }
            | Op::AssertFail(_)
            | Op::Malloc { .. }
            | Op::Free { .. }
            | Op::CpAsync { .. }
            | Op::Trap(_)
    )
}

/// Whether the compiler takes `op`.
fn supported(op: &Op) -> Result<(), String> {
    match op {
        // run by helpers in thread order
        op if one_at_a_time(op) => Ok(()),
        Op::Mov { .. }
        | Op::Int { .. }
        | Op::Float { .. }
        | Op::Un { .. }
        | Op::Tern { .. }
        | Op::Bfi { .. }
        | Op::Relu { .. }
        | Op::Prmt { .. }
        | Op::Lop3 { .. }
        | Op::Setp { .. }
        | Op::Set { .. }
        | Op::Testp { .. }
        | Op::Cvt { .. }
        | Op::Pack { .. }
        | Op::Unpack { .. }
        | Op::Carry { .. }
        | Op::Cvta { .. }
        | Op::Isspacep { .. }
        | Op::Shfl { .. }
        | Op::Vote { .. }
        | Op::Match { .. }
        | Op::Redux { .. }
        | Op::WarpSync { .. }
        | Op::Activemask { .. }
        | Op::WarpStep
        | Op::Sleep { .. }
        | Op::Bra { .. }
        | Op::Ret
        | Op::Exit
        | Op::Nop => Ok(()),
        Op::Ld { size, n, .. } | Op::St { size, n, .. } => {
            if matches!(size, 1 | 2 | 4 | 8) && (1..=4).contains(n) {
                Ok(())
            } else {
                Err(format!("{n} accesses of {size} bytes"))
            }
        }
        // every special register (`emit_ops::special`; the clocks as the
        // worker's instruction count)
        Op::Special { .. } => Ok(()),
        // `bar.sync`, `bar.red` and `bar.arrive` of any id and count (the
        // launch resolves them as the interpreter does)
        Op::Bar { id, count, .. } => match (id, count) {
            (Src::Frame(_), _) | (_, Src::Frame(_)) => Err("a barrier of a frame address".into()),
            _ => Ok(()),
        },
        op => Err(format!("op {}", op_name(op))),
    }
}

/// The variant name of `op`, for the reason a kernel stays interpreted.
fn op_name(op: &Op) -> String {
    let text = format!("{op:?}");
    text.split([' ', '(', '{'])
        .next()
        .unwrap_or("?")
        .to_string()
}

/// Registers live on entry to each basic block (guarded writes kill nothing).
fn liveness(f: &Func, starts: &[u32]) -> Vec<Vec<u32>> {
    let words = (f.nregs as usize).div_ceil(64);
    let nb = starts.len();
    let end_of = |b: usize| starts.get(b + 1).copied().unwrap_or(f.code.len() as u32);
    let block_at = |pc: u32| starts.partition_point(|&s| s < pc);
    let mut uses = vec![vec![0u64; words]; nb];
    let mut defs = vec![vec![0u64; words]; nb];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); nb];
    let set = |v: &mut Vec<u64>, r: u32| {
        if let Some(w) = v.get_mut(r as usize / 64) {
            *w |= 1 << (r % 64);
        }
    };
    let has = |v: &[u64], r: u32| {
        v.get(r as usize / 64)
            .is_some_and(|w| w >> (r % 64) & 1 != 0)
    };
    for b in 0..nb {
        let mut falls = true;
        for pc in starts[b]..end_of(b) {
            let inst = &f.code[pc as usize];
            let mut read = |r: u32| {
                if !has(&defs[b], r) {
                    set(&mut uses[b], r)
                }
            };
            if inst.guard != NONE {
                read(inst.guard);
            }
            inst.op.src_regs().into_iter().for_each(&mut read);
            if inst.guard == NONE {
                inst.op.for_each_dst(|d| set(&mut defs[b], d));
            }
            let guarded = inst.guard != NONE;
            match inst.op {
                Op::Bra { target } => {
                    succs[b].push(block_at(target));
                    falls = guarded;
                }
                Op::Ret | Op::Exit | Op::Trap(_) => falls = guarded,
                _ => {}
            }
        }
        if falls && b + 1 < nb {
            succs[b].push(b + 1);
        }
    }
    let mut live = vec![vec![0u64; words]; nb];
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..nb).rev() {
            let mut out = vec![0u64; words];
            for &s in &succs[b] {
                for (o, l) in out.iter_mut().zip(&live[s]) {
                    *o |= l;
                }
            }
            for w in 0..words {
                let v = uses[b][w] | (out[w] & !defs[b][w]);
                if v != live[b][w] {
                    live[b][w] = v;
                    changed = true;
                }
            }
        }
    }
    live.iter()
        .map(|l| (0..f.nregs).filter(|&r| has(l, r)).collect())
        .collect()
}
