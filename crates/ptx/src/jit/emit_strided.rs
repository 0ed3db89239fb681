//! The lane kernel's strided registers (`strides::wide_strides`): 64-bit values
//! whose lanes differ by a stride known before the run, kept as lane 0's value.

use super::lane_defs::add_imm;
use super::lanes::LANES;
use super::runtime::{window_base, RET_PARTED};
use super::strides::{ext32, extended_stride};
use super::translate::Translator;
use crate::ir::{IntOp, Op, Src, Ty};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I64, I64X2};
use cranelift_codegen::ir::{ConstantData, InstBuilder, Value};

impl Translator<'_, '_> {
    /// Register `r`'s lane-0 variable and stride, if it is strided.
    pub(super) fn strided(&self, r: u32) -> Option<(cranelift_frontend::Variable, u64)> {
        self.sregs.get(r as usize).copied().flatten()
    }

    /// Emits instruction `pc` when it writes a strided register (every such
    /// write is unguarded and one of the ops `wide_strides` follows);
    /// whether it did.
    pub(super) fn strided_op(&mut self, pc: u32) -> bool {
        let op = &self.ops[pc as usize];
        let mut dst = None;
        op.for_each_dst(|d| dst = dst.or(self.strided(d).map(|(v, _)| v)));
        let Some(var) = dst else {
            return false;
        };
        let int = |t: Ty| !t.is_float() && !matches!(t, Ty::Pred | Ty::B128);
        let v = match *op {
            Op::Ld { addr, size: 8, .. } => self
                .hoisted_param(&addr, 8, 1)
                .map(|(v, _)| v)
                .expect("a strided register's parameter load is hoisted"),
            Op::Mov { a, .. } => self.lane0(a),
            Op::Int { op, t, a, b, .. } if int(t) && t.bits() == 64 => {
                let x = self.lane0(a);
                match (op, b) {
                    (IntOp::Add, _) => {
                        let y = self.lane0(b);
                        self.fb.ins().iadd(x, y)
                    }
                    (IntOp::Sub, _) => {
                        let y = self.lane0(b);
                        self.fb.ins().isub(x, y)
                    }
                    (IntOp::Shl, Src::Imm(n)) => self.fb.ins().ishl_imm_u(x, n as i64),
                    _ => unreachable!("a strided register's write: {op:?}"),
                }
            }
            Op::Int {
                op: IntOp::MulWide,
                t,
                a,
                b,
                ..
            } => {
                let signed = t.signed();
                let (a, b) = match a {
                    Src::Imm(_) => (b, a),
                    _ => (a, b),
                };
                let x = self.extended0(a, signed);
                match b {
                    Src::Imm(k) => {
                        let k = ext32(k, signed);
                        if k.is_power_of_two() {
                            self.fb.ins().ishl_imm_u(x, k.trailing_zeros() as i64)
                        } else {
                            self.fb.ins().imul_imm_s(x, k as i64)
                        }
                    }
                    _ => {
                        let y = self.extended0(b, signed);
                        self.fb.ins().imul(x, y)
                    }
                }
            }
            Op::Cvt { a, st, .. } => match st.bits() {
                32 => self.extended0(a, st.signed()),
                _ => self.lane0(a),
            },
            Op::Cvta {
                a, sp, to_generic, ..
            } => {
                let x = self.lane0(a);
                let win = window_base(sp) as i64;
                let win = if to_generic { win } else { win.wrapping_neg() };
                add_imm(&mut self.fb, x, win)
            }
            _ => unreachable!("a strided register's write: {op:?}"),
        };
        self.fb.def_var(var, v);
        true
    }

    /// Lane 0's 64-bit value of `s`: a strided register, a narrow one the
    /// same in every lane (zero-extended), an immediate.
    fn lane0(&mut self, s: Src) -> Value {
        match s {
            Src::Reg(r) => {
                if let Some((var, _)) = self.strided(r) {
                    return self.fb.use_var(var);
                }
                let v = self.vregs[r as usize].expect("a narrow or strided source");
                let all = self.fb.use_var(v);
                let x = self.fb.ins().extractlane(all, 0);
                self.fb.ins().uextend(I64, x)
            }
            Src::Imm(k) => self.fb.ins().iconst(I64, k as i64),
            Src::Frame(_) => unreachable!("a frame address is not strided"),
        }
    }

    /// Lane 0's value of narrow `s` extended to 64 bits, `signed` or not,
    /// where its lanes do not wrap across the extension's range (checked
    /// for a register with a stride; where they do, the group gives up).
    fn extended0(&mut self, s: Src, signed: bool) -> Value {
        let r = match s {
            Src::Imm(k) => return self.fb.ins().iconst(I64, ext32(k, signed) as i64),
            Src::Reg(r) => r,
            Src::Frame(_) => unreachable!("a frame address is not strided"),
        };
        let v = self.vregs[r as usize].expect("a narrow source");
        let all = self.fb.use_var(v);
        let x = self.fb.ins().extractlane(all, 0);
        let stride = self.strides[r as usize]
            .and_then(extended_stride)
            .expect("a strided source");
        // (a block's check proved every lane's value in range: `jit::hoist`)
        let pc = self.pc_now;
        let proven = self.hoist.is_some_and(|h| h.widened.contains(&pc));
        if stride != 0 && !proven {
            // the last lane's value, lane 0's plus (LANES - 1) strides,
            // stays in the extension's range
            let span = stride * (LANES as i64 - 1);
            let (min, max) = if signed {
                (i32::MIN as i64, i32::MAX as i64)
            } else {
                (0, u32::MAX as i64)
            };
            let (cc, bound) = match (span > 0, signed) {
                (true, true) => (IntCC::SignedLessThanOrEqual, max - span),
                (true, false) => (IntCC::UnsignedLessThanOrEqual, max - span),
                (false, true) => (IntCC::SignedGreaterThanOrEqual, min - span),
                (false, false) => (IntCC::UnsignedGreaterThanOrEqual, min - span),
            };
            let fits = self.fb.ins().icmp_imm_u(cc, x, bound as u32 as i64);
            let (on, wraps) = (self.fb.create_block(), self.fb.create_block());
            self.fb.ins().brif(fits, on, &[], wraps, &[]);
            self.fb.switch_to_block(wraps);
            self.fb.set_cold_block(wraps);
            self.finish_all(RET_PARTED);
            self.fb.switch_to_block(on);
        }
        if signed {
            self.fb.ins().sextend(I64, x)
        } else {
            self.fb.ins().uextend(I64, x)
        }
    }

    /// Lane `lane`'s value of strided register `r` (an I64).
    pub(super) fn strided_at(&mut self, r: u32, lane: usize) -> Value {
        let (var, stride) = self.strided(r).expect("a strided register");
        let v = self.fb.use_var(var);
        match stride.wrapping_mul(lane as u64) {
            0 => v,
            k => add_imm(&mut self.fb, v, k as i64),
        }
    }

    /// Every lane's value of strided register `r` (two I64X2: lanes 0 and
    /// 1, lanes 2 and 3).
    pub(super) fn strided_lanes(&mut self, r: u32) -> [Value; 2] {
        let (var, stride) = self.strided(r).expect("a strided register");
        let v = self.fb.use_var(var);
        let all = self.fb.ins().splat(I64X2, v);
        if stride == 0 {
            return [all, all];
        }
        [[0u64, 1], [2, 3]].map(|ks| {
            let bytes: Vec<u8> = ks
                .iter()
                .flat_map(|k| stride.wrapping_mul(*k).to_le_bytes())
                .collect();
            let c = self.fb.func.dfg.constants.insert(ConstantData::from(bytes));
            let steps = self.fb.ins().vconst(I64X2, c);
            self.fb.ins().iadd(all, steps)
        })
    }

    /// For a global access at strided base `addr`: lane 0's address (an
    /// I64) and the stride between the lanes' addresses.
    pub(super) fn strided_address(&mut self, base: Src, off: i64) -> Option<(Value, u64)> {
        let Src::Reg(r) = base else {
            return None;
        };
        let (var, stride) = self.strided(r)?;
        let v = self.fb.use_var(var);
        Some((add_imm(&mut self.fb, v, off), stride))
    }
}
