//! Threads that run one context's streams: a bounded queue and a thread per
//! stream, cross-stream dependencies (legacy default stream, event waits) as
//! positions in other streams, and a tracker of how far each stream has run.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use cumux_protocol::{Handle, DEFAULT_STREAM};

use crate::device::ordering::NON_BLOCKING;
use crate::locking::{lock, wait, wait_timeout};

/// How often a wait for another session's stream asks whether to give up.
const STOP_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Jobs a stream may hold before the session (and so its client) waits: about
/// where NVIDIA's driver blocks a launch, as a session's launch window does on a
/// device in another process (`session::window`).
pub const QUEUE_BOUND: usize = 1024;

const WORKER_STACK_BYTES: usize = 16 << 20;

/// A point in a stream's history: done once the stream has finished job `seq`.
/// `seq == 0` is the stream's start and is always done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub stream: Handle,
    pub seq: u64,
}

/// One unit of stream-ordered work. It runs on the stream's worker thread.
pub type Work = Box<dyn FnOnce() + Send>;

struct Job {
    seq: u64,
    deps: Vec<Position>,
    work: Work,
}

/// How far every stream of a session has run; workers and waiters meet here.
#[derive(Default)]
pub struct Tracker {
    state: Mutex<TrackerState>,
    progress: Condvar,
}

#[derive(Default)]
struct TrackerState {
    completed: HashMap<Handle, u64>,
    /// Set at teardown: every wait returns at once.
    cancelled: bool,
}

impl TrackerState {
    fn done(&self, pos: Position) -> bool {
        self.cancelled || pos.seq <= self.completed.get(&pos.stream).copied().unwrap_or(0)
    }
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, TrackerState> {
        lock(&self.state)
    }

    pub fn is_done(&self, pos: Position) -> bool {
        self.lock().done(pos)
    }

    /// Blocks until every position is done (or the tracker is cancelled).
    pub fn wait(&self, positions: &[Position]) {
        let mut state = self.lock();
        while !positions.iter().all(|p| state.done(*p)) {
            state = wait(&self.progress, state);
        }
    }

    /// Blocks until every position is done, the tracker is cancelled, or
    /// `stop()` (asked every 50 ms) says to give up: a wait of one session's
    /// stream for another's.
    pub fn wait_unless(&self, positions: &[Position], stop: impl Fn() -> bool) {
        let mut state = self.lock();
        while !positions.iter().all(|p| state.done(*p)) && !stop() {
            state = wait_timeout(&self.progress, state, STOP_POLL);
        }
    }

    fn complete(&self, pos: Position) {
        let mut state = self.lock();
        let entry = state.completed.entry(pos.stream).or_insert(0);
        debug_assert_eq!(*entry + 1, pos.seq, "stream jobs complete in order");
        *entry = pos.seq;
        drop(state);
        self.progress.notify_all();
    }

    /// Releases every waiter for good; used when the session goes away.
    pub fn cancel(&self) {
        self.lock().cancelled = true;
        self.progress.notify_all();
    }
}

struct StreamQueue {
    sender: SyncSender<Job>,
    enqueued: u64,
    blocking: bool,
    worker: JoinHandle<()>,
}

/// The streams of one session, the default stream included.
pub struct Streams {
    tracker: Arc<Tracker>,
    queues: HashMap<Handle, StreamQueue>,
    /// Workers of destroyed streams, finishing what they hold.
    retired: Vec<JoinHandle<()>>,
    session: u64,
}

impl Streams {
    /// A session's streams, starting with its default stream.
    pub fn new(session: u64) -> std::io::Result<Self> {
        let mut streams = Streams {
            tracker: Arc::new(Tracker::default()),
            queues: HashMap::new(),
            retired: Vec::new(),
            session,
        };
        streams.create(DEFAULT_STREAM, 0)?;
        Ok(streams)
    }

    pub fn tracker(&self) -> &Arc<Tracker> {
        &self.tracker
    }

    pub fn contains(&self, stream: Handle) -> bool {
        self.queues.contains_key(&stream)
    }

    /// Starts a stream's worker. `flags` are `CUstream_flags`.
    pub fn create(&mut self, stream: Handle, flags: u32) -> std::io::Result<()> {
        assert!(
            !self.queues.contains_key(&stream),
            "stream handles are unique"
        );
        let (sender, receiver) = sync_channel::<Job>(QUEUE_BOUND);
        let tracker = Arc::clone(&self.tracker);
        let worker = std::thread::Builder::new()
            .name(format!("cumux-s{}-stream{}", self.session, stream))
            .stack_size(WORKER_STACK_BYTES)
            .spawn(move || run_worker(stream, receiver, &tracker))?;
        self.queues.insert(
            stream,
            StreamQueue {
                sender,
                enqueued: 0,
                blocking: stream == DEFAULT_STREAM || flags & NON_BLOCKING == 0,
                worker,
            },
        );
        Ok(())
    }

    /// Destroys a stream: work already queued still runs, as in CUDA.
    pub fn destroy(&mut self, stream: Handle) -> bool {
        if stream == DEFAULT_STREAM {
            return false;
        }
        match self.queues.remove(&stream) {
            Some(queue) => {
                drop(queue.sender);
                self.retired.push(queue.worker);
                true
            }
            None => false,
        }
    }

    /// Where the stream's last queued job stands (its start if none).
    pub fn tail(&self, stream: Handle) -> Option<Position> {
        self.queues.get(&stream).map(|q| Position {
            stream,
            seq: q.enqueued,
        })
    }

    /// Queues `work` on `stream` after `deps` and the legacy default-stream
    /// ordering: default-stream work waits for all blocking streams, and
    /// blocking-stream work waits for the default stream. Returns the job's
    /// position, or `None` when the stream does not exist.
    pub fn enqueue(
        &mut self,
        stream: Handle,
        mut deps: Vec<Position>,
        work: Work,
    ) -> Option<Position> {
        let blocking = self.queues.get(&stream)?.blocking;
        if blocking {
            if stream == DEFAULT_STREAM {
                deps.extend(
                    self.queues
                        .iter()
                        .filter(|(s, q)| **s != DEFAULT_STREAM && q.blocking && q.enqueued > 0)
                        .map(|(s, q)| Position {
                            stream: *s,
                            seq: q.enqueued,
                        }),
                );
            } else if let Some(tail) = self.tail(DEFAULT_STREAM) {
                deps.push(tail);
            }
        }
        deps.retain(|d| d.seq > 0 && d.stream != stream);
        let queue = self.queues.get_mut(&stream)?;
        queue.enqueued += 1;
        let pos = Position {
            stream,
            seq: queue.enqueued,
        };
        let job = Job {
            seq: pos.seq,
            deps,
            work,
        };
        if queue.sender.send(job).is_err() {
            // The worker is gone only if its thread died; nothing will run.
            tracing::error!(session = self.session, stream, "stream worker is gone");
        }
        Some(pos)
    }

    /// Whether work queued on `stream` now would run at once: the stream is
    /// idle and so is everything the legacy default stream orders it after.
    /// Explicit dependencies are the caller's to check.
    pub fn ready(&self, stream: Handle) -> bool {
        let Some(queue) = self.queues.get(&stream) else {
            return false;
        };
        if !self.is_idle(stream) {
            return false;
        }
        if !queue.blocking {
            return true;
        }
        if stream == DEFAULT_STREAM {
            self.queues
                .iter()
                .filter(|(_, q)| q.blocking)
                .all(|(s, _)| self.is_idle(*s))
        } else {
            self.is_idle(DEFAULT_STREAM)
        }
    }

    pub fn is_idle(&self, stream: Handle) -> bool {
        self.tail(stream).is_none_or(|t| self.tracker.is_done(t))
    }

    /// Waits until everything queued on `stream` so far has run. For the
    /// legacy default stream that includes every blocking stream's work, which
    /// default-stream work is ordered after.
    pub fn synchronize(&self, stream: Handle) {
        let tails: Vec<Position> = if stream == DEFAULT_STREAM {
            self.queues
                .iter()
                .filter(|(_, q)| q.blocking)
                .filter_map(|(s, _)| self.tail(*s))
                .collect()
        } else {
            self.tail(stream).into_iter().collect()
        };
        self.tracker.wait(&tails);
    }

    /// Waits until everything queued on every stream so far has run.
    pub fn synchronize_all(&self) {
        let tails: Vec<Position> = self.queues.keys().filter_map(|s| self.tail(*s)).collect();
        self.tracker.wait(&tails);
    }

    /// Stops every worker after the jobs it holds (which should skip their work
    /// once the session is closing) and waits for them.
    pub fn shutdown(&mut self) {
        self.tracker.cancel();
        let workers: Vec<JoinHandle<()>> = self
            .queues
            .drain()
            .map(|(_, q)| {
                drop(q.sender);
                q.worker
            })
            .chain(self.retired.drain(..))
            .collect();
        for worker in workers {
            if worker.join().is_err() {
                tracing::error!(session = self.session, "a stream worker panicked");
            }
        }
    }
}

fn run_worker(stream: Handle, jobs: Receiver<Job>, tracker: &Tracker) {
    for job in jobs {
        tracker.wait(&job.deps);
        if catch_unwind(AssertUnwindSafe(job.work)).is_err() {
            tracing::error!(stream, "stream job panicked; the stream goes on");
        }
        tracker.complete(Position {
            stream,
            seq: job.seq,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    type Log = Arc<Mutex<Vec<u32>>>;

    /// Streams with `created` (handle, flags) made, and an empty log.
    fn streams_with(created: &[(Handle, u32)]) -> (Streams, Log) {
        let mut s = Streams::new(1).unwrap();
        for &(stream, flags) in created {
            s.create(stream, flags).unwrap();
        }
        (s, Arc::new(Mutex::new(Vec::new())))
    }

    fn push(log: &Log, v: u32, sleep_ms: u64) -> Work {
        let log = Arc::clone(log);
        Box::new(move || {
            std::thread::sleep(Duration::from_millis(sleep_ms));
            log.lock().unwrap().push(v);
        })
    }

    #[test]
    fn one_stream_runs_in_order() {
        let (mut s, log) = streams_with(&[]);
        for i in 0..50 {
            s.enqueue(DEFAULT_STREAM, vec![], push(&log, i, (i % 3) as u64))
                .unwrap();
        }
        s.synchronize(DEFAULT_STREAM);
        assert_eq!(*log.lock().unwrap(), (0..50).collect::<Vec<_>>());
        s.shutdown();
    }

    #[test]
    fn default_stream_orders_against_blocking_streams_only() {
        let (mut s, log) = streams_with(&[(5, 0), (6, NON_BLOCKING)]);
        s.enqueue(5, vec![], push(&log, 1, 40)).unwrap();
        s.enqueue(6, vec![], push(&log, 9, 80)).unwrap();
        s.enqueue(DEFAULT_STREAM, vec![], push(&log, 2, 0)).unwrap();
        s.enqueue(5, vec![], push(&log, 3, 0)).unwrap();
        s.synchronize_all();
        // 1 before 2 (default waits for blocking 5), 2 before 3 (5 waits for default);
        // the non-blocking stream's slow job comes last.
        assert_eq!(*log.lock().unwrap(), vec![1, 2, 3, 9]);
        s.shutdown();
    }

    #[test]
    fn explicit_dependencies_order_across_streams() {
        let (mut s, log) = streams_with(&[(7, NON_BLOCKING), (8, NON_BLOCKING)]);
        let first = s.enqueue(7, vec![], push(&log, 1, 50)).unwrap();
        s.enqueue(8, vec![first], push(&log, 2, 0)).unwrap();
        s.synchronize(8);
        assert_eq!(*log.lock().unwrap(), vec![1, 2]);
        assert!(s.is_idle(7));
        s.shutdown();
    }

    #[test]
    fn ready_follows_the_legacy_default_stream() {
        let (mut s, log) = streams_with(&[(5, 0), (6, NON_BLOCKING)]);
        assert!(s.ready(DEFAULT_STREAM) && s.ready(5) && s.ready(6));
        s.enqueue(5, vec![], push(&log, 1, 100)).unwrap();
        assert!(!s.ready(DEFAULT_STREAM), "default waits for blocking 5");
        assert!(!s.ready(5));
        assert!(s.ready(6), "non-blocking 6 waits for nobody");
        assert!(!s.ready(99));
        s.synchronize_all();
        assert!(s.ready(DEFAULT_STREAM));
        s.shutdown();
    }

    #[test]
    fn destroyed_streams_finish_their_work() {
        let (mut s, log) = streams_with(&[(3, 0)]);
        s.enqueue(3, vec![], push(&log, 1, 20)).unwrap();
        assert!(s.destroy(3));
        assert!(!s.destroy(3));
        assert!(!s.destroy(DEFAULT_STREAM));
        assert!(s.enqueue(3, vec![], push(&log, 2, 0)).is_none());
        s.shutdown();
        assert_eq!(*log.lock().unwrap(), vec![1]);
    }

    #[test]
    fn a_panicking_job_does_not_stop_the_stream() {
        let (mut s, log) = streams_with(&[]);
        s.enqueue(DEFAULT_STREAM, vec![], Box::new(|| panic!("job panics")))
            .unwrap();
        s.enqueue(DEFAULT_STREAM, vec![], push(&log, 4, 0)).unwrap();
        s.synchronize(DEFAULT_STREAM);
        assert_eq!(*log.lock().unwrap(), vec![4]);
        s.shutdown();
    }
}
