//! The compiled code's instruction count, kept in the context
//! (`Ctx::instructions`) all along rather than in a register.

use super::runtime::Ctx;
use cranelift_codegen::ir::types::I64;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value};
use cranelift_frontend::FunctionBuilder;
use std::mem::offset_of;

/// Where the count lies in the context.
const AT: i32 = offset_of!(Ctx<'static>, instructions) as i32;

/// The block's count so far (an I64).
pub(super) fn count_now(fb: &mut FunctionBuilder, ctx: Value) -> Value {
    fb.ins().load(I64, MemFlagsData::trusted(), ctx, AT)
}

/// Adds `n` (an I64) to the count: one add to memory (the load and store
/// fold into it), where the count held in a variable was spilled and
/// reloaded around most basic blocks of a long run.
pub(super) fn count_add(fb: &mut FunctionBuilder, ctx: Value, n: Value) {
    let now = count_now(fb, ctx);
    let sum = fb.ins().iadd(now, n);
    fb.ins().store(MemFlagsData::trusted(), sum, ctx, AT);
}

/// [`count_add`] of a constant.
pub(super) fn count_add_imm(fb: &mut FunctionBuilder, ctx: Value, n: i64) {
    let n = fb.ins().iconst(I64, n);
    count_add(fb, ctx, n);
}
