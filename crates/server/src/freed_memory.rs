//! Gives the memory finished sessions freed back to the system. glibc's
//! malloc keeps freed memory in its arenas, so without this the server's
//! resident memory tracks its worst moment, not what its sessions hold.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the trimming thread waits after a session ends before it trims:
/// what the session's other threads (its worker's link, the reaper) free
/// meanwhile goes back too, and a busy server trims at most once per wait.
const SETTLE: Duration = Duration::from_secs(1);

/// Asks for a trim once a session is gone; returns at once. Requests that
/// come while one waits are one trim. With [`keep_thresholds_fixed`] at the
/// server's start.
///
/// Why: a session's large buffers (module images — PyTorch's cuBLAS fat
/// binaries are megabytes each — and copies' chunks) are freed on its
/// threads. glibc serves a buffer over its mmap threshold by `mmap` and
/// unmaps it at `free`, but each such `free` raises the threshold (up to 32
/// MiB) and the trim threshold (to twice that), so later buffers come from
/// the arenas and stay there when freed: a thread arena's free top is only
/// given back past the trim threshold, and `malloc_trim` gives back the
/// free chunks inside the arenas but not a thread arena's top. Measured
/// through a worker-cpu server, rounds of 4 programs each loading four
/// images of 4–24 MiB, RssAnon with no session left (2–3 MB before the
/// first): as glibc has it, 4–72 MB after a round, and 2 rounds in 6 above
/// 18 MB; trims with the thresholds fixed at 32 and 16 MiB, one round in 6
/// still kept 23–46 MB in one thread arena's free space; thresholds of 4 and
/// 2 MiB, 2.8–3.4 MB after every one of 18 rounds. Buffers above 4 MiB are
/// then always a fresh `mmap`, faulted in page by page, so what is taken and
/// freed on every call stays under it: a socket copy's chunks are 1 MiB
/// (8 MiB chunks halved copies over TCP). The same holds in a worker
/// process (`cumux worker`), whose shared one serves every session of its
/// device. A trim takes each arena's lock in turn while it returns that
/// arena's free pages (median 2 ms, off every call's path).
pub fn after_session() {
    static TRIMMER: OnceLock<Option<SyncSender<()>>> = OnceLock::new();
    let trimmer = TRIMMER.get_or_init(|| {
        let (tx, rx) = sync_channel(1);
        std::thread::Builder::new()
            .name("cumux-trim".into())
            .spawn(move || trim_on_request(rx))
            .map_err(|e| tracing::warn!("no thread to return freed memory: {e}"))
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = trimmer {
        // Full: a trim is already due, and it will see this session's frees.
        let _ = tx.try_send(());
    }
}

/// Buffers above this are mapped for themselves and unmapped when freed;
/// fixing it stops glibc raising it, and the trim threshold with it.
const MMAP_THRESHOLD: i32 = 4 << 20;
/// An arena gives its free top back, at a `free`, past this.
const TRIM_THRESHOLD: i32 = 2 << 20;

/// Fixes glibc's mmap and trim thresholds (see [`after_session`]); the
/// server calls it once at its start, before its threads.
pub fn keep_thresholds_fixed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes no pointers and only sets malloc's parameters.
    let fixed = unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    };
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let fixed = true;
    if !fixed {
        tracing::warn!("malloc's thresholds could not be set: freed memory may stay resident");
    }
}

fn trim_on_request(requests: Receiver<()>) {
    while requests.recv().is_ok() {
        std::thread::sleep(SETTLE);
        return_to_system();
    }
}

/// Hands every arena's wholly free pages back to the system (`malloc_trim`).
fn return_to_system() {
    let started = Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it locks each arena itself and
    // may be called from any thread at any time.
    let released = unsafe { libc::malloc_trim(0) } != 0;
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let released = false;
    tracing::debug!(
        released,
        trim_ms = started.elapsed().as_secs_f64() * 1e3,
        "freed memory returned to the system"
    );
}
