//! Warp collectives of compiled kernels (`shfl`, `vote`, `match`, `redux`,
//! `bar.warp.sync`, `activemask`, lockstep steps), resolved from the waiting threads' register
//! files with the grouping and results of the interpreter's `exec/warp.rs`.

use super::compiled::CompiledKernel;
use crate::exec::{redux_fold, shfl_source};
use crate::ir::{Op, ReduxOp, Src, VoteMode, NONE};

/// Where a thread stands between regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    Ready,
    AtBarrier,
    /// Waiting at the warp collective at this pc.
    AtWarp(u32),
    Exited,
}

/// The block's threads as the resolution sees them: states and register
/// files (`nregs` registers a thread, one after the other).
pub(super) struct Lanes<'a> {
    pub kernel: &'a CompiledKernel,
    pub state: &'a mut [State],
    pub regs: &'a mut [u64],
    /// Each thread's resume id (where a ready thread stands).
    pub resume: &'a [u32],
}

impl Lanes<'_> {
    fn get(&self, t: usize, s: Src) -> u64 {
        match s {
            Src::Reg(r) => {
                let n = self.kernel.nregs as usize;
                self.regs.get(t * n + r as usize).copied().unwrap_or(0)
            }
            Src::Imm(v) => v,
            // a kernel's frame starts at local address 0
            Src::Frame(o) => o as u64,
        }
    }

    fn set(&mut self, t: usize, d: u32, v: u64) {
        let n = self.kernel.nregs as usize;
        if let Some(slot) = self.regs.get_mut(t * n + d as usize) {
            *slot = v;
        }
    }

    /// The op thread `t` stands at, waiting or ready (an exited thread
    /// stands at its `ret`/`exit`, a waiting one at its barrier: neither a
    /// collective).
    fn standing_op(&self, t: usize) -> Option<&Op> {
        match self.state[t] {
            State::AtWarp(pc) => self.kernel.ops.get(pc as usize),
            State::Ready => {
                let pc = self.kernel.resumes.get(*self.resume.get(t)? as usize)?;
                self.kernel.ops.get(*pc as usize)
            }
            _ => None,
        }
    }

    /// The op thread `t` waits at, if it waits at a warp collective.
    fn op_of(&self, t: usize) -> Option<(u32, &Op)> {
        match self.state[t] {
            State::AtWarp(pc) => self.kernel.ops.get(pc as usize).map(|op| (pc, op)),
            _ => None,
        }
    }
}

/// Resolves the collectives of warp `w` whose participants all arrived;
/// with `relaxed`, lanes at different instructions of one kind (divergent
/// call sites) are grouped too. Whether any was resolved.
pub(super) fn resolve_warp(lanes: &mut Lanes<'_>, w: usize, relaxed: bool) -> bool {
    let lo = w * 32;
    let hi = (lo + 32).min(lanes.state.len());
    let alive: u32 = (lo..hi)
        .filter(|&i| lanes.state[i] != State::Exited)
        .fold(0, |m, i| m | 1 << (i - lo));
    let mut progressed = false;
    for l in lo..hi {
        let Some((pc, op)) = lanes.op_of(l) else {
            continue;
        };
        if let Op::WarpStep = op {
            // lockstep: once no lane can run on, every lane at a step goes on
            if (lo..hi).any(|i| lanes.state[i] == State::Ready) {
                continue;
            }
            for i in lo..hi {
                if let State::AtWarp(p) = lanes.state[i] {
                    if matches!(lanes.kernel.ops.get(p as usize), Some(Op::WarpStep)) {
                        lanes.state[i] = State::Ready;
                    }
                }
            }
            progressed = true;
            continue;
        }
        let mask_src = match op {
            Op::WarpSync { mask }
            | Op::Shfl { mask, .. }
            | Op::Vote { mask, .. }
            | Op::Match { mask, .. }
            | Op::Redux { mask, .. } => *mask,
            _ => Src::Imm(0xffff_ffff),
        };
        if let Op::Activemask { d } = *op {
            // converged lanes: once every live lane is blocked, those at this pc
            if (lo..hi).any(|i| lanes.state[i] == State::Ready) {
                continue;
            }
            let m = (lo..hi)
                .filter(|&i| lanes.state[i] == State::AtWarp(pc))
                .fold(0u32, |m, i| m | 1 << (i - lo));
            for i in lo..hi {
                if m & (1 << (i - lo)) != 0 {
                    lanes.set(i, d, m as u64);
                    lanes.state[i] = State::Ready;
                }
            }
            progressed = true;
            continue;
        }
        let mask = (lanes.get(l, mask_src) as u32 | 1 << (l - lo)) & alive;
        // every lane in mask must be waiting at this same instruction
        let kind = std::mem::discriminant(op);
        let ready =
            (0..32)
                .filter(|k| mask & (1 << k) != 0)
                .all(|k| match lanes.state.get(lo + k) {
                    Some(State::AtWarp(p)) => {
                        *p == pc
                            || (relaxed
                                && lanes
                                    .kernel
                                    .ops
                                    .get(*p as usize)
                                    .is_some_and(|o| std::mem::discriminant(o) == kind))
                    }
                    _ => false,
                });
        if !ready {
            continue;
        }
        let members: Vec<usize> = (0..32).filter(|k| mask & (1 << k) != 0).collect();
        collective(lanes, lo, &members, mask);
        for k in members {
            lanes.state[lo + k] = State::Ready;
        }
        progressed = true;
    }
    progressed
}

/// Resolves one collective for `members` (lanes of the warp at `lo`); each
/// lane uses the operands of the instruction it waits at.
fn collective(lanes: &mut Lanes<'_>, lo: usize, members: &[usize], mask: u32) {
    let Some((_, first)) = members.first().and_then(|&l| lanes.op_of(lo + l)) else {
        return;
    };
    match first {
        Op::Shfl { .. } => shfl(lanes, lo, members),
        Op::Vote { .. } => vote(lanes, lo, members, mask),
        Op::Match { .. } => match_any_all(lanes, lo, members, mask),
        Op::Redux { op, signed, .. } => {
            let (op, signed) = (*op, *signed);
            redux(lanes, lo, members, op, signed)
        }
        _ => {}
    }
}

/// `shfl.sync`: each lane reads the value of its source lane.
fn shfl(lanes: &mut Lanes<'_>, lo: usize, members: &[usize]) {
    let n = lanes.state.len();
    let mut results = Vec::with_capacity(members.len());
    for &lane in members {
        let Some((
            _,
            &Op::Shfl {
                mode,
                d,
                dp,
                b,
                c,
                a,
                ..
            },
        )) = lanes.op_of(lo + lane)
        else {
            continue;
        };
        let (src_lane, p) = shfl_source(
            mode,
            lane,
            lanes.get(lo + lane, b),
            lanes.get(lo + lane, c),
            lo,
            n,
        );
        // the source lane's value operand (of its own instruction)
        let src_a = match lanes.standing_op(lo + src_lane) {
            Some(Op::Shfl { a, .. }) => *a,
            _ => a,
        };
        // a lane taking no part (outside the mask, gone) reads as 0, as on a GPU
        let v = if members.contains(&src_lane) {
            lanes.get(lo + src_lane, src_a) & 0xffff_ffff
        } else {
            0
        };
        results.push((lane, d, dp, v, p));
    }
    for (lane, d, dp, v, p) in results {
        lanes.set(lo + lane, d, v);
        if dp != NONE {
            lanes.set(lo + lane, dp, p as u64);
        }
    }
}

/// `vote.sync`: the ballot of the lanes' predicates, reduced per mode.
fn vote(lanes: &mut Lanes<'_>, lo: usize, members: &[usize], mask: u32) {
    let mut ballot = 0u64;
    for &lane in members {
        if let Some((_, &Op::Vote { a, neg, .. })) = lanes.op_of(lo + lane) {
            if (lanes.get(lo + lane, a) & 1 != 0) != neg {
                ballot |= 1 << lane;
            }
        }
    }
    for &lane in members {
        if let Some((_, &Op::Vote { mode, d, .. })) = lanes.op_of(lo + lane) {
            let v = match mode {
                VoteMode::Ballot => ballot,
                VoteMode::All => (ballot == mask as u64) as u64,
                VoteMode::Any => (ballot != 0) as u64,
                VoteMode::Uni => (ballot == 0 || ballot == mask as u64) as u64,
            };
            lanes.set(lo + lane, d, v);
        }
    }
}

/// What each member contributes: `value` of its operand, 0 where it waits
/// at another kind of op.
fn lane_values(
    lanes: &Lanes<'_>,
    lo: usize,
    members: &[usize],
    value: impl Fn(&Op) -> Option<(Src, u64)>,
) -> Vec<u64> {
    members
        .iter()
        .map(|&l| {
            lanes
                .op_of(lo + l)
                .and_then(|(_, op)| value(op))
                .map_or(0, |(src, keep)| lanes.get(lo + l, src) & keep)
        })
        .collect()
}

/// `match.any.sync` / `match.all.sync`.
fn match_any_all(lanes: &mut Lanes<'_>, lo: usize, members: &[usize], mask: u32) {
    let vals = lane_values(lanes, lo, members, |op| match *op {
        Op::Match { a, wide: true, .. } => Some((a, u64::MAX)),
        Op::Match { a, .. } => Some((a, 0xffff_ffff)),
        _ => None,
    });
    let all_eq = vals.iter().all(|v| *v == vals[0]);
    for (i, &lane) in members.iter().enumerate() {
        let Some((_, &Op::Match { all, d, dp, .. })) = lanes.op_of(lo + lane) else {
            continue;
        };
        let m = if all {
            if all_eq {
                mask as u64
            } else {
                0
            }
        } else {
            members
                .iter()
                .zip(&vals)
                .filter(|(_, v)| **v == vals[i])
                .fold(0u64, |m, (l, _)| m | 1 << l)
        };
        lanes.set(lo + lane, d, m);
        if dp != NONE {
            lanes.set(lo + lane, dp, all_eq as u64);
        }
    }
}

/// `redux.sync`: the lanes' values reduced by `op`.
fn redux(lanes: &mut Lanes<'_>, lo: usize, members: &[usize], op: ReduxOp, signed: bool) {
    let vals = lane_values(lanes, lo, members, |op| match *op {
        Op::Redux { a, .. } => Some((a, 0xffff_ffff)),
        _ => None,
    });
    let acc = redux_fold(op, signed, &vals);
    for &lane in members {
        if let Some((_, &Op::Redux { d, .. })) = lanes.op_of(lo + lane) {
            lanes.set(lo + lane, d, acc);
        }
    }
}
