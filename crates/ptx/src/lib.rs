//! cumux's CPU reference device: a parser for the PTX that nvcc emits and an
//! interpreter that runs it with CUDA semantics (grids, blocks, warps, memory
//! spaces, atomics, barriers, device printf and driver-like faults).

pub mod ast;
mod exec;
mod ir;
mod lower;
mod memory;
mod parser;
mod printf;

pub use exec::{LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW};
pub use memory::{DeviceMemory, MemError, DEVICE_VA_BASE, DEVICE_VA_END};
pub use parser::{parse, ParseError};

use std::fmt;

/// Largest static shared memory per block (bytes).
pub const MAX_STATIC_SHARED: u32 = 48 * 1024;
/// Largest static + dynamic shared memory per block (bytes), as on sm_80+.
pub const MAX_SHARED_OPTIN: u32 = 99 * 1024;

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
        match self {
            Fault::IllegalAddress { addr, detail } => {
                write!(
                    f,
                    "an illegal memory access was encountered at {addr:#x}: {detail}"
                )
            }
            Fault::MisalignedAddress { addr, detail } => {
                write!(f, "misaligned address {addr:#x}: {detail}")
            }
            Fault::Trap { detail } => write!(f, "unspecified launch failure (trap): {detail}"),
            Fault::InvalidConfig(s) => write!(f, "invalid launch configuration: {s}"),
            Fault::UnknownKernel(s) => write!(f, "kernel not found: {s}"),
            Fault::OutOfResources(s) => write!(f, "too many resources requested for launch: {s}"),
            Fault::Failed(s) => write!(f, "unspecified launch failure: {s}"),
            Fault::Timeout(s) => write!(f, "the launch timed out: {s}"),
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

/// A loaded PTX module.
#[derive(Debug)]
pub struct Program {
    pub(crate) funcs: Vec<ir::Func>,
    kernels: Vec<KernelInfo>,
    pub(crate) kernel_funcs: Vec<u32>,
    globals: Vec<GlobalVar>,
    allocations: Vec<u64>,
    dyn_shared_base: u32,
}

impl Program {
    /// Parses, checks and lowers the PTX; allocates and initialises its
    /// `.global`/`.const` variables in `mem`.
    pub fn load(ptx_src: &str, mem: &DeviceMemory) -> Result<Program, LoadError> {
        let module = parse(ptx_src)?;
        Self::from_module(&module, mem)
    }

    /// Lowers an already parsed module.
    pub fn from_module(module: &ast::Module, mem: &DeviceMemory) -> Result<Program, LoadError> {
        let mut allocated = Vec::new();
        match lower::lower_module(module, mem, &mut allocated) {
            Ok(l) => {
                let (kernels, kernel_funcs) = l.kernels.into_iter().unzip();
                Ok(Program {
                    funcs: l.funcs,
                    kernels,
                    kernel_funcs,
                    globals: l.globals,
                    allocations: allocated,
                    dyn_shared_base: l.dyn_shared_base,
                })
            }
            Err(e) => {
                for a in allocated {
                    let _ = mem.free(a);
                }
                Err(e)
            }
        }
    }

    /// The module's kernels.
    pub fn kernels(&self) -> &[KernelInfo] {
        &self.kernels
    }

    /// The module's `.global` and `.const` variables.
    pub fn globals(&self) -> &[GlobalVar] {
        &self.globals
    }

    /// Runs `kernel` over the grid; `params` is the packed parameter buffer.
    pub fn launch(
        &self,
        mem: &DeviceMemory,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
    ) -> LaunchReport {
        self.launch_limited(mem, kernel, cfg, params, u64::MAX)
    }

    /// Like [`Program::launch`], but a block that executes more than
    /// `max_instructions_per_block` fails the launch (`Timeout`, code 702) instead of
    /// running forever.
    pub fn launch_limited(
        &self,
        mem: &DeviceMemory,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
        max_instructions_per_block: u64,
    ) -> LaunchReport {
        let fail = |f: Fault| LaunchReport {
            stdout: Vec::new(),
            instructions: 0,
            result: Err(f),
        };
        let Some(k) = self.kernels.iter().position(|k| k.name == kernel) else {
            return fail(Fault::UnknownKernel(kernel.to_string()));
        };
        let info = &self.kernels[k];
        if let Err(f) = check_config(info, cfg, params.len()) {
            return fail(f);
        }
        let threads: u64 = cfg.block.iter().map(|&v| v as u64).product();
        let f = &self.funcs[self.kernel_funcs[k] as usize];
        let per_thread = f.nregs as u64 * 8 + f.frame_bytes as u64;
        if per_thread.saturating_mul(threads) > exec::BLOCK_MEMORY_LIMIT as u64 {
            return fail(Fault::OutOfResources(format!(
                "{threads} threads with {per_thread} bytes of registers and local memory each"
            )));
        }
        let shared = self.dyn_shared_base as u64 + cfg.dynamic_shared_bytes as u64;
        exec::run_launch(
            self,
            mem,
            self.kernel_funcs[k],
            cfg,
            params,
            shared,
            max_instructions_per_block,
        )
    }

    /// Frees the module's globals.
    pub fn unload(self, mem: &DeviceMemory) {
        for a in self.allocations {
            let _ = mem.free(a);
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
