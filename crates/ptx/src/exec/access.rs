//! Memory access of a running thread: generic addresses resolved to their
//! space, bounds and alignment checked, faults named like the driver's; and
//! byte copies inside a thread's local memory (call arguments, returns).

use super::limits::{LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW, WINDOW_SIZE};
use super::state::{Block, Geo};
use crate::ir::Sp;
use crate::launch::Fault;
use crate::memory::{atomic_load, atomic_store, DEVICE_VA_BASE};

impl<'a> Geo<'a> {
    pub(super) fn fault_addr(&self, addr: u64, what: &str, line: u32) -> Fault {
        Fault::IllegalAddress {
            addr,
            detail: format!("{what} of address {addr:#x} at line {line}"),
        }
    }
}

/// One access of a thread's instruction: `size` bytes at `addr` in space
/// `sp`; `line` names the instruction in fault messages.
#[derive(Debug, Clone, Copy)]
pub(super) struct Access {
    pub sp: Sp,
    pub addr: u64,
    pub size: u32,
    pub line: u32,
}

impl Block {
    /// Host pointer for access `at` (checked), to write it (`WRITE`) or to
    /// read it.
    #[inline(always)]
    pub(super) fn ptr<const WRITE: bool>(
        &mut self,
        g: &Geo<'_>,
        local: &mut Vec<u64>,
        at: Access,
    ) -> Result<*mut u8, Fault> {
        self.checked_ptr(g, local, at.sp, at.addr, at.size, WRITE, at.line)
    }

    /// [`Block::ptr`] of `size` bytes at `addr` in space `sp`, made by the
    /// instruction at `line`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn checked_ptr(
        &mut self,
        g: &Geo<'_>,
        local: &mut Vec<u64>,
        sp: Sp,
        addr: u64,
        size: u32,
        write: bool,
        line: u32,
    ) -> Result<*mut u8, Fault> {
        check_alignment(addr, size, line)?;
        let what = if write { "write" } else { "read" };
        let (sp, addr) = match sp {
            Sp::Generic => match resolve_generic(addr) {
                Some(resolved) => resolved,
                None => return Err(g.fault_addr(addr, what, line)),
            },
            s => (s, addr),
        };
        let end = addr.checked_add(size as u64);
        match sp {
            Sp::Global => {
                let (base, len, p) = self.cache;
                if addr >= base && end.is_some_and(|e| e <= base + len) && p != 0 {
                    return Ok((p as *mut u8).wrapping_add((addr - base) as usize));
                }
                match g.mem.resolve(addr, size as u64) {
                    Some((base, len, p)) => {
                        self.cache = (base, len, p as usize);
                        Ok(p.wrapping_add((addr - base) as usize))
                    }
                    None => Err(g.fault_addr(addr, what, line)),
                }
            }
            Sp::Shared => {
                // shared-window addresses are 32 bits wide, as on a GPU: the
                // high bits of a 64-bit address are ignored and 32-bit
                // arithmetic wraps
                let addr = addr as u32 as u64;
                if addr + size as u64 <= g.shared_bytes {
                    Ok((self.shared.as_mut_ptr() as *mut u8).wrapping_add(addr as usize))
                } else {
                    Err(g.fault_addr(SHARED_WINDOW + addr, what, line))
                }
            }
            Sp::Local => match end {
                Some(e) if e <= local.len() as u64 * 8 => {
                    Ok((local.as_mut_ptr() as *mut u8).wrapping_add(addr as usize))
                }
                _ => Err(g.fault_addr(LOCAL_WINDOW.wrapping_add(addr), what, line)),
            },
            _ => match end {
                Some(e) if e <= g.params_len && !write => {
                    Ok((g.params.as_ptr() as *mut u8).wrapping_add(addr as usize))
                }
                _ => Err(g.fault_addr(PARAM_WINDOW.wrapping_add(addr), what, line)),
            },
        }
    }

    /// Reads access `at`.
    #[inline(always)]
    pub(super) fn load(
        &mut self,
        g: &Geo<'_>,
        local: &mut Vec<u64>,
        at: Access,
    ) -> Result<u64, Fault> {
        let p = self.ptr::<false>(g, local, at)?;
        // SAFETY: `ptr` checked bounds and alignment against a live buffer (device
        // allocation under the launch's read lock, or this block's/thread's own memory).
        Ok(unsafe { atomic_load(p, at.size) })
    }

    /// Writes `v` by access `at`.
    #[inline(always)]
    pub(super) fn store(
        &mut self,
        g: &Geo<'_>,
        local: &mut Vec<u64>,
        at: Access,
        v: u64,
    ) -> Result<(), Fault> {
        let p = self.ptr::<true>(g, local, at)?;
        // SAFETY: as in `load`.
        unsafe { atomic_store(p, at.size, v) };
        Ok(())
    }

    pub(super) fn cstring(
        &mut self,
        g: &Geo<'_>,
        local: &mut Vec<u64>,
        addr: u64,
    ) -> Option<Vec<u8>> {
        let mut s = Vec::new();
        for k in 0..65536u64 {
            let at = Access {
                sp: Sp::Generic,
                addr: addr.wrapping_add(k),
                size: 1,
                line: 0,
            };
            let c = self.load(g, local, at).ok()? as u8;
            if c == 0 {
                return Some(s);
            }
            s.push(c);
        }
        Some(s)
    }
}

pub(super) fn bytes_of(v: &mut [u64]) -> &mut [u8] {
    let len = v.len() * 8;
    // SAFETY: any u64 buffer may be viewed as bytes; the view borrows `v` mutably.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, len) }
}

/// Copies `size` bytes inside a thread's local memory.
pub(super) fn local_copy(local: &mut [u64], dst: u32, src: u32, size: u32) -> bool {
    let bytes = bytes_of(local);
    let (d, s, n) = (dst as usize, src as usize, size as usize);
    if d + n > bytes.len() || s + n > bytes.len() {
        return false;
    }
    bytes.copy_within(s..s + n, d);
    true
}

pub(super) fn local_put(local: &mut [u64], dst: u32, v: u64, size: u32) -> bool {
    let bytes = bytes_of(local);
    let (d, n) = (dst as usize, size.min(8) as usize);
    if d + n > bytes.len() {
        return false;
    }
    bytes[d..d + n].copy_from_slice(&v.to_le_bytes()[..n]);
    true
}

pub(super) fn local_get(local: &mut [u64], src: u32, size: u32) -> Option<u64> {
    let bytes = bytes_of(local);
    let (s, n) = (src as usize, size.min(8) as usize);
    let mut b = [0u8; 8];
    b[..n].copy_from_slice(bytes.get(s..s + n)?);
    Some(u64::from_le_bytes(b))
}

/// Base of the generic-address window of `sp` (0 for global and generic
/// addresses, which are device addresses as they are).
#[inline]
pub(super) fn window_base(sp: Sp) -> u64 {
    match sp {
        Sp::Shared => SHARED_WINDOW,
        Sp::Local => LOCAL_WINDOW,
        Sp::Param => PARAM_WINDOW,
        Sp::Global | Sp::Generic => 0,
    }
}

/// Whether `addr` lies in the generic-address window starting at `base`.
#[inline]
pub(super) fn in_window(addr: u64, base: u64) -> bool {
    (base..base + WINDOW_SIZE).contains(&addr)
}

/// The space and in-space offset of a generic address.
#[inline]
fn resolve_generic(addr: u64) -> Option<(Sp, u64)> {
    let sp = if addr >= DEVICE_VA_BASE {
        Sp::Global
    } else if in_window(addr, SHARED_WINDOW) {
        Sp::Shared
    } else if in_window(addr, LOCAL_WINDOW) {
        Sp::Local
    } else if in_window(addr, PARAM_WINDOW) {
        Sp::Param
    } else {
        return None;
    };
    Some((sp, addr - window_base(sp)))
}

/// A `size`-byte access at `addr` (by the instruction at `line`) must be
/// aligned to its size, up to 16 bytes, as on the device (error 716).
pub(crate) fn check_alignment(addr: u64, size: u32, line: u32) -> Result<(), Fault> {
    let align = size.min(16) as u64;
    match addr & (align - 1) {
        0 => Ok(()),
        _ => Err(Fault::MisalignedAddress {
            addr,
            detail: format!("{size}-byte access at line {line}"),
        }),
    }
}
