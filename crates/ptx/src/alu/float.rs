//! Floating-point semantics of PTX on raw register bits: representations
//! (f16/bf16/f32/f64), directed rounding, flush-to-zero, saturation, canonical
//! NaNs, and the two-operand float ops.

use crate::ir::{FOp, Rnd, Ty, UnOp};
use half::{bf16, f16};
use std::cmp::Ordering;

#[inline]
pub(crate) fn f32_of(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

#[inline]
pub(crate) fn ftz32(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// The binary floats directed rounding steps between.
trait Ulp: Copy + PartialOrd {
    const ZERO: Self;
    fn up(self) -> Self;
    fn down(self) -> Self;
}

macro_rules! ulp {
    ($($float:ty),*) => {$(
        impl Ulp for $float {
            const ZERO: $float = 0.0;
            fn up(self) -> $float {
                self.next_up()
            }
            fn down(self) -> $float {
                self.next_down()
            }
        }
    )*};
}
ulp!(f32, f64);

/// Moves `r`, the round-to-nearest result of an exact value, to the result
/// of the directed mode `rnd`, given how `r` compares with the exact value.
fn redirect<F: Ulp>(r: F, rnd: Rnd, r_vs_exact: Ordering) -> F {
    match (rnd, r_vs_exact) {
        (Rnd::Rm, Ordering::Greater) => r.down(),
        (Rnd::Rp, Ordering::Less) => r.up(),
        // toward zero: only a result of larger magnitude than the exact one moves
        (Rnd::Rz, Ordering::Greater) if r > F::ZERO => r.down(),
        (Rnd::Rz, Ordering::Less) if r < F::ZERO => r.up(),
        _ => r,
    }
}

/// Rounds an f64 to f32 with a directed mode.
pub(crate) fn round_f32(x: f64, rnd: Rnd) -> f32 {
    let r = x as f32;
    if r.is_nan() || r.is_infinite() && x.is_infinite() {
        return r;
    }
    redirect(
        r,
        rnd,
        (r as f64).partial_cmp(&x).unwrap_or(Ordering::Equal),
    )
}

/// Round an integer (as i128) to f64/f32 with a directed mode.
pub(crate) fn int_to_float(v: i128, dt: Ty, rnd: Rnd) -> u64 {
    match dt {
        Ty::F64 => {
            let r = v as f64;
            redirect(r, rnd, (r as i128).cmp(&v)).to_bits()
        }
        Ty::F32 => {
            let r = v as f32;
            redirect(r, rnd, (r as i128).cmp(&v)).to_bits() as u64
        }
        Ty::F16 => f16::from_f64(v as f64).to_bits() as u64,
        Ty::BF16 => bf16::from_f64(v as f64).to_bits() as u64,
        _ => 0,
    }
}

/// Rounds an f64 to f16/bf16 bits with the given mode.
pub(crate) fn round_half(x: f64, bf: bool, rnd: Rnd) -> u64 {
    let bits = if bf {
        bf16::from_f64(x).to_bits()
    } else {
        f16::from_f64(x).to_bits()
    };
    let v = |b: u16| {
        if bf {
            bf16::from_bits(b).to_f64()
        } else {
            f16::from_bits(b).to_f64()
        }
    };
    let rv = v(bits);
    if x.is_nan() || rv == x {
        return bits as u64;
    }
    let neg = bits & 0x8000 != 0;
    // stepping the magnitude of a non-NaN half: bits +- 1 within its sign
    let mag_down = |b: u16| if b & 0x7fff == 0 { b } else { b - 1 };
    let mag_up = |b: u16| b.wrapping_add(1);
    let r = match rnd {
        Rnd::Rz if rv.abs() > x.abs() => mag_down(bits),
        Rnd::Rm if rv > x => {
            if neg {
                mag_up(bits)
            } else {
                mag_down(bits)
            }
        }
        Rnd::Rp if rv < x => {
            if neg {
                mag_down(bits)
            } else {
                mag_up(bits)
            }
        }
        _ => bits,
    };
    r as u64
}

/// Sign of (exact result - rounded result) for an f64 operation, from
/// error-free transformations: -1, 0 or 1.
pub(crate) fn residual_sign(op: FOp, x: f64, y: f64, r: f64) -> i32 {
    if !r.is_finite() || !x.is_finite() || !y.is_finite() {
        return 0;
    }
    let e = match op {
        FOp::Add | FOp::Sub => {
            let y = if op == FOp::Sub { -y } else { y };
            // two-sum: exact error of r = x + y
            let bv = r - x;
            let av = r - bv;
            (x - av) + (y - bv)
        }
        FOp::Mul => x.mul_add(y, -r),
        FOp::Div => {
            // x - r*y has the sign of (x/y - r) times the sign of y
            let rem = (-r).mul_add(y, x);
            if y < 0.0 {
                -rem
            } else {
                rem
            }
        }
        _ => 0.0,
    };
    if e > 0.0 {
        1
    } else if e < 0.0 {
        -1
    } else {
        0
    }
}

/// Moves a round-to-nearest f64 result to the directed-rounding result given
/// the sign of the exact residual.
pub(crate) fn adjust_f64(r: f64, sign: i32, rnd: Rnd) -> f64 {
    // the residual is exact - r: a negative one means r lies above
    redirect(r, rnd, 0.cmp(&sign))
}

/// `sqrt` and `rcp` with a directed rounding mode.
pub(crate) fn directed_unary(op: UnOp, t: Ty, a: u64, rnd: Rnd, ftz: bool) -> u64 {
    if t == Ty::F32 {
        let mut x = f32_of(a);
        if ftz {
            x = ftz32(x);
        }
        let x = x as f64;
        let exact = if op == UnOp::Sqrt { x.sqrt() } else { 1.0 / x };
        // f64 results of f32 inputs are within half an f64 ulp: directed rounding
        // to f32 from them is exact except in vanishingly rare ties
        let r = round_f32(exact, rnd);
        return (if ftz { ftz32(r) } else { r }).to_bits() as u64;
    }
    let x = f64::from_bits(a);
    let (r, sign) = if op == UnOp::Sqrt {
        let r = x.sqrt();
        let e = (-r).mul_add(r, x);
        (
            r,
            if e > 0.0 {
                1
            } else if e < 0.0 {
                -1
            } else {
                0
            },
        )
    } else {
        let r = 1.0 / x;
        (r, residual_sign(FOp::Div, 1.0, x, r))
    };
    if !r.is_finite() {
        return r.to_bits();
    }
    adjust_f64(r, sign, rnd).to_bits()
}

pub(crate) fn round_int(x: f64, rnd: Rnd) -> f64 {
    match rnd {
        Rnd::Rni | Rnd::Rn => x.round_ties_even(),
        Rnd::Rmi | Rnd::Rm => x.floor(),
        Rnd::Rpi | Rnd::Rp => x.ceil(),
        _ => x.trunc(),
    }
}

/// Reads a float-typed value as f64 (f16/bf16/f32/f64).
#[inline]
pub(crate) fn fval(v: u64, t: Ty) -> f64 {
    match t {
        Ty::F32 => f32_of(v) as f64,
        Ty::F64 => f64::from_bits(v),
        Ty::F16 => f16::from_bits(v as u16).to_f64(),
        Ty::BF16 => bf16::from_bits(v as u16).to_f64(),
        _ => f64::from_bits(v),
    }
}

/// The element type of a packed pair of halves (`f16x2` or `bf16x2`).
#[inline]
pub(crate) fn pair_elem(t: Ty) -> Ty {
    if t == Ty::F16x2 {
        Ty::F16
    } else {
        Ty::BF16
    }
}

/// Half `k` (0 low, 1 high) of a packed pair.
#[inline]
pub(crate) fn half_at(v: u64, k: u32) -> u64 {
    (v >> (16 * k)) & 0xffff
}

/// A packed pair computed half by half: `f(k)` is the result for half `k`.
#[inline]
pub(crate) fn by_halves(f: impl Fn(u32) -> u64) -> u64 {
    f(0) | f(1) << 16
}

/// NaN results as the GPU produces them: the canonical all-ones-mantissa NaN.
#[inline]
pub(crate) fn canon_nan(v: u64, t: Ty) -> u64 {
    match t {
        Ty::F32 if f32_of(v).is_nan() => 0x7fff_ffff,
        Ty::F64 if f64::from_bits(v).is_nan() => 0x7fff_ffff_ffff_ffff,
        Ty::F16 if v & 0x7fff > 0x7c00 => 0x7fff,
        Ty::BF16 if v & 0x7fff > 0x7f80 => 0x7fff,
        Ty::F16x2 | Ty::BF16x2 => by_halves(|k| canon_nan(half_at(v, k), pair_elem(t))),
        _ => v,
    }
}

pub(crate) fn to_fbits(x: f64, t: Ty) -> u64 {
    match t {
        Ty::F32 => (x as f32).to_bits() as u64,
        Ty::F16 => f16::from_f64(x).to_bits() as u64,
        Ty::BF16 => bf16::from_f64(x).to_bits() as u64,
        _ => x.to_bits(),
    }
}

pub(crate) fn fop(op: FOp, x: f64, y: f64) -> f64 {
    match op {
        FOp::Add => x + y,
        FOp::Sub => x - y,
        FOp::Mul => x * y,
        FOp::Div => x / y,
        FOp::Min | FOp::Max => {
            // a NaN operand yields the other; of two zeros, min takes -0
            // and max +0
            let min = op == FOp::Min;
            if x.is_nan() {
                y
            } else if y.is_nan() {
                x
            } else if x == y {
                if x.is_sign_negative() == min {
                    x
                } else {
                    y
                }
            } else if min {
                x.min(y)
            } else {
                x.max(y)
            }
        }
        FOp::Copysign => y.copysign(x),
    }
}

/// `.sat`: clamp to [+0, 1]; NaN and -0 become +0 (as the GPU does).
pub(crate) fn sat01(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        0.0
    } else if x > 1.0 {
        1.0
    } else {
        x
    }
}

/// An exact zero sum of operands with opposite signs is -0 when rounding
/// toward minus infinity (IEEE 754), +0 otherwise.
pub(crate) fn zero_sign(r: f64, x: f64, y_eff: f64, rnd: Rnd) -> f64 {
    if r == 0.0 && rnd == Rnd::Rm && x.is_sign_negative() != y_eff.is_sign_negative() {
        -0.0
    } else {
        r
    }
}

pub(crate) fn float_bin(op: FOp, t: Ty, a: u64, b: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    let satf = |x: f64| if sat { sat01(x) } else { x };
    match t {
        Ty::F32 => {
            let (mut x, mut y) = (f32_of(a), f32_of(b));
            if ftz {
                x = ftz32(x);
                y = ftz32(y);
            }
            let r = match (op, rnd) {
                (FOp::Add, Rnd::Default | Rnd::Rn) => x + y,
                (FOp::Sub, Rnd::Default | Rnd::Rn) => x - y,
                (FOp::Mul, Rnd::Default | Rnd::Rn) => x * y,
                (FOp::Div, Rnd::Default | Rnd::Rn) => x / y,
                (FOp::Min | FOp::Max | FOp::Copysign, _) => fop(op, x as f64, y as f64) as f32,
                (FOp::Add | FOp::Sub, _) => {
                    let ye = if op == FOp::Sub { -y } else { y };
                    let r = round_f32(fop(op, x as f64, y as f64), rnd);
                    zero_sign(r as f64, x as f64, ye as f64, rnd) as f32
                }
                _ => round_f32(fop(op, x as f64, y as f64), rnd),
            };
            let r = if sat { satf(r as f64) as f32 } else { r };
            (if ftz { ftz32(r) } else { r }).to_bits() as u64
        }
        Ty::F64 => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            let r = fop(op, x, y);
            let r = match rnd {
                Rnd::Rz | Rnd::Rm | Rnd::Rp => adjust_f64(r, residual_sign(op, x, y, r), rnd),
                _ => r,
            };
            let r = match op {
                FOp::Add => zero_sign(r, x, y, rnd),
                FOp::Sub => zero_sign(r, x, -y, rnd),
                _ => r,
            };
            satf(r).to_bits()
        }
        Ty::F16 | Ty::BF16 => to_fbits(satf(fop(op, fval(a, t), fval(b, t))), t),
        Ty::F16x2 | Ty::BF16x2 => by_halves(|k| {
            float_bin(
                op,
                pair_elem(t),
                half_at(a, k),
                half_at(b, k),
                rnd,
                ftz,
                sat,
            )
        }),
        _ => 0,
    }
}
