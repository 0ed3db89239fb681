//! What a launch must satisfy before it reaches a device: the device's grid,
//! block, shared-memory and cluster limits and the kernel's own, as the driver
//! checks them at the call ([`check_launch`] → [`CheckedLaunch`]).

use cumux_protocol::{codes, CuError, DeviceInfo, GraphLaunch, LaunchAttribute};

use crate::device::attributes::{MAX_BLOCK_DIM, MAX_GRID_DIM, SHARED_PER_BLOCK_OPTIN};
use crate::device::{KernelDesc, LaunchGeometry, ModuleId, StreamWork};

/// `CUDA_ERROR_INVALID_CLUSTER_SIZE`.
const CLUSTER_SIZE_ERROR: u32 = 912;

fn err(code: u32, detail: impl Into<String>) -> CuError {
    CuError::new(code, detail)
}

/// A device's launch limits, from its attributes (the defaults where a
/// device does not give one).
pub struct LaunchLimits {
    pub block: [i32; 3],
    pub grid: [i32; 3],
    pub shared_per_block_optin: i32,
    /// 0 where the device runs no clusters (before compute capability 9).
    pub max_cluster_blocks: u32,
}

impl LaunchLimits {
    pub fn of(info: &DeviceInfo) -> Self {
        let attr = |id: u32, default: i32| {
            info.attributes
                .iter()
                .find(|(a, _)| *a == id)
                .map_or(default, |(_, v)| *v)
        };
        LaunchLimits {
            block: [2, 3, 4].map(|id| attr(id, MAX_BLOCK_DIM[id as usize - 2])),
            grid: [5, 6, 7].map(|id| attr(id, MAX_GRID_DIM[id as usize - 5])),
            // CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
            shared_per_block_optin: attr(97, SHARED_PER_BLOCK_OPTIN),
            // CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, then Hopper's non-portable limit.
            max_cluster_blocks: if attr(120, 0) != 0 { 16 } else { 0 },
        }
    }
}

/// A launch checked against its kernel and the device.
#[derive(Clone)]
pub struct CheckedLaunch {
    pub module: ModuleId,
    pub kernel: usize,
    pub geometry: LaunchGeometry,
    pub params: Vec<u8>,
}

impl CheckedLaunch {
    pub fn work(&self) -> StreamWork {
        self.clone().into_work()
    }

    pub fn into_work(self) -> StreamWork {
        StreamWork::Launch {
            module: self.module,
            kernel: self.kernel,
            geometry: self.geometry,
            params: self.params,
        }
    }
}

/// Checks `launch` of kernel `desc` (index `kernel` of device module `module`)
/// against the kernel and the device's `limits`.
pub fn check_launch(
    limits: &LaunchLimits,
    module: ModuleId,
    kernel: usize,
    desc: &KernelDesc,
    launch: GraphLaunch,
) -> Result<CheckedLaunch, CuError> {
    let GraphLaunch {
        function: _,
        grid,
        block,
        shared_bytes,
        params,
        attributes,
    } = launch;
    let bad = |what: String| Err(err(codes::INVALID_VALUE, what));
    if grid.contains(&0) || block.contains(&0) {
        return bad(format!("empty launch grid {grid:?} block {block:?}"));
    }
    let over = |dims: [u32; 3], limits: [i32; 3]| {
        dims.iter().zip(limits).any(|(d, l)| *d as u64 > l as u64)
    };
    if over(block, limits.block) || over(grid, limits.grid) {
        return bad(format!(
            "launch grid {grid:?} block {block:?} over the device's limits"
        ));
    }
    let threads: u64 = block.iter().map(|d| u64::from(*d)).product();
    let max_threads = match desc.attrs.max_threads_per_block {
        n if n > 0 => n as u64,
        _ => 1024,
    };
    if threads > max_threads {
        return bad(format!(
            "block of {threads} threads over the kernel's {max_threads}"
        ));
    }
    let shared_total = u64::from(shared_bytes) + desc.attrs.shared_size_bytes.max(0) as u64;
    if shared_total > limits.shared_per_block_optin as u64 {
        return bad(format!("{shared_total} bytes of shared memory per block"));
    }
    if (params.len() as u64) < desc.params_bytes() {
        return bad(format!(
            "{} parameter bytes for {}, which takes {}",
            params.len(),
            desc.name,
            desc.params_bytes()
        ));
    }
    check_launch_attributes(&attributes, grid, limits.max_cluster_blocks)?;
    Ok(CheckedLaunch {
        module,
        kernel,
        geometry: LaunchGeometry {
            grid,
            block,
            dynamic_shared_bytes: shared_bytes,
            attributes,
        },
        params,
    })
}

/// Checks what a launch's attributes ask of the device: cluster dimensions
/// must divide the grid and fit the device.
fn check_launch_attributes(
    attributes: &[LaunchAttribute],
    grid: [u32; 3],
    max_cluster_blocks: u32,
) -> Result<(), CuError> {
    for a in attributes {
        if let LaunchAttribute::ClusterDim(dims) = a {
            let blocks = dims.iter().map(|d| u64::from(*d)).product::<u64>();
            if blocks <= 1 && !dims.contains(&0) {
                continue;
            }
            if max_cluster_blocks == 0 {
                return Err(err(
                    codes::NOT_SUPPORTED,
                    "this device runs no thread-block clusters",
                ));
            }
            let divides = dims.iter().zip(grid).all(|(d, g)| *d > 0 && g % d == 0);
            if !divides || blocks > u64::from(max_cluster_blocks) {
                return Err(err(
                    CLUSTER_SIZE_ERROR,
                    format!("cluster {dims:?} for grid {grid:?}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An H100 lets a block opt in to 227 KiB of shared memory; cuBLASLt's
    /// Hopper GEMMs take 226 KiB, which the CPU device's 99 KiB refused.
    #[test]
    fn launch_limits_are_the_devices_own() {
        let mut info = DeviceInfo {
            ordinal: 0,
            name: "gpu".into(),
            uuid: [0; 16],
            pci: [0; 3],
            total_mem: 1 << 30,
            attributes: vec![(97, 232_448), (5, 1 << 30)],
            backend: "cuda".into(),
        };
        let limits = LaunchLimits::of(&info);
        assert_eq!(limits.shared_per_block_optin, 232_448);
        assert_eq!(limits.grid, [1 << 30, MAX_GRID_DIM[1], MAX_GRID_DIM[2]]);
        assert_eq!(limits.block, MAX_BLOCK_DIM);
        info.attributes.clear();
        assert_eq!(
            LaunchLimits::of(&info).shared_per_block_optin,
            SHARED_PER_BLOCK_OPTIN
        );
    }
}
