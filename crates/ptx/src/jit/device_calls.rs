//! What compiled code leaves to a helper: `printf`, `__assertfail`, `malloc`,
//! `free` and `cp.async`, with the interpreter's checked accesses, results
//! and faults; output kept per block.

use super::runtime::Ctx;
use crate::ir::{ArgLoc, Op, Sp, Src};
use crate::launch::Fault;
use crate::memory::{atomic_load, atomic_store};
use crate::printf;
use std::cell::RefCell;

/// The thread's local memory and register file, as the helper sees them.
struct Frame<'a> {
    local: &'a mut [u8],
    regs: &'a mut [u64],
}

impl Frame<'_> {
    /// The value of operand `s` (a kernel's frame starts at 0).
    fn src(&self, s: Src) -> u64 {
        match s {
            Src::Reg(r) => self.regs.get(r as usize).copied().unwrap_or(0),
            Src::Imm(v) => v,
            Src::Frame(o) => o as u64,
        }
    }

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
            ArgLoc::Val { src, .. } => self.src(src),
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

/// Device call `op` (`Printf`, `AssertFail`, `Malloc`, `Free` or
/// `CpAsync`) on `line`
/// by thread `lin`: its output goes to the block's, its result to its
/// register or frame slot. 0, or 1 with the fault kept in the context.
///
/// # Safety
/// `ctx` is the live context of the running block, `local` the thread's
/// `ctx.local_bytes` bytes of local memory, `regs` its `nregs` registers,
/// `op` a live op; all used by this thread only.
pub(super) unsafe extern "C" fn rt_device_call(
    ctx: *mut Ctx<'_>,
    local: *mut u8,
    regs: *mut u64,
    nregs: u64,
    op: *const Op,
    line: u32,
    lin: u32,
) -> u32 {
    // SAFETY: the caller's contract.
    let (ctx, op) = unsafe { (&mut *ctx, &*op) };
    let local_len = ctx.local_bytes as usize;
    // SAFETY: the caller's contract: the thread's own buffers, of these
    // sizes; each view lives only while nothing else reads them.
    let frame = || unsafe {
        Frame {
            local: std::slice::from_raw_parts_mut(local, local_len),
            regs: std::slice::from_raw_parts_mut(regs, nregs as usize),
        }
    };
    let result = match op {
        Op::Printf { fmt, args, ret } => {
            let (fptr, aptr) = {
                let f = frame();
                (f.value(fmt), f.value(args))
            };
            printf(ctx, local, fptr, aptr, line).map(|n| {
                if let Some(r) = ret {
                    frame().put(r, n);
                }
            })
        }
        Op::AssertFail(args) => {
            let vals = {
                let f = frame();
                args.map(|a| f.value(&a))
            };
            Err(assert_fail(ctx, local, vals, lin, line))
        }
        Op::Malloc { size, ret } => {
            let bytes = frame().value(size);
            let ptr = ctx.memory.heap_malloc(bytes);
            if let Some(r) = ret {
                frame().put(r, ptr);
            }
            Ok(())
        }
        Op::Free { ptr } => {
            let p = frame().value(ptr);
            if ctx.memory.heap_free(p) {
                Ok(())
            } else {
                Err(Fault::IllegalAddress {
                    addr: p,
                    detail: format!(
                        "free of {p:#x}, not a block of the device heap, at line {line}"
                    ),
                })
            }
        }
        &Op::CpAsync {
            dst,
            doff,
            src,
            soff,
            size,
            src_size,
        } => {
            let (da, sa, n) = {
                let f = frame();
                let da = f.src(dst).wrapping_add(doff as u64);
                let sa = f.src(src).wrapping_add(soff as u64);
                (da, sa, (f.src(src_size) as u32).min(size))
            };
            cp_async(ctx, local, da, sa, size, n, line)
        }
        _ => Err(Fault::Failed(
            "internal error: device-call helper on another op".into(),
        )),
    };
    ctx.status(result)
}

/// `cp.async` of `size` bytes, the first `n` from generic address `sa`, the
/// rest zeros, to shared address `da`, done at once byte by byte.
fn cp_async(
    ctx: &mut Ctx<'_>,
    local: *mut u8,
    da: u64,
    sa: u64,
    size: u32,
    n: u32,
    line: u32,
) -> Result<(), Fault> {
    for k in 0..size as u64 {
        let v = if (k as u32) < n {
            let p = ctx.checked_ptr(
                u32::MAX,
                local,
                Sp::Generic,
                sa.wrapping_add(k),
                1,
                false,
                line,
            )?;
            // SAFETY: `checked_ptr` checked the byte against a live buffer.
            unsafe { atomic_load(p, 1) }
        } else {
            0
        };
        let p = ctx.checked_ptr(
            u32::MAX,
            local,
            Sp::Shared,
            da.wrapping_add(k),
            1,
            true,
            line,
        )?;
        // SAFETY: as above.
        unsafe { atomic_store(p, 1, v) };
    }
    Ok(())
}

/// Appends `text` to the block's output, within the driver's bounded FIFO.
fn emit(ctx: &mut Ctx<'_>, text: &[u8]) {
    if ctx.out.len() + text.len() <= ctx.printf_fifo {
        ctx.out.extend_from_slice(text);
    }
}

/// `printf` of the format at `fptr` with the argument buffer at `aptr`;
/// the bytes it printed.
fn printf(
    ctx: &mut Ctx<'_>,
    local: *mut u8,
    fptr: u64,
    aptr: u64,
    line: u32,
) -> Result<u64, Fault> {
    let Some(fmt_bytes) = ctx.cstring(local, fptr) else {
        return Err(Fault::IllegalAddress {
            addr: fptr,
            detail: format!("printf format read of address {fptr:#x} at line {line}"),
        });
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
    emit(ctx, &text);
    Ok(text.len() as u64)
}

/// `__assertfail(message, file, line, function)` by thread `lin`: the
/// driver's assertion line goes to the block's output, the launch fails
/// with CUDA_ERROR_ASSERT.
fn assert_fail(ctx: &mut Ctx<'_>, local: *mut u8, args: [u64; 4], lin: u32, line: u32) -> Fault {
    let [message, file, at_line, function] = args;
    let mut text = |p: u64| {
        ctx.cstring(local, p)
            .map(|s| String::from_utf8_lossy(&s).into_owned())
            .unwrap_or_else(|| "?".into())
    };
    let (message, file, function) = (text(message), text(file), text(function));
    let [bx, by, bz] = ctx.ctaid;
    let [nx, ny, _] = ctx.ntid.map(|n| n.max(1));
    let (tx, ty, tz) = (lin % nx, (lin / nx) % ny, lin / (nx * ny));
    let report = format!(
        "{file}:{}: {function}: block: [{bx},{by},{bz}], thread: [{tx},{ty},{tz}] \
         Assertion `{message}` failed.\n",
        at_line as u32
    );
    emit(ctx, report.as_bytes());
    Fault::Assert {
        detail: format!("{} at line {line}", report.trim_end()),
    }
}
