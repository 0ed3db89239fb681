//! The interpreter loop of one thread: fetch, guard, dispatch to the op's
//! family (`arith`, `mem_ops`, `mbarrier`, `calls`, `tensor`, `special`),
//! until the thread reaches a collective, exits, faults or uses up its step.

use super::barrier;
use super::calls;
use super::state::{lin_to_tid, rd, Block, Geo, Status, Stop, Thread};
use super::{arith, cdp, mbarrier, mem_ops, special, tensor, watch};
use crate::ir::{Op, Src, NONE};
use crate::launch::Fault;

/// Runs one thread until it reaches a collective, exits or faults (with
/// `SINGLE_STEP`, for one instruction).
pub(super) fn run_thread<const SINGLE_STEP: bool>(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    lin: u32,
) -> Result<Stop, Fault> {
    let funcs = &g.prog.funcs;
    let tid = lin_to_tid(lin, g.config.block);
    let mut func = &funcs[th.func as usize];
    let mut pc = th.pc;
    let mut count: u64 = 0;
    // a fault of a family step ends the run with that fault
    macro_rules! fail_on_err {
        ($step:expr) => {
            if let Err(e) = $step {
                break Err(e);
            }
        };
    }
    // the thread waits at a collective until `barrier` or `warp` resolves it
    macro_rules! wait_at {
        ($status:expr) => {{
            th.pc = pc;
            th.status = $status;
            th.clock = th.clock.wrapping_add(count);
            b.instructions += count;
            return Ok(Stop::Collective);
        }};
    }
    let result = loop {
        if SINGLE_STEP && count >= 1 {
            break Ok(Stop::Yield);
        }
        // validated IR ends every function in an unguarded `ret`/`exit` and
        // branches only to its own instructions
        debug_assert!((pc as usize) < func.code.len(), "pc {pc} out of range");
        let Some(inst) = func.code.get(pc as usize) else {
            break Err(Fault::Failed(format!(
                "pc {pc} out of range in {}",
                func.name
            )));
        };
        count += 1;
        let (rbase, lbase) = (th.rbase, th.lbase);
        if inst.guard != NONE {
            let gv = rd(&th.regs, rbase, lbase, Src::Reg(inst.guard)) & 1 != 0;
            if gv == inst.guard_neg {
                pc += 1;
                continue;
            }
        }
        match &inst.op {
            // one arm per op, so that each inlined family step folds to that op
            op @ Op::Mov { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Int { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Float { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Un { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Tern { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Bfi { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Prmt { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Relu { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Lop3 { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Setp { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Set { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Testp { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Cvt { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Pack { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Unpack { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Carry { .. } => arith::step(op, &mut th.regs, rbase, lbase),
            op @ Op::Ld { .. } => fail_on_err!(mem_ops::step(g, b, th, op, inst.line)),
            op @ Op::St { .. } => fail_on_err!(mem_ops::step(g, b, th, op, inst.line)),
            op @ Op::Atom { .. } => fail_on_err!(mem_ops::step(g, b, th, op, inst.line)),
            op @ Op::Cvta { .. } => fail_on_err!(mem_ops::step(g, b, th, op, inst.line)),
            op @ Op::Isspacep { .. } => fail_on_err!(mem_ops::step(g, b, th, op, inst.line)),
            op @ Op::CpAsync { .. } => fail_on_err!(mem_ops::step(g, b, th, op, inst.line)),
            op @ Op::Mbarrier { .. } => match mbarrier::step(g, b, th, op, inst.line) {
                Ok(true) => {}
                // a wait whose phase is not complete lets the block's other
                // threads run (they make the arrivals it waits for)
                Ok(false) => {
                    pc += 1;
                    break Ok(Stop::Yield);
                }
                Err(e) => break Err(e),
            },
            Op::Special { d, r } => {
                let clock = th.clock.wrapping_add(count);
                let v = special::special(g, b, clock, tid, lin, *r);
                th.set(*d, v);
            }
            Op::Bra { target } => {
                if *target <= pc && b.instructions.wrapping_add(count) > b.check_at {
                    fail_on_err!(watch::passed(g, b, count, inst.line));
                    // a long loop lets the block's other threads run: it may
                    // wait for what one of them writes (a spin on memory)
                    pc = *target;
                    break Ok(Stop::Yield);
                }
                pc = *target;
                continue;
            }
            Op::Call(info) => match calls::call(g, b, th, info, func, pc, count, inst.line) {
                Ok(callee) => {
                    func = &funcs[callee as usize];
                    pc = 0;
                    continue;
                }
                Err(e) => break Err(e),
            },
            Op::Ret => match calls::ret(g, th, func) {
                Some(next) => {
                    func = &funcs[th.func as usize];
                    pc = next;
                    continue;
                }
                None => {
                    b.exit(th, lin);
                    break Ok(Stop::Exit);
                }
            },
            Op::Printf { fmt, args, ret } => {
                fail_on_err!(calls::printf(g, b, th, fmt, args, ret.as_ref(), inst.line))
            }
            Op::Exit => {
                b.exit(th, lin);
                break Ok(Stop::Exit);
            }
            Op::Trap(msg) => {
                break Err(Fault::Trap {
                    detail: format!(
                        "{msg} at line {} (thread {lin}, block {:?})",
                        inst.line, b.ctaid
                    ),
                });
            }
            Op::Malloc { size, ret } => calls::malloc(g, th, size, ret.as_ref()),
            Op::Free { ptr } => fail_on_err!(calls::free(g, th, ptr, inst.line)),
            Op::Cdp(c) => fail_on_err!(cdp::step(g, b, th, c, lin, inst.line)),
            Op::AssertFail(args) => {
                break Err(calls::assert_fail(g, b, th, args, tid, inst.line));
            }
            Op::Bar {
                wait: false, id, ..
            } => barrier::arrive(b, th.get(*id)),
            op @ (Op::WmmaLoad { .. } | Op::WmmaStore { .. }) => {
                fail_on_err!(tensor::wmma_load_store(g, b, th, op, lin % 32, inst.line))
            }
            Op::Bar { .. } => wait_at!(Status::AtBar),
            Op::WmmaMma { .. } => wait_at!(Status::AtWarp),
            Op::Mma { .. } => wait_at!(Status::AtWarp),
            Op::Ldmatrix { .. } => wait_at!(Status::AtWarp),
            Op::Activemask { .. } => wait_at!(Status::AtWarp),
            Op::WarpSync { .. } => wait_at!(Status::AtWarp),
            Op::Shfl { .. } => wait_at!(Status::AtWarp),
            Op::Vote { .. } => wait_at!(Status::AtWarp),
            Op::Match { .. } => wait_at!(Status::AtWarp),
            Op::Redux { .. } => wait_at!(Status::AtWarp),
            Op::Sleep { ns } => crate::sleep::nanosleep(th.get(*ns)),
            Op::WarpStep | Op::Nop => {}
        }
        pc += 1;
    };
    th.pc = pc;
    th.clock = th.clock.wrapping_add(count);
    b.instructions += count;
    result
}
