//! A worker context's CUDA arrays: array operations and copies to and from
//! arrays sent to the worker process, whose context runs them; and the
//! zeroing of a new array in a context shared by several tenants.

use cumux_protocol::arrays::{ArrayShape, CopyEnd, CopyExtent};
use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::{codes, CuError};

use super::context::{unexpected, WorkerContext};
use super::wire::{WorkerRequest, WorkerValue};
use crate::device::arrays::ArrayOp;
use crate::device::DeviceContext;

/// Zeroes array `array` (a backend id) of `shape` in `ctx`: the driver does
/// not, and in a shared context another tenant's bytes may lie where it
/// puts a new array.
pub fn zero_array(ctx: &dyn DeviceContext, array: u64, shape: &ArrayShape) -> Result<(), CuError> {
    let row = shape
        .row_bytes()
        .filter(|&r| r > 0 && r <= MAX_CHUNK_BYTES as u64)
        .ok_or_else(|| CuError::new(codes::INVALID_VALUE, format!("an array of {shape:?}")))?;
    let (rows, layers) = shape.rows_and_layers();
    let rows_per_piece = (MAX_CHUNK_BYTES as u64 / row).clamp(1, rows);
    let zeros = vec![0u8; (rows_per_piece * row) as usize];
    for z in 0..layers {
        let mut y = 0;
        while y < rows {
            let n = rows_per_piece.min(rows - y);
            let at = CopyEnd::Array {
                array,
                x_bytes: 0,
                y,
                z,
            };
            let extent = CopyExtent {
                width_bytes: row,
                height: n,
                depth: 1,
            };
            let bytes = &zeros[..(n * row) as usize];
            ctx.array_copy(&CopyEnd::Host, &at, &extent, bytes, &mut [])?;
            y += n;
        }
    }
    Ok(())
}

/// Zeroes what `op` made (an array, or every level of a mipmapped array).
pub fn zero_new(ctx: &dyn DeviceContext, op: &ArrayOp, id: u64) -> Result<(), CuError> {
    match op {
        ArrayOp::Create { shape, .. } => zero_array(ctx, id, shape),
        ArrayOp::CreateMipmapped { shape, levels, .. } => (0..*levels).try_for_each(|level| {
            let array = ctx.array(&ArrayOp::Level { mipmap: id, level })?;
            zero_array(ctx, array, &shape.level(level))
        }),
        _ => Ok(()),
    }
}

impl WorkerContext {
    /// [`crate::device::DeviceContext::array`] in the worker; the arrays'
    /// bytes count as the device's memory in use here too.
    pub(super) fn array_in_worker(&self, op: &ArrayOp) -> Result<u64, CuError> {
        let value = self.number(&WorkerRequest::Array(op.clone()))?;
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
