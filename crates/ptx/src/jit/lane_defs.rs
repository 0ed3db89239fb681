//! Plain definitions the lane kernel's emitters share: how a register is
//! made late, an unaligned access's flags, a constant added without a copy.

use cranelift_codegen::ir::{Endianness, InstBuilder, MemFlagsData, Value};
use cranelift_frontend::FunctionBuilder;

/// How a register the straight run wrote is to be made where read
/// (its variable holds an older value until then).
#[derive(Clone, Copy, Debug)]
pub(super) enum Lazy {
    /// An `f32` op's result: its lanes as computed in
    /// `Translator::vraw`, NaNs made canonical where read; `apart`: its
    /// ops read loads made late (see `Translator::canon_apart`).
    Canon { apart: bool },
    /// A covered shared word of each lane, not loaded yet: the first
    /// lane's host pointer, and whether the lanes' words are all the same
    /// (else consecutive).
    Load { p: Value, same: bool },
}

/// Flags of a lane kernel's vector access to shared or global memory: in
/// bounds (checked), little-endian lanes, aligned only to a word.
pub(super) fn unaligned() -> MemFlagsData {
    MemFlagsData::new()
        .with_notrap()
        .with_endianness(Endianness::Little)
}

/// `x` plus constant `k`: `x` itself where `k` is 0 (the code generator,
/// unoptimised, would copy it, and keep both alive).
pub(super) fn add_imm(fb: &mut FunctionBuilder, x: Value, k: i64) -> Value {
    match k {
        0 => x,
        k => fb.ins().iadd_imm_s(x, k),
    }
}
