//! What a loaded module says about itself (kernels, parameter layouts,
//! module variables) and why loading a module fails.

use crate::parser::ParseError;
use std::fmt;

/// Why a module could not be loaded.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadError {
    Parse(ParseError),
    Unsupported { what: String, line: u32 },
    Invalid(String),
    OutOfMemory,
}

impl LoadError {
    /// CUDA driver error code: 218 (INVALID_PTX) or 2 (OUT_OF_MEMORY).
    pub fn cu_code(&self) -> u32 {
        match self {
            LoadError::OutOfMemory => 2,
            _ => 218,
        }
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Parse(e) => write!(f, "PTX parse error: {e}"),
            LoadError::Unsupported { what, line } => {
                write!(f, "unsupported PTX at line {line}: {what}")
            }
            LoadError::Invalid(s) => write!(f, "invalid PTX: {s}"),
            LoadError::OutOfMemory => write!(f, "out of device memory for module globals"),
        }
    }
}

impl std::error::Error for LoadError {}

impl From<ParseError> for LoadError {
    fn from(e: ParseError) -> Self {
        LoadError::Parse(e)
    }
}

/// State space of a module variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    Global,
    Const,
}

/// A module-level `.global` / `.const` variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalVar {
    pub name: String,
    pub ptr: u64,
    pub size: u64,
    pub space: Space,
}

/// Layout of one kernel parameter inside the packed parameter buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamLayout {
    pub offset: u32,
    pub size: u32,
    pub align: u32,
}

/// What a loaded module says about one of its kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInfo {
    pub name: String,
    pub params: Vec<ParamLayout>,
    pub static_shared_bytes: u32,
    pub local_bytes: u32,
    /// `.maxntid` (or `.reqntid`) product, else 1024.
    pub max_threads_per_block: u32,
    pub reqntid: Option<[u32; 3]>,
    /// 90 for `.version 9.0`.
    pub ptx_version: u32,
    /// 75 for `.target sm_75`.
    pub target_sm: u32,
    pub num_regs: u32,
}

impl KernelInfo {
    /// Total size of the packed parameter buffer.
    pub fn params_bytes(&self) -> u32 {
        self.params.last().map(|p| p.offset + p.size).unwrap_or(0)
    }
}
