//! Conditional graph nodes (`cuGraphConditionalHandleCreate`, node type
//! `CONDITIONAL` of `cuGraphAddNode`): if, while and switch over body graphs.
//!
//! A handle is a device word (`crate::conditional` gives kernels the
//! `cudaGraphSetConditional` that sets it). Where the node stands in a
//! launch, the word is read in stream order and the chosen body graph is
//! replayed into the stream; a while node reads it again after each pass.
//! Each read waits for the stream's work before it: a graph with conditional
//! nodes runs op by op from the client, never as one server-side graph.

use std::ffi::c_void;
use std::sync::Arc;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::{Call, Handle, ReplyBody};

use super::graph::{add_graph, replay};
use super::*;
use crate::graph::{Conditional, GraphOp};
use crate::state::{client, Client, ConditionalHandle, State};

/// `CU_GRAPH_COND_ASSIGN_DEFAULT`.
const ASSIGN_DEFAULT: u32 = 1;

/// Writes `value` to a handle's word, in `stream`'s order (`None`: now).
fn set(c: &Client, cell: u64, value: u32, stream: Option<Handle>) -> CuResult<()> {
    let call = Call::Memset {
        dst: cell,
        value,
        elem_bytes: 4,
        count: 1,
        pitch: 4,
        height: 1,
        stream,
    };
    c.call(call).map(|_| ())
}

/// A handle's word once `stream`'s work before it is done.
fn read(c: &Client, cell: u64, stream: Handle) -> CuResult<u32> {
    let call = Call::MemcpyDtoH {
        src: cell,
        bytes: 4,
        stream: Some(stream),
    };
    match c.call(call)? {
        ReplyBody::Data(bytes) if bytes.len() == 4 => {
            Ok(u32::from_ne_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
        }
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

/// The handles a launch of exec `exec` sets to their default first.
pub(super) fn defaults(st: &State, exec: usize) -> Vec<ConditionalHandle> {
    let graph = st.exec_graphs.get(&exec);
    let handles = graph.and_then(|g| st.conditionals.get(g));
    handles.map_or_else(Vec::new, |h| {
        h.iter().filter(|h| h.assign_default).copied().collect()
    })
}

pub(super) fn assign(c: &Client, handles: &[ConditionalHandle], stream: Handle) -> CuResult<()> {
    for h in handles {
        set(c, h.cell, h.default, Some(stream))?;
    }
    Ok(())
}

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

/// Runs a conditional node into `stream`.
pub(super) fn run(c: &'static Client, cond: &Conditional, stream: Handle) -> CuResult<()> {
    let body = |i: usize| -> CuResult<()> {
        let recording = c
            .lock()
            .graphs
            .get(&cond.bodies[i])
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        replay(c, c.lock(), Vec::new(), &recording, stream)
    };
    let value = read(c, cond.cell, stream)?;
    match cond.kind {
        CU_GRAPH_COND_TYPE_IF if value != 0 => body(0),
        CU_GRAPH_COND_TYPE_IF if cond.bodies.len() == 2 => body(1),
        CU_GRAPH_COND_TYPE_WHILE => {
            let mut value = value;
            while value != 0 {
                body(0)?;
                value = read(c, cond.cell, stream)?;
            }
            Ok(())
        }
        CU_GRAPH_COND_TYPE_SWITCH if (value as usize) < cond.bodies.len() => body(value as usize),
        _ => Ok(()),
    }
}

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
        set(c, cell, default, None)?;
        let h = ConditionalHandle { cell, default, assign_default: flags & ASSIGN_DEFAULT != 0 };
        c.lock().conditionals.entry(g).or_default().push(h);
        out(handle_out, cell)
    }
}
