//! Comparisons to IR: `setp` (with its boolean combination), `set`, `testp`.

use super::context::FuncLower;
use super::error::invalid;
use super::modifiers::{cmp_of, first_present};
use crate::ast;
use crate::ir::{BoolOp, Op, Src, Ty};
use crate::module_info::LoadError;

impl FuncLower<'_> {
    /// `setp`, with its optional boolean combination and second destination.
    pub(super) fn lower_setp(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let ftz = i.has("ftz");
        let (o, t) = self.typed_ops(i, 3)?;
        let cmp = m
            .iter()
            .find_map(|x| cmp_of(x))
            .ok_or_else(|| invalid(self.line, "setp needs a comparison"))?;
        let bops = [
            ("and", BoolOp::And),
            ("or", BoolOp::Or),
            ("xor", BoolOp::Xor),
        ];
        let bop = first_present(m, &bops).unwrap_or(BoolOp::None);
        let (d, d2) = self.dst_pair(&o[0])?;
        let a = self.src(&o[1], t)?;
        let b = self.src(&o[2], t)?;
        let (c, cneg) = if bop != BoolOp::None {
            match o.get(3) {
                Some(x) => self.pred_src(x)?,
                None => return Err(invalid(self.line, "setp with bool op needs a predicate")),
            }
        } else {
            (Src::Imm(1), false)
        };
        self.emit(Op::Setp {
            cmp,
            t,
            d,
            d2,
            a,
            b,
            bop,
            c,
            cneg,
            ftz,
        });
        Ok(())
    }

    /// `set.cmp.dtype`: all ones (or 1.0) when the comparison holds.
    pub(super) fn lower_set(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let o = self.ops(i, 3)?;
        let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
        if tys.len() < 2 || m.iter().any(|x| matches!(x.as_str(), "and" | "or" | "xor")) {
            return self.unsupported("set form");
        }
        let cmp = m
            .iter()
            .find_map(|x| cmp_of(x))
            .ok_or_else(|| invalid(self.line, "set needs a comparison"))?;
        let (d, [a, b]) = self.dst_srcs(o, [tys[1], tys[1]])?;
        self.emit(Op::Set {
            cmp,
            t: tys[1],
            dt: tys[0],
            d,
            a,
            b,
        });
        Ok(())
    }

    /// `testp`: float class tests.
    pub(super) fn lower_testp(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let (o, t) = self.typed_ops(i, 2)?;
        let classes = [
            ("finite", 0),
            ("infinite", 1),
            ("number", 2),
            ("notanumber", 3),
            ("normal", 4),
        ];
        // subnormal otherwise
        let kind = first_present(m, &classes).unwrap_or(5);
        let (d, [a]) = self.dst_srcs(o, [t])?;
        self.emit(Op::Testp { d, a, t, kind });
        Ok(())
    }
}
