//! The lane kernel: [`LANES`] threads of a block run in step by one call, each
//! op once per lane or once for all (`emit_vec`), control flow shared; where
//! their guards part them, or at an op kept in thread order, it gives up.

use super::dirty::stops;
use super::lane_defs::add_imm;
use super::plan::one_at_a_time;
use super::resident::touched;
use super::runtime::{RET_EXIT, RET_FAULT, RET_PARTED, STOP_BARRIER, STOP_BITS, STOP_YIELD};
use super::translate::{lanes_flags, Translator};
use crate::ir::{Inst, Op, NONE};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4, I64, I64X2, I8};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value};

pub(crate) use super::LANES;

impl Translator<'_, '_> {
    /// Makes lane `k` the running one: its registers in `regs`.
    pub(super) fn set_lane(&mut self, k: usize) {
        if k == self.lane {
            return;
        }
        std::mem::swap(&mut self.regs, &mut self.lane_regs[self.lane]);
        std::mem::swap(&mut self.regs, &mut self.lane_regs[k]);
        self.lane = k;
    }

    /// The running lane's register file (lane 0's, one register file on
    /// for each lane after it).
    pub(super) fn regs_at(&mut self) -> Value {
        let step = self.func.nregs as i64 * 8;
        let regs = self.group_ptr(0, step);
        self.lane_step(regs, step)
    }

    /// The running lane's local memory.
    pub(super) fn local_at(&mut self) -> Value {
        let step = (self.func.frame_bytes as u64).div_ceil(8) as i64 * 8;
        let local = self.group_ptr(1, step);
        self.lane_step(local, step)
    }

    /// The running lane's thread index (an I32).
    pub(super) fn lin_at(&mut self) -> Value {
        let lin = self.fb.use_var(self.thread);
        if self.lane == 0 {
            return lin;
        }
        add_imm(&mut self.fb, lin, self.lane as i64)
    }

    /// The running lane's `%tid` component `k` (an I32).
    pub(super) fn tid_at(&mut self, k: usize) -> Value {
        if self.width == 1 {
            return self.tid[k];
        }
        // the lane kernel's `%tid`s lie component by component, a group's
        // x of each lane, then y, then z (`KernelFn`)
        let fixed = MemFlagsData::trusted().with_readonly();
        let off = (k * 16 + self.lane * 4) as i32;
        let tids = self.group_ptr(2, 16);
        self.fb.ins().load(I32, fixed, tids, off)
    }

    /// Every lane's `%tid` component `k` (an I32X4): one load.
    pub(super) fn tids_at(&mut self, k: usize) -> Value {
        let fixed = lanes_flags().with_readonly();
        let tids = self.group_ptr(2, 16);
        self.fb.ins().load(I32X4, fixed, tids, (k * 16) as i32)
    }

    /// Base `k` of the running group's (register files, local memory,
    /// `%tid`s: `Direct::bases`) moved on by `step` bytes for each thread
    /// before its first (pure ops the code generator places where read).
    fn group_ptr(&mut self, k: usize, step: i64) -> Value {
        let base = self.direct.bases[k];
        if step == 0 {
            return base;
        }
        let thread = self.fb.use_var(self.thread);
        let t64 = self.fb.ins().uextend(I64, thread);
        let off = match step.count_ones() {
            1 => self.fb.ins().ishl_imm_u(t64, step.trailing_zeros() as i64),
            _ => self.fb.ins().imul_imm_s(t64, step),
        };
        self.fb.ins().iadd(base, off)
    }

    /// `v`, lane 0's, moved on by `step` bytes for each lane before the
    /// running one.
    fn lane_step(&mut self, v: Value, step: i64) -> Value {
        if self.lane == 0 {
            return v;
        }
        add_imm(&mut self.fb, v, step * self.lane as i64)
    }

    /// Ends the run with stop code `code` for every lane (the thread loop:
    /// for its running thread).
    pub(super) fn finish_all(&mut self, code: u32) {
        if self.width == 1 {
            self.finish_with(code);
            return;
        }
        // a barrier or an exit goes on with the next group; a yield, a
        // fault or parted lanes return (the count stored), one past the group
        let returns =
            code == RET_FAULT || code == RET_PARTED || code & ((1 << STOP_BITS) - 1) == STOP_YIELD;
        // (a restarting lane kernel's groups that return not exited all: the
        // launch takes an exit for each, its code neither stored nor noted)
        if self.plan.restart && code == RET_EXIT {
            self.fb.ins().jump(self.next_thread, &[]);
            return;
        }
        // (the group's lanes stop alike: its first thread's code speaks for
        // them all)
        let c = self.fb.ins().iconst(I32, code as i64);
        let thread = self.fb.use_var(self.thread);
        let t64 = self.fb.ins().uextend(I64, thread);
        let off = self.fb.ins().ishl_imm_u(t64, 2);
        let at = self.fb.ins().iadd(self.codes, off);
        self.fb.ins().store(MemFlagsData::trusted(), c, at, 0);
        self.note_code(code);
        if !returns {
            // (a stop that one resume point's runs reach alone may go on
            // at that point with the next group: `jit::direct`)
            self.next_group(thread);
            return;
        }
        let done = add_imm(&mut self.fb, thread, self.width as i64);
        self.fb.ins().return_(&[done]);
    }

    /// The check of basic block `start..end`'s shared accesses that lets
    /// a copy run them unchecked: for the thread loop its running thread's,
    /// for the lane kernel every lane's.
    pub(super) fn lanes_shared_check(
        &mut self,
        start: u32,
        end: u32,
    ) -> Option<(Vec<u32>, Vec<Value>)> {
        if self.width > 1 {
            if let Some(once) = self.lanes_span_check(start, end) {
                return Some(once);
            }
        }
        let mut all: Option<(Vec<u32>, Vec<Value>)> = None;
        for k in 0..self.width as usize {
            self.set_lane(k);
            let (pcs, ok) = self.shared_block_check(start, end)?;
            match &mut all {
                Some((_, conds)) => conds.extend(ok),
                None => all = Some((pcs, ok)),
            }
        }
        self.set_lane(0);
        all
    }

    /// Emits instruction `pc` for every lane; false once it ended the
    /// basic block.
    pub(super) fn lane_inst(&mut self, pc: u32) -> bool {
        let inst = &self.func.code[pc as usize];
        if !self.passes_lazy(inst) {
            self.settle_lazy(pc);
        }
        // what the run knew of the registers this writes no longer holds
        inst.op.for_each_dst(|d| self.forget_wide(d));
        let agree = self.lanes_agree(inst);
        let next = self.next_block(pc);
        // (where the basic block ends, what it wrote of the resident ones
        // goes to the lane file: a next block or resume reads it there)
        if matches!(inst.op, Op::Bra { .. } | Op::Ret | Op::Exit | Op::Trap(_)) || stops(&inst.op) {
            let start = self.plan.starts[self.plan.starts.partition_point(|&s| s <= pc) - 1];
            self.store_resident(start, pc);
        }
        match inst.op {
            Op::Bra { target } => {
                let go = self.fb.create_block();
                match agree {
                    Some((all, any)) => self.part_or(all, any, go, next),
                    None => {
                        self.fb.ins().jump(go, &[]);
                    }
                }
                self.fb.switch_to_block(go);
                self.branch_to(target, pc, inst.line);
                false
            }
            Op::Ret | Op::Exit => {
                let exit = self.exit_block;
                match agree {
                    Some((all, any)) => self.part_or(all, any, exit, next),
                    None => {
                        self.fb.ins().jump(exit, &[]);
                    }
                }
                false
            }
            Op::Bar { wait: true, .. } => {
                let wait = self.fb.create_block();
                match agree {
                    Some((all, any)) => self.part_or(all, any, wait, next),
                    None => {
                        self.fb.ins().jump(wait, &[]);
                    }
                }
                self.fb.switch_to_block(wait);
                // the launch reads the barrier's id, count and predicate
                self.stop_at(pc + 1, STOP_BARRIER, &inst.op.src_regs());
                false
            }
            ref op if one_at_a_time(op) => {
                // the lanes give up where any would run it
                let ends = matches!(op, Op::Trap(_));
                match agree {
                    Some((_, any)) => {
                        let parted = self.fb.create_block();
                        let skip = if ends { next } else { self.fb.create_block() };
                        self.fb.ins().brif(any, parted, &[], skip, &[]);
                        self.fb.switch_to_block(parted);
                        self.fb.set_cold_block(parted);
                        self.finish_all(RET_PARTED);
                        if ends {
                            return false;
                        }
                        self.fb.switch_to_block(skip);
                        true
                    }
                    None => {
                        self.finish_all(RET_PARTED);
                        false
                    }
                }
            }
            _ if self.strided_op(pc)
                || self.vector_global(inst)
                || self.vector_op(inst)
                || self.wide_op(pc) =>
            {
                true
            }
            _ => {
                self.each_lane(pc);
                true
            }
        }
    }

    /// Emits instruction `pc` (a register or memory op) once for each
    /// lane, each under its own guard.
    pub(super) fn each_lane(&mut self, pc: u32) {
        let inst = &self.func.code[pc as usize];
        let width = self.width as usize;
        let conds = self.lane_guards(inst);
        if inst.guard == NONE {
            // every lane sets the op's vector destinations: those it does
            // not read start from zeros, not their old values (which would
            // stay live)
            let op = &self.ops[pc as usize];
            let read = op.src_regs();
            op.for_each_dst(|d| {
                if !read.contains(&d) {
                    self.clear_vector(d);
                }
            });
        }
        let lanes_after = |k: usize| (width - 1 - k) as i64;
        let per_lane = self.counted(pc + 1, self.block_end) as i64 * width as i64;
        for k in 0..width {
            self.set_lane(k);
            self.excess = per_lane + lanes_after(k);
            match conds.get(k) {
                Some(&c) => {
                    let on = self.fb.create_block();
                    let cont = self.fb.create_block();
                    self.fb.ins().brif(c, on, &[], cont, &[]);
                    self.fb.switch_to_block(on);
                    self.op(pc);
                    self.fb.ins().jump(cont, &[]);
                    self.fb.switch_to_block(cont);
                }
                None => self.op(pc),
            }
        }
        self.set_lane(0);
    }

    /// Sets narrow or vector-wide register `d` to zeros (every lane is
    /// about to set its own).
    pub(super) fn clear_vector(&mut self, d: u32) {
        if d == NONE {
            return;
        }
        if let Some(var) = self.vregs[d as usize] {
            self.vraw.retain(|x| x.0 != d);
            self.vmasks.retain(|x| x.0 != d);
            let zero = self.fb.ins().iconst(I32, 0);
            let zero = self.fb.ins().splat(I32X4, zero);
            self.fb.def_var(var, zero);
        }
        if let Some(vars) = self.wregs[d as usize] {
            let zero = self.fb.ins().iconst(I64, 0);
            let zero = self.fb.ins().splat(I64X2, zero);
            for var in vars {
                self.fb.def_var(var, zero);
            }
        }
    }

    /// Whether `inst`'s guard holds in every lane, and in any (I8
    /// conditions), if it has one: for control flow, which lanes share.
    fn lanes_agree(&mut self, inst: &Inst) -> Option<(Value, Value)> {
        if inst.guard == NONE {
            return None;
        }
        if let Some(var) = self.vregs[inst.guard as usize] {
            // each lane's guard bit at the top of its lane (its mask, where
            // the run made it), then one bit a lane
            // (a mask of the predicate's negation turns the guard round)
            let (top, negated) = match self.vmasks.iter().find(|m| m.0 == inst.guard) {
                Some(&(_, mask, negated)) => (mask, negated),
                None => {
                    let v = self.fb.use_var(var);
                    (self.fb.ins().ishl_imm_u(v, 31), false)
                }
            };
            let bits = self.fb.ins().vhigh_bits(I8, top);
            let (all_bits, none_bits) = if inst.guard_neg != negated {
                (0, 15)
            } else {
                (15, 0)
            };
            let all = self.fb.ins().icmp_imm_u(IntCC::Equal, bits, all_bits);
            let any = self.fb.ins().icmp_imm_u(IntCC::NotEqual, bits, none_bits);
            return Some((all, any));
        }
        let conds = self.lane_guards(inst);
        let one = self.fb.ins().iconst(I8, 1);
        let zero = self.fb.ins().iconst(I8, 0);
        Some(conds.iter().fold((one, zero), |(all, any), &c| {
            (self.fb.ins().band(all, c), self.fb.ins().bor(any, c))
        }))
    }

    /// Each lane's guard of `inst` (none if it has none).
    fn lane_guards(&mut self, inst: &Inst) -> Vec<Value> {
        let lane = self.lane;
        let conds = (0..self.width as usize)
            .filter_map(|k| {
                self.set_lane(k);
                self.guard(inst)
            })
            .collect();
        self.set_lane(lane);
        conds
    }

    /// Goes to `yes` when every lane's guard holds, to `no` when none
    /// does; else the lanes part ([`RET_PARTED`]).
    fn part_or(
        &mut self,
        all: Value,
        any: Value,
        yes: cranelift_codegen::ir::Block,
        no: cranelift_codegen::ir::Block,
    ) {
        let mixed = self.fb.create_block();
        let not_all = self.fb.create_block();
        self.fb.ins().brif(all, yes, &[], not_all, &[]);
        self.fb.switch_to_block(not_all);
        self.fb.ins().brif(any, mixed, &[], no, &[]);
        self.fb.switch_to_block(mixed);
        self.fb.set_cold_block(mixed);
        self.finish_all(RET_PARTED);
    }
}

impl Translator<'_, '_> {
    /// Loads the resident registers (`jit::resident`) that the basic block
    /// `start..end` reads or writes from the lane file, at its start.
    pub(super) fn load_resident(&mut self, start: u32, end: u32) {
        let lane_file = self.fb.use_var(self.lane_file);
        for r in touched(self.func, &self.resident, start, end) {
            let slot = self.slot_at(r);
            match (self.vregs[r as usize], self.sregs[r as usize]) {
                (Some(var), _) => {
                    let x = self.fb.ins().load(I32X4, lanes_flags(), lane_file, slot);
                    self.fb.def_var(var, x);
                }
                (None, Some((var, _))) => {
                    let flags = MemFlagsData::trusted();
                    let x = self.fb.ins().load(I64, flags, lane_file, slot);
                    self.fb.def_var(var, x);
                }
                _ => unreachable!("a resident register is narrow or strided"),
            }
        }
    }

    /// Stores the resident registers that `start..pc`, the basic block up
    /// to where it leaves, wrote to the lane file.
    pub(super) fn store_resident(&mut self, start: u32, pc: u32) {
        let mut written = Vec::new();
        for inst in &self.func.code[start as usize..pc as usize] {
            inst.op.for_each_dst(|d| {
                if d != NONE && self.resident[d as usize] && !written.contains(&d) {
                    written.push(d);
                }
            });
        }
        for r in written {
            match (self.vregs[r as usize], self.sregs[r as usize]) {
                (Some(var), _) => {
                    let v = self.fb.use_var(var);
                    self.store_narrow(r, v);
                }
                (None, Some((var, _))) => {
                    let v = self.fb.use_var(var);
                    self.store_strided(r, v);
                }
                _ => unreachable!("a resident register is narrow or strided"),
            }
        }
    }

    /// Stores strided register `r`'s lane 0 `v` (an I64) to its slot.
    pub(super) fn store_strided(&mut self, r: u32, v: Value) {
        let slot = self.slot_at(r);
        let flags = MemFlagsData::trusted();
        let lane_file = self.fb.use_var(self.lane_file);
        self.fb.ins().store(flags, v, lane_file, slot);
    }

    /// Stores narrow register `r`'s lanes `v` to its lane-file slot.
    pub(super) fn store_narrow(&mut self, r: u32, v: Value) {
        let slot = self.slot_at(r);
        let lane_file = self.fb.use_var(self.lane_file);
        self.fb.ins().store(lanes_flags(), v, lane_file, slot);
    }
}
