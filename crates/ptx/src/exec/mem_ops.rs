//! Memory ops of one thread: `ld`, `st` (scalar and vector), `atom`/`red`,
//! `cp.async` (done at once), and the address-space ops `cvta`/`isspacep`.

use super::access::{in_window, window_base};
use super::state::{Block, Geo, Thread};
use crate::alu::{atom_apply, sext};
use crate::ir::{Op, Sp, NONE};
use crate::launch::Fault;
use crate::memory::{atomic_rmw, DEVICE_VA_BASE};

/// Runs one memory op of thread `th`.
#[inline(always)]
pub(super) fn step(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    op: &Op,
    line: u32,
) -> Result<(), Fault> {
    match op {
        Op::Ld {
            sp,
            size,
            n,
            ds,
            addr,
            off,
            sext: se,
        } => {
            debug_assert!((1..=4).contains(n), "ld of {n} elements");
            let a = th.get(*addr).wrapping_add(*off as u64);
            check_vector_alignment(a, *size, *n, "load", line)?;
            for (k, d) in ds.iter().enumerate().take(*n as usize) {
                let ea = a.wrapping_add((k as u64) * *size as u64);
                let mut v = b.load(g, &mut th.local, *sp, ea, *size, line)?;
                if *se {
                    v = sext(v, size * 8) as u64;
                }
                th.set(*d, v);
            }
        }
        Op::St {
            sp,
            size,
            n,
            vals,
            addr,
            off,
        } => {
            debug_assert!((1..=4).contains(n), "st of {n} elements");
            let a = th.get(*addr).wrapping_add(*off as u64);
            check_vector_alignment(a, *size, *n, "store", line)?;
            let mut vs = [0u64; 4];
            for (v, s) in vs.iter_mut().zip(vals).take(*n as usize) {
                *v = th.get(*s);
            }
            for (k, v) in vs.iter().enumerate().take(*n as usize) {
                let ea = a.wrapping_add((k as u64) * *size as u64);
                b.store(g, &mut th.local, *sp, ea, *size, *v, line)?;
            }
        }
        Op::Atom {
            sp,
            op,
            t,
            d,
            addr,
            off,
            b: bb,
            c,
        } => {
            let a = th.get(*addr).wrapping_add(*off as u64);
            let (bv, cv) = (th.get(*bb), th.get(*c));
            let size = t.bytes();
            let p = b.ptr(g, &mut th.local, *sp, a, size, true, line)?;
            let (op, t) = (*op, *t);
            // SAFETY: `ptr` checked bounds and alignment (size 2, 4 or 8) of a live buffer.
            let old = unsafe { atomic_rmw(p, size, |o| atom_apply(op, t, o, bv, cv)) };
            if *d != NONE {
                th.set(*d, old);
            }
        }
        Op::Cvta {
            d,
            a,
            sp,
            to_generic,
        } => {
            let v = th.get(*a);
            let win = window_base(*sp);
            th.set(
                *d,
                if *to_generic {
                    v.wrapping_add(win)
                } else {
                    v.wrapping_sub(win)
                },
            );
        }
        Op::Isspacep { d, a, sp } => {
            let v = th.get(*a);
            let is = match sp {
                Sp::Shared | Sp::Local | Sp::Param => in_window(v, window_base(*sp)),
                _ => v >= DEVICE_VA_BASE,
            };
            th.set(*d, is as u64);
        }
        Op::CpAsync {
            dst,
            doff,
            src,
            soff,
            size,
            src_size,
        } => {
            let da = th.get(*dst).wrapping_add(*doff as u64);
            let sa = th.get(*src).wrapping_add(*soff as u64);
            let n = (th.get(*src_size) as u32).min(*size);
            for k in 0..*size as u64 {
                let v = if (k as u32) < n {
                    b.load(g, &mut th.local, Sp::Generic, sa.wrapping_add(k), 1, line)?
                } else {
                    0
                };
                b.store(g, &mut th.local, Sp::Shared, da.wrapping_add(k), 1, v, line)?;
            }
        }
        _ => debug_assert!(false, "{op:?} is not a memory op"),
    }
    Ok(())
}

/// A vector access must be aligned to its whole size (at most 16 bytes).
#[inline]
fn check_vector_alignment(addr: u64, size: u32, n: u8, what: &str, line: u32) -> Result<(), Fault> {
    let total = size * (n as u32);
    if total > size && !addr.is_multiple_of(total.min(16) as u64) {
        return Err(Fault::MisalignedAddress {
            addr,
            detail: format!("{total}-byte vector {what} at line {line}"),
        });
    }
    Ok(())
}
