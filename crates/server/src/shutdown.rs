//! Stopping a server gracefully: the [`Shutdown`] handle a signal handler
//! pulls (once: drain; twice: stop now), what a drain left behind
//! ([`Drained`]), and the wait on a listener or a shutdown request.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::status::SessionEntry;

/// What a connection that comes while the server drains is told.
pub const SHUTTING_DOWN: &str =
    "the cumux server is shutting down: it takes no new sessions (try again once it is back)";

/// Asks a serving listener to stop: the first request drains (running
/// sessions may finish, new connections are refused), a second stops at once.
/// Cloned handles pull the same cord.
#[derive(Clone)]
pub struct Shutdown(Arc<Cord>);

struct Cord {
    requests: AtomicU32,
    /// Written on each request, so a listener waiting in `poll` wakes.
    ring: UnixStream,
    /// What the listener waits on.
    bell: UnixStream,
}

impl Shutdown {
    pub fn new() -> io::Result<Shutdown> {
        let (ring, bell) = UnixStream::pair()?;
        ring.set_nonblocking(true)?;
        bell.set_nonblocking(true)?;
        Ok(Shutdown(Arc::new(Cord {
            requests: AtomicU32::new(0),
            ring,
            bell,
        })))
    }

    /// Asks for the next step (drain, then stop); the number of requests so far.
    pub fn request(&self) -> u32 {
        let count = self.0.requests.fetch_add(1, Ordering::SeqCst) + 1;
        // A full buffer already holds a wake-up.
        let _ = (&self.0.ring).write(&[1]);
        count
    }

    /// The number of requests so far.
    pub fn requests(&self) -> u32 {
        self.0.requests.load(Ordering::SeqCst)
    }

    /// Empties the wake-ups, once seen.
    fn clear(&self) {
        let mut buf = [0u8; 64];
        while matches!((&self.0.bell).read(&mut buf), Ok(n) if n > 0) {}
    }
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainEnd {
    /// Every connection had closed.
    Finished,
    /// The grace period ran out first.
    TimedOut,
    /// A second request stopped it at once.
    Stopped,
}

/// What a drain left behind.
#[derive(Debug)]
pub struct Drained {
    pub end: DrainEnd,
    /// How long it waited for running sessions.
    pub waited: Duration,
    /// Connections still open when it stopped waiting.
    pub open: u32,
    /// The programs' sessions among them.
    pub sessions: Vec<Arc<SessionEntry>>,
}

impl Drained {
    /// One line for the log: how it ended and what was left.
    pub fn summary(&self) -> String {
        let waited = format!("{:.1} s", self.waited.as_secs_f64());
        let how = match self.end {
            DrainEnd::Finished => format!("every session had ended after {waited}"),
            DrainEnd::TimedOut => format!("the drain timeout passed ({waited})"),
            DrainEnd::Stopped => format!("a second signal ended the drain after {waited}"),
        };
        if self.open == 0 {
            return format!("stopped: {how}; nothing left open");
        }
        let mut line = format!(
            "stopped: {how}; {} connection(s) left open, ended now",
            self.open
        );
        let programs: Vec<String> = self
            .sessions
            .iter()
            .map(|s| {
                format!(
                    "session {} (pid {}, {}, tenant {})",
                    s.session, s.pid, s.program, s.tenant
                )
            })
            .collect();
        if !programs.is_empty() {
            line += ": ";
            line += &programs.join(", ");
        }
        line
    }
}

/// What woke [`wait_for`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Woken {
    /// The listener has a connection to accept.
    Connection,
    /// A shutdown was requested.
    Shutdown,
    /// The timeout passed.
    Timeout,
}

/// Waits until `listener` has a connection, `shutdown` is pulled, or
/// `timeout` (forever if `None`) passes.
pub(crate) fn wait_for(
    listener: RawFd,
    shutdown: &Shutdown,
    timeout: Option<Duration>,
) -> io::Result<Woken> {
    let millis = timeout.map_or(-1, |t| {
        i32::try_from(t.as_millis().max(1)).unwrap_or(i32::MAX)
    });
    let mut fds = [
        libc::pollfd {
            fd: shutdown.0.bell.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: listener,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: `fds` is a valid array of two pollfd for the call, its length
        // passed with it; both descriptors stay open while it runs.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
        if rc >= 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    if fds[0].revents != 0 {
        shutdown.clear();
        return Ok(Woken::Shutdown);
    }
    if fds[1].revents != 0 {
        return Ok(Woken::Connection);
    }
    Ok(Woken::Timeout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn a_request_wakes_the_wait() {
        let dir = std::env::temp_dir().join(format!("cumux-shutdown-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("s")).unwrap();
        let shutdown = Shutdown::new().unwrap();
        let short = Some(Duration::from_millis(10));
        assert_eq!(
            wait_for(listener.as_raw_fd(), &shutdown, short).unwrap(),
            Woken::Timeout
        );
        let pulled = shutdown.clone();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            pulled.request()
        });
        assert_eq!(
            wait_for(listener.as_raw_fd(), &shutdown, None).unwrap(),
            Woken::Shutdown
        );
        assert_eq!(waker.join().unwrap(), 1);
        assert_eq!(shutdown.request(), 2);
        assert_eq!(shutdown.requests(), 2);
        let _client = UnixStream::connect(dir.join("s")).unwrap();
        shutdown.clear();
        assert_eq!(
            wait_for(listener.as_raw_fd(), &shutdown, short).unwrap(),
            Woken::Connection
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_summary_names_what_was_left() {
        let done = Drained {
            end: DrainEnd::Finished,
            waited: Duration::from_millis(1500),
            open: 0,
            sessions: vec![],
        };
        assert_eq!(
            done.summary(),
            "stopped: every session had ended after 1.5 s; nothing left open"
        );
        let left = Drained {
            end: DrainEnd::TimedOut,
            waited: Duration::from_secs(30),
            open: 2,
            sessions: vec![Arc::new(SessionEntry {
                session: 4,
                pid: 99,
                program: "./train".into(),
                tenant: "alice".into(),
                device: 0,
                stats: Default::default(),
                context: std::sync::Weak::<crate::device::model::ModelMemory>::new(),
            })],
        };
        let line = left.summary();
        assert!(
            line.contains("drain timeout passed (30.0 s)")
                && line.contains("2 connection(s) left open")
                && line.contains("session 4 (pid 99, ./train, tenant alice)"),
            "{line}"
        );
    }
}
