//! Parameter loads at fixed addresses, made once per call of a compiled
//! kernel before its thread loop (parameters never change during a launch).

use super::runtime::Ctx;
use crate::ir::{Op, Sp, Src};
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
