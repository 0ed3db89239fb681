//! [`SpinReader`]: reads from a socket that poll it without blocking for a
//! few microseconds first, so an answer that comes that fast costs no wake-up.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Microseconds a read polls before it sleeps (`0` never polls); the default
/// is [`DEFAULT_SPIN`] on hosts with 4 or more cores, none on smaller ones,
/// where the poller would take the core the answer needs.
pub const SPIN_ENV: &str = "CUMUX_SPIN_US";
/// How long a read polls by default.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

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

/// A blocking socket whose reads poll for `spin` before they block.
pub struct SpinReader {
    stream: UnixStream,
    spin: Duration,
}

impl SpinReader {
    pub fn new(stream: UnixStream, spin: Duration) -> Self {
        SpinReader { stream, spin }
    }

    pub fn get_ref(&self) -> &UnixStream {
        &self.stream
    }

    /// One read that never blocks: `None` when nothing is there yet.
    fn try_read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: `buf` is valid for `buf.len()` writable bytes and the fd is
        // ours for the call; MSG_DONTWAIT leaves the socket itself blocking.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        }
    }
}

impl Read for SpinReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() || self.spin.is_zero() {
            return self.stream.read(buf);
        }
        let start = Instant::now();
        loop {
            if let Some(n) = self.try_read(buf)? {
                return Ok(n);
            }
            if start.elapsed() >= self.spin {
                return self.stream.read(buf);
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
}
