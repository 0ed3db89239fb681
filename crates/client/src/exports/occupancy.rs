//! Occupancy queries (`cuOccupancy*`), answered on the client by the model
//! in `crate::occupancy` from the cached device attributes and the kernel's.

use std::ffi::c_void;

use cumux_cuda_bindings::{consts::*, types::*};

use super::launch::LAUNCH_ATTRIBUTE_BYTES;
use super::*;
use crate::occupancy::{
    active_blocks, available_dynamic_smem, inputs_on, potential_block_size, Kernel, Sm,
};
use crate::state::handles;
use crate::state::{client, Client};

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
