//! A launch checked against its kernel and the device's limits (the rules of
//! `cumux_protocol::launch_checks`, which the client applies at the call too):
//! [`check_launch`] → [`CheckedLaunch`], ready for the device.

use cumux_protocol::launch_checks::{check_params, LaunchLimits};
use cumux_protocol::{CuError, GraphLaunch};

use crate::device::{KernelDesc, LaunchGeometry, ModuleId, StreamWork};

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
    limits.check_shape(grid, block, &desc.attrs)?;
    limits.check_shared(shared_bytes, &desc.attrs)?;
    check_params(&desc.name, &desc.params, params.len())?;
    limits.check_attributes(&attributes, grid)?;
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
