//! A session's graphs of launches: each launch checked once at the graph's
//! creation, the graph run as one piece of work (a device that keeps stream
//! order makes it one graph of its own).

use std::sync::atomic::Ordering;

use cumux_protocol::{codes, GraphLaunch, Handle, ReplyBody};

use super::core::{err, invalid_handle};
use super::{CallResult, Session};
use crate::device::StreamWork;

/// Graphs a session may hold, and launches a graph may have.
const MAX_GRAPHS: usize = 4096;
const MAX_GRAPH_LAUNCHES: usize = 1 << 16;

impl Session {
    /// Checks every launch now, as a launch is checked, and keeps them; a
    /// device that keeps stream order makes them one graph of its own.
    pub(super) fn graph_create(&mut self, launches: Vec<GraphLaunch>) -> CallResult {
        if launches.is_empty() || launches.len() > MAX_GRAPH_LAUNCHES {
            return Err(err(
                codes::INVALID_VALUE,
                format!("a graph of {} launches", launches.len()),
            ));
        }
        if self.graphs.len() >= MAX_GRAPHS {
            return Err(err(
                codes::OUT_OF_MEMORY,
                format!("a session may hold {MAX_GRAPHS} graphs"),
            ));
        }
        let checked = launches
            .into_iter()
            .map(|l| self.checked_launch(l))
            .collect::<Result<Vec<_>, _>>()?;
        let handle = self.mint_handle();
        let works = checked.iter().cloned().map(StreamWork::Launch).collect();
        self.ordered()?.graph_create(handle, works)?;
        self.graphs.insert(handle, checked);
        Ok(ReplyBody::Handle(handle))
    }

    pub(super) fn graph_launch(&mut self, graph: Handle, stream: Handle) -> CallResult {
        self.check_stream(stream)?;
        let launches = self
            .graphs
            .get(&graph)
            .ok_or_else(|| invalid_handle("graph", graph))?;
        let count = launches.len() as u64;
        self.core.stats.launches.fetch_add(count, Ordering::Relaxed);
        if let Some(hold) = &self.account {
            for _ in 0..count {
                hold.account().record_launch(0);
            }
        }
        // The scheduler sees the graph as one launch of a kernel of its own.
        self.launch_work(stream, StreamWork::Graph { graph })
    }

    pub(super) fn graph_destroy(&mut self, graph: Handle) -> CallResult {
        self.graphs
            .remove(&graph)
            .ok_or_else(|| invalid_handle("graph", graph))?;
        self.ordered()?.graph_destroy(graph);
        Ok(ReplyBody::Unit)
    }
}
