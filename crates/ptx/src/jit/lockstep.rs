//! Lockstep warps in compiled code: a warp step before each volatile shared
//! access that needs one, where a thread waits until no lane of its warp can run.

use super::inline::{CHECKS, UNCOUNTED};
use crate::ir::{Func, Inst, MemOrder, Op, Sp, NONE};
use std::borrow::Cow;

/// What the lanes of a warp did since they were last together (at the
/// kernel's start, a barrier they waited at, or a step), on every path:
/// ordered so that the meet of two paths is the lesser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Since {
    /// Anything: stores, atomics, a yield.
    Dirty,
    /// Loads only (of memory other lanes may write).
    Loads,
    /// Nothing other lanes may see.
    Clean,
}

/// A volatile access that other lanes of the warp may see: `Some(true)`
/// for a store, `Some(false)` for a load.
fn warp_visible(op: &Op) -> Option<bool> {
    let (addr, store) = match op {
        Op::Ld { addr, order, .. } if *order == MemOrder::Volatile => (addr, false),
        Op::St { addr, order, .. } if *order == MemOrder::Volatile => (addr, true),
        _ => return None,
    };
    matches!(addr.sp, Sp::Shared | Sp::Generic).then_some(store)
}

/// What `op` (not a volatile access of [`warp_visible`]) leaves of `s`.
fn after(op: &Op, s: Since) -> Since {
    match op {
        // a barrier its threads wait at: each warp's lanes together again
        Op::Bar { wait: true, .. } | Op::WarpStep => Since::Clean,
        Op::Ld { addr, .. } | Op::St { addr, .. } if matches!(addr.sp, Sp::Local | Sp::Param) => s,
        Op::Ld { .. } => s.min(Since::Loads),
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
        | Op::Carry { .. }
        | Op::Cvta { .. }
        | Op::Isspacep { .. }
        | Op::Special { .. }
        | Op::Bra { .. }
        | Op::Sleep { .. }
        | Op::Nop => s,
        _ => Since::Dirty,
    }
}

/// Whether a volatile access (`store` or load) made with `s` since the
/// warp's lanes were together needs a step first: a load after loads only
/// reads what it would in lockstep (no lane wrote in between), as does
/// any access after nothing at all; the lanes then run on one by one from
/// there to their next stop, which is what the step would have led to.
fn needs_step(store: bool, s: Since) -> bool {
    match s {
        Since::Clean => false,
        Since::Loads => store,
        Since::Dirty => true,
    }
}

/// Which instructions of `f` get a step before them: each volatile shared
/// or generic access whose lanes may have seen other lanes' accesses since
/// they were together (a forward data flow over the basic blocks).
fn steps(f: &Func) -> Vec<bool> {
    let code = &f.code;
    let n = code.len();
    let mut leader = vec![false; n + 1];
    leader[0] = true;
    for (pc, inst) in code.iter().enumerate() {
        match inst.op {
            Op::Bra { target } => {
                leader[(target as usize).min(n)] = true;
                leader[pc + 1] = true;
            }
            Op::Ret | Op::Exit | Op::Trap(_) => leader[pc + 1] = true,
            _ => {}
        }
    }
    let starts: Vec<usize> = (0..n).filter(|&pc| leader[pc]).collect();
    let block_of = |pc: usize| starts.partition_point(|&s| s <= pc) - 1;
    // what enters each block (the kernel's start: together)
    let mut entry = vec![Since::Clean; starts.len()];
    let mut step = vec![false; n];
    loop {
        let mut flow = vec![Since::Clean; starts.len()];
        let mut changed = false;
        for (b, &start) in starts.iter().enumerate() {
            let end = starts.get(b + 1).copied().unwrap_or(n);
            let mut s = entry[b];
            let mut falls = true;
            for (pc, inst) in code.iter().enumerate().take(end).skip(start) {
                if let Some(store) = warp_visible(&inst.op) {
                    step[pc] = needs_step(store, s);
                    s = if store { Since::Dirty } else { Since::Loads };
                    continue;
                }
                s = after(&inst.op, s);
                match inst.op {
                    Op::Bra { target } if (target as usize) < n => {
                        // a backward branch or a call's may yield: the
                        // lanes part there
                        let checks = target as usize <= pc || inst.line & CHECKS != 0;
                        let t = block_of(target as usize);
                        flow[t] = flow[t].min(if checks { Since::Dirty } else { s });
                        falls = inst.guard != NONE;
                    }
                    Op::Ret | Op::Exit | Op::Trap(_) => falls = inst.guard != NONE,
                    _ => {}
                }
            }
            if falls && b + 1 < starts.len() {
                flow[b + 1] = flow[b + 1].min(s);
            }
        }
        // the kernel's start comes in together
        for (b, f) in flow.into_iter().enumerate() {
            if f < entry[b] {
                entry[b] = f;
                changed = true;
            }
        }
        if !changed {
            return step;
        }
    }
}

/// `f` with an [`Op::WarpStep`] before each volatile shared or generic
/// access that needs one (`f` itself where none does).
///
/// The interpreter runs a module with volatile accesses one instruction a
/// lane at a time (`exec::block`): a warp's lanes make an access before any
/// makes the next, which warp-synchronous code needs. Compiled code runs a
/// thread from stop to stop; at a step, the launch lets the warp's lanes go
/// on once none of them can run (`warp::resolve_warp`), then each runs alone
/// to its next stop, in lane order: for lanes at one pc (converged code)
/// every lane makes its volatile access before any makes its next one, as
/// in lockstep. An access needs no step where, on every path since the
/// lanes were last together (the kernel's start, a barrier they waited at,
/// a step), other lanes can have made no access it could see: none at all,
/// or only loads before a load ([`steps`]; a backward branch, which may
/// yield, parts the lanes). NVIDIA's scan sample's volatile shared loop, a
/// barrier before each access, so needs none. Volatile global accesses get
/// no step: they are how blocks talk to each other (compiled as atomics,
/// `emit_mem`), not lanes.
pub(super) fn with_steps(f: Cow<'_, Func>) -> Cow<'_, Func> {
    let n = f.code.len();
    let step = steps(&f);
    if !step.contains(&true) {
        return f;
    }
    // where each instruction goes (a branch to a stepped access goes to
    // its step)
    let mut pos = Vec::with_capacity(n + 1);
    let mut at = 0u32;
    for &s in &step {
        pos.push(at);
        at += 1 + s as u32;
    }
    pos.push(at);
    let mut code = Vec::with_capacity(at as usize);
    for (inst, &s) in f.code.iter().zip(&step) {
        if s {
            code.push(Inst {
                guard: NONE,
                guard_neg: false,
                op: Op::WarpStep,
                line: UNCOUNTED,
            });
        }
        let mut inst = inst.clone();
        if let Op::Bra { target } = &mut inst.op {
            *target = pos.get(*target as usize).copied().unwrap_or(at);
        }
        code.push(inst);
    }
    let mut f = f.into_owned();
    f.code = code;
    Cow::Owned(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Address, Src};

    fn inst(op: Op) -> Inst {
        Inst {
            guard: NONE,
            guard_neg: false,
            op,
            line: 1,
        }
    }

    fn ld(sp: Sp, order: MemOrder) -> Op {
        Op::Ld {
            addr: Address {
                sp,
                base: Src::Reg(0),
                off: 0,
            },
            size: 4,
            n: 1,
            ds: [1, NONE, NONE, NONE],
            sext: false,
            order,
        }
    }

    fn st(sp: Sp, order: MemOrder) -> Op {
        Op::St {
            addr: Address {
                sp,
                base: Src::Reg(0),
                off: 0,
            },
            size: 4,
            n: 1,
            vals: [Src::Reg(1); 4],
            order,
        }
    }

    fn func(ops: Vec<Op>) -> Func {
        Func {
            name: "k".into(),
            code: ops.into_iter().map(inst).collect(),
            nregs: 2,
            frame_bytes: 0,
            uses_volatile: true,
            params: Vec::new(),
            rets: Vec::new(),
        }
    }

    fn shape(f: &Func) -> Vec<String> {
        f.code
            .iter()
            .map(|i| match &i.op {
                Op::WarpStep => "step".to_string(),
                Op::Ld { addr, order, .. } => format!("ld {:?} {:?}", addr.sp, order),
                Op::St { addr, order, .. } => format!("st {:?} {:?}", addr.sp, order),
                Op::Bra { target } => format!("bra {target}"),
                op => format!("{op:?}"),
            })
            .collect()
    }

    #[test]
    fn a_step_goes_before_a_volatile_shared_access_after_other_lanes_may_have_written() {
        use MemOrder::*;
        let f = func(vec![
            ld(Sp::Shared, Volatile),
            ld(Sp::Generic, Volatile),
            st(Sp::Shared, Volatile),
            ld(Sp::Global, Volatile),
            st(Sp::Global, Release),
            ld(Sp::Shared, Plain),
            st(Sp::Shared, Plain),
            ld(Sp::Shared, Volatile),
            Op::Bra { target: 2 },
        ]);
        let got = with_steps(Cow::Owned(f));
        assert_eq!(
            shape(&got),
            [
                // from the start, loads only: none
                "ld Shared Volatile",
                "ld Generic Volatile",
                "step",
                "st Shared Volatile",
                "ld Global Volatile",
                "st Global Release",
                "ld Shared Plain",
                "st Shared Plain",
                "step",
                "ld Shared Volatile",
                // to the stepped store: to its step
                "bra 2",
            ]
        );
        assert!(got
            .code
            .iter()
            .all(|i| matches!(i.op, Op::WarpStep) == (i.line == UNCOUNTED)));
    }

    #[test]
    fn a_loop_back_parts_the_lanes_a_barrier_joins_them_and_global_code_is_left_alone() {
        use MemOrder::*;
        let f = func(vec![
            ld(Sp::Shared, Volatile),
            ld(Sp::Shared, Volatile),
            Op::Bra { target: 1 },
        ]);
        let got = with_steps(Cow::Owned(f));
        assert_eq!(
            shape(&got),
            ["ld Shared Volatile", "step", "ld Shared Volatile", "bra 1"]
        );
        // each access comes first after the lanes were together
        let bar = || Op::Bar {
            id: Src::Imm(0),
            count: Src::Imm(u64::MAX),
            wait: true,
            red: crate::ir::BarRed::None,
            d: NONE,
            p: Src::Imm(0),
            pneg: false,
        };
        let f = func(vec![
            st(Sp::Shared, Volatile),
            bar(),
            ld(Sp::Shared, Volatile),
            ld(Sp::Shared, Volatile),
            bar(),
            st(Sp::Shared, Volatile),
        ]);
        assert!(matches!(with_steps(Cow::Borrowed(&f)), Cow::Borrowed(_)));
        let f = func(vec![ld(Sp::Global, Volatile), st(Sp::Global, Volatile)]);
        assert!(matches!(with_steps(Cow::Borrowed(&f)), Cow::Borrowed(_)));
    }
}
