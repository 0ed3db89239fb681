//! What compiled code sees at run time: the block's context (`Ctx`, read at
//! fixed offsets) and the helpers it calls: the interpreter's `alu` step,
//! checked memory accesses on their slow path, atomics, `trap`.

use crate::alu::atom_apply;
use crate::exec::launch_progress;
use crate::exec::{check_alignment, run_register_op, LOCAL_WINDOW, PARAM_WINDOW, SHARED_WINDOW};
use crate::ir::{Op, Sp};
use crate::launch::{Fault, LAUNCH_CHECK_INTERVAL};
use crate::memory::{atomic_load, atomic_rmw, atomic_store, DeviceMemory, MemView, DEVICE_VA_BASE};
use crate::whole_vector::{load_whole, store_whole};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Size of each generic-address window of shared, local and param space.
pub(super) const WINDOW_BYTES: u64 = 1 << 32;

/// A compiled kernel region's return: the thread exited.
pub(super) const RET_EXIT: u32 = u32::MAX;
/// A compiled kernel region's return: the thread faulted (`Ctx::fault`).
pub(super) const RET_FAULT: u32 = u32::MAX - 1;

/// A lane kernel's return: its lanes part ways, or reach an op kept in
/// thread order; the block is undone and runs again on the thread loop.
pub(super) const RET_PARTED: u32 = u32::MAX - 2;

/// Why a thread stopped short of its end: the low [`STOP_BITS`] bits of a
/// region's return, above them the resume id it goes on from.
pub(super) const STOP_BITS: u32 = 2;
/// At a barrier.
pub(super) const STOP_BARRIER: u32 = 0;
/// At a backward branch past the block's next check (it stays ready).
pub(super) const STOP_YIELD: u32 = 1;
/// At a warp collective (the instruction before its resume point).
pub(super) const STOP_WARP: u32 = 2;

/// The compiled kernel: `(ctx, regs, local, first, end, resume_ids, tids,
/// codes)` runs threads `first..end` of the block one after the other, each
/// from its resume point (`resume_ids[t]`) to its next barrier, warp
/// collective, yield, exit or fault. Thread `t`'s registers are the `nregs`
/// words from `regs + 8 nregs t`, its local memory the frame's bytes
/// (rounded to words) from `local + t` frames, its `%tid` at `tids + 16 t`
/// (for the lane kernel component by component: the x of each of a
/// group's [`super::lanes::LANES`] threads at `tids + 16 t` of its first,
/// then their y, then their z, each 16 bytes).
/// Its stop goes to `codes[t]`: `resume_id << STOP_BITS | STOP_*`,
/// [`RET_EXIT`] or [`RET_FAULT`] (the lane kernel's to its group's first
/// thread's only: its lanes stop alike), and into `Ctx::codes_and` and
/// `Ctx::codes_or`. It returns the end of the threads it ran: `end`, or
/// one past a thread (a group) that yielded or faulted.
pub(super) type KernelFn = unsafe extern "C" fn(
    *mut Ctx<'_>,
    *mut u64,
    *mut u8,
    u32,
    u32,
    *const u32,
    *const [u32; 4],
    *mut u32,
) -> u32;

/// The running block as compiled code sees it. The fields up to `ctaid` are
/// read and written by generated code at their `offset_of!` offsets.
#[repr(C)]
pub(super) struct Ctx<'a> {
    pub shared: *mut u8,
    pub shared_bytes: u64,
    pub params: *const u8,
    pub params_len: u64,
    /// The global allocation each global or generic access site resolved
    /// last (`gsites` of them, the worker's).
    pub gcache: *mut GlobalEntry,
    pub gsites: u64,
    /// Instructions the block executed so far.
    pub instructions: u64,
    /// The stop codes of the call's threads, ANDed and ORed together (the
    /// launch sets all ones and zero before a call; equal after it where
    /// all of them stopped alike).
    pub codes_and: u32,
    pub codes_or: u32,
    /// A backward branch past this many instructions yields (budget checks).
    pub check_at: u64,
    /// Bytes of each thread's local memory.
    pub local_bytes: u64,
    /// Source line of the backward branch that last yielded.
    pub yield_line: u64,
    /// The budgets those checks hold the block to ([`Ctx::checkpoint`]).
    pub budget: Budget<'a>,
    pub ntid: [u32; 3],
    pub nctaid: [u32; 3],
    pub ctaid: [u32; 3],
    /// `%dynamic_smem_size`, `%smid` (the worker's index).
    pub dyn_smem: u32,
    pub smid: u32,
    /// `%nwarpid`: the block's warps.
    pub nwarpid: u32,
    /// `%total_smem_size`, and where the block's reserved shared memory starts.
    pub total_smem: u64,
    pub reserved_smem: u64,
    /// `%clock64` where the block started: the instructions its worker ran
    /// before it; and `%globaltimer`'s start (the launch's, in ns).
    pub clock_base: u64,
    pub start_ns: u64,
    /// A cooperative launch's grid workspace (`%envreg1` its high half,
    /// `%envreg2` its low), else 0.
    pub grid_workspace: u64,
    /// A `nanosleep` not yet taken: the thread yields at its next backward
    /// branch, and sleeps only where no other thread of its block can run
    /// (`rt_nanosleep`; on a GPU its threads' waits overlap).
    pub sleep_ns: u64,
    /// Device memory of the launch, and the memory itself (its heap).
    pub mem: &'a MemView<'a>,
    pub memory: &'a DeviceMemory,
    /// The fault a region returned [`RET_FAULT`] for.
    pub fault: Option<Fault>,
    /// The block's `printf` output so far.
    pub out: Vec<u8>,
    /// The output a block keeps (the context's printf FIFO).
    pub printf_fifo: usize,
    /// The lane kernel's narrow registers of each group of the block
    /// between its runs: `nregs` vectors of 16 bytes a group.
    pub lane_file: *mut u8,
    /// `bar.arrive`s of each barrier id since it last completed (read and
    /// written by generated code).
    pub arrivals: [u32; 16],
    /// While the block runs lane kernels: the log of its stores, to undo
    /// the block when its lanes part (`log_cap` entries, all initialised,
    /// the first `log_len` in use; generated code appends to it in place
    /// while there is room, [`rt_log_store`] when there is none).
    pub undo: Option<Vec<Logged>>,
    pub log: *mut Logged,
    pub log_len: u64,
    pub log_cap: u64,
    /// In a lane kernel that restarts from a failed group
    /// ([`super::restart`]): the block's count where that group started.
    pub group_count: u64,
    /// Where the block's check of its hoisted global accesses passed
    /// (`jit::hoist`): each one's host pointer less its device address.
    pub hoisted: [u64; MAX_HOISTED],
}

/// What a block's checks at backward branches read: its budget and the
/// launch's, the count its instructions go to and how many are in it.
pub(super) struct Budget<'a> {
    pub per_block: u64,
    pub per_launch: u64,
    /// The launch's count, or where it has no budget the worker's own.
    pub executed: &'a AtomicU64,
    pub abort: &'a AtomicBool,
    pub cancel: Option<&'a AtomicBool>,
    /// The block's instructions already added to `executed`.
    pub counted: u64,
    /// Whether the kernel may spin on what another block writes
    /// (`CompiledKernel::polls`): a check lets the host's other threads run.
    pub polls: bool,
}

impl Ctx<'_> {
    /// The check of a block that ran `done` instructions, past
    /// `check_at`, at a backward branch on `line`: the block's and the
    /// launch's budgets and the cancel flag; sets the next check.
    pub(super) fn checkpoint(&mut self, done: u64, line: u64) -> Result<(), Fault> {
        let sleep = std::mem::take(&mut self.sleep_ns);
        if sleep > 0 {
            crate::sleep::nanosleep(sleep);
        }
        let b = &mut self.budget;
        if done > b.per_block {
            return Err(Fault::Timeout(format!(
                "instruction limit of {} per block exceeded at line {line}",
                b.per_block
            )));
        }
        let ctaid = self.ctaid;
        let cancel = b.cancel;
        launch_progress(
            b.executed,
            b.per_launch,
            b.abort,
            || cancel.is_some_and(|c| c.load(Ordering::Relaxed)),
            &mut b.counted,
            done,
            || format!("at line {line} of block {ctaid:?}"),
        )?;
        self.check_at = done.saturating_add(LAUNCH_CHECK_INTERVAL).min(b.per_block);
        if b.polls {
            // it may spin on a flag another block sets: the host's other
            // threads (that block's worker among them) get to run
            std::thread::yield_now();
        }
        Ok(())
    }
}

/// The lane kernel's check at a backward branch past `check_at`, made in
/// place (`Ctx::checkpoint`), the block's count `done`: 0 to go on, 1 for
/// a fault (in `Ctx::fault`).
///
/// # Safety
/// `ctx` is the live context of the running block.
pub(super) unsafe extern "C" fn rt_checkpoint(ctx: *mut Ctx<'_>, done: u64, line: u64) -> u32 {
    // SAFETY: the caller's contract: a live context, used by this thread only.
    let ctx = unsafe { &mut *ctx };
    match ctx.checkpoint(done, line) {
        Ok(()) => 0,
        Err(f) => {
            ctx.fault = Some(f);
            1
        }
    }
}

/// A store of a lane kernel, logged to be undone: `size` bytes (1, 2, 4, 8
/// or 16) at `p`, whose old bits were `old` (little-endian).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct Logged {
    pub p: *mut u8,
    pub size: u64,
    pub old: [u64; 2],
}

impl Logged {
    pub(super) const EMPTY: Logged = Logged {
        p: std::ptr::null_mut(),
        size: 0,
        old: [0; 2],
    };
}

/// Bytes of a [`Logged`] entry (generated code writes them).
pub(super) const LOGGED_BYTES: i64 = 32;
const _: () = assert!(std::mem::size_of::<Logged>() == LOGGED_BYTES as usize);
const _: () = assert!(std::mem::offset_of!(Logged, size) == 8);
const _: () = assert!(std::mem::offset_of!(Logged, old) == 16);

/// Puts back the old bits of `log`'s stores, the latest first.
///
/// # Safety
/// Each entry is a store of the running block, checked (aligned to 4 bytes
/// at least, to its size up to 8, in bounds) when it ran, into memory that
/// stays while the launch runs.
pub(super) unsafe fn undo_stores(log: &[Logged]) {
    for e in log.iter().rev() {
        // SAFETY: the caller's contract; a 16-byte entry is four words,
        // each aligned to 4.
        unsafe {
            if e.size == 16 {
                for (k, half) in e.old.iter().enumerate() {
                    let at = e.p.add(8 * k);
                    atomic_store(at, 4, *half);
                    atomic_store(at.add(4), 4, *half >> 32);
                }
            } else {
                atomic_store(e.p, e.size as u32, e.old[0]);
            }
        }
    }
}

/// Global accesses of a kernel whose checks one check a block covers, at most.
pub(super) const MAX_HOISTED: usize = 4;

/// A global allocation as an access site's cache keeps it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct GlobalEntry {
    pub base: u64,
    pub len: u64,
    pub ptr: *mut u8,
    /// The words a 16-byte access may start at: `len` in whole words less
    /// 3, or 0 where under 4 (the lane kernel's check reads it).
    pub words: u64,
}

/// Bytes of one [`GlobalEntry`] (the compiled code's stride between sites).
pub(super) const GLOBAL_ENTRY_BYTES: i64 = std::mem::size_of::<GlobalEntry>() as i64;

impl GlobalEntry {
    /// No allocation: every access misses.
    pub(super) const EMPTY: GlobalEntry = GlobalEntry {
        base: 0,
        len: 0,
        ptr: std::ptr::null_mut(),
        words: 0,
    };
}

/// Space codes passed to the memory helpers.
pub(super) fn space_code(sp: Sp) -> u32 {
    match sp {
        Sp::Global => 0,
        Sp::Shared => 1,
        Sp::Local => 2,
        Sp::Param => 3,
        Sp::Generic => 4,
    }
}

fn space_of(code: u32) -> Sp {
    match code {
        0 => Sp::Global,
        1 => Sp::Shared,
        2 => Sp::Local,
        3 => Sp::Param,
        _ => Sp::Generic,
    }
}

/// Base of the generic-address window of `sp` (0 for global and generic).
pub(super) fn window_base(sp: Sp) -> u64 {
    match sp {
        Sp::Shared => SHARED_WINDOW,
        Sp::Local => LOCAL_WINDOW,
        Sp::Param => PARAM_WINDOW,
        Sp::Global | Sp::Generic => 0,
    }
}

impl Ctx<'_> {
    pub(super) fn fault_addr(addr: u64, write: bool, line: u32) -> Fault {
        let what = if write { "write" } else { "read" };
        Fault::IllegalAddress {
            addr,
            detail: format!("{what} of address {addr:#x} at line {line}"),
        }
    }

    /// A helper's answer to the compiled code: 0 when `done`, else 1 with
    /// the fault kept for the launch to report.
    pub(super) fn status(&mut self, done: Result<(), Fault>) -> u32 {
        match done {
            Ok(()) => 0,
            Err(f) => {
                self.fault = Some(f);
                1
            }
        }
    }

    /// Host pointer for `size` bytes at `addr` in `sp`, checked as the
    /// interpreter checks it (same faults, same messages); a global
    /// allocation resolved goes to access site `site`'s cache.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn checked_ptr(
        &mut self,
        site: u32,
        local: *mut u8,
        sp: Sp,
        addr: u64,
        size: u32,
        write: bool,
        line: u32,
    ) -> Result<*mut u8, Fault> {
        check_alignment(addr, size, line)?;
        let (sp, addr) = match sp {
            Sp::Generic => match resolve_generic(addr) {
                Some(resolved) => resolved,
                None => return Err(Self::fault_addr(addr, write, line)),
            },
            s => (s, addr),
        };
        let end = addr.checked_add(size as u64);
        match sp {
            Sp::Global => match self.mem.resolve(addr, size as u64) {
                Some((base, len, p)) => {
                    // a cached base must keep the fast path's alignment check exact
                    if (site as u64) < self.gsites && base % 16 == 0 {
                        // SAFETY: `gcache` holds `gsites` entries of the running
                        // worker, which only this thread touches.
                        unsafe {
                            *self.gcache.add(site as usize) = GlobalEntry {
                                base,
                                len,
                                ptr: p,
                                words: (len / 4).saturating_sub(3),
                            }
                        };
                    }
                    Ok(p.wrapping_add((addr - base) as usize))
                }
                None => Err(Self::fault_addr(addr, write, line)),
            },
            Sp::Shared => {
                let addr = addr as u32 as u64;
                if addr + size as u64 <= self.shared_bytes {
                    Ok(self.shared.wrapping_add(addr as usize))
                } else {
                    Err(Self::fault_addr(SHARED_WINDOW + addr, write, line))
                }
            }
            Sp::Local => match end {
                Some(e) if e <= self.local_bytes => Ok(local.wrapping_add(addr as usize)),
                _ => Err(Self::fault_addr(
                    LOCAL_WINDOW.wrapping_add(addr),
                    write,
                    line,
                )),
            },
            _ => match end {
                Some(e) if e <= self.params_len && !write => {
                    Ok((self.params as *mut u8).wrapping_add(addr as usize))
                }
                _ => Err(Self::fault_addr(
                    PARAM_WINDOW.wrapping_add(addr),
                    write,
                    line,
                )),
            },
        }
    }
}

/// The space and in-space offset of a generic address.
fn resolve_generic(addr: u64) -> Option<(Sp, u64)> {
    let sp = if addr >= DEVICE_VA_BASE {
        Sp::Global
    } else if addr.wrapping_sub(SHARED_WINDOW) < WINDOW_BYTES {
        Sp::Shared
    } else if addr.wrapping_sub(LOCAL_WINDOW) < WINDOW_BYTES {
        Sp::Local
    } else if addr.wrapping_sub(PARAM_WINDOW) < WINDOW_BYTES {
        Sp::Param
    } else {
        return None;
    };
    Some((sp, addr - window_base(sp)))
}

/// Evaluates the register-only op at `op` on the thread's register file
/// `regs` (`nregs` slots), as the interpreter does.
///
/// # Safety
/// `op` points to a live op and `regs` to `nregs` writable registers.
pub(super) unsafe extern "C" fn rt_register_op(op: *const Op, regs: *mut u64, nregs: u64) {
    // SAFETY: the compiled code passes an op its module owns and the
    // thread's register file of `nregs` slots (the caller's contract).
    let (op, regs) = unsafe { (&*op, std::slice::from_raw_parts_mut(regs, nregs as usize)) };
    // the alu never panics on validated ops; a panic must not cross into compiled code
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_register_op(op, regs, 0, 0)
    }));
}

/// Slow path of a load at access site `site`: `size` bytes at `addr` in
/// space `sp` into `*out`; 0, or 1 with the fault kept in the context.
///
/// # Safety
/// `ctx` is the live context of the running block, `local` the thread's
/// local memory of `ctx.local_bytes` bytes, `out` writable.
pub(super) unsafe extern "C" fn rt_load(
    ctx: *mut Ctx<'_>,
    site: u32,
    local: *mut u8,
    sp: u32,
    addr: u64,
    size: u32,
    line: u32,
    out: *mut u64,
) -> u32 {
    // SAFETY: the caller's contract: a live context, used by this thread only.
    let ctx = unsafe { &mut *ctx };
    let done = ctx
        .checked_ptr(site, local, space_of(sp), addr, size, false, line)
        .map(|p| {
            // SAFETY: `checked_ptr` checked bounds and alignment against a
            // live buffer; `out` is the caller's slot.
            unsafe { *out = atomic_load(p, size) };
        });
    ctx.status(done)
}

/// Slow path of a store of `val` (`size` bytes at `addr` in space `sp`); 0,
/// or 1 with the fault kept in the context.
///
/// # Safety
/// As [`rt_load`].
pub(super) unsafe extern "C" fn rt_store(
    ctx: *mut Ctx<'_>,
    site: u32,
    local: *mut u8,
    sp: u32,
    addr: u64,
    size: u32,
    line: u32,
    val: u64,
) -> u32 {
    // SAFETY: the caller's contract: a live context, used by this thread only.
    let ctx = unsafe { &mut *ctx };
    let done = ctx
        .checked_ptr(site, local, space_of(sp), addr, size, true, line)
        .map(|p| {
            ctx.log_store(p, size);
            // SAFETY: `checked_ptr` checked bounds and alignment of a live buffer.
            unsafe { atomic_store(p, size, val) };
        });
    ctx.status(done)
}

/// An ordered vector load of 16 bytes at `addr` in space `sp` as one
/// atomic access (`whole_vector`): its two words into `out[0..2]`; 0, or 1
/// with the fault kept in the context.
///
/// # Safety
/// As [`rt_load`], with 16 bytes writable at `out`.
pub(super) unsafe extern "C" fn rt_load_whole(
    ctx: *mut Ctx<'_>,
    site: u32,
    local: *mut u8,
    sp: u32,
    addr: u64,
    line: u32,
    out: *mut u64,
) -> u32 {
    // SAFETY: the caller's contract: a live context, used by this thread only.
    let ctx = unsafe { &mut *ctx };
    let done = ctx
        .checked_ptr(site, local, space_of(sp), addr, 16, false, line)
        .map(|p| {
            // SAFETY: `checked_ptr` checked bounds and alignment (16) of a
            // live buffer; `out` is the caller's 16-byte slot.
            unsafe {
                let words = load_whole(p, 16);
                *out = words[0];
                *out.add(1) = words[1];
            }
        });
    ctx.status(done)
}

/// An ordered vector store of the 16 bytes `lo`, `hi` at `addr` in space
/// `sp` as one atomic access; 0, or 1 with the fault kept in the context.
///
/// # Safety
/// As [`rt_load`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn rt_store_whole(
    ctx: *mut Ctx<'_>,
    site: u32,
    local: *mut u8,
    sp: u32,
    addr: u64,
    line: u32,
    lo: u64,
    hi: u64,
) -> u32 {
    // SAFETY: the caller's contract: a live context, used by this thread only.
    let ctx = unsafe { &mut *ctx };
    let done = ctx
        .checked_ptr(site, local, space_of(sp), addr, 16, true, line)
        .map(|p| {
            ctx.log_store(p, 16);
            // SAFETY: `checked_ptr` checked bounds and alignment (16) of a live buffer.
            unsafe { store_whole(p, 16, [lo, hi]) };
        });
    ctx.status(done)
}

/// Logs the `size` bytes at `p` before a lane kernel's store there (the
/// log full: it grows).
///
/// # Safety
/// `ctx` is the running block's live context; `p` is in bounds of a live
/// buffer and aligned to `size` (to 4 for 16 bytes): the store's fast path
/// checked it.
pub(super) unsafe extern "C" fn rt_log_store(ctx: *mut Ctx<'_>, p: *mut u8, size: u32) {
    // SAFETY: the caller's contract: a live context, used by this thread only.
    let ctx = unsafe { &mut *ctx };
    ctx.log_store(p, size);
}

impl Ctx<'_> {
    /// Keeps the old bits at `p` when the block's stores are logged.
    fn log_store(&mut self, p: *mut u8, size: u32) {
        let Some(log) = &mut self.undo else {
            return;
        };
        let at = self.log_len as usize;
        if at == log.len() {
            log.resize((2 * at).max(256), Logged::EMPTY);
            self.log = log.as_mut_ptr();
            self.log_cap = log.len() as u64;
        }
        // SAFETY: the store about to happen checked `p` (aligned to its
        // size, to 4 for 16 bytes, in bounds, live).
        let old = unsafe {
            match size {
                16 => [0, 8].map(|k| atomic_load(p.add(k), 4) | atomic_load(p.add(k + 4), 4) << 32),
                _ => [atomic_load(p, size), 0],
            }
        };
        log[at] = Logged {
            p,
            size: size as u64,
            old,
        };
        self.log_len += 1;
    }
}

/// `nanosleep`: the thread yields at its next backward branch and waits
/// about `ns` nanoseconds there only if no other thread of its block can
/// run (`Ctx::sleep_ns`).
///
/// # Safety
/// `ctx` is the live context of the running block.
pub(super) unsafe extern "C" fn rt_nanosleep(ctx: *mut Ctx<'_>, ns: u64) {
    // SAFETY: the caller's contract: a live context, used by this thread only.
    let ctx = unsafe { &mut *ctx };
    ctx.sleep_ns = ctx.sleep_ns.max(ns);
    ctx.check_at = 0;
}

/// `atom` (op `op`, an `Op::Atom`) at `addr` with operands `b` and `c`; the
/// old value into `*out`; 0, or 1 with the fault kept in the context.
///
/// # Safety
/// As [`rt_load`]; `op` points to a live `Op::Atom`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe extern "C" fn rt_atom(
    ctx: *mut Ctx<'_>,
    site: u32,
    local: *mut u8,
    op: *const Op,
    addr: u64,
    b: u64,
    c: u64,
    line: u32,
    out: *mut u64,
) -> u32 {
    // SAFETY: the caller's contract: a live context and op, used by this thread only.
    let (ctx, op) = unsafe { (&mut *ctx, &*op) };
    let Op::Atom {
        addr: at, op, t, ..
    } = *op
    else {
        let wrong = Fault::Failed("internal error: atom helper on another op".into());
        return ctx.status(Err(wrong));
    };
    let size = t.bytes();
    let done = ctx
        .checked_ptr(site, local, at.sp, addr, size, true, line)
        .map(|p| {
            // SAFETY: `checked_ptr` checked bounds and alignment (size 2, 4
            // or 8) of a live buffer; `out` is the caller's slot.
            unsafe { *out = atomic_rmw(p, size, |o| atom_apply(op, t, o, b, c)) };
        });
    ctx.status(done)
}

/// `trap` (op `op`, an `Op::Trap`) on `line` by thread `lin`: keeps the
/// interpreter's fault; returns 1.
///
/// # Safety
/// `ctx` is the live context of the running block, `op` a live op.
pub(super) unsafe extern "C" fn rt_trap(
    ctx: *mut Ctx<'_>,
    op: *const Op,
    line: u32,
    lin: u32,
) -> u32 {
    // SAFETY: the caller's contract: a live context and op, used by this thread only.
    let (ctx, op) = unsafe { (&mut *ctx, &*op) };
    let msg = match op {
        Op::Trap(msg) => msg.as_str(),
        _ => "trap",
    };
    ctx.fault = Some(Fault::Trap {
        detail: format!("{msg} at line {line} (thread {lin}, block {:?})", ctx.ctaid),
    });
    1
}

/// A vector access at `addr` not aligned to its `total` bytes: keeps the
/// fault the interpreter gives; returns 1.
///
/// # Safety
/// `ctx` is the live context of the running block.
pub(super) unsafe extern "C" fn rt_misaligned_vector(
    ctx: *mut Ctx<'_>,
    addr: u64,
    total: u32,
    write: u32,
    line: u32,
) -> u32 {
    // SAFETY: the caller's contract: a live context, used by this thread only.
    let ctx = unsafe { &mut *ctx };
    let what = if write != 0 { "store" } else { "load" };
    ctx.fault = Some(Fault::MisalignedAddress {
        addr,
        detail: format!("{total}-byte vector {what} at line {line}"),
    });
    1
}
