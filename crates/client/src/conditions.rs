//! The words behind graph conditional handles: set (at creation and at each
//! launch that assigns the default), read where a conditional node stands,
//! and which body a value chooses.

use cumux_cuda_bindings::consts::{
    CU_GRAPH_COND_TYPE_IF, CU_GRAPH_COND_TYPE_SWITCH, CU_GRAPH_COND_TYPE_WHILE,
};
use cumux_protocol::{Call, Handle, ReplyBody};

use crate::errors::*;
use crate::graph::Conditional;
use crate::state::Client;

/// Writes `value` to a handle's word, in `stream`'s order (`None`: now).
pub fn set(c: &Client, cell: u64, value: u32, stream: Option<Handle>) -> CuResult<()> {
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
pub fn read(c: &Client, cell: u64, stream: Handle) -> CuResult<u32> {
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

/// The body a conditional node runs for `value`, if any: an if node its
/// first (else its second, if it has one), a while node its only one while
/// the value is not 0, a switch node the one the value names.
pub fn chosen(cond: &Conditional, value: u32) -> Option<usize> {
    match cond.kind {
        CU_GRAPH_COND_TYPE_IF | CU_GRAPH_COND_TYPE_WHILE if value != 0 => Some(0),
        CU_GRAPH_COND_TYPE_IF if cond.bodies.len() == 2 => Some(1),
        CU_GRAPH_COND_TYPE_SWITCH => Some(value as usize).filter(|&i| i < cond.bodies.len()),
        _ => None,
    }
}

/// Whether a conditional node runs its body again while the value allows.
pub fn repeats(cond: &Conditional) -> bool {
    cond.kind == CU_GRAPH_COND_TYPE_WHILE
}
