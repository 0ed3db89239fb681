//! Memory instructions to IR: `ld`/`ldu`, `st`, `atom`/`red`, `cp.async`, `mbarrier`,
//! `cvta`, `isspacep`, and fences and hints (no-ops here).

use super::context::FuncLower;
use super::error::invalid;
use super::modifiers::{order_of, sp_of};
use super::symbols::Binding;
use crate::ast::{self, Operand};
use crate::ir::{Address, AtomOp, MbarKind, Op, Sp, Src, Ty, NONE};
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
            order: order_of(m),
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
            order: order_of(m),
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
        if i.has("mbarrier") && !i.has("bulk") {
            // `cp.async.mbarrier.arrive[.noinc].b64 [addr]`
            let o = self.ops(i, 1)?;
            let addr = self.address(&o[0], sp_of(&i.modifiers).unwrap_or(Sp::Generic))?;
            let noinc = i.has("noinc");
            self.emit(Op::Mbarrier {
                kind: MbarKind::CopiesArrive { noinc },
                d: NONE,
                addr,
                a: Src::Imm(0),
            });
            return Ok(());
        }
        if i.has("bulk") {
            return self.unsupported("cp.async.bulk (tensor memory access)");
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

    /// `mbarrier`: init, arrive (and `arrive_drop`), test_wait and try_wait
    /// (of a state or a phase parity), pending_count and inval, on a barrier
    /// object in shared memory. The transaction counts of `cp.async.bulk`
    /// (`expect_tx`, `complete_tx`) are refused, as is the cluster's window.
    pub(super) fn lower_mbarrier(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        if m.iter().any(|x| x.contains("tx") || x.contains("cluster")) {
            return self.unsupported("mbarrier transaction counts or cluster barriers");
        }
        let sp = sp_of(m).unwrap_or(Sp::Generic);
        let no_addr = Address {
            sp: Sp::Shared,
            base: Src::Imm(0),
            off: 0,
        };
        let op = |kind, d, addr, a| Op::Mbarrier { kind, d, addr, a };
        let first = m.first().map(String::as_str).unwrap_or("");
        let emitted = match first {
            "init" => {
                let o = self.ops(i, 2)?;
                let addr = self.address(&o[0], sp)?;
                let count = self.src(&o[1], Ty::U32)?;
                op(MbarKind::Init, NONE, addr, count)
            }
            "inval" => {
                let o = self.ops(i, 1)?;
                let addr = self.address(&o[0], sp)?;
                op(MbarKind::Inval, NONE, addr, Src::Imm(0))
            }
            "arrive" | "arrive_drop" => {
                let o = self.ops(i, 2)?;
                let d = match &o[0] {
                    Operand::Sink => NONE,
                    x => self.dst(x)?,
                };
                let addr = self.address(&o[1], sp)?;
                let count = self.src_or(o.get(2), Ty::U32, 1)?;
                let drop = first == "arrive_drop";
                op(MbarKind::Arrive { drop }, d, addr, count)
            }
            "test_wait" | "try_wait" => {
                // a try_wait's time limit (a fourth operand) only bounds its wait
                let o = self.ops(i, 3)?;
                let d = self.dst(&o[0])?;
                let addr = self.address(&o[1], sp)?;
                let parity = i.has("parity");
                let a = self.src(&o[2], if parity { Ty::U32 } else { Ty::U64 })?;
                op(MbarKind::Wait { parity }, d, addr, a)
            }
            "pending_count" => {
                let o = self.ops(i, 2)?;
                let d = self.dst(&o[0])?;
                let state = self.src(&o[1], Ty::U64)?;
                op(MbarKind::PendingCount, d, no_addr, state)
            }
            other => return self.unsupported(format!("mbarrier.{other}")),
        };
        self.emit(emitted);
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
        if i.opcode == "nanosleep" {
            let o = self.ops(i, 1)?;
            let ns = self.src(&o[0], Ty::U32)?;
            self.emit(Op::Sleep { ns });
        } else if i.opcode == "createpolicy" {
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
