//! Contexts: client-side objects over the one server session. Each device has
//! a primary context (retained and released by the runtime); each thread has a
//! stack of current contexts.

use std::ffi::c_void;

use cumux_cuda_bindings::types::CUctxCreateParams;
use cumux_protocol::Call;

use super::sync::{marked, poll_until_ready, settled, AfterSync};
use super::*;
use crate::state::{self, client, Client, Context};

/// `CU_LIMIT_*` values reported by `cuCtxGetLimit`.
fn limit_value(limit: u32) -> CuResult<usize> {
    Ok(match limit {
        0 => 1024,    // stack size
        1 => 1 << 20, // printf FIFO
        2 => 8 << 20, // malloc heap
        3 => 2,       // device runtime sync depth
        4 => 2048,    // pending launch count
        5 => 32,      // max L2 fetch granularity
        6 => 0,       // persisting L2 cache size
        7..=9 => 0,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

fn new_context(flags: u32, dev: i32) -> CuResult<usize> {
    let c = client()?;
    c.device(dev)?;
    let h = state::handles::context(c.mint(), dev as u32);
    c.lock().contexts.insert(
        h,
        Context {
            device: dev as u32,
            primary: false,
            flags,
            limits: Default::default(),
        },
    );
    state::push_context(h);
    Ok(h)
}

/// Waits for every stream, host functions included.
fn synchronize() -> CuResult<()> {
    let c = client()?;
    let (mut streams, after, device) = {
        let st = c.lock();
        let device = st.context_device()?;
        (st.streams_on(device), AfterSync::context(&st), device)
    };
    // Poll first every stream with work sent since the last context
    // synchronize, leaving the connection free in between (see
    // `poll_until_ready`); the synchronize itself then waits for all, so a
    // stream passed over here is still waited for.
    let link = c.link(device, "ContextSynchronize")?;
    let touched = link.take_touched();
    // Every stream's last work already waited for (`transport::quiet`).
    if link.all_idle() || settled(c, device, None, &after)? {
        return after.finish(c);
    }
    // Every stream that may have work left, waited for through marks.
    if let Some(busy) = link.busy_streams() {
        if marked(c, device, &busy, &after)? {
            return after.finish(c);
        }
    }
    streams.retain(|s| touched.contains(s));
    streams.push(cumux_protocol::DEFAULT_STREAM);
    for stream in streams {
        poll_until_ready(c, device, || Call::StreamQuery { stream })?;
    }
    c.call_on(device, Call::ContextSynchronize)?;
    crate::marks::after_wait(c, device);
    after.finish(c)
}

fn check_context(ctx: usize) -> CuResult<()> {
    if client()?.lock().contexts.contains_key(&ctx) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_CONTEXT)
    }
}

/// `cuCtxEnablePeerAccess` (`Some(flags)`) or `cuCtxDisablePeerAccess`
/// (`None`) from the current context to `peer`.
fn peer_access(peer: *mut c_void, enable: Option<u32>) -> CuResult<()> {
    let c = client()?;
    let current = state::current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    let (mine, theirs) = {
        let st = c.lock();
        let device_of = |h: usize| st.contexts.get(&h).map(|cx| cx.device);
        let mine = device_of(current).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let theirs = device_of(handle(peer)).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        (mine, theirs)
    };
    if enable.is_some_and(|flags| flags != 0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if mine == theirs {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    let access = super::device::P2P_ACCESS_SUPPORTED;
    if super::device::peer_attribute(c, mine as i32, theirs as i32, access)? == 0 {
        return Err(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    }
    let pair = (mine, theirs);
    let enabled = c.lock().peer_access.contains(&pair);
    match (enable.is_some(), enabled) {
        (true, true) => return Err(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
        (false, false) => return Err(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED),
        _ => {}
    }
    switch_peer_access(c, mine, theirs, enable.is_some())
}

/// Turns access from `mine`'s context to `theirs`'s memory on or off on the
/// server, and notes it (the caller has checked that the change is due).
pub(super) fn switch_peer_access(c: &Client, mine: u32, theirs: u32, on: bool) -> CuResult<()> {
    // The peer's session must be open for the server to find its context.
    c.link(theirs, "PeerAccess")?;
    let call = Call::PeerAccess {
        peer: theirs,
        enable: on,
    };
    c.call_on(mine, call)?;
    let mut st = c.lock();
    match on {
        true => st.peer_access.insert((mine, theirs)),
        false => st.peer_access.remove(&(mine, theirs)),
    };
    Ok(())
}

fn current_or(ctx: *mut c_void) -> CuResult<usize> {
    match handle(ctx) {
        0 => state::current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT),
        c => Ok(c),
    }
}

driver_fn! {
    fn cuDevicePrimaryCtxRetain(pctx: *mut *mut c_void, dev: i32) {
        let c = client()?;
        c.device(dev)?;
        let h = {
            let mut st = c.lock();
            let h = st.primary_context(dev as u32, || c.mint());
            if let Some(p) = st.primary.get_mut(&(dev as u32)) {
                p.refs += 1;
            }
            h
        };
        out(pctx, to_ptr(h))
    }

    fn cuDevicePrimaryCtxRelease | cuDevicePrimaryCtxRelease_v2 (dev: i32) {
        let c = client()?;
        c.device(dev)?;
        let mut st = c.lock();
        let p = st.primary.get_mut(&(dev as u32)).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        p.refs = p.refs.saturating_sub(1);
        Ok(())
    }

    fn cuDevicePrimaryCtxReset | cuDevicePrimaryCtxReset_v2 (dev: i32) {
        let c = client()?;
        c.device(dev)?;
        c.call_on(dev as u32, Call::ContextSynchronize)?;
        if let Some(p) = c.lock().primary.get_mut(&(dev as u32)) {
            p.refs = 0;
            p.flags = 0;
        }
        Ok(())
    }

    fn cuDevicePrimaryCtxGetState(dev: i32, flags: *mut u32, active: *mut i32) {
        let c = client()?;
        c.device(dev)?;
        let st = c.lock();
        let (f, a) = st
            .primary
            .get(&(dev as u32))
            .map(|p| (p.flags, p.refs > 0))
            .unwrap_or((0, false));
        out(flags, f)?;
        out(active, a as i32)
    }

    fn cuDevicePrimaryCtxSetFlags | cuDevicePrimaryCtxSetFlags_v2 (dev: i32, flags: u32) {
        let c = client()?;
        c.device(dev)?;
        let mut st = c.lock();
        st.primary_context(dev as u32, || c.mint());
        if let Some(p) = st.primary.get_mut(&(dev as u32)) {
            p.flags = flags;
        }
        Ok(())
    }

    fn cuCtxCreate_v2(pctx: *mut *mut c_void, flags: u32, dev: i32) {
        out(pctx, to_ptr(new_context(flags, dev)?))
    }

    fn cuCtxCreate_v3(pctx: *mut *mut c_void, _params: *mut c_void, _n: i32, flags: u32, dev: i32) {
        out(pctx, to_ptr(new_context(flags, dev)?))
    }

    fn cuCtxCreate_v4(pctx: *mut *mut c_void, _params: *mut CUctxCreateParams, flags: u32, dev: i32) {
        out(pctx, to_ptr(new_context(flags, dev)?))
    }

    fn cuCtxDestroy_v2(ctx: *mut c_void) {
        let c = client()?;
        let h = handle(ctx);
        let removed = {
            let mut st = c.lock();
            match st.contexts.get(&h) {
                Some(cx) if cx.primary => return Err(CUDA_ERROR_INVALID_CONTEXT),
                Some(_) => st.contexts.remove(&h),
                None => None,
            }
        };
        let device = removed.ok_or(CUDA_ERROR_INVALID_CONTEXT)?.device;
        state::forget_context(h);
        c.call_on(device, Call::ContextSynchronize).map(|_| ())
    }

    // Peer access where the server's GPUs have it (`DeviceInfo::peers`): the
    // program's contexts share one worker process, which enables it.
    fn cuCtxEnablePeerAccess(peer: *mut c_void, flags: u32) {
        peer_access(peer, Some(flags))
    }

    fn cuCtxDisablePeerAccess(peer: *mut c_void) {
        peer_access(peer, None)
    }

    fn cuCtxPushCurrent_v2(ctx: *mut c_void) {
        check_context(handle(ctx))?;
        state::push_context(handle(ctx));
        Ok(())
    }

    fn cuCtxPopCurrent_v2(pctx: *mut *mut c_void) {
        let h = state::pop_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        out_opt(pctx, to_ptr(h));
        Ok(())
    }

    fn cuCtxSetCurrent(ctx: *mut c_void) {
        let h = handle(ctx);
        if h != 0 {
            check_context(h)?;
        }
        state::set_current_context((h != 0).then_some(h));
        Ok(())
    }

    fn cuCtxGetCurrent(pctx: *mut *mut c_void) {
        client()?;
        out(pctx, to_ptr(state::current_context().unwrap_or(0)))
    }

    fn cuCtxGetDevice(dev: *mut i32) {
        let c = client()?;
        let ctx = state::current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let d = c.lock().contexts.get(&ctx).map(|x| x.device).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        out(dev, d as i32)
    }

    fn cuCtxGetDevice_v2(dev: *mut i32, ctx: *mut c_void) {
        let c = client()?;
        let ctx = current_or(ctx)?;
        let d = c.lock().contexts.get(&ctx).map(|x| x.device).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        out(dev, d as i32)
    }

    fn cuCtxGetFlags(flags: *mut u32) {
        let c = client()?;
        let ctx = state::current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        let f = c.lock().contexts.get(&ctx).map(|x| x.flags).unwrap_or(0);
        out(flags, f)
    }

    fn cuCtxSetFlags(flags: u32) {
        let c = client()?;
        let ctx = state::current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        if let Some(cx) = c.lock().contexts.get_mut(&ctx) {
            cx.flags = flags;
        }
        Ok(())
    }

    fn cuCtxGetId(ctx: *mut c_void, id: *mut u64) {
        client()?;
        out(id, current_or(ctx)? as u64)
    }

    fn cuCtxGetApiVersion(_ctx: *mut c_void, version: *mut u32) {
        client()?;
        out(version, 3020)
    }

    fn cuCtxSynchronize() {
        synchronize()
    }

    fn cuCtxSynchronize_v2(_ctx: *mut c_void) {
        synchronize()
    }

    fn cuCtxGetLimit(value: *mut usize, limit: u32) {
        let c = client()?;
        let default = limit_value(limit)?;
        let st = c.lock();
        let ctx = st.contexts.get(&current_or(std::ptr::null_mut())?).ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
        out(value, ctx.limits.get(&limit).copied().unwrap_or(default))
    }

    fn cuCtxSetLimit(limit: u32, value: usize) {
        let c = client()?;
        limit_value(limit)?;
        let ctx = current_or(std::ptr::null_mut())?;
        let device = c.lock().contexts.get(&ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.device;
        // The device applies every limit (stack, printf buffer, heap, ...):
        // one kept only here would be success for something not done.
        c.call_on(device, Call::SetLimit { limit, value: value as u64 })?;
        let mut st = c.lock();
        st.contexts.get_mut(&ctx).ok_or(CUDA_ERROR_INVALID_CONTEXT)?.limits.insert(limit, value);
        Ok(())
    }

    fn cuCtxGetCacheConfig(config: *mut u32) {
        client()?;
        out(config, 0)
    }

    fn cuCtxSetCacheConfig(_config: u32) {
        client().map(|_| ())
    }

    fn cuCtxGetSharedMemConfig(config: *mut u32) {
        client()?;
        out(config, 1)
    }

    fn cuCtxSetSharedMemConfig(_config: u32) {
        client().map(|_| ())
    }

    fn cuCtxGetStreamPriorityRange(least: *mut i32, greatest: *mut i32) {
        client()?;
        out_opt(least, 0);
        out_opt(greatest, -5);
        Ok(())
    }

    fn cuCtxResetPersistingL2Cache() {
        client().map(|_| ())
    }
}
