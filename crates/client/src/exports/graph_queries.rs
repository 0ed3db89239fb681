//! The rest of the explicit graph API: clones, nodes' parameters read back,
//! event and host nodes changed, nodes disabled in an instantiation, edges
//! removed, and a graph printed in DOT.

use std::ffi::{c_char, c_void};
use std::fmt::Write as _;
use std::sync::Arc;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::Call;

use super::graph::{add_graph, edges_of, node_op, node_type, reset_exec};
use super::graph_nodes::{child_op, edit_edges, event_op, host_op};
use super::graph_update::{place, set_in_exec, set_in_graph};
use super::*;
use crate::graph::GraphOp;
use crate::state::handles::to_program;
use crate::state::{client, Client};

/// A copy of `original`: its ops, fresh node handles, the same edges.
fn clone_graph(c: &Client, original: usize) -> CuResult<usize> {
    let mut st = c.lock();
    let ops = st
        .graphs
        .get(&original)
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if ops
        .iter()
        .any(|op| matches!(op, GraphOp::MemAlloc { .. } | GraphOp::MemFree { .. }))
    {
        tracing::debug!("a graph with memory nodes cannot be cloned (as with the driver)");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let old_nodes = st.graph_nodes.get(&original).cloned().unwrap_or_default();
    let explicit = st.graph_edges.get(&original).cloned();
    let clone = add_graph(c, &mut st, ops.as_ref().clone());
    let new_nodes = st.graph_nodes.get(&clone).cloned().unwrap_or_default();
    let map = |n: usize| old_nodes.iter().position(|&o| o == n).map(|i| new_nodes[i]);
    if let Some(edges) = explicit {
        let edges = edges
            .iter()
            .filter_map(|&(f, t)| Some((map(f)?, map(t)?)))
            .collect();
        st.graph_edges.insert(clone, edges);
    }
    st.graph_origins.insert(clone, original);
    Ok(clone)
}

/// A memcpy node's parameters, as `CUDA_MEMCPY3D` of one row.
fn memcpy_params(op: &GraphOp) -> CuResult<CUDA_MEMCPY3D> {
    let (src, src_host, dst, dst_host, len) = match op {
        GraphOp::Copy3D(p) => return Ok(p.0),
        GraphOp::HtoD { dst, src, len } => (0, *src, *dst, 0, *len),
        GraphOp::DtoH { dst, src, len } => (*src, 0, 0, *dst, *len),
        GraphOp::Call(Call::MemcpyDtoD {
            dst, src, bytes, ..
        }) => (*src, 0, *dst, 0, *bytes as usize),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let kind = |host: usize| match host {
        0 => CU_MEMORYTYPE_DEVICE,
        _ => CU_MEMORYTYPE_HOST,
    };
    Ok(CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: kind(src_host),
        srcHost: src_host as *const c_void,
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: len,
        srcHeight: 1,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: kind(dst_host),
        dstHost: dst_host as *mut c_void,
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: len,
        dstHeight: 1,
        WidthInBytes: len,
        Height: 1,
        Depth: 1,
    })
}

/// The event of an event record (`record`) or wait node.
fn node_event(c: &Client, node: *mut c_void, record: bool) -> CuResult<*mut c_void> {
    match (node_op(&c.lock(), node)?, record) {
        (GraphOp::Call(Call::EventRecord { event, .. }), true)
        | (GraphOp::Call(Call::StreamWaitEvent { event, .. }), false) => Ok(to_program(*event)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Disables (an empty op in its place) or enables again a kernel, memset or
/// memcpy node of an instantiation.
fn set_enabled(exec: *mut c_void, node: *mut c_void, enabled: bool) -> CuResult<()> {
    let c = client()?;
    let (graph, index) = place(c, node)?;
    let (exec, node) = (handle(exec), handle(node));
    let mut st = c.lock();
    if st.exec_graphs.get(&exec) != Some(&graph) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut recording = st
        .graph_execs
        .get(&exec)
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let ops = Arc::make_mut(&mut recording);
    let op = ops.get_mut(index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match (enabled, st.disabled_nodes.remove(&(exec, node))) {
        (true, Some(original)) => *op = original,
        (true, None) => return Ok(()),
        (false, Some(original)) => {
            st.disabled_nodes.insert((exec, node), original);
            return Ok(());
        }
        (false, None) => {
            if !matches!(node_type(op), 0..=2) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let original = std::mem::replace(op, GraphOp::Empty);
            st.disabled_nodes.insert((exec, node), original);
        }
    }
    drop(st);
    reset_exec(c, exec, recording)
}

/// A graph in the DOT language: one vertex per node (its type), one arrow per edge.
fn dot(c: &Client, graph: usize) -> CuResult<String> {
    let st = c.lock();
    let ops = st.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let nodes = st.graph_nodes.get(&graph).cloned().unwrap_or_default();
    let mut text = format!("digraph cumux_graph_{graph:x} {{\n");
    for (op, node) in ops.iter().zip(&nodes) {
        let _ = writeln!(
            text,
            "  n{node:x} [label=\"{:x} type {}\"];",
            node,
            node_type(op)
        );
    }
    for (from, to) in edges_of(&st, graph)? {
        let _ = writeln!(text, "  n{from:x} -> n{to:x};");
    }
    text.push_str("}\n");
    Ok(text)
}

driver_fn! {
    fn cuGraphClone(clone: *mut *mut c_void, original: *mut c_void) {
        non_null(clone)?;
        let h = clone_graph(client()?, handle(original))?;
        out(clone, to_ptr(h))
    }

    fn cuGraphNodeFindInClone(found: *mut *mut c_void, original: *mut c_void, clone: *mut c_void) {
        let c = client()?;
        let (graph, index) = place(c, original)?;
        let st = c.lock();
        if st.graph_origins.get(&handle(clone)) != Some(&graph) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let node = st.graph_nodes.get(&handle(clone)).and_then(|n| n.get(index)).copied();
        out(found, to_ptr(node.ok_or(CUDA_ERROR_INVALID_VALUE)?))
    }

    fn cuGraphMemsetNodeGetParams(node: *mut c_void, p: *mut CUDA_MEMSET_NODE_PARAMS) {
        let params = match node_op(&client()?.lock(), node)? {
            GraphOp::Call(Call::Memset { dst, value, elem_bytes, count, pitch, height, .. }) => {
                CUDA_MEMSET_NODE_PARAMS {
                    dst: *dst,
                    pitch: *pitch as usize,
                    value: *value,
                    elementSize: u32::from(*elem_bytes),
                    width: *count as usize,
                    height: *height as usize,
                }
            }
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        out(p, params)
    }

    fn cuGraphMemcpyNodeGetParams(node: *mut c_void, p: *mut CUDA_MEMCPY3D) {
        let params = memcpy_params(node_op(&client()?.lock(), node)?)?;
        out(p, params)
    }

    fn cuGraphEventRecordNodeGetEvent(node: *mut c_void, event: *mut *mut c_void) {
        out(event, node_event(client()?, node, true)?)
    }

    fn cuGraphEventWaitNodeGetEvent(node: *mut c_void, event: *mut *mut c_void) {
        out(event, node_event(client()?, node, false)?)
    }

    fn cuGraphEventRecordNodeSetEvent(node: *mut c_void, event: *mut c_void) {
        let c = client()?;
        set_in_graph(c, node, event_op(c, event, true)?)
    }

    fn cuGraphEventWaitNodeSetEvent(node: *mut c_void, event: *mut c_void) {
        let c = client()?;
        set_in_graph(c, node, event_op(c, event, false)?)
    }

    fn cuGraphExecEventRecordNodeSetEvent(exec: *mut c_void, node: *mut c_void, event: *mut c_void) {
        let c = client()?;
        set_in_exec(c, exec, node, event_op(c, event, true)?)
    }

    fn cuGraphExecEventWaitNodeSetEvent(exec: *mut c_void, node: *mut c_void, event: *mut c_void) {
        let c = client()?;
        set_in_exec(c, exec, node, event_op(c, event, false)?)
    }

    fn cuGraphHostNodeSetParams(node: *mut c_void, p: *const CUDA_HOST_NODE_PARAMS) {
        set_in_graph(client()?, node, host_op(read_in(p)?)?)
    }

    fn cuGraphExecHostNodeSetParams(exec: *mut c_void, node: *mut c_void, p: *const CUDA_HOST_NODE_PARAMS) {
        set_in_exec(client()?, exec, node, host_op(read_in(p)?)?)
    }

    fn cuGraphExecChildGraphNodeSetParams(exec: *mut c_void, node: *mut c_void, child: *mut c_void) {
        let c = client()?;
        set_in_exec(c, exec, node, child_op(c, child)?)
    }

    fn cuGraphNodeSetEnabled(exec: *mut c_void, node: *mut c_void, enabled: u32) {
        set_enabled(exec, node, enabled != 0)
    }

    fn cuGraphNodeGetEnabled(exec: *mut c_void, node: *mut c_void, enabled: *mut u32) {
        let c = client()?;
        place(c, node)?;
        let st = c.lock();
        if !st.graph_execs.contains_key(&handle(exec)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let off = st.disabled_nodes.contains_key(&(handle(exec), handle(node)));
        out(enabled, u32::from(!off))
    }

    fn cuGraphRemoveDependencies(graph: *mut c_void, from: *const *mut c_void, to: *const *mut c_void, n: usize) {
        remove_dependencies(graph, from, to, n)
    }

    fn cuGraphRemoveDependencies_v2(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        _data: *const CUgraphEdgeData,
        n: usize
    ) {
        remove_dependencies(graph, from, to, n)
    }

    fn cuGraphDebugDotPrint(graph: *mut c_void, path: *const c_char, _flags: u32) {
        let text = dot(client()?, handle(graph))?;
        let path = c_str(path)?;
        std::fs::write(path, text).map_err(|e| {
            tracing::debug!("cuGraphDebugDotPrint: {path}: {e}");
            CUDA_ERROR_OPERATING_SYSTEM
        })
    }
}

/// Removes edges `from[i]` → `to[i]`; an edge the graph lacks is refused.
fn remove_dependencies(
    graph: *mut c_void,
    from: *const *mut c_void,
    to: *const *mut c_void,
    n: usize,
) -> CuResult<()> {
    edit_edges(graph, from, to, n, |_, _, edges, edge| {
        let at = edges
            .iter()
            .position(|&e| e == edge)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        edges.remove(at);
        Ok(())
    })
}
