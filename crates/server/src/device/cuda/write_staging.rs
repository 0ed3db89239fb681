//! Pinned buffers a CUDA context's host-to-device writes pass through on their
//! way from a worker's ring or a socket: filled there, copied by DMA in stream order.

use cumux_cuda_driver::sys::{CU_EVENT_DISABLE_TIMING, CU_MEMHOSTALLOC_PORTABLE};
use cumux_cuda_driver::{Context, Event, PinnedBuffer, Stream};
use cumux_protocol::{CuError, DevicePtr};
use std::sync::Arc;

use super::convert::cu_err;
use crate::device::socket_bytes::{not_arrived, FillBytes};

/// Bytes of one buffer: a piece of a copy, so that filling the next piece
/// overlaps the DMA of this one (as the driver's own staging of pageable
/// memory does; one buffer per 1 MiB copy made a lone copy slower).
const SLOT_BYTES: usize = 256 << 10;
/// Buffers in turn: while some are copied, the next ones fill.
const SLOTS: usize = 16;

/// The buffers, each with the event its last copy recorded.
pub(super) struct WriteStaging {
    slots: Vec<(PinnedBuffer, Event)>,
    next: usize,
}

impl WriteStaging {
    /// [`SLOTS`] pinned buffers of [`SLOT_BYTES`] in `ctx`, for every
    /// context of the process (a capped session's streams are a green
    /// context's).
    pub(super) fn new(ctx: &Arc<Context>) -> Result<WriteStaging, CuError> {
        let slots = (0..SLOTS)
            .map(|_| {
                let buffer = PinnedBuffer::new(ctx, SLOT_BYTES, CU_MEMHOSTALLOC_PORTABLE)?;
                Ok((buffer, Event::new(ctx, CU_EVENT_DISABLE_TIMING)?))
            })
            .collect::<Result<_, _>>()
            .map_err(cu_err)?;
        Ok(WriteStaging { slots, next: 0 })
    }

    /// Queues a write of the `len` bytes `fill` yields to `dst` on `stream`,
    /// a buffer at a time, each copied by DMA: `Ok(false)`, nothing done,
    /// where the buffers it needs are not all free now (one still waits for
    /// its copy, queued behind other work, perhaps of another stream, which
    /// this write must not wait for). A failure of `fill` leaves the pieces
    /// before it queued.
    pub(super) fn write(
        &mut self,
        stream: &Stream,
        dst: DevicePtr,
        len: usize,
        fill: &mut FillBytes<'_>,
    ) -> Result<bool, CuError> {
        let pieces = len.div_ceil(SLOT_BYTES);
        if pieces > SLOTS {
            return Ok(false);
        }
        for k in 0..pieces {
            let (_, copied) = &self.slots[(self.next + k) % SLOTS];
            if !copied.is_done().map_err(cu_err)? {
                return Ok(false);
            }
        }
        let mut at = 0;
        while at < len {
            let n = (len - at).min(SLOT_BYTES);
            let (buffer, copied) = &mut self.slots[self.next];
            self.next = (self.next + 1) % SLOTS;
            let piece = &mut buffer.as_mut_slice()[..n];
            fill(piece).map_err(not_arrived)?;
            // SAFETY: the buffer is pinned and written again only after
            // `copied`, recorded behind this copy, has passed it.
            unsafe { stream.copy_htod_async(dst.wrapping_add(at as u64), piece) }
                .map_err(cu_err)?;
            copied.record(stream).map_err(cu_err)?;
            at += n;
        }
        Ok(true)
    }
}
