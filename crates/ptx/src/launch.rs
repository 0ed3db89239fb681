//! A launch's inputs and outcome as the driver sees them: configuration and
//! its checks, faults with their driver error codes, and the launch report.

use crate::module_info::KernelInfo;
use std::fmt;

/// Largest static shared memory per block (bytes).
pub const MAX_STATIC_SHARED: u32 = 48 * 1024;
/// Largest static + dynamic shared memory per block (bytes), as on sm_80+.
pub const MAX_SHARED_OPTIN: u32 = 99 * 1024;

/// Grid, block and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

/// A fault during a launch, mirroring the driver's errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    IllegalAddress {
        addr: u64,
        detail: String,
    },
    MisalignedAddress {
        addr: u64,
        detail: String,
    },
    Trap {
        detail: String,
    },
    InvalidConfig(String),
    UnknownKernel(String),
    OutOfResources(String),
    Failed(String),
    /// A block ran past the instruction budget of `launch_limited` (code 702,
    /// like the driver's watchdog timeout).
    Timeout(String),
}

impl Fault {
    /// CUDA driver error code of this fault.
    pub fn cu_code(&self) -> u32 {
        match self {
            Fault::IllegalAddress { .. } => 700,
            Fault::MisalignedAddress { .. } => 716,
            Fault::Trap { .. } => 719,
            Fault::InvalidConfig(_) => 1,
            Fault::UnknownKernel(_) => 500,
            Fault::OutOfResources(_) => 701,
            Fault::Failed(_) => 719,
            Fault::Timeout(_) => 702,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // the driver's wording of the error, the address it names, the detail
        let (what, addr, detail) = match self {
            Fault::IllegalAddress { addr, detail } => (
                "an illegal memory access was encountered at",
                Some(addr),
                detail,
            ),
            Fault::MisalignedAddress { addr, detail } => ("misaligned address", Some(addr), detail),
            Fault::Trap { detail } => ("unspecified launch failure (trap)", None, detail),
            Fault::InvalidConfig(s) => ("invalid launch configuration", None, s),
            Fault::UnknownKernel(s) => ("kernel not found", None, s),
            Fault::OutOfResources(s) => ("too many resources requested for launch", None, s),
            Fault::Failed(s) => ("unspecified launch failure", None, s),
            Fault::Timeout(s) => ("the launch timed out", None, s),
        };
        match addr {
            Some(addr) => write!(f, "{what} {addr:#x}: {detail}"),
            None => write!(f, "{what}: {detail}"),
        }
    }
}

impl std::error::Error for Fault {}

/// The outcome of one launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchReport {
    /// Device printf output, block by block in block order.
    pub stdout: Vec<u8>,
    /// Interpreted instructions (all threads).
    pub instructions: u64,
    pub result: Result<(), Fault>,
}

impl LaunchReport {
    /// A launch that failed before any block ran.
    pub(crate) fn failed(fault: Fault) -> LaunchReport {
        LaunchReport {
            stdout: Vec::new(),
            instructions: 0,
            result: Err(fault),
        }
    }
}

/// Checks a launch configuration the way the driver does.
pub fn check_config(info: &KernelInfo, cfg: &LaunchConfig, params_len: usize) -> Result<(), Fault> {
    let [bx, by, bz] = cfg.block;
    let [gx, gy, gz] = cfg.grid;
    if bx == 0 || by == 0 || bz == 0 || gx == 0 || gy == 0 || gz == 0 {
        return Err(Fault::InvalidConfig("zero grid or block dimension".into()));
    }
    if bx > 1024 || by > 1024 || bz > 64 {
        return Err(Fault::InvalidConfig(format!(
            "block {:?} exceeds (1024, 1024, 64)",
            cfg.block
        )));
    }
    let threads = bx as u64 * by as u64 * bz as u64;
    if threads > 1024 {
        return Err(Fault::InvalidConfig(format!(
            "{threads} threads per block exceed 1024"
        )));
    }
    if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
        return Err(Fault::InvalidConfig(format!(
            "grid {:?} exceeds limits",
            cfg.grid
        )));
    }
    if threads > info.max_threads_per_block as u64 {
        return Err(Fault::InvalidConfig(format!(
            "{threads} threads per block exceed the kernel's limit of {}",
            info.max_threads_per_block
        )));
    }
    if let Some(r) = info.reqntid {
        if r != cfg.block {
            return Err(Fault::InvalidConfig(format!(
                "block {:?} differs from .reqntid {r:?}",
                cfg.block
            )));
        }
    }
    let shared = info.static_shared_bytes as u64 + cfg.dynamic_shared_bytes as u64;
    if info.static_shared_bytes > MAX_STATIC_SHARED || shared > MAX_SHARED_OPTIN as u64 {
        return Err(Fault::InvalidConfig(format!(
            "{shared} bytes of shared memory exceed the limit"
        )));
    }
    if (params_len as u64) < info.params_bytes() as u64 {
        return Err(Fault::InvalidConfig(format!(
            "parameter buffer has {params_len} bytes, kernel needs {}",
            info.params_bytes()
        )));
    }
    Ok(())
}
