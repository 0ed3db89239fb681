//! Memory ops of one thread: `ld`, `st` (scalar and vector; an ordered
//! vector in global memory whole, `whole_vector`), `atom`/`red`, `cp.async`
//! (done at once), and the address-space ops `cvta`/`isspacep`.

use super::access::{in_window, window_base, Access};
use super::state::{Block, Geo, Thread};
use crate::alu::{atom_apply, sext};
use crate::ir::{Op, Sp, NONE};
use crate::launch::Fault;
use crate::memory::{atomic_rmw, DEVICE_VA_BASE};
use crate::whole_vector::{element, load_whole, pack, store_whole, whole_width};

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
            addr,
            size,
            n,
            ds,
            sext: se,
            order,
        } => {
            debug_assert!((1..=4).contains(n), "ld of {n} elements");
            let a = th.address(addr);
            check_vector_alignment(a, *size, *n, "load", line)?;
            if let Some(bytes) = whole_width(*order, addr.sp, *size, *n) {
                let at = access(addr.sp, a, bytes, line);
                let p = b.ptr::<false>(g, &mut th.local, at)?;
                // SAFETY: `ptr` checked bounds and alignment (to `bytes`, at most 16) of a live buffer.
                let words = unsafe { load_whole(p, bytes) };
                for (k, d) in ds.iter().enumerate().take(*n as usize) {
                    let v = element(words, *size, k);
                    th.set(*d, if *se { sext(v, size * 8) as u64 } else { v });
                }
                return Ok(());
            }
            for (k, d) in ds.iter().enumerate().take(*n as usize) {
                let at = vector_element(addr.sp, a, *size, k, line);
                let mut v = b.load(g, &mut th.local, at)?;
                if *se {
                    v = sext(v, size * 8) as u64;
                }
                th.set(*d, v);
            }
        }
        Op::St {
            addr,
            size,
            n,
            vals,
            order,
        } => {
            debug_assert!((1..=4).contains(n), "st of {n} elements");
            let a = th.address(addr);
            check_vector_alignment(a, *size, *n, "store", line)?;
            let mut vs = [0u64; 4];
            for (v, s) in vs.iter_mut().zip(vals).take(*n as usize) {
                *v = th.get(*s);
            }
            if let Some(bytes) = whole_width(*order, addr.sp, *size, *n) {
                let at = access(addr.sp, a, bytes, line);
                let p = b.ptr::<true>(g, &mut th.local, at)?;
                // SAFETY: as for the load above.
                unsafe { store_whole(p, bytes, pack(&vs[..*n as usize], *size)) };
                return Ok(());
            }
            for (k, v) in vs.iter().enumerate().take(*n as usize) {
                let at = vector_element(addr.sp, a, *size, k, line);
                b.store(g, &mut th.local, at, *v)?;
            }
        }
        Op::Atom {
            addr,
            op,
            t,
            d,
            b: bb,
            c,
        } => {
            let (bv, cv) = (th.get(*bb), th.get(*c));
            let size = t.bytes();
            let at = access(addr.sp, th.address(addr), size, line);
            let p = b.ptr::<true>(g, &mut th.local, at)?;
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
            let byte = |sp, addr| Access {
                sp,
                addr,
                size: 1,
                line,
            };
            for k in 0..*size as u64 {
                let v = if (k as u32) < n {
                    b.load(g, &mut th.local, byte(Sp::Generic, sa.wrapping_add(k)))?
                } else {
                    0
                };
                b.store(g, &mut th.local, byte(Sp::Shared, da.wrapping_add(k)), v)?;
            }
        }
        _ => debug_assert!(false, "{op:?} is not a memory op"),
    }
    Ok(())
}

/// Element `k` of a vector of `size`-byte elements at `base` in space `sp`.
#[inline(always)]
fn vector_element(sp: Sp, base: u64, size: u32, k: usize, line: u32) -> Access {
    access(sp, base.wrapping_add((k as u64) * size as u64), size, line)
}

/// The `size` bytes at `addr` in space `sp`.
#[inline(always)]
fn access(sp: Sp, addr: u64, size: u32, line: u32) -> Access {
    Access {
        sp,
        addr,
        size,
        line,
    }
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
