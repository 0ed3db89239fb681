//! Who holds the memory of graphs' allocation nodes: each graph and each
//! instantiation whose recording has the node; the memory goes back to the
//! device once none holds it and it was freed (by the program or a free node).

use crate::graph::GraphOp;
use crate::state::{GraphAlloc, State};

/// Addresses of the allocation nodes (`alloc`) or free nodes of `ops`.
fn addresses(ops: &[GraphOp], alloc: bool) -> impl Iterator<Item = u64> + '_ {
    ops.iter().filter_map(move |op| match (op, alloc) {
        (GraphOp::MemAlloc { ptr, .. }, true) | (GraphOp::MemFree { ptr }, false) => Some(*ptr),
        _ => None,
    })
}

/// A new allocation of a graph's node, held by nobody yet.
pub(super) fn register(st: &mut State, ptr: u64, bytes: u64) {
    let alloc = GraphAlloc {
        bytes,
        holders: 0,
        freed: false,
    };
    st.graph_allocs.insert(ptr, alloc);
}

/// One more holder (a graph or an instantiation) of `ops`' allocations; a
/// free node among them frees its memory as far as the program is concerned.
pub(super) fn hold(st: &mut State, ops: &[GraphOp]) {
    for ptr in addresses(ops, true) {
        if let Some(a) = st.graph_allocs.get_mut(&ptr) {
            a.holders += 1;
        }
    }
    for ptr in addresses(ops, false) {
        if let Some(a) = st.graph_allocs.get_mut(&ptr) {
            a.freed = true;
        }
    }
}

/// One holder of `ops`' allocations fewer: the addresses to give back now.
pub(super) fn release(st: &mut State, ops: &[GraphOp]) -> Vec<u64> {
    let mut back = Vec::new();
    for ptr in addresses(ops, true) {
        if let Some(a) = st.graph_allocs.get_mut(&ptr) {
            a.holders = a.holders.saturating_sub(1);
            if a.holders == 0 && a.freed {
                st.graph_allocs.remove(&ptr);
                back.push(ptr);
            }
        }
    }
    back
}

/// The program frees `ptr`: `true` if it is a graph's memory that a graph
/// still holds (kept, and given back when the last holder goes), `false` if
/// the caller frees it now.
pub(super) fn program_frees(st: &mut State, ptr: u64) -> bool {
    match st.graph_allocs.get_mut(&ptr) {
        Some(a) if a.holders > 0 => {
            a.freed = true;
            true
        }
        Some(_) => {
            st.graph_allocs.remove(&ptr);
            false
        }
        None => false,
    }
}

/// Bytes of graphs' memory the program has (`cuDeviceGetGraphMemAttribute`).
pub(super) fn bytes_held(st: &State) -> u64 {
    st.graph_allocs.values().map(|a| a.bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(ptr: u64, with_free: bool) -> Vec<GraphOp> {
        let mut v = vec![GraphOp::MemAlloc { ptr, bytes: 64 }, GraphOp::Empty];
        if with_free {
            v.push(GraphOp::MemFree { ptr });
        }
        v
    }

    #[test]
    fn memory_goes_back_when_freed_and_no_longer_held() {
        let mut st = State::default();
        register(&mut st, 0x1000, 64);
        let graph = ops(0x1000, false);
        hold(&mut st, &graph); // the graph
        hold(&mut st, &graph); // an instantiation
        assert!(release(&mut st, &graph).is_empty(), "not freed yet");
        assert!(program_frees(&mut st, 0x1000), "held: kept");
        assert_eq!(bytes_held(&st), 64);
        assert_eq!(release(&mut st, &graph), [0x1000]);
        assert!(st.graph_allocs.is_empty());
    }

    #[test]
    fn a_free_node_frees_for_the_program() {
        let mut st = State::default();
        register(&mut st, 0x2000, 64);
        let graph = ops(0x2000, true);
        hold(&mut st, &graph);
        assert_eq!(release(&mut st, &graph), [0x2000]);
        assert!(!program_frees(&mut st, 0x3000), "not a graph's memory");
    }
}
