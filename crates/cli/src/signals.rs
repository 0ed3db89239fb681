//! Signals for the CLI's long-lived commands: `cumux run` passes SIGINT,
//! SIGTERM, SIGHUP and SIGQUIT on to its program as the same signal
//! ([`Forwarder`]); `cumux serve` turns SIGTERM and SIGINT into a drain, and
//! outlives a write past its file-size limit ([`survive_file_size_limit`]).

use std::io;
use std::process::{Child, ExitStatus};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::{Handle, SignalsInfo};
use signal_hook::low_level::siginfo::{Cause, Origin};

/// Makes a write past the process's file-size limit (`RLIMIT_FSIZE`) fail
/// with `EFBIG` rather than end the process (SIGXFSZ's default): a
/// checkpoint the server writes past it fails, and its sessions carry on.
pub fn survive_file_size_limit() -> io::Result<()> {
    let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGXFSZ, seen).map(drop)
}

/// The signals `cumux run` passes on to its program.
pub const FORWARDED: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];

/// Who gets the signals: the program once it runs; before, the first one is
/// kept for it.
#[derive(Default)]
struct Target {
    child: Option<i32>,
    early: Option<i32>,
}

fn lock(target: &Mutex<Target>) -> MutexGuard<'_, Target> {
    target.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `cumux run` passes on a signal of this origin to `child`. One the
/// kernel sent (a terminal's Ctrl-C, Ctrl-\ or hang-up) went to the whole
/// foreground process group, the program included, so it is not sent twice;
/// nor is one the program sent itself.
pub fn passes_on(origin: &Origin, child: i32) -> bool {
    let sender = origin.process.as_ref().map(|p| p.pid);
    passes_on_from(origin.cause == Cause::Kernel, sender, child)
}

/// [`passes_on`] for a signal the kernel sent (or not), from `sender`.
fn passes_on_from(from_kernel: bool, sender: Option<i32>, child: i32) -> bool {
    !from_kernel && sender != Some(child)
}

/// While alive, catches [`FORWARDED`] signals and sends each to the program
/// (see [`passes_on`]), or keeps the first for it while it has not started;
/// none of them stops `cumux run` itself.
pub struct Forwarder {
    target: Arc<Mutex<Target>>,
    handle: Handle,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    pub fn start() -> io::Result<Forwarder> {
        let mut signals = SignalsInfo::<WithOrigin>::new(FORWARDED)?;
        let handle = signals.handle();
        let target = Arc::new(Mutex::new(Target::default()));
        let shared = Arc::clone(&target);
        let thread = std::thread::Builder::new()
            .name("cumux-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    let mut target = lock(&shared);
                    match target.child {
                        Some(pid) if passes_on(&origin, pid) => send(pid, origin.signal),
                        Some(_) => {
                            tracing::debug!(signal = origin.signal, "the program got it too")
                        }
                        None => {
                            target.early.get_or_insert(origin.signal);
                        }
                    }
                }
            })?;
        Ok(Forwarder {
            target,
            handle,
            thread: Some(thread),
        })
    }

    /// The first signal caught while there was no program yet.
    pub fn arrived_early(&self) -> Option<i32> {
        lock(&self.target).early
    }

    /// Waits for `child` to end, passing signals on to it meanwhile; a signal
    /// caught before it started is passed on at once.
    pub fn wait_for(&self, child: &mut Child) -> io::Result<ExitStatus> {
        let pid = child.id() as i32;
        {
            let mut target = lock(&self.target);
            target.child = Some(pid);
            if let Some(signal) = target.early.take() {
                send(pid, signal);
            }
        }
        let waited = wait_exited(pid);
        // Its pid stays the program's until it is reaped: no signal after this
        // can reach a process that took the pid over.
        lock(&self.target).child = None;
        waited?;
        child.wait()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn send(pid: i32, signal: i32) {
    tracing::debug!(pid, signal, "passing the signal on to the program");
    // SAFETY: kill has no memory preconditions; `pid` is a child of ours not
    // yet reaped (see `Forwarder::wait_for`), so it names that program.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Blocks until the child `pid` has exited, leaving it unreaped.
fn wait_exited(pid: i32) -> io::Result<()> {
    loop {
        // SAFETY: an all-zero siginfo_t is a valid value of that plain C struct.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid for writes for the call; WNOWAIT leaves the
        // child to be reaped by `Child::wait`.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Drain requests for `cumux serve`: calls `on_signal` with the count so far
/// (1: drain, 2: stop now) for each SIGTERM or SIGINT.
pub fn on_stop_signals(on_signal: impl Fn(u32, i32) + Send + 'static) -> io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new()
        .name("cumux-stop-signals".into())
        .spawn(move || {
            let mut count = 0;
            for signal in signals.forever() {
                count += 1;
                on_signal(count, signal);
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_the_program_got_already_are_not_sent_twice() {
        // kill(1) from another process: passed on.
        assert!(passes_on_from(false, Some(4242), 7));
        assert!(passes_on_from(false, None, 7));
        // A terminal's Ctrl-C (the kernel, to the whole group): not again.
        assert!(!passes_on_from(true, None, 7));
        // The program signalling cumux run: not back to it.
        assert!(!passes_on_from(false, Some(7), 7));
    }
}
