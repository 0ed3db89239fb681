//! The lane file's slots, and the lane kernel's registers that live there
//! between basic blocks (each block loads what it reads, stores what it wrote).

use super::dirty::stops;
use super::narrow::{narrow_regs, wide_vector_regs};
use super::plan::Plan;
use crate::ir::{Func, Op, NONE};

/// The lane file's slot of each register that a stop may store or a
/// resume load (live at a resume point, read by a barrier or shuffled;
/// `u32::MAX` for the others), and how many slots a group has.
pub(super) fn lane_slots(func: &Func, plan: &Plan) -> (Vec<u32>, u32) {
    let mut kept = vec![false; func.nregs as usize];
    for &pc in &plan.resumes {
        for &r in &plan.live_in[plan.block_at(pc)] {
            kept[r as usize] = true;
        }
    }
    for inst in &func.code {
        if stops(&inst.op) {
            for r in inst.op.src_regs() {
                kept[r as usize] = true;
            }
        }
    }
    for &r in &plan.shuffled {
        kept[r as usize] = true;
    }
    // a narrow register takes one slot, a vector-wide one two (its two
    // I64X2 halves); the others wait in the threads' register files
    let narrow = narrow_regs(func);
    let wide = wide_vector_regs(func, &narrow);
    let mut n = 0;
    let slots = kept
        .iter()
        .enumerate()
        .map(|(r, &k)| {
            let size = match (narrow[r], wide[r]) {
                (true, _) => 1,
                (false, true) => 2,
                _ => 0,
            };
            if !k || size == 0 {
                return u32::MAX;
            }
            n += size;
            n - size
        })
        .collect();
    (slots, n)
}

/// For each register, whether it is resident: narrow or strided (kept as
/// lane 0's value; `kinds`), with a lane-file slot (`slots`, kept across a
/// stop) and written in no basic block that can come round to itself
/// without passing a stop. A resident
/// register's lane-file slot always holds its value between blocks: each
/// block that writes it stores it before it leaves (by a branch, a fall
/// through or a stop), each that reads or writes it loads it first, and a
/// resume neither loads nor stores it. Where a stop used to store it and
/// the resume load it and keep it in a register (spilled across the run:
/// the matmul's loop-invariant addresses and bounds), a block now loads
/// it where read; a loop without a stop would store and load it each time
/// round, so a register it writes stays as it was.
pub(super) fn resident_regs(f: &Func, plan: &Plan, kinds: &[bool], slots: &[u32]) -> Vec<bool> {
    let n = plan.starts.len();
    let end_of = |b: usize| {
        plan.starts
            .get(b + 1)
            .copied()
            .unwrap_or(f.code.len() as u32)
    };
    // successors of each block on paths without a stop
    let succs: Vec<Vec<usize>> = (0..n)
        .map(|b| {
            let last = &f.code[end_of(b) as usize - 1];
            let through = b + 1 < n;
            let mut out = Vec::new();
            // (a branch, an exit or a stop goes on to the next block only
            // where its guard fails)
            let ends = matches!(last.op, Op::Bra { .. } | Op::Ret | Op::Exit | Op::Trap(_))
                || stops(&last.op);
            if let Op::Bra { target } = last.op {
                out.push(plan.block_at(target));
            }
            if through && (!ends || last.guard != NONE) {
                out.push(b + 1);
            }
            out
        })
        .collect();
    // whether each block can come round to itself without a stop
    let cyclic: Vec<bool> = (0..n)
        .map(|b| {
            let mut seen = vec![false; n];
            let mut work = succs[b].clone();
            while let Some(x) = work.pop() {
                if x == b {
                    return true;
                }
                if !std::mem::replace(&mut seen[x], true) {
                    work.extend(&succs[x]);
                }
            }
            false
        })
        .collect();
    let mut resident: Vec<bool> = (0..f.nregs as usize)
        .map(|r| kinds[r] && slots[r] != u32::MAX)
        .collect();
    for (b, &looped) in cyclic.iter().enumerate() {
        if !looped {
            continue;
        }
        for inst in &f.code[plan.starts[b] as usize..end_of(b) as usize] {
            inst.op.for_each_dst(|d| {
                if d != NONE {
                    resident[d as usize] = false;
                }
            });
        }
    }
    resident
}

/// The resident registers that `f.code[start..end]` reads or writes (a
/// write counts: a guarded or lane-by-lane one reads the old lanes).
pub(super) fn touched(f: &Func, resident: &[bool], start: u32, end: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut add = |r: u32| {
        if r != NONE && resident.get(r as usize) == Some(&true) && !out.contains(&r) {
            out.push(r);
        }
    };
    for inst in &f.code[start as usize..end as usize] {
        add(inst.guard);
        inst.op.src_regs().into_iter().for_each(&mut add);
        inst.op.for_each_dst(&mut add);
    }
    out
}
