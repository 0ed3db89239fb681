//! Sizes, alignments and initial bytes of PTX variables and parameters, and
//! float literals as register bits.

use super::error::{invalid, unsupported_at};
use super::symbols::Sym;
use crate::ast::{self, Initializer};
use crate::ir::{Ty, FUNC_WIN};
use crate::module_info::LoadError;
use std::collections::HashMap;

/// Largest size of any single variable (bytes).
const MAX_VAR: u64 = 1 << 30;

pub(super) fn align_up(v: u64, a: u64) -> u64 {
    let a = a.max(1);
    v.div_ceil(a).saturating_mul(a)
}

pub(super) fn var_elem_bytes(v: &ast::VarDecl) -> Result<u64, LoadError> {
    let t = Ty::parse(&v.ty).ok_or_else(|| unsupported_at(v.line, format!("type .{}", v.ty)))?;
    Ok(t.bytes() as u64 * v.vector.max(1) as u64)
}

pub(super) fn var_size(v: &ast::VarDecl) -> Result<u64, LoadError> {
    let mut n = var_elem_bytes(v)?;
    for d in &v.dims {
        n = n.saturating_mul(d.unwrap_or(0));
    }
    if n > MAX_VAR {
        return Err(invalid(v.line, format!("variable {} too large", v.name)));
    }
    Ok(n)
}

pub(super) fn var_align(v: &ast::VarDecl) -> Result<u64, LoadError> {
    let a = v.align.map(u64::from).unwrap_or(var_elem_bytes(v)?).max(1);
    if !a.is_power_of_two() || a > 4096 {
        return Err(invalid(v.line, "bad alignment"));
    }
    Ok(a)
}

pub(super) fn param_bytes(p: &ast::Param) -> Result<(u32, u32), LoadError> {
    let t = Ty::parse(&p.ty).ok_or_else(|| unsupported_at(0, format!("param type .{}", p.ty)))?;
    let size = (t.bytes() as u64).saturating_mul(p.array.unwrap_or(1));
    if size > 1 << 16 {
        return Err(invalid(0, format!("parameter {} too large", p.name)));
    }
    let align = p.align.unwrap_or(t.bytes()).max(1);
    if !align.is_power_of_two() || align > 256 {
        return Err(invalid(0, "bad parameter alignment"));
    }
    Ok((size as u32, align))
}

/// Writes an initializer into `out` (element type `t`), resolving symbols.
pub(super) fn write_init(
    init: &Initializer,
    t: Ty,
    out: &mut Vec<u8>,
    syms: &HashMap<String, Sym>,
    line: u32,
) -> Result<(), LoadError> {
    let n = t.bytes() as usize;
    let put = |v: u64, out: &mut Vec<u8>| out.extend_from_slice(&v.to_le_bytes()[..n.min(8)]);
    match init {
        Initializer::List(items) => {
            for i in items {
                write_init(i, t, out, syms, line)?;
            }
        }
        Initializer::Int(v) => put(*v as u64, out),
        Initializer::Float(f) => put(float_bits(*f, t), out),
        Initializer::FloatBits(b, w) => {
            let f = if *w == 4 {
                f32::from_bits(*b as u32) as f64
            } else {
                f64::from_bits(*b)
            };
            if t.is_float() {
                put(float_bits(f, t), out)
            } else {
                put(*b, out)
            }
        }
        Initializer::Symbol { name, offset, .. } => match syms.get(name) {
            Some(Sym::Global(a)) => put(a.wrapping_add(*offset as u64), out),
            Some(Sym::Func(i)) => put(FUNC_WIN + *i as u64, out),
            _ => {
                return Err(invalid(
                    line,
                    format!("unknown symbol {name} in initializer"),
                ))
            }
        },
    }
    Ok(())
}

pub(super) fn float_bits(f: f64, t: Ty) -> u64 {
    match t {
        Ty::F32 => (f as f32).to_bits() as u64,
        Ty::F16 => half::f16::from_f64(f).to_bits() as u64,
        Ty::BF16 => half::bf16::from_f64(f).to_bits() as u64,
        _ => f.to_bits(),
    }
}
