//! How a side waits for its peer: the spin before sleeping and its tuning
//! from the environment, futex sleeps and wakes on the doorbell words, and the
//! signs that the peer is gone or that spinning lost the core.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::area::ShmArea;
use super::layout::{Side, OFF_BELL};

/// How long a side spins before sleeping, unless `CUMUX_SHM_SPIN_US` says
/// otherwise. Longer than a futex wake-up takes (≈ 40-50 µs on the 2-core
/// development VM), so a short call is caught awake: on the CPU device a launch
/// plus synchronize takes ≈ 50 µs at 50 µs of spin and 75-160 µs at 20 µs.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// A gap this long between two checks of a spinning waiter means it may have
/// lost its core: to another task (the thread's involuntary context switches
/// rose, see [`involuntary_switches`]), or only for a moment to the host
/// (a virtual CPU taken by the hypervisor, an interrupt), which is no reason
/// to stop spinning.
pub(super) const PREEMPTED: Duration = Duration::from_micros(20);

/// Pause instructions between two looks of a spinning waiter. A pause takes
/// ~140 cycles on recent Intel cores, so 32 of them let a message wait ~2 µs
/// unseen; 4 (~0.3 µs) cut the H100 host's synchronize round trip p50 from
/// 10.3 to 7.7 µs.
pub(super) const PAUSES_PER_CHECK: u32 = 4;

/// Spins one look's worth of pauses ([`PAUSES_PER_CHECK`]): a spinning
/// waiter's gap between two looks, the connection's and a client's watch
/// alike (on the H200 host, 1 pause a look waited no shorter than 4).
#[inline]
pub fn pause_between_looks() {
    for _ in 0..PAUSES_PER_CHECK {
        std::hint::spin_loop();
    }
}

/// How long one futex sleep lasts before the peer's liveness is checked again.
pub const WAIT_SLICE: Duration = Duration::from_millis(50);

/// This thread's involuntary context switches so far: times the kernel gave
/// its core to another task while it could still run.
pub(super) fn involuntary_switches() -> i64 {
    // SAFETY: an all-zero rusage is valid; getrusage fills the one we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    usage.ru_nivcsw
}

/// Rings `side`'s doorbell, as the other side does after publishing: bumps
/// its futex word and wakes it. Harmless when there is nothing to see.
pub fn ring_doorbell(area: &ShmArea, side: Side) {
    let bell = area.word32(OFF_BELL[side.index()]);
    bell.fetch_add(1, Ordering::Release);
    futex_wake(bell);
}

/// Sleeps while `word` holds `expected`, at most `timeout`; whether it timed out.
/// A shared (not process-private) futex: the word lives in memory two processes map.
pub(super) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 at `word` (valid for the call) and
    // `ts` (valid for reads); it returns at a wake, a timeout, a signal or at once
    // if the value differs, all of which callers handle by re-checking.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
    rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

/// Wakes a sleeper on `word`.
pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address of `word` as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Whether the socket's peer hung up. Bytes waiting on it are not a hang-up:
/// after the switch to shared memory the socket carries only the memfds of
/// pinned regions ([`crate::pinned`]), which the server reads with their call.
pub(super) fn socket_hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    rc > 0 && pfd.revents != 0
}

/// How long a client spins for an answer by default on hosts of 8 or more
/// cores: longer than most waits for a kernel, as CUDA itself spins while a
/// program synchronizes (see `cumux_server::device::spin::WAIT_SPIN`).
pub const ANSWER_SPIN: Duration = Duration::from_micros(1000);

/// The client's spin for answers: `CUMUX_SHM_SPIN_US`, else [`ANSWER_SPIN`] on
/// hosts of 8 or more cores, else [`DEFAULT_SPIN`].
pub fn answer_spin_from_env() -> Duration {
    if std::env::var("CUMUX_SHM_SPIN_US").is_ok() {
        return spin_from_env();
    }
    match std::thread::available_parallelism() {
        Ok(n) if n.get() >= 8 => ANSWER_SPIN,
        _ => DEFAULT_SPIN,
    }
}

/// `CUMUX_SHM_SPIN_US`, else [`DEFAULT_SPIN`].
pub fn spin_from_env() -> Duration {
    std::env::var("CUMUX_SHM_SPIN_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_micros)
        .unwrap_or(DEFAULT_SPIN)
}
