//! Where a lane's job and its waiter meet: the job's progress and answer,
//! waited for by a blocking thread ([`Pending::wait`]) or polled as a future
//! by an async task, so that an HTTP request needs no thread of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use cumux_server::device::spin::{answer_spin_time, WAIT_SPIN_CORES};

use crate::failure::Failure;

/// How long a waiter polls for an answer, and a batch tenant's lane for its
/// next job, before it sleeps: on hosts of 8 or more cores, as long as the
/// server polls for a worker's answer (1 ms, or `CUMUX_SPIN_US`); none on
/// smaller ones, whatever `CUMUX_SPIN_US` says. An invocation's path holds
/// three pollers (the HTTP task, the lane, the worker) beside the work: on
/// 2 cores with `CUMUX_SPIN_US=100` they took a hot `vadd` from 44 µs to 359
/// (`bench/results/2026-11-27-cpu-functions-overhead-*.txt`).
pub fn answer_poll() -> Duration {
    static POLL: OnceLock<Duration> = OnceLock::new();
    *POLL.get_or_init(|| match std::thread::available_parallelism() {
        Ok(n) if n.get() >= WAIT_SPIN_CORES => answer_spin_time(),
        _ => Duration::ZERO,
    })
}

/// At most one poller in this many cores: a lane polls for its next job
/// only while fewer lanes than that poll (see [`Poller`]).
const CORES_PER_POLLER: usize = 4;

/// Lanes polling for their next job now.
static POLLING: AtomicUsize = AtomicUsize::new(0);

/// A lane's place among the lanes polling for their next job, while it
/// polls: many busy lanes on a host would otherwise spin on every core.
pub struct Poller(());

impl Poller {
    /// A place, if fewer than a quarter of the host's cores' worth of lanes
    /// poll now (the cores counted once: the question reads cgroup files,
    /// about 59 µs on the development machine, and a lane asks after each
    /// job).
    pub fn take() -> Option<Poller> {
        static MOST: OnceLock<usize> = OnceLock::new();
        let most = *MOST.get_or_init(|| {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get() / CORES_PER_POLLER)
                .max(1)
        });
        match POLLING.fetch_add(1, Ordering::Relaxed) < most {
            true => Some(Poller(())),
            false => {
                POLLING.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        POLLING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What stops the lane's running work from another thread.
pub type Canceller = Box<dyn FnOnce() + Send>;

/// Where a job is, as its lane and its waiter see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    Queued,
    Running,
    Done,
    /// Its waiter gave up before it ran: it never will.
    Abandoned,
    /// The lane dropped it, run or not, without an answer.
    Lost,
}

struct State<T> {
    progress: Progress,
    answer: Option<Result<T, Failure>>,
    waker: Option<Waker>,
    /// Whether a waiter blocks on the condition variable ([`Pending::wait`]):
    /// only then is it notified (a futex wake-up, a system call each time),
    /// not for an HTTP request, which polls or is woken by its waker.
    blocked: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
    /// Whether the job is settled (done, abandoned or lost): what a waiter
    /// polling for it reads without the lock.
    settled: AtomicBool,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tells the waiter, blocked or polling, that the state moved.
    fn notify(&self, mut state: MutexGuard<'_, State<T>>) {
        let waker = state.waker.take();
        let blocked = state.blocked;
        self.settled.store(true, Ordering::Release);
        drop(state);
        if blocked {
            self.changed.notify_all();
        }
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The lane's side of a job: it starts the job, or finds it abandoned, and
/// gives its answer. Dropped without an answer (the lane stopped, or the job
/// panicked), it tells the waiter so.
pub struct Ticket<T> {
    shared: Arc<Shared<T>>,
    deadline: Instant,
    answered: bool,
}

/// The waiter's side of a job.
pub struct Pending<T> {
    shared: Arc<Shared<T>>,
    deadline: Instant,
    poisoned: Arc<AtomicBool>,
    cancel: Arc<Mutex<Option<Canceller>>>,
}

/// A job's two sides: the ticket goes with the job to the lane; `poisoned`
/// and `cancel` are the lane's, for a running job past its deadline.
pub fn pair<T>(
    deadline: Instant,
    poisoned: Arc<AtomicBool>,
    cancel: Arc<Mutex<Option<Canceller>>>,
) -> (Ticket<T>, Pending<T>) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            progress: Progress::Queued,
            answer: None,
            waker: None,
            blocked: false,
        }),
        changed: Condvar::new(),
        settled: AtomicBool::new(false),
    });
    let ticket = Ticket {
        shared: Arc::clone(&shared),
        deadline,
        answered: false,
    };
    let pending = Pending {
        shared,
        deadline,
        poisoned,
        cancel,
    };
    (ticket, pending)
}

impl<T> Ticket<T> {
    /// Whether the job may run: not if its waiter gave up or its deadline
    /// passed while it was queued (it is abandoned then).
    pub fn start(&mut self) -> bool {
        let mut state = self.shared.lock();
        if state.progress == Progress::Abandoned || Instant::now() >= self.deadline {
            state.progress = Progress::Abandoned;
            self.answered = true;
            self.shared.notify(state);
            return false;
        }
        state.progress = Progress::Running;
        true
    }

    /// The job's answer.
    pub fn answer(mut self, answer: Result<T, Failure>) {
        let mut state = self.shared.lock();
        state.progress = Progress::Done;
        state.answer = Some(answer);
        self.answered = true;
        self.shared.notify(state);
    }
}

impl<T> Drop for Ticket<T> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut state = self.shared.lock();
        if state.progress != Progress::Abandoned {
            state.progress = Progress::Lost;
        }
        self.shared.notify(state);
    }
}

impl<T> Pending<T> {
    /// When the job's waiter gives up on it.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The answer, if the job has one or will never have one.
    fn settled(state: &mut State<T>) -> Option<Result<T, Failure>> {
        match state.progress {
            Progress::Done => Some(state.answer.take().unwrap_or_else(|| {
                Err(Failure::Internal(
                    "the tenant's lane dropped the answer".into(),
                ))
            })),
            Progress::Abandoned => Some(Err(Failure::Deadline(
                "the deadline passed while queued".into(),
            ))),
            Progress::Lost => Some(Err(Failure::Internal(
                "the tenant's lane dropped the request".into(),
            ))),
            Progress::Queued | Progress::Running => None,
        }
    }

    /// The job's answer if it has come, without waiting (for a waiter that
    /// polls rather than sleep and be woken for an answer this near).
    pub fn ready(&self) -> Option<Result<T, Failure>> {
        match self.shared.settled.load(Ordering::Acquire) {
            true => Self::settled(&mut self.shared.lock()),
            false => None,
        }
    }

    /// Blocks until the job's answer, or until its deadline (then see
    /// [`Pending::expire`]).
    pub fn wait(self) -> Result<T, Failure> {
        {
            let mut state = self.shared.lock();
            loop {
                if let Some(answer) = Self::settled(&mut state) {
                    return answer;
                }
                let left = self.deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                // Under the lock, so the lane's next notify sees it.
                state.blocked = true;
                state = self
                    .shared
                    .changed
                    .wait_timeout(state, left)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
            }
        }
        self.expire()
    }

    /// The waiter's deadline passed: a job still queued never runs, and a
    /// running one has the lane's work cancelled (the session is rebuilt
    /// before the lane goes on); the answer is then a [`Failure::Deadline`].
    /// A job that finished meanwhile gives its answer.
    pub fn expire(&self) -> Result<T, Failure> {
        let mut state = self.shared.lock();
        if let Some(answer) = Self::settled(&mut state) {
            return answer;
        }
        if state.progress == Progress::Queued {
            state.progress = Progress::Abandoned;
            return Err(Failure::Deadline("the deadline passed while queued".into()));
        }
        // Running, under the job's lock: the lane cannot have moved on to another.
        self.poisoned.store(true, Ordering::SeqCst);
        let cancel = self
            .cancel
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(cancel) = cancel {
            cancel();
        }
        Err(Failure::Deadline(
            "the invocation ran past its deadline; its work was cancelled".into(),
        ))
    }
}

/// Polled, the answer once the job has one; the deadline is the poller's to
/// keep (with [`Pending::expire`] when it passes).
impl<T> Future for Pending<T> {
    type Output = Result<T, Failure>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.shared.lock();
        match Self::settled(&mut state) {
            Some(answer) => Poll::Ready(answer),
            None => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
