//! Dynamic parallelism (CDP2): the device runtime calls of a grid's threads
//! (parameter buffers, launches queued, streams, last errors, cudaMalloc).

use super::access::{local_get, local_put, Access};
use super::runtime::*;
use super::state::{Block, Geo, Thread};
use crate::ir::{ArgLoc, CdpCall, CdpFn, Sp, Src, FUNC_WIN};
use crate::launch::{check_config, Fault, LaunchConfig};
use std::sync::atomic::Ordering;

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
            let params_len = match kernel.and_then(|k| g.kernels.get(k)) {
                Some(info) => info.params_bytes() as usize,
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

/// What stops launch `h` into `stream` (0: nothing): the kernel and its
/// shape checked as a host's launch is ([`check_config`]); a queued launch
/// counts as pending.
fn check(g: &Geo<'_>, h: &Header, stream: u64) -> u32 {
    let cdp = g.cdp;
    let Some(info) = h.kernel.and_then(|k| g.kernels.get(k)) else {
        return INVALID_DEVICE_FUNCTION;
    };
    if check_config(info, &h.cfg, h.params_len).is_err() {
        return INVALID_CONFIGURATION;
    }
    let known =
        matches!(stream, 0 | TAIL | FIRE_AND_FORGET) || lock(&cdp.streams).contains(&stream);
    if !known {
        return INVALID_RESOURCE_HANDLE;
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
