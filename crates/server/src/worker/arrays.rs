//! A worker context's CUDA arrays: array operations and copies to and from
//! arrays sent to the worker process, whose context runs them.

use cumux_protocol::arrays::{CopyEnd, CopyExtent};
use cumux_protocol::CuError;

use super::context::{unexpected, WorkerContext};
use super::wire::{WorkerRequest, WorkerValue};
use crate::device::arrays::ArrayOp;

impl WorkerContext {
    /// [`crate::device::DeviceContext::array`] in the worker; the arrays'
    /// bytes count as the device's memory in use here too.
    pub(super) fn array_in_worker(&self, op: &ArrayOp) -> Result<u64, CuError> {
        let value = match self.call(&WorkerRequest::Array(op.clone()), &[], None)? {
            WorkerValue::Number(v) => v,
            other => return Err(unexpected(&other)),
        };
        match *op {
            ArrayOp::Create { bytes, .. } | ArrayOp::CreateMipmapped { bytes, .. } => {
                self.memory.charge(bytes)
            }
            ArrayOp::Destroy { bytes, .. } | ArrayOp::DestroyMipmapped { bytes, .. } => {
                self.memory.release(bytes)
            }
            _ => {}
        }
        Ok(value)
    }

    /// [`crate::device::DeviceContext::array_copy`] in the worker: a host
    /// source's box goes as a raw frame, a host destination's comes back
    /// as one.
    pub(super) fn array_copy_in_worker(
        &self,
        src: &CopyEnd,
        dst: &CopyEnd,
        extent: &CopyExtent,
        from_host: &[u8],
        to_host: &mut [u8],
    ) -> Result<(), CuError> {
        let request = WorkerRequest::ArrayCopy {
            src: *src,
            dst: *dst,
            extent: *extent,
        };
        let frames: &[&[u8]] = match src {
            CopyEnd::Host => &[from_host],
            _ => &[],
        };
        let back = (*dst == CopyEnd::Host).then_some(to_host);
        match self.call(&request, frames, back)? {
            WorkerValue::Bytes | WorkerValue::Unit => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}
