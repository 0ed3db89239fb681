//! Narrow registers the lane kernel makes late in a straight run: an `f32`
//! op's result made canonical where read, a covered shared word loaded at its
//! use (so an `fma` chain takes its loads as operands).

use super::lane_defs::unaligned;
use super::lane_defs::Lazy;
use super::narrow::plain;
use super::translate::Translator;
use crate::ir::{FOp, Inst, MemOrder, Op, Sp, Src, TernOp, Ty, NONE};
use cranelift_codegen::ir::types::{F32, F32X4, I32X4, I64};
use cranelift_codegen::ir::{
    Endianness, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Value,
};

impl Translator<'_, '_> {
    /// Whether `inst` leaves the run's lazy registers lazy: an unguarded
    /// `f32` `add`, `sub`, `mul`, `div` or `fma` of narrow registers (it
    /// reads them through [`Self::lazy_floats`]) or a covered shared word
    /// load whose lanes' way is known (it becomes lazy itself). Between
    /// such ops memory does not change, so a load made later reads what it
    /// would have read.
    pub(super) fn passes_lazy(&self, inst: &Inst) -> bool {
        if self.width == 1 || inst.guard != NONE {
            return false;
        }
        let narrow = |s: Src| match s {
            Src::Reg(r) => self.vregs[r as usize].is_some() && self.sregs[r as usize].is_none(),
            Src::Imm(_) => true,
            Src::Frame(_) => false,
        };
        match inst.op {
            Op::Tern {
                op: TernOp::Fma,
                t: Ty::F32,
                d,
                a,
                b,
                c,
                mode,
            } => plain(&mode) && [a, b, c, Src::Reg(d)].into_iter().all(narrow),
            Op::Float {
                op: FOp::Add | FOp::Sub | FOp::Mul | FOp::Div,
                t: Ty::F32,
                d,
                a,
                b,
                mode,
            } => plain(&mode) && [a, b, Src::Reg(d)].into_iter().all(narrow),
            Op::Ld {
                addr,
                size: 4,
                n: 1,
                ds,
                sext: false,
                order: MemOrder::Plain,
            } => {
                addr.sp == Sp::Shared
                    && self.covered(Sp::Shared)
                    && narrow(addr.base)
                    && narrow(Src::Reg(ds[0]))
                    && self
                        .lane_bases
                        .iter()
                        .any(|b| b.base == addr.base && b.mode.is_some())
            }
            _ => false,
        }
    }

    /// Sets narrow register `d` lazily to `how`.
    pub(super) fn vdef_lazy(&mut self, d: u32, how: Lazy) {
        self.vmasks.retain(|x| x.0 != d);
        self.lazy.retain(|x| x.0 != d);
        if !matches!(how, Lazy::Canon { .. }) {
            self.vraw.retain(|x| x.0 != d);
        }
        self.lazy.push((d, how));
    }

    /// The `f32` lanes of `srcs` for an op that [`Self::passes_lazy`]:
    /// a lazy load made here (a broadcast before a whole vector, so that
    /// the last load is the op's own operand), an `f32` op's raw result.
    pub(super) fn lazy_floats<const N: usize>(&mut self, srcs: [Src; N]) -> [Value; N] {
        let lazy_load = |t: &Self, s: Src| match s {
            Src::Reg(r) => t.lazy.iter().find(|x| x.0 == r).and_then(|x| match x.1 {
                Lazy::Load { p, same } => Some((p, same)),
                Lazy::Canon { .. } => None,
            }),
            _ => None,
        };
        let mut out: [Option<Value>; N] = [None; N];
        for pass in 0..3 {
            for (k, &s) in srcs.iter().enumerate() {
                let here = match lazy_load(self, s) {
                    Some((_, true)) => pass == 0,
                    Some((_, false)) => pass == 1,
                    None => pass == 2,
                };
                if !here || out[k].is_some() {
                    continue;
                }
                out[k] = Some(match lazy_load(self, s) {
                    Some((p, same)) => self.load_f32s(p, same),
                    None => self.vfloat(s),
                });
            }
        }
        out.map(|v| v.expect("every source made"))
    }

    /// Whether any of `srcs` is a load made late or an `f32` result of
    /// one (its chain keeps its loads as operands only where its end is
    /// made canonical apart).
    pub(super) fn reads_lazy_loads(&self, srcs: &[Src]) -> bool {
        srcs.iter().any(|&s| {
            let Src::Reg(r) = s else { return false };
            self.lazy
                .iter()
                .any(|x| x.0 == r && matches!(x.1, Lazy::Load { .. } | Lazy::Canon { apart: true }))
        })
    }

    /// Each lane's word at `p` on (all the word at `p` where `same`) as
    /// `f32` lanes.
    fn load_f32s(&mut self, p: Value, same: bool) -> Value {
        if same {
            let one = self.fb.ins().load(F32, unaligned(), p, 0);
            return self.fb.ins().splat(F32X4, one);
        }
        self.fb.ins().load(F32X4, unaligned(), p, 0)
    }

    /// Gives the run's lazy registers their values where something may
    /// read them from `pc` on (the rest of the basic block reads them, or
    /// any block has them live on entry); the others are dead.
    pub(super) fn settle_lazy(&mut self, pc: u32) {
        for (r, how) in std::mem::take(&mut self.lazy) {
            if !self.read_from(r, pc) {
                continue;
            }
            let v = match how {
                Lazy::Canon { apart } => {
                    let raw = self.vraw.iter().find(|x| x.0 == r).map(|x| x.1);
                    let raw = raw.expect("a lazy f32 result keeps its raw lanes");
                    if apart {
                        self.canon_apart(raw)
                    } else {
                        self.vcanon(raw)
                    }
                }
                Lazy::Load { p, same } => {
                    let f = self.load_f32s(p, same);
                    let flags = MemFlagsData::new().with_endianness(Endianness::Little);
                    self.fb.ins().bitcast(I32X4, flags, f)
                }
            };
            let var = self.vregs[r as usize].expect("a narrow register");
            self.fb.def_var(var, v);
        }
    }

    /// Whether register `r` may be read from `pc` on: in the rest of the
    /// basic block before an unguarded write (a guarded write keeps the
    /// old lanes, so reads them), or after it where any block has it live.
    fn read_from(&self, r: u32, pc: u32) -> bool {
        for inst in &self.func.code[pc as usize..self.block_end as usize] {
            let mut writes = false;
            inst.op.for_each_dst(|d| writes |= d == r);
            if inst.guard == r || inst.op.src_regs().contains(&r) || writes && inst.guard != NONE {
                return true;
            }
            if writes {
                return false;
            }
        }
        self.plan.live_in.iter().any(|l| l.contains(&r))
    }

    /// [`Self::vcanon`] of `raw` passed through the stack: the code
    /// generator counts an `fma`'s result read twice (as the canonical
    /// form reads it) as read twice all down its chain, which keeps every
    /// load of the chain out of its operands (a block parameter with one
    /// incoming value would be folded away).
    fn canon_apart(&mut self, raw: Value) -> Value {
        let slot =
            self.fb
                .create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 16, 4));
        self.fb.ins().stack_store(I64, raw, slot, 0);
        let x = self.fb.ins().stack_load(I64, F32X4, slot, 0);
        self.vcanon(x)
    }
}
