//! Warp collectives to IR: `shfl`, `vote`, `match`, `redux`, `activemask`
//! and `bar.warp.sync`.

use super::context::FuncLower;
use crate::ast::{self, Operand};
use crate::ir::{Op, ReduxOp, ShflMode, Src, Ty, VoteMode, NONE};
use crate::module_info::LoadError;

impl FuncLower<'_> {
    /// `bar.warp.sync`.
    pub(super) fn lower_bar_warp_sync(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let o = self.ops(i, 1)?;
        let mask = self.src(&o[0], Ty::B32)?;
        self.emit(Op::WarpSync { mask });
        Ok(())
    }

    /// `shfl.sync`, with its optional predicate destination.
    pub(super) fn lower_shfl(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let has = |s: &str| m.iter().any(|x| x == s);
        let o = self.ops(i, 4)?;
        let mode = if has("up") {
            ShflMode::Up
        } else if has("down") {
            ShflMode::Down
        } else if has("bfly") {
            ShflMode::Bfly
        } else {
            ShflMode::Idx
        };
        let (d, dp) = match &o[0] {
            Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
            x => (self.dst(x)?, NONE),
        };
        let a = self.src(&o[1], Ty::B32)?;
        let b = self.src(&o[2], Ty::U32)?;
        let c = self.src(&o[3], Ty::U32)?;
        let mask = match o.get(4) {
            Some(x) => self.src(x, Ty::U32)?,
            None => Src::Imm(0xffff_ffff),
        };
        self.emit(Op::Shfl {
            mode,
            d,
            dp,
            a,
            b,
            c,
            mask,
        });
        Ok(())
    }

    /// `vote.sync`.
    pub(super) fn lower_vote(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let has = |s: &str| m.iter().any(|x| x == s);
        let o = self.ops(i, 2)?;
        let mode = if has("all") {
            VoteMode::All
        } else if has("any") {
            VoteMode::Any
        } else if has("uni") {
            VoteMode::Uni
        } else {
            VoteMode::Ballot
        };
        let d = self.dst(&o[0])?;
        let (a, neg) = match &o[1] {
            Operand::Not(n) => (self.src(&Operand::Name(n.clone()), Ty::Pred)?, true),
            x => (self.src(x, Ty::Pred)?, false),
        };
        let mask = match o.get(2) {
            Some(x) => self.src(x, Ty::U32)?,
            None => Src::Imm(0xffff_ffff),
        };
        self.emit(Op::Vote {
            mode,
            d,
            a,
            neg,
            mask,
        });
        Ok(())
    }

    /// `match.any.sync` / `match.all.sync`.
    pub(super) fn lower_match(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let has = |s: &str| m.iter().any(|x| x == s);
        let o = self.ops(i, 3)?;
        let t = self.need_ty(m)?;
        let (d, dp) = match &o[0] {
            Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
            x => (self.dst(x)?, NONE),
        };
        let a = self.src(&o[1], t)?;
        let mask = self.src(&o[2], Ty::U32)?;
        self.emit(Op::Match {
            all: has("all"),
            d,
            dp,
            a,
            wide: t.bytes() == 8,
            mask,
        });
        Ok(())
    }

    /// `redux.sync` on integers.
    pub(super) fn lower_redux(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let has = |s: &str| m.iter().any(|x| x == s);
        let o = self.ops(i, 3)?;
        let t = self.need_ty(m)?;
        if t.is_float() {
            return self.unsupported("redux on floats");
        }
        let op = if has("add") {
            ReduxOp::Add
        } else if has("min") {
            ReduxOp::Min
        } else if has("max") {
            ReduxOp::Max
        } else if has("and") {
            ReduxOp::And
        } else if has("or") {
            ReduxOp::Or
        } else {
            ReduxOp::Xor
        };
        let d = self.dst(&o[0])?;
        let a = self.src(&o[1], t)?;
        let mask = self.src(&o[2], Ty::U32)?;
        self.emit(Op::Redux {
            op,
            signed: t.signed(),
            d,
            a,
            mask,
        });
        Ok(())
    }

    /// `activemask`.
    pub(super) fn lower_activemask(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let o = self.ops(i, 1)?;
        let d = self.dst(&o[0])?;
        self.emit(Op::Activemask { d });
        Ok(())
    }
}
