//! The lane kernel's vector-wide registers (`narrow::wide_vector_regs`): 64-bit
//! address arithmetic as two vectors of 64-bit lanes, parameter loads as one value for every lane.

use super::runtime::window_base;
use super::translate::{Translator, WideFact};
use crate::ir::{Address, IntOp, Op, Src, Ty, NONE};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4, I64, I64X2};
use cranelift_codegen::ir::{ConstantData, InstBuilder, Value};

impl Translator<'_, '_> {
    /// Emits instruction `pc` as vector ops when it is unguarded, writes a
    /// vector-wide register and has a vector form, or loads a hoisted
    /// parameter into a narrow or vector-wide one; whether it did.
    pub(super) fn wide_op(&mut self, pc: u32) -> bool {
        if self.func.code[pc as usize].guard != NONE || self.width != 4 {
            return false;
        }
        let op = &self.ops[pc as usize];
        if let Op::Ld {
            addr,
            size,
            n: 1,
            ds,
            sext,
            ..
        } = *op
        {
            return self.uniform_param(&addr, size, ds[0], sext);
        }
        let mut dst = NONE;
        op.for_each_dst(|d| dst = d);
        if dst == NONE || self.wregs[dst as usize].is_none() {
            return false;
        }
        let halves = match *op {
            Op::Mov { a, mask, .. } if mask == u64::MAX => self.wsrc(a),
            Op::Int { op, t, a, b, .. } if !t.is_float() && t.bits() == 64 => match (op, b) {
                (IntOp::Add | IntOp::Sub, _) => match (self.wsrc(a), self.wsrc(b)) {
                    (Some(x), Some(y)) => Some([0, 1].map(|k| match op {
                        IntOp::Add => self.fb.ins().iadd(x[k], y[k]),
                        _ => self.fb.ins().isub(x[k], y[k]),
                    })),
                    _ => None,
                },
                (IntOp::Shl, Src::Imm(n)) if n < 64 => self
                    .wsrc(a)
                    .map(|x| x.map(|h| self.fb.ins().ishl_imm_u(h, n as i64))),
                _ => None,
            },
            Op::Int {
                op: IntOp::MulWide,
                t,
                a,
                b,
                ..
            } if t.bits() == 32 && !t.is_float() => self.mul_wide(a, b, t.signed()),
            Op::Cvta {
                a, sp, to_generic, ..
            } => {
                let win = window_base(sp) as i64;
                let win = if to_generic { win } else { win.wrapping_neg() };
                match self.wsrc(a) {
                    Some(x) if win == 0 => Some(x),
                    Some(x) => {
                        let w = self.wsplat(win as u64);
                        Some(x.map(|h| self.fb.ins().iadd(h, w)))
                    }
                    None => None,
                }
            }
            Op::Cvt {
                a, dt, st, mode, ..
            } if !mode.sat && !mode.ftz && int(dt) && int(st) && dt.bits() == 64 => {
                match st.bits() {
                    32 => self.widen32(a, st.signed()),
                    64 => self.wsrc(a),
                    _ => None,
                }
            }
            _ => None,
        };
        let Some(halves) = halves else {
            return false;
        };
        self.wdef(dst, halves);
        if let Some(fact) = self.wide_fact_of(op) {
            self.wfacts.push((dst, fact));
        }
        true
    }

    /// What is known of the lanes of the register op `op` (emitted as
    /// vector ops) writes, from what is known of its sources.
    fn wide_fact_of(&self, op: &Op) -> Option<WideFact> {
        let uniform = |s: Src| match s {
            Src::Imm(_) => true,
            Src::Reg(r) => self.uniform[r as usize],
            Src::Frame(_) => false,
        };
        // a uniform value added keeps how the lanes lie
        let offset = |s: Src| match s {
            Src::Reg(r) => Some(match self.wide_fact(r) {
                Some(WideFact::Offset { root }) => WideFact::Offset { root },
                _ => WideFact::Offset { root: r },
            }),
            _ => None,
        };
        match *op {
            Op::Int {
                op: IntOp::Add,
                a,
                b,
                ..
            } if uniform(a) => offset(b),
            Op::Int {
                op: IntOp::Add | IntOp::Sub,
                a,
                b,
                ..
            } if uniform(b) => offset(a),
            _ => None,
        }
    }

    /// What the run knows of register `r`'s lanes.
    fn wide_fact(&self, r: u32) -> Option<WideFact> {
        self.wfacts.iter().rev().find(|f| f.0 == r).map(|f| f.1)
    }

    /// Drops what the run knew of register `r` and of those whose lanes
    /// lie as its did (it is about to be written).
    pub(super) fn forget_wide(&mut self, r: u32) {
        self.wfacts
            .retain(|&(d, f)| d != r && !matches!(f, WideFact::Offset { root } if root == r));
        self.wconsecutive.retain(|&(root, _)| root != r);
    }

    /// Sets vector-wide register `d` to `halves` for every lane.
    fn wdef(&mut self, d: u32, halves: [Value; 2]) {
        let vars = self.wregs[d as usize].expect("a vector-wide destination");
        for (var, h) in vars.into_iter().zip(halves) {
            self.fb.def_var(var, h);
        }
    }

    /// `s` as 64 bits for every lane (two I64X2), if it is a vector-wide
    /// register, a narrow one (zero above) or an immediate.
    pub(super) fn wsrc(&mut self, s: Src) -> Option<[Value; 2]> {
        match s {
            Src::Reg(r) => {
                if let Some(vars) = self.wregs[r as usize] {
                    return Some(vars.map(|v| self.fb.use_var(v)));
                }
                if self.sregs[r as usize].is_some() {
                    return Some(self.strided_lanes(r));
                }
                let v = self.vregs[r as usize]?;
                let x = self.fb.use_var(v);
                Some([self.fb.ins().uwiden_low(x), self.fb.ins().uwiden_high(x)])
            }
            Src::Imm(k) => {
                let x = self.wsplat(k);
                Some([x, x])
            }
            Src::Frame(_) => None,
        }
    }

    /// The 32-bit `s` (narrow or an immediate) extended to 64 bits, signed
    /// or not, for every lane.
    fn widen32(&mut self, s: Src, signed: bool) -> Option<[Value; 2]> {
        match s {
            Src::Reg(r) => {
                let v = self.vregs[r as usize]?;
                let x = self.fb.use_var(v);
                Some(if signed {
                    [self.fb.ins().swiden_low(x), self.fb.ins().swiden_high(x)]
                } else {
                    [self.fb.ins().uwiden_low(x), self.fb.ins().uwiden_high(x)]
                })
            }
            Src::Imm(k) => {
                let x = self.wsplat(ext32(k, signed));
                Some([x, x])
            }
            Src::Frame(_) => None,
        }
    }

    /// `mul.wide` of 32-bit `a` and `b` (narrow or immediates): the 64-bit
    /// product for every lane (a shift for a power of two).
    fn mul_wide(&mut self, a: Src, b: Src, signed: bool) -> Option<[Value; 2]> {
        let (a, b) = match a {
            Src::Imm(_) => (b, a),
            _ => (a, b),
        };
        let x = self.widen32(a, signed)?;
        if let Src::Imm(k) = b {
            let k = ext32(k, signed);
            if k.is_power_of_two() {
                let n = k.trailing_zeros() as i64;
                return Some(x.map(|h| self.fb.ins().ishl_imm_u(h, n)));
            }
        }
        let y = self.widen32(b, signed)?;
        Some([0, 1].map(|k| self.fb.ins().imul(x[k], y[k])))
    }

    /// `v` in both 64-bit lanes.
    fn wsplat(&mut self, v: u64) -> Value {
        let x = self.fb.ins().iconst(I64, v as i64);
        self.fb.ins().splat(I64X2, x)
    }

    /// A load of a parameter hoisted before the thread loop into narrow or
    /// vector-wide register `d`: the one value in every lane (the lane
    /// kernel runs only where every hoisted parameter is in); whether it did.
    fn uniform_param(&mut self, addr: &Address, size: u32, d: u32, sext: bool) -> bool {
        let narrow = self.vregs[d as usize].is_some() && size <= 4 && !sext;
        let wide = self.wregs[d as usize].is_some() && size == 8;
        let Some((v, _)) = self.hoisted_param(addr, size, 1).filter(|_| narrow || wide) else {
            return false;
        };
        // (made in every lane with the loads, before the group loop)
        let k = self.params.values.iter().position(|p| p.1 == v);
        let splat = k.and_then(|k| self.params.splats.get(k).copied());
        if narrow {
            let x = match splat {
                Some(x) if size == 4 => x,
                _ => {
                    let x = self.fb.ins().ireduce(I32, v);
                    self.fb.ins().splat(I32X4, x)
                }
            };
            self.vdef(d, x, None);
        } else {
            let x = match splat {
                Some(x) => x,
                None => self.fb.ins().splat(I64X2, v),
            };
            self.wdef(d, [x, x]);
        }
        true
    }

    /// For a global access at vector-wide base `addr`: every lane's address
    /// (two I64X2), the first lane's (an I64), and whether the lanes'
    /// addresses are consecutive words (an I8 condition).
    pub(super) fn wide_addresses(&mut self, addr: &Address) -> Option<([Value; 2], Value, Value)> {
        let Src::Reg(r) = addr.base else {
            return None;
        };
        self.wregs[r as usize]?;
        let mut at = self.wsrc(addr.base)?;
        if addr.off != 0 {
            let off = self.wsplat(addr.off as u64);
            at = at.map(|h| self.fb.ins().iadd(h, off));
        }
        let first = self.fb.ins().extractlane(at[0], 0);
        // a base that is a uniform value plus a register whose lanes were
        // found consecutive (or not) in this run lies the same way
        let root = match self.wide_fact(r) {
            Some(WideFact::Offset { root }) => Some(root),
            _ => None,
        };
        let known = root.and_then(|root| self.wconsecutive.iter().find(|c| c.0 == root));
        if let Some(&(_, consecutive)) = known {
            return Some((at, first, consecutive));
        }
        let all_first = self.fb.ins().splat(I64X2, first);
        let mut same = None;
        for (k, words) in [[0u64, 4], [8, 12]].into_iter().enumerate() {
            let bytes: Vec<u8> = words.iter().flat_map(|v| v.to_le_bytes()).collect();
            let c = self.fb.func.dfg.constants.insert(ConstantData::from(bytes));
            let steps = self.fb.ins().vconst(I64X2, c);
            let want = self.fb.ins().iadd(all_first, steps);
            let eq = self.fb.ins().icmp(IntCC::Equal, at[k], want);
            same = Some(match same {
                Some(s) => self.fb.ins().band(s, eq),
                None => eq,
            });
        }
        let consecutive = self.fb.ins().vall_true(same.expect("two halves"));
        if let Some(root) = root {
            self.wconsecutive.push((root, consecutive));
        }
        Some((at, first, consecutive))
    }
}

/// Whether `t` is an integer type of a register op.
fn int(t: Ty) -> bool {
    !t.is_float() && !matches!(t, Ty::Pred | Ty::B128)
}

/// The low 32 bits of `k`, sign- or zero-extended.
fn ext32(k: u64, signed: bool) -> u64 {
    if signed {
        k as u32 as i32 as i64 as u64
    } else {
        k as u32 as u64
    }
}
