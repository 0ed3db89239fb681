//! cumux's CPU reference device: PTX text parsed (`parser` → [`ast`]), lowered
//! (`lower` → `ir`, checked by `validate`) and run with CUDA semantics by the
//! interpreter (`exec`, value semantics in `alu`) or compiled to native code
//! (`jit`); [`Program`] ties them together.

mod alu;
pub mod ast;
#[cfg(test)]
mod boundary_tests;
mod exec;
mod heap;
mod ir;
mod ir_operands;
mod jit;
mod launch;
mod lower;
mod memory;
mod module_info;
mod parser;
mod printf;
mod program;
mod sleep;
mod validate;
mod whole_vector;

pub use exec::{
    LOCAL_WINDOW, MAX_COOPERATIVE_BLOCKS, MAX_COOPERATIVE_THREADS, PARAM_WINDOW, SHARED_WINDOW,
};
pub use heap::DEFAULT_HEAP_BYTES;
pub use jit::{compilations, compiled_blocks, hoisted_blocks, hoisted_loop_sites, lane_blocks};
pub use launch::{
    check_config, Fault, LaunchConfig, LaunchLimits, LaunchReport, DEFAULT_PRINTF_FIFO,
    LAUNCH_CHECK_INTERVAL, MAX_SHARED_OPTIN, MAX_STATIC_SHARED,
};
pub use memory::{
    DeviceMemory, HostBytes, MemError, SharedAllocation, DEVICE_VA_BASE, DEVICE_VA_END,
    DEVICE_WINDOW_BYTES, MAX_WINDOWS, VMM_GRANULARITY,
};
pub use module_info::{GlobalVar, KernelInfo, LoadError, ParamLayout, Space};
pub use parser::{parse, ParseError};
pub use program::{Engine, Program};
