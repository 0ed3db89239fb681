//! Changing graphs after they are built: a node's parameters in its graph
//! (`cuGraph*NodeSetParams`), in an instantiated graph (`cuGraphExec*NodeSetParams`,
//! as XLA's command buffers update theirs) and a whole exec from its graph
//! (`cuGraphExecUpdate`). A node keeps its type; anything else is refused.

use std::ffi::c_void;
use std::sync::Arc;

use cumux_cuda_bindings::{consts::*, types::*};

use super::graph::{node_type, reset_exec};
use super::graph_nodes::{kernel_op_v2, memcpy_op, memset_op, node_params_op};
use super::*;
use crate::graph::GraphOp;
use crate::state::{client, Client};

/// Where a node's op sits: (its graph, its index in the recording).
pub(super) fn place(c: &Client, node: *mut c_void) -> CuResult<(usize, usize)> {
    c.lock()
        .nodes
        .get(&handle(node))
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// `op` replaces the op at `index` of `ops` if it is of the same node type.
fn replace(ops: &mut [GraphOp], index: usize, op: GraphOp) -> CuResult<()> {
    let old = ops.get_mut(index).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if node_type(old) != node_type(&op) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    *old = op;
    Ok(())
}

/// A node of a graph gets new parameters (`op`).
pub(super) fn set_in_graph(c: &Client, node: *mut c_void, op: GraphOp) -> CuResult<()> {
    let (graph, index) = place(c, node)?;
    let mut st = c.lock();
    let ops = st.graphs.get_mut(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    replace(Arc::make_mut(ops).as_mut_slice(), index, op)?;
    // `cuGraphKernelNodeGetParams` hands out the new arguments from now on.
    st.kernel_node_args.remove(&handle(node));
    Ok(())
}

/// A node of the graph `exec` was instantiated from gets new parameters in
/// `exec` alone.
pub(super) fn set_in_exec(
    c: &Client,
    exec: *mut c_void,
    node: *mut c_void,
    op: GraphOp,
) -> CuResult<()> {
    let (graph, index) = place(c, node)?;
    let exec = handle(exec);
    let mut recording = {
        let st = c.lock();
        if st.exec_graphs.get(&exec) != Some(&graph) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        st.graph_execs
            .get(&exec)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?
    };
    replace(Arc::make_mut(&mut recording).as_mut_slice(), index, op)?;
    reset_exec(c, exec, recording)
}

/// A kernel node's op from v1 parameters (no `kern`, no context).
fn kernel_op_v1(c: &Client, p: *const CUDA_KERNEL_NODE_PARAMS_v1) -> CuResult<GraphOp> {
    let p = read_in(p)?;
    let v2 = CUDA_KERNEL_NODE_PARAMS {
        func: p.func,
        gridDimX: p.gridDimX,
        gridDimY: p.gridDimY,
        gridDimZ: p.gridDimZ,
        blockDimX: p.blockDimX,
        blockDimY: p.blockDimY,
        blockDimZ: p.blockDimZ,
        sharedMemBytes: p.sharedMemBytes,
        kernelParams: p.kernelParams,
        extra: p.extra,
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    };
    kernel_op_v2(c, &v2)
}

/// `cuGraphExecUpdate`'s check: the graph has the exec's nodes, each of the
/// same type; `None` when it does, else the first node that differs (or the
/// last, for a graph of another size).
fn first_change(old: &[GraphOp], new: &[GraphOp], nodes: &[usize]) -> Option<usize> {
    let differs = (0..old.len().max(new.len())).find(|&i| match (old.get(i), new.get(i)) {
        (Some(a), Some(b)) => node_type(a) != node_type(b),
        _ => true,
    })?;
    Some(nodes.get(differs).or(nodes.last()).copied().unwrap_or(0))
}

/// Updates `exec` from `graph`: Ok(None) when done, Ok(Some(node)) when the
/// topology or a node's type changed (nothing updated).
fn update_exec(exec: *mut c_void, graph: *mut c_void) -> CuResult<Option<usize>> {
    let c = client()?;
    let (exec, graph) = (handle(exec), handle(graph));
    let (old, new, nodes) = {
        let st = c.lock();
        let old = st
            .graph_execs
            .get(&exec)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let new = st
            .graphs
            .get(&graph)
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        (
            old,
            new,
            st.graph_nodes.get(&graph).cloned().unwrap_or_default(),
        )
    };
    if let Some(node) = first_change(&old, &new, &nodes) {
        tracing::debug!("cuGraphExecUpdate: node {node:#x} changed type or the topology changed");
        return Ok(Some(node));
    }
    reset_exec(c, exec, new)?;
    c.lock().exec_graphs.insert(exec, graph);
    Ok(None)
}

driver_fn! {
    fn cuGraphKernelNodeSetParams(node: *mut c_void, p: *const CUDA_KERNEL_NODE_PARAMS_v1) {
        let c = client()?;
        set_in_graph(c, node, kernel_op_v1(c, p)?)
    }

    fn cuGraphKernelNodeSetParams_v2(node: *mut c_void, p: *const CUDA_KERNEL_NODE_PARAMS) {
        let c = client()?;
        set_in_graph(c, node, kernel_op_v2(c, read_in(p)?)?)
    }

    fn cuGraphMemsetNodeSetParams(node: *mut c_void, p: *const CUDA_MEMSET_NODE_PARAMS) {
        set_in_graph(client()?, node, memset_op(read_in(p)?)?)
    }

    fn cuGraphMemcpyNodeSetParams(node: *mut c_void, p: *const CUDA_MEMCPY3D) {
        let c = client()?;
        let op = memcpy_op(&c.lock(), read_in(p)?)?;
        set_in_graph(c, node, op)
    }

    fn cuGraphNodeSetParams | cuGraphNodeSetParams_v2 (node: *mut c_void, p: *mut c_void) {
        let c = client()?;
        set_in_graph(c, node, node_params_op(c, p)?)
    }

    fn cuGraphExecKernelNodeSetParams(exec: *mut c_void, node: *mut c_void, p: *const CUDA_KERNEL_NODE_PARAMS_v1) {
        let c = client()?;
        set_in_exec(c, exec, node, kernel_op_v1(c, p)?)
    }

    fn cuGraphExecKernelNodeSetParams_v2(exec: *mut c_void, node: *mut c_void, p: *const CUDA_KERNEL_NODE_PARAMS) {
        let c = client()?;
        set_in_exec(c, exec, node, kernel_op_v2(c, read_in(p)?)?)
    }

    fn cuGraphExecMemsetNodeSetParams(exec: *mut c_void, node: *mut c_void, p: *const CUDA_MEMSET_NODE_PARAMS, _ctx: *mut c_void) {
        set_in_exec(client()?, exec, node, memset_op(read_in(p)?)?)
    }

    fn cuGraphExecMemcpyNodeSetParams(exec: *mut c_void, node: *mut c_void, p: *const CUDA_MEMCPY3D, _ctx: *mut c_void) {
        let c = client()?;
        let op = memcpy_op(&c.lock(), read_in(p)?)?;
        set_in_exec(c, exec, node, op)
    }

    fn cuGraphExecNodeSetParams(exec: *mut c_void, node: *mut c_void, p: *mut c_void) {
        let c = client()?;
        set_in_exec(c, exec, node, node_params_op(c, p)?)
    }

    fn cuGraphExecUpdate(
        exec: *mut c_void,
        graph: *mut c_void,
        error_node: *mut *mut c_void,
        result: *mut CUgraphExecUpdateResult
    ) {
        let changed = update_exec(exec, graph)?;
        out_opt(error_node, changed.map_or(std::ptr::null_mut(), to_ptr));
        out_opt(result, match changed {
            None => CU_GRAPH_EXEC_UPDATE_SUCCESS,
            Some(_) => CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
        });
        changed.map_or(Ok(()), |_| Err(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE))
    }

    fn cuGraphExecUpdate_v2(exec: *mut c_void, graph: *mut c_void, info: *mut CUgraphExecUpdateResultInfo) {
        let changed = update_exec(exec, graph)?;
        if !info.is_null() {
            let node = changed.map_or(std::ptr::null_mut(), to_ptr);
            out(info, CUgraphExecUpdateResultInfo {
                result: match changed {
                    None => CU_GRAPH_EXEC_UPDATE_SUCCESS,
                    Some(_) => CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED,
                },
                errorNode: node,
                errorFromNode: std::ptr::null_mut(),
            })?;
        }
        changed.map_or(Ok(()), |_| Err(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE))
    }
}
