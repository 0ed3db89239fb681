//! A session's memory moved in pieces with the device's side on a thread of
//! its own: reads run ahead of a checkpoint's writing, writes behind a restore's reading.

use std::sync::mpsc::{channel, sync_channel};

use cumux_protocol::{codes, CuError, DevicePtr};

use super::image_stream::CHUNK;
use crate::device::DeviceContext;

/// Pieces in flight between the two sides (each at most [`CHUNK`] bytes).
const AHEAD: usize = 2;

/// Hands a piece to write at a device address ([`write_behind`]).
pub(super) type Put<'a> = dyn FnMut(DevicePtr, &[u8]) -> Result<(), CuError> + 'a;

fn side_failed() -> CuError {
    CuError::new(codes::UNKNOWN, "the memory's other side stopped")
}

fn side_panicked() -> CuError {
    CuError::new(codes::UNKNOWN, "the memory's device side panicked")
}

/// Hands each `(ptr, size)` allocation's bytes of `ctx`, in order, to
/// `take` in pieces of at most [`CHUNK`], while a thread reads the next
/// pieces from the device. The first error of either side ends both.
pub(super) fn read_ahead(
    ctx: &dyn DeviceContext,
    allocations: &[(DevicePtr, u64)],
    take: &mut dyn FnMut(&[u8]) -> Result<(), CuError>,
) -> Result<(), CuError> {
    std::thread::scope(|scope| {
        let (pieces, arrived) = sync_channel::<Result<Vec<u8>, CuError>>(AHEAD);
        let (spent, reusable) = channel::<Vec<u8>>();
        let reader = scope.spawn(move || {
            for &(ptr, size) in allocations {
                let mut offset = 0;
                while offset < size {
                    let n = (size - offset).min(CHUNK as u64) as usize;
                    let mut buf = reusable.try_recv().unwrap_or_default();
                    buf.resize(n, 0);
                    let read = ctx.mem_read(ptr + offset, &mut buf).map(|()| buf);
                    let failed = read.is_err();
                    if pieces.send(read).is_err() || failed {
                        return;
                    }
                    offset += n as u64;
                }
            }
        });
        let mut taken = Ok(());
        for piece in arrived.iter() {
            taken = piece.and_then(|buf| {
                take(&buf)?;
                let _ = spent.send(buf);
                Ok(())
            });
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

/// Runs `fill`, whose `put(ptr, bytes)` calls hand pieces to a thread
/// that writes them into `ctx` while `fill` reads on. Returns once every
/// piece is written; the first error of either side ends both.
pub(super) fn write_behind(
    ctx: &dyn DeviceContext,
    fill: &mut dyn FnMut(&mut Put<'_>) -> Result<(), CuError>,
) -> Result<(), CuError> {
    std::thread::scope(|scope| {
        let (pieces, arrived) = sync_channel::<(DevicePtr, Vec<u8>)>(AHEAD);
        let (spent, reusable) = channel::<Vec<u8>>();
        let writer = scope.spawn(move || -> Result<(), CuError> {
            for (ptr, buf) in arrived.iter() {
                ctx.mem_write(ptr, &buf)?;
                let _ = spent.send(buf);
            }
            Ok(())
        });
        let filled = fill(&mut |ptr, bytes| {
            let mut buf = reusable.try_recv().unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(bytes);
            pieces.send((ptr, buf)).map_err(|_| side_failed())
        });
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
    fn pieces_come_in_order_and_errors_of_either_side_end_both() {
        let device = CpuDevice::new(64 << 20);
        let ctx = device.create_context().unwrap();
        let sizes = [CHUNK as u64 * 2 + 5, 300, 1];
        let allocations: Vec<(DevicePtr, u64)> = sizes
            .iter()
            .map(|&n| (ctx.mem_alloc(n).unwrap(), n))
            .collect();
        let pattern =
            |i: usize, n: u64| -> Vec<u8> { (0..n).map(|j| (j % 251) as u8 ^ i as u8).collect() };
        // Written behind: each allocation's pattern, in two pieces.
        write_behind(ctx.as_ref(), &mut |put| {
            for (i, &(ptr, n)) in allocations.iter().enumerate() {
                let bytes = pattern(i, n);
                let half = bytes.len() / 2;
                put(ptr, &bytes[..half])?;
                put(ptr + half as u64, &bytes[half..])?;
            }
            Ok(())
        })
        .unwrap();
        // Read ahead: the same bytes, in order, in pieces of at most CHUNK.
        let mut all = Vec::new();
        read_ahead(ctx.as_ref(), &allocations, &mut |piece| {
            assert!(piece.len() <= CHUNK);
            all.extend_from_slice(piece);
            Ok(())
        })
        .unwrap();
        let want: Vec<u8> = sizes
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| pattern(i, n))
            .collect();
        assert!(all == want, "read back differs");

        // A taker that fails stops the reader; its error comes back.
        let mut pieces = 0;
        let stop = read_ahead(ctx.as_ref(), &allocations, &mut |_| {
            pieces += 1;
            Err(CuError::new(codes::INVALID_VALUE, "disk full"))
        });
        assert_eq!(stop.unwrap_err().detail, "disk full");
        assert_eq!(pieces, 1);
        // A device side that fails: its error, not the other side's.
        let unmapped = allocations[0].0 + (1 << 30);
        let read = read_ahead(ctx.as_ref(), &[(unmapped, 16)], &mut |_| Ok(()));
        assert!(read.is_err());
        let wrote = write_behind(ctx.as_ref(), &mut |put| {
            put(unmapped, &[1, 2, 3])?;
            for _ in 0..8 {
                put(allocations[1].0, &[0; 16])?;
            }
            Ok(())
        });
        let e = wrote.unwrap_err();
        assert_ne!(e.detail, side_failed().detail, "{e:?}");
    }
}
