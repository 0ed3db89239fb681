//! A checkpoint's chunks packed and checked on a thread pool (issue 17), the
//! device, the pool and the file busy at once, the chunks kept in order.
//!
//! Checkpoint: a thread reads the device ahead (`memory_pipe::read_ahead`),
//! each chunk is packed on the pool (`image_stream::Packer`: fill, zstd or
//! raw, and its checksum), and the calling thread writes the records in
//! order. Restore: a thread reads the records, each is checked and unpacked
//! on the pool (`image_stream::Unpacker`), and the calling thread hands
//! them in order to the device's writer (`memory_pipe::write_behind`). At
//! most [`window`] chunks are on the pool at once.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cumux_protocol::{codes, CuError, DevicePtr};

use super::image_stream::{Packer, Piece, Record, StreamReader, StreamWriter, Unpacker};
use super::memory_pipe::{self, Buffers, MemorySource, Put};
use super::stage_times::{Stage, StageTimes};
use crate::device::DeviceContext;

thread_local! {
    static PACKER: RefCell<Packer> = RefCell::new(Packer::default());
    static UNPACKER: RefCell<Unpacker> = RefCell::new(Unpacker::default());
}

/// The pool's threads: one a core.
pub(super) fn threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// Chunks on the pool at once: enough to keep every thread busy while the
/// file or the device waits.
pub(super) fn window() -> usize {
    2 * threads()
}

/// The pool chunks are packed and checked on, made at first use. A panic
/// in a job ends that job alone: its chunk's answer never comes, which the
/// waiting side reports.
fn pool() -> Result<&'static rayon::ThreadPool, CuError> {
    static POOL: OnceLock<Result<rayon::ThreadPool, String>> = OnceLock::new();
    let pool = POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads())
            .thread_name(|i| format!("cumux-image-{i}"))
            .panic_handler(|_| tracing::error!("a checkpoint chunk's packing or check panicked"))
            .build()
            .map_err(|e| e.to_string())
    });
    pool.as_ref().map_err(|e| {
        CuError::new(
            codes::UNKNOWN,
            format!("no threads for the checkpoint: {e}"),
        )
    })
}

fn lost(index: u64) -> CuError {
    CuError::new(
        codes::UNKNOWN,
        format!("chunk {index} of the checkpoint was lost: its packing or check panicked"),
    )
}

/// Each `(ptr, size)` allocation of `ctx` into `writer`, read from the
/// device a few chunks ahead and packed on the pool; where the time went
/// into `times`.
pub(super) fn write_memory<W: Write>(
    ctx: &dyn DeviceContext,
    allocations: &[(DevicePtr, u64)],
    writer: &mut StreamWriter<W>,
    times: &StageTimes,
) -> Result<(), CuError> {
    let pool = pool()?;
    let buffers = Buffers::default();
    let key = writer.key();
    let window = window();
    let mut packing: VecDeque<(u64, Receiver<Packed>)> = VecDeque::with_capacity(window + 1);
    let mut index = 0u64;
    memory_pipe::read_ahead(ctx, allocations, &buffers, times, &mut |at, piece| {
        let (done, packed) = sync_channel(1);
        let i = index;
        index += 1;
        pool.spawn(move || {
            let started = Instant::now();
            let record = PACKER.with(|p| p.borrow_mut().encode_piece(&key, i, at, piece));
            let _ = done.send((record, started.elapsed()));
        });
        packing.push_back((i, packed));
        while packing.len() > window {
            write_first(&mut packing, writer, &buffers, times)?;
        }
        Ok(())
    })?;
    while !packing.is_empty() {
        write_first(&mut packing, writer, &buffers, times)?;
    }
    Ok(())
}

/// A chunk's record, and the time its packing took.
type Packed = (Record, Duration);

/// The first chunk on the pool, once packed, into `writer`.
fn write_first<W: Write>(
    packing: &mut VecDeque<(u64, Receiver<Packed>)>,
    writer: &mut StreamWriter<W>,
    buffers: &Buffers,
    times: &StageTimes,
) -> Result<(), CuError> {
    let Some((index, packed)) = packing.pop_front() else {
        return Ok(());
    };
    let (record, packing) =
        times.timed(Stage::PackWait, || packed.recv().map_err(|_| lost(index)))?;
    times.add_time(Stage::PackBusy, packing);
    times.timed(Stage::Write, || writer.put(&record))?;
    buffers.give(record.stored);
    Ok(())
}

/// A chunk checked and unpacked: where it goes and its memory.
type Checked = Result<(DevicePtr, Piece), CuError>;

impl<R: Read + Send> MemorySource for StreamReader<R> {
    /// Records read on a thread of their own, checked and unpacked on the
    /// pool, handed to `put` in order.
    fn pour(
        &mut self,
        allocations: &[(DevicePtr, u64)],
        buffers: &Buffers,
        put: &mut Put<'_>,
    ) -> Result<(), CuError> {
        let pool = pool()?;
        std::thread::scope(|scope| {
            let (checking, checked) = sync_channel::<(u64, Receiver<Checked>)>(window());
            let reader = scope.spawn(move || {
                let key = self.key();
                let mut index = 0u64;
                for &(ptr, size) in allocations {
                    let mut offset = 0;
                    while offset < size {
                        let at = ptr + offset;
                        let (done, answer) = sync_channel::<Checked>(1);
                        match self.record(at, size - offset, buffers.take(0)) {
                            Ok(record) => {
                                offset += record.raw_len();
                                let buffers = buffers.clone();
                                pool.spawn(move || {
                                    let _ = done.send(check(&key, record, &buffers));
                                });
                            }
                            Err(e) => {
                                let _ = done.send(Err(e));
                                let _ = checking.send((index, answer));
                                return;
                            }
                        }
                        if checking.send((index, answer)).is_err() {
                            return;
                        }
                        index += 1;
                    }
                }
            });
            let mut poured = Ok(());
            for (index, answer) in checked.iter() {
                poured = answer
                    .recv()
                    .unwrap_or_else(|_| Err(lost(index)))
                    .and_then(|(at, piece)| put(at, piece));
                if poured.is_err() {
                    break;
                }
            }
            // Dropping the receiver lets a reader blocked on a full channel
            // see the end; its own errors came through the channel.
            drop(checked);
            match reader.join() {
                Ok(()) => poured,
                Err(_) => poured.and(Err(CuError::new(
                    codes::UNKNOWN,
                    "the checkpoint's reader panicked",
                ))),
            }
        })
    }

    fn finish(&mut self) -> Result<(), CuError> {
        StreamReader::finish(self)
    }
}

/// `record` checked under `key` and unpacked (on a pool thread).
fn check(key: &super::image_stream::Digest, record: Record, buffers: &Buffers) -> Checked {
    let at = record.at;
    let (piece, spent) =
        UNPACKER.with(|u| u.borrow_mut().decode(key, record, || buffers.take(0)))?;
    if let Some(spent) = spent {
        buffers.give(spent);
    }
    Ok((at, piece))
}

#[cfg(test)]
mod tests {
    use super::super::file_writeback::Writeback;
    use super::super::image::{Allocation, SessionImage};
    use super::super::image_stream::{extents, Packer, Record, Unpacker, CHUNK};
    use super::*;
    use crate::device::cpu::CpuDevice;
    use crate::device::Device;

    /// Chunk `i`'s bytes: zeros, one value, runs, or noise, by turns.
    fn chunk_bytes(i: usize, n: usize) -> Vec<u8> {
        let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (0..n)
            .map(|j| match i % 4 {
                0 => 0,
                1 => 0x5a,
                2 => (j / 4096) as u8,
                _ => {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                }
            })
            .collect()
    }

    #[test]
    fn many_chunks_go_through_the_pool_in_order_and_a_bad_one_is_named() {
        let device = CpuDevice::new(256 << 20);
        let from = device.create_context().unwrap();
        // More chunks than the window, and an allocation of an odd size.
        let sizes = [(window() * 2 + 3) * CHUNK + 1001, 77];
        let mut image = SessionImage::empty(1);
        let mut want = Vec::new();
        for size in sizes {
            let ptr = from.mem_alloc(size as u64).unwrap();
            let bytes: Vec<u8> = (0..size.div_ceil(CHUNK))
                .flat_map(|i| chunk_bytes(i, CHUNK))
                .take(size)
                .collect();
            from.mem_write(ptr, &bytes).unwrap();
            image.allocations.push(Allocation {
                ptr,
                size: size as u64,
            });
            want.push(bytes);
        }
        let mut writer = StreamWriter::start(Vec::new(), &image).unwrap();
        write_memory(
            from.as_ref(),
            &extents(&image),
            &mut writer,
            &StageTimes::default(),
        )
        .unwrap();
        assert!(writer.filled >= 2 * CHUNK as u64 && writer.compressed > 0);
        let bytes = writer.finish().unwrap().0;
        // The same stream as one written on the calling thread.
        let all = want.concat();
        let plain = super::super::image_stream::written(Vec::new(), &image, &all).unwrap();
        assert!(plain.0 == bytes);

        // Read back into fresh memory of another context.
        let to = device.create_context().unwrap();
        let restore = |stream: &[u8]| -> Result<Vec<Vec<u8>>, CuError> {
            let targets: Vec<(DevicePtr, u64)> = sizes
                .iter()
                .map(|&n| (to.mem_alloc(n as u64).unwrap(), n as u64))
                .collect();
            let (mut reader, read) = StreamReader::open(stream)?;
            let offsets: Vec<(DevicePtr, u64)> = extents(&read);
            let buffers = Buffers::default();
            let moved = |at: DevicePtr| {
                let i = offsets
                    .iter()
                    .position(|&(p, n)| at >= p && at < p + n)
                    .unwrap();
                targets[i].0 + (at - offsets[i].0)
            };
            memory_pipe::write_behind(to.as_ref(), &buffers, &mut |put| {
                reader.pour(&offsets, &buffers, &mut |at, piece| put(moved(at), piece))
            })?;
            MemorySource::finish(&mut reader)?;
            Ok(targets
                .iter()
                .map(|&(p, n)| {
                    let mut back = vec![0; n as usize];
                    to.mem_read(p, &mut back).unwrap();
                    back
                })
                .collect())
        };
        assert!(restore(&bytes).unwrap() == want);
        // A byte changed in chunk 7 (noise, stored raw): refused, naming it.
        let mut corrupt = bytes.clone();
        let needle = &all[7 * CHUNK + 100..7 * CHUNK + 164];
        let at = corrupt.windows(64).position(|w| w == needle).unwrap();
        corrupt[at + 10] ^= 1;
        let why = restore(&corrupt).unwrap_err().detail;
        assert!(
            why.contains("chunk 7 (") && why.contains("does not match its checksum"),
            "{why}"
        );
        // Cut short: refused as truncated.
        let why = restore(&bytes[..bytes.len() / 2]).unwrap_err().detail;
        assert!(why.contains("truncated"), "{why}");
    }

    /// The format and the pool alone, from a CPU context's memory (a copy)
    /// to a file and back: `CUMUX_IMAGE_BENCH_MIB` MiB (default 1024) of
    /// half noise and half one value (as `bench/h100/migrate.sh`'s disk
    /// part), then of runs that compress; into `CUMUX_IMAGE_BENCH_FILE`
    /// (default in the temp folder), synced, and into memory. Run with
    /// `cargo test --release -p cumux-server --lib image_pipeline::tests::throughput
    /// -- --ignored --nocapture` (`taskset` picks the pool's cores).
    #[test]
    #[ignore]
    fn throughput() {
        use std::time::Instant;
        let mib: usize = std::env::var("CUMUX_IMAGE_BENCH_MIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1024);
        let path = std::env::var("CUMUX_IMAGE_BENCH_FILE")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|_| std::env::temp_dir().join("cumux-image-bench.ckpt"));
        let size = mib << 20;
        let device = CpuDevice::new(2 * size as u64 + (64 << 20));
        let (from, to) = (
            device.create_context().unwrap(),
            device.create_context().unwrap(),
        );
        let (ptr, back) = (
            from.mem_alloc(size as u64).unwrap(),
            to.mem_alloc(size as u64).unwrap(),
        );
        let image = SessionImage {
            allocations: vec![Allocation {
                ptr,
                size: size as u64,
            }],
            ..SessionImage::empty(1)
        };
        let gbs = |t: std::time::Duration| size as f64 / t.as_secs_f64() / 1e9;
        println!("threads {}, {mib} MiB, file {}", threads(), path.display());
        for (name, mix) in [("half noise, half one value", 0), ("runs (zstd)", 1)] {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let bytes: Vec<u8> = (0..size)
                .map(|i| match (mix, i < size / 2) {
                    (0, true) => {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    }
                    (0, false) => 0x5a,
                    _ => (i / 4096) as u8,
                })
                .collect();
            from.mem_write(ptr, &bytes).unwrap();
            // One pool thread's share: chunks packed, then checked and
            // unpacked, on this thread alone (best of 3, so load matters less).
            let key = [7u8; 32];
            let (mut packer, mut unpacker) = (Packer::default(), Unpacker::default());
            let (mut pack, mut unpack) = (f64::MAX, f64::MAX);
            for _ in 0..3 {
                let chunks: Vec<Vec<u8>> = bytes.chunks(CHUNK).map(<[u8]>::to_vec).collect();
                let started = Instant::now();
                let records: Vec<Record> = chunks
                    .into_iter()
                    .enumerate()
                    .map(|(i, c)| packer.encode(&key, i as u64, 0, c))
                    .collect();
                pack = pack.min(started.elapsed().as_secs_f64());
                let started = Instant::now();
                for record in records {
                    unpacker.decode(&key, record, Vec::new).unwrap();
                }
                unpack = unpack.min(started.elapsed().as_secs_f64());
            }
            println!(
                "{name}: one thread packs at {:.2} GB/s, checks and unpacks at {:.2} GB/s",
                size as f64 / pack / 1e9,
                size as f64 / unpack / 1e9
            );
            let to_file = |sync: bool| {
                let file = std::fs::File::create(&path).unwrap();
                let started = Instant::now();
                let out = std::io::BufWriter::with_capacity(1 << 20, Writeback::new(&file));
                let mut writer = StreamWriter::start(out, &image).unwrap();
                let times = StageTimes::default();
                write_memory(from.as_ref(), &extents(&image), &mut writer, &times).unwrap();
                let (out, stored) = writer.finish().unwrap();
                let mut out = out.into_inner().map_err(|_| "flush").unwrap();
                if sync {
                    times.timed(Stage::Sync, || out.sync()).unwrap();
                    println!(
                        "  synced: {}",
                        times.summary(size as u64, started.elapsed(), threads())
                    );
                }
                (started.elapsed(), stored)
            };
            let from_file = || {
                let file = std::fs::File::open(&path).unwrap();
                let started = Instant::now();
                let input = std::io::BufReader::with_capacity(1 << 20, &file);
                let (mut reader, read) = StreamReader::open(input).unwrap();
                let buffers = Buffers::default();
                memory_pipe::write_behind(to.as_ref(), &buffers, &mut |put| {
                    reader.pour(&extents(&read), &buffers, &mut |at, piece| {
                        put(at - ptr + back, piece)
                    })
                })
                .unwrap();
                MemorySource::finish(&mut reader).unwrap();
                started.elapsed()
            };
            for round in 0..3 {
                let (written, stored) = to_file(false);
                let (synced, _) = to_file(true);
                let read = from_file();
                let mut memory = StreamWriter::start(Vec::new(), &image).unwrap();
                let started = Instant::now();
                write_memory(
                    from.as_ref(),
                    &extents(&image),
                    &mut memory,
                    &StageTimes::default(),
                )
                .unwrap();
                let in_memory = started.elapsed();
                println!(
                    "{name}, round {round}: file {stored} bytes; checkpoint {:.2} GB/s ({:.2} synced), \
                     restore {:.2} GB/s (page cache); checkpoint into memory {:.2} GB/s",
                    gbs(written),
                    gbs(synced),
                    gbs(read),
                    gbs(in_memory)
                );
            }
            let mut check = vec![0u8; size];
            to.mem_read(back, &mut check).unwrap();
            assert!(check == bytes, "{name}: restored memory differs");
        }
        let _ = std::fs::remove_file(&path);
    }
}
