//! Occupancy queries (`cuOccupancy*`) answered on the client from cached
//! attributes: the device's per-SM limits and the kernel's registers and
//! shared memory, with the allocation granularities of sm_70 and later. No
//! round trip, so libraries that ask before every launch (cuDNN, cuBLAS
//! heuristics, Triton) pay nothing. A cooperative launch is checked against
//! the same model at the call.

use cumux_cuda_bindings::consts::*;
use cumux_protocol::Handle;

use crate::errors::*;
use crate::state::Client;

/// What one SM offers (device attributes).
#[derive(Debug, Clone, Copy)]
pub struct Sm {
    pub warp_size: i32,
    pub threads_per_sm: i32,
    pub blocks_per_sm: i32,
    pub regs_per_sm: i32,
    pub regs_per_block: i32,
    pub smem_per_sm: i32,
    /// The most shared memory one block may opt in to.
    pub smem_per_block_optin: i32,
    /// Shared memory the system reserves for each resident block.
    pub reserved_smem_per_block: i32,
}

/// What one block of a kernel needs (function attributes).
#[derive(Debug, Clone, Copy)]
pub struct Kernel {
    pub regs_per_thread: i32,
    pub static_smem: i32,
    pub max_threads_per_block: i32,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
    pub max_dynamic_smem: i32,
}

/// Registers are allocated per warp in units of 256.
const REG_UNIT: i64 = 256;
/// Shared memory is allocated per block in units of 128 bytes.
const SMEM_UNIT: i64 = 128;

fn round_up(v: i64, unit: i64) -> i64 {
    (v + unit - 1) / unit * unit
}

impl Sm {
    fn warps(&self, block: i32) -> i64 {
        let w = self.warp_size.max(1) as i64;
        (block as i64 + w - 1) / w
    }

    /// Blocks the shared memory of one SM holds, each using `per_block`.
    fn blocks_by_smem(&self, per_block: i64) -> i64 {
        let need = round_up(per_block + self.reserved_smem_per_block as i64, SMEM_UNIT);
        if need <= 0 {
            return i64::MAX;
        }
        self.smem_per_sm as i64 / need
    }
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`: resident blocks of
/// `block` threads, each with `dynamic_smem` bytes of dynamic shared memory.
pub fn active_blocks(sm: &Sm, k: &Kernel, block: i32, dynamic_smem: usize) -> i32 {
    if block <= 0 || block > k.max_threads_per_block.max(1) {
        return 0;
    }
    let smem = k.static_smem as i64 + dynamic_smem as i64;
    if smem > sm.smem_per_block_optin.max(0) as i64 && smem > 0 {
        return 0;
    }
    let warps = sm.warps(block);
    let by_threads = sm.threads_per_sm as i64 / (warps * sm.warp_size.max(1) as i64);
    let by_blocks = sm.blocks_per_sm.max(1) as i64;
    let by_regs = if k.regs_per_thread > 0 {
        let per_warp = round_up(k.regs_per_thread as i64 * sm.warp_size as i64, REG_UNIT);
        if per_warp * warps > sm.regs_per_block as i64 {
            return 0;
        }
        (sm.regs_per_sm as i64 / per_warp) / warps
    } else {
        i64::MAX
    };
    let by_smem = if smem > 0 {
        sm.blocks_by_smem(smem)
    } else {
        i64::MAX
    };
    by_threads.min(by_blocks).min(by_regs).min(by_smem).max(0) as i32
}

/// `cuOccupancyAvailableDynamicSMemPerBlock`: the dynamic shared memory
/// each block may use with `blocks` blocks of `block` threads resident on
/// one SM; `None` when that many cannot be resident at all (the driver's
/// "invalid value"). As NVIDIA's driver answers (measured on an H200, driver
/// 580): an even share of the SM's shared memory less the kernel's static
/// memory, the per-block reservation not taken off.
pub fn available_dynamic_smem(sm: &Sm, k: &Kernel, blocks: i32, block: i32) -> Option<usize> {
    if blocks <= 0 || active_blocks(sm, k, block, 0) < blocks {
        return None;
    }
    let share = sm.smem_per_sm as i64 / blocks as i64 / SMEM_UNIT * SMEM_UNIT;
    let dynamic = (share - k.static_smem as i64)
        .min(sm.smem_per_block_optin as i64 - k.static_smem as i64)
        .min(k.max_dynamic_smem as i64);
    Some(dynamic.max(0) as usize)
}

/// `cuOccupancyMaxPotentialBlockSize`: the block size (a multiple of the
/// warp size up to the kernel's and `limit`'s maximum) that keeps the most
/// threads resident, and the grid that fills the device with it:
/// `(min_grid, block)`. `smem_for` gives the dynamic shared memory a block
/// size needs.
pub fn potential_block_size(
    sm: &Sm,
    k: &Kernel,
    sms: i32,
    limit: i32,
    smem_for: impl Fn(i32) -> usize,
) -> (i32, i32) {
    let mut max = k.max_threads_per_block.max(1);
    if limit > 0 {
        max = max.min(limit);
    }
    let step = sm.warp_size.max(1);
    let mut best = (0i64, 0i32, 0i32); // (threads, block, blocks)
    let mut block = max;
    // Try the largest size, then every smaller multiple of the warp size.
    while block > 0 {
        let blocks = active_blocks(sm, k, block, smem_for(block));
        let threads = blocks as i64 * block as i64;
        if threads > best.0 {
            best = (threads, block, blocks);
        }
        block = if block % step != 0 {
            block / step * step
        } else {
            block - step
        };
    }
    (best.2 * sms.max(1), best.1)
}

/// The occupancy model's view of device `dev` and of kernel `function`.
pub(crate) fn inputs_on(c: &Client, function: Handle, dev: i32) -> CuResult<(Sm, Kernel, i32)> {
    let attrs = c.lock().function(function)?.attrs;
    let attr = |a: u32, fallback: i32| -> CuResult<i32> {
        let v = c.attribute(dev, a)?;
        Ok(if v > 0 { v } else { fallback })
    };
    let smem_per_block = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49_152)?;
    let sm = Sm {
        warp_size: attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32)?,
        threads_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048)?,
        blocks_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32)?,
        regs_per_sm: attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65_536)?,
        regs_per_block: attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65_536)?,
        smem_per_sm: attr(
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            smem_per_block,
        )?,
        smem_per_block_optin: attr(
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            smem_per_block,
        )?,
        reserved_smem_per_block: c
            .attribute(dev, CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)?
            .max(0),
    };
    let max_threads = if attrs.max_threads_per_block > 0 {
        attrs.max_threads_per_block
    } else {
        attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024)?
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
    Ok((
        sm,
        kernel,
        attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 1)?,
    ))
}

/// A cooperative launch of `grid` blocks of `block` threads with `smem`
/// bytes of dynamic shared memory: refused at the call, as the driver does,
/// when more blocks than the device holds at once would have to wait for
/// each other (`CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE`).
pub(crate) fn check_co_resident(
    c: &Client,
    function: Handle,
    dev: i32,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
) -> CuResult<()> {
    let (sm, k, sms) = inputs_on(c, function, dev)?;
    let threads = block.iter().map(|&d| d as i64).product::<i64>();
    let blocks = grid.iter().map(|&d| d as i64).product::<i64>();
    let per_sm = active_blocks(&sm, &k, threads.min(i32::MAX as i64) as i32, smem as usize);
    if blocks > per_sm as i64 * sms.max(1) as i64 {
        return Err(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100 (sm_90) as its driver reports it.
    fn h100() -> Sm {
        Sm {
            warp_size: 32,
            threads_per_sm: 2048,
            blocks_per_sm: 32,
            regs_per_sm: 65536,
            regs_per_block: 65536,
            smem_per_sm: 233_472,
            smem_per_block_optin: 232_448,
            reserved_smem_per_block: 1024,
        }
    }

    fn kernel(regs: i32, smem: i32) -> Kernel {
        Kernel {
            regs_per_thread: regs,
            static_smem: smem,
            max_threads_per_block: 1024,
            max_dynamic_smem: 232_448 - smem,
        }
    }

    #[test]
    fn limits_by_threads_registers_and_shared_memory() {
        let sm = h100();
        // Threads: 2048 / 256.
        assert_eq!(active_blocks(&sm, &kernel(16, 0), 256, 0), 8);
        // Registers: 64 per thread → 2048 per warp → 32 warps → 4 blocks of 8.
        assert_eq!(active_blocks(&sm, &kernel(64, 0), 256, 0), 4);
        // Shared memory: 48 KiB + 1 KiB reserved → 4 blocks in 228 KiB.
        assert_eq!(active_blocks(&sm, &kernel(16, 49_152), 256, 0), 4);
        assert_eq!(active_blocks(&sm, &kernel(16, 0), 256, 49_152), 4);
        // Blocks per SM: 32 blocks of one warp.
        assert_eq!(active_blocks(&sm, &kernel(16, 0), 32, 0), 32);
        // Over the kernel's block limit, or more shared memory than a block may have.
        assert_eq!(active_blocks(&sm, &kernel(16, 0), 2048, 0), 0);
        assert_eq!(active_blocks(&sm, &kernel(16, 0), 128, 300_000), 0);
    }

    #[test]
    fn dynamic_shared_memory_left_per_block() {
        let sm = h100();
        let k = kernel(32, 0);
        // One block may take all it may opt in to.
        assert_eq!(available_dynamic_smem(&sm, &k, 1, 128), Some(232_448));
        // Two blocks share 228 KiB evenly: the driver takes no reservation
        // off (H200, driver 580: 116,736 for 2 blocks, 58,368 for 4).
        assert_eq!(available_dynamic_smem(&sm, &k, 2, 128), Some(116_736));
        assert_eq!(available_dynamic_smem(&sm, &k, 4, 256), Some(58_368));
        // More blocks than can be resident (by blocks, or threads): an error.
        assert_eq!(available_dynamic_smem(&sm, &k, 64, 128), None);
        assert_eq!(available_dynamic_smem(&sm, &k, 4, 1024), None);
        let s = kernel(32, 4096);
        assert_eq!(
            available_dynamic_smem(&sm, &s, 2, 128),
            Some(116_736 - 4096)
        );
    }

    #[test]
    fn potential_block_size_fills_the_sm() {
        let sm = h100();
        let (grid, block) = potential_block_size(&sm, &kernel(16, 0), 132, 0, |_| 0);
        assert_eq!(block, 1024);
        assert_eq!(grid, 2 * 132);
        let (_, limited) = potential_block_size(&sm, &kernel(16, 0), 132, 200, |_| 0);
        assert_eq!(limited, 128);
        // Heavy register use: 128 regs → 4096 per warp → 16 warps per SM.
        let (grid, block) = potential_block_size(&sm, &kernel(128, 0), 132, 0, |_| 0);
        assert_eq!(block * grid / 132, 512);
    }
}
