//! Dynamic parallelism (CDP2): a grid's threads queue device-side launches,
//! which run after that grid ends, in launch order, tail launches last.

use super::access::{local_get, local_put, Access};
use super::grid::Executable;
use super::state::{Block, Geo, Thread};
use crate::ir::{ArgLoc, CdpCall, CdpFn, Sp, Src, FUNC_WIN};
use crate::launch::{Fault, LaunchConfig, LaunchLimits, LaunchReport};
use crate::memory::DeviceMemory;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Deepest nesting of device-side launches (the host's launch is depth 0).
pub(crate) const MAX_DEPTH: u32 = 24;
/// Launches queued and not yet started, the whole tree together
/// (`cudaLimitDevRuntimePendingLaunchCount`'s default).
pub(crate) const PENDING_LIMIT: usize = 2048;

/// `cudaStreamTailLaunch` and `cudaStreamFireAndForget`.
const TAIL: u64 = 3;
const FIRE_AND_FORGET: u64 = 4;
/// Handles of streams made on the device start here.
const STREAM_BASE: u64 = 0x1000;

// the runtime's `cudaError_t` codes a device-side call returns
const INVALID_VALUE: u32 = 1;
const MEMORY_ALLOCATION: u32 = 2;
const INVALID_CONFIGURATION: u32 = 9;
const MAX_DEPTH_EXCEEDED: u32 = 65;
const PENDING_COUNT_EXCEEDED: u32 = 69;
const INVALID_DEVICE_FUNCTION: u32 = 98;
const INVALID_RESOURCE_HANDLE: u32 = 400;

/// A parameter buffer handed out: the launch it is for.
#[derive(Debug, Clone, Copy)]
struct Header {
    /// Index into the module's kernels, `None` for a bad function address.
    kernel: Option<usize>,
    cfg: LaunchConfig,
    params_len: usize,
}

/// A launch queued by a thread of the grid.
#[derive(Debug)]
struct Queued {
    kernel: usize,
    cfg: LaunchConfig,
    buf: u64,
    params_len: usize,
    tail: bool,
}

/// One grid's device runtime: its parameter buffers, queued launches,
/// streams and each thread's last error.
#[derive(Debug)]
pub(super) struct Cdp<'a> {
    depth: u32,
    /// Launches queued and not started in the whole tree.
    pending: &'a AtomicUsize,
    bufs: Mutex<HashMap<u64, Header>>,
    queue: Mutex<Vec<Queued>>,
    streams: Mutex<HashSet<u64>>,
    next_stream: AtomicU64,
    errors: Mutex<HashMap<([u32; 3], u32), u32>>,
}

impl<'a> Cdp<'a> {
    pub(super) fn new(depth: u32, pending: &'a AtomicUsize) -> Cdp<'a> {
        Cdp {
            depth,
            pending,
            bufs: Mutex::default(),
            queue: Mutex::default(),
            streams: Mutex::default(),
            next_stream: AtomicU64::new(STREAM_BASE),
            errors: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The value of argument `l`; `word` picks a 4-byte word of a `.param`
/// aggregate (a `dim3`), else the whole value.
fn arg(th: &mut Thread, l: &ArgLoc, word: Option<u32>) -> u64 {
    match (*l, word) {
        (ArgLoc::Frame { off, .. }, Some(k)) => {
            local_get(&mut th.local, th.lbase + off + 4 * k, 4).unwrap_or(0)
        }
        (ArgLoc::Frame { off, size }, None) => {
            local_get(&mut th.local, th.lbase + off, size.min(8)).unwrap_or(0)
        }
        (ArgLoc::Val { src, .. }, None | Some(0)) => th.get(src),
        (ArgLoc::Val { .. }, Some(_)) => 0,
    }
}

fn dim3(th: &mut Thread, l: Option<&ArgLoc>) -> [u32; 3] {
    let Some(l) = l else { return [0; 3] };
    [0, 1, 2].map(|k| arg(th, l, Some(k)) as u32)
}

/// Runs device runtime call `c` of thread `lin` of block `b`.
pub(super) fn step(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    c: &CdpCall,
    lin: u32,
    line: u32,
) -> Result<(), Fault> {
    let cdp = g.cdp;
    let a = |th: &mut Thread, i: usize| c.args.get(i).map_or(0, |l| arg(th, l, None));
    let key = (b.ctaid, lin);
    let ret = match c.func {
        CdpFn::GetParameterBuffer => {
            let f = a(th, 0);
            let cfg = LaunchConfig {
                grid: dim3(th, c.args.get(1)),
                block: dim3(th, c.args.get(2)),
                dynamic_shared_bytes: a(th, 3) as u32,
            };
            let fidx = f.wrapping_sub(FUNC_WIN);
            let kernel = g.prog.kernels.iter().position(|&k| k as u64 == fidx);
            let params_len = match kernel {
                Some(k) => g.param_lens.get(k).copied().unwrap_or(4096),
                None => 4096,
            };
            let buf = g.memory.heap_malloc(params_len.max(8) as u64);
            if buf == 0 {
                lock(&cdp.errors).insert(key, MEMORY_ALLOCATION);
            } else {
                let h = Header {
                    kernel,
                    cfg,
                    params_len,
                };
                lock(&cdp.bufs).insert(buf, h);
            }
            buf
        }
        CdpFn::LaunchDevice => {
            let (buf, stream) = (a(th, 0), a(th, 1));
            let code = launch(g, buf, stream);
            if code != 0 {
                lock(&cdp.errors).insert(key, code);
            }
            code as u64
        }
        CdpFn::GetLastError => lock(&cdp.errors).remove(&key).unwrap_or(0) as u64,
        CdpFn::PeekAtLastError => lock(&cdp.errors).get(&key).copied().unwrap_or(0) as u64,
        CdpFn::StreamCreate => {
            // a device-side stream must be non-blocking
            if a(th, 1) != 1 {
                INVALID_VALUE as u64
            } else {
                let s = cdp.next_stream.fetch_add(1, Ordering::Relaxed);
                lock(&cdp.streams).insert(s);
                let at = a(th, 0);
                store(g, b, th, at, s, 8, line)?;
                0
            }
        }
        CdpFn::StreamDestroy => {
            if lock(&cdp.streams).remove(&a(th, 0)) {
                0
            } else {
                INVALID_RESOURCE_HANDLE as u64
            }
        }
        CdpFn::Malloc => {
            let (at, size) = (a(th, 0), a(th, 1));
            let p = g.memory.heap_malloc(size);
            store(g, b, th, at, p, 8, line)?;
            if p == 0 {
                MEMORY_ALLOCATION as u64
            } else {
                0
            }
        }
        CdpFn::Free => {
            let p = a(th, 0);
            if p == 0 || g.memory.heap_free(p) {
                0
            } else {
                INVALID_VALUE as u64
            }
        }
        CdpFn::GetDevice => {
            let at = a(th, 0);
            store(g, b, th, at, 0, 4, line)?;
            0
        }
    };
    match c.ret {
        Some(ArgLoc::Frame { off, size }) => {
            local_put(&mut th.local, th.lbase + off, ret, size);
        }
        Some(ArgLoc::Val {
            src: Src::Reg(d), ..
        }) => th.set(d, ret),
        _ => {}
    }
    Ok(())
}

/// Writes `v` (`size` bytes) at generic address `addr` for the thread.
fn store(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    addr: u64,
    v: u64,
    size: u32,
    line: u32,
) -> Result<(), Fault> {
    let at = Access {
        sp: Sp::Generic,
        addr,
        size,
        line,
    };
    b.store(g, &mut th.local, at, v)
}

/// `cudaLaunchDevice(buf, stream)`: queues the launch `buf` was made for;
/// the error code it returns (0: queued).
fn launch(g: &Geo<'_>, buf: u64, stream: u64) -> u32 {
    let cdp = g.cdp;
    let Some(h) = lock(&cdp.bufs).remove(&buf) else {
        return INVALID_VALUE;
    };
    let code = check(g, &h, stream);
    let Some(kernel) = h.kernel.filter(|_| code == 0) else {
        g.memory.heap_free(buf);
        return code;
    };
    lock(&cdp.queue).push(Queued {
        kernel,
        cfg: h.cfg,
        buf,
        params_len: h.params_len,
        tail: stream == TAIL,
    });
    0
}

/// What stops launch `h` into `stream` (0: nothing); a queued launch counts
/// as pending.
fn check(g: &Geo<'_>, h: &Header, stream: u64) -> u32 {
    let cdp = g.cdp;
    if h.kernel.is_none() {
        return INVALID_DEVICE_FUNCTION;
    }
    let [bx, by, bz] = h.cfg.block;
    let [gx, gy, gz] = h.cfg.grid;
    let threads = bx as u64 * by as u64 * bz as u64;
    if [bx, by, bz, gx, gy, gz].contains(&0)
        || bx > 1024
        || by > 1024
        || bz > 64
        || threads > 1024
        || gx > i32::MAX as u32
        || gy > 65535
        || gz > 65535
    {
        return INVALID_CONFIGURATION;
    }
    let known =
        matches!(stream, 0 | TAIL | FIRE_AND_FORGET) || lock(&cdp.streams).contains(&stream);
    if !known {
        return INVALID_RESOURCE_HANDLE;
    }
    if cdp.depth + 1 > MAX_DEPTH {
        return MAX_DEPTH_EXCEEDED;
    }
    let taken = cdp
        .pending
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < PENDING_LIMIT).then_some(n + 1)
        });
    if taken.is_err() {
        return PENDING_COUNT_EXCEEDED;
    }
    0
}

impl Executable {
    /// Runs kernel `k` at nesting `depth`, then the launches its threads
    /// queued (tail launches last), each with its own tree, one at a time:
    /// the whole tree is one report, its first fault the tree's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn launch_tree(
        &self,
        mem: &DeviceMemory,
        k: usize,
        cfg: &LaunchConfig,
        params: &[u8],
        limits: &LaunchLimits<'_>,
        grid_workspace: u64,
        depth: u32,
        pending: &AtomicUsize,
    ) -> LaunchReport {
        let cdp = Cdp::new(depth, pending);
        let mut report = self.launch_in(mem, k, cfg, params, limits, grid_workspace, &cdp);
        for buf in lock(&cdp.bufs).keys() {
            mem.heap_free(*buf);
        }
        let mut queue = std::mem::take(&mut *lock(&cdp.queue));
        queue.sort_by_key(|q| q.tail);
        for q in queue {
            pending.fetch_sub(1, Ordering::Relaxed);
            let mut p = vec![0u8; q.params_len];
            let read = mem.read(q.buf, &mut p);
            mem.heap_free(q.buf);
            if report.result.is_err() {
                continue;
            }
            if let Err(e) = read {
                report.result = Err(Fault::Failed(format!("parameter buffer lost: {e:?}")));
                continue;
            }
            let child = self.launch_tree(mem, q.kernel, &q.cfg, &p, limits, 0, depth + 1, pending);
            report.stdout.extend_from_slice(&child.stdout);
            report.instructions += child.instructions;
            report.result = child.result;
        }
        report
    }
}
