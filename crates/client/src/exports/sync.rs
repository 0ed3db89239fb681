//! Waiting for the device: polling with the connection free
//! (`poll_until_ready`), and what a synchronising call does once the wait is
//! over (`AfterSync`): wait for host functions and pull managed memory.

use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use cumux_protocol::{Call, Handle, MAX_QUERY_WITHIN_US};

use crate::errors::*;
use crate::state::{Client, State};

/// Threads in this process (`None` if unknown): the link count of its
/// `/proc/PID/task` directory, two more than its threads, read with one
/// `fstat` of a directory kept open (0.5 µs, where reading `/proc/self/stat`
/// took 9.5 µs and sat on every synchronize of the H100 host's round trip).
/// A forked child opens its own.
fn process_threads() -> Option<usize> {
    static TASKS: Mutex<Option<(u32, std::fs::File)>> = Mutex::new(None);
    let pid = std::process::id();
    let mut tasks = TASKS.lock().unwrap_or_else(|p| p.into_inner());
    if tasks.as_ref().is_none_or(|(owner, _)| *owner != pid) {
        *tasks = std::fs::File::open(format!("/proc/{pid}/task"))
            .ok()
            .map(|dir| (pid, dir));
    }
    let links = tasks.as_ref()?.1.metadata().ok()?.nlink();
    (links as usize).checked_sub(2).filter(|n| *n > 0)
}

/// How long [`poll_until_ready`] polls without sleeping in between.
const POLL_AWAKE: std::time::Duration = std::time::Duration::from_micros(200);
/// The longest sleep between two polls: what a wait may overrun its work by
/// (it was 1 ms, a sixth of a GPT training step on the H200).
const POLL_SLEEP_MAX: std::time::Duration = std::time::Duration::from_micros(100);

/// Before a synchronising call: polls `query`, with the connection free
/// between polls, until it stops saying "not ready". The server answers a
/// connection's calls in order, so a blocking wait would hold up the
/// program's other threads, whose calls the wait may depend on (a kernel
/// waiting for a flag another thread copies in). The synchronising call that
/// follows then returns at once. A query that reports an error (a sticky
/// one, which it also clears) hands it back for the wait to return. A
/// process with a single thread has nobody to hold up: it waits blocking,
/// in one round trip. `Ok(true)`: a query said ready (a stream's then also
/// did what its synchronize would, on the server); `Ok(false)`: no poll.
pub(crate) fn poll_until_ready(
    c: &Client,
    device: u32,
    query: impl Fn() -> Call,
) -> CuResult<bool> {
    if process_threads() == Some(1) {
        return Ok(false);
    }
    let started = std::time::Instant::now();
    if c.link(device, "StreamQuery")?.on_socket() {
        return poll_within(c, device, query, started);
    }
    // Polls back to back at first (each a round trip of a few µs): a sleep
    // lasts 50 µs or more however short it is asked to be (timer slack).

    let mut pause = std::time::Duration::from_micros(20);
    loop {
        match c.call_on(device, query()) {
            Err(CUDA_ERROR_NOT_READY) if started.elapsed() < POLL_AWAKE => std::thread::yield_now(),
            Err(CUDA_ERROR_NOT_READY) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(POLL_SLEEP_MAX);
            }
            Err(e) => return Err(e),
            Ok(_) => return Ok(true),
        }
    }
}

/// [`poll_until_ready`] over a socket, where a round trip may cross a
/// network: each poll is a `QueryWithin` the server repeats for as long as
/// the wait has lasted so far (1 ms at first, at most
/// `MAX_QUERY_WITHIN_US`), so the wait overruns its work by about half a
/// round trip, not by up to a round trip per poll, and holds the
/// connection from the program's other threads for a bounded time.
fn poll_within(
    c: &Client,
    device: u32,
    query: impl Fn() -> Call,
    started: std::time::Instant,
) -> CuResult<bool> {
    loop {
        let waited = started
            .elapsed()
            .as_micros()
            .min(MAX_QUERY_WITHIN_US as u128) as u32;
        let call = Call::QueryWithin {
            query: Box::new(query()),
            within_us: waited.max(1_000),
        };
        match c.call_on(device, call) {
            Err(CUDA_ERROR_NOT_READY) => {}
            Err(e) => return Err(e),
            Ok(_) => return Ok(true),
        }
    }
}

/// Whether `stream` of `device` is known to have no work left (answered by
/// the link's record of calls and answers, `transport::quiet`): its
/// synchronize or query needs no round trip.
pub(crate) fn known_idle(c: &Client, device: u32, stream: Handle) -> bool {
    c.link(device, "StreamQuery")
        .is_ok_and(|link| link.stream_idle(stream))
}

/// Whether `event` is known to be reached (see [`known_idle`]).
pub(crate) fn known_reached(c: &Client, event: Handle) -> bool {
    c.link(cumux_protocol::device_of_handle(event), "EventQuery")
        .is_ok_and(|link| link.event_reached(event))
}

/// Whether a synchronize of `stream` (`None`: the context) of `device` was
/// settled (`transport::Link::settle`): answered here, the server waiting for
/// its copies in the calls' order. Never one that waits for host functions.
pub(crate) fn settled(
    c: &Client,
    device: u32,
    stream: Option<Handle>,
    after: &AfterSync,
) -> CuResult<bool> {
    if !matches!(after.host_fns, HostFns::None) {
        return Ok(false);
    }
    c.link(device, "StreamSynchronize")?.settle(stream)
}

/// Whether a synchronize of `streams` of `device` was answered by marks
/// stored behind their work (`marks::sync_streams`). Never one that waits
/// for host functions.
pub(crate) fn marked(
    c: &Client,
    device: u32,
    streams: &[Handle],
    after: &AfterSync,
) -> CuResult<bool> {
    if !matches!(after.host_fns, HostFns::None) {
        return Ok(false);
    }
    crate::marks::sync_streams(c, device, streams)
}

/// Which host functions a synchronising call waits for once the device is done.
enum HostFns {
    None,
    Stream(Handle),
    All,
}

/// What a synchronising call must do after its wait, noted under the state
/// lock before it: wait for host functions queued then, pull managed memory.
/// With neither (the common case) `finish` takes no lock.
pub(crate) struct AfterSync {
    host_fns: HostFns,
    managed: bool,
}

impl AfterSync {
    /// Nothing to do after the wait.
    pub(crate) fn none() -> AfterSync {
        AfterSync {
            host_fns: HostFns::None,
            managed: false,
        }
    }

    /// Waits for `host_fns` if `pending`, and pulls managed memory if there is any.
    fn noted(s: &State, host_fns: HostFns, pending: bool) -> AfterSync {
        AfterSync {
            host_fns: if pending { host_fns } else { HostFns::None },
            managed: !s.managed.is_empty(),
        }
    }

    /// After a stream's synchronisation: its host functions, managed memory.
    pub(crate) fn stream(s: &State, stream: Handle) -> AfterSync {
        Self::noted(s, HostFns::Stream(stream), s.host_fns_pending(stream))
    }

    /// After the context's synchronisation: every stream's host functions,
    /// managed memory.
    pub(crate) fn context(s: &State) -> AfterSync {
        Self::noted(s, HostFns::All, s.any_host_fns_pending())
    }

    /// After a synchronising wait that runs no host functions (an event, a
    /// synchronous copy): managed memory.
    pub(crate) fn managed(s: &State) -> AfterSync {
        Self::noted(s, HostFns::None, false)
    }

    pub(crate) fn finish(self, c: &Client) -> CuResult<()> {
        // The host may use managed memory again (before it is pulled in).
        crate::managed_guard::open_all();
        if matches!(self.host_fns, HostFns::None) && !self.managed {
            return Ok(());
        }
        let mut s = c.lock();
        loop {
            let waiting = match self.host_fns {
                HostFns::None => false,
                HostFns::Stream(stream) => s.host_fns_pending(stream),
                HostFns::All => s.any_host_fns_pending(),
            };
            if !waiting {
                break;
            }
            s = c.wait(s);
        }
        let stale = if self.managed {
            s.managed_to_pull()
        } else {
            Vec::new()
        };
        drop(s);
        crate::managed::pull(c, stale)
    }
}

#[cfg(test)]
mod tests {
    use super::process_threads;

    /// The count matches the task directory's entries (read on either side of
    /// it, so that other tests' threads coming and going cannot fool it), with
    /// a thread of ours alive and after it ended.
    #[test]
    fn threads_are_counted_as_they_come_and_go() {
        let entries = || std::fs::read_dir("/proc/self/task").unwrap().count();
        let agrees = || {
            (0..1000).any(|_| {
                let (a, n, b) = (entries(), process_threads(), entries());
                a == b && n == Some(a)
            })
        };
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let helper = std::thread::spawn(move || rx.recv().ok());
        assert!(agrees());
        tx.send(()).unwrap();
        helper.join().unwrap();
        assert!(agrees());
    }
}
