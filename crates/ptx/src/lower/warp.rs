//! Warp collectives to IR: `shfl`, `vote`, `match`, `redux`, `activemask`
//! and `bar.warp.sync`.

use super::context::FuncLower;
use super::modifiers::first_present;
use crate::ast;
use crate::ir::{Op, ReduxOp, ShflMode, Ty, VoteMode};
use crate::module_info::LoadError;

/// The member mask of a warp collective that names none.
const FULL_WARP: u64 = 0xffff_ffff;

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
        let o = self.ops(i, 4)?;
        let modes = [
            ("up", ShflMode::Up),
            ("down", ShflMode::Down),
            ("bfly", ShflMode::Bfly),
        ];
        let mode = first_present(&i.modifiers, &modes).unwrap_or(ShflMode::Idx);
        let (d, dp) = self.dst_pair(&o[0])?;
        let a = self.src(&o[1], Ty::B32)?;
        let b = self.src(&o[2], Ty::U32)?;
        let c = self.src(&o[3], Ty::U32)?;
        let mask = self.src_or(o.get(4), Ty::U32, FULL_WARP)?;
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
        let o = self.ops(i, 2)?;
        let modes = [
            ("all", VoteMode::All),
            ("any", VoteMode::Any),
            ("uni", VoteMode::Uni),
        ];
        let mode = first_present(&i.modifiers, &modes).unwrap_or(VoteMode::Ballot);
        let d = self.dst(&o[0])?;
        let (a, neg) = self.pred_src(&o[1])?;
        let mask = self.src_or(o.get(2), Ty::U32, FULL_WARP)?;
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
        let o = self.ops(i, 3)?;
        let t = self.need_ty(m)?;
        let (d, dp) = self.dst_pair(&o[0])?;
        let a = self.src(&o[1], t)?;
        let mask = self.src(&o[2], Ty::U32)?;
        self.emit(Op::Match {
            all: i.has("all"),
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
        let o = self.ops(i, 3)?;
        let t = self.need_ty(m)?;
        if t.is_float() {
            return self.unsupported("redux on floats");
        }
        let ops = [
            ("add", ReduxOp::Add),
            ("min", ReduxOp::Min),
            ("max", ReduxOp::Max),
            ("and", ReduxOp::And),
            ("or", ReduxOp::Or),
        ];
        let op = first_present(m, &ops).unwrap_or(ReduxOp::Xor);
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
