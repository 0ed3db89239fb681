//! Stream capture and graph launch (see `crate::graph`): captures, graphs,
//! their nodes and instantiations live in the state; a graph of launches
//! alone goes to the server whole, any other replays op by op.

use std::ffi::{c_char, c_void};
use std::sync::Arc;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::{Call, Handle, ReplyBody, DEFAULT_STREAM};

use super::copy::{send_dtoh, send_htod, Pinned};
use super::graph_allocs;
use super::*;
use crate::graph::{retarget, Conditional, GraphOp, Recording};
use crate::state::handles::{self, to_program};
use crate::state::{client, Client, ConditionalHandle, State, StateGuard};

fn begin(s: *mut c_void) -> CuResult<()> {
    let c = client()?;
    let stream = handles::stream(s)?;
    let mut st = c.lock();
    st.check_stream(stream)?;
    if stream == DEFAULT_STREAM {
        // The legacy default stream cannot be captured.
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    if st.capturing(stream) {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    st.capture.insert(stream, Vec::new());
    Ok(())
}

/// Registers a graph and mints one node handle per recorded op.
pub(super) fn add_graph(c: &Client, st: &mut State, ops: Vec<GraphOp>) -> usize {
    let h = c.mint();
    add_graph_as(c, st, h, ops);
    h
}

/// Registers graph `h` (a handle minted already) with `ops`.
fn add_graph_as(c: &Client, st: &mut State, h: usize, ops: Vec<GraphOp>) {
    let nodes: Vec<usize> = (0..ops.len()).map(|_| c.mint()).collect();
    for (i, n) in nodes.iter().enumerate() {
        st.nodes.insert(*n, (h, i));
    }
    st.graph_nodes.insert(h, nodes);
    graph_allocs::hold(st, &ops);
    st.graphs.insert(h, Arc::new(ops));
}

/// Appends `ops` to graph `g` in order, each a node of its own.
fn append_ops(c: &Client, st: &mut State, g: usize, ops: Vec<GraphOp>) -> CuResult<()> {
    graph_allocs::hold(st, &ops);
    let graph = Arc::make_mut(st.graphs.get_mut(&g).ok_or(CUDA_ERROR_INVALID_VALUE)?);
    let first = graph.len();
    let count = ops.len();
    graph.extend(ops);
    for index in first..first + count {
        let node = c.mint();
        st.nodes.insert(node, (g, index));
        st.graph_nodes.entry(g).or_default().push(node);
    }
    Ok(())
}

/// The graph of `stream`'s capture, made now if the program had not asked
/// for it before: an empty graph until the capture ends.
pub(super) fn capture_graph(c: &Client, st: &mut State, stream: Handle) -> CuResult<usize> {
    let origin = st.capture_origin(stream).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    if let Some(&g) = st.capture_graph.get(&origin) {
        return Ok(g);
    }
    let g = add_graph(c, st, Vec::new());
    st.capture_graph.insert(origin, g);
    Ok(g)
}

fn remove_graph(c: &Client, graph: usize) -> CuResult<()> {
    let mut st = c.lock();
    let ops = st.graphs.remove(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    st.graph_edges.remove(&graph);
    st.graph_origins.remove(&graph);
    for n in st.graph_nodes.remove(&graph).unwrap_or_default() {
        st.nodes.remove(&n);
        st.kernel_node_args.remove(&n);
    }
    let back = graph_allocs::release(&mut st, &ops);
    drop(st);
    give_back(c, back)
}

/// Frees graphs' memory that no graph holds any more.
fn give_back(c: &Client, ptrs: Vec<u64>) -> CuResult<()> {
    for ptr in ptrs {
        super::memory::free(c, ptr)?;
    }
    Ok(())
}

/// The node handles of a graph.
fn graph_nodes(c: &Client, graph: *mut c_void) -> CuResult<Vec<usize>> {
    c.lock()
        .graph_nodes
        .get(&handle(graph))
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Writes `list` into a caller's array the way the driver's graph queries
/// do: with `array` null, only the count; else up to `*count` entries (the
/// rest of a longer array nulled) and the number written.
fn list_out(list: &[usize], array: *mut *mut c_void, count: *mut usize) -> CuResult<()> {
    if array.is_null() {
        return out(count, list.len());
    }
    let room = *read_in(count)?;
    for i in 0..room {
        let value = list.get(i).map_or(std::ptr::null_mut(), |&n| to_ptr(n));
        out(array.wrapping_add(i), value)?;
    }
    out(count, room.min(list.len()))
}

/// A graph's edges (from, to): those its nodes were added with, else (a
/// captured graph) the chain of its recording, each op after the one before.
pub(super) fn edges_of(st: &State, graph: usize) -> CuResult<Vec<(usize, usize)>> {
    let nodes = st.graph_nodes.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(match st.graph_edges.get(&graph) {
        Some(edges) => edges.clone(),
        None => nodes.windows(2).map(|w| (w[0], w[1])).collect(),
    })
}

/// The nodes `node` depends on (`upstream`) or that depend on it.
fn neighbours(c: &Client, node: *mut c_void, upstream: bool) -> CuResult<Vec<usize>> {
    let st = c.lock();
    let node = handle(node);
    let &(graph, _) = st.nodes.get(&node).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let edges = edges_of(&st, graph)?;
    Ok(edges
        .into_iter()
        .filter_map(|(from, to)| match upstream {
            true => (to == node).then_some(from),
            false => (from == node).then_some(to),
        })
        .collect())
}

/// `CUgraphNodeType` of a recorded op.
pub(super) fn node_type(op: &GraphOp) -> u32 {
    match op {
        GraphOp::Call(cumux_protocol::Call::Launch { .. }) => 0,
        GraphOp::HtoD { .. } | GraphOp::DtoH { .. } | GraphOp::Copy3D(_) => 1,
        GraphOp::Call(cumux_protocol::Call::MemcpyDtoD { .. }) => 1,
        GraphOp::Call(cumux_protocol::Call::Memset { .. }) => 2,
        GraphOp::HostFn(_) => 3,
        GraphOp::Child(_) => 4,
        GraphOp::Empty => 5,
        GraphOp::Call(cumux_protocol::Call::StreamWaitEvent { .. }) => 6,
        GraphOp::Call(cumux_protocol::Call::EventRecord { .. }) => 7,
        GraphOp::MemAlloc { .. } => 10,
        GraphOp::MemFree { .. } => 11,
        GraphOp::Conditional(_) => 13,
        GraphOp::Call(_) => 5,
    }
}

/// The op a node stands for.
pub(super) fn node_op(st: &State, node: *mut c_void) -> CuResult<&GraphOp> {
    let &(graph, index) = st
        .nodes
        .get(&handle(node))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let recording = st.graphs.get(&graph).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    recording.get(index).ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// What `cuGraphKernelNodeGetParams` reports of a recorded launch: the
/// function, its shape, and `kernelParams` pointing at argument copies that
/// live as long as the graph (`extra` is null).
struct KernelNode {
    function: Handle,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    kernel_params: *mut *mut c_void,
}

fn kernel_node(c: &Client, node: *mut c_void) -> CuResult<KernelNode> {
    let mut st = c.lock();
    let launch = crate::graph::as_launch(node_op(&st, node)?).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let layout = st
        .functions
        .get(&launch.function)
        .map(|f| f.params.clone())
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let args = st
        .kernel_node_args
        .entry(handle(node))
        .or_insert_with(|| (launch.params, Vec::new()));
    let base = args.0.as_ptr() as usize;
    args.1 = layout.iter().map(|pi| base + pi.offset as usize).collect();
    let kernel_params = if args.1.is_empty() {
        std::ptr::null_mut()
    } else {
        args.1.as_mut_ptr().cast()
    };
    Ok(KernelNode {
        function: launch.function,
        grid: launch.grid,
        block: launch.block,
        shared: launch.shared_bytes,
        kernel_params,
    })
}

/// A `CUDA_KERNEL_NODE_PARAMS` of either version from a `KernelNode`, with
/// the fields the newer one adds.
macro_rules! kernel_node_params {
    ($params:ident, $k:expr $(, $field:ident: $value:expr)*) => {
        $params {
            func: to_program($k.function),
            gridDimX: $k.grid[0],
            gridDimY: $k.grid[1],
            gridDimZ: $k.grid[2],
            blockDimX: $k.block[0],
            blockDimY: $k.block[1],
            blockDimZ: $k.block[2],
            sharedMemBytes: $k.shared,
            kernelParams: $k.kernel_params,
            extra: std::ptr::null_mut(),
            $($field: $value,)*
        }
    };
}

/// `CUgraphEdgeData` of a default edge.
const DEFAULT_EDGE: CUgraphEdgeData = CUgraphEdgeData {
    from_port: 0,
    to_port: 0,
    type_: 0,
    reserved: [0; 5],
};

/// A graph's edges into the caller's arrays (edge data, when asked, all
/// zero: the default edge type).
fn edges_out(
    graph: *mut c_void,
    from: *mut *mut c_void,
    to: *mut *mut c_void,
    data: *mut CUgraphEdgeData,
    count: *mut usize,
) -> CuResult<()> {
    let list = edges_of(&client()?.lock(), handle(graph))?;
    let edges = list.len();
    if from.is_null() || to.is_null() {
        return out(count, edges);
    }
    let room = *read_in(count)?;
    for i in 0..room {
        let (f, t) = match list.get(i) {
            Some(&(f, t)) => (to_ptr(f), to_ptr(t)),
            None => (std::ptr::null_mut(), std::ptr::null_mut()),
        };
        out(from.wrapping_add(i), f)?;
        out(to.wrapping_add(i), t)?;
        if !data.is_null() {
            out(data.wrapping_add(i), DEFAULT_EDGE)?;
        }
    }
    out(count, room.min(edges))
}

/// Default `CUgraphEdgeData` for each edge slot the caller
/// gave room for (`*count` entries).
fn zero_edge_data(data: *mut CUgraphEdgeData, count: *mut usize) -> CuResult<()> {
    if data.is_null() || count.is_null() {
        return Ok(());
    }
    for i in 0..*read_in(count)? {
        out(data.wrapping_add(i), DEFAULT_EDGE)?;
    }
    Ok(())
}

fn instantiate(exec: *mut *mut c_void, graph: *mut c_void) -> CuResult<()> {
    let c = client()?;
    let recording = c
        .lock()
        .graphs
        .get(&handle(graph))
        .cloned()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let h = c.mint();
    let server_graph = server_graph_of(c, h, &recording);
    let mut st = c.lock();
    if let Some(server_graph) = server_graph {
        st.server_graphs.insert(h, server_graph);
    }
    graph_allocs::hold(&mut st, &recording);
    st.graph_execs.insert(h, recording);
    st.exec_graphs.insert(h, handle(graph));
    drop(st);
    out(exec, to_ptr(h))
}

/// The server's graph for exec `h`'s recording, when it is launches alone:
/// kept by the server as one graph (a CUDA graph on a GPU) and launched by
/// one call. `None` (replay op by op) for any other, or a server that cannot.
fn server_graph_of(c: &Client, h: usize, recording: &Recording) -> Option<Handle> {
    let launches = crate::graph::launches_only(recording).filter(|_| server_graphs())?;
    match c.call(Call::GraphCreate { launches }) {
        Ok(ReplyBody::Handle(graph)) => Some(graph),
        other => {
            tracing::debug!("graph {h:#x} replays launch by launch: {other:?}");
            None
        }
    }
}

/// Exec `h` runs `recording` from now on: its server graph, if it had one, is
/// made again from it (the driver's updates take effect at the next launch).
pub(super) fn reset_exec(c: &Client, h: usize, recording: Recording) -> CuResult<()> {
    let old = {
        let mut st = c.lock();
        if !st.graph_execs.contains_key(&h) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        st.graph_execs.insert(h, Arc::clone(&recording));
        st.server_graphs.remove(&h)
    };
    let Some(old) = old else {
        return Ok(());
    };
    c.call(Call::GraphDestroy { graph: old })?;
    if let Some(graph) = server_graph_of(c, h, &recording) {
        c.lock().server_graphs.insert(h, graph);
    }
    Ok(())
}

/// Whether graphs of launches go to the server whole (unless `CUMUX_GRAPHS=replay`).
fn server_graphs() -> bool {
    static WHOLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WHOLE.get_or_init(|| std::env::var("CUMUX_GRAPHS").map_or(true, |v| v.trim() != "replay"))
}

/// Replays a recording into `stream` op by op (`st` from the launch, with
/// `push` the managed memory to send first). Into a stream being captured,
/// every op is recorded instead.
pub(super) fn replay(
    c: &'static Client,
    mut st: StateGuard<'static>,
    push: Vec<(u64, u64)>,
    recording: &Recording,
    stream: Handle,
) -> CuResult<()> {
    if st.capturing(stream) {
        for op in recording.iter() {
            let op = match op {
                GraphOp::Call(call) => GraphOp::Call(retarget(call, stream)),
                op => op.clone(),
            };
            st.capture(stream, op);
        }
        drop(st);
        return crate::managed::push(c, push, None);
    }
    // Copies need a context, and go through pinned buffers where they can.
    let copies = recording
        .iter()
        .any(|op| matches!(op, GraphOp::HtoD { .. } | GraphOp::DtoH { .. }));
    let pinned: Vec<Pinned> = if copies {
        st.context_device()?;
        recording
            .iter()
            .map(|op| match op {
                GraphOp::HtoD { src, len, .. } => st.pinned_span(*src, *len),
                GraphOp::DtoH { dst, len, .. } => st.pinned_span(*dst, *len),
                _ => None,
            })
            .collect()
    } else {
        Vec::new()
    };
    drop(st);
    crate::managed::push(c, push, Some(stream))?;
    let queue = Some(stream);
    for (i, op) in recording.iter().enumerate() {
        let pinned = pinned.get(i).copied().flatten();
        match op {
            GraphOp::Call(call) => crate::marks::send_marked(c, retarget(call, stream))?,
            GraphOp::HtoD { dst, src, len } => {
                let bytes = host_bytes(*src as *const c_void, *len)?;
                if !bytes.is_empty() {
                    send_htod(c, *dst, bytes, pinned, queue)?;
                }
            }
            GraphOp::DtoH { dst, src, len } => {
                let bytes = host_bytes_mut(*dst as *mut c_void, *len)?;
                send_dtoh(c, bytes, *src, pinned, queue)?;
            }
            GraphOp::HostFn(f) => {
                let f = Arc::clone(f);
                crate::host_fn::enqueue(c, stream, Box::new(move |status| f(status)))?
            }
            GraphOp::Empty | GraphOp::MemAlloc { .. } => {}
            GraphOp::Copy3D(p) => super::copy::copy_3d(c, &p.0, Some(stream))?,
            GraphOp::MemFree { ptr } => free_at_replay(c, *ptr, stream)?,
            GraphOp::Child(child) => replay(c, c.lock(), Vec::new(), child, stream)?,
            GraphOp::Conditional(cond) => run_conditional(c, cond, stream)?,
        }
    }
    Ok(())
}

/// A conditional node where it stands: its word read in stream order (each
/// read waits for the stream's work before it, so such graphs run op by op
/// from the client), the chosen body replayed, again for a while node.
fn run_conditional(c: &'static Client, cond: &Conditional, stream: Handle) -> CuResult<()> {
    loop {
        let value = crate::conditions::read(c, cond.cell, stream)?;
        let Some(i) = crate::conditions::chosen(cond, value) else {
            return Ok(());
        };
        let body = c.lock().graphs.get(&cond.bodies[i]).cloned();
        let body = body.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        replay(c, c.lock(), Vec::new(), &body, stream)?;
        if !crate::conditions::repeats(cond) {
            return Ok(());
        }
    }
}

/// A free node at a launch: a graph's memory stays held (see
/// `graph_allocs`); other memory is freed once the stream's work before it is done.
fn free_at_replay(c: &Client, ptr: u64, stream: Handle) -> CuResult<()> {
    if c.lock().graph_allocs.contains_key(&ptr) {
        return Ok(());
    }
    c.call(Call::StreamSynchronize { stream })?;
    super::memory::free(c, ptr)
}

driver_fn! {
    fn cuStreamBeginCapture | cuStreamBeginCapture_ptsz (s: *mut c_void) {
        begin(s)
    }

    fn cuStreamBeginCapture_v2 | cuStreamBeginCapture_v2_ptsz (s: *mut c_void, _mode: u32) {
        begin(s)
    }

    fn cuStreamEndCapture | cuStreamEndCapture_ptsz (s: *mut c_void, graph: *mut *mut c_void) {
        let c = client()?;
        let stream = handles::stream(s)?;
        let mut st = c.lock();
        st.check_stream(stream)?;
        if !st.capture.contains_key(&stream) && st.capturing(stream) {
            // A stream that joined a capture does not end it.
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
        }
        let ops = st.end_capture(stream).ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
        let into = st.capture_into.remove(&stream);
        let h = match st.capture_graph.remove(&stream) {
            Some(g) if into => {
                append_ops(c, &mut st, g, ops)?;
                g
            }
            // The graph the program was given while capturing: its nodes so
            // far were recorded in the capture, and it is made whole now.
            Some(g) => {
                st.graphs.remove(&g);
                for n in st.graph_nodes.remove(&g).unwrap_or_default() {
                    st.nodes.remove(&n);
                }
                add_graph_as(c, &mut st, g, ops);
                g
            }
            None => add_graph(c, &mut st, ops),
        };
        drop(st);
        out_opt(graph, to_ptr(h));
        Ok(())
    }

    fn cuStreamBeginCaptureToGraph | cuStreamBeginCaptureToGraph_ptsz (
        s: *mut c_void,
        graph: *mut c_void,
        deps: *const *mut c_void,
        edges: *const CUgraphEdgeData,
        n: usize,
        _mode: u32
    ) {
        let c = client()?;
        let g = handle(graph);
        // The graph's nodes so far come before whatever is captured; the
        // dependencies named are among them.
        {
            let st = c.lock();
            if !st.graphs.contains_key(&g) || st.capture_graph.values().any(|&o| o == g) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            let named = super::graph_nodes::node_list(deps, n)?;
            if named.iter().any(|d| st.nodes.get(d).map(|p| p.0) != Some(g)) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        super::graph_nodes::edges_taken(edges, n)?;
        begin(s)?;
        let stream = handles::stream(s)?;
        let mut st = c.lock();
        st.capture_graph.insert(stream, g);
        st.capture_into.insert(stream);
        Ok(())
    }

    fn cuGraphCreate(graph: *mut *mut c_void, flags: u32) {
        let c = client()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = add_graph(c, &mut c.lock(), Vec::new());
        out(graph, to_ptr(h))
    }

    fn cuGraphDestroy(graph: *mut c_void) {
        remove_graph(client()?, handle(graph))
    }

    fn cuGraphGetNodes(graph: *mut c_void, nodes: *mut *mut c_void, count: *mut usize) {
        list_out(&graph_nodes(client()?, graph)?, nodes, count)
    }

    fn cuGraphGetRootNodes(graph: *mut c_void, nodes: *mut *mut c_void, count: *mut usize) {
        let c = client()?;
        let all = graph_nodes(c, graph)?;
        let edges = edges_of(&c.lock(), handle(graph))?;
        let roots: Vec<usize> = all.into_iter().filter(|n| edges.iter().all(|e| e.1 != *n)).collect();
        list_out(&roots, nodes, count)
    }

    fn cuGraphGetEdges(graph: *mut c_void, from: *mut *mut c_void, to: *mut *mut c_void, count: *mut usize) {
        edges_out(graph, from, to, std::ptr::null_mut(), count)
    }

    fn cuGraphGetEdges_v2(
        graph: *mut c_void,
        from: *mut *mut c_void,
        to: *mut *mut c_void,
        data: *mut CUgraphEdgeData,
        count: *mut usize
    ) {
        edges_out(graph, from, to, data, count)
    }

    fn cuGraphNodeGetDependencies(node: *mut c_void, deps: *mut *mut c_void, count: *mut usize) {
        list_out(&neighbours(client()?, node, true)?, deps, count)
    }

    fn cuGraphNodeGetDependentNodes(node: *mut c_void, deps: *mut *mut c_void, count: *mut usize) {
        list_out(&neighbours(client()?, node, false)?, deps, count)
    }

    fn cuGraphNodeGetDependencies_v2(node: *mut c_void, deps: *mut *mut c_void, data: *mut CUgraphEdgeData, count: *mut usize) {
        let list = neighbours(client()?, node, true)?;
        zero_edge_data(data, count)?;
        list_out(&list, deps, count)
    }

    fn cuGraphNodeGetDependentNodes_v2(node: *mut c_void, deps: *mut *mut c_void, data: *mut CUgraphEdgeData, count: *mut usize) {
        let list = neighbours(client()?, node, false)?;
        zero_edge_data(data, count)?;
        list_out(&list, deps, count)
    }

    fn cuGraphNodeGetType(node: *mut c_void, kind: *mut CUgraphNodeType) {
        let t = node_type(node_op(&client()?.lock(), node)?);
        out(kind, t)
    }

    fn cuGraphKernelNodeGetParams(node: *mut c_void, params: *mut CUDA_KERNEL_NODE_PARAMS_v1) {
        non_null(params)?;
        let k = kernel_node(client()?, node)?;
        out(params, kernel_node_params!(CUDA_KERNEL_NODE_PARAMS_v1, k))
    }

    fn cuGraphKernelNodeGetParams_v2(node: *mut c_void, params: *mut CUDA_KERNEL_NODE_PARAMS_v2) {
        non_null(params)?;
        let k = kernel_node(client()?, node)?;
        // cumux's CUkernel and CUfunction handles are one and the same, and
        // the runtime maps this one back to its host stub.
        let context = to_ptr(crate::state::current_context().unwrap_or(0));
        out(params, kernel_node_params!(CUDA_KERNEL_NODE_PARAMS_v2, k, kern: to_program(k.function), ctx: context))
    }

    fn cuGraphInstantiateWithFlags(exec: *mut *mut c_void, graph: *mut c_void, _flags: u64) {
        instantiate(exec, graph)
    }

    fn cuGraphInstantiate | cuGraphInstantiate_v2 (
        exec: *mut *mut c_void,
        graph: *mut c_void,
        error_node: *mut *mut c_void,
        log: *mut c_char,
        log_size: usize
    ) {
        out_opt(error_node, std::ptr::null_mut());
        if !log.is_null() && log_size > 0 {
            out(log, 0)?;
        }
        instantiate(exec, graph)
    }

    fn cuGraphInstantiateWithParams | cuGraphInstantiateWithParams_ptsz (
        exec: *mut *mut c_void,
        graph: *mut c_void,
        params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS
    ) {
        instantiate(exec, graph)?;
        if !params.is_null() {
            let mut p = *read_in(params)?;
            p.hErrNode_out = std::ptr::null_mut();
            p.result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
            out(params, p)?;
        }
        Ok(())
    }

    fn cuGraphExecDestroy(exec: *mut c_void) {
        let c = client()?;
        let (graph, back) = {
            let mut st = c.lock();
            let ops = st.graph_execs.remove(&handle(exec)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            st.exec_graphs.remove(&handle(exec));
            st.disabled_nodes.retain(|&(e, _), _| e != handle(exec));
            (st.server_graphs.remove(&handle(exec)), graph_allocs::release(&mut st, &ops))
        };
        if let Some(graph) = graph {
            c.call(Call::GraphDestroy { graph })?;
        }
        give_back(c, back)
    }

    fn cuGraphUpload | cuGraphUpload_ptsz (exec: *mut c_void, s: *mut c_void) {
        let c = client()?;
        let stream = handles::stream(s)?;
        let st = c.lock();
        st.check_stream(stream)?;
        st.graph_execs.get(&handle(exec)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    fn cuGraphLaunch | cuGraphLaunch_ptsz (exec: *mut c_void, s: *mut c_void) {
        let c = client()?;
        let stream = handles::stream(s);
        let mut st = c.lock();
        let recording = st
            .graph_execs
            .get(&handle(exec))
            .cloned()
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let stream = stream?;
        st = c.ready_stream(st, stream)?;
        let graph = st.server_graphs.get(&handle(exec)).copied();
        let defaults: Vec<ConditionalHandle> = st
            .exec_graphs
            .get(&handle(exec))
            .and_then(|g| st.conditionals.get(g))
            .map_or_else(Vec::new, |h| h.iter().filter(|h| h.assign_default).copied().collect());
        let push = st.managed_to_push(Some(stream));
        match graph {
            Some(graph) => {
                drop(st);
                crate::managed::push(c, push, Some(stream))?;
                c.call(Call::GraphLaunch { graph, stream })?;
            }
            None => {
                drop(st);
                for h in &defaults {
                    crate::conditions::set(c, h.cell, h.default, Some(stream))?;
                }
                replay(c, c.lock(), push, &recording, stream)?;
            }
        }
        crate::managed_guard::after_work(stream);
        Ok(())
    }
}
