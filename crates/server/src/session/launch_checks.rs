//! A launch checked against its kernel and the device's limits (the rules of
//! `cumux_protocol::launch_checks`, which the client applies at the call too):
//! [`check_launch`] → a [`KernelLaunch`], ready for the device.

use cumux_protocol::launch_checks::{check_params, LaunchLimits};
use cumux_protocol::{CuError, GraphLaunch};

use crate::device::{KernelDesc, KernelLaunch, LaunchGeometry, ModuleId};

/// Checks `launch` of kernel `desc` (index `kernel` of device module `module`)
/// against the kernel and the device's `limits`.
pub fn check_launch(
    limits: &LaunchLimits,
    module: ModuleId,
    kernel: usize,
    desc: &KernelDesc,
    launch: GraphLaunch,
) -> Result<KernelLaunch, CuError> {
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
    Ok(KernelLaunch {
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
