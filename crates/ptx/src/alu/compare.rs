//! Comparisons (`setp`, `set`, `slct`) of integer and float register bits,
//! ordered and unordered, and the float class tests of `testp`.

use super::float::fval;
use super::int::sext;
use crate::ir::{Cmp, Ty};

pub(crate) fn compare(cmp: Cmp, t: Ty, a: u64, b: u64) -> bool {
    if t.is_float() {
        let (x, y) = (fval(a, t), fval(b, t));
        let un = x.is_nan() || y.is_nan();
        return match cmp {
            Cmp::Eq => !un && x == y,
            Cmp::Ne => !un && x != y,
            Cmp::Lt | Cmp::Lo => !un && x < y,
            Cmp::Le | Cmp::Ls => !un && x <= y,
            Cmp::Gt | Cmp::Hi => !un && x > y,
            Cmp::Ge | Cmp::Hs => !un && x >= y,
            Cmp::Equ => un || x == y,
            Cmp::Neu => un || x != y,
            Cmp::Ltu => un || x < y,
            Cmp::Leu => un || x <= y,
            Cmp::Gtu => un || x > y,
            Cmp::Geu => un || x >= y,
            Cmp::Num => !un,
            Cmp::Nan => un,
        };
    }
    let bits = t.bits();
    let (ua, ub) = (a & t.mask(), b & t.mask());
    let (sa, sb) = (sext(a, bits), sext(b, bits));
    let signed = t.signed();
    match cmp {
        Cmp::Eq | Cmp::Equ => ua == ub,
        Cmp::Ne | Cmp::Neu => ua != ub,
        Cmp::Lt | Cmp::Ltu => {
            if signed {
                sa < sb
            } else {
                ua < ub
            }
        }
        Cmp::Le | Cmp::Leu => {
            if signed {
                sa <= sb
            } else {
                ua <= ub
            }
        }
        Cmp::Gt | Cmp::Gtu => {
            if signed {
                sa > sb
            } else {
                ua > ub
            }
        }
        Cmp::Ge | Cmp::Geu => {
            if signed {
                sa >= sb
            } else {
                ua >= ub
            }
        }
        Cmp::Lo => ua < ub,
        Cmp::Ls => ua <= ub,
        Cmp::Hi => ua > ub,
        Cmp::Hs => ua >= ub,
        Cmp::Num => true,
        Cmp::Nan => false,
    }
}

/// `testp`: class `kind` (0 finite, 1 infinite, 2 number, 3 NaN, 4 normal,
/// 5 subnormal) of the float `a` of type `t`.
pub(crate) fn testp(kind: u8, t: Ty, a: u64) -> bool {
    let x = fval(a, t);
    match kind {
        0 => x.is_finite(),
        1 => x.is_infinite(),
        2 => !x.is_nan(),
        3 => x.is_nan(),
        4 => {
            if t == Ty::F32 {
                (x as f32).is_normal()
            } else {
                x.is_normal()
            }
        }
        _ => {
            if t == Ty::F32 {
                (x as f32).is_subnormal()
            } else {
                x.is_subnormal()
            }
        }
    }
}
