//! The PTX compiler: kernels the `plan` takes go from the lowered IR to native
//! code with Cranelift (`translate`, `emit_ops`, `emit_mem`) and run as thread
//! loops split at barriers and collectives (`launch`, `warp`, `runtime`).

mod compiled;
mod device_calls;
mod emit_mem;
mod emit_ops;
mod launch;
mod plan;
mod runtime;
mod shared_checks;
mod translate;
mod warp;

pub(crate) use compiled::CompiledModule;
pub(crate) use launch::launch;
