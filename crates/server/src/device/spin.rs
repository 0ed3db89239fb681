//! [`SpinReader`]: reads from a socket that poll it without blocking for a
//! few microseconds first, so an answer that comes that fast costs no wake-up.
//! Descriptors that come with the bytes (`SCM_RIGHTS`) are kept for the taking.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Microseconds a read polls before it sleeps (`0` never polls); the default
/// is [`DEFAULT_SPIN`] on hosts with 4 or more cores, none on smaller ones,
/// where the poller would take the core the answer needs.
pub const SPIN_ENV: &str = "CUMUX_SPIN_US";
/// How long a read polls by default.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// How long the server polls for a worker's answer by default on hosts of
/// [`WAIT_SPIN_CORES`] or more cores: longer than most waits for a kernel, as
/// CUDA itself spins while a program synchronizes. Measured on the H100 host: a
/// 50 µs kernel's launch and synchronize took 144 µs at the 50 µs poll (the
/// answer came after the poll ended, and the wake-ups cost the rest) and 71 µs
/// at 2 ms (native: 49 µs).
pub const WAIT_SPIN: Duration = Duration::from_micros(1000);
/// Hosts with at least this many cores poll for [`WAIT_SPIN`].
pub const WAIT_SPIN_CORES: usize = 8;

/// How long a latency-critical tenant's server thread and worker thread poll for
/// its next call on large hosts (see [`hot_spin_time`]): longer than the pause
/// between the calls of a program that launches, waits and launches again, so
/// neither sleeps between them. Measured on the H100 host: a 50 µs kernel's
/// launch and synchronize, 1 ms apart, took p50 106 µs / p99 650 µs when both
/// slept between calls, 71 / 174 µs when they polled for 2 ms.
pub const HOT_SPIN: Duration = Duration::from_millis(5);

/// The poll for a latency-critical tenant's next call: [`HOT_SPIN`] on hosts of
/// [`WAIT_SPIN_CORES`] or more cores (unless `CUMUX_SPIN_US` says otherwise),
/// else as [`spin_time`].
pub fn hot_spin_time() -> Duration {
    on_large_hosts(HOT_SPIN)
}

/// How long the server polls for a worker's answer: `CUMUX_SPIN_US`, else
/// [`WAIT_SPIN`] on large hosts, else as [`spin_time`].
pub fn answer_spin_time() -> Duration {
    on_large_hosts(WAIT_SPIN)
}

/// `spin` on hosts of [`WAIT_SPIN_CORES`] or more cores, unless `CUMUX_SPIN_US`
/// says otherwise; else as [`spin_time`].
fn on_large_hosts(spin: Duration) -> Duration {
    if std::env::var(SPIN_ENV).is_ok() {
        return spin_time();
    }
    match std::thread::available_parallelism() {
        Ok(n) if n.get() >= WAIT_SPIN_CORES => spin,
        _ => spin_time(),
    }
}

/// The polling time this process uses.
pub fn spin_time() -> Duration {
    if let Some(us) = std::env::var(SPIN_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        return Duration::from_micros(us.min(10_000));
    }
    match std::thread::available_parallelism() {
        Ok(n) if n.get() >= 4 => DEFAULT_SPIN,
        _ => Duration::ZERO,
    }
}

/// Descriptors a reader keeps before it refuses more (closing them).
const MAX_KEPT_FDS: usize = 64;

/// A blocking socket whose reads poll for `spin` before they block.
pub struct SpinReader {
    stream: UnixStream,
    spin: Duration,
    /// Descriptors received with the bytes read so far, oldest first.
    fds: VecDeque<OwnedFd>,
}

impl SpinReader {
    pub fn new(stream: UnixStream, spin: Duration) -> Self {
        SpinReader {
            stream,
            spin,
            fds: VecDeque::new(),
        }
    }

    /// Polls for `spin` from the next read on.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
    }

    /// What a read polls for before it blocks.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// The oldest descriptor that came with the bytes read so far.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    /// One `recvmsg`, keeping the descriptors that come with the bytes.
    fn recv(&mut self, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
        let mut fds = Vec::new();
        let n = cumux_protocol::shm::recv_with_fds(self.stream.as_fd(), buf, flags, &mut fds)?;
        for fd in fds {
            if self.fds.len() < MAX_KEPT_FDS {
                self.fds.push_back(fd);
            }
        }
        Ok(n)
    }

    pub fn get_ref(&self) -> &UnixStream {
        &self.stream
    }

    /// One read that never blocks: `None` when nothing is there yet.
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // MSG_DONTWAIT leaves the socket itself blocking.
        match self.recv(buf, libc::MSG_DONTWAIT) {
            Ok(n) => Ok(Some(n)),
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(e),
            },
        }
    }
}

impl Read for SpinReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() || self.spin.is_zero() {
            return self.recv(buf, 0);
        }
        let start = Instant::now();
        loop {
            if let Some(n) = self.try_read(buf)? {
                return Ok(n);
            }
            if start.elapsed() >= self.spin {
                return self.recv(buf, 0);
            }
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_what_comes_whether_polling_or_blocking() {
        for spin in [Duration::ZERO, Duration::from_micros(200)] {
            let (mut a, b) = UnixStream::pair().unwrap();
            let mut r = SpinReader::new(b, spin);
            a.write_all(b"now").unwrap();
            let mut buf = [0u8; 8];
            assert_eq!(r.read(&mut buf).unwrap(), 3);
            assert_eq!(&buf[..3], b"now");
            // Written long after the polling ends: the read blocks for it.
            let writer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                a.write_all(b"later").unwrap();
                a
            });
            assert_eq!(r.read(&mut buf).unwrap(), 5);
            assert_eq!(&buf[..5], b"later");
            drop(writer.join().unwrap());
            assert_eq!(r.read(&mut buf).unwrap(), 0, "end of stream");
        }
    }

    #[test]
    fn descriptors_that_come_with_the_bytes_are_kept() {
        for spin in [Duration::ZERO, Duration::from_micros(200)] {
            let (a, b) = UnixStream::pair().unwrap();
            let (x, _y) = UnixStream::pair().unwrap();
            let mut r = SpinReader::new(b, spin);
            cumux_protocol::shm::send_with_fd(&a, b"fd!", x.as_fd()).unwrap();
            let mut buf = [0u8; 8];
            assert_eq!(r.read(&mut buf).unwrap(), 3);
            assert!(r.take_fd().is_some());
            assert!(r.take_fd().is_none());
        }
    }
}
