//! Unanswered calls on a socket, written together: a connection's batch of
//! encoded requests goes out with the next call that waits, once it is large
//! or old, or from the flusher thread once the program sends nothing more.
//!
//! Over a network each write is a system call, a TLS record and a packet
//! for the server to read; a program's launches come microseconds apart.
//! A batch is never older than its age plus the flusher's wake-up, so
//! unanswered work reaches the device about as soon as before. The flusher
//! keeps a due time per connection and never waits on one that is busy: it
//! tries it again later, so one connection's long wait holds up no other.

use std::io::{self, Write};
use std::sync::{Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use cumux_protocol as proto;

/// How long a batch may wait for more calls before it goes out.
pub const BATCH_AGE: Duration = Duration::from_micros(20);
/// A batch this large goes out at once.
pub const BATCH_BYTES: usize = 64 << 10;

/// Encoded requests not yet written, oldest first.
#[derive(Debug)]
pub struct Batch {
    bytes: Vec<u8>,
    since: Option<Instant>,
    age: Duration,
    /// Writes to the socket so far (the tests count them).
    writes: u64,
}

impl Batch {
    pub fn new(age: Duration) -> Self {
        Batch {
            bytes: Vec::new(),
            since: None,
            age,
            writes: 0,
        }
    }

    /// Adds one request (`msg`, with its byte buffer `bulk`, small); whether
    /// the batch was empty before it (its flush then needs arranging).
    pub fn push(&mut self, msg: &[u8], bulk: &[u8]) -> Result<bool, proto::FrameError> {
        let started = self.bytes.is_empty();
        proto::write_message(&mut self.bytes, msg, bulk)?;
        if started {
            self.since = Some(Instant::now());
        }
        Ok(started)
    }

    /// Whether the batch should go out now.
    pub fn due(&self) -> bool {
        self.due_at().is_some_and(|at| at <= Instant::now())
    }

    /// When the batch should go out (now, if it is large); `None` when empty.
    pub fn due_at(&self) -> Option<Instant> {
        let since = self.since?;
        if self.bytes.len() >= BATCH_BYTES {
            return Some(since);
        }
        Some(since + self.age)
    }

    /// Lets the batch wait `age` from now on (a test's second phase).
    #[cfg(test)]
    pub fn set_age(&mut self, age: Duration) {
        self.age = age;
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Writes the batch to `w`, if there is one.
    pub fn flush(&mut self, w: &mut impl Write) -> io::Result<()> {
        if self.bytes.is_empty() {
            return Ok(());
        }
        let written = w.write_all(&self.bytes).and_then(|()| w.flush());
        self.clear();
        self.writes += 1;
        written
    }

    /// Takes the batch's bytes to write elsewhere, leaving it empty.
    pub fn take(&mut self) -> Vec<u8> {
        let room = self.bytes.capacity();
        self.since = None;
        self.writes += 1;
        std::mem::replace(&mut self.bytes, Vec::with_capacity(room))
    }

    /// Forgets the batch (a lost link: a resumed session sends its kept calls again).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.since = None;
    }

    #[cfg(test)]
    pub fn writes(&self) -> u64 {
        self.writes
    }
}

/// What the flusher thread flushes: a connection that holds a batch.
pub trait Flush: Send + Sync {
    /// Writes the connection's batch if it is due, keeping a failure for its
    /// next call; never waits for a connection another thread holds.
    fn flush_if_due(&self) -> Flushing;
    /// Writes the batch whatever its age, if no thread holds the connection
    /// (the process's exit).
    fn flush_now(&self);
}

/// What became of a connection's batch when the flusher came for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flushing {
    /// Written, or there was none (another call took it).
    Done,
    /// A younger batch, due then.
    NotYet(Instant),
    /// Another thread holds the connection: try again later.
    Busy,
}

/// A connection the flusher comes back to at `due`; `busy` times it was
/// found held, which spaces out the next try.
struct Waiting {
    due: Instant,
    busy: u32,
    conn: Weak<dyn Flush>,
}

/// The first wait before a busy connection is tried again; it doubles up to
/// [`BUSY_RETRY_MAX`]. A connection is held for long only by a call waiting
/// for its answer, and such a call wrote the batch before it waited.
const BUSY_RETRY: Duration = Duration::from_micros(20);
const BUSY_RETRY_MAX: Duration = Duration::from_millis(1);

/// Connections whose batch started, waiting for the flusher; the process
/// that made the thread (a forked child makes its own).
struct Flusher {
    pid: u32,
    waiting: Mutex<Vec<Waiting>>,
    wake: Condvar,
}

fn flusher() -> &'static Mutex<Option<&'static Flusher>> {
    static FLUSHER: OnceLock<Mutex<Option<&'static Flusher>>> = OnceLock::new();
    FLUSHER.get_or_init(|| Mutex::new(None))
}

/// Has `conn`'s batch written at `due` (or soon after) if nothing else
/// writes it first; false when there is no flusher thread (none could be
/// started), so the caller writes the batch itself.
#[must_use]
pub fn watch(conn: Weak<dyn Flush>, due: Instant) -> bool {
    let pid = std::process::id();
    let mut slot = flusher().lock().unwrap_or_else(|p| p.into_inner());
    let current = match *slot {
        Some(f) if f.pid == pid => f,
        _ => {
            let made: &'static Flusher = Box::leak(Box::new(Flusher {
                pid,
                waiting: Mutex::new(Vec::new()),
                wake: Condvar::new(),
            }));
            let started = std::thread::Builder::new()
                .name("cumux-flush".into())
                .spawn(move || run(made));
            if started.is_err() {
                return false;
            }
            *slot = Some(made);
            // SAFETY: registers a function with no arguments that never
            // unwinds (it catches panics) to run at the process's exit.
            unsafe { libc::atexit(flush_at_exit) };
            made
        }
    };
    drop(slot);
    current
        .waiting
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Waiting { due, busy: 0, conn });
    current.wake.notify_one();
    true
}

/// The flusher: sleeps until the earliest due time, then tries every
/// connection due by then; a younger batch or a busy connection comes back
/// later, at its own time.
fn run(f: &'static Flusher) {
    // SAFETY: prctl with PR_SET_TIMERSLACK only sets this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64, 0u64, 0u64, 0u64) };
    loop {
        let due = take_due(f);
        let mut again = Vec::new();
        for w in due {
            let Some(conn) = w.conn.upgrade() else {
                continue;
            };
            match conn.flush_if_due() {
                Flushing::Done => {}
                Flushing::NotYet(at) => again.push(Waiting {
                    due: at,
                    busy: 0,
                    ..w
                }),
                Flushing::Busy => {
                    let wait = BUSY_RETRY
                        .saturating_mul(1 << w.busy.min(6))
                        .min(BUSY_RETRY_MAX);
                    again.push(Waiting {
                        due: Instant::now() + wait,
                        busy: w.busy + 1,
                        ..w
                    });
                }
            }
        }
        if !again.is_empty() {
            f.waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(again);
        }
    }
}

/// Waits until some connection is due and takes every one due by now.
fn take_due(f: &Flusher) -> Vec<Waiting> {
    let mut waiting = f.waiting.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let now = Instant::now();
        match waiting.iter().map(|w| w.due).min() {
            None => waiting = f.wake.wait(waiting).unwrap_or_else(|p| p.into_inner()),
            Some(first) if first > now => {
                waiting = f
                    .wake
                    .wait_timeout(waiting, first - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            Some(_) => {
                let (due, later) = std::mem::take(&mut *waiting)
                    .into_iter()
                    .partition(|w| w.due <= now);
                *waiting = later;
                return due;
            }
        }
    }
}

/// At the process's exit, what the flusher has not written yet goes out
/// (a program that launches and exits): from connections no thread holds.
extern "C" fn flush_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(f) = *flusher().lock().unwrap_or_else(|p| p.into_inner()) else {
            return;
        };
        if f.pid != std::process::id() {
            return;
        }
        let waiting = std::mem::take(&mut *f.waiting.lock().unwrap_or_else(|p| p.into_inner()));
        for conn in waiting.iter().filter_map(|w| w.conn.upgrade()) {
            conn.flush_now();
        }
    });
}

/// How long unanswered calls on a socket wait to go out together
/// ([`BATCH_AGE`]); `CUMUX_BATCH_US` (0: each goes at once), read once.
pub fn batch_age() -> Duration {
    static AGE: OnceLock<Duration> = OnceLock::new();
    *AGE.get_or_init(|| {
        std::env::var("CUMUX_BATCH_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(BATCH_AGE, |us| Duration::from_micros(us.min(10_000)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_goes_out_whole_once_due() {
        let mut b = Batch::new(Duration::from_millis(50));
        assert!(b.push(b"one", b"").unwrap(), "the first request starts it");
        assert!(!b.push(b"two", b"xy").unwrap());
        assert!(!b.due(), "young and small");
        let mut out = Vec::new();
        b.flush(&mut out).unwrap();
        let mut r = io::Cursor::new(out);
        let mut buf = Vec::new();
        assert_eq!(proto::read_message(&mut r, &mut buf).unwrap(), None);
        assert_eq!(buf, b"one");
        let bulk = proto::read_message(&mut r, &mut buf).unwrap();
        assert_eq!(buf, b"two");
        assert_eq!(bulk, Some(2));
        assert!(b.is_empty() && b.writes() == 1);
        b.push(&vec![0; BATCH_BYTES], b"").unwrap();
        assert!(b.due(), "large");
        let mut old = Batch::new(Duration::ZERO);
        old.push(b"x", b"").unwrap();
        assert!(old.due(), "old");
    }
}
