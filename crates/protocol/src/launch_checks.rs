//! What a kernel launch must satisfy before any device sees it: the device's
//! grid, block, shared-memory and cluster limits and the kernel's own. The client
//! checks them at the call (as the driver does) and the server, the authority,
//! checks them again; both use these rules and these defaults.

use crate::{codes, CuError, FunctionAttrs, LaunchAttribute, ParamInfo};

/// Block dimensions where a device reports none (every GPU since Fermi).
pub const MAX_BLOCK_DIM: [i32; 3] = [1024, 1024, 64];
/// Grid dimensions where a device reports none.
pub const MAX_GRID_DIM: [i32; 3] = [i32::MAX, 65535, 65535];
/// Threads per block where a device reports none.
pub const MAX_THREADS_PER_BLOCK: i32 = 1024;
/// Shared memory a block may use after opting in, where a device reports none.
pub const SHARED_PER_BLOCK_OPTIN: i32 = 99 << 10;
/// `CUDA_ERROR_INVALID_CLUSTER_SIZE`.
pub const CLUSTER_SIZE_ERROR: u32 = 912;
/// Blocks a cluster may have on a device that runs clusters (Hopper's
/// non-portable limit).
const MAX_CLUSTER_BLOCKS: u32 = 16;

/// `CU_DEVICE_ATTRIBUTE_*` numbers the limits come from.
mod attribute {
    pub const MAX_THREADS_PER_BLOCK: u32 = 1;
    pub const MAX_BLOCK_DIM_X: u32 = 2;
    pub const MAX_GRID_DIM_X: u32 = 5;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: u32 = 97;
    pub const CLUSTER_LAUNCH: u32 = 120;
}

fn invalid(what: String) -> CuError {
    CuError::new(codes::INVALID_VALUE, what)
}

/// A device's launch limits, from its attributes (the defaults above where a
/// device does not give one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchLimits {
    pub threads_per_block: i32,
    pub block: [i32; 3],
    pub grid: [i32; 3],
    pub shared_per_block_optin: i32,
    /// 0 where the device runs no clusters (before compute capability 9).
    pub max_cluster_blocks: u32,
}

impl LaunchLimits {
    /// The limits of a device whose attributes are `attributes` (number, value).
    pub fn of(attributes: &[(u32, i32)]) -> Self {
        // A value of 0 or less is no limit the device gave: the default holds.
        let attr = |id: u32, default: i32| {
            attributes
                .iter()
                .find(|(a, v)| *a == id && *v > 0)
                .map_or(default, |(_, v)| *v)
        };
        let dims = |first: u32, defaults: [i32; 3]| {
            [0, 1, 2].map(|i| attr(first + i, defaults[i as usize]))
        };
        LaunchLimits {
            threads_per_block: attr(attribute::MAX_THREADS_PER_BLOCK, MAX_THREADS_PER_BLOCK),
            block: dims(attribute::MAX_BLOCK_DIM_X, MAX_BLOCK_DIM),
            grid: dims(attribute::MAX_GRID_DIM_X, MAX_GRID_DIM),
            shared_per_block_optin: attr(
                attribute::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                SHARED_PER_BLOCK_OPTIN,
            ),
            max_cluster_blocks: match attr(attribute::CLUSTER_LAUNCH, 0) {
                0 => 0,
                _ => MAX_CLUSTER_BLOCKS,
            },
        }
    }

    /// Checks a launch's grid and block against the device and the kernel.
    pub fn check_shape(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        kernel: &FunctionAttrs,
    ) -> Result<(), CuError> {
        if grid.contains(&0) || block.contains(&0) {
            return Err(invalid(format!(
                "empty launch grid {grid:?} block {block:?}"
            )));
        }
        let over = |dims: [u32; 3], limits: [i32; 3]| {
            dims.iter()
                .zip(limits)
                .any(|(d, l)| i64::from(*d) > i64::from(l))
        };
        if over(block, self.block) || over(grid, self.grid) {
            return Err(invalid(format!(
                "launch grid {grid:?} block {block:?} over the device's limits"
            )));
        }
        let threads: u64 = block.iter().map(|d| u64::from(*d)).product();
        if threads > self.threads_per_block.max(1) as u64 {
            return Err(invalid(format!(
                "block of {threads} threads over the device's {}",
                self.threads_per_block
            )));
        }
        // Over the kernel's launch bound: NVIDIA's driver says "invalid value"
        // too (measured on an H100, driver 580).
        let kernel_max = kernel.max_threads_per_block;
        if kernel_max > 0 && threads > kernel_max as u64 {
            return Err(invalid(format!(
                "block of {threads} threads over the kernel's {kernel_max}"
            )));
        }
        Ok(())
    }

    /// Checks a block's shared memory (the kernel's static and `dynamic` bytes)
    /// against what the device lets a block opt in to.
    pub fn check_shared(&self, dynamic: u32, kernel: &FunctionAttrs) -> Result<(), CuError> {
        let total = u64::from(dynamic) + kernel.shared_size_bytes.max(0) as u64;
        if total > self.shared_per_block_optin.max(0) as u64 {
            return Err(invalid(format!("{total} bytes of shared memory per block")));
        }
        Ok(())
    }

    /// Checks what a launch's attributes ask of the device: cluster dimensions
    /// must divide the grid and fit the device.
    pub fn check_attributes(
        &self,
        attributes: &[LaunchAttribute],
        grid: [u32; 3],
    ) -> Result<(), CuError> {
        for a in attributes {
            let LaunchAttribute::ClusterDim(dims) = a else {
                continue;
            };
            // Saturating: three u32s can overflow a u64, and a wrapped
            // product could look like no cluster at all.
            let blocks = dims
                .iter()
                .fold(1u64, |n, d| n.saturating_mul(u64::from(*d)));
            if blocks <= 1 && !dims.contains(&0) {
                continue;
            }
            if self.max_cluster_blocks == 0 {
                return Err(CuError::new(
                    codes::NOT_SUPPORTED,
                    "this device runs no thread-block clusters",
                ));
            }
            let divides = dims.iter().zip(grid).all(|(d, g)| *d > 0 && g % d == 0);
            if !divides || blocks > u64::from(self.max_cluster_blocks) {
                return Err(CuError::new(
                    CLUSTER_SIZE_ERROR,
                    format!("cluster {dims:?} for grid {grid:?}"),
                ));
            }
        }
        Ok(())
    }
}

/// Bytes a kernel's packed parameter buffer must hold at least.
pub fn params_bytes(params: &[ParamInfo]) -> u64 {
    params
        .iter()
        .map(|p| u64::from(p.offset) + u64::from(p.size))
        .max()
        .unwrap_or(0)
}

/// Checks that `given` parameter bytes cover every parameter of kernel `name`.
pub fn check_params(name: &str, params: &[ParamInfo], given: usize) -> Result<(), CuError> {
    let needed = params_bytes(params);
    if (given as u64) < needed {
        return Err(invalid(format!(
            "{given} parameter bytes for {name}, which takes {needed}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100 lets a block opt in to 227 KiB of shared memory; cuBLASLt's
    /// Hopper GEMMs take 226 KiB, which the CPU device's 99 KiB refused.
    #[test]
    fn limits_are_the_devices_own_with_defaults_for_the_rest() {
        let limits = LaunchLimits::of(&[(97, 232_448), (5, 1 << 30), (120, 1)]);
        assert_eq!(limits.shared_per_block_optin, 232_448);
        assert_eq!(limits.grid, [1 << 30, MAX_GRID_DIM[1], MAX_GRID_DIM[2]]);
        assert_eq!(limits.block, MAX_BLOCK_DIM);
        assert_eq!(limits.max_cluster_blocks, MAX_CLUSTER_BLOCKS);
        let none = LaunchLimits::of(&[(2, 0), (97, -1)]);
        assert_eq!(none.block, MAX_BLOCK_DIM, "0 is no limit given");
        assert_eq!(none.shared_per_block_optin, SHARED_PER_BLOCK_OPTIN);
        assert_eq!(none.max_cluster_blocks, 0);
    }

    #[test]
    fn shapes_past_a_limit_are_refused() {
        let limits = LaunchLimits::of(&[]);
        let kernel = FunctionAttrs {
            max_threads_per_block: 256,
            ..FunctionAttrs::default()
        };
        assert!(limits.check_shape([1, 1, 1], [256, 1, 1], &kernel).is_ok());
        for (grid, block) in [
            ([0, 1, 1], [1, 1, 1]),
            ([1, 1, 1], [257, 1, 1]),
            ([1, 65536, 1], [1, 1, 1]),
            ([1, 1, 1], [1, 1, 65]),
        ] {
            let e = limits.check_shape(grid, block, &kernel).unwrap_err();
            assert_eq!(e.code, codes::INVALID_VALUE, "{grid:?} {block:?}");
        }
        // A kernel that names no limit gets the device's (1024 by default).
        let open = FunctionAttrs::default();
        assert!(limits.check_shape([1, 1, 1], [1024, 1, 1], &open).is_ok());
        assert!(limits.check_shape([1, 1, 1], [32, 33, 1], &open).is_err());
    }

    #[test]
    fn shared_memory_params_and_clusters() {
        let limits = LaunchLimits::of(&[(120, 1)]);
        let kernel = FunctionAttrs {
            shared_size_bytes: 1024,
            ..FunctionAttrs::default()
        };
        assert!(limits
            .check_shared(SHARED_PER_BLOCK_OPTIN as u32 - 1024, &kernel)
            .is_ok());
        assert!(limits
            .check_shared(SHARED_PER_BLOCK_OPTIN as u32 - 1023, &kernel)
            .is_err());
        let params = [ParamInfo { offset: 8, size: 8 }];
        assert!(check_params("k", &params, 16).is_ok());
        assert_eq!(
            check_params("k", &params, 12).unwrap_err().code,
            codes::INVALID_VALUE
        );
        let cluster = |dims| [LaunchAttribute::ClusterDim(dims)];
        assert!(limits
            .check_attributes(&cluster([2, 1, 1]), [4, 1, 1])
            .is_ok());
        let e = limits
            .check_attributes(&cluster([3, 1, 1]), [4, 1, 1])
            .unwrap_err();
        assert_eq!(e.code, CLUSTER_SIZE_ERROR);
        // Dimensions whose product is past u64 are refused, not an overflow
        // (found by cumux-fuzz), nor wrapped to a product that passes.
        for dims in [[u32::MAX; 3], [1 << 31, 1 << 31, 4]] {
            let e = limits
                .check_attributes(&cluster(dims), [4, 1, 1])
                .unwrap_err();
            assert_eq!(e.code, CLUSTER_SIZE_ERROR);
        }
        let e = LaunchLimits::of(&[])
            .check_attributes(&cluster([2, 1, 1]), [4, 1, 1])
            .unwrap_err();
        assert_eq!(e.code, codes::NOT_SUPPORTED);
    }
}
