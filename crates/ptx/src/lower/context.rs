//! The state of lowering one function (`FuncLower`): scopes of register and
//! symbol names, register and frame allocation, the code emitted so far, and
//! the resolution of operands to IR sources, destinations and addresses.

use super::error::{invalid, unsupported_at};
use super::layout::{align_up, float_bits};
use super::special::special_register;
use super::symbols::{Binding, Sym};
use crate::ast::{self, Operand};
use crate::ir::{Address, Inst, Op, Sp, Src, Ty, FUNC_WIN, MAX_FRAME_BYTES, MAX_REGS, NONE};
use crate::module_info::LoadError;
use std::collections::HashMap;

pub(super) struct FuncLower<'a> {
    pub(super) syms: &'a HashMap<String, Sym>,
    pub(super) funcs: &'a [&'a ast::Function],
    pub(super) scopes: Vec<HashMap<String, Binding>>,
    /// Register ranges `%r<N>`: prefix -> (first slot, count, type) per scope.
    pub(super) ranges: Vec<HashMap<String, (u32, u32, Ty)>>,
    pub(super) nregs: u32,
    pub(super) frame: u32,
    pub(super) code: Vec<Inst>,
    pub(super) labels: HashMap<String, u32>,
    pub(super) fixups: Vec<(usize, String, u32)>,
    pub(super) is_entry: bool,
    /// Hidden register holding the carry flag, allocated on first use.
    pub(super) cc: Option<u32>,
    pub(super) uses_volatile: bool,
    pub(super) line: u32,
}

impl<'a> FuncLower<'a> {
    pub(super) fn new(syms: &'a HashMap<String, Sym>, funcs: &'a [&'a ast::Function]) -> Self {
        FuncLower {
            syms,
            funcs,
            scopes: vec![HashMap::new()],
            ranges: vec![HashMap::new()],
            nregs: 0,
            frame: 0,
            code: Vec::new(),
            labels: HashMap::new(),
            fixups: Vec::new(),
            is_entry: false,
            cc: None,
            uses_volatile: false,
            line: 0,
        }
    }

    pub(super) fn unsupported<T>(&self, what: impl Into<String>) -> Result<T, LoadError> {
        Err(unsupported_at(self.line, what))
    }

    pub(super) fn alloc_frame(&mut self, size: u32, align: u32) -> Result<u32, LoadError> {
        let off = align_up(self.frame as u64, align.max(1) as u64);
        let end = off + size as u64;
        if end > MAX_FRAME_BYTES as u64 {
            return Err(invalid(self.line, "local frame too large"));
        }
        self.frame = end as u32;
        Ok(off as u32)
    }

    pub(super) fn new_reg(&mut self) -> Result<u32, LoadError> {
        if self.nregs >= MAX_REGS {
            return Err(invalid(self.line, "too many registers"));
        }
        self.nregs += 1;
        Ok(self.nregs - 1)
    }

    pub(super) fn emit(&mut self, op: Op) {
        self.code.push(Inst {
            guard: NONE,
            guard_neg: false,
            op,
            line: self.line,
        });
    }

    pub(super) fn lookup(&self, name: &str) -> Option<Binding> {
        for i in (0..self.scopes.len()).rev() {
            if let Some(b) = self.scopes[i].get(name) {
                return Some(*b);
            }
            // range registers: prefix + decimal index
            let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 && digits < name.len() {
                let (prefix, idx) = name.split_at(name.len() - digits);
                if let Some(&(first, n, t)) = self.ranges[i].get(prefix) {
                    if let Ok(k) = idx.parse::<u32>() {
                        if k < n && !(idx.len() > 1 && idx.starts_with('0')) {
                            return Some(Binding::Reg(first + k, t));
                        }
                    }
                }
            }
        }
        self.syms.get(name).map(|s| Binding::Sym(*s))
    }

    /// Destination register slot.
    pub(super) fn dst(&mut self, o: &Operand) -> Result<u32, LoadError> {
        match o {
            Operand::Name(n) => match self.lookup(n) {
                Some(Binding::Reg(r, _)) => Ok(r),
                _ => Err(invalid(self.line, format!("`{n}` is not a register"))),
            },
            Operand::Sink => self.new_reg(),
            _ => Err(invalid(self.line, "destination must be a register")),
        }
    }

    /// Source operand read as type `t`.
    pub(super) fn src(&mut self, o: &Operand, t: Ty) -> Result<Src, LoadError> {
        Ok(match o {
            Operand::Name(n) => {
                if let Some(b) = self.lookup(n) {
                    match b {
                        Binding::Reg(r, _) => Src::Reg(r),
                        Binding::Sym(s) => self.sym_value(s, 0)?,
                    }
                } else if let Some(sr) = special_register(n) {
                    let d = self.new_reg()?;
                    self.emit(Op::Special { d, r: sr });
                    Src::Reg(d)
                } else if n == "WARP_SZ" {
                    Src::Imm(32)
                } else {
                    return Err(invalid(self.line, format!("unknown name `{n}`")));
                }
            }
            Operand::NameOffset(n, off) => match self.lookup(n) {
                Some(Binding::Sym(s)) => self.sym_value(s, *off)?,
                _ => return Err(invalid(self.line, format!("unknown symbol `{n}`"))),
            },
            Operand::Int(v) => Src::Imm(*v as u64),
            Operand::Float(f) => Src::Imm(float_bits(*f, t)),
            Operand::FloatBits(b, w) => {
                let f = if *w == 4 {
                    f32::from_bits(*b as u32) as f64
                } else {
                    f64::from_bits(*b)
                };
                if t.is_float() && t.bytes() != *w {
                    Src::Imm(float_bits(f, t))
                } else {
                    Src::Imm(*b)
                }
            }
            Operand::Not(_) => return Err(invalid(self.line, "unexpected `!`")),
            Operand::Sink => Src::Imm(0),
            Operand::Vector(items) => {
                // packed source: build into a temp
                let bits = if items.is_empty() {
                    0
                } else {
                    t.bits() / items.len() as u32
                };
                let parts = self.src_list(items, Ty::B64)?;
                let d = self.new_reg()?;
                self.emit(Op::Pack { d, parts, bits });
                Src::Reg(d)
            }
            _ => return Err(invalid(self.line, "unsupported operand form")),
        })
    }

    pub(super) fn sym_value(&mut self, s: Sym, off: i64) -> Result<Src, LoadError> {
        Ok(match s {
            Sym::Global(a) => Src::Imm(a.wrapping_add(off as u64)),
            Sym::Shared(o) => Src::Imm(o.wrapping_add(off as u64)),
            Sym::Frame(o, _) => Src::Frame((o as i64).wrapping_add(off) as u32),
            Sym::KParam(o) => Src::Imm((o as i64).wrapping_add(off) as u64),
            Sym::Func(i) => Src::Imm(FUNC_WIN + i as u64),
        })
    }

    /// An `[addr]` operand in space `sp` (a frame symbol's `.param` is local).
    pub(super) fn address(&mut self, o: &Operand, sp: Sp) -> Result<Address, LoadError> {
        let Operand::Address { base, offset } = o else {
            return Err(invalid(self.line, "expected an address operand"));
        };
        let (sp, base, off) = match base {
            None => (sp, Src::Imm(*offset as u64), 0),
            Some(base) => match self.lookup(base) {
                Some(Binding::Reg(r, _)) => (sp, Src::Reg(r), *offset),
                Some(Binding::Sym(s)) => {
                    let sp = match (s, sp) {
                        (Sym::Frame(..), Sp::Param) => Sp::Local,
                        (_, sp) => sp,
                    };
                    (sp, self.sym_value(s, 0)?, *offset)
                }
                None => return Err(invalid(self.line, format!("unknown address base `{base}`"))),
            },
        };
        Ok(Address { sp, base, off })
    }

    pub(super) fn ty_of(&self, mods: &[String]) -> Option<Ty> {
        mods.iter().rev().find_map(|m| Ty::parse(m))
    }

    pub(super) fn need_ty(&self, mods: &[String]) -> Result<Ty, LoadError> {
        self.ty_of(mods)
            .ok_or_else(|| invalid(self.line, "instruction needs a type"))
    }

    pub(super) fn ops<'o>(
        &self,
        i: &'o ast::Instruction,
        n: usize,
    ) -> Result<&'o [Operand], LoadError> {
        if i.operands.len() < n {
            return Err(invalid(
                self.line,
                format!("`{}` needs {} operands", i.opcode, n),
            ));
        }
        Ok(&i.operands)
    }

    /// The operands of `i` (at least `n`) and the type it names.
    pub(super) fn typed_ops<'o>(
        &self,
        i: &'o ast::Instruction,
        n: usize,
    ) -> Result<(&'o [Operand], Ty), LoadError> {
        let o = self.ops(i, n)?;
        Ok((o, self.need_ty(&i.modifiers)?))
    }

    /// The destination `o[0]` and the sources `o[1..=N]`, read as `tys`.
    pub(super) fn dst_srcs<const N: usize>(
        &mut self,
        o: &[Operand],
        tys: [Ty; N],
    ) -> Result<(u32, [Src; N]), LoadError> {
        let d = self.dst(&o[0])?;
        Ok((d, self.srcs(&o[1..], tys)?))
    }

    /// The sources `o[..N]`, read as `tys`.
    pub(super) fn srcs<const N: usize>(
        &mut self,
        o: &[Operand],
        tys: [Ty; N],
    ) -> Result<[Src; N], LoadError> {
        let mut srcs = [Src::Imm(0); N];
        for (k, (s, t)) in srcs.iter_mut().zip(tys).enumerate() {
            *s = self.src(&o[k], t)?;
        }
        Ok(srcs)
    }

    pub(super) fn dsts(&mut self, o: &Operand) -> Result<([u32; 4], u8), LoadError> {
        let mut ds = [NONE; 4];
        match o {
            Operand::Vector(items) => {
                if items.len() > 4 || items.is_empty() {
                    return self.unsupported("vector wider than 4");
                }
                for (k, it) in items.iter().enumerate() {
                    ds[k] = self.dst(it)?;
                }
                Ok((ds, items.len() as u8))
            }
            x => {
                ds[0] = self.dst(x)?;
                Ok((ds, 1))
            }
        }
    }

    /// Destination registers of a list of operands.
    pub(super) fn dst_list(&mut self, items: &[Operand]) -> Result<Vec<u32>, LoadError> {
        items.iter().map(|d| self.dst(d)).collect()
    }

    /// Sources of a list of operands, each read as `t`.
    pub(super) fn src_list(&mut self, items: &[Operand], t: Ty) -> Result<Vec<Src>, LoadError> {
        items.iter().map(|s| self.src(s, t)).collect()
    }

    /// A destination with an optional second (predicate) one: `d` or `d|p`.
    pub(super) fn dst_pair(&mut self, o: &Operand) -> Result<(u32, u32), LoadError> {
        Ok(match o {
            Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
            x => (self.dst(x)?, NONE),
        })
    }

    /// A predicate source and whether it is negated: `p` or `!p`.
    pub(super) fn pred_src(&mut self, o: &Operand) -> Result<(Src, bool), LoadError> {
        Ok(match o {
            Operand::Not(n) => (self.src(&Operand::Name(n.clone()), Ty::Pred)?, true),
            x => (self.src(x, Ty::Pred)?, false),
        })
    }

    /// An optional source read as `t`, the immediate `default` when absent.
    pub(super) fn src_or(
        &mut self,
        o: Option<&Operand>,
        t: Ty,
        default: u64,
    ) -> Result<Src, LoadError> {
        match o {
            Some(x) => self.src(x, t),
            None => Ok(Src::Imm(default)),
        }
    }
}
