//! A kernel's one loop (its only backward branch), entered only from the block before it,
//! and its counter, stepped by a constant while below a bound: `jit::hoist` spans its trips.

use super::plan::Plan;
use crate::ir::{BoolOp, Cmp, Func, IntOp, Op, Src, Ty, NONE};

/// The loop of a kernel whose one backward branch ends it: pcs `head` to
/// `back`, entered only by falling into `head` from the block before
/// (no branch from outside goes into it), left by any branch out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Loop {
    /// Its first pc, the backward branch's target.
    pub head: u32,
    /// The first pc of the block before it, which falls into `head`.
    pub pre: u32,
    /// The first pc of its last block (the latch).
    pub latch: u32,
    /// The backward branch, the latch's last instruction.
    pub back: u32,
}

impl Loop {
    pub fn inside(&self, pc: u32) -> bool {
        (self.head..=self.back).contains(&pc)
    }
}

/// How many backward branches `f` has; its loop where that is one, of
/// the form [`Loop`] describes.
pub(super) fn simple_loop(f: &Func, p: &Plan) -> (usize, Option<Loop>) {
    let branches: Vec<(u32, u32)> = f
        .code
        .iter()
        .enumerate()
        .filter_map(|(pc, i)| match i.op {
            Op::Bra { target } => Some((pc as u32, target)),
            _ => None,
        })
        .collect();
    let backs: Vec<(u32, u32)> = branches.iter().copied().filter(|(x, t)| t <= x).collect();
    let [(back, head)] = backs[..] else {
        return (backs.len(), None);
    };
    let Ok(at) = p.starts.binary_search(&head) else {
        return (1, None);
    };
    let falls = head > 0
        && match f.code[head as usize - 1] {
            ref i if i.guard != NONE => true,
            ref i => !matches!(i.op, Op::Bra { .. } | Op::Ret | Op::Exit | Op::Trap(_)),
        };
    let l = Loop {
        head,
        pre: if at > 0 { p.starts[at - 1] } else { 0 },
        latch: p.starts[p.starts.partition_point(|&s| s <= back) - 1],
        back,
    };
    // (nothing from outside branches in: not even to `head`, which
    // would pass by the block before)
    let closed = branches
        .iter()
        .all(|&(x, t)| x == back || !l.inside(t) || l.inside(x));
    (1, (falls && at > 0 && closed).then_some(l))
}

/// A loop's counter: register `reg`, written once in the loop, by
/// `add reg, reg, step` in the latch before `setp.lt reg, bound` (at pc
/// `cmp`), which the backward branch takes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counter {
    pub reg: u32,
    pub step: u32,
    pub bound: Src,
    pub cmp: u32,
    pub signed: bool,
}

/// `l`'s counter, where it has one; `writes` holds each register's
/// writes' pcs.
pub(super) fn counter(f: &Func, l: &Loop, writes: &[Vec<u32>]) -> Option<Counter> {
    let bra = &f.code[l.back as usize];
    if bra.guard == NONE || bra.guard_neg {
        return None;
    }
    let [s] = writes.get(bra.guard as usize)?[..] else {
        return None;
    };
    let inst = &f.code[s as usize];
    let Op::Setp {
        cmp,
        t,
        a: Src::Reg(c),
        b,
        bop: BoolOp::None,
        ..
    } = inst.op
    else {
        return None;
    };
    let int32 = |t: Ty| t.bits() == 32 && !t.is_float() && !matches!(t, Ty::Pred | Ty::B128);
    let signed = match cmp {
        Cmp::Lt => t.signed(),
        Cmp::Lo => false,
        _ => return None,
    };
    if !(l.latch..l.back).contains(&s) || inst.guard != NONE || !int32(t) {
        return None;
    }
    // (the bound the same every trip: no write of it in the loop)
    if let Src::Reg(q) = b {
        if writes.get(q as usize)?.iter().any(|&w| l.inside(w)) {
            return None;
        }
    }
    let inner: Vec<u32> = writes
        .get(c as usize)?
        .iter()
        .copied()
        .filter(|&w| l.inside(w))
        .collect();
    let [u] = inner[..] else { return None };
    let up = &f.code[u as usize];
    let Op::Int {
        op: IntOp::Add,
        t: ut,
        d,
        a: Src::Reg(ua),
        b: Src::Imm(k),
    } = up.op
    else {
        return None;
    };
    let k = u32::try_from(k)
        .ok()
        .filter(|&k| (1..1 << 31).contains(&k))?;
    let fits = d == c && ua == c && int32(ut) && up.guard == NONE;
    (fits && (l.latch..s).contains(&u)).then_some(Counter {
        reg: c,
        step: k,
        bound: b,
        cmp: s,
        signed,
    })
}
