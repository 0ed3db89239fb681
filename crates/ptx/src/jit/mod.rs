//! The PTX compiler: kernels of the common class (`plan`) translated from the
//! lowered IR to native code with Cranelift (`translate`, `emit_mem`), run as
//! thread-coarsened blocks split at barriers (`launch`) over the helpers and
//! context of `runtime`; `compiled` owns a module's code.

mod compiled;
mod emit_mem;
mod launch;
mod plan;
mod runtime;
mod translate;

pub(crate) use compiled::CompiledModule;
pub(crate) use launch::launch;
