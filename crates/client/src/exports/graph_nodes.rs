//! CUDA graphs built node by node (`cuGraphAdd*Node`, `cuGraphAddDependencies`):
//! each node is one op of the graph's recording (`crate::graph`), and a launch
//! runs them in the order they were added, which every dependency agrees with.

use std::ffi::c_void;
use std::sync::Arc;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::{Call, DEFAULT_STREAM};

use super::graph::edges_of;
use super::graph_allocs;
use super::graph_memory::{alloc_node_op, free_node_op};
use super::launch::pack_params;
use super::*;
use crate::graph::{Copy3D, GraphOp};
use crate::host_fn::UserData;
use crate::state::{client, handles, Client, State};

/// `n` node handles from the program's array `list`.
pub(super) fn node_list(list: *const *mut c_void, n: usize) -> CuResult<Vec<usize>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let width = std::mem::size_of::<usize>();
    let bytes = host_bytes(
        list.cast(),
        n.checked_mul(width).ok_or(CUDA_ERROR_INVALID_VALUE)?,
    )?;
    Ok(bytes
        .chunks_exact(width)
        .map(|w| {
            let mut word = [0u8; std::mem::size_of::<usize>()];
            word.copy_from_slice(w);
            usize::from_ne_bytes(word)
        })
        .collect())
}

/// Appends `op` to `graph` as a node after `deps` (nodes of that graph): the
/// new node's handle, written to `node_out`.
pub(super) fn add_node(
    c: &Client,
    node_out: *mut *mut c_void,
    graph: *mut c_void,
    deps: *const *mut c_void,
    n: usize,
    op: GraphOp,
) -> CuResult<()> {
    non_null(node_out)?;
    let deps = node_list(deps, n)?;
    let g = handle(graph);
    let mut st = c.lock();
    if let Some(stream) = st.capture_of_graph(g) {
        // A node added to a capture's graph while it captures: recorded in
        // the capture's order, after everything captured so far (which
        // holds whatever it depends on).
        if deps
            .iter()
            .any(|d| st.nodes.get(d).is_some_and(|p| p.0 != g))
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        st.capture(stream, op);
        let node = c.mint();
        st.nodes.insert(node, (g, usize::MAX));
        st.graph_nodes.entry(g).or_default().push(node);
        drop(st);
        return out(node_out, to_ptr(node));
    }
    let mut edges = edges_of(&st, g)?;
    if deps.iter().any(|d| st.nodes.get(d).map(|p| p.0) != Some(g)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let node = c.mint();
    if !st.graphs.contains_key(&g) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    graph_allocs::hold(&mut st, std::slice::from_ref(&op));
    let ops = Arc::make_mut(st.graphs.get_mut(&g).ok_or(CUDA_ERROR_INVALID_VALUE)?);
    ops.push(op);
    let index = ops.len() - 1;
    st.nodes.insert(node, (g, index));
    st.graph_nodes.entry(g).or_default().push(node);
    edges.extend(deps.iter().map(|&d| (d, node)));
    st.graph_edges.insert(g, edges);
    drop(st);
    out(node_out, to_ptr(node))
}

/// A kernel node's launch, its arguments packed now as a launch packs them.
#[allow(clippy::too_many_arguments)]
fn kernel_op(
    c: &Client,
    func: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult<GraphOp> {
    let function = handles::wire_or_invalid(func)?;
    let st = c.lock();
    let params = pack_params(&st.function(function)?.params, kernel_params, extra)?;
    Ok(GraphOp::Call(Call::Launch {
        function,
        grid,
        block,
        shared_bytes: shared,
        stream: DEFAULT_STREAM,
        params,
        attributes: Vec::new(),
    }))
}

/// A child graph node's op: the child's ops as they are now.
pub(super) fn child_op(c: &Client, child: *mut c_void) -> CuResult<GraphOp> {
    let st = c.lock();
    let ops = st
        .graphs
        .get(&handle(child))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(GraphOp::Child(Arc::new(ops.as_ref().clone())))
}

/// An event record (or wait) node's op.
pub(super) fn event_op(c: &Client, event: *mut c_void, record: bool) -> CuResult<GraphOp> {
    let event = handles::wire_or_invalid(event)?;
    c.lock().check_event(event)?;
    Ok(GraphOp::Call(match record {
        true => Call::EventRecord {
            event,
            stream: DEFAULT_STREAM,
        },
        false => Call::StreamWaitEvent {
            stream: DEFAULT_STREAM,
            event,
        },
    }))
}

/// [`kernel_op`] of a `CUDA_KERNEL_NODE_PARAMS` of either version, launching `$func`.
macro_rules! kernel_node_op {
    ($c:expr, $p:expr, $func:expr) => {
        kernel_op(
            $c,
            $func,
            [$p.gridDimX, $p.gridDimY, $p.gridDimZ],
            [$p.blockDimX, $p.blockDimY, $p.blockDimZ],
            $p.sharedMemBytes,
            $p.kernelParams,
            $p.extra,
        )
    };
}

/// A kernel node's op from the v2 (or v3) parameters: their function, else
/// their kernel (cumux's CUkernel and CUfunction handles are one and the same).
pub(super) fn kernel_op_v2(c: &Client, p: &CUDA_KERNEL_NODE_PARAMS) -> CuResult<GraphOp> {
    let func = match p.func.is_null() {
        true => p.kern.cast(),
        false => p.func.cast(),
    };
    kernel_node_op!(c, p, func)
}

/// A memset node's op: 1, 2 or 4-byte elements, rows `pitch` bytes apart.
pub(super) fn memset_op(p: &CUDA_MEMSET_NODE_PARAMS) -> CuResult<GraphOp> {
    if !matches!(p.elementSize, 1 | 2 | 4) || p.width == 0 || p.height == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let row = p
        .width
        .checked_mul(p.elementSize as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let pitch = match p.height {
        1 => row,
        _ if p.pitch < row => return Err(CUDA_ERROR_INVALID_VALUE),
        _ => p.pitch,
    };
    Ok(GraphOp::Call(Call::Memset {
        dst: p.dst,
        value: p.value,
        elem_bytes: p.elementSize as u8,
        count: p.width as u64,
        pitch: pitch as u64,
        height: p.height as u64,
        stream: Some(DEFAULT_STREAM),
    }))
}

/// One side of a memcpy node: (address, whether it is device memory).
fn copy_side(st: &State, kind: u32, host: usize, device: u64) -> CuResult<(u64, bool)> {
    match kind {
        CU_MEMORYTYPE_HOST => Ok((host as u64, false)),
        CU_MEMORYTYPE_DEVICE => Ok((device, true)),
        CU_MEMORYTYPE_UNIFIED => Ok((device, st.is_device_memory(device))),
        _ => Err(CUDA_ERROR_NOT_SUPPORTED),
    }
}

/// A memcpy node's op: one contiguous row as a copy call; a box of rows
/// (offsets, pitches, depth) or an array end as the whole copy, made at
/// each launch.
pub(super) fn memcpy_op(st: &State, p: &CUDA_MEMCPY3D) -> CuResult<GraphOp> {
    let offsets = [
        p.srcXInBytes,
        p.srcY,
        p.srcZ,
        p.srcLOD,
        p.dstXInBytes,
        p.dstY,
        p.dstZ,
        p.dstLOD,
    ];
    let array = p.srcMemoryType == CU_MEMORYTYPE_ARRAY || p.dstMemoryType == CU_MEMORYTYPE_ARRAY;
    if array || offsets.iter().any(|&o| o != 0) || p.Height > 1 || p.Depth > 1 {
        // Made at each launch as cuMemcpy3DAsync makes it (checked then).
        return Ok(GraphOp::Copy3D(Copy3D(*p)));
    }
    let len = p.WidthInBytes;
    let (src, src_device) = copy_side(st, p.srcMemoryType, p.srcHost as usize, p.srcDevice)?;
    let (dst, dst_device) = copy_side(st, p.dstMemoryType, p.dstHost as usize, p.dstDevice)?;
    Ok(match (dst_device, src_device) {
        (true, true) => GraphOp::Call(Call::MemcpyDtoD {
            dst,
            src,
            bytes: len as u64,
            stream: Some(DEFAULT_STREAM),
        }),
        (true, false) => GraphOp::HtoD {
            dst,
            src: src as usize,
            len,
        },
        (false, true) => GraphOp::DtoH {
            dst: dst as usize,
            src,
            len,
        },
        (false, false) => return Err(CUDA_ERROR_NOT_SUPPORTED),
    })
}

/// A host node's op: the program's function with its argument, skipped
/// after an error as stream host functions are.
pub(super) fn host_op(p: &CUDA_HOST_NODE_PARAMS) -> CuResult<GraphOp> {
    let func = p.fn_.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let data = UserData(p.userData);
    Ok(GraphOp::HostFn(Arc::new(move |status| {
        if status == CUDA_SUCCESS {
            let data = &data;
            // SAFETY: calling the program's host function with its own argument.
            unsafe { func(data.0) }
        }
    })))
}

/// Applies `edit` to `graph`'s edges for each pair `from[i]` → `to[i]`
/// (with the graph's handle and the state, to place the nodes), then keeps
/// the edges; the first refusal changes nothing.
pub(super) fn edit_edges(
    graph: *mut c_void,
    from: *const *mut c_void,
    to: *const *mut c_void,
    n: usize,
    edit: impl Fn(&State, usize, &mut Vec<(usize, usize)>, (usize, usize)) -> CuResult<()>,
) -> CuResult<()> {
    let (from, to) = (node_list(from, n)?, node_list(to, n)?);
    let c = client()?;
    let g = handle(graph);
    let mut st = c.lock();
    let mut edges = edges_of(&st, g)?;
    for edge in from.into_iter().zip(to) {
        edit(&st, g, &mut edges, edge)?;
    }
    st.graph_edges.insert(g, edges);
    Ok(())
}

/// Adds edges `from[i]` → `to[i]`; an edge against the order the nodes were
/// added in answers `CUDA_ERROR_NOT_SUPPORTED` (cumux runs them in that order).
fn add_dependencies(
    graph: *mut c_void,
    from: *const *mut c_void,
    to: *const *mut c_void,
    n: usize,
) -> CuResult<()> {
    edit_edges(graph, from, to, n, |st, g, edges, (f, t)| {
        let place = |n: usize| st.nodes.get(&n).filter(|p| p.0 == g).map(|p| p.1);
        let (Some(fi), Some(ti)) = (place(f), place(t)) else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        if fi >= ti {
            tracing::debug!("a graph edge to a node added before its source is not supported");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        edges.push((f, t));
        Ok(())
    })
}

/// Bytes from the start of a `CUgraphNodeParams` to its union of parameters
/// (after the node type and three reserved ints).
const NODE_PARAMS_UNION: usize = 16;
/// Bytes from the start of a `CUDA_MEMCPY_NODE_PARAMS` to its `CUDA_MEMCPY3D`
/// (after its flags, a reserved int and the copy's context).
const MEMCPY_NODE_COPY: usize = 16;

/// The op of a `CUgraphNodeParams` (`cuGraphAddNode`): kernel, memset,
/// memcpy, empty, child, event, host, memory and conditional nodes; any other type
/// answers `CUDA_ERROR_NOT_SUPPORTED`.
pub(super) fn node_params_op(c: &Client, params: *mut c_void) -> CuResult<GraphOp> {
    non_null(params)?;
    let kind = *read_in(params.cast::<u32>())?;
    let union = params.cast::<u8>().wrapping_add(NODE_PARAMS_UNION);
    match kind {
        // `CUDA_KERNEL_NODE_PARAMS_v3` has the layout of the v2 structure.
        CU_GRAPH_NODE_TYPE_KERNEL => {
            kernel_op_v2(c, read_in(union.cast::<CUDA_KERNEL_NODE_PARAMS>())?)
        }
        // `CUDA_MEMSET_NODE_PARAMS_v2` is the v1 structure and a context.
        CU_GRAPH_NODE_TYPE_MEMSET => memset_op(read_in(union.cast::<CUDA_MEMSET_NODE_PARAMS>())?),
        CU_GRAPH_NODE_TYPE_MEMCPY => {
            let copy = union.wrapping_add(MEMCPY_NODE_COPY).cast::<CUDA_MEMCPY3D>();
            memcpy_op(&c.lock(), read_in(copy)?)
        }
        CU_GRAPH_NODE_TYPE_EMPTY => Ok(GraphOp::Empty),
        // `CUDA_HOST_NODE_PARAMS_v2` is the v1 structure.
        CU_GRAPH_NODE_TYPE_HOST => host_op(read_in(union.cast::<CUDA_HOST_NODE_PARAMS>())?),
        CU_GRAPH_NODE_TYPE_MEM_ALLOC => alloc_node_op(c, union.cast()),
        CU_GRAPH_NODE_TYPE_MEM_FREE => free_node_op(c, *read_in(union.cast::<u64>())?),
        CU_GRAPH_NODE_TYPE_GRAPH => child_op(c, *read_in(union.cast::<*mut c_void>())?),
        CU_GRAPH_NODE_TYPE_CONDITIONAL => super::graph_conditional::conditional_op(c, union),
        CU_GRAPH_NODE_TYPE_EVENT_RECORD | CU_GRAPH_NODE_TYPE_WAIT_EVENT => event_op(
            c,
            *read_in(union.cast::<*mut c_void>())?,
            kind == CU_GRAPH_NODE_TYPE_EVENT_RECORD,
        ),
        other => {
            // Said once per type on stderr, as an unimplemented entry point is.
            static SAID: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());
            let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
            if !said.contains(&other) {
                said.push(other);
                crate::errors::report_not_implemented(&format!(
                    "cuGraphAddNode of node type {other}"
                ));
            }
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
    }
}

/// `cuGraphAddNode_v2`/`_v3` edge data. Default and programmatic edges are
/// taken, each as a full dependency: a programmatic edge only lets the next
/// kernel start before the previous one ends (XLA adds them on Hopper), so
/// running it after the previous one ends keeps every result (at the price of
/// that overlap). Other edge types, or reserved bytes set, are refused.
/// `CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER`, the last of the header's ports
/// (default 0, programmatic 1, launch order 2).
const LAST_KERNEL_PORT: u8 = 2;

pub(super) fn edges_taken(data: *const CUgraphEdgeData, n: usize) -> CuResult<()> {
    if data.is_null() || n == 0 {
        return Ok(());
    }
    let bytes = host_bytes(data.cast(), n * std::mem::size_of::<CUgraphEdgeData>())?;
    for edge in bytes.chunks_exact(std::mem::size_of::<CUgraphEdgeData>()) {
        let (ports, kind, reserved) = (&edge[..2], edge[2], &edge[3..]);
        let ports_known = ports.iter().all(|&p| p <= LAST_KERNEL_PORT);
        let kind_known = matches!(
            kind as u32,
            CU_GRAPH_DEPENDENCY_TYPE_DEFAULT | CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        );
        if !(ports_known && kind_known && reserved.iter().all(|&b| b == 0)) {
            tracing::debug!("a graph edge of type {kind} (ports {ports:?}) is not supported");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
    }
    Ok(())
}

driver_fn! {
    fn cuGraphAddNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        params: *mut c_void
    ) {
        let c = client()?;
        let op = node_params_op(c, params)?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddNode_v2 | cuGraphAddNode_v3 (
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        data: *const CUgraphEdgeData,
        n: usize,
        params: *mut c_void
    ) {
        edges_taken(data, n)?;
        let c = client()?;
        let op = node_params_op(c, params)?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddKernelNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        p: *const CUDA_KERNEL_NODE_PARAMS_v1
    ) {
        let c = client()?;
        let p = read_in(p)?;
        let op = kernel_node_op!(c, p, p.func.cast())?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddKernelNode_v2(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        p: *const CUDA_KERNEL_NODE_PARAMS
    ) {
        let c = client()?;
        let op = kernel_op_v2(c, read_in(p)?)?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddMemsetNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        p: *const CUDA_MEMSET_NODE_PARAMS,
        _ctx: *mut c_void
    ) {
        let op = memset_op(read_in(p)?)?;
        add_node(client()?, node, graph, deps, n, op)
    }

    fn cuGraphAddMemcpyNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        p: *const CUDA_MEMCPY3D,
        _ctx: *mut c_void
    ) {
        let c = client()?;
        let op = memcpy_op(&c.lock(), read_in(p)?)?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddHostNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        p: *const CUDA_HOST_NODE_PARAMS
    ) {
        let op = host_op(read_in(p)?)?;
        add_node(client()?, node, graph, deps, n, op)
    }

    fn cuGraphAddMemAllocNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        p: *mut c_void
    ) {
        let c = client()?;
        let op = alloc_node_op(c, p)?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddMemFreeNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        ptr: u64
    ) {
        let c = client()?;
        let op = free_node_op(c, ptr)?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddEmptyNode(node: *mut *mut c_void, graph: *mut c_void, deps: *const *mut c_void, n: usize) {
        add_node(client()?, node, graph, deps, n, GraphOp::Empty)
    }

    fn cuGraphAddChildGraphNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        child: *mut c_void
    ) {
        let c = client()?;
        let op = child_op(c, child)?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddEventRecordNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        event: *mut c_void
    ) {
        let c = client()?;
        let op = event_op(c, event, true)?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddEventWaitNode(
        node: *mut *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        n: usize,
        event: *mut c_void
    ) {
        let c = client()?;
        let op = event_op(c, event, false)?;
        add_node(c, node, graph, deps, n, op)
    }

    fn cuGraphAddDependencies(graph: *mut c_void, from: *const *mut c_void, to: *const *mut c_void, n: usize) {
        add_dependencies(graph, from, to, n)
    }

    fn cuGraphAddDependencies_v2(
        graph: *mut c_void,
        from: *const *mut c_void,
        to: *const *mut c_void,
        data: *const CUgraphEdgeData,
        n: usize
    ) {
        edges_taken(data, n)?;
        add_dependencies(graph, from, to, n)
    }
}
