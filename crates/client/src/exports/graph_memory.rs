//! Graphs' memory nodes (`cuGraphAddMemAllocNode`, `cuGraphAddMemFreeNode`,
//! and the generic call's types 10 and 11): the memory is allocated when the
//! node is made, at the address the node reports, and held as `graph_allocs` says.

use std::ffi::c_void;

use cumux_cuda_bindings::consts::*;

use super::graph::node_op;
use super::graph_allocs;
use super::*;
use crate::graph::GraphOp;
use crate::state::{client, Client};

/// Offsets in `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 and v2 alike): after the
/// 88-byte `CUmemPoolProps` come the access descriptors, their count, the
/// size and the address (out).
const POOL_LOCATION_TYPE: usize = 8;
const POOL_LOCATION_ID: usize = 12;
const BYTESIZE: usize = 104;
const DPTR: usize = 112;

fn field<T: Copy>(params: *mut c_void, offset: usize) -> CuResult<T> {
    Ok(*read_in(
        params.cast::<u8>().wrapping_add(offset).cast::<T>(),
    )?)
}

/// An allocation node's op for the parameters at `params`: the memory is
/// allocated now on the current context's device and its address written
/// into the parameters, as the driver does.
pub(super) fn alloc_node_op(c: &Client, params: *mut c_void) -> CuResult<GraphOp> {
    non_null(params)?;
    let bytes: usize = field(params, BYTESIZE)?;
    let (kind, id): (u32, i32) = (
        field(params, POOL_LOCATION_TYPE)?,
        field(params, POOL_LOCATION_ID)?,
    );
    let st = c.lock();
    let device = st.context_device()?;
    if kind != CU_MEM_LOCATION_TYPE_DEVICE || id != device as i32 {
        tracing::debug!(
            "a graph allocation node for location ({kind}, {id}), not the current device {device}"
        );
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ptr = super::memory::alloc(c, st, bytes)?;
    graph_allocs::register(&mut c.lock(), ptr, bytes as u64);
    out(params.cast::<u8>().wrapping_add(DPTR).cast::<u64>(), ptr)?;
    Ok(GraphOp::MemAlloc {
        ptr,
        bytes: bytes as u64,
    })
}

/// A free node's op: `ptr` must be memory of a graph's allocation node.
pub(super) fn free_node_op(c: &Client, ptr: u64) -> CuResult<GraphOp> {
    if !c.lock().graph_allocs.contains_key(&ptr) {
        tracing::debug!("a graph free node for {ptr:#x}, which no allocation node made");
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(GraphOp::MemFree { ptr })
}

driver_fn! {
    fn cuGraphMemAllocNodeGetParams(node: *mut c_void, params: *mut c_void) {
        let c = client()?;
        let (ptr, bytes) = match node_op(&c.lock(), node)? {
            GraphOp::MemAlloc { ptr, bytes } => (*ptr, *bytes),
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        non_null(params)?;
        let device = c.lock().context_device()?;
        // SAFETY: non-null; the caller passes a CUDA_MEM_ALLOC_NODE_PARAMS to
        // fill (DPTR + 8 bytes), zeroed first as the driver reports no access
        // descriptors.
        unsafe { std::ptr::write_bytes(params.cast::<u8>(), 0, DPTR + 8) };
        let at = |o: usize| params.cast::<u8>().wrapping_add(o);
        out(at(0).cast::<u32>(), CU_MEM_ALLOCATION_TYPE_PINNED)?;
        out(at(POOL_LOCATION_TYPE).cast::<u32>(), CU_MEM_LOCATION_TYPE_DEVICE)?;
        out(at(POOL_LOCATION_ID).cast::<i32>(), device as i32)?;
        out(at(BYTESIZE).cast::<u64>(), bytes)?;
        out(at(DPTR).cast::<u64>(), ptr)
    }

    fn cuGraphMemFreeNodeGetParams(node: *mut c_void, ptr: *mut u64) {
        match node_op(&client()?.lock(), node)? {
            GraphOp::MemFree { ptr: p } => out(ptr, *p),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }

    // Memory of graphs is given back when no graph holds it: nothing else to trim.
    fn cuDeviceGraphMemTrim(dev: i32) {
        client()?.device(dev).map(|_| ())
    }

    fn cuDeviceGetGraphMemAttribute(dev: i32, attr: u32, value: *mut c_void) {
        let c = client()?;
        c.device(dev)?;
        if attr > CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // cumux keeps no high watermark apart: each reads what is held now.
        let held = graph_allocs::bytes_held(&c.lock());
        out(value.cast::<u64>(), held)
    }

    fn cuDeviceSetGraphMemAttribute(dev: i32, attr: u32, value: *mut c_void) {
        client()?.device(dev)?;
        non_null(value)?;
        // Only the high watermarks may be reset (to 0).
        match attr {
            CU_GRAPH_MEM_ATTR_USED_MEM_HIGH | CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
}
