//! Memory instructions to IR: `ld`/`ldu`, `st`, `atom`/`red`, `cp.async`,
//! `cvta`, `isspacep`, and fences and hints (no-ops here).

use super::context::FuncLower;
use super::error::invalid;
use super::modifiers::sp_of;
use super::symbols::Binding;
use crate::ast::{self, Operand};
use crate::ir::{AtomOp, Op, Sp, Src, Ty, NONE};
use crate::module_info::LoadError;

impl FuncLower<'_> {
    /// `ld`/`ldu`, scalar or vector.
    pub(super) fn lower_ld(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let (o, t) = self.typed_ops(i, 2)?;
        let addr = self.address(&o[1], sp_of(m).unwrap_or(Sp::Generic))?;
        if t == Ty::B128 {
            return self.unsupported("128-bit load");
        }
        let (ds, n) = self.dsts(&o[0])?;
        self.emit(Op::Ld {
            addr,
            size: t.bytes(),
            n,
            ds,
            sext: t.signed(),
        });
        Ok(())
    }

    /// `st`, scalar or vector.
    pub(super) fn lower_st(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let (o, t) = self.typed_ops(i, 2)?;
        let addr = self.address(&o[0], sp_of(m).unwrap_or(Sp::Generic))?;
        let mut vals = [Src::Imm(0); 4];
        let n = match &o[1] {
            Operand::Vector(items) => {
                if items.len() > 4 || items.is_empty() {
                    return self.unsupported("vector store wider than 4");
                }
                for (k, it) in items.iter().enumerate() {
                    vals[k] = self.src(it, t)?;
                }
                items.len() as u8
            }
            other => {
                vals[0] = self.src(other, t)?;
                1
            }
        };
        if t == Ty::B128 {
            return self.unsupported("128-bit store");
        }
        self.emit(Op::St {
            addr,
            size: t.bytes(),
            n,
            vals,
        });
        Ok(())
    }

    /// `cvta`: between a space's own addresses and generic ones.
    pub(super) fn lower_cvta(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let o = self.ops(i, 2)?;
        let to = i.has("to");
        let sp = sp_of(m).unwrap_or(Sp::Global);
        let (d, [a]) = self.dst_srcs(o, [Ty::U64])?;
        self.emit(Op::Cvta {
            d,
            a,
            sp,
            to_generic: !to,
        });
        Ok(())
    }

    /// `isspacep`: whether a generic address lies in a space.
    pub(super) fn lower_isspacep(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let o = self.ops(i, 2)?;
        let sp = sp_of(m).unwrap_or(Sp::Global);
        let (d, [a]) = self.dst_srcs(o, [Ty::U64])?;
        self.emit(Op::Isspacep { d, a, sp });
        Ok(())
    }

    /// `cp.async` (done at once) and its group commits and waits (no-ops).
    pub(super) fn lower_cp_async(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        if i.has("commit_group") || i.has("wait_group") || i.has("wait_all") {
            self.emit(Op::Nop);
            return Ok(());
        }
        if i.has("bulk") || i.has("mbarrier") {
            return self.unsupported("cp.async.bulk / mbarrier forms");
        }
        let o = self.ops(i, 3)?;
        // the copy reads generic addresses and writes shared ones, whatever
        // space the operands name
        let dst = self.address(&o[0], Sp::Shared)?;
        let src = self.address(&o[1], Sp::Global)?;
        let size = match &o[2] {
            Operand::Int(v) if matches!(*v, 4 | 8 | 16) => *v as u32,
            _ => return Err(invalid(self.line, "cp.async size must be 4, 8 or 16")),
        };
        // optional: a source size (or an ignore-source predicate), then a
        // cache policy when `.L2::cache_hint` is named
        let hinted = i.modifiers.iter().any(|m| m.ends_with("cache_hint"));
        let extra = &o[3..o.len() - usize::from(hinted && o.len() > 3)];
        let src_size = match extra.first() {
            Some(x) if self.is_predicate(x) => self.ignore_source(x, size)?,
            x => self.src_or(x, Ty::U32, size as u64)?,
        };
        self.emit(Op::CpAsync {
            dst: dst.base,
            doff: dst.off,
            src: src.base,
            soff: src.off,
            size,
            src_size,
        });
        Ok(())
    }

    /// Whether operand `o` names a predicate register (or its negation).
    fn is_predicate(&self, o: &Operand) -> bool {
        let name = match o {
            Operand::Name(n) | Operand::Not(n) => n,
            _ => return false,
        };
        matches!(self.lookup(name), Some(Binding::Reg(_, Ty::Pred)))
    }

    /// The source size of a `cp.async` whose `ignore-src` predicate is `o`:
    /// 0 bytes (all zeros) when it holds, else all `size` bytes.
    fn ignore_source(&mut self, o: &Operand, size: u32) -> Result<Src, LoadError> {
        let (p, negated) = self.pred_src(o)?;
        let Src::Reg(p) = p else {
            return Err(invalid(
                self.line,
                "cp.async ignore-src must be a predicate register",
            ));
        };
        let d = self.new_reg()?;
        for (value, guard_neg) in [(0, negated), (size as u64, !negated)] {
            self.emit(Op::Mov {
                d,
                a: Src::Imm(value),
                mask: u64::MAX,
            });
            if let Some(inst) = self.code.last_mut() {
                inst.guard = p;
                inst.guard_neg = guard_neg;
            }
        }
        Ok(Src::Reg(d))
    }

    /// `atom` and `red`.
    pub(super) fn lower_atom(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let is_red = i.opcode == "red";
        let (o, t) = self.typed_ops(i, if is_red { 2 } else { 3 })?;
        let sp = sp_of(m).unwrap_or(Sp::Generic);
        let op = m
            .iter()
            .find_map(|x| {
                Some(match x.as_str() {
                    "add" => AtomOp::Add,
                    "min" => AtomOp::Min,
                    "max" => AtomOp::Max,
                    "inc" => AtomOp::Inc,
                    "dec" => AtomOp::Dec,
                    "exch" => AtomOp::Exch,
                    "cas" => AtomOp::Cas,
                    "and" => AtomOp::And,
                    "or" => AtomOp::Or,
                    "xor" => AtomOp::Xor,
                    _ => return None,
                })
            })
            .ok_or_else(|| invalid(self.line, "atom needs an operation"))?;
        if i.has("v2") || i.has("v4") || i.has("v8") {
            return self.unsupported("vector atomics");
        }
        if t.is_float()
            && !matches!(
                op,
                AtomOp::Add | AtomOp::Exch | AtomOp::Min | AtomOp::Max | AtomOp::Cas
            )
        {
            return self.unsupported("float atomic op");
        }
        if t.bytes() < 2 || t == Ty::B128 {
            return self.unsupported("atomic width");
        }
        let (d, rest) = if is_red {
            (NONE, o)
        } else {
            (self.dst(&o[0])?, &o[1..])
        };
        let addr = self.address(&rest[0], sp)?;
        let b = self.src(&rest[1], t)?;
        let c = self.src_or(rest.get(2), t, 0)?;
        self.emit(Op::Atom {
            addr,
            op,
            t,
            d,
            b,
            c,
        });
        Ok(())
    }

    /// Fences, prefetches and scheduling hints: no-ops for the interpreter
    /// (`createpolicy` gives a zero policy).
    pub(super) fn lower_hint(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        if i.opcode == "createpolicy" {
            let o = self.ops(i, 1)?;
            let d = self.dst(&o[0])?;
            self.emit(Op::Mov {
                d,
                a: Src::Imm(0),
                mask: u64::MAX,
            });
        } else {
            self.emit(Op::Nop)
        }
        Ok(())
    }
}
