//! Kernel launches (plain, `Ex`, cooperative) and host functions on streams.
//! Launches are checked against cached device and function limits under the
//! state lock, taken once, then queued without a round trip.

use std::ffi::c_void;

use std::sync::Arc;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::{Call, LaunchAttribute};

use super::function::dynamic_shared_limit;
use super::*;
use crate::graph::GraphOp;
use crate::host_fn::UserData;
use crate::state::handles;
use crate::state::{client, Client, FunctionSettings};

const CU_LAUNCH_PARAM_END: usize = 0;
const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// Packs the arguments: from `kernelParams` (one pointer per parameter) or
/// from `extra`'s ready-made buffer.
pub(crate) fn pack_params(
    params: &[cumux_protocol::ParamInfo],
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult<Vec<u8>> {
    let total = params
        .iter()
        .map(|p| (p.offset + p.size) as usize)
        .max()
        .unwrap_or(0);
    if !kernel_params.is_null() {
        let mut buf = vec![0u8; total];
        let pointers = host_bytes(kernel_params.cast(), params.len() * 8)?;
        for (i, p) in params.iter().enumerate() {
            let arg =
                usize::from_ne_bytes(pointers[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            let bytes = host_bytes(arg as *const c_void, p.size as usize)?;
            buf[p.offset as usize..(p.offset + p.size) as usize].copy_from_slice(bytes);
        }
        return Ok(buf);
    }
    if extra.is_null() {
        return if params.is_empty() {
            Ok(Vec::new())
        } else {
            Err(CUDA_ERROR_INVALID_VALUE)
        };
    }
    let (mut buffer, mut size) = (0usize, None::<usize>);
    // `extra` is a list of (key, value) pointers ending in CU_LAUNCH_PARAM_END;
    // bounded so a missing terminator cannot run away.
    for i in 0..64 {
        let pair = host_bytes(extra.wrapping_add(i * 2).cast(), 16)?;
        let key = usize::from_ne_bytes(pair[0..8].try_into().unwrap_or_default());
        let value = usize::from_ne_bytes(pair[8..16].try_into().unwrap_or_default());
        match key {
            CU_LAUNCH_PARAM_END => break,
            CU_LAUNCH_PARAM_BUFFER_POINTER => buffer = value,
            CU_LAUNCH_PARAM_BUFFER_SIZE => {
                let s = host_bytes(value as *const c_void, 8)?;
                size = Some(usize::from_ne_bytes(s.try_into().unwrap_or_default()));
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        if i == 63 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let size = size.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // A buffer shorter than the parameters leaves the rest zero, as the
    // driver takes it (NCCL passes only the part of its 4 KiB argument
    // structure a launch uses).
    let mut buf = host_bytes(buffer as *const c_void, size)?.to_vec();
    buf.resize(total.max(size), 0);
    Ok(buf)
}

/// Checks a launch the way the driver does at the call, then queues it.
#[allow(clippy::too_many_arguments)]
fn launch(
    c: &Client,
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: *mut c_void,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    mut attributes: Vec<LaunchAttribute>,
) -> CuResult<()> {
    let stream = handles::stream(stream);
    // A library's kernel runs in the current context (or its stream's):
    // that device's copy of it.
    let device = match &stream {
        Ok(s) => c.device_for(0, Some(*s)),
        Err(_) => crate::state::current_device(),
    };
    let function = super::module::kernel_on(client()?, handles::wire_or_invalid(f)?, device)?;
    let cooperative = attributes
        .iter()
        .any(|a| matches!(a, LaunchAttribute::Cooperative(v) if *v != 0));
    if cooperative {
        let dev = cumux_protocol::device_of_handle(function) as i32;
        crate::occupancy::check_co_resident(c, function, dev, grid, block, shared)?;
    }
    let mut st = c.lock();
    let func = st.function(function)?;
    let (attrs, settings) = (func.attrs, func.settings);
    with_settings(&mut attributes, &settings);
    let dev = st.context_device()? as i32;
    check_shape(c, dev, grid, block, &attrs)?;
    if shared as i64 > dynamic_shared_limit(c, dev, &attrs)? as i64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let stream = stream?;
    st = c.ready_stream(st, stream)?;
    let params = pack_params(&st.function(function)?.params, kernel_params, extra)?;
    let push = st.managed_to_push(Some(stream));
    // A capture records the launch; its push goes now, as before any copy.
    let push_stream = (!st.capturing(stream)).then_some(stream);
    let call = st.capture_call(Call::Launch {
        function,
        grid,
        block,
        shared_bytes: shared,
        stream,
        params,
        attributes,
    });
    drop(st);
    crate::managed::push(c, push, push_stream)?;
    // The function's device runs it; a stream of another device is not its.
    let device = cumux_protocol::device_of_handle(function);
    if stream != cumux_protocol::DEFAULT_STREAM
        && cumux_protocol::device_of_handle(stream) != device
    {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    match call {
        Some(call) => {
            c.call_on(device, call)?;
            crate::managed_guard::after_work(stream);
            Ok(())
        }
        None => Ok(()),
    }
}

/// Adds to a launch's `attributes` what the kernel's settings
/// (`cuFuncSetAttribute`) ask of every launch: its required cluster shape
/// where the launch names none, its cluster scheduling policy.
pub(crate) fn with_settings(attributes: &mut Vec<LaunchAttribute>, settings: &FunctionSettings) {
    let names_cluster = attributes
        .iter()
        .any(|a| matches!(a, LaunchAttribute::ClusterDim(_)));
    if !names_cluster && settings.required_cluster.iter().any(|d| *d > 0) {
        let dims = settings.required_cluster.map(|d| d.max(1) as u32);
        attributes.push(LaunchAttribute::ClusterDim(dims));
    }
    if settings.cluster_scheduling_policy != 0 {
        attributes.push(LaunchAttribute::ClusterSchedulingPolicy(
            settings.cluster_scheduling_policy as u32,
        ));
    }
}

/// The grid and block limits of the device and of the kernel
/// (`cumux_protocol::launch_checks`, the server's rules too).
fn check_shape(
    c: &Client,
    dev: i32,
    grid: [u32; 3],
    block: [u32; 3],
    attrs: &cumux_protocol::FunctionAttrs,
) -> CuResult<()> {
    c.launch_limits(dev)?
        .check_shape(grid, block, attrs)
        .map_err(|e| e.code)
}

/// Queues a host function behind the work already on the stream (or records
/// it when the stream is being captured).
pub(crate) fn host_function(
    stream: *mut c_void,
    run: Arc<dyn Fn(CUresult) + Send + Sync>,
) -> CuResult<()> {
    let c = client()?;
    let stream = handles::stream(stream)?;
    let mut st = c.lock();
    st.check_stream(stream)?;
    let run = match st.capture(stream, GraphOp::HostFn(run)) {
        None => return Ok(()),
        Some(GraphOp::HostFn(run)) => run,
        Some(_) => return Err(CUDA_ERROR_UNKNOWN),
    };
    drop(st);
    crate::host_fn::enqueue(c, stream, Box::new(move |status| run(status)))
}

/// Bytes of one `CUlaunchAttribute`.
pub(crate) const LAUNCH_ATTRIBUTE_BYTES: usize = 72;

/// The attributes of a `cuLaunchKernelEx` that change how the kernel runs.
/// Hints that leave its results alone (access policy window, stream
/// synchronization policy, memory sync domain map, preferred cluster shape,
/// shared memory carveout, NVLink-centric scheduling, portable cluster size
/// and shared memory modes) are left out; those naming events are not
/// supported yet and say so.
pub(crate) fn launch_attributes(cfg: &CUlaunchConfig) -> CuResult<Vec<LaunchAttribute>> {
    if cfg.numAttrs == 0 {
        return Ok(Vec::new());
    }
    let n = cfg.numAttrs as usize;
    let list = host_bytes(cfg.attrs.cast(), n.saturating_mul(LAUNCH_ATTRIBUTE_BYTES))?;
    let mut out = Vec::new();
    for a in list.chunks_exact(LAUNCH_ATTRIBUTE_BYTES) {
        let word = |i: usize| {
            u32::from_ne_bytes([a[8 + 4 * i], a[9 + 4 * i], a[10 + 4 * i], a[11 + 4 * i]])
        };
        let id = u32::from_ne_bytes([a[0], a[1], a[2], a[3]]);
        match id {
            CU_LAUNCH_ATTRIBUTE_IGNORE => {}
            CU_LAUNCH_ATTRIBUTE_COOPERATIVE => out.push(LaunchAttribute::Cooperative(word(0))),
            CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION => {
                out.push(LaunchAttribute::ClusterDim([word(0), word(1), word(2)]))
            }
            CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE => {
                out.push(LaunchAttribute::ClusterSchedulingPolicy(word(0)))
            }
            CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION => {
                out.push(LaunchAttribute::ProgrammaticSerialization(word(0)))
            }
            CU_LAUNCH_ATTRIBUTE_PRIORITY => out.push(LaunchAttribute::Priority(word(0) as i32)),
            CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN => {
                out.push(LaunchAttribute::MemSyncDomain(word(0)))
            }
            CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW
            | CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY
            | CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP
            | CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION
            | CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
            | CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING
            | CU_LAUNCH_ATTRIBUTE_PORTABLE_CLUSTER_SIZE_MODE
            | CU_LAUNCH_ATTRIBUTE_SHARED_MEMORY_MODE => {
                tracing::debug!("cuLaunchKernelEx: hint attribute {id} left out");
            }
            _ => {
                tracing::warn!("cuLaunchKernelEx: launch attribute {id} is not supported");
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
        }
    }
    Ok(out)
}

driver_fn! {
    fn cuLaunchKernel | cuLaunchKernel_ptsz (
        f: *mut c_void,
        gx: u32, gy: u32, gz: u32,
        bx: u32, by: u32, bz: u32,
        shared: u32,
        stream: *mut c_void,
        params: *mut *mut c_void,
        extra: *mut *mut c_void
    ) {
        launch(client()?, f, [gx, gy, gz], [bx, by, bz], shared, stream, params, extra, Vec::new())
    }

    fn cuLaunchCooperativeKernel | cuLaunchCooperativeKernel_ptsz (
        f: *mut c_void,
        gx: u32, gy: u32, gz: u32,
        bx: u32, by: u32, bz: u32,
        shared: u32,
        stream: *mut c_void,
        params: *mut *mut c_void
    ) {
        let cooperative = vec![LaunchAttribute::Cooperative(1)];
        launch(client()?, f, [gx, gy, gz], [bx, by, bz], shared, stream, params, std::ptr::null_mut(), cooperative)
    }

    fn cuLaunchKernelEx | cuLaunchKernelEx_ptsz (
        config: *const CUlaunchConfig,
        f: *mut c_void,
        params: *mut *mut c_void,
        extra: *mut *mut c_void
    ) {
        let cfg = read_in(config)?;
        let attributes = launch_attributes(cfg)?;
        let grid = [cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ];
        let block = [cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ];
        launch(client()?, f, grid, block, cfg.sharedMemBytes, cfg.hStream, params, extra, attributes)
    }

    fn cuLaunchHostFunc | cuLaunchHostFunc_ptsz (stream: *mut c_void, func: CUhostFn, data: *mut c_void) {
        let func = func.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let data = UserData(data);
        host_function(stream, Arc::new(move |status| {
            // Unlike stream callbacks, host functions are skipped after an error.
            if status == CUDA_SUCCESS {
                let data = data;
                // SAFETY: calling the program's host function with its own argument.
                unsafe { func(data.0) }
            }
        }))
    }

    fn cuStreamAddCallback | cuStreamAddCallback_ptsz (stream: *mut c_void, cb: CUstreamCallback, data: *mut c_void, flags: u32) {
        let cb = cb.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (data, handle) = (UserData(data), UserData(stream));
        host_function(stream, Arc::new(move |status| {
            let (data, handle) = (data, handle);
            // SAFETY: calling the program's callback with its own arguments.
            unsafe { cb(handle.0, status, data.0) }
        }))
    }
}
