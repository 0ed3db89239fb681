//! Parameter loads at fixed addresses and block-wide special registers, made
//! once per call of a compiled kernel before its thread loop (fixed for it).

use super::runtime::Ctx;
use crate::ir::{IntOp, Op, SReg, Sp, Src, TernOp};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{I32, I32X4, I64, I64X2};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value};
use cranelift_frontend::FunctionBuilder;
use std::mem::offset_of;

/// The kernel's parameter loads at fixed addresses, loaded once for a call
/// of the compiled code (parameters never change during a launch).
pub(super) struct HoistedParams {
    /// (address, bytes) → the value there (the launch's parameter buffer
    /// is padded to `extent` bytes, so each load reads inside it).
    pub values: Vec<((u64, u32), Value)>,
    /// Whether every one of them is inside the launch's parameters (else
    /// each takes its own checked path).
    pub all_in: Option<Value>,
    /// The end of the furthest of them.
    pub extent: u64,
    /// For the lane kernel, each value in every lane (an I64X2 for 8
    /// bytes, an I32X4 for fewer), made once with the loads.
    pub splats: Vec<Value>,
}

/// The parameter loads of `ops` at fixed, aligned addresses (at most 64 of
/// them) that [`hoist_params`] makes: (address, bytes) each.
pub(super) fn hoisted_loads(ops: &[Op]) -> Vec<(u64, u32)> {
    let mut wanted: Vec<(u64, u32)> = Vec::new();
    for op in ops {
        if let Op::Ld {
            addr, size, n: 1, ..
        } = *op
        {
            if let (Sp::Param, Src::Imm(b)) = (addr.sp, addr.base) {
                let at = b.wrapping_add(addr.off as u64);
                let fits = at % size as u64 == 0 && at < 1 << 16;
                if fits && !wanted.contains(&(at, size)) && wanted.len() < 64 {
                    wanted.push((at, size));
                }
            }
        }
    }
    wanted
}

/// Loads the parameters `ops` read at fixed, aligned addresses (at most 64
/// of them), at the point `fb` is at.
/// The lane kernel (`lanes`) also gets each in every lane.
pub(super) fn hoist_params(
    fb: &mut FunctionBuilder<'_>,
    ctx: Value,
    ops: &[Op],
    lanes: bool,
) -> HoistedParams {
    let wanted = hoisted_loads(ops);
    let extent = wanted.iter().map(|&(a, s)| a + s as u64).max().unwrap_or(0);
    if wanted.is_empty() {
        return HoistedParams {
            values: Vec::new(),
            all_in: None,
            extent,
            splats: Vec::new(),
        };
    }
    let fixed = MemFlagsData::trusted().with_readonly();
    let base = fb
        .ins()
        .load(I64, fixed, ctx, offset_of!(Ctx<'static>, params) as i32);
    let len = fb
        .ins()
        .load(I64, fixed, ctx, offset_of!(Ctx<'static>, params_len) as i32);
    let all_in = fb
        .ins()
        .icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, len, extent as i64);
    let values: Vec<((u64, u32), Value)> = wanted
        .into_iter()
        .map(|(at, size)| {
            let off = at as i32;
            let v = match size {
                1 => fb.ins().uload8(I64, fixed, base, off),
                2 => fb.ins().uload16(I64, fixed, base, off),
                4 => fb.ins().uload32(fixed, base, off),
                _ => fb.ins().load(I64, fixed, base, off),
            };
            ((at, size), v)
        })
        .collect();
    let splats = values
        .iter()
        .filter(|_| lanes)
        .map(|&((_, size), v)| {
            if size == 8 {
                fb.ins().splat(I64X2, v)
            } else {
                let x = fb.ins().ireduce(I32, v);
                fb.ins().splat(I32X4, x)
            }
        })
        .collect();
    HoistedParams {
        values,
        all_in: Some(all_in),
        extent,
        splats,
    }
}

/// The lane kernel's (`lanes`) block-wide special registers, in every lane
/// (`%ntid`, `%ctaid`, `%nctaid`: the same for the whole call), and the
/// products of two of them a `mad.lo` or `mul.lo` may read (vector add's
/// `%ctaid.x * %ntid.x`), made once a call: (the two values, the product)
/// for `Translator::product`, which uses one only where its operands are
/// those very values.
pub(super) type Specials = (Vec<(SReg, Value)>, Vec<(Value, Value, Value)>);

/// [`Specials`] of `ops`, loaded and made before the call's loop.
pub(super) fn hoist_specials(
    fb: &mut FunctionBuilder,
    ctx: Value,
    ops: &[Op],
    lanes: bool,
) -> Specials {
    let mut specials = Vec::new();
    if !lanes {
        return (specials, Vec::new());
    }
    let field = |f: usize, k: u8| (f + 4 * k as usize) as i32;
    for op in ops {
        if let Op::Special { r, .. } = *op {
            let off = match r {
                SReg::Ntid(k) if k < 3 => field(offset_of!(Ctx, ntid), k),
                SReg::Ctaid(k) if k < 3 => field(offset_of!(Ctx, ctaid), k),
                SReg::Nctaid(k) if k < 3 => field(offset_of!(Ctx, nctaid), k),
                _ => continue,
            };
            if specials.iter().any(|&(s, _)| s == r) {
                continue;
            }
            let fixed = MemFlagsData::trusted().with_readonly();
            let x = fb.ins().load(I32, fixed, ctx, off);
            specials.push((r, fb.ins().splat(I32X4, x)));
        }
    }
    // the special a register holds where a special or its copy wrote it
    let written = |r: u32| {
        ops.iter().find(|op| {
            let mut w = false;
            op.for_each_dst(|d| w |= d == r);
            w
        })
    };
    let special_of = |r: u32| {
        let s = match written(r)? {
            Op::Special { r: s, .. } => *s,
            Op::Mov { a: Src::Reg(t), .. } => match written(*t)? {
                Op::Special { r: s, .. } => *s,
                _ => return None,
            },
            _ => return None,
        };
        specials.iter().find(|x| x.0 == s).map(|x| x.1)
    };
    let mut products: Vec<(Value, Value, Value)> = Vec::new();
    for op in ops {
        let (a, b) = match *op {
            Op::Tern {
                op: TernOp::MadLo,
                a: Src::Reg(a),
                b: Src::Reg(b),
                ..
            }
            | Op::Int {
                op: IntOp::MulLo,
                a: Src::Reg(a),
                b: Src::Reg(b),
                ..
            } => (a, b),
            _ => continue,
        };
        if let (Some(x), Some(y)) = (special_of(a), special_of(b)) {
            if !products.iter().any(|p| (p.0, p.1) == (x, y)) {
                products.push((x, y, fb.ins().imul(x, y)));
            }
        }
    }
    (specials, products)
}
