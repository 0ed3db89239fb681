//! Which registers only ever hold 32-bit values (zero above), and which wide
//! ones only address arithmetic writes: the lane kernel keeps each for all
//! its lanes in vectors (one of 32-bit lanes, two of 64-bit lanes).

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};

use crate::ir::{Cmp, FOp, FloatMode, Func, IntOp, Op, Rnd, SReg, Src, TernOp, Ty, NONE};

/// Whether each register of `f` is narrow: every op that writes it leaves a
/// value below 2^32 (as the compiled code computes it), so that 32 bits
/// keep it whole. A thread starts with 0 in each, also narrow.
pub(super) fn narrow_regs(f: &Func) -> Vec<bool> {
    shrink(f, vec![true; f.nregs as usize], writes_narrow)
}

/// Whether each wide register of `f` (not `narrow`) is only written by ops
/// that the lane kernel runs as two vectors of 64-bit lanes
/// (`emit_wide`): 64-bit moves, adds, subtractions and shifts of such
/// registers, narrow ones and immediates, `mul.wide` and widening `cvt`s
/// of narrow ones, `cvta`, and 8-byte parameter loads.
pub(super) fn wide_vector_regs(f: &Func, narrow: &[bool]) -> Vec<bool> {
    let wide = narrow.iter().map(|&n| !n).collect();
    shrink(f, wide, |op, wide| writes_wide(op, narrow, wide))
}

/// Which vector-wide registers of `f` (`wide`) hold one value in every
/// lane of a group all along: each write of one is unguarded and makes it
/// from such registers and immediates alone (8-byte parameter loads,
/// `cvta`, 64-bit moves, adds, subtractions and shifts by a constant); a
/// thread starts with 0 in each.
pub(super) fn uniform_wide_regs(f: &Func, wide: &[bool]) -> Vec<bool> {
    let mut set = wide.to_vec();
    loop {
        let mut changed = false;
        for inst in &f.code {
            let is = |s: Src| match s {
                Src::Reg(r) => set.get(r as usize) == Some(&true),
                Src::Imm(_) => true,
                Src::Frame(_) => false,
            };
            let keeps = inst.guard == NONE
                && match inst.op {
                    Op::Ld {
                        addr,
                        size: 8,
                        n: 1,
                        ..
                    } => addr.sp == crate::ir::Sp::Param && matches!(addr.base, Src::Imm(_)),
                    Op::Cvta { a, .. } => is(a),
                    Op::Mov { a, mask, .. } => mask == u64::MAX && is(a),
                    Op::Int { op, t, a, b, .. } if t.bits() == 64 && !t.is_float() => match op {
                        IntOp::Add | IntOp::Sub => is(a) && is(b),
                        IntOp::Shl => is(a) && matches!(b, Src::Imm(_)),
                        _ => false,
                    },
                    _ => false,
                };
            let mut out = Vec::new();
            inst.op.for_each_dst(|d| {
                if d != NONE && set.get(d as usize) == Some(&true) && !keeps {
                    out.push(d);
                }
            });
            for d in out {
                set[d as usize] = false;
                changed = true;
            }
        }
        if !changed {
            return set;
        }
    }
}

/// Takes out of `set`, until nothing changes, every register that some op
/// writes where `keeps(op, set)` says the op does not keep it in the set.
fn shrink(f: &Func, mut set: Vec<bool>, keeps: impl Fn(&Op, &[bool]) -> bool) -> Vec<bool> {
    loop {
        let mut changed = false;
        for inst in &f.code {
            let mut out = Vec::new();
            inst.op.for_each_dst(|d| {
                if d != NONE && set.get(d as usize) == Some(&true) && !keeps(&inst.op, &set) {
                    out.push(d);
                }
            });
            for d in out {
                set[d as usize] = false;
                changed = true;
            }
        }
        if !changed {
            return set;
        }
    }
}

/// Whether `op` has a vector form of 64-bit lanes, its operands narrow
/// (`narrow`), vector-wide (`wide`) or immediates as it needs them.
pub(super) fn writes_wide(op: &Op, narrow: &[bool], wide: &[bool]) -> bool {
    let is = |set: &[bool], s: Src| match s {
        Src::Reg(r) => set.get(r as usize) == Some(&true),
        Src::Imm(_) => true,
        Src::Frame(_) => false,
    };
    let w = |s: Src| is(wide, s);
    let n = |s: Src| is(narrow, s);
    let int = |t: Ty| !t.is_float() && !matches!(t, Ty::Pred | Ty::B128);
    match *op {
        Op::Mov { a, mask, .. } => mask == u64::MAX && (w(a) || n(a)),
        Op::Int { op, t, a, b, .. } if int(t) => match op {
            IntOp::Add | IntOp::Sub => t.bits() == 64 && (w(a) || n(a)) && (w(b) || n(b)),
            IntOp::Shl => t.bits() == 64 && w(a) && matches!(b, Src::Imm(k) if k < 64),
            IntOp::MulWide => t.bits() == 32 && n(a) && n(b),
            _ => false,
        },
        Op::Cvta { a, .. } => w(a),
        Op::Cvt {
            a, dt, st, mode, ..
        } => {
            !mode.sat
                && !mode.ftz
                && int(dt)
                && int(st)
                && dt.bits() == 64
                && ((st.bits() == 32 && n(a)) || (st.bits() == 64 && (w(a) || n(a))))
        }
        Op::Ld {
            addr,
            size: 8,
            n: 1,
            ..
        } => addr.sp == crate::ir::Sp::Param && matches!(addr.base, Src::Imm(_)),
        _ => false,
    }
}

/// Whether a float op of `mode` runs open-coded (round to nearest, no
/// flush, no saturation).
pub(super) fn plain(mode: &FloatMode) -> bool {
    matches!(mode.rnd, Rnd::Default | Rnd::Rn) && !mode.ftz && !mode.sat
}

/// Whether a 32-bit register op of type `t` (not a float).
fn int32(t: Ty) -> bool {
    t.bits() <= 32 && !t.is_float() && t != Ty::B128
}

/// Whether every register `op` writes gets a value below 2^32, given which
/// registers are narrow so far.
fn writes_narrow(op: &Op, narrow: &[bool]) -> bool {
    let small = |s: Src| match s {
        Src::Reg(r) => narrow.get(r as usize) == Some(&true),
        Src::Imm(v) => v <= u32::MAX as u64,
        Src::Frame(o) => (o as u64) <= u32::MAX as u64,
    };
    match *op {
        Op::Mov { a, mask, .. } => mask <= u32::MAX as u64 || small(a),
        Op::Int { op, t, .. } => match op {
            IntOp::Add
            | IntOp::Sub
            | IntOp::MulLo
            | IntOp::And
            | IntOp::Or
            | IntOp::Xor
            | IntOp::Min
            | IntOp::Max => int32(t),
            IntOp::Shl | IntOp::Shr => int32(t) && t != Ty::Pred,
            IntOp::MulWide => matches!(t.bits(), 16) && !t.is_float(),
            _ => false,
        },
        Op::Tern {
            op: TernOp::MadLo,
            t,
            ..
        } => int32(t),
        Op::Tern {
            op: TernOp::Selp,
            t,
            ..
        } => t.bits() <= 32,
        Op::Tern {
            op: TernOp::Fma,
            t: Ty::F32,
            mode,
            ..
        } => plain(&mode),
        Op::Float {
            op: FOp::Add | FOp::Sub | FOp::Mul | FOp::Div,
            t: Ty::F32,
            mode,
            ..
        } => plain(&mode),
        Op::Setp { cmp, t, .. } => cmp_native(cmp, t),
        Op::Ld { size, sext, .. } => size <= 4 && !sext,
        Op::Special { r, .. } => matches!(
            r,
            SReg::Tid(_) | SReg::Ntid(_) | SReg::Ctaid(_) | SReg::Nctaid(_)
        ),
        _ => false,
    }
}

/// The condition code of float comparison `cmp`.
pub(super) fn float_cc(cmp: Cmp) -> FloatCC {
    match cmp {
        Cmp::Eq => FloatCC::Equal,
        Cmp::Ne => FloatCC::OrderedNotEqual,
        Cmp::Lt | Cmp::Lo => FloatCC::LessThan,
        Cmp::Le | Cmp::Ls => FloatCC::LessThanOrEqual,
        Cmp::Gt | Cmp::Hi => FloatCC::GreaterThan,
        Cmp::Ge | Cmp::Hs => FloatCC::GreaterThanOrEqual,
        Cmp::Equ => FloatCC::UnorderedOrEqual,
        Cmp::Neu => FloatCC::NotEqual,
        Cmp::Ltu => FloatCC::UnorderedOrLessThan,
        Cmp::Leu => FloatCC::UnorderedOrLessThanOrEqual,
        Cmp::Gtu => FloatCC::UnorderedOrGreaterThan,
        Cmp::Geu => FloatCC::UnorderedOrGreaterThanOrEqual,
        Cmp::Num => FloatCC::Ordered,
        Cmp::Nan => FloatCC::Unordered,
    }
}

/// The condition code of integer comparison `cmp`, `signed` or not.
pub(super) fn int_cc(cmp: Cmp, signed: bool) -> IntCC {
    match cmp {
        Cmp::Eq | Cmp::Equ => IntCC::Equal,
        Cmp::Ne | Cmp::Neu => IntCC::NotEqual,
        Cmp::Lt | Cmp::Ltu if signed => IntCC::SignedLessThan,
        Cmp::Le | Cmp::Leu if signed => IntCC::SignedLessThanOrEqual,
        Cmp::Gt | Cmp::Gtu if signed => IntCC::SignedGreaterThan,
        Cmp::Ge | Cmp::Geu if signed => IntCC::SignedGreaterThanOrEqual,
        Cmp::Lt | Cmp::Ltu => IntCC::UnsignedLessThan,
        Cmp::Le | Cmp::Leu => IntCC::UnsignedLessThanOrEqual,
        Cmp::Gt | Cmp::Gtu => IntCC::UnsignedGreaterThan,
        _ => IntCC::UnsignedGreaterThanOrEqual,
    }
}

/// Whether `setp` compares `cmp` of type `t` open-coded (to 0 or 1).
pub(super) fn cmp_native(cmp: Cmp, t: Ty) -> bool {
    match t {
        Ty::F32 | Ty::F64 => true,
        t if t.is_float() || t == Ty::Pred || t == Ty::B128 => false,
        _ => matches!(
            cmp,
            Cmp::Eq
                | Cmp::Ne
                | Cmp::Lt
                | Cmp::Le
                | Cmp::Gt
                | Cmp::Ge
                | Cmp::Equ
                | Cmp::Neu
                | Cmp::Ltu
                | Cmp::Leu
                | Cmp::Gtu
                | Cmp::Geu
        ),
    }
}
