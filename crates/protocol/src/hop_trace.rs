//! Hop trace: the moments each call passes on its way client → server → worker
//! and back, per process, for profiling a round trip (`CUMUX_HOP_TRACE=DIR`; off by default).
//!
//! Each process that marks a hop maps `DIR/<pid>.hop`, a file of fixed 32-byte
//! records (CLOCK_MONOTONIC nanoseconds, thread id, hop, call name), claimed by
//! one atomic add each. The records live in the page cache, so a process that is
//! killed loses none. `bench/hop_trace.py` joins the files of one run.

use std::cell::Cell;
use std::fs::OpenOptions;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use memmap2::MmapMut;

/// Names the folder the trace files go to; unset, nothing is traced.
pub const HOP_TRACE_ENV: &str = "CUMUX_HOP_TRACE";

/// Records per process file (32 MiB); later marks are dropped.
const RECORDS: usize = 1 << 20;
const RECORD_BYTES: usize = 32;
const NAME_BYTES: usize = 19;
/// First record of a file: this magic, then the record size.
const MAGIC: &[u8; 8] = b"CUMUXHOP";

/// A point on a call's path. Client, server and worker each mark their own.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// The client is about to send a call.
    ClientSend = 1,
    /// The client has its answer.
    ClientAnswer = 2,
    /// The server has read a call.
    ServerReceive = 3,
    /// The server has sent the call's reply (or, fire-and-forget, is done with it).
    ServerReply = 4,
    /// The server is about to send a request to the worker.
    ServerForward = 5,
    /// The server has the worker's answer.
    ServerBack = 6,
    /// The worker has read a request.
    WorkerReceive = 7,
    /// The worker's driver call returned.
    WorkerDone = 8,
    /// The worker has sent its answer.
    WorkerReply = 9,
    /// A shared-memory wait stops spinning and sleeps on its doorbell.
    Sleep = 10,
    /// A sleeping shared-memory wait woke up.
    Wake = 11,
    /// A spinning wait lost its core and gave up its spin.
    SpinLost = 12,
    /// The server has read the worker's printf output up to the call's marker.
    PrintfMarker = 13,
    /// A named step inside a process's handling of a call (for finer profiles).
    Step = 14,
}

struct Trace {
    /// Keeps the mapping alive; records are written through `base`.
    _map: MmapMut,
    base: *mut u8,
    next: AtomicUsize,
}

// SAFETY: `base` points into `_map`, which lives as long as the Trace; writers
// claim disjoint records through `next`, so no two threads write the same bytes.
unsafe impl Sync for Trace {}
// SAFETY: as above; the mapping is not tied to the thread that made it.
unsafe impl Send for Trace {}

static TRACE: OnceLock<Option<Trace>> = OnceLock::new();

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
}

fn open(dir: &Path) -> Result<Trace, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{}.hop", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.set_len((RECORDS * RECORD_BYTES) as u64)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // SAFETY: a file this process just created and sized; nothing else resizes it.
    let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| format!("mmap: {e}"))?;
    map[..8].copy_from_slice(MAGIC);
    map[8..12].copy_from_slice(&(RECORD_BYTES as u32).to_le_bytes());
    let base = map.as_mut_ptr();
    Ok(Trace {
        _map: map,
        base,
        next: AtomicUsize::new(1),
    })
}

fn trace() -> Option<&'static Trace> {
    TRACE
        .get_or_init(|| {
            let dir = std::env::var_os(HOP_TRACE_ENV)?;
            match open(Path::new(&dir)) {
                Ok(trace) => Some(trace),
                Err(e) => {
                    eprintln!("cumux: no hop trace: {e}");
                    None
                }
            }
        })
        .as_ref()
}

/// Whether hops are being traced in this process.
pub fn enabled() -> bool {
    trace().is_some()
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn thread_id() -> u32 {
    TID.with(|tid| {
        if tid.get() == 0 {
            // SAFETY: gettid has no arguments and cannot fail.
            tid.set(unsafe { libc::gettid() } as u32);
        }
        tid.get()
    })
}

/// Records that the current thread passes `hop` for a call named `name`
/// (truncated to 19 bytes). Does nothing unless tracing is on.
pub fn mark(hop: Hop, name: &str) {
    if let Some(trace) = trace() {
        trace.mark(hop, name);
    }
}

impl Trace {
    fn mark(&self, hop: Hop, name: &str) {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        if index >= RECORDS {
            return;
        }
        let mut record = [0u8; RECORD_BYTES];
        record[..8].copy_from_slice(&now_ns().to_le_bytes());
        record[8..12].copy_from_slice(&thread_id().to_le_bytes());
        record[12] = hop as u8;
        let name = &name.as_bytes()[..name.len().min(NAME_BYTES)];
        record[13..13 + name.len()].copy_from_slice(name);
        // SAFETY: `index` < RECORDS was claimed by this thread alone, so the 32 bytes
        // at `base + index * 32` lie inside the mapping and no one else writes them.
        unsafe {
            std::ptr::copy_nonoverlapping(
                record.as_ptr(),
                self.base.add(index * RECORD_BYTES),
                RECORD_BYTES,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_land_in_the_process_file_in_order() {
        let dir = std::env::temp_dir().join(format!("cumux-hop-{}", std::process::id()));
        let trace = open(&dir).unwrap();
        trace.mark(Hop::ClientSend, "StreamSynchronize");
        trace.mark(Hop::ClientAnswer, "a name longer than nineteen bytes");
        let bytes = std::fs::read(dir.join(format!("{}.hop", std::process::id()))).unwrap();
        assert_eq!(&bytes[..8], MAGIC);
        let record = |i: usize| &bytes[i * RECORD_BYTES..(i + 1) * RECORD_BYTES];
        let time = |i: usize| u64::from_le_bytes(record(i)[..8].try_into().unwrap());
        assert_eq!(record(1)[12], Hop::ClientSend as u8);
        assert_eq!(&record(1)[13..30], b"StreamSynchronize");
        assert_eq!(record(2)[12], Hop::ClientAnswer as u8);
        assert_eq!(&record(2)[13..32], b"a name longer than ");
        assert!(time(1) > 0 && time(2) >= time(1));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
