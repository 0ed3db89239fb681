//! Kernel launches (plain, `Ex`, cooperative), host functions on streams and
//! occupancy queries. Launches are checked against cached device and function
//! limits, then queued without a round trip.

use std::ffi::c_void;

use cumux_protocol::{Call, LaunchAttribute};

use super::memory::{stream_handle, stream_of};
use super::module::dynamic_shared_limit;
use super::*;
use crate::graph::GraphOp;
use crate::host_fn::UserData;
use crate::occupancy::{active_blocks, available_dynamic_smem, potential_block_size, Kernel, Sm};
use crate::state::{client, Client};
use cumux_cuda_bindings::{consts::*, types::*};
use std::sync::Arc;

const CU_LAUNCH_PARAM_END: usize = 0;
const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// Packs the arguments: from `kernelParams` (one pointer per parameter) or
/// from `extra`'s ready-made buffer.
fn pack_params(
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
    if size < total {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut buf = host_bytes(buffer as *const c_void, size)?.to_vec();
    buf.truncate(total.max(size));
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
    attributes: Vec<LaunchAttribute>,
) -> CuResult<()> {
    let (server, params, attrs, settings) = {
        let t = c.tables();
        let func = t.function(handle(f))?;
        (func.server, func.params.clone(), func.attrs, func.settings)
    };
    let mut attributes = attributes;
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
    let dev = c.context_device()? as i32;
    if grid.contains(&0) || block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let max_block = [
        c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)?,
        c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)?,
        c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)?,
    ];
    let max_grid = [
        c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)?,
        c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)?,
        c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)?,
    ];
    for i in 0..3 {
        if (max_block[i] > 0 && block[i] as i64 > max_block[i] as i64)
            || (max_grid[i] > 0 && grid[i] as i64 > max_grid[i] as i64)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let threads = block.iter().map(|&b| b as u64).product::<u64>();
    let device_max = c
        .attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?
        .max(1) as u64;
    if threads > device_max {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Over the kernel's launch bound: NVIDIA's driver says "invalid value"
    // too (measured on an H100, driver 580).
    if attrs.max_threads_per_block > 0 && threads > attrs.max_threads_per_block as u64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if shared as i64 > dynamic_shared_limit(c, &attrs)? as i64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let stream = stream_of(c, stream)?;
    let params = pack_params(&params, kernel_params, extra)?;
    crate::managed::to_device(c)?;
    c.call(Call::Launch {
        function: server,
        grid,
        block,
        shared_bytes: shared,
        stream,
        params,
        attributes,
    })
    .map(|_| ())
}

/// Queues a host function behind the work already on the stream (or records
/// it when the stream is being captured).
fn host_function(stream: *mut c_void, run: Arc<dyn Fn(CUresult) + Send + Sync>) -> CuResult<()> {
    let c = client()?;
    let s = stream_handle(c, stream)?;
    match c.record(s, GraphOp::HostFn(run)) {
        None => Ok(()),
        Some(GraphOp::HostFn(run)) => crate::host_fn::enqueue(c, s, Box::new(move |st| run(st))),
        Some(_) => Err(CUDA_ERROR_UNKNOWN),
    }
}

/// The occupancy model's view of the current device and of kernel `f`.
fn occupancy_inputs(c: &Client, f: *mut c_void) -> CuResult<(Sm, Kernel, i32)> {
    let attrs = c.tables().function(handle(f))?.attrs;
    let dev = c.current_device() as i32;
    let attr = |a: u32, fallback: i32| -> CuResult<i32> {
        let v = c.attribute(dev, a)?;
        Ok(if v > 0 { v } else { fallback })
    };
    let smem_per_block = attr(8, 49_152)?;
    let sm = Sm {
        warp_size: attr(10, 32)?,
        threads_per_sm: attr(39, 2048)?,
        blocks_per_sm: attr(106, 32)?,
        regs_per_sm: attr(82, 65_536)?,
        regs_per_block: attr(12, 65_536)?,
        smem_per_sm: attr(81, smem_per_block)?,
        smem_per_block_optin: attr(97, smem_per_block)?,
        reserved_smem_per_block: c.attribute(dev, 111)?.max(0),
    };
    let max_threads = if attrs.max_threads_per_block > 0 {
        attrs.max_threads_per_block
    } else {
        attr(1, 1024)?
    };
    let kernel = Kernel {
        regs_per_thread: attrs.num_regs.max(0),
        static_smem: attrs.shared_size_bytes.max(0),
        max_threads_per_block: max_threads,
        max_dynamic_smem: if attrs.max_dynamic_shared_size_bytes > 0 {
            attrs.max_dynamic_shared_size_bytes
        } else {
            (smem_per_block - attrs.shared_size_bytes).max(0)
        },
    };
    Ok((sm, kernel, attr(16, 1)?))
}

/// Bytes of one `CUlaunchAttribute`.
const LAUNCH_ATTRIBUTE_BYTES: usize = 72;

/// The attributes of a `cuLaunchKernelEx` that change how the kernel runs.
/// Hints that leave its results alone (access policy window, stream
/// synchronization policy, memory sync domain map, preferred cluster shape,
/// shared memory carveout, NVLink-centric scheduling, portable cluster size
/// and shared memory modes) are left out; those naming events are not
/// supported yet and say so.
fn launch_attributes(cfg: &CUlaunchConfig) -> CuResult<Vec<LaunchAttribute>> {
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
            0 => {}
            2 => out.push(LaunchAttribute::Cooperative(word(0))),
            4 => out.push(LaunchAttribute::ClusterDim([word(0), word(1), word(2)])),
            5 => out.push(LaunchAttribute::ClusterSchedulingPolicy(word(0))),
            6 => out.push(LaunchAttribute::ProgrammaticSerialization(word(0))),
            8 => out.push(LaunchAttribute::Priority(word(0) as i32)),
            10 => out.push(LaunchAttribute::MemSyncDomain(word(0))),
            1 | 3 | 9 | 11 | 14 | 16 | 17 | 18 => {
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

fn occupancy_blocks(c: &Client, f: *mut c_void, block_size: i32, smem: usize) -> CuResult<i32> {
    let (sm, k, _) = occupancy_inputs(c, f)?;
    if block_size <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(active_blocks(&sm, &k, block_size, smem))
}

fn potential_block(
    min_grid: *mut i32,
    block: *mut i32,
    f: *mut c_void,
    smem_fn: CUoccupancyB2DSize,
    smem: usize,
    limit: i32,
) -> CuResult<()> {
    let c = client()?;
    if min_grid.is_null() || block.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (sm, k, sms) = occupancy_inputs(c, f)?;
    let (grid, size) = potential_block_size(&sm, &k, sms, limit, |b| match smem_fn {
        // SAFETY: the program's own callback, called with a block size.
        Some(f) => unsafe { f(b) },
        None => smem,
    });
    out(block, size)?;
    out(min_grid, grid)
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

    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut i32, f: *mut c_void, block: i32, smem: usize) {
        let c = client()?;
        out(n, occupancy_blocks(c, f, block, smem)?)
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: *mut i32, f: *mut c_void, block: i32, smem: usize, _flags: u32) {
        let c = client()?;
        out(n, occupancy_blocks(c, f, block, smem)?)
    }

    fn cuOccupancyMaxPotentialBlockSize(
        min_grid: *mut i32,
        block: *mut i32,
        f: *mut c_void,
        smem_fn: CUoccupancyB2DSize,
        smem: usize,
        limit: i32
    ) {
        potential_block(min_grid, block, f, smem_fn, smem, limit)
    }

    fn cuOccupancyMaxPotentialBlockSizeWithFlags(
        min_grid: *mut i32,
        block: *mut i32,
        f: *mut c_void,
        smem_fn: CUoccupancyB2DSize,
        smem: usize,
        limit: i32,
        _flags: u32
    ) {
        potential_block(min_grid, block, f, smem_fn, smem, limit)
    }

    fn cuOccupancyMaxActiveClusters(clusters: *mut i32, f: *mut c_void, config: *const CUlaunchConfig) {
        let c = client()?;
        let cfg = read_in(config)?;
        let block = cfg.blockDimX * cfg.blockDimY.max(1) * cfg.blockDimZ.max(1);
        let smem = cfg.sharedMemBytes as usize;
        let n = cfg.numAttrs as usize;
        let mut cluster = 1u32;
        if !cfg.attrs.is_null() && n > 0 {
            // Each CUlaunchAttribute is an id and a 64-byte value 8 bytes in.
            let list = host_bytes(cfg.attrs, n.min(64) * LAUNCH_ATTRIBUTE_BYTES)?;
            for a in list.chunks_exact(LAUNCH_ATTRIBUTE_BYTES) {
                let word = |o: usize| u32::from_ne_bytes(a[o..o + 4].try_into().unwrap_or_default());
                if word(0) == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION {
                    cluster = word(8).max(1) * word(12).max(1) * word(16).max(1);
                }
            }
        }
        let (sm, k, sms) = occupancy_inputs(c, f)?;
        let per_sm = active_blocks(&sm, &k, block as i32, smem) as i64;
        out(clusters, (per_sm * sms as i64 / cluster as i64).min(i32::MAX as i64) as i32)
    }

    fn cuOccupancyAvailableDynamicSMemPerBlock(size: *mut usize, f: *mut c_void, blocks: i32, block: i32) {
        let c = client()?;
        let (sm, k, _) = occupancy_inputs(c, f)?;
        out(size, available_dynamic_smem(&sm, &k, blocks, block))
    }
}
