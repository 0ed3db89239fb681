//! Tensor-core instructions to IR: `wmma` m16n16k16 loads, stores and
//! multiply-adds, `mma.sync` m16n8k16/m16n8k8, and `ldmatrix`.

use super::context::FuncLower;
use super::error::invalid;
use super::modifiers::{first_present, sp_of};
use crate::ast::{self, Operand};
use crate::ir::{MmaOperands, Op, Sp, Src, Ty, WmmaTile};
use crate::module_info::LoadError;

/// The registers of a vector operand.
fn any_vector(o: &Operand) -> Option<&Vec<Operand>> {
    match o {
        Operand::Vector(v) => Some(v),
        _ => None,
    }
}

/// The registers of a `wmma` fragment: a vector of 1 to 8.
fn wmma_fragment(o: &Operand) -> Option<&Vec<Operand>> {
    any_vector(o).filter(|v| !v.is_empty() && v.len() <= 8)
}

impl FuncLower<'_> {
    /// The operands of an `mma`-like op of element types `(dty, ab, cty)`:
    /// its `d, a, b, c` fragments are register vectors as `fragment` accepts
    /// them, the sources read as `.b32` before `d`.
    fn mma_operands(
        &mut self,
        o: &[Operand],
        (dty, ab, cty): (Ty, Ty, Ty),
        fragment: fn(&Operand) -> Option<&Vec<Operand>>,
        what: &str,
    ) -> Result<MmaOperands, LoadError> {
        let mut src: [Vec<Src>; 3] = Default::default();
        for (s, op) in src.iter_mut().zip(&o[1..4]) {
            let Some(items) = fragment(op) else {
                return Err(invalid(self.line, format!("{what} needs register vectors")));
            };
            *s = self.src_list(items, Ty::B32)?;
        }
        let Some(ditems) = fragment(&o[0]) else {
            return Err(invalid(
                self.line,
                format!("{what} needs a destination vector"),
            ));
        };
        Ok(MmaOperands {
            ab,
            cty,
            dty,
            satfinite: false,
            d: self.dst_list(ditems)?,
            src,
        })
    }

    /// `wmma.load`, `wmma.store` and `wmma.mma` of m16n16k16 tiles.
    pub(super) fn lower_wmma(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        if !i.has("m16n16k16") {
            return self.unsupported("wmma shape other than m16n16k16");
        }
        let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
        let float = |t: &Ty| matches!(t, Ty::F16 | Ty::BF16 | Ty::F32);
        // integer tiles: `.s8`/`.u8` inputs, `.s32` accumulators (as on a
        // 7.2+ GPU; the sub-byte `.s4`/`.u4`/`.b1` shapes are others)
        let int = |t: &Ty| matches!(t, Ty::S8 | Ty::U8 | Ty::S32);
        if tys.is_empty() || !(tys.iter().all(float) || tys.iter().all(int)) {
            let named: Vec<&str> = m
                .iter()
                .filter(|x| Ty::parse(x).is_some())
                .map(String::as_str)
                .collect();
            return self.unsupported(format!(
                "wmma of element type .{}: only f16, bf16, s8 and u8 run on the CPU device",
                named.join(".")
            ));
        }
        if i.has("load") || i.has("store") {
            let o = self.ops(i, 2)?;
            let (vec_op, addr_op) = if i.has("load") {
                (&o[0], &o[1])
            } else {
                (&o[1], &o[0])
            };
            let Some(items) = wmma_fragment(vec_op) else {
                return Err(invalid(self.line, "wmma needs a register vector"));
            };
            let tile = WmmaTile {
                ety: tys[tys.len() - 1],
                row: i.has("row"),
                addr: self.address(addr_op, sp_of(m).unwrap_or(Sp::Generic))?,
                stride: self.src_or(o.get(2), Ty::U32, 16)?,
            };
            let op = if i.has("load") {
                Op::WmmaLoad {
                    tile,
                    ds: self.dst_list(items)?,
                }
            } else {
                Op::WmmaStore {
                    tile,
                    vals: self.src_list(items, Ty::B32)?,
                }
            };
            self.emit(op);
            return Ok(());
        }
        if !i.has("mma") {
            return self.unsupported("wmma form");
        }
        let o = self.ops(i, 4)?;
        let types = match tys.as_slice() {
            [d, c] => (*d, Ty::F16, *c),
            [d, a, _, c] => (*d, *a, *c),
            _ => return self.unsupported("wmma.mma types"),
        };
        let (d, ab, c) = types;
        let integer = matches!(ab, Ty::S8 | Ty::U8);
        if integer != (d == Ty::S32 && c == Ty::S32) {
            return self.unsupported("wmma.mma of mixed integer and float types");
        }
        let mut mma = self.mma_operands(o, types, wmma_fragment, "wmma.mma")?;
        mma.satfinite = i.has("satfinite");
        self.emit(Op::WmmaMma { mma: Box::new(mma) });
        Ok(())
    }

    /// `mma.sync` m16n8k16 / m16n8k8, f16/bf16 inputs, `.row.col`.
    pub(super) fn lower_mma(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let Some(k) = first_present(m, &[("m16n8k16", 16), ("m16n8k8", 8)]) else {
            return self.unsupported("mma shape other than m16n8k16 / m16n8k8");
        };
        if !(i.has("row") && i.has("col")) {
            return self.unsupported("mma layout other than .row.col");
        }
        let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
        let (dty, ab, cty) = match tys.as_slice() {
            [d, a, b, c] if a == b && matches!(a, Ty::F16 | Ty::BF16) => (*d, *a, *c),
            _ => return self.unsupported("mma types"),
        };
        if !matches!(dty, Ty::F32 | Ty::F16)
            || !matches!(cty, Ty::F32 | Ty::F16)
            || (ab == Ty::BF16 && k == 8 && dty != Ty::F32)
        {
            return self.unsupported("mma accumulator type");
        }
        let o = self.ops(i, 4)?;
        let mma = self.mma_operands(o, (dty, ab, cty), any_vector, "mma")?;
        self.emit(Op::Mma {
            k,
            mma: Box::new(mma),
        });
        Ok(())
    }

    /// `ldmatrix.m8n8.x{1,2,4}[.trans].b16`.
    pub(super) fn lower_ldmatrix(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        if !i.has("m8n8") || !i.has("b16") {
            return self.unsupported("ldmatrix shape other than m8n8.b16");
        }
        let num = first_present(m, &[("x4", 4), ("x2", 2)]).unwrap_or(1);
        let o = self.ops(i, 2)?;
        let Some(items) = any_vector(&o[0]) else {
            return Err(invalid(self.line, "ldmatrix needs a register vector"));
        };
        if items.len() != num {
            return Err(invalid(self.line, "ldmatrix vector size does not match .x"));
        }
        let ds = self.dst_list(items)?;
        let addr = self.address(&o[1], sp_of(m).unwrap_or(Sp::Generic))?;
        self.emit(Op::Ldmatrix {
            num: num as u8,
            trans: i.has("trans"),
            ds,
            addr,
        });
        Ok(())
    }
}
