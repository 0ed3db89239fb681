//! What stops a launch before its end: the per-block and per-launch
//! instruction budgets and the cancel flag. A block checks them at a backward
//! branch or call once it ran `LAUNCH_CHECK_INTERVAL` more instructions (a
//! kernel whose threads may poll for each other also lets its other threads
//! run every `POLL_YIELD_INTERVAL`), and
//! again at its end, adding what it ran to the launch's count.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::state::{Block, Geo};
use crate::ir::{Func, Module, Op};
use crate::launch::{
    next_yield, waits_in_block as waits_in_block_ops, Fault, LAUNCH_CHECK_INTERVAL,
};

/// Readies `b`'s count for a new block of the launch.
pub(super) fn start_block(g: &Geo<'_>, b: &mut Block) {
    b.instructions = 0;
    b.counted = 0;
    b.full_check_at = next_check(g, 0);
    b.check_at = next_yield(0, b.full_check_at, g.waits_in_block);
}

/// Whether kernel `kernel` of `prog`, or a function it may call, may poll
/// for another thread of its block ([`waits_in_block_ops`]).
pub(super) fn waits_in_block(prog: &Module, kernel: u32) -> bool {
    let waits = |f: &Func| waits_in_block_ops(f.code.iter().map(|i| &i.op));
    let mut seen = vec![false; prog.funcs.len()];
    let mut todo = vec![kernel as usize];
    while let Some(k) = todo.pop() {
        if k >= seen.len() || std::mem::replace(&mut seen[k], true) {
            continue;
        }
        let f = &prog.funcs[k];
        if waits(f) {
            return true;
        }
        for i in &f.code {
            if let Op::Call(info) = &i.op {
                if info.target.is_some() {
                    // an indirect call may reach any function
                    return prog.funcs.iter().any(waits);
                }
                todo.push(info.func as usize);
            }
        }
    }
    false
}

/// A running thread's count passed `b.check_at` at a backward branch or
/// call on `line` (`count` of its instructions not yet in the block's): the
/// budgets and the cancel flag where their check is due, and the next
/// check, sooner in a kernel that polls.
pub(super) fn passed(g: &Geo<'_>, b: &mut Block, count: u64, line: u32) -> Result<(), Fault> {
    let done = b.instructions.wrapping_add(count);
    if done > b.full_check_at {
        checkpoint(g, b, count, line)?;
        b.full_check_at = b.check_at;
    }
    b.check_at = next_yield(done, b.full_check_at, g.waits_in_block);
    Ok(())
}

/// The check of a block whose count, with the `count` instructions of the
/// running thread not yet added, passed `b.check_at` at a backward branch or
/// call on `line`: a fault ends the launch, else the next check is set.
#[cold]
#[inline(never)]
fn checkpoint(g: &Geo<'_>, b: &mut Block, count: u64, line: u32) -> Result<(), Fault> {
    let done = b.instructions.wrapping_add(count);
    if done > g.budget {
        return Err(Fault::Timeout(format!(
            "instruction limit of {} per block exceeded at line {line}",
            g.budget
        )));
    }
    let ctaid = b.ctaid;
    launch_check(g, b, done, || format!("at line {line} of block {ctaid:?}"))?;
    b.check_at = next_check(g, done);
    Ok(())
}

/// At the end of a block, whatever its result: adds the rest of its count to
/// the launch's and says whether the launch may go on.
pub(super) fn end_block(g: &Geo<'_>, b: &mut Block) -> Result<(), Fault> {
    let ctaid = b.ctaid;
    launch_check(g, b, b.instructions, || format!("by block {ctaid:?}"))
}

/// Before a block starts: whether the launch was cancelled.
pub(super) fn cancelled(g: &Geo<'_>) -> Option<Fault> {
    is_cancelled(g).then(|| Fault::Cancelled("before a block started".into()))
}

fn is_cancelled(g: &Geo<'_>) -> bool {
    g.cancel.is_some_and(|c| c.load(Ordering::Relaxed))
}

/// Adds the block's instructions up to `done` to the launch's count, then
/// checks the launch's budget and the cancel flag; `place` says where.
fn launch_check(
    g: &Geo<'_>,
    b: &mut Block,
    done: u64,
    place: impl FnOnce() -> String,
) -> Result<(), Fault> {
    let cancelled = || is_cancelled(g);
    let (executed, budget, abort) = (&g.executed, g.launch_budget, &g.abort);
    launch_progress(
        executed,
        budget,
        abort,
        cancelled,
        &mut b.counted,
        done,
        place,
    )
}

/// Adds a block's instructions since its last check (`counted`, up to `done`)
/// to the launch's count (`executed`) and says whether the launch goes on:
/// not past its `budget`, not cancelled, no other block's fault (`abort`).
/// The interpreter's and the compiler's blocks both check this way.
pub(crate) fn launch_progress(
    executed: &AtomicU64,
    budget: u64,
    abort: &AtomicBool,
    cancelled: impl FnOnce() -> bool,
    counted: &mut u64,
    done: u64,
    place: impl FnOnce() -> String,
) -> Result<(), Fault> {
    let added = done.wrapping_sub(*counted);
    *counted = done;
    let total = executed
        .fetch_add(added, Ordering::Relaxed)
        .saturating_add(added);
    if total > budget {
        return Err(Fault::Timeout(format!(
            "instruction limit of {budget} per launch exceeded {}",
            place()
        )));
    }
    if cancelled() {
        return Err(Fault::Cancelled(format!("stopped {}", place())));
    }
    if abort.load(Ordering::Relaxed) {
        return Err(Fault::Cancelled(format!(
            "stopped {} after another block faulted",
            place()
        )));
    }
    Ok(())
}

/// The count past which a block that ran `done` instructions checks next:
/// no later than its own budget.
fn next_check(g: &Geo<'_>, done: u64) -> u64 {
    done.saturating_add(LAUNCH_CHECK_INTERVAL).min(g.budget)
}
