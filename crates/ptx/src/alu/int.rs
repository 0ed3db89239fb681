//! Integer and bit semantics of PTX on raw register bits: sign extension,
//! the two-operand integer ops, carries, bit-field insert, `prmt`, `lop3`.

use crate::ir::{CarryKind, IntOp, Ty};

#[inline]
pub(crate) fn sext(v: u64, bits: u32) -> i64 {
    if bits >= 64 {
        v as i64
    } else {
        let s = 64 - bits;
        ((v << s) as i64) >> s
    }
}

pub(crate) fn int_bin(op: IntOp, t: Ty, a: u64, b: u64) -> u64 {
    let bits = t.bits();
    let mask = t.mask();
    let s = t.signed();
    match op {
        IntOp::Add => a.wrapping_add(b) & mask,
        IntOp::Sub => a.wrapping_sub(b) & mask,
        IntOp::MulLo => a.wrapping_mul(b) & mask,
        IntOp::Mul24Lo => {
            let (x, y) = if s {
                (sext(a, 24) as u64, sext(b, 24) as u64)
            } else {
                (a & 0xff_ffff, b & 0xff_ffff)
            };
            x.wrapping_mul(y) & mask
        }
        IntOp::MulHi => {
            if s {
                let p = (sext(a, bits) as i128) * (sext(b, bits) as i128);
                ((p >> bits) as u64) & mask
            } else {
                let p = ((a & mask) as u128) * ((b & mask) as u128);
                ((p >> bits) as u64) & mask
            }
        }
        IntOp::MulWide => {
            let wmask = if bits >= 32 {
                u64::MAX
            } else {
                (1u64 << (2 * bits)) - 1
            };
            if s {
                ((sext(a, bits) as i128 * sext(b, bits) as i128) as u64) & wmask
            } else {
                (((a & mask) as u128 * (b & mask) as u128) as u64) & wmask
            }
        }
        IntOp::Div | IntOp::Rem => {
            if s {
                let (x, y) = (sext(a, bits), sext(b, bits));
                if y == 0 {
                    return if op == IntOp::Div { mask } else { a & mask };
                }
                let r = if op == IntOp::Div {
                    x.wrapping_div(y)
                } else {
                    x.wrapping_rem(y)
                };
                r as u64 & mask
            } else {
                let (x, y) = (a & mask, b & mask);
                if y == 0 {
                    return if op == IntOp::Div { mask } else { x };
                }
                if op == IntOp::Div {
                    x / y
                } else {
                    x % y
                }
            }
        }
        IntOp::Min | IntOp::Max => {
            let less = if s {
                sext(a, bits) < sext(b, bits)
            } else {
                (a & mask) < (b & mask)
            };
            let pick_a = if op == IntOp::Min { less } else { !less };
            (if pick_a { a } else { b }) & mask
        }
        IntOp::And => a & b & mask,
        IntOp::Or => (a | b) & mask,
        IntOp::Xor => (a ^ b) & mask,
        IntOp::Shl => {
            let n = b & 0xffff_ffff;
            if n >= bits as u64 {
                0
            } else {
                (a << n) & mask
            }
        }
        IntOp::Shr => {
            let n = (b & 0xffff_ffff).min(bits as u64 - 1 + !s as u64);
            if s {
                (sext(a, bits) >> n.min(63)) as u64 & mask
            } else if n >= bits as u64 {
                0
            } else {
                ((a & mask) >> n) & mask
            }
        }
        IntOp::AddSat | IntOp::SubSat => {
            let (x, y) = (sext(a, bits) as i128, sext(b, bits) as i128);
            let r = if op == IntOp::AddSat { x + y } else { x - y };
            let (lo, hi) = (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1);
            (r.clamp(lo, hi) as u64) & mask
        }
        IntOp::Bmsk => {
            let (p, l) = (a & 0xff, b & 0xff);
            let p = p.min(32);
            let l = l.min(32 - p);
            (((1u64 << l) - 1) << p) & 0xffff_ffff
        }
    }
}

pub(crate) fn prmt(a: u64, b: u64, c: u64, mode: u8) -> u64 {
    let bytes = ((b & 0xffff_ffff) << 32) | (a & 0xffff_ffff);
    let byte = |i: u64| (bytes >> ((i & 7) * 8)) & 0xff;
    let n = c & 3;
    let mut r = 0u64;
    for k in 0..4u64 {
        let v = match mode {
            1 => byte(n + k),                 // f4e
            2 => byte((n + 8 - k) & 7),       // b4e
            3 => byte(n),                     // rc8
            4 => byte(k.max(n)),              // ecl
            5 => byte(k.min(n)),              // ecr
            6 => byte((n & 1) * 2 + (k & 1)), // rc16
            _ => {
                let sel = (c >> (4 * k)) & 0xf;
                let x = byte(sel & 7);
                if sel & 8 != 0 {
                    if x & 0x80 != 0 {
                        0xff
                    } else {
                        0
                    }
                } else {
                    x
                }
            }
        };
        r |= v << (8 * k);
    }
    r
}

pub(crate) fn lop3(a: u64, b: u64, c: u64, lut: u8) -> u64 {
    let mut r = 0u64;
    for i in 0..8u8 {
        if lut & (1 << i) != 0 {
            let x = if i & 4 != 0 { a } else { !a };
            let y = if i & 2 != 0 { b } else { !b };
            let z = if i & 1 != 0 { c } else { !c };
            r |= x & y & z;
        }
    }
    r & 0xffff_ffff
}

/// `bfi`: inserts the low `len` bits of `a` into `b` at bit `pos`.
pub(crate) fn bfi(t: Ty, a: u64, b: u64, pos: u64, len: u64) -> u64 {
    let bits = t.bits() as u64;
    let (pos, len) = (pos & 0xff, len & 0xff);
    if pos >= bits || len == 0 {
        return b & t.mask();
    }
    let l = len.min(bits - pos);
    let m = if l >= 64 {
        u64::MAX
    } else {
        ((1u64 << l) - 1) << pos
    };
    ((b & !m) | ((a << pos) & m)) & t.mask()
}

/// Add, subtract or multiply-add with a carry in (`flag`): the result and
/// the carry (or borrow) out.
pub(crate) fn carry(kind: CarryKind, t: Ty, a: u64, b: u64, c: u64, flag: bool) -> (u64, bool) {
    let bits = t.bits();
    let mask = t.mask() as u128;
    let (x, y, z) = (a as u128 & mask, b as u128 & mask, c as u128 & mask);
    let flag = flag as u128;
    let (v, carry) = match kind {
        CarryKind::Add => {
            let r = x + y + flag;
            (r, (r >> bits) & 1)
        }
        CarryKind::Sub => {
            let sub = y + flag;
            (x.wrapping_sub(sub), (x < sub) as u128)
        }
        CarryKind::MadLo | CarryKind::MadHi => {
            let p = x * y;
            let part = if kind == CarryKind::MadHi {
                p >> bits
            } else {
                p & mask
            };
            let r = part + z + flag;
            (r, (r >> bits) & 1)
        }
    };
    ((v & mask) as u64, carry != 0)
}
