//! [`Hangups`]: one thread that watches every connection's socket for its peer
//! hanging up (`EPOLLRDHUP`), and then runs what the connection asked for, its
//! session's cancel, while the connection's own thread may still be blocked in
//! a call that waits for the session's work (a synchronize on a kernel that
//! never ends). Only a hang-up wakes it: requests arriving do not.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rustix::buffer::spare_capacity;
use rustix::event::epoll;

use crate::locking::lock;

type OnHangup = Box<dyn FnOnce() + Send>;

/// The watching thread's epoll set and what to run for each socket in it.
pub struct Hangups {
    epoll: OwnedFd,
    waiting: Mutex<HashMap<u64, OnHangup>>,
    next_token: AtomicU64,
    thread_started: Mutex<bool>,
}

/// One socket watched; dropping it stops the watch (before the socket closes).
pub struct HangupWatch {
    hangups: Arc<Hangups>,
    token: u64,
    fd: OwnedFd,
}

impl Hangups {
    pub fn new() -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(Hangups {
            epoll: epoll::create(epoll::CreateFlags::CLOEXEC)?,
            waiting: Mutex::new(HashMap::new()),
            next_token: AtomicU64::new(1),
            thread_started: Mutex::new(false),
        }))
    }

    /// Runs `on_hangup` (once, on the watching thread) when the peer of
    /// `socket` hangs up, unless the watch is dropped first.
    pub fn watch(
        self: &Arc<Self>,
        socket: BorrowedFd<'_>,
        on_hangup: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<HangupWatch> {
        self.start_thread()?;
        // A duplicate of its own, so the watch never names a closed or reused
        // descriptor, whatever the connection does with its socket.
        let fd = socket.try_clone_to_owned()?;
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        lock(&self.waiting).insert(token, Box::new(on_hangup));
        let flags = epoll::EventFlags::RDHUP | epoll::EventFlags::ONESHOT;
        if let Err(e) = epoll::add(&self.epoll, &fd, epoll::EventData::new_u64(token), flags) {
            lock(&self.waiting).remove(&token);
            return Err(e.into());
        }
        Ok(HangupWatch {
            hangups: Arc::clone(self),
            token,
            fd,
        })
    }

    fn start_thread(self: &Arc<Self>) -> std::io::Result<()> {
        let mut started = lock(&self.thread_started);
        if !*started {
            let weak = Arc::downgrade(self);
            std::thread::Builder::new()
                .name("cumux-hangups".into())
                .spawn(move || watch_loop(weak))?;
            *started = true;
        }
        Ok(())
    }
}

impl Drop for HangupWatch {
    fn drop(&mut self) {
        lock(&self.hangups.waiting).remove(&self.token);
        let _ = epoll::delete(&self.hangups.epoll, self.fd.as_fd());
    }
}

fn watch_loop(hangups: Weak<Hangups>) {
    let mut events = Vec::with_capacity(64);
    // Wakes now and then to see whether the server is gone.
    let tick = rustix::event::Timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    loop {
        let Some(hangups) = hangups.upgrade() else {
            return;
        };
        events.clear();
        if let Err(e) = epoll::wait(&hangups.epoll, spare_capacity(&mut events), Some(&tick)) {
            if e != rustix::io::Errno::INTR {
                tracing::error!("the hang-up watcher stops: {e}");
                return;
            }
        }
        for event in events.drain(..) {
            let token = event.data.u64();
            let on_hangup = lock(&hangups.waiting).remove(&token);
            if let Some(on_hangup) = on_hangup {
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(on_hangup)).is_err() {
                    tracing::error!("a hang-up's cancel panicked");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn a_hang_up_runs_its_cancel_once_and_traffic_does_not() {
        let hangups = Hangups::new().unwrap();
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let (said, heard) = mpsc::channel();
        let watch = hangups
            .watch(ours.as_fd(), move || said.send(()).unwrap())
            .unwrap();
        theirs.write_all(b"a request").unwrap();
        assert!(
            heard.recv_timeout(Duration::from_millis(200)).is_err(),
            "bytes are no hang-up"
        );
        drop(theirs);
        heard
            .recv_timeout(Duration::from_secs(5))
            .expect("the hang-up is seen");
        drop(watch);

        // A watch dropped first runs nothing.
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (said, heard) = mpsc::channel::<()>();
        let watch = hangups
            .watch(ours.as_fd(), move || said.send(()).unwrap())
            .unwrap();
        drop(watch);
        drop(theirs);
        assert!(heard.recv_timeout(Duration::from_millis(200)).is_err());
    }
}
