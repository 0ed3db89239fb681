//! Synchronous copies of pageable memory through a pinned staging buffer of
//! the client's own: two slots, filled and drained in turn.
//!
//! A `cudaMemcpy` between device memory and pageable memory, of any size, is
//! cut into slot-sized chunks (a small one is one chunk: the device reaches
//! the slot directly, which beats carrying the bytes through the server at
//! every size). Host to device: the client copies a chunk
//! into a slot and queues `MemcpyHtoDHost` from it (no bytes on the wire)
//! while the previous slot's copy runs; device to host: the copy of the next
//! chunk into one slot runs while the client copies the other slot out. An
//! event per slot (recorded after its copy) says when the slot may be reused.
//! The copies go on the legacy default stream and the call returns once the
//! last is done, as a synchronous copy does. Asynchronous copies of pageable
//! memory keep the old route: their bytes are taken at the call.
//!
//! The buffer lives in the state (`State::staging`), lent to one copy at a
//! time (`State::borrow_staging`); a copy that finds it lent, or made for
//! another of the program's devices, takes the old route too.

use std::os::fd::AsFd;
use std::sync::OnceLock;

use cumux_cuda_bindings::consts::CU_EVENT_DISABLE_TIMING;
use cumux_protocol::pinned::{create_memfd, HostMapping};
use cumux_protocol::{Call, ReplyBody, DEFAULT_STREAM};

use crate::errors::*;
use crate::state::{Client, StagingBuffer, StagingLoan};

/// Copies this large or larger are staged: all but empty ones.
pub const MIN_BYTES: usize = 1;
/// Bytes of one slot.
pub const SLOT_BYTES: usize = 4 << 20;

/// The buffer a loan gives: made now if nobody made it yet. `None` when it
/// cannot be had (`CUMUX_PINNED=off`, or the server would not take it), or
/// for a program that may resume elsewhere: host memory shared with one
/// server cannot move to another, and would keep its session from moving.
pub fn buffer(c: &Client, loan: StagingLoan, device: u32) -> Option<StagingBuffer> {
    match loan {
        StagingLoan::Ready(buffer) => Some(buffer),
        StagingLoan::ToMake if !crate::pinned::enabled() || crate::resume::wanted() => None,
        StagingLoan::ToMake => setup(c, device)
            .map_err(|e| {
                tracing::debug!("no staging buffer ({e}); large pageable copies carry their bytes");
            })
            .ok(),
    }
}

fn setup(c: &Client, device: u32) -> CuResult<StagingBuffer> {
    let len = (2 * SLOT_BYTES) as u64;
    let fd = create_memfd(len).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    let mapping = HostMapping::map(fd.as_fd(), len).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    let call = Call::HostRegister {
        base: mapping.as_ptr() as u64,
        bytes: len,
        reached: false,
    };
    let region = match c.call_with_fd_on(device, call, fd.as_fd())? {
        ReplyBody::Handle(h) => h,
        _ => return Err(CUDA_ERROR_UNKNOWN),
    };
    let mut events = [0; 2];
    for e in &mut events {
        *e = c.new_event(device, CU_EVENT_DISABLE_TIMING)?;
    }
    Ok(StagingBuffer {
        device,
        region,
        mapping,
        events,
    })
}

/// Copies at least this large are split across the copy threads (a 1 MiB
/// copy split four ways was once slower on the H100 than one thread's).
const PARALLEL_BYTES: usize = 2 << 20;
/// At most this many threads copy one slot.
const MAX_COPY_THREADS: usize = 4;

/// The threads that fill and drain slots: none where the machine has one
/// core (or they could not be started), and none in a forked child, which
/// has no threads of its parent's.
fn copy_threads() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<(u32, Option<rayon::ThreadPool>)> = OnceLock::new();
    let (owner, pool) = POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(MAX_COPY_THREADS);
        let pool = (threads > 1)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("cumux-copy-{i}"))
                    .build()
                    .ok()
            })
            .flatten();
        (std::process::id(), pool)
    });
    pool.as_ref().filter(|_| *owner == std::process::id())
}

/// `dst.copy_from_slice(src)`, by several threads for a large copy.
fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    match copy_threads() {
        Some(pool) if dst.len() >= PARALLEL_BYTES => {
            let part = dst.len().div_ceil(pool.current_num_threads());
            pool.scope(|s| {
                for (d, from) in dst.chunks_mut(part).zip(src.chunks(part)) {
                    s.spawn(move |_| d.copy_from_slice(from));
                }
            });
        }
        _ => dst.copy_from_slice(src),
    }
}

fn slot(i: usize) -> u64 {
    ((i % 2) * SLOT_BYTES) as u64
}

/// Queues a copy through slot `i % 2` and records the slot's event after it.
fn post(c: &Client, b: &StagingBuffer, call: Call, i: usize) -> CuResult<()> {
    c.call_on(b.device, call)?;
    c.call_on(
        b.device,
        Call::EventRecord {
            event: b.events[i % 2],
            stream: DEFAULT_STREAM,
        },
    )?;
    Ok(())
}

/// Waits until slot `i % 2`'s latest copy is done.
fn wait(c: &Client, b: &StagingBuffer, i: usize) -> CuResult<()> {
    c.call_on(
        b.device,
        Call::EventSynchronize {
            event: b.events[i % 2],
        },
    )
    .map(|_| ())
}

/// A synchronous copy of `src` (pageable) to `dst` through the buffer.
pub fn htod(c: &Client, b: &StagingBuffer, dst: u64, src: &[u8]) -> CuResult<()> {
    for (i, chunk) in src.chunks(SLOT_BYTES).enumerate() {
        if i >= 2 {
            wait(c, b, i)?;
        }
        // SAFETY: the slot's previous copy is done (waited above), and the
        // buffer is lent to this copy alone.
        let slot_bytes = unsafe { b.mapping.bytes_mut(slot(i), chunk.len() as u64) }
            .ok_or(CUDA_ERROR_UNKNOWN)?;
        copy_bytes(slot_bytes, chunk);
        let call = Call::MemcpyHtoDHost {
            dst: dst + (i * SLOT_BYTES) as u64,
            region: b.region,
            offset: slot(i),
            bytes: chunk.len() as u64,
            stream: Some(DEFAULT_STREAM),
        };
        post(c, b, call, i)?;
    }
    c.call_on(
        b.device,
        Call::StreamSynchronize {
            stream: DEFAULT_STREAM,
        },
    )
    .map(|_| ())
}

/// A synchronous copy from `src` into `dst` (pageable) through the buffer.
pub fn dtoh(c: &Client, b: &StagingBuffer, dst: &mut [u8], src: u64) -> CuResult<()> {
    let total = dst.len();
    let chunks = total.div_ceil(SLOT_BYTES);
    let fetch = |i: usize| {
        let at = i * SLOT_BYTES;
        let len = SLOT_BYTES.min(total - at);
        Call::MemcpyDtoHHost {
            src: src + at as u64,
            region: b.region,
            offset: slot(i),
            bytes: len as u64,
            stream: Some(DEFAULT_STREAM),
        }
    };
    for i in 0..chunks.min(2) {
        post(c, b, fetch(i), i)?;
    }
    for (i, out) in dst.chunks_mut(SLOT_BYTES).enumerate() {
        wait(c, b, i)?;
        let slot_bytes = b
            .mapping
            .bytes(slot(i), out.len() as u64)
            .ok_or(CUDA_ERROR_UNKNOWN)?;
        copy_bytes(out, slot_bytes);
        if i + 2 < chunks {
            post(c, b, fetch(i + 2), i)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_copied_by_several_threads_is_the_bytes_in_order() {
        for len in [
            0,
            1,
            PARALLEL_BYTES - 1,
            PARALLEL_BYTES,
            SLOT_BYTES - 3,
            SLOT_BYTES,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
            let mut dst = vec![0u8; len];
            copy_bytes(&mut dst, &src);
            assert!(dst == src, "a copy of {len} bytes differs");
        }
    }
}
