//! Device `printf` from compiled code: the format string and arguments read
//! through the checked accesses, formatted by the crate's `printf`, kept in
//! the block's output as the interpreter keeps it.

use super::runtime::Ctx;
use crate::exec::PRINTF_LIMIT;
use crate::ir::{ArgLoc, Op, Sp, Src};
use crate::launch::Fault;
use crate::memory::atomic_load;
use crate::printf;
use std::cell::RefCell;

/// The thread's local memory and register file, as the helper sees them.
struct Frame<'a> {
    local: &'a mut [u8],
    regs: &'a mut [u64],
}

impl Frame<'_> {
    /// The value an argument location holds (a kernel's frame starts at 0).
    fn value(&self, l: &ArgLoc) -> u64 {
        match *l {
            ArgLoc::Frame { off, size } => {
                let (s, n) = (off as usize, size.min(8) as usize);
                let mut b = [0u8; 8];
                match self.local.get(s..s + n) {
                    Some(bytes) => {
                        b[..n].copy_from_slice(bytes);
                        u64::from_le_bytes(b)
                    }
                    None => 0,
                }
            }
            ArgLoc::Val { src, .. } => match src {
                Src::Reg(r) => self.regs.get(r as usize).copied().unwrap_or(0),
                Src::Imm(v) => v,
                Src::Frame(o) => o as u64,
            },
        }
    }

    /// Writes `v` where a return location says.
    fn put(&mut self, l: &ArgLoc, v: u64) {
        match *l {
            ArgLoc::Frame { off, size } => {
                let (d, n) = (off as usize, size.min(8) as usize);
                if let Some(bytes) = self.local.get_mut(d..d + n) {
                    bytes.copy_from_slice(&v.to_le_bytes()[..n]);
                }
            }
            ArgLoc::Val {
                src: Src::Reg(d), ..
            } => {
                if let Some(slot) = self.regs.get_mut(d as usize) {
                    *slot = v;
                }
            }
            _ => {}
        }
    }
}

impl Ctx<'_> {
    /// `size` bytes at generic address `addr`, if the access is good.
    fn generic_load(&mut self, local: *mut u8, addr: u64, size: u32) -> Option<u64> {
        let p = self
            .checked_ptr(u32::MAX, local, Sp::Generic, addr, size, false, 0)
            .ok()?;
        // SAFETY: `checked_ptr` checked bounds and alignment of a live buffer.
        Some(unsafe { atomic_load(p, size) })
    }

    /// The NUL-terminated string at generic address `addr` (at most 64 KiB).
    fn cstring(&mut self, local: *mut u8, addr: u64) -> Option<Vec<u8>> {
        let mut s = Vec::new();
        for k in 0..65536u64 {
            let c = self.generic_load(local, addr.wrapping_add(k), 1)? as u8;
            if c == 0 {
                return Some(s);
            }
            s.push(c);
        }
        Some(s)
    }
}

/// `printf` (op `op`, an `Op::Printf`) on `line`: its output goes to the
/// block's; its result, if it has one, to its register or frame slot. 0, or
/// 1 with the fault kept in the context.
///
/// # Safety
/// `ctx` is the live context of the running block, `local` the thread's
/// `ctx.local_bytes` bytes of local memory, `regs` its `nregs` registers,
/// `op` a live op; all used by this thread only.
pub(super) unsafe extern "C" fn rt_printf(
    ctx: *mut Ctx<'_>,
    local: *mut u8,
    regs: *mut u64,
    nregs: u64,
    op: *const Op,
    line: u32,
) -> u32 {
    // SAFETY: the caller's contract.
    let (ctx, op) = unsafe { (&mut *ctx, &*op) };
    let Op::Printf { fmt, args, ret } = op else {
        ctx.fault = Some(Fault::Failed(
            "internal error: printf helper on another op".into(),
        ));
        return 1;
    };
    let local_len = ctx.local_bytes as usize;
    // SAFETY: the caller's contract: the thread's own buffers, of these
    // sizes; each view lives only while nothing else reads them.
    let frame = || unsafe {
        Frame {
            local: std::slice::from_raw_parts_mut(local, local_len),
            regs: std::slice::from_raw_parts_mut(regs, nregs as usize),
        }
    };
    let (fptr, aptr) = {
        let f = frame();
        (f.value(fmt), f.value(args))
    };
    let Some(fmt_bytes) = ctx.cstring(local, fptr) else {
        ctx.fault = Some(Fault::IllegalAddress {
            addr: fptr,
            detail: format!("printf format read of address {fptr:#x} at line {line}"),
        });
        return 1;
    };
    let cell = RefCell::new(&mut *ctx);
    let text = printf::format(
        &fmt_bytes,
        |off, size| {
            cell.borrow_mut()
                .generic_load(local, aptr.wrapping_add(off), size)
        },
        |p| cell.borrow_mut().cstring(local, p),
    );
    // like the driver's bounded printf FIFO: excess output is dropped
    if ctx.out.len() + text.len() <= PRINTF_LIMIT {
        ctx.out.extend_from_slice(&text);
    }
    if let Some(r) = ret {
        frame().put(r, text.len() as u64);
    }
    0
}
