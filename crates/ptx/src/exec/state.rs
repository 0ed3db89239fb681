//! The interpreter's state: launch-wide facts (`Geo`), the running block
//! (`Block`), each thread's registers, local memory and call frames
//! (`Thread`), and register reads and writes relative to a frame.

use super::runtime::Cdp;
use crate::ir::{Address, Module, Op, Src};
use crate::launch::LaunchConfig;
use crate::memory::{DeviceMemory, MemView};
use crate::module_info::KernelInfo;
use std::sync::atomic::{AtomicBool, AtomicU64};

/// Where a thread stands between runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    Ready,
    /// Waiting at a warp collective.
    AtWarp,
    /// Waiting at a block barrier.
    AtBar,
    Exited,
}

/// A caller's place, kept while a callee runs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Frame {
    pub func: u32,
    pub call_pc: u32,
    pub rbase: u32,
    pub lbase: u32,
}

/// One thread: its place in the code, its register file and local memory
/// (all frames of the call stack, the current one at `rbase`/`lbase`).
pub(super) struct Thread {
    pub pc: u32,
    pub func: u32,
    pub rbase: u32,
    pub lbase: u32,
    pub frames: Vec<Frame>,
    pub status: Status,
    pub clock: u64,
    pub regs: Vec<u64>,
    pub local: Vec<u64>,
}

impl Thread {
    pub(super) fn new() -> Thread {
        Thread {
            pc: 0,
            func: 0,
            rbase: 0,
            lbase: 0,
            frames: Vec::new(),
            status: Status::Ready,
            clock: 0,
            regs: Vec::new(),
            local: Vec::new(),
        }
    }

    /// Puts the thread at the start of `kernel` with zeroed registers and
    /// local memory (keeping the buffers' capacity).
    pub(super) fn reset(&mut self, kernel: u32, nregs: u32, frame_bytes: u32) {
        self.pc = 0;
        self.func = kernel;
        self.rbase = 0;
        self.lbase = 0;
        self.frames.clear();
        self.status = Status::Ready;
        self.regs.clear();
        self.regs.resize(nregs as usize, 0);
        self.local.clear();
        self.local.resize((frame_bytes as usize).div_ceil(8), 0);
    }

    /// Lets a thread waiting at a collective go on past it.
    pub(super) fn release(&mut self) {
        self.pc += 1;
        self.status = Status::Ready;
    }

    /// The value of `s` in the current frame.
    #[inline]
    pub(super) fn get(&self, s: Src) -> u64 {
        rd(&self.regs, self.rbase, self.lbase, s)
    }

    /// The address an instruction's memory operand names.
    #[inline]
    pub(super) fn address(&self, a: &Address) -> u64 {
        self.get(a.base).wrapping_add(a.off as u64)
    }

    /// Writes register `d` of the current frame.
    #[inline]
    pub(super) fn set(&mut self, d: u32, v: u64) {
        wr(&mut self.regs, self.rbase, d, v)
    }
}

/// Launch-wide, read-only facts.
pub(super) struct Geo<'a> {
    /// Host threads for the blocks ([`crate::LaunchLimits::workers`]).
    pub workers: usize,
    pub prog: &'a Module,
    pub mem: &'a MemView<'a>,
    /// The memory itself (its device heap, for `malloc`/`free`).
    pub memory: &'a DeviceMemory,
    pub params: &'a [u64],
    pub params_len: u64,
    /// Grid (`%nctaid`), block (`%ntid`) and dynamic shared memory.
    pub config: LaunchConfig,
    pub shared_bytes: u64,
    /// Where the block's reserved shared memory starts (at `shared_bytes`
    /// when the module reads no `%reserved_smem_offset_*`).
    pub reserved_smem: u64,
    pub start_ns: u64,
    pub kernel: u32,
    /// Instructions a block may execute before the launch fails.
    pub budget: u64,
    /// Instructions all blocks together may execute before the launch fails.
    pub launch_budget: u64,
    /// Instructions the launch's blocks executed, as far as counted (each
    /// block adds its own at its checks and its end).
    pub executed: &'a AtomicU64,
    /// Once set, the launch stops at its next check.
    pub cancel: Option<&'a AtomicBool>,
    /// Set once a block faulted: the others stop at their next check (in a
    /// cooperative launch they may be waiting for the faulted one).
    pub abort: &'a AtomicBool,
    /// The device address of a cooperative launch's grid workspace (what
    /// `cooperative_groups::this_grid().sync()` counts in), else 0.
    pub grid_workspace: u64,
    /// Bytes of registers plus local memory one thread may use (call stack).
    pub stack_limit: usize,
    /// The printf text a block keeps (the context's FIFO size).
    pub printf_fifo: usize,
    /// Run the lanes of a warp in lockstep (module uses volatile accesses).
    pub lockstep: bool,
    /// The kernel or a function it calls may poll for another thread of its
    /// block (`launch::waits_in_block`): its threads yield every
    /// [`crate::launch::POLL_YIELD_INTERVAL`] instructions.
    pub waits_in_block: bool,
    /// The grid's device runtime (dynamic parallelism).
    pub cdp: &'a Cdp<'a>,
    /// Each kernel's description, in kernel order.
    pub kernels: &'a [KernelInfo],
}

/// Per-worker mutable state of the block being run.
pub(super) struct Block {
    pub ctaid: [u32; 3],
    pub smid: u32,
    pub shared: Vec<u64>,
    pub out: Vec<u8>,
    /// The last global allocation resolved: (base, length, host pointer).
    pub cache: (u64, u64, usize),
    /// Threads that arrived (without waiting) at each barrier.
    pub arrivals: [u32; 16],
    /// Instructions this block executed so far.
    pub instructions: u64,
    /// Of those, the ones already added to [`Geo::executed`].
    pub counted: u64,
    /// At a backward branch or call past this many instructions the block
    /// checks its budgets and the cancel flag (`watch`).
    pub check_at: u64,
    /// Where the next check of the budgets and the cancel flag is due when
    /// `check_at` comes sooner (a kernel that polls).
    pub full_check_at: u64,
    /// Lanes of each warp that have not exited.
    pub warp_live: Vec<u32>,
}

impl Block {
    pub(super) fn new(smid: u32) -> Block {
        Block {
            ctaid: [0; 3],
            smid,
            shared: Vec::new(),
            out: Vec::new(),
            cache: (0, 0, 0),
            arrivals: [0; 16],
            instructions: 0,
            counted: 0,
            check_at: 0,
            full_check_at: 0,
            warp_live: Vec::new(),
        }
    }

    /// Marks thread `lin` exited.
    pub(super) fn exit(&mut self, th: &mut Thread, lin: u32) {
        if let Some(m) = self.warp_live.get_mut((lin / 32) as usize) {
            *m &= !(1u32 << (lin % 32));
        }
        th.status = Status::Exited;
    }
}

/// Why a thread stopped running.
pub(super) enum Stop {
    Collective,
    Exit,
    /// Step budget used up; the thread stays ready.
    Yield,
}

/// Reads `s` in the frame at register base `rbase` and local base `lbase`.
#[inline]
pub(super) fn rd(regs: &[u64], rbase: u32, lbase: u32, s: Src) -> u64 {
    match s {
        Src::Reg(r) => {
            // validated IR names registers below the function's count, and
            // every frame's registers are allocated on entry
            debug_assert!(
                ((rbase + r) as usize) < regs.len(),
                "register {r} out of range"
            );
            regs.get((rbase + r) as usize).copied().unwrap_or(0)
        }
        Src::Imm(v) => v,
        Src::Frame(o) => (lbase as u64).wrapping_add(o as u64),
    }
}

/// Writes register `d` of the frame at register base `rbase`.
#[inline]
pub(super) fn wr(regs: &mut [u64], rbase: u32, d: u32, v: u64) {
    debug_assert!(
        (rbase.wrapping_add(d) as usize) < regs.len(),
        "register {d} out of range"
    );
    if let Some(slot) = regs.get_mut((rbase.wrapping_add(d)) as usize) {
        *slot = v;
    }
}

/// `%tid` of the thread with linear index `lin` in a block of shape `ntid`.
pub(super) fn lin_to_tid(lin: u32, ntid: [u32; 3]) -> [u32; 3] {
    let x = lin % ntid[0].max(1);
    let y = (lin / ntid[0].max(1)) % ntid[1].max(1);
    let z = lin / (ntid[0].max(1) * ntid[1].max(1));
    [x, y, z]
}

/// The op thread `th` stands at (for a waiting thread: its collective).
#[inline]
pub(super) fn op_at<'p>(prog: &'p Module, th: &Thread) -> Option<&'p Op> {
    prog.funcs
        .get(th.func as usize)?
        .code
        .get(th.pc as usize)
        .map(|i| &i.op)
}
