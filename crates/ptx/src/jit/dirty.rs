//! Which registers a thread may have changed since it last resumed: a stop
//! stores back only those (the others hold in its register file already).

use crate::ir::{Func, Op, NONE};

/// A set of registers, one bit each.
pub(super) type RegSet = Vec<u64>;

fn add(set: &mut RegSet, r: u32) {
    if let Some(w) = set.get_mut(r as usize / 64) {
        *w |= 1 << (r % 64);
    }
}

/// Whether `set` holds `r`.
pub(super) fn holds(set: &RegSet, r: u32) -> bool {
    set.get(r as usize / 64)
        .is_some_and(|w| w >> (r % 64) & 1 != 0)
}

/// Whether `op` stops its thread when it runs (a barrier it waits at, a
/// warp collective, whose result is written to the register file, not the
/// code's, or a lockstep step).
pub(super) fn stops(op: &Op) -> bool {
    matches!(
        op,
        Op::Bar { wait: true, .. }
            | Op::Shfl { .. }
            | Op::Vote { .. }
            | Op::Match { .. }
            | Op::Redux { .. }
            | Op::WarpSync { .. }
            | Op::Activemask { .. }
            | Op::WarpStep
    )
}

/// The registers written by `f.code[from..to]` (guarded or not), added to `set`.
pub(super) fn add_writes(f: &Func, from: u32, to: u32, set: &mut RegSet) {
    for inst in &f.code[from as usize..to as usize] {
        if !stops(&inst.op) {
            inst.op.for_each_dst(|d| {
                if d != NONE {
                    add(set, d)
                }
            });
        }
    }
}

/// The basic blocks' successors and the registers each writes.
fn graph(f: &Func, starts: &[u32]) -> (Vec<Vec<usize>>, Vec<RegSet>) {
    let words = (f.nregs as usize).div_ceil(64);
    let nb = starts.len();
    let end_of = |b: usize| starts.get(b + 1).copied().unwrap_or(f.code.len() as u32);
    let block_at = |pc: u32| starts.partition_point(|&s| s < pc);
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); nb];
    let mut writes = vec![vec![0u64; words]; nb];
    for b in 0..nb {
        let (start, end) = (starts[b], end_of(b));
        add_writes(f, start, end, &mut writes[b]);
        let Some(last) = end.checked_sub(1).and_then(|pc| f.code.get(pc as usize)) else {
            continue;
        };
        let guarded = last.guard != NONE;
        let falls = match last.op {
            Op::Bra { target } => {
                succs[b].push(block_at(target));
                guarded
            }
            Op::Ret | Op::Exit | Op::Trap(_) => guarded,
            ref op if stops(op) => guarded,
            _ => true,
        };
        if falls && b + 1 < nb {
            succs[b].push(b + 1);
        }
    }
    (succs, writes)
}

/// The registers possibly changed since the thread last resumed, on entry
/// to each basic block (`starts`). A thread's start counts every register
/// changed when `fresh_start` (the code starts them at 0, the file holds
/// another block's); a resume point entered by the dispatch starts clean.
pub(super) fn dirty_in(f: &Func, starts: &[u32], fresh_start: bool) -> Vec<RegSet> {
    let words = (f.nregs as usize).div_ceil(64);
    let nb = starts.len();
    let mut entry = vec![Some(vec![0u64; words]); nb];
    if fresh_start && nb > 0 {
        entry[0] = Some(vec![u64::MAX; words]);
    }
    flow(f, starts, entry)
        .into_iter()
        .map(|d| d.expect("every block is an entry"))
        .collect()
}

/// The registers possibly changed on entry to each basic block by a run
/// that began at one of the resume points `resumes` other than a fresh
/// thread start (pc 0 when `fresh_start`); `None` where only a thread's
/// start reaches. Where the start's run also reaches, it may have changed
/// more ([`dirty_in`]): a stop stores those only for it.
pub(super) fn dirty_resumed(
    f: &Func,
    starts: &[u32],
    resumes: &[u32],
    fresh_start: bool,
) -> Vec<Option<RegSet>> {
    let words = (f.nregs as usize).div_ceil(64);
    let mut entry = vec![None; starts.len()];
    for &pc in resumes {
        if pc != 0 || !fresh_start {
            entry[starts.partition_point(|&s| s < pc)] = Some(vec![0u64; words]);
        }
    }
    flow(f, starts, entry)
}

/// The writes along every path from the blocks with an `entry` set (that
/// set on entry), to the entry of each block (`None`: no path reaches it).
fn flow(f: &Func, starts: &[u32], entry: Vec<Option<RegSet>>) -> Vec<Option<RegSet>> {
    let (succs, writes) = graph(f, starts);
    let mut dirty = entry;
    let mut changed = true;
    while changed {
        changed = false;
        for b in 0..starts.len() {
            let Some(d) = &dirty[b] else { continue };
            let out: RegSet = d.iter().zip(&writes[b]).map(|(d, w)| d | w).collect();
            for &s in &succs[b] {
                match &mut dirty[s] {
                    Some(x) => {
                        for (x, o) in x.iter_mut().zip(&out) {
                            if *x | o != *x {
                                *x |= o;
                                changed = true;
                            }
                        }
                    }
                    none => {
                        *none = Some(out.clone());
                        changed = true;
                    }
                }
            }
        }
    }
    dirty
}
