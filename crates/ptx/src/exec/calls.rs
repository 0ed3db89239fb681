//! Calls between functions of a thread: `call` (frames, argument copies,
//! stack limits, indirect targets), `ret` (return values back to the caller)
//! and device `printf`, the one external function the interpreter provides.

use super::access::{local_copy, local_get, local_put, Access};
use super::limits::{LOCAL_LIMIT, LOCAL_WINDOW, MAX_CALL_DEPTH};
use super::state::{rd, wr, Block, Frame, Geo, Thread};
use super::watch;
use crate::ir::{ArgLoc, CallInfo, Func, Inst, Op, Sp, Src, FUNC_WIN};
use crate::launch::Fault;
use crate::printf;

/// `call` from `caller` at `pc`: checks the target and the stack, copies the
/// arguments into the callee's new frame and enters it. Returns the callee.
#[allow(clippy::too_many_arguments)]
pub(super) fn call(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    info: &CallInfo,
    caller: &Func,
    pc: u32,
    count: u64,
    line: u32,
) -> Result<u32, Fault> {
    let funcs = &g.prog.funcs;
    let (rbase, lbase) = (th.rbase, th.lbase);
    let fidx = match info.target {
        None => info.func,
        Some(t) => {
            let v = th.get(t);
            let idx = v.wrapping_sub(FUNC_WIN);
            match funcs.get(idx as usize) {
                Some(f) if idx < funcs.len() as u64 && f.params.len() == info.args.len() => {
                    idx as u32
                }
                _ => {
                    return Err(Fault::IllegalAddress {
                        addr: v,
                        detail: format!("indirect call to a bad function address at line {line}"),
                    })
                }
            }
        }
    };
    let Some(callee) = funcs.get(fidx as usize) else {
        debug_assert!(
            false,
            "validated IR calls function {fidx} of {}",
            funcs.len()
        );
        return Err(Fault::Failed("call to unknown function".into()));
    };
    if b.instructions.wrapping_add(count) > b.check_at {
        watch::passed(g, b, count, line)?;
    }
    if th.frames.len() >= MAX_CALL_DEPTH {
        return Err(Fault::IllegalAddress {
            addr: 0,
            detail: format!("call stack overflow at line {line}"),
        });
    }
    let new_rbase = rbase + caller.nregs;
    let new_lbase = (lbase + caller.frame_bytes).div_ceil(16) * 16;
    let need_regs = (new_rbase + callee.nregs) as usize;
    let need_local = (new_lbase as usize + callee.frame_bytes as usize).div_ceil(8);
    if need_local * 8 > LOCAL_LIMIT || (need_regs + need_local) * 8 > g.stack_limit {
        return Err(Fault::IllegalAddress {
            addr: LOCAL_WINDOW + new_lbase as u64,
            detail: format!("stack overflow at line {line}"),
        });
    }
    if th.regs.len() < need_regs {
        th.regs.resize(need_regs, 0);
    }
    if th.local.len() < need_local {
        th.local.resize(need_local, 0);
    }
    let mut ok = true;
    for (arg, &(poff, psize)) in info.args.iter().zip(&callee.params) {
        match *arg {
            ArgLoc::Frame { off, size } => {
                ok &= local_copy(
                    &mut th.local,
                    new_lbase + poff,
                    lbase + off,
                    size.min(psize),
                );
            }
            ArgLoc::Val { src, size } => {
                let v = rd(&th.regs, rbase, lbase, src);
                ok &= local_put(&mut th.local, new_lbase + poff, v, size.min(psize));
            }
        }
    }
    // validated IR keeps arguments inside the caller's frame and parameters
    // inside the callee's
    debug_assert!(ok, "call arguments outside the frames at line {line}");
    if !ok {
        return Err(Fault::Failed("bad call arguments".into()));
    }
    th.frames.push(Frame {
        func: th.func,
        call_pc: pc,
        rbase,
        lbase,
    });
    // callee registers start zeroed
    for v in &mut th.regs[new_rbase as usize..need_regs] {
        *v = 0;
    }
    th.func = fidx;
    th.rbase = new_rbase;
    th.lbase = new_lbase;
    Ok(fidx)
}

/// `ret` from `callee`: copies the return values into the caller's frame and
/// resumes the caller. Returns the pc to continue at, or `None` when the
/// thread returned from its kernel.
pub(super) fn ret(g: &Geo<'_>, th: &mut Thread, callee: &Func) -> Option<u32> {
    let fr = th.frames.pop()?;
    let lbase = th.lbase;
    let caller = &g.prog.funcs[fr.func as usize];
    debug_assert!(
        matches!(
            caller.code.get(fr.call_pc as usize),
            Some(Inst {
                op: Op::Call(_),
                ..
            })
        ),
        "a frame returns to a call"
    );
    if let Some(Inst {
        op: Op::Call(info), ..
    }) = caller.code.get(fr.call_pc as usize)
    {
        for (ret, &(roff, rsize)) in info.rets.iter().zip(&callee.rets) {
            match *ret {
                ArgLoc::Frame { off, size } => {
                    local_copy(&mut th.local, fr.lbase + off, lbase + roff, size.min(rsize));
                }
                ArgLoc::Val {
                    src: Src::Reg(r),
                    size,
                } => {
                    let v = local_get(&mut th.local, lbase + roff, size.min(rsize)).unwrap_or(0);
                    wr(&mut th.regs, fr.rbase, r, v);
                }
                ArgLoc::Val { .. } => {}
            }
        }
    }
    th.func = fr.func;
    th.rbase = fr.rbase;
    th.lbase = fr.lbase;
    Some(fr.call_pc + 1)
}

/// `vprintf(fmt, args)`: formats into the block's output (bounded like the
/// driver's printf FIFO) and stores the length where `ret` names.
pub(super) fn printf(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    fmt: &ArgLoc,
    args: &ArgLoc,
    ret: Option<&ArgLoc>,
    line: u32,
) -> Result<(), Fault> {
    let (rbase, lbase) = (th.rbase, th.lbase);
    let fptr = arg_value(th, fmt);
    let aptr = arg_value(th, args);
    let Some(fmt_bytes) = b.cstring(g, &mut th.local, fptr) else {
        return Err(g.fault_addr(fptr, "printf format read", line));
    };
    let local = &mut th.local;
    let cell = std::cell::RefCell::new((&mut *b, local));
    let text = printf::format(
        &fmt_bytes,
        |off, size| {
            let mut c = cell.borrow_mut();
            let (blk, loc) = &mut *c;
            let at = Access {
                sp: Sp::Generic,
                addr: aptr.wrapping_add(off),
                size,
                line: 0,
            };
            blk.load(g, loc, at).ok()
        },
        |p| {
            let mut c = cell.borrow_mut();
            let (blk, loc) = &mut *c;
            blk.cstring(g, loc, p)
        },
    );
    let n = text.len() as u64;
    // like the driver's bounded printf FIFO: excess output is dropped
    if b.out.len() + text.len() <= g.printf_fifo {
        b.out.extend_from_slice(&text);
    }
    if let Some(r) = ret {
        match *r {
            ArgLoc::Frame { off, size } => {
                local_put(&mut th.local, lbase + off, n, size);
            }
            ArgLoc::Val {
                src: Src::Reg(d), ..
            } => wr(&mut th.regs, rbase, d, n),
            _ => {}
        }
    }
    Ok(())
}

/// `__assertfail(message, file, line, function, …)` of thread `tid`: the
/// driver's assertion line goes to the block's output (like its printf), and
/// the launch fails with CUDA_ERROR_ASSERT.
pub(super) fn assert_fail(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    args: &[ArgLoc; 4],
    tid: [u32; 3],
    line: u32,
) -> Fault {
    let [message, file, at_line, function] = args.map(|a| arg_value(th, &a));
    let mut text = |p: u64| {
        b.cstring(g, &mut th.local, p)
            .map(|s| String::from_utf8_lossy(&s).into_owned())
            .unwrap_or_else(|| "?".into())
    };
    let (message, file, function) = (text(message), text(file), text(function));
    let [bx, by, bz] = b.ctaid;
    let [tx, ty, tz] = tid;
    let report = format!(
        "{file}:{}: {function}: block: [{bx},{by},{bz}], thread: [{tx},{ty},{tz}] \
         Assertion `{message}` failed.\n",
        at_line as u32
    );
    if b.out.len() + report.len() <= g.printf_fifo {
        b.out.extend_from_slice(report.as_bytes());
    }
    Fault::Assert {
        detail: format!("{} at line {line}", report.trim_end()),
    }
}

/// Device `malloc(size)`: a block of the context's heap (NULL when it is
/// full), its address stored where `ret` names.
pub(super) fn malloc(g: &Geo<'_>, th: &mut Thread, size: &ArgLoc, ret: Option<&ArgLoc>) {
    let bytes = arg_value(th, size);
    let ptr = g.memory.heap_malloc(bytes);
    match ret {
        Some(&ArgLoc::Frame { off, size }) => {
            local_put(&mut th.local, th.lbase + off, ptr, size);
        }
        Some(&ArgLoc::Val {
            src: Src::Reg(d), ..
        }) => th.set(d, ptr),
        _ => {}
    }
}

/// Device `free(ptr)`: a pointer the heap did not hand out (or already took
/// back) faults rather than corrupting the heap.
pub(super) fn free(g: &Geo<'_>, th: &mut Thread, ptr: &ArgLoc, line: u32) -> Result<(), Fault> {
    let p = arg_value(th, ptr);
    if g.memory.heap_free(p) {
        Ok(())
    } else {
        Err(Fault::IllegalAddress {
            addr: p,
            detail: format!("free of {p:#x}, not a block of the device heap, at line {line}"),
        })
    }
}

/// The value of call argument `l` in the current frame.
fn arg_value(th: &mut Thread, l: &ArgLoc) -> u64 {
    match *l {
        ArgLoc::Frame { off, size } => {
            local_get(&mut th.local, th.lbase + off, size.min(8)).unwrap_or(0)
        }
        ArgLoc::Val { src, .. } => th.get(src),
    }
}
