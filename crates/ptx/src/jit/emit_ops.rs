//! Register ops in compiled code: the common ones open-coded with the
//! interpreter's exact semantics (fused `fma`, canonical NaNs), every other
//! one through the interpreter's own `alu` step on the thread's register file.

use super::count::count_now;
use super::device_calls::rt_device_call;
use super::inline::{CHECKS, UNCOUNTED};
use super::lane_defs::add_imm;
use super::narrow::{cmp_native, float_cc, int_cc};
use super::runtime::{rt_nanosleep, rt_register_op, window_base, Ctx, WINDOW_BYTES};
use super::translate::{ctx_off, Translator};
use crate::ir::{
    BoolOp, Cmp, FOp, FloatMode, IntOp, Op, Rnd, SReg, Sp, Src, TernOp, Ty, UnOp, NONE,
};
use crate::memory::DEVICE_VA_BASE;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32, F64, I16, I32, I64, I8};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value};
use std::mem::offset_of;

impl Translator<'_, '_> {
    fn masked(&mut self, v: Value, mask: u64) -> Value {
        // the low 8, 16 or 32 bits: a narrowing and a zero extension (one
        // move), not an `and` with a constant from memory
        let narrow = match mask {
            u64::MAX => return v,
            0xff => Some(I8),
            0xffff => Some(I16),
            0xffff_ffff => Some(I32),
            _ => None,
        };
        match narrow {
            Some(t) => {
                let x = self.fb.ins().ireduce(t, v);
                self.fb.ins().uextend(I64, x)
            }
            None => self.fb.ins().band_imm_u(v, mask as i64),
        }
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
        if let Some(&f) = self.floats.get(&(v, t == Ty::F32)) {
            return f;
        }
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
        let canon = if t == Ty::F32 {
            self.fb.ins().f32const(f32::from_bits(0x7fff_ffff))
        } else {
            self.fb.ins().f64const(f64::from_bits(i64::MAX as u64))
        };
        let f = self.fb.ins().select(nan, canon, f);
        let bits = if t == Ty::F32 {
            let w = self.fb.ins().bitcast(I32, MemFlagsData::new(), f);
            self.fb.ins().uextend(I64, w)
        } else {
            self.fb.ins().bitcast(I64, MemFlagsData::new(), f)
        };
        // these bits are exactly `f`'s
        self.floats.insert((bits, t == Ty::F32), f);
        bits
    }

    /// Emits register or memory op `pc` (not control flow).
    pub(super) fn op(&mut self, pc: u32) {
        let op = &self.ops[pc as usize];
        let line = self.func.code[pc as usize].line & !(UNCOUNTED | CHECKS);
        let plain =
            |m: &crate::ir::FloatMode| matches!(m.rnd, Rnd::Default | Rnd::Rn) && !m.ftz && !m.sat;
        match *op {
            Op::Nop => {}
            Op::Sleep { ns } => {
                let v = self.src(ns);
                self.call_runtime(rt_nanosleep as *const (), &[self.ctx, v], &[]);
            }
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
            } if cmp_native(cmp, t) => {
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
            Op::Un {
                op: uop, t, d, a, ..
            } if Self::un_native(uop, t) => {
                let a = self.src(a);
                let v = self.un_op(uop, t, a);
                self.set(d, v);
            }
            Op::Cvt { d, a, dt, st, mode } if Self::cvt_native(dt, st, &mode) => {
                let a = self.src(a);
                let v = self.cvt(a, dt, st, mode.rnd);
                self.set(d, v);
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
                    add_imm(&mut self.fb, v, win)
                } else {
                    add_imm(&mut self.fb, v, win.wrapping_neg())
                };
                self.set(d, v);
            }
            Op::Isspacep { d, a, sp } => {
                let v = self.src(a);
                let is = match sp {
                    Sp::Shared | Sp::Local | Sp::Param => {
                        let off = add_imm(&mut self.fb, v, (window_base(sp) as i64).wrapping_neg());
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
            Op::Bar {
                wait: false, id, ..
            } => {
                // `bar.arrive`: one more arrival at barrier `id & 15`
                let id = self.src(id);
                let slot = self.fb.ins().band_imm_u(id, 15);
                let off = self.fb.ins().ishl_imm_u(slot, 2);
                let at = self.fb.ins().iadd(self.ctx, off);
                let flags = MemFlagsData::trusted();
                let n = self.fb.ins().load(I32, flags, at, ctx_off!(arrivals));
                let n = add_imm(&mut self.fb, n, 1);
                self.fb.ins().store(flags, n, at, ctx_off!(arrivals));
            }
            Op::Printf { .. } | Op::Malloc { .. } | Op::Free { .. } | Op::CpAsync { .. } => {
                self.device_call(pc, line)
            }
            Op::AssertFail(_) => {
                self.device_call(pc, line);
                // the helper always faults: what follows is never reached
                self.jump_to_fault();
                let dead = self.fb.create_block();
                self.fb.switch_to_block(dead);
            }
            _ => self.helper_op(pc),
        }
    }

    fn special(&mut self, r: SReg) -> Value {
        match r {
            SReg::Tid(k) => {
                let t = self.tid_at(k as usize % 3);
                self.fb.ins().uextend(I64, t)
            }
            SReg::Ntid(9) => self.fb.ins().iconst(I64, 1),
            SReg::Ntid(k) => self.ctx_u32(ctx_off!(ntid) + 4 * (k as i32 % 3)),
            SReg::Ctaid(k) => self.ctx_u32(ctx_off!(ctaid) + 4 * (k as i32 % 3)),
            SReg::Nctaid(k) => self.ctx_u32(ctx_off!(nctaid) + 4 * (k as i32 % 3)),
            SReg::Laneid => {
                let lin = self.lin_at();
                let l = self.fb.ins().uextend(I64, lin);
                self.fb.ins().band_imm_u(l, 31)
            }
            SReg::Warpid => {
                let lin = self.lin_at();
                let l = self.fb.ins().uextend(I64, lin);
                self.fb.ins().ushr_imm_u(l, 5)
            }
            SReg::Nwarpid => self.ctx_u32(ctx_off!(nwarpid)),
            SReg::Clock | SReg::Clock64 | SReg::Globaltimer => {
                // the worker's instructions so far: before the block, and
                // the block's up to this one (the count has the rest of the
                // basic block in already: `excess`, of all lanes)
                let n = count_now(&mut self.fb, self.ctx);
                let here = add_imm(&mut self.fb, n, -self.excess);
                let base = self.ctx_u64(ctx_off!(clock_base));
                let clock = self.fb.ins().iadd(base, here);
                match r {
                    SReg::Clock => self.fb.ins().band_imm_u(clock, 0xffff_ffff),
                    SReg::Clock64 => clock,
                    _ => {
                        let start = self.ctx_u64(ctx_off!(start_ns));
                        self.fb.ins().iadd(start, clock)
                    }
                }
            }
            SReg::Smid => self.ctx_u32(ctx_off!(smid)),
            SReg::Nsmid => self.imm(132),
            SReg::Gridid => self.imm(1),
            SReg::DynSmem => self.ctx_u32(ctx_off!(dyn_smem)),
            SReg::TotalSmem => self.ctx_u64(ctx_off!(total_smem)),
            SReg::ReservedSmem(k) => {
                let begin = self.ctx_u64(ctx_off!(reserved_smem));
                match k % 5 {
                    0 | 3 => begin,
                    1 => add_imm(&mut self.fb, begin, 1024),
                    2 => self.imm(1024),
                    _ => add_imm(&mut self.fb, begin, 512),
                }
            }
            SReg::LanemaskEq
            | SReg::LanemaskLt
            | SReg::LanemaskLe
            | SReg::LanemaskGt
            | SReg::LanemaskGe => {
                let lin = self.lin_at();
                let l = self.fb.ins().uextend(I64, lin);
                let lane = self.fb.ins().band_imm_u(l, 31);
                let one = self.imm(1);
                let bit = self.fb.ins().ishl(one, lane);
                let below = add_imm(&mut self.fb, bit, -1);
                let upto = self.fb.ins().ishl_imm_u(bit, 1);
                let upto = add_imm(&mut self.fb, upto, -1);
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
            // the cooperative launch's grid workspace (0 outside one)
            SReg::Envreg(1) => {
                let w = self.ctx_u64(ctx_off!(grid_workspace));
                self.fb.ins().ushr_imm_u(w, 32)
            }
            SReg::Envreg(2) => {
                let w = self.ctx_u64(ctx_off!(grid_workspace));
                self.fb.ins().band_imm_u(w, 0xffff_ffff)
            }
            // the other `%envreg*` read 0; `Zero`
            _ => self.imm(0),
        }
    }

    fn ctx_u64(&mut self, off: i32) -> Value {
        let fixed = MemFlagsData::trusted().with_readonly();
        self.fb.ins().load(I64, fixed, self.ctx, off)
    }

    /// Stores the registers `op` reads to the thread's register file, for a
    /// helper that runs it there; the registers it writes, to reload after.
    fn spill_sources(&mut self, op: &Op) -> Vec<u32> {
        let srcs = op.src_regs();
        let mut dsts = Vec::new();
        op.for_each_dst(|d| dsts.push(d));
        let rp = self.regs_at();
        for r in srcs {
            let v = self.src(Src::Reg(r));
            self.fb
                .ins()
                .store(MemFlagsData::trusted(), v, rp, (r * 8) as i32);
        }
        dsts
    }

    /// Takes registers a helper wrote back from the thread's register file.
    fn reload(&mut self, dsts: Vec<u32>) {
        let rp = self.regs_at();
        for d in dsts {
            let v = self
                .fb
                .ins()
                .load(I64, MemFlagsData::trusted(), rp, (d * 8) as i32);
            self.set(d, v);
        }
    }

    /// Register op `pc` through the interpreter's own step: its sources go
    /// to the thread's register file, its results come back from it.
    fn helper_op(&mut self, pc: u32) {
        let op = &self.ops[pc as usize];
        let dsts = self.spill_sources(op);
        let opp = self.imm(op as *const Op as usize as i64);
        let nregs = self.imm(self.func.nregs as i64);
        let rp = self.regs_at();
        self.call_runtime(rt_register_op as *const (), &[opp, rp, nregs], &[]);
        self.reload(dsts);
    }

    /// A device-library call through its helper: the registers it reads go
    /// to the thread's register file, its result comes back from it.
    fn device_call(&mut self, pc: u32, line: u32) {
        let op = &self.ops[pc as usize];
        let dsts = self.spill_sources(op);
        let opp = self.imm(op as *const Op as usize as i64);
        let nregs = self.imm(self.func.nregs as i64);
        let ln = self.imm32(line as i64);
        let (local, rp, lin) = (self.local_at(), self.regs_at(), self.lin_at());
        let args = [self.ctx, local, rp, nregs, opp, ln, lin];
        self.call_checked(rt_device_call as *const (), &args);
        self.reload(dsts);
    }

    fn int_native(&self, op: IntOp, t: Ty) -> bool {
        match op {
            IntOp::Add | IntOp::Sub | IntOp::MulLo | IntOp::And | IntOp::Or | IntOp::Xor => true,
            IntOp::Shl | IntOp::Shr => t != Ty::Pred,
            IntOp::MulWide => matches!(t.bits(), 16 | 32),
            IntOp::Min | IntOp::Max => !t.is_float() && t != Ty::B128,
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
            IntOp::Min | IntOp::Max => {
                let (x, y) = if s {
                    (self.sext(a, bits), self.sext(b, bits))
                } else {
                    (self.masked(a, mask), self.masked(b, mask))
                };
                let cc = if s {
                    IntCC::SignedLessThan
                } else {
                    IntCC::UnsignedLessThan
                };
                let less = self.fb.ins().icmp(cc, x, y);
                let v = if op == IntOp::Min {
                    self.fb.ins().select(less, a, b)
                } else {
                    self.fb.ins().select(less, b, a)
                };
                return self.masked(v, mask);
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

    /// `cmp` of `a` and `b` as type `t` (an I8 condition).
    fn compare(&mut self, cmp: Cmp, t: Ty, a: Value, b: Value) -> Value {
        if t.is_float() {
            let (x, y) = (self.float_of(a, t), self.float_of(b, t));
            return self.fb.ins().fcmp(float_cc(cmp), x, y);
        }
        let bits = t.bits();
        let (x, y) = if t.signed() {
            (self.sext(a, bits), self.sext(b, bits))
        } else {
            (self.masked(a, t.mask()), self.masked(b, t.mask()))
        };
        self.fb.ins().icmp(int_cc(cmp, t.signed()), x, y)
    }

    fn un_native(op: UnOp, t: Ty) -> bool {
        match op {
            UnOp::Not | UnOp::Neg | UnOp::Abs => !t.is_float() && t != Ty::B128,
            UnOp::FNeg | UnOp::FAbs => matches!(t, Ty::F32 | Ty::F64),
            _ => false,
        }
    }

    /// `op` of `a` as type `t`, as `alu::un_op` computes it (the negation
    /// and absolute value of a float only touch its sign: no NaN canon).
    fn un_op(&mut self, op: UnOp, t: Ty, a: Value) -> Value {
        let mask = t.mask();
        let v = match op {
            UnOp::Not => self.fb.ins().bnot(a),
            UnOp::Neg => self.fb.ins().ineg(a),
            UnOp::Abs => {
                let x = self.sext(a, t.bits());
                self.fb.ins().iabs(x)
            }
            UnOp::FNeg => {
                let sign = self.imm((1u64 << (t.bits() - 1)) as i64);
                return self.fb.ins().bxor(a, sign);
            }
            _ => {
                // FAbs
                let rest = self.imm(!(1u64 << (t.bits() - 1)) as i64);
                let v = self.fb.ins().band(a, rest);
                return self.masked(v, mask);
            }
        };
        self.masked(v, mask)
    }

    /// Whether `cvt` from `st` to `dt` with `mode` is open-coded: integer
    /// widths, integers of 32 or 64 bits to f32/f64 to nearest, f32/f64 to
    /// integers of 32 or 64 bits with an integer rounding, f32 and f64 to
    /// each other to nearest; no `.sat`, no `.ftz`.
    fn cvt_native(dt: Ty, st: Ty, mode: &FloatMode) -> bool {
        if mode.sat || mode.ftz {
            return false;
        }
        let int = |t: Ty| !t.is_float() && !matches!(t, Ty::Pred | Ty::B128);
        let wide_int = |t: Ty| int(t) && t.bits() >= 32;
        let float = |t: Ty| matches!(t, Ty::F32 | Ty::F64);
        let nearest = matches!(mode.rnd, Rnd::Default | Rnd::Rn);
        match (st, dt) {
            (s, d) if int(s) && int(d) => true,
            (s, d) if wide_int(s) && float(d) => nearest,
            (s, d) if float(s) && wide_int(d) => {
                matches!(mode.rnd, Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi)
            }
            (Ty::F32, Ty::F64) => nearest,
            (Ty::F64, Ty::F32) => nearest,
            _ => false,
        }
    }

    /// `cvt` of `a` from `st` to `dt` (a case `cvt_native` takes), as
    /// `alu::cvt` computes it.
    fn cvt(&mut self, a: Value, dt: Ty, st: Ty, rnd: Rnd) -> Value {
        if !st.is_float() {
            let v = if st.signed() {
                self.sext(a, st.bits())
            } else {
                self.masked(a, st.mask())
            };
            if !dt.is_float() {
                return self.masked(v, dt.mask());
            }
            // v holds the source exactly in 64 bits; one rounding to dt
            let fty = if dt == Ty::F32 { F32 } else { F64 };
            let f = if st.signed() {
                self.fb.ins().fcvt_from_sint(fty, v)
            } else {
                self.fb.ins().fcvt_from_uint(fty, v)
            };
            return self.float_bits(f, dt);
        }
        let x = self.float_of(a, st);
        if dt.is_float() {
            let f = if dt == Ty::F64 {
                self.fb.ins().fpromote(F64, x)
            } else {
                self.fb.ins().fdemote(F32, x)
            };
            return self.canon_bits(f, dt);
        }
        let r = match rnd {
            Rnd::Rni => self.fb.ins().nearest(x),
            Rnd::Rmi => self.fb.ins().floor(x),
            Rnd::Rpi => self.fb.ins().ceil(x),
            _ => x,
        };
        // NaN to 0, out of range saturated, toward zero: as the alu
        let ity = if dt.bits() == 32 { I32 } else { I64 };
        let v = if dt.signed() {
            self.fb.ins().fcvt_to_sint_sat(ity, r)
        } else {
            self.fb.ins().fcvt_to_uint_sat(ity, r)
        };
        let v = if ity == I32 {
            self.fb.ins().uextend(I64, v)
        } else {
            v
        };
        self.masked(v, dt.mask())
    }

    /// The register bits of float `f` of type `t` (a value that cannot be NaN).
    fn float_bits(&mut self, f: Value, t: Ty) -> Value {
        if t == Ty::F32 {
            let w = self.fb.ins().bitcast(I32, MemFlagsData::new(), f);
            self.fb.ins().uextend(I64, w)
        } else {
            self.fb.ins().bitcast(I64, MemFlagsData::new(), f)
        }
    }
}
