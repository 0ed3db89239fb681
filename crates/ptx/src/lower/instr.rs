//! One PTX instruction to IR ops: `.relu` and guard predicates, then the
//! instruction's family (`arith`, `compare`, `memory`, `control`, `warp`,
//! `tensor`) by opcode.

use super::context::FuncLower;
use super::error::invalid;
use super::symbols::Binding;
use crate::ast::{self, Operand};
use crate::ir::{Op, Ty, NONE};
use crate::module_info::LoadError;

impl FuncLower<'_> {
    /// Lowers instruction `i`; its guard applies to its main (last) op.
    pub(super) fn instr(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        if i.has("relu") {
            // `.relu`: the result clamped at zero (NaN stays NaN), as a second op
            let mut plain = i.clone();
            plain.modifiers.retain(|m| m != "relu");
            let dt = match i.opcode.as_str() {
                "cvt" => i.modifiers.iter().find_map(|m| Ty::parse(m)),
                _ => i.modifiers.iter().rev().find_map(|m| Ty::parse(m)),
            };
            let Some(t) = dt.filter(|t| t.is_float()) else {
                return self.unsupported(".relu on this instruction");
            };
            self.instr(&plain)?;
            let Some(Operand::Name(dn)) = i.operands.first() else {
                return Err(invalid(self.line, ".relu needs a register destination"));
            };
            let Some(Binding::Reg(d, _)) = self.lookup(dn) else {
                return Err(invalid(self.line, ".relu needs a register destination"));
            };
            self.emit(Op::Relu { d, t });
            if let Some(g) = &i.guard {
                if let Some(Binding::Reg(r, _)) = self.lookup(&g.reg) {
                    if let Some(last) = self.code.last_mut() {
                        last.guard = r;
                        last.guard_neg = g.negated;
                    }
                }
            }
            return Ok(());
        }
        let guard = match &i.guard {
            None => (NONE, false),
            Some(g) => match self.lookup(&g.reg) {
                Some(Binding::Reg(r, _)) => (r, g.negated),
                _ => return Err(invalid(self.line, format!("unknown predicate `{}`", g.reg))),
            },
        };
        let start = self.code.len();
        self.instr_body(i)?;
        // guard applies to the instruction's main op (the last one emitted);
        // helper ops (special register reads, packs) before it are harmless.
        if guard.0 != NONE && self.code.len() > start {
            if let Some(last) = self.code.last_mut() {
                last.guard = guard.0;
                last.guard_neg = guard.1;
            }
        }
        Ok(())
    }

    /// Lowers `i` by its opcode, without guard or `.relu`.
    fn instr_body(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        if i.has("volatile") {
            self.uses_volatile = true;
        }
        match i.opcode.as_str() {
            // arithmetic and logic
            "mov" => self.lower_mov(i),
            "add" | "sub" | "mad" | "addc" | "subc" | "madc"
                if i.has("cc") || i.opcode.ends_with('c') =>
            {
                self.lower_carry(i)
            }
            "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor"
            | "shl" | "shr" | "copysign" | "mul24" | "bmsk" => self.lower_binary(i),
            "not" | "neg" | "abs" | "popc" | "clz" | "brev" | "bfind" | "cnot" | "sqrt"
            | "rsqrt" | "rcp" | "sin" | "cos" | "ex2" | "lg2" | "tanh" => self.lower_unary(i),
            "mad" | "fma" | "selp" | "bfe" | "sad" | "slct" | "shf" | "dp4a" | "dp2a" | "mad24" => {
                self.lower_ternary(i)
            }
            "bfi" => self.lower_bfi(i),
            "prmt" => self.lower_prmt(i),
            "lop3" => self.lower_lop3(i),
            "cvt" => self.lower_cvt(i),
            // comparisons
            "setp" => self.lower_setp(i),
            "set" => self.lower_set(i),
            "testp" => self.lower_testp(i),
            // memory
            "ld" | "ldu" => self.lower_ld(i),
            "st" => self.lower_st(i),
            "cvta" => self.lower_cvta(i),
            "isspacep" => self.lower_isspacep(i),
            "cp" if i.has("async") => self.lower_cp_async(i),
            "mbarrier" => self.lower_mbarrier(i),
            "atom" | "red" => self.lower_atom(i),
            "membar" | "fence" | "prefetch" | "prefetchu" | "nanosleep" | "pmevent"
            | "griddepcontrol" | "discard" | "applypriority" | "createpolicy" | "mbarrier_nop" => {
                self.lower_hint(i)
            }
            // control flow
            "bra" | "brx" => self.lower_branch(i),
            "ret" => {
                self.emit(if self.is_entry { Op::Exit } else { Op::Ret });
                Ok(())
            }
            "exit" => {
                self.emit(Op::Exit);
                Ok(())
            }
            "trap" => {
                self.emit(Op::Trap("trap instruction".into()));
                Ok(())
            }
            "brkpt" => {
                self.emit(Op::Trap("breakpoint instruction".into()));
                Ok(())
            }
            "call" => self.lower_call(i),
            "bar" | "barrier" if i.has("warp") => self.lower_bar_warp_sync(i),
            "bar" | "barrier" => self.lower_barrier(i),
            // warp collectives
            "shfl" => self.lower_shfl(i),
            "vote" => self.lower_vote(i),
            "match" => self.lower_match(i),
            "redux" => self.lower_redux(i),
            "activemask" => self.lower_activemask(i),
            // tensor cores
            "wmma" => self.lower_wmma(i),
            "mma" => self.lower_mma(i),
            "ldmatrix" => self.lower_ldmatrix(i),
            other => self.unsupported(format!("instruction `{other}`")),
        }
    }
}
