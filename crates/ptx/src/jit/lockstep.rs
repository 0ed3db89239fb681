//! Lockstep warps in compiled code: a thread stops before each volatile
//! shared or generic access until no lane of its warp can run on, then all
//! go on together, so warp-synchronous code sees what the interpreter's
//! lockstep warps give it.
//!
//! The interpreter runs a module with volatile accesses one instruction a
//! lane at a time (`exec::block`): a warp's lanes do an access before any
//! does the next. Compiled code runs a thread from stop to stop, so the
//! kernel gets an uncounted [`Op::WarpStep`] before each such access; the
//! launch lets a warp's lanes waiting at steps go on once none of them can
//! run (`warp::resolve_warp`). Between two steps each lane runs alone, in
//! lane order: for lanes at one pc (converged code) every lane makes its
//! volatile access before any makes its next one, as in lockstep. A load
//! that follows a volatile load with no store, atomic, branch or stop
//! between needs no step of its own (no lane writes in between, so what it
//! reads is the same). Volatile global accesses get no step: they are how
//! blocks talk to each other (compiled as atomics, `emit_mem`), not lanes.

use super::inline::UNCOUNTED;
use crate::ir::{Func, Inst, MemOrder, Op, Sp, NONE};
use std::borrow::Cow;

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

/// Whether `op` may write memory another lane reads, moves its thread
/// elsewhere or stops it: the next volatile load needs its own step.
fn breaks_run(op: &Op) -> bool {
    match op {
        Op::St { addr, .. } => !matches!(addr.sp, Sp::Local | Sp::Param),
        Op::Ld { .. }
        | Op::Mov { .. }
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
        | Op::Nop => false,
        _ => true,
    }
}

/// `f` with an [`Op::WarpStep`] before each volatile shared or generic
/// access that needs one (`f` itself where none does).
pub(super) fn with_steps(f: Cow<'_, Func>) -> Cow<'_, Func> {
    let n = f.code.len();
    let mut target = vec![false; n + 1];
    for inst in &f.code {
        if let Op::Bra { target: t } = inst.op {
            if let Some(slot) = target.get_mut(t as usize) {
                *slot = true;
            }
        }
    }
    let mut step = vec![false; n];
    // the last volatile access of the run since the last step was a load
    let mut after_load = false;
    for (pc, inst) in f.code.iter().enumerate() {
        if target[pc] {
            after_load = false;
        }
        match warp_visible(&inst.op) {
            Some(false) => {
                step[pc] = !after_load;
                after_load = true;
            }
            Some(true) => {
                step[pc] = true;
                after_load = false;
            }
            None => after_load &= !breaks_run(&inst.op),
        }
    }
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
    fn a_step_goes_before_each_volatile_shared_access_but_a_load_after_a_load() {
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
                "step",
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
                "bra 3",
            ]
        );
        assert!(got
            .code
            .iter()
            .all(|i| matches!(i.op, Op::WarpStep) == (i.line == UNCOUNTED)));
    }

    #[test]
    fn a_branch_target_starts_a_new_run_and_global_only_code_is_left_alone() {
        use MemOrder::*;
        let f = func(vec![
            ld(Sp::Shared, Volatile),
            ld(Sp::Shared, Volatile),
            Op::Bra { target: 1 },
        ]);
        let got = with_steps(Cow::Owned(f));
        assert_eq!(
            shape(&got),
            [
                "step",
                "ld Shared Volatile",
                "step",
                "ld Shared Volatile",
                "bra 2"
            ]
        );
        let f = func(vec![ld(Sp::Global, Volatile), st(Sp::Global, Volatile)]);
        assert!(matches!(with_steps(Cow::Borrowed(&f)), Cow::Borrowed(_)));
    }
}
