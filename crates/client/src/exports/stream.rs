//! Streams and events. Records and waits are stream-ordered (no reply);
//! queries and synchronisation are round trips that also surface sticky errors.

use std::ffi::c_void;
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use cumux_protocol::{Call, ReplyBody};

use super::memory::{stream_handle, stream_of};
use super::*;
use crate::state::{client, Client, Event, Stream};
use cumux_cuda_bindings::types::{CUgraphEdgeData, CUgraphNode};

/// Stream priorities: 0 is the lowest, -5 the highest.
const PRIORITY_LEAST: i32 = 0;
const PRIORITY_GREATEST: i32 = -5;

fn create_stream(c: &Client, flags: u32, priority: i32) -> CuResult<usize> {
    c.context_device()?;
    if flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let priority = priority.clamp(PRIORITY_GREATEST, PRIORITY_LEAST);
    let server = match c.call(Call::StreamCreate { flags, priority })? {
        ReplyBody::Handle(h) => h,
        _ => return Err(CUDA_ERROR_UNKNOWN),
    };
    let h = c.mint();
    c.tables().streams.insert(
        h,
        Stream {
            server,
            flags,
            priority,
        },
    );
    Ok(h)
}

/// Threads in this process (`None` if unknown): the link count of its
/// `/proc/PID/task` directory, two more than its threads, read with one
/// `fstat` of a directory kept open (0.5 µs, where reading `/proc/self/stat`
/// took 9.5 µs and sat on every synchronize of the H100 host's round trip).
/// A forked child opens its own.
fn process_threads() -> Option<usize> {
    static TASKS: Mutex<Option<(u32, std::fs::File)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut tasks = TASKS.lock().unwrap_or_else(|p| p.into_inner());
    if tasks.as_ref().is_none_or(|(owner, _)| *owner != pid) {
        *tasks = std::fs::File::open(format!("/proc/{pid}/task"))
            .ok()
            .map(|dir| (pid, dir));
    }
    let links = tasks.as_ref()?.1.metadata().ok()?.nlink();
    (links as usize).checked_sub(2).filter(|n| *n > 0)
}

/// How long [`poll_until_ready`] polls without sleeping in between.
const POLL_AWAKE: std::time::Duration = std::time::Duration::from_micros(200);
/// The longest sleep between two polls: what a wait may overrun its work by
/// (it was 1 ms, a sixth of a GPT training step on the H200).
const POLL_SLEEP_MAX: std::time::Duration = std::time::Duration::from_micros(100);

/// Before a synchronising call: polls `query`, with the connection free
/// between polls, until it stops saying "not ready". The server answers a
/// connection's calls in order, so a blocking wait would hold up the
/// program's other threads, whose calls the wait may depend on (a kernel
/// waiting for a flag another thread copies in). The synchronising call that
/// follows then returns at once. A query that reports an error (a sticky
/// one, which it also clears) hands it back for the wait to return. A
/// process with a single thread has nobody to hold up: it waits blocking,
/// in one round trip.
pub(crate) fn poll_until_ready(c: &Client, query: impl Fn() -> Call) -> CuResult<()> {
    if process_threads() == Some(1) {
        return Ok(());
    }
    // Polls back to back at first (each a round trip of a few µs): a sleep
    // lasts 50 µs or more however short it is asked to be (timer slack).
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_micros(20);
    loop {
        match c.call(query()) {
            Err(CUDA_ERROR_NOT_READY) if started.elapsed() < POLL_AWAKE => std::thread::yield_now(),
            Err(CUDA_ERROR_NOT_READY) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(POLL_SLEEP_MAX);
            }
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
    }
}

fn event_of(c: &Client, e: *mut c_void) -> CuResult<u64> {
    c.tables().event_server(handle(e))
}

fn elapsed(ms: *mut f32, start: *mut c_void, end: *mut c_void) -> CuResult<()> {
    let c = client()?;
    let (start, end) = (event_of(c, start)?, event_of(c, end)?);
    match c.call(Call::EventElapsed { start, end })? {
        ReplyBody::ElapsedMs(v) => out(ms, v),
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

fn record(event: *mut c_void, stream: *mut c_void) -> CuResult<()> {
    let c = client()?;
    let (event, stream) = (event_of(c, event)?, stream_of(c, stream)?);
    c.call(Call::EventRecord { event, stream }).map(|_| ())
}

driver_fn! {
    fn cuStreamCreate(ps: *mut *mut c_void, flags: u32) {
        let c = client()?;
        out(ps, to_ptr(create_stream(c, flags, 0)?))
    }

    fn cuStreamCreateWithPriority(ps: *mut *mut c_void, flags: u32, priority: i32) {
        let c = client()?;
        out(ps, to_ptr(create_stream(c, flags, priority)?))
    }

    fn cuStreamDestroy_v2(s: *mut c_void) {
        let c = client()?;
        // Host functions still queued on the stream run first.
        if let Ok(stream) = stream_handle(c, s) {
            c.gates.get(stream).wait_idle();
        }
        let st = c.tables().streams.remove(&handle(s)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        c.call(Call::StreamDestroy { stream: st.server }).map(|_| ())
    }

    fn cuStreamSynchronize | cuStreamSynchronize_ptsz (s: *mut c_void) {
        let c = client()?;
        let stream = stream_handle(c, s)?;
        if super::graph::capture_status(c, stream) != 0 {
            return Err(super::graph::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        poll_until_ready(c, || Call::StreamQuery { stream })?;
        c.call(Call::StreamSynchronize { stream })?;
        c.gates.get(stream).wait_idle();
        crate::managed::to_host(c)
    }

    fn cuStreamQuery | cuStreamQuery_ptsz (s: *mut c_void) {
        let c = client()?;
        let stream = stream_handle(c, s)?;
        if c.gates.get(stream).busy() {
            return Err(CUDA_ERROR_NOT_READY);
        }
        c.call(Call::StreamQuery { stream }).map(|_| ())
    }

    fn cuStreamWaitEvent | cuStreamWaitEvent_ptsz (s: *mut c_void, e: *mut c_void, _flags: u32) {
        let c = client()?;
        let (stream, event) = (stream_of(c, s)?, event_of(c, e)?);
        c.call(Call::StreamWaitEvent { stream, event }).map(|_| ())
    }

    fn cuStreamGetPriority | cuStreamGetPriority_ptsz (s: *mut c_void, priority: *mut i32) {
        let c = client()?;
        stream_handle(c, s)?;
        let p = c.tables().streams.get(&handle(s)).map(|x| x.priority).unwrap_or(0);
        out(priority, p)
    }

    fn cuStreamGetFlags | cuStreamGetFlags_ptsz (s: *mut c_void, flags: *mut u32) {
        let c = client()?;
        stream_handle(c, s)?;
        let f = c.tables().streams.get(&handle(s)).map(|x| x.flags).unwrap_or(0);
        out(flags, f)
    }

    fn cuStreamGetId | cuStreamGetId_ptsz (s: *mut c_void, id: *mut u64) {
        let c = client()?;
        out(id, stream_handle(c, s)?)
    }

    fn cuStreamGetCtx | cuStreamGetCtx_ptsz (s: *mut c_void, ctx: *mut *mut c_void) {
        let c = client()?;
        stream_handle(c, s)?;
        out(ctx, to_ptr(c.primary_context(c.current_device())))
    }

    fn cuStreamGetCtx_v2 | cuStreamGetCtx_v2_ptsz (s: *mut c_void, ctx: *mut *mut c_void, green: *mut *mut c_void) {
        let c = client()?;
        stream_handle(c, s)?;
        out_opt(green, std::ptr::null_mut());
        out(ctx, to_ptr(c.primary_context(c.current_device())))
    }

    fn cuStreamGetDevice | cuStreamGetDevice_ptsz (s: *mut c_void, dev: *mut i32) {
        let c = client()?;
        stream_handle(c, s)?;
        out(dev, c.current_device() as i32)
    }

    fn cuEventCreate(pe: *mut *mut c_void, flags: u32) {
        let c = client()?;
        c.context_device()?;
        if flags & !0xf != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let server = match c.call(Call::EventCreate { flags })? {
            ReplyBody::Handle(h) => h,
            _ => return Err(CUDA_ERROR_UNKNOWN),
        };
        let h = c.mint();
        c.tables().events.insert(h, Event { server, flags });
        out(pe, to_ptr(h))
    }

    fn cuEventRecord | cuEventRecord_ptsz (e: *mut c_void, s: *mut c_void) {
        record(e, s)
    }

    fn cuEventRecordWithFlags | cuEventRecordWithFlags_ptsz (e: *mut c_void, s: *mut c_void, _flags: u32) {
        record(e, s)
    }

    fn cuEventQuery(e: *mut c_void) {
        let c = client()?;
        let event = event_of(c, e)?;
        c.call(Call::EventQuery { event }).map(|_| ())
    }

    fn cuEventSynchronize(e: *mut c_void) {
        let c = client()?;
        let event = event_of(c, e)?;
        poll_until_ready(c, || Call::EventQuery { event })?;
        c.call(Call::EventSynchronize { event })?;
        crate::managed::to_host(c)
    }

    fn cuEventElapsedTime | cuEventElapsedTime_v2 (ms: *mut f32, start: *mut c_void, end: *mut c_void) {
        elapsed(ms, start, end)
    }

    fn cuEventDestroy_v2(e: *mut c_void) {
        let c = client()?;
        let ev = c.tables().events.remove(&handle(e)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        c.call(Call::EventDestroy { event: ev.server }).map(|_| ())
    }

    fn cuStreamIsCapturing | cuStreamIsCapturing_ptsz (s: *mut c_void, status: *mut u32) {
        let c = client()?;
        let stream = stream_handle(c, s)?;
        out(status, super::graph::capture_status(c, stream))
    }

    fn cuStreamGetCaptureInfo | cuStreamGetCaptureInfo_ptsz (s: *mut c_void, status: *mut u32, id: *mut u64) {
        let c = client()?;
        let stream = stream_handle(c, s)?;
        out_opt(id, stream);
        out(status, super::graph::capture_status(c, stream))
    }

    fn cuStreamGetCaptureInfo_v2 | cuStreamGetCaptureInfo_v2_ptsz (
        s: *mut c_void,
        status: *mut u32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut *const CUgraphNode,
        num_deps: *mut usize
    ) {
        let c = client()?;
        let stream = stream_handle(c, s)?;
        out_opt(id, stream);
        out_opt(graph, std::ptr::null_mut());
        out_opt(deps, std::ptr::null());
        out_opt(num_deps, 0);
        out(status, super::graph::capture_status(c, stream))
    }

    fn cuStreamGetCaptureInfo_v3 | cuStreamGetCaptureInfo_v3_ptsz (
        s: *mut c_void,
        status: *mut u32,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut *const CUgraphNode,
        edges: *mut *const CUgraphEdgeData,
        num_deps: *mut usize
    ) {
        let c = client()?;
        let stream = stream_handle(c, s)?;
        out_opt(id, stream);
        out_opt(graph, std::ptr::null_mut());
        out_opt(deps, std::ptr::null());
        out_opt(edges, std::ptr::null());
        out_opt(num_deps, 0);
        out(status, super::graph::capture_status(c, stream))
    }

    fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) {
        thread_local! {
            static MODE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
        }
        let wanted = *read_in(mode)?;
        let old = MODE.with(|m| m.replace(wanted));
        out(mode, old)
    }

    fn cuStreamGetAttribute | cuStreamGetAttribute_ptsz (s: *mut c_void, attr: u32, value: *mut c_void) {
        let c = client()?;
        stream_handle(c, s)?;
        match attr {
            // Priority.
            8 => {
                let p = c.tables().streams.get(&handle(s)).map(|x| x.priority).unwrap_or(0);
                out(value.cast::<i32>(), p)
            }
            // Access policy window, synchronisation policy and the rest: defaults.
            _ => {
                host_bytes_mut(value, 32)?.fill(0);
                Ok(())
            }
        }
    }

    fn cuStreamSetAttribute | cuStreamSetAttribute_ptsz (s: *mut c_void, _attr: u32, value: *const c_void) {
        let c = client()?;
        stream_handle(c, s)?;
        read_in(value.cast::<u8>()).map(|_| ())
    }

    fn cuStreamCopyAttributes | cuStreamCopyAttributes_ptsz (dst: *mut c_void, src: *mut c_void) {
        let c = client()?;
        stream_handle(c, dst)?;
        stream_handle(c, src).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::process_threads;

    /// The count matches the task directory's entries (read on either side of
    /// it, so that other tests' threads coming and going cannot fool it), with
    /// a thread of ours alive and after it ended.
    #[test]
    fn threads_are_counted_as_they_come_and_go() {
        let entries = || std::fs::read_dir("/proc/self/task").unwrap().count();
        let agrees = || {
            (0..1000).any(|_| {
                let (a, n, b) = (entries(), process_threads(), entries());
                a == b && n == Some(a)
            })
        };
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let helper = std::thread::spawn(move || rx.recv().ok());
        assert!(agrees());
        tx.send(()).unwrap();
        helper.join().unwrap();
        assert!(agrees());
    }
}
