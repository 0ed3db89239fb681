//! The PTX compiler: kernels of the common class (`plan`) translated from the
//! lowered IR to native code with Cranelift (`translate`, `emit_ops`,
//! `emit_mem`), run as thread-coarsened blocks split at barriers and warp
//! collectives (`launch`, `warp`) over the context and helpers of `runtime`;
//! `compiled` owns the code.

mod compiled;
mod emit_mem;
mod emit_ops;
mod launch;
mod plan;
mod runtime;
mod translate;
mod warp;

pub(crate) use compiled::CompiledModule;
pub(crate) use launch::launch;
