//! Unanswered calls on a socket, written together: a connection's batch of
//! encoded requests goes out with the next call that waits, once it is large
//! or old, or from the flusher thread once the program sends nothing more.
//!
//! Over a network each write is a system call, a TLS record and a packet
//! for the server to read; a program's launches come microseconds apart.
//! A batch is never older than [`BATCH_AGE`] plus the flusher's wake-up, so
//! unanswered work reaches the device about as soon as before.

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
        self.bytes.len() >= BATCH_BYTES || self.since.is_some_and(|t| t.elapsed() >= self.age)
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
    /// Writes the connection's batch, keeping a failure for its next call;
    /// with `wait` false, only if the connection is free now.
    fn flush_batch(&self, wait: bool);
}

/// Connections whose batch started, waiting for the flusher; the process
/// that made the thread (a forked child makes its own).
struct Flusher {
    pid: u32,
    waiting: Mutex<Vec<Weak<dyn Flush>>>,
    wake: Condvar,
}

fn flusher() -> &'static Mutex<Option<&'static Flusher>> {
    static FLUSHER: OnceLock<Mutex<Option<&'static Flusher>>> = OnceLock::new();
    FLUSHER.get_or_init(|| Mutex::new(None))
}

/// Has `conn`'s batch written within about [`BATCH_AGE`] if nothing else
/// writes it first.
pub fn watch(conn: Weak<dyn Flush>) {
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
                // No thread: flush now rather than let the batch wait.
                drop(slot);
                if let Some(conn) = conn.upgrade() {
                    conn.flush_batch(true);
                }
                return;
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
        .push(conn);
    current.wake.notify_one();
}

/// The flusher: sleeps until a batch starts, lets it gather for its age,
/// then writes every waiting connection's batch.
fn run(f: &'static Flusher) {
    // SAFETY: prctl with PR_SET_TIMERSLACK only sets this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64, 0u64, 0u64, 0u64) };
    loop {
        let mut waiting = f.waiting.lock().unwrap_or_else(|p| p.into_inner());
        while waiting.is_empty() {
            waiting = f.wake.wait(waiting).unwrap_or_else(|p| p.into_inner());
        }
        drop(waiting);
        std::thread::sleep(BATCH_AGE);
        let due = std::mem::take(&mut *f.waiting.lock().unwrap_or_else(|p| p.into_inner()));
        for conn in due.iter().filter_map(Weak::upgrade) {
            conn.flush_batch(true);
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
        let due = std::mem::take(&mut *f.waiting.lock().unwrap_or_else(|p| p.into_inner()));
        for conn in due.iter().filter_map(Weak::upgrade) {
            conn.flush_batch(false);
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
