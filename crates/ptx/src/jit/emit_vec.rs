//! Register ops of the lane kernel on narrow registers, one vector op for all
//! lanes (32-bit integer and `f32` arithmetic, `setp`, `selp`, `%tid`), with
//! the thread loop's exact results; any other op runs lane by lane.

use super::lane_defs::Lazy;
use super::narrow::{cmp_native, float_cc, int_cc, plain};
use super::runtime::Ctx;
use super::translate::{ctx_off, Translator};
use crate::ir::{BoolOp, Cmp, FOp, Inst, IntOp, Op, SReg, Src, TernOp, Ty, NONE};
use cranelift_codegen::ir::condcodes::{CondCode, FloatCC, IntCC};
use cranelift_codegen::ir::types::{F32X4, I32, I32X4};
use cranelift_codegen::ir::{ConstantData, Endianness, InstBuilder, MemFlagsData, Value};
use std::mem::offset_of;

impl Translator<'_, '_> {
    /// Emits `inst` (at `pc`) as vector ops for every lane when its
    /// registers are narrow and it has a vector form; whether it did.
    pub(super) fn vector_op(&mut self, inst: &Inst) -> bool {
        let narrow = |t: &Self, s: Src| match s {
            Src::Reg(r) => t.vregs[r as usize].is_some(),
            Src::Imm(_) => true,
            Src::Frame(_) => false,
        };
        let mut fits = inst.guard == NONE || narrow(self, Src::Reg(inst.guard));
        inst.op.for_each_src(|s| fits &= narrow(self, s));
        inst.op
            .for_each_dst(|d| fits &= d == NONE || narrow(self, Src::Reg(d)));
        if !fits {
            return false;
        }
        if self.vector_shared(inst) {
            return true;
        }
        let int32 = |t: Ty| t.bits() == 32 && !t.is_float();
        let mut raw = None;
        let mut masks: Vec<(u32, Value, bool)> = Vec::new();
        let results: Vec<(u32, Value)> = match inst.op {
            Op::Mov { d, a, mask } if mask >= u32::MAX as u64 => vec![(d, self.vsrc(a))],
            Op::Int { op, t, d, a, b } if int32(t) => {
                let x = self.vsrc(a);
                let v = match (op, b) {
                    (
                        IntOp::Add
                        | IntOp::Sub
                        | IntOp::MulLo
                        | IntOp::And
                        | IntOp::Or
                        | IntOp::Xor,
                        _,
                    ) => {
                        let y = self.vsrc(b);
                        if op == IntOp::MulLo {
                            self.product(x, y)
                        } else {
                            let ins = self.fb.ins();
                            match op {
                                IntOp::Add => ins.iadd(x, y),
                                IntOp::Sub => ins.isub(x, y),
                                IntOp::And => ins.band(x, y),
                                IntOp::Or => ins.bor(x, y),
                                _ => ins.bxor(x, y),
                            }
                        }
                    }
                    (IntOp::Shl, Src::Imm(n)) if n < 32 => self.fb.ins().ishl_imm_u(x, n as i64),
                    (IntOp::Shr, Src::Imm(n)) if t.signed() => {
                        self.fb.ins().sshr_imm_u(x, n.min(31) as i64)
                    }
                    (IntOp::Shr, Src::Imm(n)) if n < 32 => self.fb.ins().ushr_imm_u(x, n as i64),
                    _ => return false,
                };
                vec![(d, v)]
            }
            Op::Int { op, t, d, a, b }
                if t.bits() < 32
                    && !t.is_float()
                    && matches!(
                        op,
                        IntOp::Add
                            | IntOp::Sub
                            | IntOp::MulLo
                            | IntOp::And
                            | IntOp::Or
                            | IntOp::Xor
                    ) =>
            {
                // narrower than the lanes (predicates, 8 and 16 bits):
                // the 32-bit result cut to the type's bits, as the
                // interpreter cuts it
                // (a predicate `and`/`or`/`xor` of two the run knows as
                // masks is their mask too, for guards: `vmasks`)
                if t == Ty::Pred && matches!(op, IntOp::And | IntOp::Or | IntOp::Xor) {
                    if let (Some((mx, nx)), Some((my, ny))) =
                        (self.vmask_as_is(a), self.vmask_as_is(b))
                    {
                        // (of two negated masks: `!x & !y` is `!(x | y)`,
                        // `!x | !y` is `!(x & y)`; a xor of one negated mask
                        // is the negated xor)
                        let ins = self.fb.ins();
                        let m = match (op, nx && ny, nx || ny) {
                            (IntOp::Xor, ..) => Some((ins.bxor(mx, my), nx != ny)),
                            (IntOp::And, false, false) => Some((ins.band(mx, my), false)),
                            (IntOp::And, true, _) => Some((ins.bor(mx, my), true)),
                            (IntOp::Or, false, false) => Some((ins.bor(mx, my), false)),
                            (IntOp::Or, true, _) => Some((ins.band(mx, my), true)),
                            _ => None,
                        };
                        let m = match m {
                            Some(m) => Some(m),
                            None => match (self.vmask(a, false), self.vmask(b, false)) {
                                (Some(x), Some(y)) if op == IntOp::And => {
                                    Some((self.fb.ins().band(x, y), false))
                                }
                                (Some(x), Some(y)) => Some((self.fb.ins().bor(x, y), false)),
                                _ => None,
                            },
                        };
                        masks.extend(m.map(|(m, n)| (d, m, n)));
                    }
                }
                let (x, y) = (self.vsrc(a), self.vsrc(b));
                let ins = self.fb.ins();
                let v = match op {
                    IntOp::Add => ins.iadd(x, y),
                    IntOp::Sub => ins.isub(x, y),
                    IntOp::MulLo => ins.imul(x, y),
                    IntOp::And => ins.band(x, y),
                    IntOp::Or => ins.bor(x, y),
                    _ => ins.bxor(x, y),
                };
                let mask = self.fb.ins().iconst(I32, t.mask() as u32 as i64);
                let mask = self.fb.ins().splat(I32X4, mask);
                vec![(d, self.fb.ins().band(v, mask))]
            }
            Op::Tern {
                op: TernOp::MadLo,
                t,
                d,
                a,
                b,
                c,
                ..
            } if int32(t) => {
                let (x, y, z) = (self.vsrc(a), self.vsrc(b), self.vsrc(c));
                let p = self.product(x, y);
                vec![(d, self.fb.ins().iadd(p, z))]
            }
            Op::Tern {
                op: TernOp::Selp,
                t,
                d,
                a,
                b,
                c,
                ..
            } if t.bits() == 32 => {
                let (x, y) = (self.vsrc(a), self.vsrc(b));
                let on = self.vtrue(c, false);
                vec![(d, self.fb.ins().bitselect(on, x, y))]
            }
            Op::Tern {
                op: TernOp::Fma,
                t: Ty::F32,
                d,
                a,
                b,
                c,
                mode,
            } if plain(&mode) => {
                let apart = self.reads_lazy_loads(&[a, b, c]);
                let [x, y, z] = self.lazy_floats([a, b, c]);
                let r = self.fb.ins().fma(x, y, z);
                if inst.guard == NONE {
                    return self.vdef_raw(d, r, apart);
                }
                raw = Some(r);
                vec![(d, self.vcanon(r))]
            }
            Op::Float {
                op,
                t: Ty::F32,
                d,
                a,
                b,
                mode,
            } if plain(&mode) && matches!(op, FOp::Add | FOp::Sub | FOp::Mul | FOp::Div) => {
                let apart = self.reads_lazy_loads(&[a, b]);
                let [x, y] = self.lazy_floats([a, b]);
                let ins = self.fb.ins();
                let r = match op {
                    FOp::Add => ins.fadd(x, y),
                    FOp::Sub => ins.fsub(x, y),
                    FOp::Mul => ins.fmul(x, y),
                    _ => ins.fdiv(x, y),
                };
                if inst.guard == NONE {
                    return self.vdef_raw(d, r, apart);
                }
                raw = Some(r);
                vec![(d, self.vcanon(r))]
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
            } if cmp_native(cmp, t) && (int32(t) || t == Ty::F32) => {
                let Some(p) = self.vcompare(cmp, t, a, b) else {
                    return false;
                };
                // (the lanes as masks, for guards: `vmasks`)
                let cmask = match bop {
                    BoolOp::None => None,
                    _ => self.vmask(c, cneg),
                };
                let mcombine = |t: &mut Self, m: Value| match (bop, cmask) {
                    (BoolOp::None, _) => Some(m),
                    (BoolOp::And, Some(cm)) => Some(t.fb.ins().band(m, cm)),
                    (BoolOp::Or, Some(cm)) => Some(t.fb.ins().bor(m, cm)),
                    (BoolOp::Xor, Some(cm)) => Some(t.fb.ins().bxor(m, cm)),
                    _ => None,
                };
                let pm = p;
                // (a signed `ge`/`le` or a `ne` alone: its negation's mask,
                // one compare where it is two)
                let negated = bop == BoolOp::None
                    && d2 == NONE
                    && int32(t)
                    && matches!(
                        int_cc(cmp, t.signed()),
                        IntCC::SignedGreaterThanOrEqual
                            | IntCC::SignedLessThanOrEqual
                            | IntCC::NotEqual
                    );
                if negated {
                    let cc = int_cc(cmp, t.signed()).complement();
                    let (x, y) = (self.vsrc(a), self.vsrc(b));
                    masks.push((d, self.fb.ins().icmp(cc, x, y), true));
                } else {
                    masks.extend(mcombine(self, pm).map(|m| (d, m, false)));
                }
                if d2 != NONE {
                    let npm = self.fb.ins().bnot(pm);
                    masks.extend(mcombine(self, npm).map(|m| (d2, m, false)));
                }
                // lanes of all ones or zeros, to 1 or 0
                let p = self.fb.ins().ushr_imm_u(p, 31);
                let cv = self.vsrc(c);
                let one = self.vsplat(1);
                let cv = self.fb.ins().band(cv, one);
                let cv = if cneg {
                    self.fb.ins().bxor(cv, one)
                } else {
                    cv
                };
                let combine = |t: &mut Self, x: Value| match bop {
                    BoolOp::None => x,
                    BoolOp::And => t.fb.ins().band(x, cv),
                    BoolOp::Or => t.fb.ins().bor(x, cv),
                    BoolOp::Xor => t.fb.ins().bxor(x, cv),
                };
                let mut out = vec![(d, combine(self, p))];
                if d2 != NONE {
                    let np = self.fb.ins().bxor(p, one);
                    out.push((d2, combine(self, np)));
                }
                out
            }
            Op::Special { d, r } => match r {
                SReg::Tid(k) => vec![(d, self.tids_at(k as usize % 3))],
                _ if self.specials.iter().any(|&(s, _)| s == r) => {
                    let x = self.specials.iter().find(|&&(s, _)| s == r).map(|s| s.1);
                    vec![(d, x.expect("found"))]
                }
                SReg::Ntid(k) | SReg::Ctaid(k) | SReg::Nctaid(k) if k < 3 => {
                    let off = match r {
                        SReg::Ntid(_) => ctx_off!(ntid),
                        SReg::Ctaid(_) => ctx_off!(ctaid),
                        _ => ctx_off!(nctaid),
                    } + 4 * k as i32;
                    let fixed = MemFlagsData::trusted().with_readonly();
                    let x = self.fb.ins().load(I32, fixed, self.ctx, off);
                    vec![(d, self.fb.ins().splat(I32X4, x))]
                }
                _ => return false,
            },
            _ => return false,
        };
        // a guarded op keeps the old value in the lanes whose guard fails
        let on = (inst.guard != NONE).then(|| self.vtrue(Src::Reg(inst.guard), inst.guard_neg));
        for (d, v) in results {
            let var = self.vregs[d as usize].expect("a narrow destination");
            let v = match on {
                Some(on) => {
                    let old = self.fb.use_var(var);
                    self.fb.ins().bitselect(on, v, old)
                }
                None => v,
            };
            self.vdef(d, v, raw.filter(|_| on.is_none()));
        }
        if on.is_none() {
            self.vmasks.extend(masks);
        }
        true
    }

    /// `x * y` lane by lane: made once a call where both are block-wide
    /// special registers' values (`Translator::products`).
    fn product(&mut self, x: Value, y: Value) -> Value {
        match self.products.iter().find(|p| (p.0, p.1) == (x, y)) {
            Some(p) => p.2,
            None => self.fb.ins().imul(x, y),
        }
    }

    /// Predicate `s` (negated where `neg`) as masks in every lane (all
    /// ones where it holds), where the straight run knows them.
    fn vmask(&mut self, s: Src, neg: bool) -> Option<Value> {
        let (m, negated) = self.vmask_as_is(s)?;
        Some(if neg != negated {
            self.fb.ins().bnot(m)
        } else {
            m
        })
    }

    /// Predicate `s`'s mask as the run knows it, and whether that is the
    /// mask of its negation.
    fn vmask_as_is(&mut self, s: Src) -> Option<(Value, bool)> {
        match s {
            Src::Reg(r) => self.vmasks.iter().find(|m| m.0 == r).map(|m| (m.1, m.2)),
            Src::Imm(v) => Some((self.vsplat(if v & 1 != 0 { u32::MAX } else { 0 }), false)),
            Src::Frame(_) => None,
        }
    }

    /// Sets narrow register `d` to `v` (an I32X4) for every lane; `raw`:
    /// the `f32` lanes `v` was made canonical from ([`Translator::vraw`]).
    pub(super) fn vdef(&mut self, d: u32, v: Value, raw: Option<Value>) {
        let var = self.vregs[d as usize].expect("a narrow destination");
        self.fb.def_var(var, v);
        self.vmasks.retain(|x| x.0 != d);
        self.vraw.retain(|x| x.0 != d);
        if let Some(r) = raw {
            self.vraw.push((d, r));
        }
    }

    /// `s` for every lane (narrow): its vector, or an immediate's low 32
    /// bits in each lane (the ops above read no more of it).
    fn vsrc(&mut self, s: Src) -> Value {
        match s {
            Src::Reg(r) => {
                let var = self.vregs[r as usize].expect("a narrow source");
                self.fb.use_var(var)
            }
            Src::Imm(v) => self.vsplat(v as u32),
            Src::Frame(o) => self.vsplat(o),
        }
    }

    /// [`Self::vsrc`] for the other vector emitters.
    pub(super) fn vsrc_pub(&mut self, s: Src) -> Value {
        self.vsrc(s)
    }

    /// `v` in every lane; made once in the straight run of a basic block
    /// being emitted (vector ops branch nowhere, so it dominates the rest).
    fn vsplat(&mut self, v: u32) -> Value {
        if let Some(&(_, x)) = self.vconsts.iter().find(|c| c.0 == v) {
            return x;
        }
        // (from the constant pool: one load, not a move and a broadcast)
        let bytes: Vec<u8> = [v; 4].iter().flat_map(|w| w.to_le_bytes()).collect();
        let c = self.fb.func.dfg.constants.insert(ConstantData::from(bytes));
        let x = self.fb.ins().vconst(I32X4, c);
        self.vconsts.push((v, x));
        x
    }

    /// All ones in the lanes where predicate `s` is true (`neg`: false).
    fn vtrue(&mut self, s: Src, neg: bool) -> Value {
        if let Some(m) = self.vmask(s, neg) {
            return m;
        }
        let v = self.vsrc(s);
        let one = self.vsplat(1);
        let bit = self.fb.ins().band(v, one);
        let cc = if neg { IntCC::Equal } else { IntCC::NotEqual };
        let zero = self.vsplat(0);
        self.fb.ins().icmp(cc, bit, zero)
    }

    /// Sets narrow register `d` to `f32` lanes `r` as computed, made
    /// canonical where read ([`Lazy::Canon`]); true.
    fn vdef_raw(&mut self, d: u32, r: Value, apart: bool) -> bool {
        self.vraw.retain(|x| x.0 != d);
        self.vraw.push((d, r));
        self.vdef_lazy(d, Lazy::Canon { apart });
        true
    }

    pub(super) fn vfloat(&mut self, s: Src) -> Value {
        if let Src::Reg(r) = s {
            if let Some(&(_, raw)) = self.vraw.iter().find(|x| x.0 == r) {
                return raw;
            }
        }
        let v = self.vsrc(s);
        self.fb.ins().bitcast(F32X4, lanes_flags(), v)
    }

    /// The bits of `f32` lanes `f`, each NaN made canonical.
    pub(super) fn vcanon(&mut self, f: Value) -> Value {
        let nan = self.fb.ins().fcmp(FloatCC::Unordered, f, f);
        let nan = self.fb.ins().bitcast(I32X4, lanes_flags(), nan);
        let bits = self.fb.ins().bitcast(I32X4, lanes_flags(), f);
        let canon = self.vsplat(0x7fff_ffff);
        self.fb.ins().bitselect(nan, canon, bits)
    }

    /// `cmp` of `a` and `b` as 32-bit type `t` in every lane (all ones
    /// where it holds), if it has a vector form.
    fn vcompare(&mut self, cmp: Cmp, t: Ty, a: Src, b: Src) -> Option<Value> {
        if t == Ty::F32 {
            // OrderedNotEqual and UnorderedOrEqual have no vector form
            if matches!(cmp, Cmp::Ne | Cmp::Equ) {
                return None;
            }
            let cc = float_cc(cmp);
            let (x, y) = (self.vfloat(a), self.vfloat(b));
            let m = self.fb.ins().fcmp(cc, x, y);
            return Some(self.fb.ins().bitcast(I32X4, lanes_flags(), m));
        }
        let (x, y) = (self.vsrc(a), self.vsrc(b));
        Some(self.fb.ins().icmp(int_cc(cmp, t.signed()), x, y))
    }
}

/// Flags of a bitcast between vector types (lane order as in memory).
fn lanes_flags() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}
