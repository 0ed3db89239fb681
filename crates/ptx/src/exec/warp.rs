//! Warp collectives: when every participant of a `shfl`, `vote`, `match`,
//! `redux`, `bar.warp.sync` or `activemask` has arrived, resolve it at once for
//! all of them (each lane with the operands of the instruction it waits at);
//! tensor collectives go to `tensor`.

use super::state::{op_at, Block, Geo, Status, Thread};
use super::tensor;
use crate::alu::int_bin;
use crate::ir::{IntOp, Op, ReduxOp, ShflMode, Src, Ty, VoteMode, NONE};
use crate::launch::Fault;

/// Resolves warp collectives whose participants have all arrived. With
/// `relaxed`, lanes waiting at different instructions of the same kind
/// (divergent call sites) are grouped too.
pub(super) fn resolve_warps(
    g: &Geo<'_>,
    threads: &mut [Thread],
    block: &mut Block,
    relaxed: bool,
) -> Result<bool, Fault> {
    let mut progressed = false;
    for w in 0..threads.len().div_ceil(32) {
        progressed |= resolve_warp(g, threads, block, w, relaxed)?;
    }
    Ok(progressed)
}

/// Resolves the collectives of warp `w` whose participants all arrived.
pub(super) fn resolve_warp(
    g: &Geo<'_>,
    threads: &mut [Thread],
    block: &mut Block,
    w: usize,
    relaxed: bool,
) -> Result<bool, Fault> {
    let lo = w * 32;
    let hi = (lo + 32).min(threads.len());
    let alive: u32 = (lo..hi)
        .filter(|&i| threads[i].status != Status::Exited)
        .fold(0, |m, i| m | 1 << (i - lo));
    let mut progressed = false;
    for l in lo..hi {
        let t = &threads[l];
        if t.status != Status::AtWarp {
            continue;
        }
        let (func, pc) = (t.func, t.pc);
        let Some(inst) = g.prog.funcs[func as usize].code.get(pc as usize) else {
            continue;
        };
        let mask_src = match &inst.op {
            Op::WarpSync { mask }
            | Op::Shfl { mask, .. }
            | Op::Vote { mask, .. }
            | Op::Match { mask, .. }
            | Op::Redux { mask, .. } => *mask,
            _ => Src::Imm(0xffff_ffff),
        };
        let mask = if let Op::Activemask { d } = inst.op {
            // converged lanes: once every live lane is blocked, those at this pc
            let warp = &mut threads[lo..hi];
            if warp.iter().any(|o| o.status == Status::Ready) {
                continue;
            }
            let m = warp
                .iter()
                .enumerate()
                .filter(|(_, o)| o.status == Status::AtWarp && o.func == func && o.pc == pc)
                .fold(0u32, |m, (i, _)| m | 1 << i);
            for (i, o) in warp.iter_mut().enumerate() {
                if m & (1 << i) != 0 {
                    o.set(d, m as u64);
                    o.release();
                }
            }
            progressed = true;
            continue;
        } else {
            (t.get(mask_src) as u32 | 1 << (l - lo)) & alive
        };
        // every lane in mask must be waiting at this same instruction
        let kind = std::mem::discriminant(&inst.op);
        let ready = (0..32).filter(|k| mask & (1 << k) != 0).all(|k| {
            let o = &threads[lo + k];
            o.status == Status::AtWarp
                && ((o.func == func && o.pc == pc)
                    || (relaxed
                        && g.prog.funcs[o.func as usize]
                            .code
                            .get(o.pc as usize)
                            .is_some_and(|i| std::mem::discriminant(&i.op) == kind)))
        });
        if !ready {
            continue;
        }
        collective(g, threads, block, lo, mask)?;
        for k in 0..32 {
            if mask & (1 << k) != 0 {
                threads[lo + k].release();
            }
        }
        progressed = true;
    }
    Ok(progressed)
}

/// Resolves one warp collective for the lanes in `mask`; every lane uses
/// the operands of the instruction it is waiting at.
fn collective(
    g: &Geo<'_>,
    threads: &mut [Thread],
    block: &mut Block,
    lo: usize,
    mask: u32,
) -> Result<(), Fault> {
    let mut lane_buf = [0usize; 32];
    let mut count = 0;
    for k in 0..32 {
        if mask & (1 << k) != 0 {
            lane_buf[count] = k;
            count += 1;
        }
    }
    let lanes = &lane_buf[..count];
    let Some(first) = lanes.first().and_then(|&l| op_at(g.prog, &threads[lo + l])) else {
        return Ok(());
    };
    match first {
        Op::Shfl { .. } => shfl(g, threads, lo, lanes),
        Op::Vote { .. } => vote(g, threads, lo, lanes, mask),
        Op::Match { .. } => match_any_all(g, threads, lo, lanes, mask),
        Op::Redux { op, signed, .. } => redux(g, threads, lo, lanes, *op, *signed),
        Op::Ldmatrix { .. } => tensor::ldmatrix(g, threads, block, lo, lanes)?,
        Op::Mma { .. } => tensor::mma(g, threads, lo, lanes),
        Op::WmmaMma { .. } => tensor::wmma_mma(g, threads, lo, lanes),
        _ => {}
    }
    Ok(())
}

/// What each of `lanes` contributes to a collective: `value` of the thread
/// and the op it waits at, 0 where that is not the collective's kind.
fn lane_values(
    g: &Geo<'_>,
    threads: &[Thread],
    lo: usize,
    lanes: &[usize],
    value: impl Fn(&Thread, &Op) -> Option<u64>,
) -> Vec<u64> {
    lanes
        .iter()
        .map(|&l| {
            let th = &threads[lo + l];
            op_at(g.prog, th).and_then(|op| value(th, op)).unwrap_or(0)
        })
        .collect()
}

/// `shfl.sync`: each lane reads the value of its source lane.
fn shfl(g: &Geo<'_>, threads: &mut [Thread], lo: usize, lanes: &[usize]) {
    let prog = g.prog;
    let n = threads.len();
    let mut results = [(0usize, 0u32, 0u32, 0u64, false); 32];
    let mut nres = 0;
    for &lane in lanes {
        let th = &threads[lo + lane];
        let Some(Op::Shfl {
            mode, d, dp, b, c, ..
        }) = op_at(prog, th)
        else {
            continue;
        };
        let (src_lane, p) = shfl_source(*mode, lane, th.get(*b), th.get(*c), lo, n);
        let src = &threads[lo + src_lane];
        // the source lane's value operand (of its own instruction)
        let a = match op_at(prog, src) {
            Some(Op::Shfl { a, .. }) => *a,
            _ => match op_at(prog, th) {
                Some(Op::Shfl { a, .. }) => *a,
                _ => Src::Imm(0),
            },
        };
        // a lane taking no part (outside the mask, gone) reads as 0, as on a GPU
        let v = if lanes.contains(&src_lane) {
            src.get(a) & 0xffff_ffff
        } else {
            0
        };
        results[nres] = (lane, *d, *dp, v, p);
        nres += 1;
    }
    for &(lane, d, dp, v, p) in &results[..nres] {
        let th = &mut threads[lo + lane];
        th.set(d, v);
        if dp != NONE {
            th.set(dp, p as u64);
        }
    }
}

/// `vote.sync`: the ballot of the lanes' predicates, reduced per mode.
fn vote(g: &Geo<'_>, threads: &mut [Thread], lo: usize, lanes: &[usize], mask: u32) {
    let prog = g.prog;
    let mut ballot = 0u64;
    for &lane in lanes {
        let th = &threads[lo + lane];
        if let Some(Op::Vote { a, neg, .. }) = op_at(prog, th) {
            if (th.get(*a) & 1 != 0) != *neg {
                ballot |= 1 << lane;
            }
        }
    }
    for &lane in lanes {
        let th = &mut threads[lo + lane];
        if let Some(Op::Vote { mode, d, .. }) = op_at(prog, th) {
            let v = match mode {
                VoteMode::Ballot => ballot,
                VoteMode::All => (ballot == mask as u64) as u64,
                VoteMode::Any => (ballot != 0) as u64,
                VoteMode::Uni => (ballot == 0 || ballot == mask as u64) as u64,
            };
            th.set(*d, v);
        }
    }
}

/// `match.any.sync` / `match.all.sync`.
fn match_any_all(g: &Geo<'_>, threads: &mut [Thread], lo: usize, lanes: &[usize], mask: u32) {
    let prog = g.prog;
    let vals = lane_values(g, threads, lo, lanes, |th, op| match op {
        Op::Match { a, wide: true, .. } => Some(th.get(*a)),
        Op::Match { a, .. } => Some(th.get(*a) & 0xffff_ffff),
        _ => None,
    });
    let all_eq = vals.iter().all(|v| *v == vals[0]);
    for (i, &lane) in lanes.iter().enumerate() {
        let th = &mut threads[lo + lane];
        let Some(Op::Match { all, d, dp, .. }) = op_at(prog, th) else {
            continue;
        };
        let m = if *all {
            if all_eq {
                mask as u64
            } else {
                0
            }
        } else {
            lanes
                .iter()
                .zip(&vals)
                .filter(|(_, v)| **v == vals[i])
                .fold(0u64, |m, (l, _)| m | 1 << l)
        };
        th.set(*d, m);
        if *dp != NONE {
            th.set(*dp, all_eq as u64);
        }
    }
}

/// `redux.sync`: the lanes' values reduced by `op`.
fn redux(
    g: &Geo<'_>,
    threads: &mut [Thread],
    lo: usize,
    lanes: &[usize],
    op: ReduxOp,
    signed: bool,
) {
    let prog = g.prog;
    let vals = lane_values(g, threads, lo, lanes, |th, op| match op {
        Op::Redux { a, .. } => Some(th.get(*a) & 0xffff_ffff),
        _ => None,
    });
    let acc = redux_fold(op, signed, &vals);
    for &lane in lanes {
        let th = &mut threads[lo + lane];
        if let Some(Op::Redux { d, .. }) = op_at(prog, th) {
            th.set(*d, acc);
        }
    }
}

/// `shfl.sync`'s source for `lane` of the warp starting at thread `lo` (of
/// `n` threads): the lane whose value it reads (itself when out of range)
/// and whether that lane was in range, from the lane operand `b` and the
/// clamp/segment mask operand `c`, as PTX defines them.
pub(crate) fn shfl_source(
    mode: ShflMode,
    lane: usize,
    b: u64,
    c: u64,
    lo: usize,
    n: usize,
) -> (usize, bool) {
    let bval = (b & 0x1f) as i64;
    let segmask = ((c >> 8) & 0x1f) as i64;
    let clamp = (c & 0x1f) as i64;
    let lane_i = lane as i64;
    let max_lane = (lane_i & segmask) | (clamp & !segmask);
    let min_lane = lane_i & segmask;
    let (j, p) = match mode {
        ShflMode::Up => {
            let j = lane_i - bval;
            (j, j >= max_lane)
        }
        ShflMode::Down => {
            let j = lane_i + bval;
            (j, j <= max_lane)
        }
        ShflMode::Bfly => {
            let j = lane_i ^ bval;
            (j, j <= max_lane)
        }
        ShflMode::Idx => {
            let j = min_lane | (bval & !segmask);
            (j, j <= max_lane)
        }
    };
    match p && (0..32).contains(&j) && lo + (j as usize) < n {
        true => (j as usize, p),
        false => (lane, p),
    }
}

/// `redux.sync`'s result: the lanes' 32-bit values reduced by `op`.
pub(crate) fn redux_fold(op: ReduxOp, signed: bool, vals: &[u64]) -> u64 {
    let t = if signed { Ty::S32 } else { Ty::U32 };
    let mut acc = vals.first().copied().unwrap_or(0);
    for &v in vals.iter().skip(1) {
        acc = match op {
            ReduxOp::Add => acc.wrapping_add(v) & 0xffff_ffff,
            ReduxOp::Min => int_bin(IntOp::Min, t, acc, v),
            ReduxOp::Max => int_bin(IntOp::Max, t, acc, v),
            ReduxOp::And => acc & v,
            ReduxOp::Or => acc | v,
            ReduxOp::Xor => acc ^ v,
        };
    }
    acc
}
