//! Register-only ops of one thread: every op that neither touches memory
//! nor changes control flow, evaluated with `alu` and written back to the
//! thread's current frame.

use super::state::{rd, wr};
use crate::alu::{
    bfi, canon_nan, carry, compare, cvt, directed_unary, float_bin, int_bin, lop3, prmt, relu,
    tern, testp, to_fbits, un_op,
};
use crate::ir::*;

/// Runs one register-only op in the frame at `rbase`/`lbase`.
#[inline(always)]
pub(crate) fn step(op: &Op, regs: &mut [u64], rbase: u32, lbase: u32) {
    macro_rules! r {
        ($s:expr) => {
            rd(regs, rbase, lbase, $s)
        };
    }
    match op {
        Op::Mov { d, a, mask } => {
            let v = r!(*a) & mask;
            wr(regs, rbase, *d, v);
        }
        Op::Int { op, t, d, a, b } => {
            let v = int_bin(*op, *t, r!(*a), r!(*b));
            wr(regs, rbase, *d, v);
        }
        Op::Float {
            op,
            t,
            d,
            a,
            b,
            mode,
        } => {
            let v = float_bin(*op, *t, r!(*a), r!(*b), mode.rnd, mode.ftz, mode.sat);
            let v = if *op == FOp::Copysign {
                v
            } else {
                canon_nan(v, *t)
            };
            wr(regs, rbase, *d, v);
        }
        Op::Un { op, t, d, a, mode } => {
            let v = match (op, t, mode.rnd) {
                (UnOp::Sqrt | UnOp::Rcp, Ty::F32 | Ty::F64, Rnd::Rz | Rnd::Rm | Rnd::Rp) => {
                    directed_unary(*op, *t, r!(*a), mode.rnd, mode.ftz)
                }
                _ => un_op(*op, *t, r!(*a), mode.ftz, mode.sat),
            };
            let v = if t.is_float() && !matches!(op, UnOp::FNeg | UnOp::FAbs) {
                canon_nan(v, *t)
            } else {
                v
            };
            wr(regs, rbase, *d, v);
        }
        Op::Tern {
            op,
            t,
            d,
            a,
            b,
            c,
            mode,
        } => {
            let v = tern(
                *op,
                *t,
                r!(*a),
                r!(*b),
                r!(*c),
                mode.rnd,
                mode.ftz,
                mode.sat,
            );
            let v = if *op == TernOp::Fma {
                canon_nan(v, *t)
            } else {
                v
            };
            wr(regs, rbase, *d, v);
        }
        Op::Bfi { t, d, a, b, c, e } => {
            let v = bfi(*t, r!(*a), r!(*b), r!(*c), r!(*e));
            wr(regs, rbase, *d, v);
        }
        Op::Prmt { d, a, b, c, mode } => {
            let v = prmt(r!(*a), r!(*b), r!(*c), *mode);
            wr(regs, rbase, *d, v);
        }
        Op::Relu { d, t } => {
            let v = relu(r!(Src::Reg(*d)), *t);
            wr(regs, rbase, *d, v);
        }
        Op::Lop3 { d, a, b, c, lut } => {
            let v = lop3(r!(*a), r!(*b), r!(*c), *lut);
            wr(regs, rbase, *d, v);
        }
        Op::Setp {
            cmp,
            t,
            d,
            d2,
            a,
            b,
            bop,
            c,
            cneg,
            ftz: _,
        } => {
            let p = compare(*cmp, *t, r!(*a), r!(*b));
            let cv = (r!(*c) & 1 != 0) != *cneg;
            let f = |x: bool| match bop {
                BoolOp::None => x,
                BoolOp::And => x && cv,
                BoolOp::Or => x || cv,
                BoolOp::Xor => x ^ cv,
            };
            wr(regs, rbase, *d, f(p) as u64);
            if *d2 != NONE {
                wr(regs, rbase, *d2, f(!p) as u64);
            }
        }
        Op::Set {
            cmp,
            t,
            dt,
            d,
            a,
            b,
        } => {
            let p = compare(*cmp, *t, r!(*a), r!(*b));
            let v = if dt.is_float() {
                if p {
                    to_fbits(1.0, *dt)
                } else {
                    0
                }
            } else if p {
                dt.mask()
            } else {
                0
            };
            wr(regs, rbase, *d, v);
        }
        Op::Testp { d, a, t, kind } => {
            let v = testp(*kind, *t, r!(*a));
            wr(regs, rbase, *d, v as u64);
        }
        Op::Cvt { d, a, dt, st, mode } => {
            let v = cvt(r!(*a), *dt, *st, mode.rnd, mode.sat, mode.ftz);
            let v = if dt.is_float() { canon_nan(v, *dt) } else { v };
            wr(regs, rbase, *d, v);
        }
        Op::Pack { d, parts, bits } => {
            let mut v = 0u64;
            let m = low_bits(*bits);
            for (k, p) in parts.iter().enumerate() {
                let sh = (k as u32).saturating_mul(*bits);
                if sh < 64 {
                    v |= (r!(*p) & m) << sh;
                }
            }
            wr(regs, rbase, *d, v);
        }
        Op::Unpack { ds, a, bits } => {
            let v = r!(*a);
            let m = low_bits(*bits);
            for (k, d) in ds.iter().enumerate() {
                let sh = (k as u32).saturating_mul(*bits);
                let part = if sh < 64 { (v >> sh) & m } else { 0 };
                wr(regs, rbase, *d, part);
            }
        }
        Op::Carry {
            kind,
            t,
            d,
            a,
            b,
            c,
            cin,
            cout,
            cc,
        } => {
            let flag = *cin && r!(Src::Reg(*cc)) & 1 != 0;
            let (v, carry) = carry(*kind, *t, r!(*a), r!(*b), r!(*c), flag);
            wr(regs, rbase, *d, v);
            if *cout {
                wr(regs, rbase, *cc, carry as u64);
            }
        }
        _ => debug_assert!(false, "{op:?} is not a register-only op"),
    }
}

/// A mask of the low `bits` bits (all 64 from 64 up).
#[inline(always)]
fn low_bits(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}
