//! One kernel to Cranelift IR: a dispatch on the resume point, registers as
//! SSA variables loaded where a thread resumes and stored where it stops (a
//! barrier, a yield at a backward branch), control flow and guards, and the
//! register ops: common ones open-coded, the rest through the interpreter's
//! `alu` step (`rt_register_op`); memory ops live in `emit_mem`.

use super::plan::Plan;
use super::runtime::{
    rt_register_op, rt_trap, window_base, Ctx, RET_EXIT, RET_FAULT, WINDOW_BYTES,
};
use crate::ir::{BoolOp, Cmp, FOp, Func, Inst, IntOp, Op, Rnd, SReg, Sp, Src, TernOp, Ty, NONE};
use crate::memory::DEVICE_VA_BASE;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F64, I32, I64};
use cranelift_codegen::ir::{
    AbiParam, Block, BlockArg, InstBuilder, JumpTableData, MemFlagsData, Signature, StackSlotData,
    StackSlotKind, Type, Value,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, Variable};
use std::mem::offset_of;

/// The signature of a compiled kernel ([`super::runtime::KernelFn`]).
pub(super) fn kernel_signature(call_conv: CallConv) -> Signature {
    let mut sig = Signature::new(call_conv);
    for t in [I64, I64, I64, I32, I32, I32, I32, I32] {
        sig.params.push(AbiParam::new(t));
    }
    sig.returns.push(AbiParam::new(I32));
    sig
}

/// The state of translating one kernel.
pub(super) struct Translator<'a, 'f> {
    pub fb: FunctionBuilder<'f>,
    pub call_conv: CallConv,
    pub func: &'a Func,
    /// The kernel's ops, owned by the compiled kernel (helpers get pointers).
    pub ops: &'a [Op],
    pub plan: &'a Plan,
    pub regs: Vec<Variable>,
    pub count: Variable,
    pub ctx: Value,
    pub regs_ptr: Value,
    pub local: Value,
    pub lin: Value,
    pub tid: [Value; 3],
    pub blocks: Vec<Block>,
    pub exit_block: Block,
    pub fault_block: Block,
    /// Instructions of the current basic block after the one being
    /// emitted: counted on entry, taken back when that one faults.
    pub excess: i64,
    /// The block's shared memory (host base, bytes), loaded at the start of
    /// a basic block with shared accesses (it dominates them all).
    pub shared_here: Option<(Value, Value)>,
    /// The global-cache site of the access being emitted, and the sites so far.
    pub site: u32,
    pub sites: u32,
    /// An 8-byte stack slot the load helper writes into.
    pub slot: cranelift_codegen::ir::StackSlot,
}

/// A field of [`Ctx`] at its offset.
macro_rules! ctx_off {
    ($field:ident) => {
        offset_of!(Ctx<'static>, $field) as i32
    };
}
pub(super) use ctx_off;

impl<'a, 'f> Translator<'a, 'f> {
    /// Builds the whole function into `fb`'s function; returns its number
    /// of global-cache sites.
    pub(super) fn translate(
        mut fb: FunctionBuilder<'f>,
        target: TargetFrontendConfig,
        func: &'a Func,
        ops: &'a [Op],
        plan: &'a Plan,
    ) -> u32 {
        let entry = fb.create_block();
        fb.append_block_params_for_function_params(entry);
        fb.switch_to_block(entry);
        let p = fb.block_params(entry).to_vec();
        let regs: Vec<Variable> = (0..func.nregs).map(|_| fb.declare_var(I64)).collect();
        let count = fb.declare_var(I64);
        let blocks: Vec<Block> = plan.starts.iter().map(|_| fb.create_block()).collect();
        let exit_block = fb.create_block();
        let fault_block = fb.create_block();
        let slot =
            fb.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 8, 3));
        let call_conv = target.default_call_conv;
        let mut t = Translator {
            fb,
            call_conv,
            func,
            ops,
            plan,
            regs,
            count,
            ctx: p[0],
            regs_ptr: p[1],
            local: p[2],
            lin: p[3],
            tid: [p[4], p[5], p[6]],
            blocks,
            exit_block,
            fault_block,
            excess: 0,
            shared_here: None,
            site: u32::MAX,
            sites: 0,
            slot,
        };
        let n =
            t.fb.ins()
                .load(I64, MemFlagsData::trusted(), t.ctx, ctx_off!(instructions));
        t.fb.def_var(count, n);
        // dispatch on the resume point: load its live registers, go on there
        let resume_blocks: Vec<Block> = plan.resumes.iter().map(|_| t.fb.create_block()).collect();
        let calls: Vec<_> = resume_blocks
            .iter()
            .map(|&b| t.fb.func.dfg.block_call(b, &[]))
            .collect();
        let default = t.fb.func.dfg.block_call(exit_block, &[]);
        let table = t.fb.create_jump_table(JumpTableData::new(default, &calls));
        t.fb.ins().br_table(p[7], table);
        for (k, &rb) in resume_blocks.iter().enumerate() {
            t.fb.switch_to_block(rb);
            let pc = plan.resumes[k];
            let b = plan.block_at(pc);
            for &r in &plan.live_in[b] {
                let v =
                    t.fb.ins()
                        .load(I64, MemFlagsData::trusted(), t.regs_ptr, (r * 8) as i32);
                t.fb.def_var(t.regs[r as usize], v);
            }
            t.fb.ins().jump(t.blocks[b], &[]);
        }
        for b in 0..plan.starts.len() {
            t.basic_block(b);
        }
        t.fb.switch_to_block(exit_block);
        t.finish_with(RET_EXIT);
        t.fb.switch_to_block(fault_block);
        let excess = t.fb.append_block_param(fault_block, I64);
        let n = t.fb.use_var(count);
        let n = t.fb.ins().isub(n, excess);
        t.fb.def_var(count, n);
        t.finish_with(RET_FAULT);
        t.fb.seal_all_blocks();
        let sites = t.sites;
        t.fb.finalize(target);
        sites
    }

    /// Stores the instruction count and returns `code`.
    fn finish_with(&mut self, code: u32) {
        let n = self.fb.use_var(self.count);
        self.fb
            .ins()
            .store(MemFlagsData::trusted(), n, self.ctx, ctx_off!(instructions));
        let c = self.fb.ins().iconst(I32, code as i64);
        self.fb.ins().return_(&[c]);
    }

    /// Stops the thread to resume at `pc` later: stores the registers live
    /// there and returns its resume id (`yielded` in the low bit).
    fn stop_at(&mut self, pc: u32, yielded: bool) {
        let b = self.plan.block_at(pc);
        for &r in &self.plan.live_in[b] {
            let v = self.fb.use_var(self.regs[r as usize]);
            self.fb
                .ins()
                .store(MemFlagsData::trusted(), v, self.regs_ptr, (r * 8) as i32);
        }
        let id = self.plan.resume_id(pc);
        self.finish_with(id << 1 | yielded as u32);
    }

    fn basic_block(&mut self, b: usize) {
        self.fb.switch_to_block(self.blocks[b]);
        let start = self.plan.starts[b];
        let end = self
            .plan
            .starts
            .get(b + 1)
            .copied()
            .unwrap_or(self.func.code.len() as u32);
        let n = self.fb.use_var(self.count);
        let n = self.fb.ins().iadd_imm_s(n, (end - start) as i64);
        self.fb.def_var(self.count, n);
        let shared_accesses = (start..end)
            .filter(|&pc| match self.ops[pc as usize] {
                Op::Ld { addr, .. } | Op::St { addr, .. } => addr.sp == Sp::Shared,
                _ => false,
            })
            .count();
        self.shared_here = (shared_accesses > 1).then(|| {
            let fixed = MemFlagsData::trusted().with_readonly();
            let bytes = self
                .fb
                .ins()
                .load(I64, fixed, self.ctx, ctx_off!(shared_bytes));
            let base = self.fb.ins().load(I64, fixed, self.ctx, ctx_off!(shared));
            (base, bytes)
        });
        for pc in start..end {
            self.excess = (end - pc - 1) as i64;
            if !self.inst(pc) {
                return;
            }
        }
        match self.blocks.get(b + 1) {
            Some(&next) => {
                self.fb.ins().jump(next, &[]);
            }
            None => {
                self.fb.ins().jump(self.exit_block, &[]);
            }
        }
    }

    /// The guard of `inst` as a 0/1 condition, if it has one.
    fn guard(&mut self, inst: &Inst) -> Option<Value> {
        if inst.guard == NONE {
            return None;
        }
        let g = self.fb.use_var(self.regs[inst.guard as usize]);
        let bit = self.fb.ins().band_imm_u(g, 1);
        let cc = if inst.guard_neg {
            IntCC::Equal
        } else {
            IntCC::NotEqual
        };
        Some(self.fb.ins().icmp_imm_u(cc, bit, 0))
    }

    /// The block after `pc` (the next basic block when `pc` ends one).
    fn next_block(&self, pc: u32) -> Block {
        self.blocks
            .get(self.plan.block_at(pc + 1))
            .copied()
            .unwrap_or(self.exit_block)
    }

    /// Emits instruction `pc`; false once it ended the basic block.
    fn inst(&mut self, pc: u32) -> bool {
        let inst = &self.func.code[pc as usize];
        let guard = self.guard(inst);
        match inst.op {
            Op::Bra { target } => {
                let to = self.blocks[self.plan.block_at(target)];
                let go = self.fb.create_block();
                match guard {
                    Some(c) => {
                        let next = self.next_block(pc);
                        self.fb.ins().brif(c, go, &[], next, &[]);
                    }
                    None => {
                        self.fb.ins().jump(go, &[]);
                    }
                }
                self.fb.switch_to_block(go);
                if target <= pc {
                    // a long loop yields so that the block's budgets are checked
                    let n = self.fb.use_var(self.count);
                    let at = self.fb.ins().load(
                        I64,
                        MemFlagsData::trusted(),
                        self.ctx,
                        ctx_off!(check_at),
                    );
                    let over = self.fb.ins().icmp(IntCC::UnsignedGreaterThan, n, at);
                    let stop = self.fb.create_block();
                    self.fb.set_cold_block(stop);
                    self.fb.ins().brif(over, stop, &[], to, &[]);
                    self.fb.switch_to_block(stop);
                    let line = self.fb.ins().iconst(I64, inst.line as i64);
                    self.fb.ins().store(
                        MemFlagsData::trusted(),
                        line,
                        self.ctx,
                        ctx_off!(yield_line),
                    );
                    self.stop_at(target, true);
                } else {
                    self.fb.ins().jump(to, &[]);
                }
                false
            }
            Op::Ret | Op::Exit => {
                match guard {
                    Some(c) => {
                        let next = self.next_block(pc);
                        self.fb.ins().brif(c, self.exit_block, &[], next, &[]);
                    }
                    None => {
                        self.fb.ins().jump(self.exit_block, &[]);
                    }
                }
                false
            }
            Op::Trap(_) => {
                let trap = self.fb.create_block();
                match guard {
                    Some(c) => {
                        let next = self.next_block(pc);
                        self.fb.ins().brif(c, trap, &[], next, &[]);
                    }
                    None => {
                        self.fb.ins().jump(trap, &[]);
                    }
                }
                self.fb.switch_to_block(trap);
                let mut sig = Signature::new(self.call_conv);
                sig.params.extend([AbiParam::new(I64), AbiParam::new(I64)]);
                sig.params.extend([AbiParam::new(I32), AbiParam::new(I32)]);
                sig.returns.push(AbiParam::new(I32));
                let sig = self.fb.import_signature(sig);
                let f = self.imm(rt_trap as *const () as usize as i64);
                let op = self.imm(&self.ops[pc as usize] as *const Op as usize as i64);
                let line = self.fb.ins().iconst(I32, inst.line as i64);
                self.fb
                    .ins()
                    .call_indirect(sig, f, &[self.ctx, op, line, self.lin]);
                self.jump_to_fault();
                false
            }
            Op::Bar { .. } => {
                let wait = self.fb.create_block();
                match guard {
                    Some(c) => {
                        let next = self.next_block(pc);
                        self.fb.ins().brif(c, wait, &[], next, &[]);
                    }
                    None => {
                        self.fb.ins().jump(wait, &[]);
                    }
                }
                self.fb.switch_to_block(wait);
                self.stop_at(pc + 1, false);
                false
            }
            _ => {
                let (on, cont) = match guard {
                    Some(c) => {
                        let on = self.fb.create_block();
                        let cont = self.fb.create_block();
                        self.fb.ins().brif(c, on, &[], cont, &[]);
                        self.fb.switch_to_block(on);
                        (Some(on), Some(cont))
                    }
                    None => (None, None),
                };
                self.op(pc);
                if let (Some(_), Some(cont)) = (on, cont) {
                    self.fb.ins().jump(cont, &[]);
                    self.fb.switch_to_block(cont);
                }
                true
            }
        }
    }

    /// The value of `s` as 64 register bits.
    pub(super) fn src(&mut self, s: Src) -> Value {
        match s {
            Src::Reg(r) => self.fb.use_var(self.regs[r as usize]),
            Src::Imm(v) => self.fb.ins().iconst(I64, v as i64),
            // a kernel's frame starts at local address 0
            Src::Frame(o) => self.fb.ins().iconst(I64, o as i64),
        }
    }

    pub(super) fn set(&mut self, d: u32, v: Value) {
        self.fb.def_var(self.regs[d as usize], v);
    }

    fn masked(&mut self, v: Value, mask: u64) -> Value {
        if mask == u64::MAX {
            v
        } else {
            self.fb.ins().band_imm_u(v, mask as i64)
        }
    }

    /// `v` sign-extended from its low `bits`.
    pub(super) fn sext(&mut self, v: Value, bits: u32) -> Value {
        if bits >= 64 {
            return v;
        }
        let s = self.fb.ins().ishl_imm_u(v, (64 - bits) as i64);
        self.fb.ins().sshr_imm_u(s, (64 - bits) as i64)
    }

    /// Loads the ctx field at `off` as a zero-extended u32.
    fn ctx_u32(&mut self, off: i32) -> Value {
        let v = self
            .fb
            .ins()
            .load(I32, MemFlagsData::trusted(), self.ctx, off);
        self.fb.ins().uextend(I64, v)
    }

    fn bool_to_reg(&mut self, c: Value) -> Value {
        self.fb.ins().uextend(I64, c)
    }

    fn float_of(&mut self, v: Value, t: Ty) -> Value {
        if t == Ty::F32 {
            let w = self.fb.ins().ireduce(I32, v);
            self.fb.ins().bitcast(F32, MemFlagsData::new(), w)
        } else {
            self.fb.ins().bitcast(F64, MemFlagsData::new(), v)
        }
    }

    /// The register bits of float `f` of type `t`, NaN made canonical.
    fn canon_bits(&mut self, f: Value, t: Ty) -> Value {
        let nan = self.fb.ins().fcmp(FloatCC::Unordered, f, f);
        let (bits, canon) = if t == Ty::F32 {
            let w = self.fb.ins().bitcast(I32, MemFlagsData::new(), f);
            (self.fb.ins().uextend(I64, w), 0x7fff_ffffi64)
        } else {
            (self.fb.ins().bitcast(I64, MemFlagsData::new(), f), i64::MAX)
        };
        let c = self.fb.ins().iconst(I64, canon);
        self.fb.ins().select(nan, c, bits)
    }

    /// Emits register or memory op `pc` (not control flow).
    fn op(&mut self, pc: u32) {
        let op = &self.ops[pc as usize];
        let line = self.func.code[pc as usize].line;
        let plain =
            |m: &crate::ir::FloatMode| matches!(m.rnd, Rnd::Default | Rnd::Rn) && !m.ftz && !m.sat;
        match *op {
            Op::Nop => {}
            Op::Mov { d, a, mask } => {
                let v = self.src(a);
                let v = self.masked(v, mask);
                self.set(d, v);
            }
            Op::Int {
                op: iop,
                t,
                d,
                a,
                b,
            } if self.int_native(iop, t) => {
                let (a, b) = (self.src(a), self.src(b));
                let v = self.int_op(iop, t, a, b);
                self.set(d, v);
            }
            Op::Float {
                op: fop,
                t: t @ (Ty::F32 | Ty::F64),
                d,
                a,
                b,
                mode,
            } if plain(&mode) && matches!(fop, FOp::Add | FOp::Sub | FOp::Mul | FOp::Div) => {
                let (a, b) = (self.src(a), self.src(b));
                let (x, y) = (self.float_of(a, t), self.float_of(b, t));
                let r = match fop {
                    FOp::Add => self.fb.ins().fadd(x, y),
                    FOp::Sub => self.fb.ins().fsub(x, y),
                    FOp::Mul => self.fb.ins().fmul(x, y),
                    _ => self.fb.ins().fdiv(x, y),
                };
                let v = self.canon_bits(r, t);
                self.set(d, v);
            }
            Op::Tern {
                op: TernOp::Fma,
                t: t @ (Ty::F32 | Ty::F64),
                d,
                a,
                b,
                c,
                mode,
            } if plain(&mode) => {
                let (a, b, c) = (self.src(a), self.src(b), self.src(c));
                let (x, y, z) = (
                    self.float_of(a, t),
                    self.float_of(b, t),
                    self.float_of(c, t),
                );
                let r = self.fb.ins().fma(x, y, z);
                let v = self.canon_bits(r, t);
                self.set(d, v);
            }
            Op::Tern {
                op: TernOp::MadLo,
                t,
                d,
                a,
                b,
                c,
                ..
            } if !t.is_float() => {
                let (a, b, c) = (self.src(a), self.src(b), self.src(c));
                let p = self.fb.ins().imul(a, b);
                let s = self.fb.ins().iadd(p, c);
                let v = self.masked(s, t.mask());
                self.set(d, v);
            }
            Op::Tern {
                op: TernOp::Selp,
                t,
                d,
                a,
                b,
                c,
                ..
            } => {
                let (a, b, c) = (self.src(a), self.src(b), self.src(c));
                let bit = self.fb.ins().band_imm_u(c, 1);
                let v = self.fb.ins().select(bit, a, b);
                let v = self.masked(v, t.mask());
                self.set(d, v);
            }
            Op::Setp {
                cmp,
                t,
                d,
                d2,
                a,
                b,
                bop,
                c,
                cneg,
                ..
            } if self.cmp_native(cmp, t) => {
                let (a, b) = (self.src(a), self.src(b));
                let p = self.compare(cmp, t, a, b);
                let cv = self.src(c);
                let cv = self.fb.ins().band_imm_u(cv, 1);
                let cv = if cneg {
                    self.fb.ins().bxor_imm_u(cv, 1)
                } else {
                    cv
                };
                let p = self.bool_to_reg(p);
                let combine = |t: &mut Self, x: Value| match bop {
                    BoolOp::None => x,
                    BoolOp::And => t.fb.ins().band(x, cv),
                    BoolOp::Or => t.fb.ins().bor(x, cv),
                    BoolOp::Xor => t.fb.ins().bxor(x, cv),
                };
                let v = combine(self, p);
                self.set(d, v);
                if d2 != NONE {
                    let np = self.fb.ins().bxor_imm_u(p, 1);
                    let v2 = combine(self, np);
                    self.set(d2, v2);
                }
            }
            Op::Cvta {
                d,
                a,
                sp,
                to_generic,
            } => {
                let v = self.src(a);
                let win = window_base(sp) as i64;
                let v = if to_generic {
                    self.fb.ins().iadd_imm_s(v, win)
                } else {
                    self.fb.ins().iadd_imm_s(v, win.wrapping_neg())
                };
                self.set(d, v);
            }
            Op::Isspacep { d, a, sp } => {
                let v = self.src(a);
                let is = match sp {
                    Sp::Shared | Sp::Local | Sp::Param => {
                        let off = self
                            .fb
                            .ins()
                            .iadd_imm_s(v, (window_base(sp) as i64).wrapping_neg());
                        self.fb
                            .ins()
                            .icmp_imm_u(IntCC::UnsignedLessThan, off, WINDOW_BYTES as i64)
                    }
                    _ => self.fb.ins().icmp_imm_u(
                        IntCC::UnsignedGreaterThanOrEqual,
                        v,
                        DEVICE_VA_BASE as i64,
                    ),
                };
                let v = self.bool_to_reg(is);
                self.set(d, v);
            }
            Op::Special { d, r } => {
                let v = self.special(r);
                self.set(d, v);
            }
            Op::Ld { .. } | Op::St { .. } | Op::Atom { .. } => self.memory_op(op, line),
            _ => self.helper_op(pc),
        }
    }

    fn special(&mut self, r: SReg) -> Value {
        match r {
            SReg::Tid(k) => self.fb.ins().uextend(I64, self.tid[k as usize % 3]),
            SReg::Ntid(9) => self.fb.ins().iconst(I64, 1),
            SReg::Ntid(k) => self.ctx_u32(ctx_off!(ntid) + 4 * (k as i32 % 3)),
            SReg::Ctaid(k) => self.ctx_u32(ctx_off!(ctaid) + 4 * (k as i32 % 3)),
            SReg::Nctaid(k) => self.ctx_u32(ctx_off!(nctaid) + 4 * (k as i32 % 3)),
            SReg::Laneid => {
                let l = self.fb.ins().uextend(I64, self.lin);
                self.fb.ins().band_imm_u(l, 31)
            }
            SReg::Warpid => {
                let l = self.fb.ins().uextend(I64, self.lin);
                self.fb.ins().ushr_imm_u(l, 5)
            }
            SReg::Nwarpid => self.ctx_u32(ctx_off!(nwarpid)),
            SReg::Smid => self.ctx_u32(ctx_off!(smid)),
            SReg::Nsmid => self.imm(132),
            SReg::Gridid => self.imm(1),
            SReg::DynSmem => self.ctx_u32(ctx_off!(dyn_smem)),
            SReg::TotalSmem => self.ctx_u64(ctx_off!(total_smem)),
            SReg::ReservedSmem(k) => {
                let begin = self.ctx_u64(ctx_off!(reserved_smem));
                match k % 5 {
                    0 | 3 => begin,
                    1 => self.fb.ins().iadd_imm_s(begin, 1024),
                    2 => self.imm(1024),
                    _ => self.fb.ins().iadd_imm_s(begin, 512),
                }
            }
            SReg::LanemaskEq
            | SReg::LanemaskLt
            | SReg::LanemaskLe
            | SReg::LanemaskGt
            | SReg::LanemaskGe => {
                let l = self.fb.ins().uextend(I64, self.lin);
                let lane = self.fb.ins().band_imm_u(l, 31);
                let one = self.imm(1);
                let bit = self.fb.ins().ishl(one, lane);
                let below = self.fb.ins().iadd_imm_s(bit, -1);
                let upto = self.fb.ins().ishl_imm_u(bit, 1);
                let upto = self.fb.ins().iadd_imm_s(upto, -1);
                match r {
                    SReg::LanemaskEq => bit,
                    SReg::LanemaskLt => below,
                    SReg::LanemaskLe => self.fb.ins().band_imm_u(upto, 0xffff_ffff),
                    SReg::LanemaskGt => {
                        let v = self.fb.ins().bnot(upto);
                        self.fb.ins().band_imm_u(v, 0xffff_ffff)
                    }
                    _ => {
                        let v = self.fb.ins().bnot(below);
                        self.fb.ins().band_imm_u(v, 0xffff_ffff)
                    }
                }
            }
            // `%envreg*` read 0 outside a cooperative launch; `Zero`
            _ => self.imm(0),
        }
    }

    fn ctx_u64(&mut self, off: i32) -> Value {
        let fixed = MemFlagsData::trusted().with_readonly();
        self.fb.ins().load(I64, fixed, self.ctx, off)
    }

    /// Register op `pc` through the interpreter's own step: its sources go
    /// to the thread's register file, its results come back from it.
    fn helper_op(&mut self, pc: u32) {
        let op = &self.ops[pc as usize];
        let mut srcs = Vec::new();
        op.for_each_src(|s| {
            if let Src::Reg(r) = s {
                srcs.push(r)
            }
        });
        let mut dsts = Vec::new();
        op.for_each_dst(|d| dsts.push(d));
        for r in srcs {
            let v = self.fb.use_var(self.regs[r as usize]);
            self.fb
                .ins()
                .store(MemFlagsData::trusted(), v, self.regs_ptr, (r * 8) as i32);
        }
        let mut sig = Signature::new(self.call_conv);
        sig.params.extend([AbiParam::new(I64); 3]);
        let sig = self.fb.import_signature(sig);
        let callee = self
            .fb
            .ins()
            .iconst(I64, rt_register_op as *const () as usize as i64);
        let opp = self.fb.ins().iconst(I64, op as *const Op as usize as i64);
        let nregs = self.fb.ins().iconst(I64, self.func.nregs as i64);
        self.fb
            .ins()
            .call_indirect(sig, callee, &[opp, self.regs_ptr, nregs]);
        for d in dsts {
            let v = self
                .fb
                .ins()
                .load(I64, MemFlagsData::trusted(), self.regs_ptr, (d * 8) as i32);
            self.set(d, v);
        }
    }

    fn int_native(&self, op: IntOp, t: Ty) -> bool {
        match op {
            IntOp::Add | IntOp::Sub | IntOp::MulLo | IntOp::And | IntOp::Or | IntOp::Xor => true,
            IntOp::Shl | IntOp::Shr => t != Ty::Pred,
            IntOp::MulWide => matches!(t.bits(), 16 | 32),
            _ => false,
        }
    }

    fn int_op(&mut self, op: IntOp, t: Ty, a: Value, b: Value) -> Value {
        let bits = t.bits();
        let mask = t.mask();
        let s = t.signed();
        let ins = self.fb.ins();
        let v = match op {
            IntOp::Add => ins.iadd(a, b),
            IntOp::Sub => ins.isub(a, b),
            IntOp::MulLo => ins.imul(a, b),
            IntOp::And => ins.band(a, b),
            IntOp::Or => ins.bor(a, b),
            IntOp::Xor => ins.bxor(a, b),
            IntOp::Shl => {
                let n = self.fb.ins().band_imm_u(b, 0xffff_ffff);
                let sh = self.fb.ins().ishl(a, n);
                let sh = self.masked(sh, mask);
                let big =
                    self.fb
                        .ins()
                        .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, n, bits as i64);
                let zero = self.fb.ins().iconst(I64, 0);
                return self.fb.ins().select(big, zero, sh);
            }
            IntOp::Shr => {
                let n = self.fb.ins().band_imm_u(b, 0xffff_ffff);
                if s {
                    let cap = self.fb.ins().iconst(I64, bits as i64 - 1);
                    let n = self.fb.ins().umin(n, cap);
                    let x = self.sext(a, bits);
                    let v = self.fb.ins().sshr(x, n);
                    return self.masked(v, mask);
                }
                let x = self.masked(a, mask);
                let v = self.fb.ins().ushr(x, n);
                let big =
                    self.fb
                        .ins()
                        .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, n, bits as i64);
                let zero = self.fb.ins().iconst(I64, 0);
                return self.fb.ins().select(big, zero, v);
            }
            _ => {
                // MulWide of 16 or 32 bits: the product fits 64 bits
                let (x, y) = if s {
                    (self.sext(a, bits), self.sext(b, bits))
                } else {
                    (self.masked(a, mask), self.masked(b, mask))
                };
                let p = self.fb.ins().imul(x, y);
                let wmask = if bits >= 32 {
                    u64::MAX
                } else {
                    (1u64 << (2 * bits)) - 1
                };
                return self.masked(p, wmask);
            }
        };
        self.masked(v, mask)
    }

    fn cmp_native(&self, cmp: Cmp, t: Ty) -> bool {
        match t {
            Ty::F32 | Ty::F64 => true,
            t if t.is_float() || t == Ty::Pred || t == Ty::B128 => false,
            _ => matches!(
                cmp,
                Cmp::Eq
                    | Cmp::Ne
                    | Cmp::Lt
                    | Cmp::Le
                    | Cmp::Gt
                    | Cmp::Ge
                    | Cmp::Equ
                    | Cmp::Neu
                    | Cmp::Ltu
                    | Cmp::Leu
                    | Cmp::Gtu
                    | Cmp::Geu
            ),
        }
    }

    /// `cmp` of `a` and `b` as type `t` (an I8 condition).
    fn compare(&mut self, cmp: Cmp, t: Ty, a: Value, b: Value) -> Value {
        if t.is_float() {
            let (x, y) = (self.float_of(a, t), self.float_of(b, t));
            let cc = match cmp {
                Cmp::Eq => FloatCC::Equal,
                Cmp::Ne => FloatCC::OrderedNotEqual,
                Cmp::Lt | Cmp::Lo => FloatCC::LessThan,
                Cmp::Le | Cmp::Ls => FloatCC::LessThanOrEqual,
                Cmp::Gt | Cmp::Hi => FloatCC::GreaterThan,
                Cmp::Ge | Cmp::Hs => FloatCC::GreaterThanOrEqual,
                Cmp::Equ => FloatCC::UnorderedOrEqual,
                Cmp::Neu => FloatCC::NotEqual,
                Cmp::Ltu => FloatCC::UnorderedOrLessThan,
                Cmp::Leu => FloatCC::UnorderedOrLessThanOrEqual,
                Cmp::Gtu => FloatCC::UnorderedOrGreaterThan,
                Cmp::Geu => FloatCC::UnorderedOrGreaterThanOrEqual,
                Cmp::Num => FloatCC::Ordered,
                Cmp::Nan => FloatCC::Unordered,
            };
            return self.fb.ins().fcmp(cc, x, y);
        }
        let bits = t.bits();
        let (x, y) = if t.signed() {
            (self.sext(a, bits), self.sext(b, bits))
        } else {
            (self.masked(a, t.mask()), self.masked(b, t.mask()))
        };
        let s = t.signed();
        let cc = match cmp {
            Cmp::Eq | Cmp::Equ => IntCC::Equal,
            Cmp::Ne | Cmp::Neu => IntCC::NotEqual,
            Cmp::Lt | Cmp::Ltu if s => IntCC::SignedLessThan,
            Cmp::Le | Cmp::Leu if s => IntCC::SignedLessThanOrEqual,
            Cmp::Gt | Cmp::Gtu if s => IntCC::SignedGreaterThan,
            Cmp::Ge | Cmp::Geu if s => IntCC::SignedGreaterThanOrEqual,
            Cmp::Lt | Cmp::Ltu => IntCC::UnsignedLessThan,
            Cmp::Le | Cmp::Leu => IntCC::UnsignedLessThanOrEqual,
            Cmp::Gt | Cmp::Gtu => IntCC::UnsignedGreaterThan,
            _ => IntCC::UnsignedGreaterThanOrEqual,
        };
        self.fb.ins().icmp(cc, x, y)
    }

    /// Jumps to the fault exit when `failed` (an I32 status) is non-zero.
    pub(super) fn fault_if(&mut self, failed: Value) {
        let ok = self.fb.create_block();
        let excess = self.fb.ins().iconst(I64, self.excess);
        self.fb.ins().brif(
            failed,
            self.fault_block,
            &[BlockArg::Value(excess)],
            ok,
            &[],
        );
        self.fb.switch_to_block(ok);
    }

    /// Jumps to the fault exit (the current block ends).
    pub(super) fn jump_to_fault(&mut self) {
        let excess = self.fb.ins().iconst(I64, self.excess);
        self.fb
            .ins()
            .jump(self.fault_block, &[BlockArg::Value(excess)]);
    }

    /// A 64-bit constant.
    pub(super) fn imm(&mut self, v: i64) -> Value {
        self.fb.ins().iconst(I64, v)
    }

    /// A type of `bytes` bytes.
    pub(super) fn int_type(bytes: u32) -> Type {
        Type::int_with_byte_size(bytes as u16).unwrap_or(I64)
    }

    /// Jumps to `to` passing `v` (`emit_mem`'s joins).
    pub(super) fn jump_with(&mut self, to: Block, v: Value) {
        self.fb.ins().jump(to, &[BlockArg::Value(v)]);
    }
}
