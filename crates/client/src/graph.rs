//! CUDA graphs by stream capture, recorded on the client: while a stream is
//! captured, the stream-ordered work sent to it is recorded instead of sent.
//! A graph of kernel launches alone goes to the server whole at instantiation
//! and each launch of it is one call; any other is replayed into a stream
//! call by call (host memory of copies is read and written at replay, as graph
//! memcpy nodes do). A graph built node by node (`exports::graph_nodes`) is
//! recorded the same way, its nodes in the order they were added.

use std::sync::Arc;

use cumux_protocol::{Call, GraphLaunch, Handle};

use crate::errors::*;

/// One recorded piece of stream-ordered work.
#[derive(Clone)]
pub enum GraphOp {
    /// A protocol call; its stream is replaced by the replay stream.
    Call(Call),
    HtoD {
        dst: u64,
        src: usize,
        len: usize,
    },
    DtoH {
        dst: usize,
        src: u64,
        len: usize,
    },
    HostFn(Arc<dyn Fn(CUresult) + Send + Sync>),
    /// A node that only orders others (`cuGraphAddEmptyNode`).
    Empty,
    /// A child graph's ops, run in their order where the node stands
    /// (`cuGraphAddChildGraphNode`; the child is copied when added).
    Child(Recording),
    /// A memory allocation node: the memory was allocated when the node was
    /// made (its address is fixed for the graph's life) and stays while the
    /// graph or an instantiation of it holds it (`exports::graph_allocs`).
    MemAlloc {
        ptr: u64,
        bytes: u64,
    },
    /// A memcpy node of more than one contiguous row (pitched 2-D and 3-D
    /// boxes, arrays), made at each launch as `cuMemcpy3DAsync` makes it.
    Copy3D(Copy3D),
    /// A memory free node: nothing at a launch for memory a graph allocated
    /// (held until no graph holds it); memory allocated outside graphs is
    /// freed there.
    MemFree {
        ptr: u64,
    },
    /// A conditional node (`CU_GRAPH_NODE_TYPE_CONDITIONAL`).
    Conditional(Arc<Conditional>),
}

/// A conditional node: its handle is a device word that kernels set
/// (`cudaGraphSetConditional`, `crate::conditional`), read where the node
/// stands at each launch to run a body graph once (if), again and again
/// (while) or the one it names (switch).
#[derive(Debug)]
pub struct Conditional {
    /// The handle: the device address of the condition's word.
    pub cell: u64,
    /// `CU_GRAPH_COND_TYPE_IF`, `_WHILE` or `_SWITCH`.
    pub kind: u32,
    /// The program's handles of its body graphs, filled after the node is made.
    pub bodies: Vec<usize>,
}

pub type Recording = Arc<Vec<GraphOp>>;

/// A memcpy node's parameters as the program gave them.
#[derive(Clone, Copy)]
pub struct Copy3D(pub cumux_cuda_bindings::types::CUDA_MEMCPY3D);
// SAFETY: the host addresses inside are the program's, kept as numbers and
// read or written only at a launch, through the checked host-memory helpers,
// as the driver does with a memcpy node's host memory.
unsafe impl Send for Copy3D {}
// SAFETY: as above; never written through a shared reference.
unsafe impl Sync for Copy3D {}

/// The stream a stream-ordered call is for (`None` for other calls).
pub fn stream_of_call(call: &Call) -> Option<Handle> {
    match call {
        Call::Launch { stream, .. }
        | Call::EventRecord { stream, .. }
        | Call::StreamWaitEvent { stream, .. } => Some(*stream),
        Call::MemcpyDtoD { stream, .. } | Call::Memset { stream, .. } => *stream,
        _ => None,
    }
}

/// A recorded kernel launch, as one launch of a server-side graph; `None`
/// for any other op.
pub fn as_launch(op: &GraphOp) -> Option<GraphLaunch> {
    match op {
        GraphOp::Call(Call::Launch {
            function,
            grid,
            block,
            shared_bytes,
            params,
            attributes,
            ..
        }) => Some(GraphLaunch {
            function: *function,
            grid: *grid,
            block: *block,
            shared_bytes: *shared_bytes,
            params: params.clone(),
            attributes: attributes.clone(),
        }),
        _ => None,
    }
}

/// A recording of kernel launches alone, as the launches of one server-side
/// graph (`Call::GraphCreate`); `None` if it records anything else.
pub fn launches_only(recording: &[GraphOp]) -> Option<Vec<GraphLaunch>> {
    let mut launches = Vec::new();
    for op in recording {
        match op {
            GraphOp::Empty | GraphOp::MemAlloc { .. } => {}
            GraphOp::Child(child) => launches.extend(launches_only(child)?),
            GraphOp::Conditional(_) => return None,
            op => launches.push(as_launch(op)?),
        }
    }
    Some(launches)
}

/// A recorded call retargeted at `to`.
pub fn retarget(call: &Call, to: Handle) -> Call {
    let mut call = call.clone();
    match &mut call {
        Call::Launch { stream, .. }
        | Call::EventRecord { stream, .. }
        | Call::StreamWaitEvent { stream, .. } => *stream = to,
        Call::MemcpyDtoD { stream, .. } | Call::Memset { stream, .. } => *stream = Some(to),
        _ => {}
    }
    call
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_calls_move_to_the_replay_stream() {
        let launch = Call::Launch {
            function: 1,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
            stream: 5,
            params: vec![],
            attributes: Vec::new(),
        };
        assert_eq!(stream_of_call(&launch), Some(5));
        assert_eq!(stream_of_call(&retarget(&launch, 9)), Some(9));
        let memset = Call::Memset {
            dst: 0,
            value: 0,
            elem_bytes: 1,
            count: 1,
            pitch: 1,
            height: 1,
            stream: None,
        };
        assert_eq!(stream_of_call(&memset), None);
        assert_eq!(stream_of_call(&Call::ContextSynchronize), None);
    }
}
