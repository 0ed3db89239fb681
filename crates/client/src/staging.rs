//! Large synchronous copies of pageable memory through a pinned staging
//! buffer of the client's own: two slots, filled and drained in turn.
//!
//! A `cudaMemcpy` of 1 MiB or more between device memory and pageable memory
//! is cut into slot-sized chunks. Host to device: the client copies a chunk
//! into a slot and queues `MemcpyHtoDHost` from it (no bytes on the wire)
//! while the previous slot's copy runs; device to host: the copy of the next
//! chunk into one slot runs while the client copies the other slot out. An
//! event per slot (recorded after its copy) says when the slot may be reused.
//! The copies go on the legacy default stream and the call returns once the
//! last is done, as a synchronous copy does. Asynchronous copies of pageable
//! memory keep the old route: their bytes are taken at the call.

use std::os::fd::AsFd;
use std::sync::{Mutex, MutexGuard, TryLockError};

use cumux_protocol::pinned::{create_memfd, HostMapping};
use cumux_protocol::{Call, Handle, ReplyBody, DEFAULT_STREAM};

use crate::errors::*;
use crate::state::Client;

/// Copies this large or larger are staged.
pub const MIN_BYTES: usize = 1 << 20;
/// Bytes of one slot.
pub const SLOT_BYTES: usize = 4 << 20;
/// `CU_EVENT_DISABLE_TIMING`.
const EVENT_DISABLE_TIMING: u32 = 0x2;

/// The staging buffer, once set up.
pub struct Staging {
    region: Handle,
    mapping: HostMapping,
    /// Recorded after the latest copy through each slot.
    events: [Handle; 2],
}

/// The client's staging buffer: made at the first large copy; `Err` when
/// the server would not take it (copies then keep the old route).
#[derive(Default)]
pub struct StagingSlot(Mutex<Option<Result<Staging, ()>>>);

impl Staging {
    fn setup(c: &Client) -> CuResult<Staging> {
        let len = (2 * SLOT_BYTES) as u64;
        let fd = create_memfd(len).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        let mapping = HostMapping::map(fd.as_fd(), len).map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
        let call = Call::HostRegister {
            base: mapping.as_ptr() as u64,
            bytes: len,
        };
        let region = match c.register_host(call, fd.as_fd())? {
            ReplyBody::Handle(h) => h,
            _ => return Err(CUDA_ERROR_UNKNOWN),
        };
        let mut events = [0; 2];
        for e in &mut events {
            *e = match c.call(Call::EventCreate {
                flags: EVENT_DISABLE_TIMING,
            })? {
                ReplyBody::Handle(h) => h,
                _ => return Err(CUDA_ERROR_UNKNOWN),
            };
        }
        Ok(Staging {
            region,
            mapping,
            events,
        })
    }

    fn slot(&self, i: usize) -> u64 {
        ((i % 2) * SLOT_BYTES) as u64
    }

    /// Queues a copy through slot `i % 2` and records the slot's event after it.
    fn post(&self, c: &Client, call: Call, i: usize) -> CuResult<()> {
        c.call(call)?;
        c.call(Call::EventRecord {
            event: self.events[i % 2],
            stream: DEFAULT_STREAM,
        })?;
        Ok(())
    }

    /// Waits until slot `i % 2`'s latest copy is done.
    fn wait(&self, c: &Client, i: usize) -> CuResult<()> {
        c.call(Call::EventSynchronize {
            event: self.events[i % 2],
        })
        .map(|_| ())
    }
}

/// The staging buffer for one copy, unless another thread is using it or it
/// cannot be had (then `None`: the copy takes the old route).
fn take(c: &Client) -> Option<MutexGuard<'_, Option<Result<Staging, ()>>>> {
    let mut guard = match c.staging.0.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => return None,
    };
    if guard.is_none() {
        if !crate::pinned::enabled() {
            *guard = Some(Err(()));
            return None;
        }
        *guard = Some(Staging::setup(c).map_err(|e| {
            tracing::debug!("no staging buffer ({e}); large pageable copies carry their bytes");
        }));
    }
    matches!(&*guard, Some(Ok(_))).then_some(guard)
}

/// A synchronous copy of `src` (pageable) to `dst` through the staging
/// buffer; `None` when it is not to be staged.
pub fn htod(c: &Client, dst: u64, src: &[u8]) -> Option<CuResult<()>> {
    if src.len() < MIN_BYTES {
        return None;
    }
    let guard = take(c)?;
    let Some(Ok(s)) = &*guard else { return None };
    let run = || -> CuResult<()> {
        for (i, chunk) in src.chunks(SLOT_BYTES).enumerate() {
            if i >= 2 {
                s.wait(c, i)?;
            }
            // SAFETY: the slot's previous copy is done (waited above), and
            // the guard keeps other threads of this process out of the buffer.
            let slot = unsafe { s.mapping.bytes_mut(s.slot(i), chunk.len() as u64) }
                .ok_or(CUDA_ERROR_UNKNOWN)?;
            slot.copy_from_slice(chunk);
            let call = Call::MemcpyHtoDHost {
                dst: dst + (i * SLOT_BYTES) as u64,
                region: s.region,
                offset: s.slot(i),
                bytes: chunk.len() as u64,
                stream: Some(DEFAULT_STREAM),
            };
            s.post(c, call, i)?;
        }
        c.call(Call::StreamSynchronize {
            stream: DEFAULT_STREAM,
        })
        .map(|_| ())
    };
    Some(run())
}

/// A synchronous copy from `src` into `dst` (pageable) through the staging
/// buffer; `None` when it is not to be staged.
pub fn dtoh(c: &Client, dst: &mut [u8], src: u64) -> Option<CuResult<()>> {
    if dst.len() < MIN_BYTES {
        return None;
    }
    let guard = take(c)?;
    let Some(Ok(s)) = &*guard else { return None };
    let total = dst.len();
    let chunks = total.div_ceil(SLOT_BYTES);
    let fetch = |i: usize| {
        let at = i * SLOT_BYTES;
        let len = SLOT_BYTES.min(total - at);
        Call::MemcpyDtoHHost {
            src: src + at as u64,
            region: s.region,
            offset: s.slot(i),
            bytes: len as u64,
            stream: Some(DEFAULT_STREAM),
        }
    };
    let mut run = || -> CuResult<()> {
        for i in 0..chunks.min(2) {
            s.post(c, fetch(i), i)?;
        }
        for (i, out) in dst.chunks_mut(SLOT_BYTES).enumerate() {
            s.wait(c, i)?;
            let slot = s
                .mapping
                .bytes(s.slot(i), out.len() as u64)
                .ok_or(CUDA_ERROR_UNKNOWN)?;
            out.copy_from_slice(slot);
            if i + 2 < chunks {
                s.post(c, fetch(i + 2), i)?;
            }
        }
        Ok(())
    };
    Some(run())
}
