//! Capture of device `printf`: the driver writes a context's printf buffer to
//! the process's stdout (fd 1) at sync points, so fd 1 is turned into a pipe
//! once, and output written during a capture window is handed to its caller.
//!
//! How it works: [`StdoutCapture::install`] dups the real stdout away, points
//! fd 1 at a pipe and starts a reader thread. Outside any window the reader
//! forwards what it reads to the real stdout, so the process's own output is
//! unchanged. [`StdoutCapture::window`] runs a closure (a synchronizing driver
//! call) with the window open, flushes C stdio, writes an end marker into the
//! pipe and waits until the reader has seen it: everything read before the
//! marker is the window's output. Windows are serialised process-wide, so keep
//! them short (wait for the GPU first, then synchronize inside the window).
//! This relies on the driver writing the printf text on the calling thread
//! before the synchronizing call returns.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// Bytes that end a window in the pipe; device printf cannot easily emit NULs.
const MARKER: &[u8] = b"\0\x1bcumux-capture-window-end\x1b\0";
/// Bytes kept per window at most; older ones are dropped first.
const WINDOW_CAP: usize = 64 << 20;
/// How long a window waits for its marker before giving up on the rest.
const MARKER_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Shared {
    open: bool,
    buf: Vec<u8>,
    /// The marker was read; `buf` holds the window's output.
    done: bool,
}

/// The process-wide stdout capture.
///
/// Alternatives weighed: a worker process per session whose stdout is a pipe
/// of its own (exact, and isolates driver crashes, but needs an IPC layer for
/// every device call and a process and context per session); rewriting
/// `vprintf` calls in PTX to a cumux buffer (works only where PTX is JIT-ed,
/// not for cubins); reading the driver's printf FIFO directly (undocumented).
/// The pipe with serialised windows is the simplest that is correct when every
/// call that can flush a printing context runs inside a window.
pub struct StdoutCapture {
    shared: Arc<(Mutex<Shared>, Condvar)>,
    /// Serialises windows.
    windows: Mutex<()>,
    /// Write end of the pipe (fd 1 is a dup of it).
    pipe_write: i32,
}

static CAPTURE: OnceLock<Result<StdoutCapture, String>> = OnceLock::new();

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn os_error(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

impl StdoutCapture {
    /// Redirects fd 1 into the capture pipe (once per process) and returns the
    /// capture, or why it could not be set up.
    pub fn install() -> Result<&'static StdoutCapture, String> {
        CAPTURE
            .get_or_init(Self::set_up)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn set_up() -> Result<StdoutCapture, String> {
        let _ = std::io::stdout().flush();
        // SAFETY: fflush(NULL) flushes every C output stream; no pointers kept.
        unsafe { libc::fflush(std::ptr::null_mut()) };
        // SAFETY: plain fd calls; every returned fd is checked before use.
        let real = unsafe { libc::fcntl(1, libc::F_DUPFD_CLOEXEC, 3) };
        if real < 0 {
            return Err(os_error("cannot duplicate stdout"));
        }
        let mut fds = [0i32; 2];
        // SAFETY: `fds` has room for the two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            // SAFETY: `real` is ours.
            unsafe { libc::close(real) };
            return Err(os_error("cannot create the capture pipe"));
        }
        let [read_end, write_end] = fds;
        // SAFETY: fd 1 now refers to the pipe; the old stdout lives on as `real`.
        if unsafe { libc::dup2(write_end, 1) } < 0 {
            // SAFETY: all three are ours.
            unsafe {
                libc::close(real);
                libc::close(read_end);
                libc::close(write_end);
            }
            return Err(os_error("cannot point stdout at the capture pipe"));
        }
        let shared = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
        let reader_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("cumux-stdout-capture".into())
            .spawn(move || reader(read_end, real, &reader_shared))
            .map_err(|e| format!("cannot start the capture reader: {e}"))?;
        Ok(StdoutCapture {
            shared,
            windows: Mutex::new(()),
            pipe_write: write_end,
        })
    }

    /// Runs `f` with a window open and returns its result and what reached
    /// stdout meanwhile.
    pub fn window<T>(&self, f: impl FnOnce() -> T) -> (T, Vec<u8>) {
        let _serial = lock(&self.windows);
        let (state, changed) = &*self.shared;
        {
            let mut s = lock(state);
            s.open = true;
            s.done = false;
            s.buf.clear();
        }
        let result = f();
        // SAFETY: flushes C stdio buffers (the driver may print through them).
        unsafe { libc::fflush(std::ptr::null_mut()) };
        let mut written = 0;
        while written < MARKER.len() {
            // SAFETY: writes from a live slice to our own pipe fd.
            let n = unsafe {
                libc::write(
                    self.pipe_write,
                    MARKER[written..].as_ptr().cast(),
                    MARKER.len() - written,
                )
            };
            if n <= 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                break;
            }
            written += n as usize;
        }
        let mut s = lock(state);
        if written == MARKER.len() {
            let deadline = std::time::Instant::now() + MARKER_WAIT;
            while !s.done {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                s = changed
                    .wait_timeout(s, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        s.open = false;
        let out = std::mem::take(&mut s.buf);
        (result, out)
    }
}

/// Reads the pipe forever: into the open window's buffer up to its marker,
/// everything else to the real stdout.
fn reader(read_end: i32, real: i32, shared: &(Mutex<Shared>, Condvar)) {
    let (state, changed) = shared;
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        // SAFETY: reads into a live buffer of the stated length.
        let n = unsafe { libc::read(read_end, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        if n == 0 {
            return;
        }
        let bytes = &chunk[..n as usize];
        let forward = {
            let mut s = lock(state);
            if s.open && !s.done {
                let start = s.buf.len().saturating_sub(MARKER.len());
                s.buf.extend_from_slice(bytes);
                match find(&s.buf[start..], MARKER) {
                    Some(at) => {
                        let at = start + at;
                        let rest = s.buf.split_off(at + MARKER.len());
                        s.buf.truncate(at);
                        s.done = true;
                        changed.notify_all();
                        rest
                    }
                    None => {
                        if s.buf.len() > WINDOW_CAP {
                            let excess = s.buf.len() - WINDOW_CAP;
                            s.buf.drain(..excess);
                        }
                        Vec::new()
                    }
                }
            } else {
                // A marker of a window that gave up waiting is dropped here.
                strip_markers(bytes)
            }
        };
        write_all(real, &forward);
    }
}

fn write_all(fd: i32, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writes from a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// Position of `needle` in `haystack`.
pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `bytes` without any window markers.
fn strip_markers(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some(at) = find(rest, MARKER) {
        out.extend_from_slice(&rest[..at]);
        rest = &rest[at + MARKER.len()..];
    }
    out.extend_from_slice(rest);
    out
}

/// Whether a module image can print (`cumux_fatbin::image_may_print`):
/// capturing costs a printing module's launches time, so only those are.
pub use cumux_fatbin::{image_may_print, image_mentions};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_found_and_stripped() {
        let mut data = b"hello".to_vec();
        data.extend_from_slice(MARKER);
        data.extend_from_slice(b"world");
        assert_eq!(find(&data, MARKER), Some(5));
        assert_eq!(strip_markers(&data), b"helloworld");
        assert_eq!(find(b"ab", MARKER), None);
    }

    #[test]
    fn printing_images_are_recognised() {
        assert!(image_may_print(b".extern .func (.param .b32 r) vprintf\n"));
        assert!(!image_may_print(b".visible .entry add()\n{\n}\n"));
        assert!(!image_may_print(
            b"call.uni __assertfail, (p0, p1, p2, p3, p4);"
        ));
    }
}
