//! A session's launches: each checked against its kernel and the device at
//! the call, then queued on its stream; graphs of launches, checked once and
//! run as one piece of work.

use std::sync::atomic::Ordering;

use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::{codes, CuError, GraphLaunch, Handle, ReplyBody};

use super::core::{err, invalid_handle};
use super::launch_checks::check_launch;
use super::{CallResult, Session};
use crate::device::{KernelLaunch, StreamWork};

/// Graphs a session may hold, and launches a graph may have.
const MAX_GRAPHS: usize = 4096;
const MAX_GRAPH_LAUNCHES: usize = 1 << 16;

impl Session {
    pub(super) fn launch(&mut self, stream: Handle, launch: GraphLaunch) -> CallResult {
        self.check_stream(stream)?;
        let checked = self.checked_launch(launch)?;
        hop_trace::mark(Hop::Step, "checked");
        self.submit_launch(stream, checked)
    }

    /// A launch checked against its kernel and the device's limits.
    pub(super) fn checked_launch(&self, launch: GraphLaunch) -> Result<KernelLaunch, CuError> {
        let f = self
            .functions
            .get(&launch.function)
            .ok_or_else(|| invalid_handle("function", launch.function))?;
        check_launch(&self.limits, f.module, f.index, &f.desc, launch)
    }

    /// Queues a checked launch on `stream`.
    pub(super) fn submit_launch(&mut self, stream: Handle, launch: KernelLaunch) -> CallResult {
        // The count is exact; the device time is measured only where the
        // server's own threads run the kernel (`launch_meter`).
        self.core.stats.launches.fetch_add(1, Ordering::Relaxed);
        if let Some(hold) = &self.account {
            hold.account().record_launch(0);
        }
        self.launch_work(stream, StreamWork::Launch(launch))
    }

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
