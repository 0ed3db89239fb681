//! Stream capture and graph launch (see `crate::graph`).

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use super::memory::{dtoh, htod, stream_handle, stream_of};
use super::*;
use crate::graph::{retarget, GraphOp, Recording};
use crate::state::{client, Client};

pub(crate) const CUDA_ERROR_ILLEGAL_STATE: CUresult = 401;
pub(crate) const CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: CUresult = 900;

/// `CU_STREAM_CAPTURE_STATUS_ACTIVE` when the stream is being captured.
pub(crate) fn capture_status(c: &Client, stream: u64) -> u32 {
    c.tables().capture.contains_key(&stream) as u32
}

fn begin(s: *mut c_void) -> CuResult<()> {
    let c = client()?;
    let stream = stream_handle(c, s)?;
    if stream == cumux_protocol::DEFAULT_STREAM {
        // The legacy default stream cannot be captured.
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    let mut t = c.tables();
    if t.capture.contains_key(&stream) {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    t.capture.insert(stream, Vec::new());
    Ok(())
}

fn instantiate(exec: *mut *mut c_void, graph: *mut c_void) -> CuResult<()> {
    let c = client()?;
    let recording = c
        .tables()
        .graphs
        .get(&handle(graph))
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let h = c.mint();
    c.tables().graph_execs.insert(h, recording);
    out(exec, to_ptr(h))
}

fn replay(c: &'static Client, recording: &Recording, stream: u64) -> CuResult<()> {
    crate::managed::to_device(c)?;
    for op in recording.iter() {
        match op {
            GraphOp::Call(call) => {
                c.call(retarget(call, stream))?;
            }
            GraphOp::HtoD { dst, src, len } => htod(
                c,
                *dst,
                host_bytes(*src as *const c_void, *len)?,
                Some(stream),
            )?,
            GraphOp::DtoH { dst, src, len } => dtoh(
                c,
                host_bytes_mut(*dst as *mut c_void, *len)?,
                *src,
                Some(stream),
            )?,
            GraphOp::HostFn(f) => {
                let f = Arc::clone(f);
                match c.record(stream, GraphOp::HostFn(f)) {
                    None => {}
                    Some(GraphOp::HostFn(f)) => {
                        crate::host_fn::enqueue(c, stream, Box::new(move |st| f(st)))?
                    }
                    Some(_) => return Err(CUDA_ERROR_UNKNOWN),
                }
            }
        }
    }
    Ok(())
}

driver_fn! {
    fn cuStreamBeginCapture | cuStreamBeginCapture_ptsz (s: *mut c_void) {
        begin(s)
    }

    fn cuStreamBeginCapture_v2 | cuStreamBeginCapture_v2_ptsz (s: *mut c_void, _mode: u32) {
        begin(s)
    }

    fn cuStreamEndCapture | cuStreamEndCapture_ptsz (s: *mut c_void, graph: *mut *mut c_void) {
        let c = client()?;
        let stream = stream_handle(c, s)?;
        let ops = c.tables().capture.remove(&stream).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        let h = c.mint();
        c.tables().graphs.insert(h, Arc::new(ops));
        out(graph, to_ptr(h))
    }

    fn cuGraphCreate(graph: *mut *mut c_void, flags: u32) {
        let c = client()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = c.mint();
        c.tables().graphs.insert(h, Arc::new(Vec::new()));
        out(graph, to_ptr(h))
    }

    fn cuGraphDestroy(graph: *mut c_void) {
        let c = client()?;
        c.tables().graphs.remove(&handle(graph)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn cuGraphInstantiateWithFlags(exec: *mut *mut c_void, graph: *mut c_void, _flags: u64) {
        instantiate(exec, graph)
    }

    fn cuGraphInstantiate | cuGraphInstantiate_v2 (
        exec: *mut *mut c_void,
        graph: *mut c_void,
        error_node: *mut *mut c_void,
        log: *mut c_char,
        log_size: usize
    ) {
        out_opt(error_node, std::ptr::null_mut());
        if !log.is_null() && log_size > 0 {
            out(log, 0)?;
        }
        instantiate(exec, graph)
    }

    fn cuGraphInstantiateWithParams | cuGraphInstantiateWithParams_ptsz (
        exec: *mut *mut c_void,
        graph: *mut c_void,
        params: *mut c_void
    ) {
        instantiate(exec, graph)?;
        if !params.is_null() {
            // CUDA_GRAPH_INSTANTIATE_PARAMS: flags, upload stream, error node,
            // result (CUDA_GRAPH_INSTANTIATE_SUCCESS).
            let p = params.cast::<u8>();
            out(p.wrapping_add(16).cast::<*mut c_void>(), std::ptr::null_mut())?;
            out(p.wrapping_add(24).cast::<u32>(), 0)?;
        }
        Ok(())
    }

    fn cuGraphExecDestroy(exec: *mut c_void) {
        let c = client()?;
        c.tables().graph_execs.remove(&handle(exec)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn cuGraphUpload | cuGraphUpload_ptsz (exec: *mut c_void, s: *mut c_void) {
        let c = client()?;
        stream_handle(c, s)?;
        c.tables().graph_execs.get(&handle(exec)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn cuGraphLaunch | cuGraphLaunch_ptsz (exec: *mut c_void, s: *mut c_void) {
        let c = client()?;
        let recording = c
            .tables()
            .graph_execs
            .get(&handle(exec))
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let stream = stream_of(c, s)?;
        replay(c, &recording, stream)
    }
}
