//! The read-modify-write step of `atom`/`red`: the new value from the old
//! one, or `None` where a compare-and-swap leaves memory unchanged.

use super::float::float_bin;
use super::int::int_bin;
use crate::ir::{AtomOp, FOp, IntOp, Rnd, Ty};

pub(crate) fn atom_apply(op: AtomOp, t: Ty, old: u64, b: u64, c: u64) -> Option<u64> {
    let mask = t.mask();
    let old = old & mask;
    Some(match op {
        AtomOp::Add => {
            if t.is_float() {
                float_bin(FOp::Add, t, old, b, Rnd::Rn, false, false)
            } else {
                old.wrapping_add(b) & mask
            }
        }
        AtomOp::Min | AtomOp::Max => {
            let min = op == AtomOp::Min;
            if t.is_float() {
                let fop = if min { FOp::Min } else { FOp::Max };
                float_bin(fop, t, old, b, Rnd::Rn, false, false)
            } else {
                int_bin(if min { IntOp::Min } else { IntOp::Max }, t, old, b)
            }
        }
        AtomOp::Inc => {
            if old >= (b & mask) {
                0
            } else {
                old + 1
            }
        }
        AtomOp::Dec => {
            if old == 0 || old > (b & mask) {
                b & mask
            } else {
                old - 1
            }
        }
        AtomOp::Exch => b & mask,
        AtomOp::Cas => {
            if old == b & mask {
                c & mask
            } else {
                return None;
            }
        }
        AtomOp::And => old & b,
        AtomOp::Or => (old | b) & mask,
        AtomOp::Xor => (old ^ b) & mask,
    })
}
