//! A lane kernel's stop goes on with the next group at a resume point whose runs
//! reach the stop, where that group resumes there, without the loop's dispatch.

use super::dirty::stops;
use super::resident::lane_slots;
use super::restart::group_start;
use super::translate::Translator;
use crate::ir::{Inst, Op, NONE};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I64};
use cranelift_codegen::ir::{Block, BlockArg, InstBuilder, MemFlagsData, Value};

impl Translator<'_, '_> {
    /// The resume ids of the points from which a run reaches the stop at
    /// `pc` (the lane kernel's), those after a stop alone where there are
    /// any (a group starts or resumes after a yield once or seldom): runs
    /// go on through branches (both ways where guarded) and end at stops
    /// and exits. The next group likely resumes where this one did.
    pub(super) fn origins(&mut self, pc: u32) -> Vec<u32> {
        if self.width == 1 {
            return Vec::new();
        }
        let code = &self.func.code;
        let resumes = &self.plan.resumes;
        // (each resume point's stops, found once a kernel)
        let reached = self
            .direct
            .reached
            .get_or_insert_with(|| resumes.iter().map(|&r| stops_from(code, r)).collect());
        let mut found: Vec<u32> = (0..resumes.len() as u32)
            .filter(|&id| reached[id as usize].binary_search(&pc).is_ok())
            .collect();
        let after_stop = |id: &u32| {
            let pc = self.plan.resumes[*id as usize] as usize;
            pc > 0 && stops(&code[pc - 1].op)
        };
        if found.iter().any(after_stop) {
            found.retain(after_stop);
        }
        found
    }

    /// Goes on from a stop of group `thread` (its code stored): with the
    /// next group at the first of [`super::translate::Direct::origins`]
    /// that is its resume point (its resume id read as the dispatch reads
    /// it), else through the loop's head.
    pub(super) fn next_group(&mut self, thread: Value) {
        let origins = std::mem::take(&mut self.direct.origins);
        if origins.is_empty() {
            self.fb.ins().jump(self.next_thread, &[]);
            return;
        }
        let next = self.fb.ins().iadd_imm_s(thread, self.width as i64);
        let more = self
            .fb
            .ins()
            .icmp(IntCC::UnsignedLessThan, next, self.direct.end);
        let check = self.fb.create_block();
        self.fb.ins().brif(more, check, &[], self.direct.done, &[]);
        self.fb.switch_to_block(check);
        let t64 = self.fb.ins().uextend(I64, next);
        let off = self.fb.ins().ishl_imm_u(t64, 2);
        let at = self.fb.ins().iadd(self.direct.resume_ids, off);
        let resume = self.fb.ins().load(I32, MemFlagsData::trusted(), at, 0);
        // (the next group's lane file follows this one's: the loop's body
        // puts group `t`'s `t` times `16 slots / width` bytes on)
        let file = self.fb.use_var(self.lane_file);
        let per_thread = lane_slots(self.func, self.plan).1 as i64 * 16 / self.width as i64;
        let file = match per_thread {
            0 => file,
            n => self.fb.ins().iadd_imm_s(file, n * self.width as i64),
        };
        let args = [BlockArg::Value(next), BlockArg::Value(file)];
        let head_args = [BlockArg::Value(next)];
        for (k, &id) in origins.iter().enumerate() {
            let same = self.fb.ins().icmp_imm_u(IntCC::Equal, resume, id as i64);
            let entry = self.entry(id);
            let last = k + 1 == origins.len();
            let (other, or_args): (Block, &[BlockArg]) = match last {
                true => (self.direct.head, &head_args),
                false => (self.fb.create_block(), &[]),
            };
            self.fb.ins().brif(same, entry, &args, other, or_args);
            if !last {
                self.fb.switch_to_block(other);
            }
        }
    }

    /// The block entering a group at resume point `id` (made once).
    fn entry(&mut self, id: u32) -> Block {
        if let Some(b) = self.direct.entries[id as usize] {
            return b;
        }
        let b = self.fb.create_block();
        self.fb.append_block_param(b, I32);
        self.fb.append_block_param(b, I64);
        self.direct.entries[id as usize] = Some(b);
        b
    }

    /// Fills the entry blocks the stops made: the group's thread and lane
    /// file, then its resume point.
    pub(super) fn fill_entries(&mut self) {
        for id in 0..self.direct.entries.len() {
            let Some(b) = self.direct.entries[id] else {
                continue;
            };
            self.fb.switch_to_block(b);
            let (thread, file) = (self.fb.block_params(b)[0], self.fb.block_params(b)[1]);
            let logs = !self
                .hoist
                .is_some_and(|h| h.unlogged(self.ops, &self.plan.final_stores));
            group_start(&mut self.fb, self.ctx, self.plan.restart, logs);
            self.fb.def_var(self.thread, thread);
            self.fb.def_var(self.lane_file, file);
            self.fb.ins().jump(self.direct.resume_blocks[id], &[]);
        }
    }
}

/// The stops (ascending pcs) a run from `start` reaches: through branches
/// (both ways where guarded), ending at stops and exits.
fn stops_from(code: &[Inst], start: u32) -> Vec<u32> {
    let mut seen = vec![false; code.len()];
    let mut todo = vec![start];
    let mut found = Vec::new();
    while let Some(at) = todo.pop() {
        let Some(inst) = code.get(at as usize) else {
            continue;
        };
        if std::mem::replace(&mut seen[at as usize], true) {
            continue;
        }
        if stops(&inst.op) {
            found.push(at);
            continue;
        }
        match inst.op {
            Op::Bra { target } => {
                todo.push(target);
                if inst.guard != NONE {
                    todo.push(at + 1);
                }
            }
            Op::Ret | Op::Exit | Op::Trap(_) => {}
            _ => todo.push(at + 1),
        }
    }
    found.sort_unstable();
    found
}
