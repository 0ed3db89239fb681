//! Streams and events. Records and waits are stream-ordered (no reply);
//! queries and synchronisation are round trips that also surface sticky
//! errors. Streams and events are named by their server handles
//! (`crate::state::handles`).

use std::ffi::c_void;

use cumux_cuda_bindings::consts::{
    CU_EVENT_INTERPROCESS, CU_EVENT_RECORD_EXTERNAL, CU_EVENT_WAIT_EXTERNAL,
};
use cumux_cuda_bindings::types::{CUgraphEdgeData, CUgraphNode};
use cumux_protocol::{device_of_handle, Call, Handle, ReplyBody, MAX_STREAMS};

use super::sync::{known_idle, known_reached, marked, poll_until_ready, settled, AfterSync};
use super::*;
use crate::marks::{self, EventMark};
use crate::state::handles::{self, to_program};
use crate::state::{client, Client, Event, StateGuard, Stream};

/// Stream priorities: 0 is the lowest, -5 the highest.
const PRIORITY_LEAST: i32 = 0;
const PRIORITY_GREATEST: i32 = -5;

/// `CU_STREAM_CAPTURE_STATUS_ACTIVE` when the stream is being captured.
const CAPTURE_ACTIVE: u32 = 1;

/// A stream the program names, checked under the lock (which stays held).
fn known_stream(s: *mut c_void) -> CuResult<(&'static Client, StateGuard<'static>, Handle)> {
    let c = client()?;
    let stream = handles::stream(s)?;
    let st = c.lock();
    st.check_stream(stream)?;
    Ok((c, st, stream))
}

/// Checks a `cuStreamUpdateCaptureDependencies`: a capturing stream, known
/// nodes, flags add (0) or set (1).
fn capture_dependencies(
    s: *mut c_void,
    deps: *mut CUgraphNode,
    n: usize,
    flags: u32,
) -> CuResult<()> {
    let (_, st, stream) = known_stream(s)?;
    if !st.capturing(stream) {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    if flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let nodes = super::graph_nodes::node_list(deps.cast_const().cast(), n)?;
    if nodes.iter().any(|node| !st.nodes.contains_key(node)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// The stream the program names and its `CUstreamCaptureStatus`.
fn capture_status(s: *mut c_void) -> CuResult<(Handle, u32)> {
    let (_, st, stream) = known_stream(s)?;
    let status = if st.capturing(stream) {
        CAPTURE_ACTIVE
    } else {
        0
    };
    Ok((stream, status))
}

/// The server handle of an event the program names, checked under `st`.
fn known_event(st: &StateGuard<'_>, e: *mut c_void) -> CuResult<Handle> {
    let event = handles::wire_or_invalid(e)?;
    st.check_event(event)?;
    Ok(event)
}

fn create_stream(c: &Client, flags: u32, priority: i32) -> CuResult<*mut c_void> {
    let device = c.lock().context_device()?;
    if flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let priority = priority.clamp(PRIORITY_GREATEST, PRIORITY_LEAST);
    let stream = c.create_on(device, Call::StreamCreate { flags, priority }, |handle| {
        // A session's limit, told at once rather than at the next wait.
        let st = c.lock();
        let on_device = st
            .streams
            .keys()
            .filter(|s| device_of_handle(**s) == device);
        if on_device.count() >= MAX_STREAMS {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(Call::NewStream {
            handle,
            flags,
            priority,
        })
    })?;
    c.lock().streams.insert(stream, Stream { flags, priority });
    Ok(to_program(stream))
}

fn elapsed(ms: *mut f32, start: *mut c_void, end: *mut c_void) -> CuResult<()> {
    let c = client()?;
    let (start, end) = {
        let st = c.lock();
        (known_event(&st, start)?, known_event(&st, end)?)
    };
    let answer = match c.call(Call::EventElapsed { start, end }) {
        // The program's waits for these events may have been answered here
        // (recorded behind no work: `transport::quiet`), before the device
        // stamped them: it stamps them at once, so wait for that and ask again.
        Err(CUDA_ERROR_NOT_READY) if known_reached(c, start) || known_reached(c, end) => {
            for event in [start, end] {
                let device = cumux_protocol::device_of_handle(event);
                c.call_on(device, Call::EventSynchronize { event })?;
            }
            c.call(Call::EventElapsed { start, end })
        }
        answer => answer,
    };
    match answer? {
        ReplyBody::ElapsedMs(v) => out(ms, v),
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

/// Records an event in stream order, or into the stream's capture: there
/// a node only with `CU_EVENT_RECORD_EXTERNAL` (`flags`), as the driver does.
fn record(e: *mut c_void, s: *mut c_void, flags: u32) -> CuResult<()> {
    let c = client()?;
    let stream = handles::stream(s);
    let mut st = c.lock();
    let event = known_event(&st, e)?;
    let stream = stream?;
    st = c.ready_stream(st, stream)?;
    let shared = st
        .events
        .get(&event)
        .is_some_and(|e| e.flags & CU_EVENT_INTERPROCESS != 0);
    // An external record is a node of a capture (recorded at each launch).
    let call = Call::EventRecord { event, stream };
    let call = match flags & CU_EVENT_RECORD_EXTERNAL != 0 {
        true => st.capture_node(stream, call),
        false => st.capture_call(call),
    };
    drop(st);
    let Some(call) = call else { return Ok(()) };
    marks::send_marked(c, call)?;
    // Another program may wait for this record as soon as it returns, as
    // the driver lets it: the server has taken it once a fence comes back.
    if shared {
        c.call(Call::Fence)?;
    }
    Ok(())
}

driver_fn! {
    fn cuStreamCreate(ps: *mut *mut c_void, flags: u32) {
        out(ps, create_stream(client()?, flags, 0)?)
    }

    fn cuStreamCreateWithPriority(ps: *mut *mut c_void, flags: u32, priority: i32) {
        out(ps, create_stream(client()?, flags, priority)?)
    }

    fn cuStreamDestroy_v2(s: *mut c_void) {
        let c = client()?;
        let stream = handles::stream(s);
        let mut st = c.lock();
        // Host functions still queued on the stream run first.
        if let Ok(stream) = stream {
            while st.host_fns_pending(stream) {
                st = c.wait(st);
            }
        }
        let stream = stream?;
        st.streams.remove(&stream).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        drop(st);
        // A late mark into the slot stores a value below any its next
        // owner waits for.
        marks::release_stream(c, c.device_for(0, Some(stream)), stream);
        c.call(Call::StreamDestroy { stream }).map(|_| ())
    }

    fn cuStreamSynchronize | cuStreamSynchronize_ptsz (s: *mut c_void) {
        let (c, st, stream) = known_stream(s)?;
        if st.capturing(stream) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        let after = AfterSync::stream(&st, stream);
        drop(st);
        // A stream found finished by a poll was synchronized with it.
        let device = c.device_for(0, Some(stream));
        if !known_idle(c, device, stream)
            && !settled(c, device, Some(stream), &after)?
            && !marked(c, device, &[stream], &after)?
        {
            if !poll_until_ready(c, device, || Call::StreamQuery { stream })? {
                c.call(Call::StreamSynchronize { stream })?;
            }
            marks::after_wait(c, device);
        }
        after.finish(c)
    }

    fn cuStreamQuery | cuStreamQuery_ptsz (s: *mut c_void) {
        let (c, st, stream) = known_stream(s)?;
        if st.host_fns_pending(stream) {
            return Err(CUDA_ERROR_NOT_READY);
        }
        drop(st);
        if known_idle(c, c.device_for(0, Some(stream)), stream) {
            return Ok(());
        }
        c.call(Call::StreamQuery { stream }).map(|_| ())
    }

    fn cuStreamWaitEvent | cuStreamWaitEvent_ptsz (s: *mut c_void, e: *mut c_void, flags: u32) {
        let c = client()?;
        let stream = handles::stream(s)?;
        let mut st = c.ready_stream(c.lock(), stream)?;
        let event = known_event(&st, e)?;
        // An event of another device: each device is a session of its own,
        // so the wait happens here, before anything later reaches the stream.
        let event_device = cumux_protocol::device_of_handle(event);
        if event_device != c.device_for(0, Some(stream)) {
            if st.capturing(stream) {
                return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
            }
            drop(st);
            if known_reached(c, event) {
                return Ok(());
            }
            poll_until_ready(c, event_device, || Call::EventQuery { event })?;
            return c
                .call_on(event_device, Call::EventSynchronize { event })
                .map(|_| ());
        }
        let call = Call::StreamWaitEvent { stream, event };
        let call = match flags & CU_EVENT_WAIT_EXTERNAL != 0 {
            true => st.capture_node(stream, call),
            false => st.capture_call(call),
        };
        drop(st);
        match call {
            Some(call) => c.call(call).map(|_| ()),
            None => Ok(()),
        }
    }

    fn cuStreamGetPriority | cuStreamGetPriority_ptsz (s: *mut c_void, priority: *mut i32) {
        let (_, st, stream) = known_stream(s)?;
        let p = st.streams.get(&stream).map_or(0, |x| x.priority);
        drop(st);
        out(priority, p)
    }

    fn cuStreamGetFlags | cuStreamGetFlags_ptsz (s: *mut c_void, flags: *mut u32) {
        let (_, st, stream) = known_stream(s)?;
        let f = st.streams.get(&stream).map_or(0, |x| x.flags);
        drop(st);
        out(flags, f)
    }

    fn cuStreamGetId | cuStreamGetId_ptsz (s: *mut c_void, id: *mut u64) {
        let (_, st, stream) = known_stream(s)?;
        drop(st);
        out(id, stream)
    }

    fn cuStreamGetCtx | cuStreamGetCtx_ptsz (s: *mut c_void, ctx: *mut *mut c_void) {
        let (c, mut st, stream) = known_stream(s)?;
        let device = c.device_for(0, Some(stream));
        let primary = st.primary_context(device, || c.mint());
        drop(st);
        out(ctx, to_ptr(primary))
    }

    fn cuStreamGetCtx_v2 | cuStreamGetCtx_v2_ptsz (s: *mut c_void, ctx: *mut *mut c_void, green: *mut *mut c_void) {
        let (c, mut st, stream) = known_stream(s)?;
        let device = c.device_for(0, Some(stream));
        let primary = st.primary_context(device, || c.mint());
        drop(st);
        out_opt(green, std::ptr::null_mut());
        out(ctx, to_ptr(primary))
    }

    fn cuStreamGetDevice | cuStreamGetDevice_ptsz (s: *mut c_void, dev: *mut i32) {
        let (c, st, stream) = known_stream(s)?;
        let device = c.device_for(0, Some(stream));
        drop(st);
        out(dev, device as i32)
    }

    fn cuEventCreate(pe: *mut *mut c_void, flags: u32) {
        let c = client()?;
        c.lock().context_device()?;
        if flags & !0xf != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = c.lock().context_device()?;
        let event = c.new_event(device, flags)?;
        // Another process's waits on an interprocess event are its own.
        let mark = match flags & CU_EVENT_INTERPROCESS {
            0 => marks::take_slot(c, device).map(EventMark::new),
            _ => None,
        };
        c.lock().events.insert(event, Event { flags, mark });
        out(pe, to_program(event))
    }

    fn cuEventRecord | cuEventRecord_ptsz (e: *mut c_void, s: *mut c_void) {
        record(e, s, 0)
    }

    fn cuEventRecordWithFlags | cuEventRecordWithFlags_ptsz (e: *mut c_void, s: *mut c_void, flags: u32) {
        record(e, s, flags)
    }

    fn cuEventQuery(e: *mut c_void) {
        let c = client()?;
        let event = known_event(&c.lock(), e)?;
        if known_reached(c, event) || marks::watch(c, event).is_some_and(|w| w.reached()) {
            return Ok(());
        }
        c.call(Call::EventQuery { event })?;
        marks::after_wait(c, device_of_handle(event));
        Ok(())
    }

    fn cuEventSynchronize(e: *mut c_void) {
        let c = client()?;
        let (event, after) = {
            let st = c.lock();
            (known_event(&st, e)?, AfterSync::managed(&st))
        };
        let device = cumux_protocol::device_of_handle(event);
        let marked = || marks::watch(c, event).is_some_and(|w| w.wait());
        if !known_reached(c, event) && !marked() {
            poll_until_ready(c, device, || Call::EventQuery { event })?;
            c.call(Call::EventSynchronize { event })?;
            marks::after_wait(c, device);
        }
        after.finish(c)
    }

    fn cuEventElapsedTime | cuEventElapsedTime_v2 (ms: *mut f32, start: *mut c_void, end: *mut c_void) {
        elapsed(ms, start, end)
    }

    fn cuEventDestroy_v2(e: *mut c_void) {
        let c = client()?;
        let event = handles::wire_or_invalid(e)?;
        let gone = c.lock().events.remove(&event).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        if let Some(mark) = gone.mark {
            marks::release(c, device_of_handle(event), mark.slot);
        }
        c.call(Call::EventDestroy { event }).map(|_| ())
    }

    fn cuStreamIsCapturing | cuStreamIsCapturing_ptsz (s: *mut c_void, status: *mut u32) {
        out(status, capture_status(s)?.1)
    }

    // The newest form answers for all: the stream's id, capture status and
    // the capture's graph (`graph::capture_graph`); no dependencies or edges:
    // what is captured next comes after everything captured before.
    fn cuStreamGetCaptureInfo_v3 | cuStreamGetCaptureInfo_v3_ptsz (
        s: *mut c_void,
        status: *mut u32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut *const CUgraphNode,
        edges: *mut *const CUgraphEdgeData,
        num_deps: *mut usize
    ) {
        let (stream, capture) = capture_status(s)?;
        out_opt(id, stream);
        let captured_graph = match graph.is_null() || capture != CAPTURE_ACTIVE {
            true => std::ptr::null_mut(),
            false => {
                let c = client()?;
                to_ptr(super::graph::capture_graph(c, &mut c.lock(), stream)?)
            }
        };
        out_opt(graph, captured_graph);
        out_opt(deps, std::ptr::null());
        out_opt(edges, std::ptr::null());
        out_opt(num_deps, 0);
        out(status, capture)
    }

    fn cuStreamGetCaptureInfo_v2 | cuStreamGetCaptureInfo_v2_ptsz (
        s: *mut c_void,
        status: *mut u32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut *const CUgraphNode,
        num_deps: *mut usize
    ) {
        let no_edges = std::ptr::null_mut();
        // SAFETY: the program's own arguments, forwarded to the newest form.
        forwarded(unsafe { cuStreamGetCaptureInfo_v3(s, status, id, graph, deps, no_edges, num_deps) })
    }

    fn cuStreamGetCaptureInfo | cuStreamGetCaptureInfo_ptsz (s: *mut c_void, status: *mut u32, id: *mut u64) {
        let none = std::ptr::null_mut();
        // SAFETY: as above, the rest not wanted.
        forwarded(unsafe { cuStreamGetCaptureInfo_v3(s, status, id, none, none.cast(), none.cast(), none.cast()) })
    }

    // Captured work runs in the order it was captured, after all that came
    // before it: any dependencies named are kept by that order.
    fn cuStreamUpdateCaptureDependencies | cuStreamUpdateCaptureDependencies_ptsz (
        s: *mut c_void,
        deps: *mut CUgraphNode,
        n: usize,
        flags: u32
    ) {
        capture_dependencies(s, deps, n, flags)
    }

    fn cuStreamUpdateCaptureDependencies_v2 | cuStreamUpdateCaptureDependencies_v2_ptsz (
        s: *mut c_void,
        deps: *mut CUgraphNode,
        edges: *const CUgraphEdgeData,
        n: usize,
        flags: u32
    ) {
        super::graph_nodes::edges_taken(edges, n)?;
        capture_dependencies(s, deps, n, flags)
    }

    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) {
        thread_local! {
            // Plain data needs no destructor, so this is never torn down and
            // `with` cannot fail, even in a call made while the thread ends.
            static MODE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        let wanted = *read_in(mode)?;
        let old = MODE.with(|m| m.replace(wanted));
        out(mode, old)
    }

    fn cuStreamGetAttribute | cuStreamGetAttribute_ptsz (s: *mut c_void, attr: u32, value: *mut c_void) {
        let (_, st, stream) = known_stream(s)?;
        let priority = st.streams.get(&stream).map_or(0, |x| x.priority);
        drop(st);
        match attr {
            // Priority.
            8 => out(value.cast::<i32>(), priority),
            // Access policy window, synchronisation policy and the rest: defaults.
            _ => {
                host_bytes_mut(value, 32)?.fill(0);
                Ok(())
            }
        }
    }

    fn cuStreamSetAttribute | cuStreamSetAttribute_ptsz (s: *mut c_void, _attr: u32, value: *const c_void) {
        drop(known_stream(s)?);
        read_in(value.cast::<u8>()).map(|_| ())
    }

    fn cuStreamCopyAttributes | cuStreamCopyAttributes_ptsz (dst: *mut c_void, src: *mut c_void) {
        let (_, st, _) = known_stream(dst)?;
        st.check_stream(handles::stream(src)?)
    }
}
