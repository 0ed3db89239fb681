//! The interpreter: runs one launch of a lowered kernel. Blocks run in
//! parallel on host threads (`grid`); inside a block (`block`), threads run
//! one at a time (`thread`) up to the next collective (`barrier`, `warp`,
//! `tensor`), which is resolved exactly; `watch` stops a launch over its
//! instruction budgets or cancelled.

mod access;
mod arith;
mod barrier;
mod block;
mod blocks;
mod calls;
mod cdp;
mod grid;
mod limits;
mod mbarrier;
mod mem_ops;
mod runtime;
mod special;
mod state;
mod tensor;
mod thread;
mod warp;
mod watch;

pub(crate) use access::check_alignment;
pub(crate) use arith::step as run_register_op;
pub(crate) use blocks::{on_workers, BlockResults};
pub(crate) use grid::{resident_memory, with_grid_workspace, Executable};
pub use limits::{
    LOCAL_WINDOW, MAX_COOPERATIVE_BLOCKS, MAX_COOPERATIVE_THREADS, PARAM_WINDOW, SHARED_WINDOW,
};
pub(crate) use warp::{redux_fold, shfl_source};
pub(crate) use watch::launch_progress;
