//! Occupancy queries (`cuOccupancy*`), answered on the client by the model
//! in `crate::occupancy` from the cached device attributes and the kernel's;
//! a GPU's cluster queries by its driver, once per shape.

use std::ffi::c_void;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::{Call, ClusterQuery, GraphLaunch, ReplyBody};

use super::launch::{launch_attributes, with_settings, LAUNCH_ATTRIBUTE_BYTES};
use super::*;
use crate::occupancy::{
    active_blocks, available_dynamic_smem, inputs_on, potential_block_size, Kernel, Sm,
};
use crate::state::handles;
use crate::state::{client, Client, FunctionSettings};

/// The occupancy model's view of the current device and of kernel `f`.
fn occupancy_inputs(c: &Client, f: *mut c_void) -> CuResult<(Sm, Kernel, i32)> {
    let dev = c.lock().current_device() as i32;
    inputs_on(c, handles::wire_or_invalid(f)?, dev)
}

fn occupancy_blocks(c: &Client, f: *mut c_void, block_size: i32, smem: usize) -> CuResult<i32> {
    let (sm, k, _) = occupancy_inputs(c, f)?;
    if block_size <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(active_blocks(&sm, &k, block_size, smem))
}

/// A cluster occupancy query about kernel `f` launched as `cfg`, asked of a
/// GPU's driver (once per query and shape: the answer is the chip's, as
/// each cluster must fit one of its processing clusters, and libraries such
/// as cuBLAS size their grids and choose their kernels by it); `None` for
/// the CPU device, which the model answers.
fn asked_of_driver(
    c: &'static Client,
    f: *mut c_void,
    cfg: &CUlaunchConfig,
    query: impl FnOnce(FunctionSettings) -> ClusterQuery,
) -> CuResult<Option<i32>> {
    let device = crate::state::current_device();
    let function = super::module::kernel_on(c, handles::wire_or_invalid(f)?, device)?;
    let device = cumux_protocol::device_of_handle(function);
    if c.devices
        .get(device as usize)
        .is_none_or(|d| d.backend != "cuda")
    {
        return Ok(None);
    }
    let mut attributes = launch_attributes(cfg)?;
    let key = {
        let st = c.lock();
        let func = st.function(function)?;
        with_settings(&mut attributes, &func.settings);
        let launch = GraphLaunch {
            function,
            grid: [cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ],
            block: [cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ],
            shared_bytes: cfg.sharedMemBytes,
            params: Vec::new(),
            attributes,
        };
        let key = (query(func.settings), launch);
        if let Some(n) = func.cluster_answers.get(&key) {
            return Ok(Some(*n));
        }
        key
    };
    let call = Call::ClusterOccupancy {
        launch: key.1.clone(),
        query: key.0,
    };
    let n = match c.call_on(device, call)? {
        ReplyBody::Value(n) => i32::try_from(n).unwrap_or(i32::MAX),
        _ => return Err(CUDA_ERROR_UNKNOWN),
    };
    if let Ok(func) = c.lock().function_mut(function) {
        func.cluster_answers.insert(key, n);
    }
    Ok(Some(n))
}

driver_fn! {
    fn cuOccupancyMaxActiveBlocksPerMultiprocessor(n: *mut i32, f: *mut c_void, block: i32, smem: usize) {
        let c = client()?;
        out(n, occupancy_blocks(c, f, block, smem)?)
    }

    fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n: *mut i32, f: *mut c_void, block: i32, smem: usize, _flags: u32) {
        let c = client()?;
        out(n, occupancy_blocks(c, f, block, smem)?)
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

    fn cuOccupancyMaxPotentialBlockSize(
        min_grid: *mut i32,
        block: *mut i32,
        f: *mut c_void,
        smem_fn: CUoccupancyB2DSize,
        smem: usize,
        limit: i32
    ) {
        // SAFETY: the program's own arguments, forwarded with no flags.
        forwarded(unsafe { cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block, f, smem_fn, smem, limit, 0) })
    }

    fn cuOccupancyMaxActiveClusters(clusters: *mut i32, f: *mut c_void, config: *const CUlaunchConfig) {
        let c = client()?;
        let cfg = read_in(config)?;
        if let Some(n) = asked_of_driver(c, f, cfg, |_| ClusterQuery::MaxActiveClusters)? {
            return out(clusters, n);
        }
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

    fn cuOccupancyMaxPotentialClusterSize(size: *mut i32, f: *mut c_void, config: *const CUlaunchConfig) {
        let c = client()?;
        let cfg = read_in(config)?;
        let query = |settings: FunctionSettings| ClusterQuery::MaxPotentialClusterSize {
            non_portable: settings.non_portable_cluster_size_allowed != 0,
        };
        match asked_of_driver(c, f, cfg, query)? {
            Some(n) => out(size, n),
            // The CPU device runs no clusters of its own to size.
            None => Err(CUDA_ERROR_NOT_SUPPORTED),
        }
    }

    fn cuOccupancyAvailableDynamicSMemPerBlock(size: *mut usize, f: *mut c_void, blocks: i32, block: i32) {
        let c = client()?;
        let (sm, k, _) = occupancy_inputs(c, f)?;
        out(size, available_dynamic_smem(&sm, &k, blocks, block).ok_or(CUDA_ERROR_INVALID_VALUE)?)
    }
}
