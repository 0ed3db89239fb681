//! Conditional graph nodes (`cuGraphConditionalHandleCreate`, node type
//! `CONDITIONAL` of `cuGraphAddNode`): if, while and switch over body graphs.
//!
//! A handle is a device word (`crate::conditional` gives kernels the
//! `cudaGraphSetConditional` that sets it, and reads it); a launch replays
//! the chosen body where the node stands (`graph::run_conditional`).

use std::ffi::c_void;
use std::sync::Arc;

use cumux_cuda_bindings::{consts::*, types::*};

use super::graph::add_graph;
use super::*;
use crate::graph::{Conditional, GraphOp};
use crate::state::{client, Client, ConditionalHandle};

/// `CU_GRAPH_COND_ASSIGN_DEFAULT`.
const ASSIGN_DEFAULT: u32 = 1;

/// The op of a conditional node's `CUDA_CONDITIONAL_NODE_PARAMS` at `params`:
/// its body graphs are made here, and its `phGraph_out` is set to an array
/// of them that the node owns (as the driver's array is the driver's).
pub(super) fn conditional_op(c: &Client, params: *mut u8) -> CuResult<GraphOp> {
    let cell = *read_in(params.cast::<u64>())?;
    let kind = *read_in(params.wrapping_add(8).cast::<u32>())?;
    let size = *read_in(params.wrapping_add(12).cast::<u32>())?;
    let sizes_allowed = match kind {
        CU_GRAPH_COND_TYPE_IF => 1..=2,
        CU_GRAPH_COND_TYPE_WHILE => 1..=1,
        CU_GRAPH_COND_TYPE_SWITCH => 1..=MAX_SWITCH,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    if !sizes_allowed.contains(&size) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut st = c.lock();
    let known = st.conditionals.values().flatten().any(|h| h.cell == cell);
    if !known {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let bodies: Vec<usize> = (0..size)
        .map(|_| add_graph(c, &mut st, Vec::new()))
        .collect();
    drop(st);
    let cond = Arc::new(Conditional { cell, kind, bodies });
    let array = cond.bodies.as_ptr() as *mut c_void;
    out(params.wrapping_add(16).cast::<*mut c_void>(), array)?;
    Ok(GraphOp::Conditional(cond))
}

/// The most bodies a switch node may have.
const MAX_SWITCH: u32 = 1 << 16;

driver_fn! {
    fn cuGraphConditionalHandleCreate(
        handle_out: *mut CUgraphConditionalHandle,
        graph: CUgraph,
        _ctx: CUcontext,
        default: u32,
        flags: u32
    ) {
        let c = client()?;
        non_null(handle_out)?;
        if flags & !ASSIGN_DEFAULT != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let g = handle(graph.cast());
        if !c.lock().graphs.contains_key(&g) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::conditional::used();
        let cell = super::memory::alloc(c, c.lock(), 4)?;
        crate::conditions::set(c, cell, default, None)?;
        let h = ConditionalHandle { cell, default, assign_default: flags & ASSIGN_DEFAULT != 0 };
        c.lock().conditionals.entry(g).or_default().push(h);
        out(handle_out, cell)
    }
}
