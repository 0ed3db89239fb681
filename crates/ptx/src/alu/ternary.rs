//! Three-operand PTX ops: `mad`/`fma` in all widths, `selp`, `bfe`, `sad`,
//! `slct`, funnel shifts and the `dp4a`/`dp2a` dot products.

use super::float::{
    by_halves, f32_of, ftz32, fval, half_at, pair_elem, round_f32, sat01, to_fbits,
};
use super::int::{int_bin, sext};
use crate::ir::{IntOp, Rnd, TernOp, Ty};

#[allow(clippy::too_many_arguments)]
pub(crate) fn tern(
    op: TernOp,
    t: Ty,
    a: u64,
    b: u64,
    c: u64,
    rnd: Rnd,
    ftz: bool,
    sat: bool,
) -> u64 {
    let bits = t.bits();
    let mask = t.mask();
    match op {
        TernOp::MadLo => a.wrapping_mul(b).wrapping_add(c) & mask,
        TernOp::Mad24Lo => int_bin(IntOp::Mul24Lo, t, a, b).wrapping_add(c) & mask,
        TernOp::MadHi => {
            if sat && t == Ty::S32 {
                let p = int_bin(IntOp::MulHi, t, a, b);
                return int_bin(IntOp::AddSat, t, p, c);
            }
            int_bin(IntOp::MulHi, t, a, b).wrapping_add(c) & mask
        }
        TernOp::MadWide => {
            let w = int_bin(IntOp::MulWide, t, a, b);
            let wmask = if bits >= 32 {
                u64::MAX
            } else {
                (1u64 << (2 * bits)) - 1
            };
            w.wrapping_add(c) & wmask
        }
        TernOp::Fma => match t {
            Ty::F32 => {
                let (mut x, mut y, mut z) = (f32_of(a), f32_of(b), f32_of(c));
                if ftz {
                    x = ftz32(x);
                    y = ftz32(y);
                    z = ftz32(z);
                }
                let r = match rnd {
                    Rnd::Rz | Rnd::Rm | Rnd::Rp => {
                        round_f32((x as f64).mul_add(y as f64, z as f64), rnd)
                    }
                    _ => x.mul_add(y, z),
                };
                let r = if sat { sat01(r as f64) as _ } else { r };
                (if ftz { ftz32(r) } else { r }).to_bits() as u64
            }
            Ty::F64 => f64::from_bits(a)
                .mul_add(f64::from_bits(b), f64::from_bits(c))
                .to_bits(),
            Ty::F16 | Ty::BF16 => {
                let r = fval(a, t).mul_add(fval(b, t), fval(c, t));
                let r = if sat { sat01(r) } else { r };
                to_fbits(r, t)
            }
            Ty::F16x2 | Ty::BF16x2 => by_halves(|k| {
                let (a, b, c) = (half_at(a, k), half_at(b, k), half_at(c, k));
                tern(op, pair_elem(t), a, b, c, rnd, ftz, sat)
            }),
            _ => 0,
        },
        TernOp::Selp => {
            if c & 1 != 0 {
                a & mask
            } else {
                b & mask
            }
        }
        TernOp::Bfe => {
            let pos = (b & 0xff) as u32;
            let len = (c & 0xff) as u32;
            let v = a & mask;
            if t.signed() {
                let sbit = if len == 0 {
                    false
                } else {
                    let msb = (pos + len - 1).min(bits - 1);
                    (v >> msb) & 1 != 0
                };
                if len == 0 {
                    return if sbit { mask } else { 0 };
                }
                let mut r = 0u64;
                for i in 0..bits {
                    let bit = if i < len && pos + i < bits {
                        (v >> (pos + i)) & 1
                    } else {
                        sbit as u64
                    };
                    r |= bit << i;
                }
                r & mask
            } else {
                if pos >= bits || len == 0 {
                    return 0;
                }
                let l = len.min(bits);
                let m = if l >= 64 { u64::MAX } else { (1u64 << l) - 1 };
                (v >> pos) & m & mask
            }
        }
        TernOp::Sad => {
            let d = if t.signed() {
                (sext(a, bits) - sext(b, bits)).unsigned_abs()
            } else {
                (a & mask).abs_diff(b & mask)
            };
            d.wrapping_add(c) & mask
        }
        TernOp::Slct => {
            let ge = if t == Ty::F32 {
                f32_of(c) >= 0.0
            } else {
                sext(c, 32) >= 0
            };
            if ge {
                a
            } else {
                b
            }
        }
        TernOp::Shfl | TernOp::Shfr => {
            let n = if t == Ty::U8 {
                (c & 0xffff_ffff).min(32)
            } else {
                c & 31
            };
            let wide = ((b & 0xffff_ffff) << 32) | (a & 0xffff_ffff);
            if op == TernOp::Shfl {
                ((wide << n) >> 32) & 0xffff_ffff
            } else {
                (wide >> n) & 0xffff_ffff
            }
        }
        TernOp::Dp4a | TernOp::Dp2aLo | TernOp::Dp2aHi => {
            let (asg, bsg) = match t {
                Ty::S64 => (true, true),
                Ty::S32 => (true, false),
                Ty::S16 => (false, true),
                _ => (false, false),
            };
            let byte = |v: u64, k: u32, sg: bool, w: u32| -> i64 {
                let x = (v >> (k * w)) & ((1u64 << w) - 1);
                if sg {
                    sext(x, w)
                } else {
                    x as i64
                }
            };
            let mut acc = if asg || bsg {
                sext(c, 32)
            } else {
                (c & 0xffff_ffff) as i64
            };
            if op == TernOp::Dp4a {
                for k in 0..4 {
                    acc = acc.wrapping_add(byte(a, k, asg, 8).wrapping_mul(byte(b, k, bsg, 8)));
                }
            } else {
                let base = if op == TernOp::Dp2aHi { 2 } else { 0 };
                for k in 0..2 {
                    acc = acc.wrapping_add(byte(a, k, asg, 16).wrapping_mul(byte(
                        b,
                        base + k,
                        bsg,
                        8,
                    )));
                }
            }
            acc as u64 & 0xffff_ffff
        }
    }
}
