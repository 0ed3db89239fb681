//! One function's body to an `ir::Func`: its parameters (kernel parameters
//! or frame slots), scoped declarations, labels, the instructions, and the
//! branch targets fixed up once all labels are known.

use super::context::FuncLower;
use super::error::{invalid, unsupported_at};
use super::layout::{align_up, param_bytes, var_align, var_size};
use super::symbols::{Binding, Sym};
use crate::ast::{self, StateSpace, Statement};
use crate::ir::{Func, Op, Ty, MAX_REGS};
use crate::module_info::LoadError;
use std::collections::HashMap;

impl FuncLower<'_> {
    pub(super) fn lower(mut self, f: &ast::Function) -> Result<Func, LoadError> {
        self.is_entry = f.is_entry;
        self.line = f.line;
        let mut params = Vec::new();
        let mut rets = Vec::new();
        if f.is_entry {
            let mut off = 0u32;
            for p in &f.params {
                let (size, align) = param_bytes(p)?;
                off = align_up(off as u64, align as u64) as u32;
                self.scopes[0].insert(p.name.clone(), Binding::Sym(Sym::KParam(off)));
                off = off.saturating_add(size);
            }
        } else {
            for (list, out) in [(&f.returns, &mut rets), (&f.params, &mut params)] {
                for p in list.iter() {
                    let (size, align) = param_bytes(p)?;
                    let off = self.alloc_frame(size, align)?;
                    if p.is_reg {
                        return Err(unsupported_at(f.line, ".reg function parameters"));
                    } else {
                        self.scopes[0].insert(p.name.clone(), Binding::Sym(Sym::Frame(off, size)));
                        out.push((off, size));
                    }
                }
            }
        }
        if let Some(body) = &f.body {
            self.block(body)?;
        }
        // implicit return at the end
        self.emit(if f.is_entry { Op::Exit } else { Op::Ret });
        for (at, label, line) in std::mem::take(&mut self.fixups) {
            let Some(&target) = self.labels.get(&label) else {
                return Err(invalid(line, format!("unknown label {label}")));
            };
            if let Op::Bra { target: t } = &mut self.code[at].op {
                *t = target;
            }
        }
        Ok(Func {
            name: f.name.clone(),
            code: self.code,
            nregs: self.nregs.max(1),
            frame_bytes: align_up(self.frame as u64, 16) as u32,
            params,
            rets,
            uses_volatile: self.uses_volatile,
        })
    }

    fn block(&mut self, body: &[Statement]) -> Result<(), LoadError> {
        for s in body {
            match s {
                Statement::Label(l, line) => {
                    self.line = *line;
                    if self
                        .labels
                        .insert(l.clone(), self.code.len() as u32)
                        .is_some()
                    {
                        return Err(invalid(*line, format!("duplicate label {l}")));
                    }
                }
                Statement::Var(v) => self.var(v)?,
                Statement::Block(b) => {
                    self.scopes.push(HashMap::new());
                    self.ranges.push(HashMap::new());
                    let r = self.block(b);
                    self.scopes.pop();
                    self.ranges.pop();
                    r?;
                }
                Statement::Instr(i) => {
                    self.line = i.line;
                    self.instr(i)?;
                }
            }
        }
        Ok(())
    }

    fn var(&mut self, v: &ast::VarDecl) -> Result<(), LoadError> {
        self.line = v.line;
        let scope = self.scopes.len() - 1;
        match v.space {
            StateSpace::Reg => {
                let t = Ty::parse(&v.ty)
                    .ok_or_else(|| unsupported_at(v.line, format!("register type .{}", v.ty)))?;
                let t = if v.vector > 1 { Ty::B128 } else { t };
                if let Some(n) = v.range {
                    if self.nregs as u64 + n as u64 >= MAX_REGS as u64 {
                        return Err(invalid(v.line, "too many registers"));
                    }
                    let first = self.nregs;
                    self.nregs += n;
                    self.ranges[scope].insert(v.name.clone(), (first, n, t));
                } else {
                    let r = self.new_reg()?;
                    self.scopes[scope].insert(v.name.clone(), Binding::Reg(r, t));
                }
            }
            StateSpace::Local | StateSpace::Param => {
                let size = var_size(v)? as u32;
                let off = self.alloc_frame(size, var_align(v)? as u32)?;
                self.scopes[scope].insert(v.name.clone(), Binding::Sym(Sym::Frame(off, size)));
            }
            StateSpace::Shared => {} // laid out by collect_shared
            _ => return self.unsupported("global/const variable inside a function"),
        }
        Ok(())
    }
}
