//! The PTX compiler: kernels the `plan` takes (calls `inline`d, warps
//! stepped at volatile shared accesses by `lockstep`) go from the lowered IR
//! to native code with Cranelift (`translate`, `emit_*`, `lanes`), cached per
//! process (`compiled`), run as thread loops split at barriers (`launch`).

mod barriers;
mod compiled;
mod count;
mod device_calls;
mod direct;
mod dirty;
mod emit_mem;
mod emit_ops;
mod emit_strided;
mod emit_vec;
mod emit_vec_global;
mod emit_vec_mem;
mod emit_whole;
mod emit_wide;
mod hoist;
mod inline;
mod lane_defs;
mod lanes;
mod launch;
mod lazy;
mod lockstep;
mod narrow;
mod needed;
mod params;
mod plan;
mod resident;
mod restart;
mod runtime;
mod shared_checks;
mod strides;
mod translate;
mod trips;
mod warp;

/// Threads a lane kernel runs in step (a group starts at a multiple of it);
/// here, where `lanes` and `strides` both read it, neither importing the other.
pub(crate) const LANES: u32 = 4;

pub use compiled::compilations;
pub(crate) use compiled::CompiledModule;
pub(crate) use launch::launch;
pub use launch::{compiled_blocks, hoisted_blocks, hoisted_loop_sites, lane_blocks};
