//! The checkpoint stream (issue 17): a session's image as it goes to a file or
//! over a connection, written and read in bounded pieces, checksummed.
//!
//! Layout, little-endian: `CUMUXCKP`, the format ([`FORMAT`], u32), flags
//! (u32, 0), the header's length (u64), the header (a postcard
//! [`SessionImage`]: everything but memory's bytes), a SHA-256 of all before
//! it; then each allocation's bytes, in the header's order, in chunks of at
//! most [`CHUNK`] bytes: kind (u8: raw or zstd), raw length (u32), stored
//! length (u32), the stored bytes; last a SHA-256 of everything before it.
//! A chunk is compressed (zstd's fast level) only where a sample of it
//! shrinks to an eighth: such data compresses at several GB/s, while data
//! that shrinks less compresses at 0.3-0.5 GB/s, slower than writing it.

use std::io::{ErrorKind, Read, Write};

use cumux_protocol::{codes, CuError, DevicePtr};
use sha2::{Digest, Sha256};

use super::image::{SessionImage, IMAGE_FORMAT};

/// A checkpoint's first bytes.
pub const MAGIC: &[u8; 8] = b"CUMUXCKP";
/// The layout this cumux writes and reads (1: a whole image, zstd-compressed,
/// written by the admin's `cumux`).
pub const FORMAT: u32 = 2;
/// Bytes of memory a chunk carries at most: the one buffer each side moves
/// memory through.
pub const CHUNK: usize = 8 << 20;
/// Magic, format, flags, the header's length.
const PREAMBLE: usize = 8 + 4 + 4 + 8;
/// The largest header a checkpoint may say it has (module images included).
const MAX_HEADER: u64 = 1 << 32;
const DIGEST: usize = 32;
const CHUNK_HEAD: usize = 1 + 4 + 4;
const RAW: u8 = 0;
const ZSTD: u8 = 1;
/// zstd's fast level.
const LEVEL: i32 = 1;
/// Pieces of a chunk compressed to judge it, and their size.
const SAMPLES: usize = 4;
const SAMPLE: usize = 8 << 10;
/// A chunk is compressed where its sample shrinks to 1/SHRINK or less.
const SHRINK: usize = 8;

fn bad(detail: impl Into<String>) -> CuError {
    CuError::new(codes::INVALID_VALUE, detail)
}

fn io_error(what: &str, e: std::io::Error) -> CuError {
    CuError::new(codes::UNKNOWN, format!("cannot {what} the checkpoint: {e}"))
}

/// Bytes on their way, hashed as they pass.
struct Hashed<T> {
    inner: T,
    hash: Sha256,
    bytes: u64,
}

impl<T> Hashed<T> {
    fn new(inner: T) -> Self {
        Hashed {
            inner,
            hash: Sha256::new(),
            bytes: 0,
        }
    }

    fn digest(&self) -> [u8; DIGEST] {
        self.hash.clone().finalize().into()
    }
}

impl<W: Write> Hashed<W> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), CuError> {
        self.inner
            .write_all(bytes)
            .map_err(|e| io_error("write", e))?;
        self.hash.update(bytes);
        self.bytes += bytes.len() as u64;
        Ok(())
    }
}

impl<R: Read> Hashed<R> {
    /// Reads as much of `buf` as the input has: the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, CuError> {
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error("read", e)),
            }
        }
        self.hash.update(&buf[..got]);
        self.bytes += got as u64;
        Ok(got)
    }

    /// Reads all of `buf`, or says the stream is truncated.
    fn take(&mut self, buf: &mut [u8]) -> Result<(), CuError> {
        match self.fill(buf)? == buf.len() {
            true => Ok(()),
            false => Err(truncated()),
        }
    }
}

/// Writes a checkpoint stream: [`StreamWriter::start`] with the header,
/// [`StreamWriter::chunk`] for each piece of memory, then
/// [`StreamWriter::finish`].
pub struct StreamWriter<W: Write> {
    out: Hashed<W>,
    compressor: zstd::bulk::Compressor<'static>,
    packed: Vec<u8>,
    sample: Vec<u8>,
    /// Bytes of memory written, and of them stored compressed.
    pub memory: u64,
    pub compressed: u64,
}

impl<W: Write> StreamWriter<W> {
    /// A stream into `out` that starts with `header`'s preamble.
    pub fn start(out: W, header: &SessionImage) -> Result<Self, CuError> {
        let body = postcard::to_stdvec(header)
            .map_err(|e| CuError::new(codes::UNKNOWN, format!("cannot encode the image: {e}")))?;
        let compressor = zstd::bulk::Compressor::new(LEVEL)
            .map_err(|e| CuError::new(codes::UNKNOWN, format!("zstd: {e}")))?;
        let mut out = Hashed::new(out);
        out.put(MAGIC)?;
        out.put(&FORMAT.to_le_bytes())?;
        out.put(&0u32.to_le_bytes())?;
        out.put(&(body.len() as u64).to_le_bytes())?;
        out.put(&body)?;
        let digest = out.digest();
        out.put(&digest)?;
        Ok(StreamWriter {
            out,
            compressor,
            packed: Vec::new(),
            sample: Vec::new(),
            memory: 0,
            compressed: 0,
        })
    }

    /// The next piece of memory (at most [`CHUNK`] bytes), compressed where
    /// a sample says that pays.
    pub fn chunk(&mut self, raw: &[u8]) -> Result<(), CuError> {
        if raw.len() > CHUNK {
            return Err(bad(format!("a chunk of {} bytes", raw.len())));
        }
        let compressed = self.worth_compressing(raw) && {
            self.packed.clear();
            self.packed
                .reserve(zstd::zstd_safe::compress_bound(raw.len()));
            let packed = self.compressor.compress_to_buffer(raw, &mut self.packed);
            packed.is_ok_and(|n| n < raw.len())
        };
        let (kind, data) = match compressed {
            true => (ZSTD, &self.packed[..]),
            false => (RAW, raw),
        };
        let mut head = [0u8; CHUNK_HEAD];
        head[0] = kind;
        head[1..5].copy_from_slice(&(raw.len() as u32).to_le_bytes());
        head[5..9].copy_from_slice(&(data.len() as u32).to_le_bytes());
        self.out.put(&head)?;
        self.out.put(data)?;
        self.memory += raw.len() as u64;
        if compressed {
            self.compressed += raw.len() as u64;
        }
        Ok(())
    }

    /// Whether samples of `raw` shrink enough under zstd for the whole to
    /// be worth compressing.
    fn worth_compressing(&mut self, raw: &[u8]) -> bool {
        if raw.len() < SAMPLES * SAMPLE {
            return raw.len() >= 64;
        }
        self.sample.clear();
        self.sample.reserve(zstd::zstd_safe::compress_bound(SAMPLE));
        let mut shrunk = 0;
        for i in 0..SAMPLES {
            let at = (raw.len() - SAMPLE) / (SAMPLES - 1) * i;
            let piece = &raw[at..at + SAMPLE];
            match self.compressor.compress_to_buffer(piece, &mut self.sample) {
                Ok(n) => shrunk += n,
                Err(_) => return false,
            }
        }
        shrunk * SHRINK <= SAMPLES * SAMPLE
    }

    /// Ends the stream with its checksum: the writer and the stream's bytes.
    pub fn finish(mut self) -> Result<(W, u64), CuError> {
        let digest = self.out.digest();
        self.out.put(&digest)?;
        self.out.inner.flush().map_err(|e| io_error("write", e))?;
        Ok((self.out.inner, self.out.bytes))
    }
}

/// Takes a piece of an allocation's bytes at its offset.
pub type Put<'a> = dyn FnMut(u64, &[u8]) -> Result<(), CuError> + 'a;

/// Where a rebuild's memory comes from: each allocation's bytes in turn.
pub trait MemorySource {
    /// Hands the `size` bytes of the allocation at `ptr` to `put(offset,
    /// bytes)`, piece by piece.
    fn next(&mut self, ptr: DevicePtr, size: u64, put: &mut Put<'_>) -> Result<(), CuError>;

    /// Called after the last allocation: a stream checks its checksum here.
    fn finish(&mut self) -> Result<(), CuError> {
        Ok(())
    }

    /// The context the bytes come from, where they come from one: a move
    /// then tries copying them device to device instead.
    fn context(&self) -> Option<&dyn crate::device::DeviceContext> {
        None
    }
}

/// Reads a checkpoint stream: [`StreamReader::open`] checks its preamble and
/// gives its header, then each allocation's memory ([`MemorySource`]), then
/// its checksum ([`MemorySource::finish`]).
pub struct StreamReader<R: Read> {
    input: Hashed<R>,
    decompressor: zstd::bulk::Decompressor<'static>,
    packed: Vec<u8>,
    raw: Vec<u8>,
}

impl<R: Read> StreamReader<R> {
    /// The stream in `input` and its header, or why it is refused.
    pub fn open(input: R) -> Result<(Self, SessionImage), CuError> {
        let decompressor = zstd::bulk::Decompressor::new()
            .map_err(|e| CuError::new(codes::UNKNOWN, format!("zstd: {e}")))?;
        let mut input = Hashed::new(input);
        let mut preamble = [0u8; PREAMBLE];
        let got = input.fill(&mut preamble)?;
        if got < MAGIC.len() || &preamble[..MAGIC.len()] != MAGIC {
            return Err(bad(
                "not a session image: not a cumux checkpoint (no CUMUXCKP header)",
            ));
        }
        let word =
            |at: usize| u32::from_le_bytes(preamble[at..at + 4].try_into().unwrap_or_default());
        let (format, flags) = (word(8), word(12));
        if format != FORMAT {
            return Err(bad(format!(
                "a checkpoint of format {format}; this cumux reads format {FORMAT}"
            )));
        }
        if got < PREAMBLE {
            return Err(truncated());
        }
        if flags != 0 {
            return Err(bad(format!(
                "the checkpoint has flags {flags:#x} this cumux does not know"
            )));
        }
        let length = u64::from_le_bytes(preamble[16..24].try_into().unwrap_or_default());
        if length > MAX_HEADER {
            return Err(corrupt(format!(
                "its header says {length} bytes, past the {MAX_HEADER} one may have"
            )));
        }
        let mut body = vec![0u8; length as usize];
        input.take(&mut body)?;
        let digest = input.digest();
        let mut said = [0u8; DIGEST];
        input.take(&mut said)?;
        if digest != said {
            return Err(bad(
                "the checkpoint's header checksum does not match: the file is corrupt",
            ));
        }
        let image: SessionImage = postcard::from_bytes(&body)
            .map_err(|e| bad(format!("not a session image of this cumux: {e}")))?;
        if image.format != IMAGE_FORMAT {
            return Err(bad(format!(
                "a session image of format {}, this server reads {IMAGE_FORMAT}",
                image.format
            )));
        }
        let reader = StreamReader {
            input,
            decompressor,
            packed: Vec::new(),
            raw: Vec::new(),
        };
        Ok((reader, image))
    }

    /// The next chunk of memory, at most `left` bytes, into `self.raw`.
    fn chunk(&mut self, left: u64) -> Result<(), CuError> {
        let mut head = [0u8; CHUNK_HEAD];
        self.input.take(&mut head)?;
        let raw_len = u32::from_le_bytes(head[1..5].try_into().unwrap_or_default()) as usize;
        let stored = u32::from_le_bytes(head[5..9].try_into().unwrap_or_default()) as usize;
        if raw_len == 0 || raw_len > CHUNK || raw_len as u64 > left {
            return Err(corrupt(format!("a chunk of {raw_len} bytes")));
        }
        match head[0] {
            RAW if stored == raw_len => {
                self.raw.resize(raw_len, 0);
                self.input.take(&mut self.raw)
            }
            ZSTD if stored <= zstd::zstd_safe::compress_bound(CHUNK) => {
                self.packed.resize(stored, 0);
                self.input.take(&mut self.packed)?;
                self.raw.clear();
                self.raw.reserve(CHUNK);
                let unpacked = self
                    .decompressor
                    .decompress_to_buffer(&self.packed, &mut self.raw);
                match unpacked {
                    Ok(n) if n == raw_len => Ok(()),
                    _ => Err(corrupt("a compressed chunk does not unpack")),
                }
            }
            kind => Err(corrupt(format!(
                "a chunk of kind {kind}, {stored} bytes stored"
            ))),
        }
    }
}

fn truncated() -> CuError {
    bad("the checkpoint is truncated: it ends before its checksum")
}

fn corrupt(what: impl std::fmt::Display) -> CuError {
    bad(format!("the checkpoint is corrupt: {what}"))
}

impl<R: Read> MemorySource for StreamReader<R> {
    fn next(&mut self, _ptr: DevicePtr, size: u64, put: &mut Put<'_>) -> Result<(), CuError> {
        let mut done = 0u64;
        while done < size {
            self.chunk(size - done)?;
            put(done, &self.raw)?;
            done += self.raw.len() as u64;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), CuError> {
        let digest = self.input.digest();
        let mut said = [0u8; DIGEST];
        self.input.take(&mut said)?;
        if digest != said {
            return Err(bad(
                "the checkpoint's checksum does not match: the file is truncated or corrupt",
            ));
        }
        let mut more = [0u8; 1];
        if self.input.fill(&mut more)? != 0 {
            return Err(corrupt("bytes after its checksum"));
        }
        Ok(())
    }
}

/// A stream's header, once all of the stream is read and its checksum
/// checked.
pub fn verified(input: impl Read) -> Result<SessionImage, CuError> {
    let (mut reader, image) = StreamReader::open(input)?;
    for a in &image.allocations {
        reader.next(a.ptr, a.size, &mut |_, _| Ok(()))?;
    }
    reader.finish()?;
    Ok(image)
}

/// The stream `bytes` with its header changed by `change` (its memory as it
/// was): for tests of images out of place.
pub fn rewritten(bytes: &[u8], change: impl FnOnce(&mut SessionImage)) -> Result<Vec<u8>, CuError> {
    let (mut reader, mut image) = StreamReader::open(bytes)?;
    let allocations = image.allocations.clone();
    change(&mut image);
    let mut writer = StreamWriter::start(Vec::new(), &image)?;
    for a in &allocations {
        reader.next(a.ptr, a.size, &mut |_, piece| writer.chunk(piece))?;
    }
    reader.finish()?;
    Ok(writer.finish()?.0)
}

#[cfg(test)]
mod tests {
    use super::super::image::{Allocation, ResumePoint, StreamImage};
    use super::*;

    fn image(sizes: &[u64]) -> SessionImage {
        let mut at = 0x2000_0000_0000;
        let allocations = sizes
            .iter()
            .map(|&size| {
                let a = Allocation { ptr: at, size };
                at += size.next_multiple_of(256);
                a
            })
            .collect();
        SessionImage {
            format: IMAGE_FORMAT,
            index: 0,
            window: 1,
            next_handle: 9,
            allocations,
            modules: Vec::new(),
            streams: vec![StreamImage {
                handle: 5,
                flags: 1,
                priority: 0,
            }],
            events: vec![(6, 2)],
            graphs: Vec::new(),
            limits: vec![(2, 8 << 20)],
            aliases: vec![(0x1000, 64, 0x9000)],
            resume: Some(ResumePoint {
                key: 77,
                seq: 12,
                tenant: "t".into(),
                program: "p".into(),
            }),
        }
    }

    /// An allocation's bytes: runs of one value (compressible), then noise.
    fn memory(size: u64, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..size)
            .map(|i| match i < size / 2 {
                true => (i / 4096) as u8,
                false => {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                }
            })
            .collect()
    }

    fn stream_of(image: &SessionImage, memories: &[Vec<u8>]) -> Vec<u8> {
        let mut writer = StreamWriter::start(Vec::new(), image).unwrap();
        for m in memories {
            for piece in m.chunks(CHUNK) {
                writer.chunk(piece).unwrap();
            }
        }
        assert!(writer.compressed > 0 && writer.compressed < writer.memory);
        writer.finish().unwrap().0
    }

    fn read_back(bytes: &[u8]) -> Result<(SessionImage, Vec<Vec<u8>>), CuError> {
        let (mut reader, image) = StreamReader::open(bytes)?;
        let mut memories = Vec::new();
        for a in &image.allocations {
            let mut m = Vec::new();
            reader.next(a.ptr, a.size, &mut |offset, piece| {
                assert_eq!(offset, m.len() as u64);
                m.extend_from_slice(piece);
                Ok(())
            })?;
            memories.push(m);
        }
        reader.finish()?;
        Ok((image, memories))
    }

    #[test]
    fn a_stream_reads_back_and_truncated_corrupt_or_foreign_ones_are_refused() {
        let sizes = [3, CHUNK as u64 * 2 + 5000, 1 << 20];
        let image = image(&sizes);
        let memories: Vec<Vec<u8>> = sizes.iter().map(|&s| memory(s, s)).collect();
        let bytes = stream_of(&image, &memories);
        assert_eq!(read_back(&bytes).unwrap(), (image.clone(), memories));
        assert_eq!(verified(&bytes[..]).unwrap(), image);
        let why = |bytes: &[u8]| read_back(bytes).unwrap_err().detail;
        assert!(why(&bytes[..bytes.len() - 1]).contains("truncated"));
        assert!(why(&bytes[..bytes.len() / 2]).contains("truncated"));
        assert!(why(&bytes[..20]).contains("truncated"));
        // A byte changed anywhere: refused, whatever it hit.
        for at in [
            30,
            PREAMBLE + 40,
            bytes.len() / 3,
            bytes.len() / 2,
            bytes.len() - 40,
        ] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x40;
            let why = why(&flipped);
            assert!(
                why.contains("checksum does not match") || why.contains("corrupt"),
                "{at}: {why}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(why(&longer).contains("after its checksum"));
        assert!(why(b"\x7fELF and so on").contains("not a cumux checkpoint"));
        let mut older = bytes.clone();
        older[8] = 1;
        assert!(why(&older).contains("format 1; this cumux reads format 2"));
    }

    #[test]
    fn incompressible_memory_is_stored_as_it_is_and_a_header_can_be_rewritten() {
        let noise = memory(2 * CHUNK as u64, 5)[CHUNK..].to_vec();
        let image = image(&[noise.len() as u64]);
        let mut writer = StreamWriter::start(Vec::new(), &image).unwrap();
        writer.chunk(&noise).unwrap();
        assert_eq!(writer.compressed, 0);
        let (bytes, size) = writer.finish().unwrap();
        assert_eq!(bytes.len() as u64, size);
        let changed = rewritten(&bytes, |i| i.next_handle = 10).unwrap();
        let (header, memories) = read_back(&changed).unwrap();
        assert_eq!(header.next_handle, 10);
        assert_eq!(memories, vec![noise]);
    }

    #[test]
    fn another_image_format_is_refused() {
        let other = SessionImage {
            format: IMAGE_FORMAT + 1,
            ..image(&[])
        };
        let bytes = StreamWriter::start(Vec::new(), &other)
            .unwrap()
            .finish()
            .unwrap()
            .0;
        assert!(read_back(&bytes).unwrap_err().detail.contains("format"));
    }
}
