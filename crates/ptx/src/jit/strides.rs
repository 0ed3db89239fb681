//! How a lane kernel's 32-bit registers differ between the lanes of a group,
//! known before it runs: the same in every lane, or lane 0's plus a stride each.

use crate::ir::{Func, IntOp, Op, SReg, Sp, Src, TernOp, NONE};

/// What is known of one register's lanes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lanes {
    /// No write of it reaches a read yet (the analysis goes on).
    Unset,
    /// Lane `k` holds lane 0's value plus `k` times this (modulo 2^32; 0:
    /// the same value in every lane).
    Stride(u32),
    Unknown,
}

impl Lanes {
    fn meet(self, other: Lanes) -> Lanes {
        match (self, other) {
            (Lanes::Unset, x) | (x, Lanes::Unset) => x,
            (Lanes::Stride(a), Lanes::Stride(b)) if a == b => self,
            _ => Lanes::Unknown,
        }
    }

    /// `f` of two strides; unset or unknown where either is.
    fn with(self, other: Lanes, f: impl Fn(u32, u32) -> Option<u32>) -> Lanes {
        match (self, other) {
            (Lanes::Stride(a), Lanes::Stride(b)) => f(a, b).map_or(Lanes::Unknown, Lanes::Stride),
            (Lanes::Unknown, _) | (_, Lanes::Unknown) => Lanes::Unknown,
            _ => Lanes::Unset,
        }
    }
}

/// For each register of `f`, the stride between the lanes of a lane-kernel
/// group that it holds all along (`Some(0)`: one value in every lane), where
/// the group's threads are consecutive in `%tid.x` and share `%tid.y` and
/// `%tid.z` (a block whose `%ntid.x` is a multiple of 4): `%tid.x` has
/// stride 1; `%tid.y`, `%tid.z`, `%ntid`, `%ctaid`, `%nctaid`, parameters
/// and immediates 0; 32-bit `add`, `sub`, `mul.lo`/`mad.lo` by a constant
/// and `shl` by a constant carry strides; any other pure op of stride-0
/// operands gives stride 0. A write guarded by a predicate that may differ
/// between lanes, or by anything else, makes it unknown (`None`). The
/// registers live at the kernel's start (`live_at_start`, read as 0 by
/// every thread) start with stride 0; the others' first writes set theirs.
pub(super) fn lane_strides(f: &Func, live_at_start: &[u32]) -> Vec<Option<u32>> {
    let mut lanes = vec![Lanes::Unset; f.nregs as usize];
    for &r in live_at_start {
        if let Some(l) = lanes.get_mut(r as usize) {
            *l = Lanes::Stride(0);
        }
    }
    loop {
        let mut changed = false;
        for inst in &f.code {
            let mut made = written(&inst.op, &lanes);
            if inst.guard != NONE {
                made = match lanes.get(inst.guard as usize) {
                    Some(Lanes::Stride(0)) => made,
                    Some(Lanes::Unset) => Lanes::Unset,
                    _ => Lanes::Unknown,
                };
            }
            inst.op.for_each_dst(|d| {
                if let Some(l) = lanes.get_mut(d as usize) {
                    let met = l.meet(made);
                    if met != *l {
                        *l = met;
                        changed = true;
                    }
                }
            });
        }
        if !changed {
            break;
        }
    }
    lanes
        .into_iter()
        .map(|l| match l {
            Lanes::Stride(s) => Some(s),
            _ => None,
        })
        .collect()
}

/// What `op` writes to its destinations, given `lanes`.
fn written(op: &Op, lanes: &[Lanes]) -> Lanes {
    let of = |s: Src| match s {
        Src::Reg(r) => lanes.get(r as usize).copied().unwrap_or(Lanes::Unknown),
        Src::Imm(_) => Lanes::Stride(0),
        Src::Frame(_) => Lanes::Unknown,
    };
    let constant = |s: Src| match s {
        Src::Imm(k) => Some(k as u32),
        _ => None,
    };
    // lane k of a * b where one of them is a constant, or both the same
    let mul = |a: Src, b: Src| match (constant(a), constant(b)) {
        (Some(k), _) => of(b).with(Lanes::Stride(0), |s, _| Some(s.wrapping_mul(k))),
        (_, Some(k)) => of(a).with(Lanes::Stride(0), |s, _| Some(s.wrapping_mul(k))),
        _ => of(a).with(of(b), |x, y| (x == 0 && y == 0).then_some(0)),
    };
    let int32 = |t: crate::ir::Ty| t.bits() == 32 && !t.is_float();
    match *op {
        Op::Special { r, .. } => match r {
            SReg::Tid(0) => Lanes::Stride(1),
            SReg::Tid(1 | 2) | SReg::Ntid(_) | SReg::Ctaid(_) | SReg::Nctaid(_) => Lanes::Stride(0),
            _ => Lanes::Unknown,
        },
        Op::Mov { a, mask, .. } => match of(a) {
            Lanes::Stride(s) if s != 0 && mask as u32 != u32::MAX => Lanes::Unknown,
            l => l,
        },
        Op::Int {
            op: int_op,
            t,
            a,
            b,
            ..
        } if int32(t) => match int_op {
            IntOp::Add => of(a).with(of(b), |x, y| Some(x.wrapping_add(y))),
            IntOp::Sub => of(a).with(of(b), |x, y| Some(x.wrapping_sub(y))),
            IntOp::MulLo => mul(a, b),
            IntOp::Shl => match constant(b) {
                Some(k) if k < 32 => of(a).with(Lanes::Stride(0), |s, _| Some(s << k)),
                _ => uniform(op, lanes),
            },
            _ => uniform(op, lanes),
        },
        Op::Tern {
            op: TernOp::MadLo,
            t,
            a,
            b,
            c,
            ..
        } if int32(t) => mul(a, b).with(of(c), |x, y| Some(x.wrapping_add(y))),
        Op::Tern {
            op: TernOp::Shfl, ..
        } => Lanes::Unknown,
        Op::Ld { addr, .. } => {
            if addr.sp == Sp::Param && matches!(addr.base, Src::Imm(_)) {
                Lanes::Stride(0)
            } else {
                Lanes::Unknown
            }
        }
        Op::Int { .. }
        | Op::Float { .. }
        | Op::Un { .. }
        | Op::Tern { .. }
        | Op::Bfi { .. }
        | Op::Setp { .. }
        | Op::Set { .. }
        | Op::Cvt { .. }
        | Op::Prmt { .. } => uniform(op, lanes),
        _ => Lanes::Unknown,
    }
}

/// Stride 0 where every source of `op` has it (unset or unknown where any
/// is; a frame address is unknown).
fn uniform(op: &Op, lanes: &[Lanes]) -> Lanes {
    let mut acc = Lanes::Stride(0);
    op.for_each_src(|s| {
        let l = match s {
            Src::Reg(r) => lanes.get(r as usize).copied().unwrap_or(Lanes::Unknown),
            Src::Imm(_) => Lanes::Stride(0),
            Src::Frame(_) => Lanes::Unknown,
        };
        acc = acc.with(l, |x, y| (x == 0 && y == 0).then_some(0));
    });
    acc
}
