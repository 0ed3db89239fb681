//! Warp collectives to IR: `shfl`, `vote`, `match`, `redux`, `activemask`
//! and `bar.warp.sync`.

use super::context::FuncLower;
use super::modifiers::first_present;
use crate::ast;
use crate::ir::{Op, ReduxOp, ShflMode, Src, Ty, VoteMode};
use crate::module_info::LoadError;

/// The member mask of a warp collective that names none.
const FULL_WARP: u64 = 0xffff_ffff;

/// The `shfl` modes other than `.idx`, by modifier.
const SHFL_MODES: [(&str, ShflMode); 3] = [
    ("up", ShflMode::Up),
    ("down", ShflMode::Down),
    ("bfly", ShflMode::Bfly),
];

/// The `vote` modes other than `.ballot`, by modifier.
const VOTE_MODES: [(&str, VoteMode); 3] = [
    ("all", VoteMode::All),
    ("any", VoteMode::Any),
    ("uni", VoteMode::Uni),
];

impl FuncLower<'_> {
    /// The member mask of a warp collective: operand `o`, or the full warp.
    fn member_mask(&mut self, o: Option<&ast::Operand>) -> Result<Src, LoadError> {
        self.src_or(o, Ty::U32, FULL_WARP)
    }

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
        let mode = first_present(&i.modifiers, &SHFL_MODES).unwrap_or(ShflMode::Idx);
        let (d, dp) = self.dst_pair(&o[0])?;
        let [a, b, c] = self.srcs(&o[1..], [Ty::B32, Ty::U32, Ty::U32])?;
        let op = Op::Shfl {
            mode,
            d,
            dp,
            a,
            b,
            c,
            mask: self.member_mask(o.get(4))?,
        };
        self.emit(op);
        Ok(())
    }

    /// `vote.sync`.
    pub(super) fn lower_vote(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let o = self.ops(i, 2)?;
        let mode = first_present(&i.modifiers, &VOTE_MODES).unwrap_or(VoteMode::Ballot);
        let d = self.dst(&o[0])?;
        let (a, neg) = self.pred_src(&o[1])?;
        let op = Op::Vote {
            mode,
            d,
            a,
            neg,
            mask: self.member_mask(o.get(2))?,
        };
        self.emit(op);
        Ok(())
    }

    /// `match.any.sync` / `match.all.sync`.
    pub(super) fn lower_match(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let (o, t) = self.typed_ops(i, 3)?;
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
        let (o, t) = self.typed_ops(i, 3)?;
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
        let (d, [a, mask]) = self.dst_srcs(o, [t, Ty::U32])?;
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
