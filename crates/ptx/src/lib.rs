//! cumux's CPU reference device: a parser for the PTX that nvcc emits and an
//! interpreter that runs it with CUDA semantics (grids, blocks, warps, memory
//! spaces, atomics, barriers, device printf and driver-like faults).
//!
//! The pipeline: `parser` (text → [`ast`]), `lower` (ast → `ir`, checked by
//! `validate`), `exec` (the interpreter over `ir`, value semantics in `alu`).
//! [`Program`] ties them together; this root only declares and re-exports.

mod alu;
pub mod ast;
#[cfg(test)]
mod boundary_tests;
mod exec;
mod ir;
mod launch;
mod lower;
mod memory;
mod module_info;
mod parser;
mod printf;
mod program;
mod validate;

pub use exec::{LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW};
pub use launch::{
    check_config, Fault, LaunchConfig, LaunchReport, MAX_SHARED_OPTIN, MAX_STATIC_SHARED,
};
pub use memory::{DeviceMemory, MemError, DEVICE_VA_BASE, DEVICE_VA_END};
pub use module_info::{GlobalVar, KernelInfo, LoadError, ParamLayout, Space};
pub use parser::{parse, ParseError};
pub use program::Program;
