//! Which registers a run from a resume point may read before it writes them
//! (its ops, and the stores of the stop it ends at): a resume loads only those.

use super::dirty::{add_writes, holds, stops, RegSet};
use super::inline::{CHECKS, UNCOUNTED};
use super::plan::Plan;
use crate::ir::{Func, Op, NONE};

fn add(set: &mut RegSet, r: u32) {
    if let Some(w) = set.get_mut(r as usize / 64) {
        *w |= 1 << (r % 64);
    }
}

/// For each basic block of `plan`, the registers a run entering it may
/// read before writing them, up to the stop that ends the run: a barrier
/// or warp collective (which stores the registers live after it that the
/// run may have changed, and reads its operands) or a backward branch's
/// yield (which stores those live at its target). An exit stores the
/// shuffled registers; a fault or the lanes parting stores none.
/// Guarded writes kill nothing (the old value stays where the guard is
/// off), as in the plan's liveness.
pub(super) fn needed_in(f: &Func, plan: &Plan) -> Vec<RegSet> {
    let words = (f.nregs as usize).div_ceil(64);
    let starts = &plan.starts;
    let nb = starts.len();
    let end_of = |b: usize| starts.get(b + 1).copied().unwrap_or(f.code.len() as u32);
    let mut uses = vec![vec![0u64; words]; nb];
    let mut defs = vec![vec![0u64; words]; nb];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); nb];
    // what the stop at `pc` (in block `b`) stores: the registers live at
    // `resume` that the run may have changed by then
    let stored = |b: usize, pc: u32, resume: u32, set: &mut RegSet, defs: &RegSet| {
        // (a resumed run's: a thread's start loads no registers)
        let mut dirty = plan.dirty_resumed[b]
            .clone()
            .unwrap_or_else(|| plan.dirty_in[b].clone());
        add_writes(f, starts[b], pc, &mut dirty);
        let live = plan
            .live_in
            .get(plan.block_at(resume))
            .map_or(&[][..], |l| l);
        for &r in live.iter().chain(&plan.shuffled) {
            if holds(&dirty, r) && !holds(defs, r) {
                add(set, r);
            }
        }
    };
    for b in 0..nb {
        let mut falls = true;
        for pc in starts[b]..end_of(b) {
            let inst = &f.code[pc as usize];
            let mut read = |r: u32| {
                if !holds(&defs[b], r) {
                    add(&mut uses[b], r)
                }
            };
            if inst.guard != NONE {
                read(inst.guard);
            }
            inst.op.src_regs().into_iter().for_each(&mut read);
            let guarded = inst.guard != NONE;
            match inst.op {
                Op::Bra { target } => {
                    let checks =
                        (target <= pc && inst.line & UNCOUNTED == 0) || inst.line & CHECKS != 0;
                    if checks {
                        stored(b, pc, target, &mut uses[b], &defs[b]);
                    }
                    succs[b].push(plan.block_at(target));
                    falls = guarded;
                }
                Op::Ret | Op::Exit => {
                    for &r in &plan.shuffled {
                        if !holds(&defs[b], r) {
                            add(&mut uses[b], r);
                        }
                    }
                    falls = guarded;
                }
                Op::Trap(_) => falls = guarded,
                ref op if stops(op) => {
                    // (a guarded one stops where its guard holds)
                    stored(b, pc, pc + 1, &mut uses[b], &defs[b]);
                    falls = guarded;
                }
                _ => {}
            }
            if inst.guard == NONE && !stops(&inst.op) {
                inst.op.for_each_dst(|d| {
                    if d != NONE {
                        add(&mut defs[b], d)
                    }
                });
            }
        }
        if falls && b + 1 < nb {
            succs[b].push(b + 1);
        }
    }
    let mut needed = uses.clone();
    let mut changed = true;
    while changed {
        changed = false;
        for b in (0..nb).rev() {
            for s in succs[b].clone() {
                for w in 0..words {
                    let v = needed[s][w] & !defs[b][w];
                    if needed[b][w] | v != needed[b][w] {
                        needed[b][w] |= v;
                        changed = true;
                    }
                }
            }
        }
    }
    needed
}
