//! One-operand PTX ops (integer bit counts, negation, float math functions)
//! and `.relu`, on raw register bits.

use super::float::{by_halves, ftz32, fval, half_at, pair_elem, sat01, to_fbits};
use super::int::sext;
use crate::ir::{Ty, UnOp};

pub(crate) fn un_op(op: UnOp, t: Ty, a: u64, ftz: bool, sat: bool) -> u64 {
    let bits = t.bits();
    let mask = t.mask();
    match op {
        UnOp::Not => !a & mask,
        UnOp::Cnot => ((a & mask) == 0) as u64,
        UnOp::Neg => a.wrapping_neg() & mask,
        UnOp::Abs => (sext(a, bits).wrapping_abs() as u64) & mask,
        UnOp::Popc => (a & mask).count_ones() as u64,
        UnOp::Clz => ((a & mask).leading_zeros() - (64 - bits)) as u64,
        UnOp::Brev => ((a & mask).reverse_bits() >> (64 - bits)) & mask,
        UnOp::Bfind | UnOp::BfindShift => {
            let v = if t.signed() && sext(a, bits) < 0 {
                !a & mask
            } else {
                a & mask
            };
            if v == 0 {
                0xffff_ffff
            } else {
                let pos = 63 - v.leading_zeros() as u64;
                if op == UnOp::BfindShift {
                    bits as u64 - 1 - pos
                } else {
                    pos
                }
            }
        }
        UnOp::FNeg => match t {
            Ty::F32 | Ty::F64 | Ty::F16 | Ty::BF16 => a ^ (1u64 << (bits - 1)),
            Ty::F16x2 | Ty::BF16x2 => a ^ 0x8000_8000,
            _ => a,
        },
        UnOp::FAbs => match t {
            Ty::F32 | Ty::F64 | Ty::F16 | Ty::BF16 => a & !(1u64 << (bits - 1)) & mask,
            Ty::F16x2 | Ty::BF16x2 => a & 0x7fff_7fff,
            _ => a,
        },
        _ => {
            if matches!(t, Ty::F16x2 | Ty::BF16x2) {
                return by_halves(|k| un_op(op, pair_elem(t), half_at(a, k), ftz, sat));
            }
            let mut x = fval(a, t);
            if ftz && t == Ty::F32 {
                x = ftz32(x as f32) as f64;
            }
            let r = match op {
                UnOp::Sqrt => {
                    if t == Ty::F32 {
                        (x as f32).sqrt() as f64
                    } else {
                        x.sqrt()
                    }
                }
                UnOp::Rsqrt => 1.0 / x.sqrt(),
                UnOp::Rcp => {
                    if t == Ty::F32 {
                        (1.0f32 / x as f32) as f64
                    } else {
                        1.0 / x
                    }
                }
                UnOp::Sin => x.sin(),
                UnOp::Cos => x.cos(),
                UnOp::Ex2 => x.exp2(),
                UnOp::Lg2 => x.log2(),
                UnOp::Tanh => x.tanh(),
                _ => x,
            };
            let r = if sat { sat01(r) } else { r };
            if t == Ty::F32 && ftz {
                ftz32(r as f32).to_bits() as u64
            } else {
                to_fbits(r, t)
            }
        }
    }
}

/// `.relu`: negative (non-NaN) values become +0.
pub(crate) fn relu(v: u64, t: Ty) -> u64 {
    match t {
        Ty::F16x2 | Ty::BF16x2 => by_halves(|k| relu(half_at(v, k), pair_elem(t))),
        _ => {
            let x = fval(v, t);
            if x < 0.0 {
                0
            } else {
                v
            }
        }
    }
}
