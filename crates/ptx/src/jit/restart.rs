//! Lane blocks that go on from a failed group: where the kernel's only stop is
//! its exit, the groups before ran as the interpreter runs their threads, so
//! that group alone runs again, thread by thread, and a last store needs no log.

use super::count::count_now;
use super::runtime::Ctx;
use crate::ir::{Func, Inst, IntOp, Op, Sp, NONE};
use cranelift_codegen::ir::types::I64;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value};
use cranelift_frontend::FunctionBuilder;
use std::mem::offset_of;

/// Whether a lane block whose group fails (its lanes part, or a lane
/// faults) may keep the groups before it and go on thread by thread from
/// that group: the kernel's only resume point is its start (no barrier,
/// warp op, backward branch or budget check: its groups ran each thread
/// from start to exit, in thread order, with no yield), it has no local
/// frame, and it writes only global memory (a group's shared or local
/// stores could not be undone), and every branch goes forward (an
/// uncounted one back would make no resume point; a thread's start then
/// reads no register file). Its ops run in lanes, or part the lanes
/// before any lane runs them.
pub(super) fn restartable(f: &Func, resumes: &[u32]) -> bool {
    resumes.len() == 1
        && f.frame_bytes == 0
        && f.code.iter().enumerate().all(|(pc, i)| match i.op {
            Op::Bra { target } => target as usize > pc,
            Op::St { addr, .. } => addr.sp == Sp::Global,
            Op::Ld { .. }
            | Op::Atom { .. }
            | Op::Printf { .. }
            | Op::AssertFail(_)
            | Op::Malloc { .. }
            | Op::Free { .. }
            | Op::Trap(_) => true,
            _ => infallible(i) || matches!(i.op, Op::Bra { .. } | Op::Ret | Op::Exit),
        })
}

/// Whether `inst` neither faults nor parts the lanes: register ops (no
/// integer division), unguarded branches and exits.
fn infallible(inst: &Inst) -> bool {
    match inst.op {
        Op::Int {
            op: IntOp::Div | IntOp::Rem,
            ..
        } => false,
        Op::Mov { .. }
        | Op::Int { .. }
        | Op::Float { .. }
        | Op::Un { .. }
        | Op::Tern { .. }
        | Op::Bfi { .. }
        | Op::Relu { .. }
        | Op::Prmt { .. }
        | Op::Lop3 { .. }
        | Op::Setp { .. }
        | Op::Set { .. }
        | Op::Testp { .. }
        | Op::Cvt { .. }
        | Op::Pack { .. }
        | Op::Unpack { .. }
        | Op::Cvta { .. }
        | Op::Isspacep { .. }
        | Op::Special { .. }
        | Op::Nop => true,
        Op::Bra { .. } | Op::Ret | Op::Exit => inst.guard == NONE,
        _ => false,
    }
}

/// The stores of a [`restartable`] kernel after which nothing can fail on
/// any path to the exit: a group that ran one never runs again, so it
/// needs no log (where it is one 16-byte access, all or nothing).
pub(super) fn final_stores(f: &Func) -> Vec<u32> {
    let n = f.code.len() as u32;
    let after = |pc: u32| -> Vec<u32> {
        let inst = &f.code[pc as usize];
        let mut next = Vec::new();
        match inst.op {
            Op::Bra { target } => next.push(target),
            Op::Ret | Op::Exit if inst.guard == NONE => return next,
            _ => {}
        }
        let falls = !matches!(inst.op, Op::Bra { .. }) || inst.guard != NONE;
        if falls && pc + 1 < n {
            next.push(pc + 1);
        }
        next
    };
    (0..n)
        .filter(|&pc| matches!(f.code[pc as usize].op, Op::St { .. }))
        .filter(|&pc| {
            let mut seen = vec![false; n as usize];
            let mut work = after(pc);
            while let Some(p) = work.pop() {
                if std::mem::replace(&mut seen[p as usize], true) {
                    continue;
                }
                if !infallible(&f.code[p as usize]) {
                    return false;
                }
                work.extend(after(p));
            }
            true
        })
        .collect()
}

/// At a group's start (and the call's) in a [`restartable`] lane kernel
/// (where `restart`): the block's count so far (where a failed group's
/// count is taken back to) and a fresh log (the group's own stores alone
/// are undone; none where the code `logs` no store: the log stays empty).
pub(super) fn group_start(fb: &mut FunctionBuilder, ctx: Value, restart: bool, logs: bool) {
    if !restart {
        return;
    }
    let flags = MemFlagsData::trusted();
    let n = count_now(fb, ctx);
    let at = offset_of!(Ctx, group_count) as i32;
    fb.ins().store(flags, n, ctx, at);
    if logs {
        let zero = fb.ins().iconst(I64, 0);
        fb.ins()
            .store(flags, zero, ctx, offset_of!(Ctx, log_len) as i32);
    }
}
