//! `cvt`: conversions between integer and float types with rounding,
//! saturation and flush-to-zero.

use super::float::{ftz32, fval, int_to_float, round_f32, round_half, round_int, sat01, to_fbits};
use super::int::sext;
use crate::ir::{Rnd, Ty};

pub(crate) fn cvt(a: u64, dt: Ty, st: Ty, rnd: Rnd, sat: bool, ftz: bool) -> u64 {
    if st.is_float() {
        let mut x = fval(a, st);
        if ftz && st == Ty::F32 {
            x = ftz32(x as f32) as f64;
        }
        if dt.is_float() {
            if matches!(rnd, Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi) {
                x = round_int(x, rnd);
            }
            if sat {
                x = sat01(x);
            }
            return match dt {
                Ty::F32 => {
                    let r = if st == Ty::F64 {
                        round_f32(x, rnd)
                    } else {
                        x as f32
                    };
                    (if ftz { ftz32(r) } else { r }).to_bits() as u64
                }
                Ty::F16 | Ty::BF16 => round_half(x, dt == Ty::BF16, rnd),
                _ => to_fbits(x, dt),
            };
        }
        // float -> int: round then saturate to the destination range
        if x.is_nan() {
            return 0;
        }
        let r = round_int(x, rnd);
        let bits = dt.bits();
        let v: i128 = if dt.signed() {
            let lo = -(1i128 << (bits - 1));
            let hi = (1i128 << (bits - 1)) - 1;
            (r.clamp(lo as f64, hi as f64) as i128).clamp(lo, hi)
        } else {
            let hi = (1u128 << bits) - 1;
            (r.clamp(0.0, hi as f64) as u128).min(hi) as i128
        };
        return (v as u64) & dt.mask();
    }
    // integer source
    let v: i128 = if st.signed() {
        sext(a, st.bits()) as i128
    } else {
        (a & st.mask()) as i128
    };
    if dt.is_float() {
        let r = int_to_float(v, dt, if rnd == Rnd::Default { Rnd::Rn } else { rnd });
        if sat {
            let x = sat01(fval(r, dt));
            return to_fbits(x, dt);
        }
        return r;
    }
    if sat {
        let bits = dt.bits();
        let (lo, hi) = if dt.signed() {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        } else {
            (0, (1i128 << bits) - 1)
        };
        return (v.clamp(lo, hi) as u64) & dt.mask();
    }
    if dt.signed() && dt.bits() < st.bits().max(1) || !dt.signed() {
        (v as u64) & dt.mask()
    } else {
        // widening to a signed type keeps the sign in the low bits
        (v as u64) & dt.mask()
    }
}
