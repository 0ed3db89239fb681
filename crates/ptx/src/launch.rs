//! A launch's inputs and outcome as the driver sees them: configuration and
//! its checks, faults with their driver error codes, and the launch report.

use crate::ir::{MemOrder, Op, Sp};
use crate::module_info::KernelInfo;
use std::fmt;
use std::sync::atomic::AtomicBool;

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

/// What may stop a launch before its end. The interpreter checks them at
/// every backward branch and call of a block once it ran
/// [`LAUNCH_CHECK_INTERVAL`] more instructions, and between blocks.
#[derive(Debug, Clone, Copy)]
pub struct LaunchLimits<'a> {
    /// Instructions one block may execute; the block that runs past it fails
    /// the launch with [`Fault::Timeout`] at that instruction.
    pub per_block: u64,
    /// Instructions all blocks together may execute; past it the launch fails
    /// with [`Fault::Timeout`] at the next check (a launch fails exactly when
    /// its blocks executed more in total).
    pub per_launch: u64,
    /// Once set, from any thread, the launch stops at its next check with
    /// [`Fault::Cancelled`].
    pub cancel: Option<&'a AtomicBool>,
    /// Host threads that run the launch's blocks; 0: `CUMUX_PTX_THREADS`,
    /// else one per core (a cooperative launch runs all its blocks at once).
    pub workers: usize,
    /// The context's printf FIFO (`CU_LIMIT_PRINTF_FIFO_SIZE`): the text a
    /// block keeps; the launch keeps that or 8 default FIFOs, whichever is
    /// more (the text is larger than the records a GPU's FIFO holds).
    pub printf_fifo: usize,
}

impl LaunchLimits<'_> {
    /// No budget and no cancel flag: the launch runs to its end.
    pub const NONE: LaunchLimits<'static> = LaunchLimits {
        per_block: u64::MAX,
        per_launch: u64::MAX,
        cancel: None,
        workers: 0,
        printf_fifo: DEFAULT_PRINTF_FIFO,
    };
}

/// The printf FIFO of a context whose program set none (1 MiB, the driver's
/// default).
pub const DEFAULT_PRINTF_FIFO: usize = 1 << 20;

/// The printf text a launch keeps, all blocks together, under a FIFO of
/// `fifo` bytes.
pub(crate) fn printf_launch_limit(fifo: usize) -> usize {
    fifo.max(8 * DEFAULT_PRINTF_FIFO)
}

/// Instructions a block runs between two checks of the per-launch budget and
/// the cancel flag (well under a millisecond of interpretation).
pub const LAUNCH_CHECK_INTERVAL: u64 = 1 << 16;

/// Instructions between yields of a running thread of a kernel whose
/// threads may poll for each other ([`waits_in_block`]), on both engines: a
/// thread spinning until the block's other threads arrive (a
/// `cuda::barrier`, a flag in shared memory) lets them run after this
/// many, not after a whole
/// [`LAUNCH_CHECK_INTERVAL`] (a 1,024-thread block waiting at such a
/// barrier spun 67 M instructions, and `simpleAWBarrier` ended at the
/// launch's budget). The budgets and the cancel flag are still checked
/// every `LAUNCH_CHECK_INTERVAL`.
pub const POLL_YIELD_INTERVAL: u64 = 1024;

/// Where a block's next yield is due, its count at `done` and its next
/// check of budgets and the cancel flag at `full_check_at`: sooner in a
/// kernel whose threads wait for each other ([`POLL_YIELD_INTERVAL`]). Both
/// engines set their checks by it, so they yield at the same counts.
pub(crate) fn next_yield(done: u64, full_check_at: u64, waits_in_block: bool) -> u64 {
    if waits_in_block {
        done.saturating_add(POLL_YIELD_INTERVAL).min(full_check_at)
    } else {
        full_check_at
    }
}

/// Whether a thread of a kernel of `ops` may wait for another thread of
/// its own block by polling: an ordered load of shared memory (a flag, a
/// `cuda::barrier`'s phase) or a `nanosleep` back-off. Its threads yield
/// every [`POLL_YIELD_INTERVAL`] instructions (both engines); a kernel that
/// polls only global or generic memory (a grid sync's `.acquire.gpu`)
/// waits for other blocks, which no yield of its own threads runs, and
/// yields every [`LAUNCH_CHECK_INTERVAL`].
pub(crate) fn waits_in_block<'a>(ops: impl IntoIterator<Item = &'a Op>) -> bool {
    ops.into_iter().any(|op| match op {
        Op::Sleep { .. } => true,
        Op::Ld { addr, order, .. } => *order != MemOrder::Plain && addr.sp == Sp::Shared,
        _ => false,
    })
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
    /// A device-side `assert` failed (code 710, CUDA_ERROR_ASSERT).
    Assert {
        detail: String,
    },
    InvalidConfig(String),
    UnknownKernel(String),
    OutOfResources(String),
    Failed(String),
    /// A block, or the launch as a whole, ran past its instruction budget
    /// ([`LaunchLimits`]; code 702, like the driver's watchdog timeout).
    Timeout(String),
    /// A cooperative launch of more blocks than can run at once (code 720,
    /// CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE).
    CooperativeTooLarge(String),
    /// The launch's cancel flag was set ([`LaunchLimits::cancel`]): it stopped
    /// at its next check (code 719, as a launch whose context went away).
    Cancelled(String),
}

impl Fault {
    /// CUDA driver error code of this fault.
    pub fn cu_code(&self) -> u32 {
        match self {
            Fault::IllegalAddress { .. } => 700,
            Fault::MisalignedAddress { .. } => 716,
            Fault::Trap { .. } => 719,
            Fault::Assert { .. } => 710,
            Fault::InvalidConfig(_) => 1,
            Fault::UnknownKernel(_) => 500,
            Fault::OutOfResources(_) => 701,
            Fault::Failed(_) => 719,
            Fault::Timeout(_) => 702,
            Fault::Cancelled(_) => 719,
            Fault::CooperativeTooLarge(_) => 720,
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
            Fault::Assert { detail } => ("device-side assert triggered", None, detail),
            Fault::InvalidConfig(s) => ("invalid launch configuration", None, s),
            Fault::UnknownKernel(s) => ("kernel not found", None, s),
            Fault::OutOfResources(s) => ("too many resources requested for launch", None, s),
            Fault::Failed(s) => ("unspecified launch failure", None, s),
            Fault::Timeout(s) => ("the launch timed out", None, s),
            Fault::Cancelled(s) => ("the launch was cancelled", None, s),
            Fault::CooperativeTooLarge(s) => ("cooperative launch too large", None, s),
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
