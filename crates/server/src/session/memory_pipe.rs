//! A session's memory moved in pieces with the device's side on a thread of
//! its own: reads run ahead of a checkpoint's writing, writes behind a restore's reading.

use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cumux_protocol::{codes, CuError, DevicePtr};

use super::image_stream::{Piece, CHUNK};
use super::stage_times::{Stage, StageTimes};
use crate::device::pieces::TakePiece;
use crate::device::DeviceContext;

/// Pieces in flight between the two sides (each at most [`CHUNK`] bytes).
const AHEAD: usize = 2;
/// Pieces a checkpoint's device side reads ahead of their packing: enough
/// to keep a worker's answers coming while the pool is busy, few enough to
/// bound the memory they hold (32 MiB).
const READ_AHEAD: usize = 8;
/// Bytes asked of the device in one go ([`DeviceContext::mem_read_pieces`]),
/// answered piece by piece.
pub(super) const SPAN: u64 = 64 << 20;

/// Hands on a piece at a device address ([`write_behind`], and what
/// `DeviceContext::mem_read_pieces` takes): the device layer's own type.
pub(super) type Put<'a> = TakePiece<'a>;

/// Where a rebuild's memory comes from: each allocation's bytes in turn.
pub(super) trait MemorySource {
    /// Hands each `(ptr, size)` allocation's bytes, in order, to
    /// `put(address, piece)`, taking the buffers it fills from `buffers`.
    fn pour(
        &mut self,
        allocations: &[(DevicePtr, u64)],
        buffers: &Buffers,
        put: &mut Put<'_>,
    ) -> Result<(), CuError>;

    /// Called after the last allocation: a stream checks its trailer here.
    fn finish(&mut self) -> Result<(), CuError> {
        Ok(())
    }

    /// The context the bytes come from, where they come from one: a move
    /// then tries copying them device to device instead.
    fn context(&self) -> Option<&dyn DeviceContext> {
        None
    }
}

/// Buffers of a chunk each, handed back by the side that spent them to the
/// side that fills them, so memory passes without a fresh allocation each
/// time. Lives as long as one checkpoint or restore.
#[derive(Clone, Default)]
pub(super) struct Buffers(Arc<Mutex<Vec<Vec<u8>>>>);

/// Buffers kept at most: those in flight come back.
const KEPT: usize = 256;

impl Buffers {
    /// A buffer of `len` bytes (their values whatever they were).
    pub(super) fn take(&self, len: usize) -> Vec<u8> {
        let kept = self.0.lock().ok().and_then(|mut kept| kept.pop());
        let mut buf = kept.unwrap_or_default();
        buf.resize(len, 0);
        buf
    }

    /// A buffer spent; kept if it is a chunk's size.
    pub(super) fn give(&self, buf: Vec<u8>) {
        if buf.capacity() >= CHUNK {
            if let Ok(mut kept) = self.0.lock() {
                if kept.len() < KEPT {
                    kept.push(buf);
                }
            }
        }
    }
}

fn side_failed() -> CuError {
    CuError::new(codes::UNKNOWN, "the memory's other side stopped")
}

fn side_panicked() -> CuError {
    CuError::new(codes::UNKNOWN, "the memory's device side panicked")
}

/// Hands each `(ptr, size)` allocation's bytes of `ctx`, in order, to
/// `take(address, piece)` in pieces of at most [`CHUNK`] (bytes in buffers
/// from `buffers`, which `take` may give back, or a fill the device side
/// found), while a thread reads the next pieces from the device, a span at
/// a time. The first error of either side ends both. `times` gets the
/// device side's busy time and the caller's waits for it.
pub(super) fn read_ahead(
    ctx: &dyn DeviceContext,
    allocations: &[(DevicePtr, u64)],
    buffers: &Buffers,
    times: &StageTimes,
    take: &mut dyn FnMut(DevicePtr, Piece) -> Result<(), CuError>,
) -> Result<(), CuError> {
    std::thread::scope(|scope| {
        let (pieces, arrived) = sync_channel::<Result<(DevicePtr, Piece), CuError>>(READ_AHEAD);
        let reader = scope.spawn(move || {
            let started = Instant::now();
            let mut handing = std::time::Duration::ZERO;
            let read = read_allocations(ctx, allocations, buffers, &mut |at, piece| {
                let sent = Instant::now();
                let gone = pieces.send(Ok((at, piece))).is_err();
                handing += sent.elapsed();
                if gone {
                    return Err(side_failed());
                }
                Ok(())
            });
            let busy = started.elapsed().saturating_sub(handing);
            times.add_time(Stage::DeviceBusy, busy);
            if let Err(e) = read {
                // A taker gone needs no word; the device's error does.
                let _ = pieces.send(Err(e));
            }
        });
        let mut taken = Ok(());
        loop {
            let waited = Instant::now();
            let Ok(piece) = arrived.recv() else {
                break;
            };
            times.add(Stage::ReadWait, waited);
            taken = piece.and_then(|(at, piece)| take(at, piece));
            if taken.is_err() {
                break;
            }
        }
        // Dropping the receiver first lets a reader blocked on a full
        // channel see the end.
        drop(arrived);
        match reader.join() {
            Ok(()) => taken,
            Err(_) => taken.and(Err(side_panicked())),
        }
    })
}

/// Reads each `(ptr, size)` allocation of `ctx`, in order, a [`SPAN`] at a
/// time ([`DeviceContext::mem_read_pieces`]), handing `take` its pieces of
/// at most [`CHUNK`] (bytes in buffers from `buffers`, or fills). The first
/// error ends it.
pub(super) fn read_allocations(
    ctx: &dyn DeviceContext,
    allocations: &[(DevicePtr, u64)],
    buffers: &Buffers,
    take: &mut Put<'_>,
) -> Result<(), CuError> {
    for &(ptr, size) in allocations {
        let mut offset = 0;
        while offset < size {
            let n = (size - offset).min(SPAN);
            let buffer = &mut |len| buffers.take(len);
            ctx.mem_read_pieces(ptr + offset, n, CHUNK, buffer, take)?;
            offset += n;
        }
    }
    Ok(())
}

/// Runs `fill`, whose `put(ptr, piece)` calls hand pieces to a thread that
/// writes them into `ctx` (a fill as the device's own fill) while `fill`
/// reads on; spent buffers go back to `buffers`. Returns once every piece
/// is written; the first error of either side ends both.
pub(super) fn write_behind(
    ctx: &dyn DeviceContext,
    buffers: &Buffers,
    fill: &mut dyn FnMut(&mut Put<'_>) -> Result<(), CuError>,
) -> Result<(), CuError> {
    std::thread::scope(|scope| {
        let (pieces, arrived) = sync_channel::<(DevicePtr, Piece)>(AHEAD);
        let writer = scope.spawn(move || -> Result<(), CuError> {
            for (ptr, piece) in arrived.iter() {
                match piece {
                    Piece::Bytes(buf) => {
                        ctx.mem_write(ptr, &buf)?;
                        buffers.give(buf);
                    }
                    Piece::Fill { value, len } => ctx.mem_fill(ptr, &[value], len)?,
                }
            }
            Ok(())
        });
        let filled = fill(&mut |ptr, piece| pieces.send((ptr, piece)).map_err(|_| side_failed()));
        drop(pieces);
        let written = writer.join().unwrap_or_else(|_| Err(side_panicked()));
        // The writer's own error says more than the "stopped" it caused.
        match (filled, written) {
            (_, Err(e)) => Err(e),
            (Err(e), Ok(())) => Err(e),
            (Ok(()), Ok(())) => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::CpuDevice;
    use crate::device::Device;

    #[test]
    fn pieces_come_in_order_fills_are_written_and_errors_of_either_side_end_both() {
        let device = CpuDevice::new(64 << 20);
        let ctx = device.create_context().unwrap();
        let sizes = [CHUNK as u64 * 2 + 5, 300, 1];
        let allocations: Vec<(DevicePtr, u64)> = sizes
            .iter()
            .map(|&n| (ctx.mem_alloc(n).unwrap(), n))
            .collect();
        let pattern =
            |i: usize, n: u64| -> Vec<u8> { (0..n).map(|j| (j % 251) as u8 ^ i as u8).collect() };
        let buffers = Buffers::default();
        // Written behind: each allocation's pattern, in two pieces.
        write_behind(ctx.as_ref(), &buffers, &mut |put| {
            for (i, &(ptr, n)) in allocations.iter().enumerate() {
                let bytes = pattern(i, n);
                let half = bytes.len() / 2;
                put(ptr, Piece::Bytes(bytes[..half].to_vec()))?;
                put(ptr + half as u64, Piece::Bytes(bytes[half..].to_vec()))?;
            }
            Ok(())
        })
        .unwrap();
        // Read ahead: the same bytes, in order, in pieces of at most CHUNK.
        let mut all = Vec::new();
        let mut next = allocations[0].0;
        let times = StageTimes::default();
        read_ahead(
            ctx.as_ref(),
            &allocations,
            &buffers,
            &times,
            &mut |at, piece| {
                let Piece::Bytes(piece) = piece else {
                    panic!("a CPU context's reads are bytes");
                };
                assert!(piece.len() <= CHUNK);
                assert!(at == next || allocations.iter().any(|a| a.0 == at));
                next = at + piece.len() as u64;
                all.extend_from_slice(&piece);
                buffers.give(piece);
                Ok(())
            },
        )
        .unwrap();
        assert!(times.get(Stage::DeviceBusy) > std::time::Duration::ZERO);
        let want: Vec<u8> = sizes
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| pattern(i, n))
            .collect();
        assert!(all == want, "read back differs");
        // A fill is the device's own, over exactly its bytes.
        let (ptr, n) = allocations[0];
        write_behind(ctx.as_ref(), &buffers, &mut |put| {
            put(
                ptr + 1,
                Piece::Fill {
                    value: 0xa7,
                    len: n - 2,
                },
            )
        })
        .unwrap();
        let mut back = vec![0u8; n as usize];
        ctx.mem_read(ptr, &mut back).unwrap();
        let first = pattern(0, n);
        assert_eq!(
            (back[0], back[n as usize - 1]),
            (first[0], first[n as usize - 1])
        );
        assert!(back[1..n as usize - 1].iter().all(|&b| b == 0xa7));

        // A taker that fails stops the reader; its error comes back.
        let mut pieces = 0;
        let stop = read_ahead(ctx.as_ref(), &allocations, &buffers, &times, &mut |_, _| {
            pieces += 1;
            Err(CuError::new(codes::INVALID_VALUE, "disk full"))
        });
        assert_eq!(stop.unwrap_err().detail, "disk full");
        assert_eq!(pieces, 1);
        // A device side that fails: its error, not the other side's.
        let unmapped = allocations[0].0 + (1 << 30);
        let read = read_ahead(
            ctx.as_ref(),
            &[(unmapped, 16)],
            &buffers,
            &times,
            &mut |_, _| Ok(()),
        );
        assert!(read.is_err());
        let wrote = write_behind(ctx.as_ref(), &buffers, &mut |put| {
            put(unmapped, Piece::Bytes(vec![1, 2, 3]))?;
            for _ in 0..8 {
                put(allocations[1].0, Piece::Bytes(vec![0; 16]))?;
            }
            Ok(())
        });
        let e = wrote.unwrap_err();
        assert_ne!(e.detail, side_failed().detail, "{e:?}");
    }
}
