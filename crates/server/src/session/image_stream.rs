//! The checkpoint stream's layout (issue 17): a session's image as it goes to a
//! file or over a connection, its memory in chunks checked one by one. Pure.
//!
//! Layout, little-endian: `CUMUXCKP`, the format ([`FORMAT`], u32), flags
//! (u32, 0), the header's length (u64), the header (a postcard
//! [`SessionImage`]: everything but memory's bytes), a BLAKE3 of all before
//! it (the stream's *key*). Then one record per chunk of memory: each
//! allocation's bytes, in the header's order, cut at [`CHUNK`] bytes. A
//! record is its kind (u8: raw, zstd or fill), raw length (u32), stored
//! length (u32), a checksum (32 bytes), then the stored bytes: the chunk
//! itself, one zstd frame of it, or the one byte value it is all made of.
//! The checksum is BLAKE3 keyed by the stream's key over the chunk's number
//! (u64), kind, raw length and stored bytes, so a record is checked on its
//! own (on any thread, before it is unpacked) and only in its place in its
//! own stream. Last the trailer: the number of records (u64) and a BLAKE3
//! keyed by the key over their checksums in order, then nothing.
//! A chunk is compressed (zstd's fast level) only where a sample of it
//! shrinks to an eighth: such data compresses at several GB/s, while data
//! that shrinks less compresses at 0.3-0.5 GB/s, slower than writing it.
//! Chunks are independent, so `session::image_pipeline` packs and checks
//! them on a thread pool.

use std::io::{ErrorKind, Read, Write};

use cumux_protocol::{codes, CuError, DevicePtr};

use super::image::{SessionImage, IMAGE_FORMAT};
use crate::device::pieces::one_value;

/// A checkpoint's first bytes.
pub const MAGIC: &[u8; 8] = b"CUMUXCKP";
/// The layout this cumux writes and reads (1: a whole image, zstd-compressed;
/// 2: chunks under one SHA-256 of the whole stream).
pub const FORMAT: u32 = 3;
/// Bytes of memory a chunk carries at most.
pub const CHUNK: usize = 4 << 20;
/// A BLAKE3 checksum, and the stream's key.
pub type Digest = [u8; 32];
/// Magic, format, flags, the header's length.
const PREAMBLE: usize = 8 + 4 + 4 + 8;
/// The largest header a checkpoint may say it has (module images included).
const MAX_HEADER: u64 = 1 << 32;
/// A record's kind, raw length, stored length and checksum.
const RECORD_HEAD: usize = 1 + 4 + 4 + 32;
/// The number of records and the checksum of their checksums.
const TRAILER: usize = 8 + 32;
const RAW: u8 = 0;
const ZSTD: u8 = 1;
const FILL: u8 = 2;
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

fn corrupt(what: impl std::fmt::Display) -> CuError {
    bad(format!("the checkpoint is corrupt: {what}"))
}

/// Memory on its way to a device: bytes, or one byte value `len` times.
pub use crate::device::pieces::MemPiece as Piece;

/// One chunk's record: which chunk, where its memory goes, how it is
/// stored, its checksum and its stored bytes.
pub struct Record {
    /// The chunk's number in its stream, from 0.
    pub index: u64,
    /// The device address of its first byte.
    pub at: DevicePtr,
    kind: u8,
    raw_len: u32,
    digest: Digest,
    /// What follows the record's head in the stream.
    pub stored: Vec<u8>,
}

impl Record {
    /// Bytes of memory it stands for.
    pub fn raw_len(&self) -> u64 {
        u64::from(self.raw_len)
    }

    /// Whether it stands for one byte value repeated.
    pub fn is_fill(&self) -> bool {
        self.kind == FILL
    }

    /// Whether its memory is stored zstd-compressed.
    pub fn is_compressed(&self) -> bool {
        self.kind == ZSTD
    }

    /// The chunk, for an error: its number, size and address.
    fn name(&self) -> String {
        format!(
            "chunk {} ({} bytes at {:#x})",
            self.index, self.raw_len, self.at
        )
    }

    fn checksum(&self, key: &Digest) -> Digest {
        checksum(key, self.index, self.kind, self.raw_len, &self.stored)
    }
}

fn checksum(key: &Digest, index: u64, kind: u8, raw_len: u32, stored: &[u8]) -> Digest {
    let mut hash = blake3::Hasher::new_keyed(key);
    hash.update(&index.to_le_bytes());
    hash.update(&[kind]);
    hash.update(&raw_len.to_le_bytes());
    hash.update(stored);
    hash.finalize().into()
}

/// Makes chunks' records: zstd's context and the buffers it packs into.
pub struct Packer {
    compressor: Option<zstd::bulk::Compressor<'static>>,
    sample: Vec<u8>,
    /// A buffer for the next compressed chunk.
    spare: Vec<u8>,
}

impl Default for Packer {
    fn default() -> Self {
        Packer {
            // Without a context (out of memory) chunks are stored raw.
            compressor: zstd::bulk::Compressor::new(LEVEL).ok(),
            sample: Vec::new(),
            spare: Vec::new(),
        }
    }
}

impl Packer {
    /// `raw` (at most [`CHUNK`] bytes, at `at` on the device) as chunk
    /// `index` of the stream keyed `key`: a fill where it is one byte value,
    /// else compressed where a sample says that pays, else as it is. One
    /// buffer comes back for the one given: `raw` itself as the stored
    /// bytes, or a buffer the packer kept.
    pub fn encode(&mut self, key: &Digest, index: u64, at: DevicePtr, raw: Vec<u8>) -> Record {
        self.encode_piece(key, index, at, Piece::Bytes(raw))
    }

    /// [`Packer::encode`] of a piece, which may be a fill the device side
    /// found already (then its record's stored byte is a fresh buffer).
    pub fn encode_piece(
        &mut self,
        key: &Digest,
        index: u64,
        at: DevicePtr,
        piece: Piece,
    ) -> Record {
        let raw = match piece {
            Piece::Bytes(raw) => raw,
            Piece::Fill { value, len } => {
                debug_assert!(len > 0 && len <= CHUNK as u64);
                return self.record(key, index, at, FILL, len as u32, vec![value]);
            }
        };
        debug_assert!(!raw.is_empty() && raw.len() <= CHUNK);
        let raw_len = raw.len() as u32;
        let (kind, stored) = if let Some(value) = one_value(&raw) {
            let mut stored = raw;
            stored.truncate(1);
            stored[0] = value;
            (FILL, stored)
        } else if self.compress(&raw) {
            (ZSTD, std::mem::replace(&mut self.spare, raw))
        } else {
            (RAW, raw)
        };
        self.record(key, index, at, kind, raw_len, stored)
    }

    fn record(
        &self,
        key: &Digest,
        index: u64,
        at: DevicePtr,
        kind: u8,
        raw_len: u32,
        stored: Vec<u8>,
    ) -> Record {
        let digest = checksum(key, index, kind, raw_len, &stored);
        Record {
            index,
            at,
            kind,
            raw_len,
            digest,
            stored,
        }
    }

    /// `raw` compressed into `self.spare` if samples say it pays and it
    /// shrinks.
    fn compress(&mut self, raw: &[u8]) -> bool {
        if !self.worth_compressing(raw) {
            return false;
        }
        let Some(compressor) = self.compressor.as_mut() else {
            return false;
        };
        self.spare.clear();
        self.spare
            .reserve(zstd::zstd_safe::compress_bound(raw.len()));
        let packed = compressor.compress_to_buffer(raw, &mut self.spare);
        packed.is_ok_and(|n| n < raw.len())
    }

    /// Whether samples of `raw` shrink enough under zstd for the whole to
    /// be worth compressing.
    fn worth_compressing(&mut self, raw: &[u8]) -> bool {
        if raw.len() < SAMPLES * SAMPLE {
            return raw.len() >= 64;
        }
        let Some(compressor) = self.compressor.as_mut() else {
            return false;
        };
        self.sample.clear();
        self.sample.reserve(zstd::zstd_safe::compress_bound(SAMPLE));
        let mut shrunk = 0;
        for i in 0..SAMPLES {
            let at = (raw.len() - SAMPLE) / (SAMPLES - 1) * i;
            let piece = &raw[at..at + SAMPLE];
            match compressor.compress_to_buffer(piece, &mut self.sample) {
                Ok(n) => shrunk += n,
                Err(_) => return false,
            }
        }
        shrunk * SHRINK <= SAMPLES * SAMPLE
    }
}

/// Checks and unpacks chunks' records: zstd's context.
#[derive(Default)]
pub struct Unpacker {
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
}

impl Unpacker {
    /// `record`'s memory once its checksum under `key` matches, or an
    /// error that names the chunk; and the buffer the memory is not in, if
    /// any. A compressed chunk unpacks into a buffer from `buffer`.
    pub fn decode(
        &mut self,
        key: &Digest,
        record: Record,
        buffer: impl FnOnce() -> Vec<u8>,
    ) -> Result<(Piece, Option<Vec<u8>>), CuError> {
        if record.checksum(key) != record.digest {
            return Err(corrupt(format!(
                "{} does not match its checksum",
                record.name()
            )));
        }
        let raw_len = record.raw_len as usize;
        match record.kind {
            RAW => Ok((Piece::Bytes(record.stored), None)),
            FILL => match record.stored[..] {
                [value] => {
                    let len = record.raw_len();
                    Ok((Piece::Fill { value, len }, Some(record.stored)))
                }
                _ => Err(corrupt(format!(
                    "{} is a fill of no one value",
                    record.name()
                ))),
            },
            _ => {
                let decompressor = match &mut self.decompressor {
                    Some(d) => d,
                    none => none.insert(
                        zstd::bulk::Decompressor::new()
                            .map_err(|e| CuError::new(codes::UNKNOWN, format!("zstd: {e}")))?,
                    ),
                };
                let mut raw = buffer();
                raw.clear();
                raw.reserve(raw_len);
                match decompressor.decompress_to_buffer(&record.stored, &mut raw) {
                    Ok(n) if n == raw_len => Ok((Piece::Bytes(raw), Some(record.stored))),
                    _ => Err(corrupt(format!("{} does not unpack", record.name()))),
                }
            }
        }
    }
}

/// Writes a checkpoint stream: [`StreamWriter::start`] with the header,
/// [`StreamWriter::put`] for each chunk's record in order (made by a
/// [`Packer`] with [`StreamWriter::key`]), then [`StreamWriter::finish`].
pub struct StreamWriter<W: Write> {
    out: W,
    key: Digest,
    trailer: blake3::Hasher,
    records: u64,
    bytes: u64,
    /// Bytes of memory written, of them stored compressed, and as fills.
    pub memory: u64,
    pub compressed: u64,
    pub filled: u64,
}

impl<W: Write> StreamWriter<W> {
    /// A stream into `out` that starts with `header`'s preamble.
    pub fn start(out: W, header: &SessionImage) -> Result<Self, CuError> {
        let body = postcard::to_stdvec(header)
            .map_err(|e| CuError::new(codes::UNKNOWN, format!("cannot encode the image: {e}")))?;
        let mut preamble = Vec::with_capacity(PREAMBLE);
        preamble.extend_from_slice(MAGIC);
        preamble.extend_from_slice(&FORMAT.to_le_bytes());
        preamble.extend_from_slice(&0u32.to_le_bytes());
        preamble.extend_from_slice(&(body.len() as u64).to_le_bytes());
        let mut hash = blake3::Hasher::new();
        hash.update(&preamble);
        hash.update(&body);
        let key: Digest = hash.finalize().into();
        let mut writer = StreamWriter {
            out,
            key,
            trailer: blake3::Hasher::new_keyed(&key),
            records: 0,
            bytes: 0,
            memory: 0,
            compressed: 0,
            filled: 0,
        };
        writer.write(&preamble)?;
        writer.write(&body)?;
        writer.write(&key)?;
        Ok(writer)
    }

    /// The key chunks' records are checksummed under.
    pub fn key(&self) -> Digest {
        self.key
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), CuError> {
        self.out
            .write_all(bytes)
            .map_err(|e| io_error("write", e))?;
        self.bytes += bytes.len() as u64;
        Ok(())
    }

    /// The next chunk's record (its number must be the next).
    pub fn put(&mut self, record: &Record) -> Result<(), CuError> {
        if record.index != self.records {
            return Err(CuError::new(
                codes::UNKNOWN,
                format!(
                    "chunk {} written where chunk {} goes",
                    record.index, self.records
                ),
            ));
        }
        let mut head = [0u8; RECORD_HEAD];
        head[0] = record.kind;
        head[1..5].copy_from_slice(&record.raw_len.to_le_bytes());
        head[5..9].copy_from_slice(&(record.stored.len() as u32).to_le_bytes());
        head[9..].copy_from_slice(&record.digest);
        self.write(&head)?;
        self.write(&record.stored)?;
        self.trailer.update(&record.digest);
        self.records += 1;
        self.memory += record.raw_len();
        match record.kind {
            ZSTD => self.compressed += record.raw_len(),
            FILL => self.filled += record.raw_len(),
            _ => {}
        }
        Ok(())
    }

    /// Ends the stream with its trailer: the writer and the stream's bytes.
    pub fn finish(mut self) -> Result<(W, u64), CuError> {
        let digest: Digest = self.trailer.finalize().into();
        let mut trailer = [0u8; TRAILER];
        trailer[..8].copy_from_slice(&self.records.to_le_bytes());
        trailer[8..].copy_from_slice(&digest);
        self.write(&trailer)?;
        self.out.flush().map_err(|e| io_error("write", e))?;
        Ok((self.out, self.bytes))
    }
}

/// Reads a checkpoint stream: [`StreamReader::open`] checks its preamble and
/// header and gives the header, [`StreamReader::record`] each chunk's record
/// in turn (checked and unpacked by an [`Unpacker`] with
/// [`StreamReader::key`]), then [`StreamReader::finish`] its trailer.
pub struct StreamReader<R: Read> {
    input: R,
    key: Digest,
    trailer: blake3::Hasher,
    records: u64,
}

fn truncated(what: impl std::fmt::Display) -> CuError {
    bad(format!("the checkpoint is truncated: it ends {what}"))
}

/// Reads as much of `buf` as `input` has: the bytes read.
fn fill(input: &mut impl Read, buf: &mut [u8]) -> Result<usize, CuError> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error("read", e)),
        }
    }
    Ok(got)
}

/// Reads all of `buf`, or says the stream ends `where_`.
fn take(input: &mut impl Read, buf: &mut [u8], where_: impl Fn() -> String) -> Result<(), CuError> {
    match fill(input, buf)? == buf.len() {
        true => Ok(()),
        false => Err(truncated(where_())),
    }
}

impl<R: Read> StreamReader<R> {
    /// The stream in `input` and its header, or why it is refused.
    pub fn open(mut input: R) -> Result<(Self, SessionImage), CuError> {
        let mut preamble = [0u8; PREAMBLE];
        let got = fill(&mut input, &mut preamble)?;
        if got < MAGIC.len() || &preamble[..MAGIC.len()] != MAGIC {
            return Err(bad(
                "not a session image: not a cumux checkpoint (no CUMUXCKP header)",
            ));
        }
        if got < 12 {
            return Err(truncated("in its preamble"));
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
            return Err(truncated("in its preamble"));
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
        // Read in steps, so a length the file does not have allocates little.
        let mut body = Vec::new();
        let read = (&mut input)
            .take(length)
            .read_to_end(&mut body)
            .map_err(|e| io_error("read", e))?;
        if read as u64 != length {
            return Err(truncated("in its header"));
        }
        let mut said = [0u8; 32];
        take(&mut input, &mut said, || "in its header".into())?;
        let mut hash = blake3::Hasher::new();
        hash.update(&preamble);
        hash.update(&body);
        let key: Digest = hash.finalize().into();
        if key != said {
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
            key,
            trailer: blake3::Hasher::new_keyed(&key),
            records: 0,
        };
        Ok((reader, image))
    }

    /// The key chunks' records are checksummed under.
    pub fn key(&self) -> Digest {
        self.key
    }

    /// The next chunk's record, for memory at `at` of which `left` bytes
    /// are still to come, its stored bytes read into `buffer`. Its
    /// checksum is not checked yet ([`Unpacker::decode`] does).
    pub fn record(&mut self, at: DevicePtr, left: u64, buffer: Vec<u8>) -> Result<Record, CuError> {
        let index = self.records;
        let name = || format!("in chunk {index} (at {at:#x})");
        let mut head = [0u8; RECORD_HEAD];
        take(&mut self.input, &mut head, name)?;
        let raw_len = u32::from_le_bytes(head[1..5].try_into().unwrap_or_default());
        let stored_len = u32::from_le_bytes(head[5..9].try_into().unwrap_or_default()) as usize;
        let kind = head[0];
        if raw_len == 0 || raw_len as usize > CHUNK || u64::from(raw_len) > left {
            return Err(corrupt(format!(
                "chunk {index} (at {at:#x}) says {raw_len} bytes, where {} may come",
                left.min(CHUNK as u64)
            )));
        }
        let fits = match kind {
            RAW => stored_len == raw_len as usize,
            ZSTD => stored_len <= zstd::zstd_safe::compress_bound(raw_len as usize),
            FILL => stored_len == 1,
            _ => false,
        };
        if !fits {
            return Err(corrupt(format!(
                "chunk {index} (at {at:#x}) is of kind {kind} with {stored_len} bytes stored for \
                 {raw_len}"
            )));
        }
        // Read into the buffer's spare room: no zeroing first.
        let mut stored = buffer;
        stored.clear();
        stored.reserve(stored_len);
        let got = (&mut self.input)
            .take(stored_len as u64)
            .read_to_end(&mut stored)
            .map_err(|e| io_error("read", e))?;
        if got != stored_len {
            return Err(truncated(name()));
        }
        let digest: Digest = head[9..].try_into().unwrap_or_default();
        self.trailer.update(&digest);
        self.records += 1;
        Ok(Record {
            index,
            at,
            kind,
            raw_len,
            digest,
            stored,
        })
    }

    /// Checks the trailer, after the last chunk: the number of records and
    /// the checksum of their checksums, then the stream's end.
    pub fn finish(&mut self) -> Result<(), CuError> {
        let mut trailer = [0u8; TRAILER];
        take(&mut self.input, &mut trailer, || {
            "after its memory, before its checksum".into()
        })?;
        let count = u64::from_le_bytes(trailer[..8].try_into().unwrap_or_default());
        let digest: Digest = self.trailer.finalize().into();
        if count != self.records || digest[..] != trailer[8..] {
            return Err(bad(
                "the checkpoint's checksum does not match: the file is truncated or corrupt",
            ));
        }
        let mut more = [0u8; 1];
        if fill(&mut self.input, &mut more)? != 0 {
            return Err(corrupt("bytes after its checksum"));
        }
        Ok(())
    }

    /// Each `(ptr, size)` allocation's memory, checked and unpacked here in
    /// turn, to `take(address, piece)`.
    pub fn pieces(
        &mut self,
        allocations: &[(DevicePtr, u64)],
        take: &mut dyn FnMut(DevicePtr, Piece) -> Result<(), CuError>,
    ) -> Result<(), CuError> {
        let mut unpacker = Unpacker::default();
        for &(ptr, size) in allocations {
            let mut offset = 0;
            while offset < size {
                let at = ptr + offset;
                let record = self.record(at, size - offset, Vec::new())?;
                offset += record.raw_len();
                take(at, unpacker.decode(&self.key, record, Vec::new)?.0)?;
            }
        }
        Ok(())
    }
}

/// The `(ptr, size)` of each of `image`'s allocations, in the stream's order.
pub fn extents(image: &SessionImage) -> Vec<(DevicePtr, u64)> {
    image.allocations.iter().map(|a| (a.ptr, a.size)).collect()
}

/// A stream's header, once all of the stream is read and every checksum
/// checked.
pub fn verified(input: impl Read) -> Result<SessionImage, CuError> {
    let (mut reader, image) = StreamReader::open(input)?;
    reader.pieces(&extents(&image), &mut |_, _| Ok(()))?;
    reader.finish()?;
    Ok(image)
}

/// Writes `image`'s stream with `memory` (its allocations' bytes one after
/// another), here on the calling thread.
pub fn written<W: Write>(out: W, image: &SessionImage, memory: &[u8]) -> Result<(W, u64), CuError> {
    let mut writer = StreamWriter::start(out, image)?;
    let mut packer = Packer::default();
    let key = writer.key();
    let mut left = memory;
    let mut index = 0;
    for (ptr, size) in extents(image) {
        let mut offset = 0;
        while offset < size {
            let n = (size - offset).min(CHUNK as u64) as usize;
            if left.len() < n {
                return Err(bad("less memory than the image's allocations"));
            }
            let (raw, rest) = left.split_at(n);
            left = rest;
            writer.put(&packer.encode(&key, index, ptr + offset, raw.to_vec()))?;
            index += 1;
            offset += n as u64;
        }
    }
    writer.finish()
}

/// The stream `bytes` read whole: its image and its memory, every checksum
/// checked.
pub fn read_whole(bytes: &[u8]) -> Result<(SessionImage, Vec<u8>), CuError> {
    let (mut reader, image) = StreamReader::open(bytes)?;
    let mut memory = Vec::new();
    reader.pieces(&extents(&image), &mut |_, piece| {
        match piece {
            Piece::Bytes(bytes) => memory.extend_from_slice(&bytes),
            Piece::Fill { value, len } => memory.resize(memory.len() + len as usize, value),
        }
        Ok(())
    })?;
    reader.finish()?;
    Ok((image, memory))
}

/// The stream `bytes` with its header changed by `change` (its memory as it
/// was): for tests of images out of place.
pub fn rewritten(bytes: &[u8], change: impl FnOnce(&mut SessionImage)) -> Result<Vec<u8>, CuError> {
    let (mut image, memory) = read_whole(bytes)?;
    change(&mut image);
    Ok(written(Vec::new(), &image, &memory)?.0)
}

#[cfg(test)]
mod tests {
    use super::super::image::{Allocation, ResumePoint, StreamImage};
    use super::*;

    pub(crate) fn image(sizes: &[u64]) -> SessionImage {
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

    /// An allocation's bytes: a run of zeros (a fill), runs of one value
    /// each 4 KiB (compressible), then noise.
    fn memory(size: u64, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..size)
            .map(|i| match i {
                i if i < CHUNK as u64 => 0,
                i if i < size / 2 => (i / 4096) as u8,
                _ => {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                }
            })
            .collect()
    }

    fn read_back(bytes: &[u8]) -> Result<(SessionImage, Vec<Vec<u8>>), CuError> {
        let (mut reader, image) = StreamReader::open(bytes)?;
        let mut memories = Vec::new();
        for (ptr, size) in extents(&image) {
            let mut m = Vec::new();
            reader.pieces(&[(ptr, size)], &mut |at, piece| {
                assert_eq!(at, ptr + m.len() as u64);
                match piece {
                    Piece::Bytes(bytes) => m.extend_from_slice(&bytes),
                    Piece::Fill { value, len } => m.resize(m.len() + len as usize, value),
                }
                Ok(())
            })?;
            memories.push(m);
        }
        reader.finish()?;
        Ok((image, memories))
    }

    /// Where chunk `n`'s stored bytes start in a stream of `image` whose
    /// chunks are `stored` long.
    fn chunk_start(image: &SessionImage, stored: &[usize], n: usize) -> usize {
        let header = postcard::to_stdvec(image).unwrap().len();
        let before: usize = stored[..n].iter().map(|s| RECORD_HEAD + s).sum();
        PREAMBLE + header + 32 + before + RECORD_HEAD
    }

    #[test]
    fn a_stream_reads_back_with_fills_and_compressed_chunks_exactly() {
        let sizes = [3, CHUNK as u64 * 4 + 5000, 1 << 20];
        let image = image(&sizes);
        let memories: Vec<Vec<u8>> = sizes.iter().map(|&s| memory(s, s)).collect();
        let all = memories.concat();
        let mut writer = StreamWriter::start(Vec::new(), &image).unwrap();
        let mut packer = Packer::default();
        let mut index = 0;
        let mut left = &all[..];
        for (ptr, size) in extents(&image) {
            for offset in (0..size).step_by(CHUNK) {
                let n = (size - offset).min(CHUNK as u64) as usize;
                let record = packer.encode(&writer.key(), index, ptr + offset, left[..n].to_vec());
                writer.put(&record).unwrap();
                left = &left[n..];
                index += 1;
            }
        }
        let (memory, compressed, filled) = (writer.memory, writer.compressed, writer.filled);
        let (bytes, size) = writer.finish().unwrap();
        assert_eq!(bytes.len() as u64, size);
        assert_eq!(memory, all.len() as u64);
        // The first chunk of zeros is a fill; the runs compress; noise does not.
        assert!(filled >= CHUNK as u64, "{filled}");
        assert!(compressed > 0 && compressed + filled < memory);
        assert!(bytes.len() < all.len() * 3 / 4, "{} bytes", bytes.len());
        assert_eq!(read_back(&bytes).unwrap(), (image.clone(), memories));
        assert_eq!(verified(&bytes[..]).unwrap(), image);
        // Written in one go, the same stream.
        assert_eq!(written(Vec::new(), &image, &all).unwrap().0, bytes);
    }

    fn noise_stream(chunks: usize) -> (SessionImage, Vec<u8>, Vec<u8>) {
        let size = (CHUNK * chunks) as u64;
        let memory = memory(2 * size, 5)[size as usize..].to_vec();
        let image = image(&[size]);
        let bytes = written(Vec::new(), &image, &memory).unwrap().0;
        (image, memory, bytes)
    }

    #[test]
    fn a_changed_byte_in_a_chunk_is_refused_naming_that_chunk() {
        let (image, memory, bytes) = noise_stream(4);
        let why = |bytes: &[u8]| read_back(bytes).unwrap_err().detail;
        let ptr = image.allocations[0].ptr;
        for n in [0, 2, 3] {
            let mut flipped = bytes.clone();
            flipped[chunk_start(&image, &[CHUNK; 4], n) + 1000] ^= 0x40;
            let at = ptr + (n * CHUNK) as u64;
            assert_eq!(
                why(&flipped),
                format!(
                    "the checkpoint is corrupt: chunk {n} ({CHUNK} bytes at {at:#x}) does not \
                     match its checksum"
                )
            );
            // Its checksum changed instead: the same.
            let mut flipped = bytes.clone();
            flipped[chunk_start(&image, &[CHUNK; 4], n) - 3] ^= 1;
            assert!(why(&flipped).contains(&format!("chunk {n} ")));
        }
        // Two chunks swapped: each is checked in its own place.
        let first = chunk_start(&image, &[CHUNK; 4], 0) - RECORD_HEAD;
        let second = chunk_start(&image, &[CHUNK; 4], 1) - RECORD_HEAD;
        let record = RECORD_HEAD + CHUNK;
        let mut swapped = bytes.clone();
        swapped[first..first + record].copy_from_slice(&bytes[second..second + record]);
        swapped[second..second + record].copy_from_slice(&bytes[first..first + record]);
        assert!(why(&swapped).contains("chunk 0 "), "{}", why(&swapped));
        // The same chunk from a stream of another header: refused too
        // (records are keyed by their stream's header).
        let mut other = image.clone();
        other.next_handle += 1;
        let foreign = written(Vec::new(), &other, &memory).unwrap().0;
        let theirs = chunk_start(&other, &[CHUNK; 4], 0) - RECORD_HEAD;
        let mut spliced = bytes.clone();
        spliced[first..first + record].copy_from_slice(&foreign[theirs..theirs + record]);
        assert!(why(&spliced).contains("chunk 0 "), "{}", why(&spliced));
    }

    #[test]
    fn truncated_longer_foreign_and_older_streams_are_refused() {
        let (_, _, bytes) = noise_stream(2);
        let why = |bytes: &[u8]| read_back(bytes).unwrap_err().detail;
        assert!(why(&bytes[..bytes.len() - 1]).contains("truncated"));
        assert!(why(&bytes[..bytes.len() - TRAILER]).contains("truncated"));
        assert!(why(&bytes[..bytes.len() / 2]).contains("truncated: it ends in chunk 0"));
        assert!(why(&bytes[..bytes.len() - TRAILER - 10]).contains("in chunk 1"));
        assert!(why(&bytes[..20]).contains("truncated"));
        assert!(why(&bytes[..40]).contains("truncated"));
        // The trailer's count or checksum changed.
        let mut counted = bytes.clone();
        let at = bytes.len() - TRAILER;
        counted[at] ^= 1;
        assert!(why(&counted).contains("checksum does not match"));
        let mut summed = bytes.clone();
        summed[bytes.len() - 1] ^= 1;
        assert!(why(&summed).contains("checksum does not match"));
        // The header.
        let mut header = bytes.clone();
        header[PREAMBLE + 3] ^= 0x40;
        assert!(why(&header).contains("header checksum"));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(why(&longer).contains("after its checksum"));
        assert!(why(b"\x7fELF and so on").contains("not a cumux checkpoint"));
        let mut older = bytes.clone();
        older[8] = 2;
        assert!(why(&older).contains("format 2; this cumux reads format 3"));
        let mut huge = bytes.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(why(&huge).contains("past the"));
    }

    #[test]
    fn a_chunk_of_one_value_is_a_fill_of_one_byte() {
        for value in [0u8, 0x5a, 0xff] {
            let image = image(&[CHUNK as u64 + 17]);
            let memory = vec![value; CHUNK + 17];
            let (bytes, _) = written(Vec::new(), &image, &memory).unwrap();
            let header = postcard::to_stdvec(&image).unwrap().len();
            assert_eq!(
                bytes.len(),
                PREAMBLE + header + 32 + 2 * (RECORD_HEAD + 1) + TRAILER
            );
            let (mut reader, _) = StreamReader::open(&bytes[..]).unwrap();
            let mut pieces = Vec::new();
            reader
                .pieces(&extents(&image), &mut |at, piece| {
                    pieces.push((at, piece));
                    Ok(())
                })
                .unwrap();
            reader.finish().unwrap();
            let ptr = image.allocations[0].ptr;
            assert_eq!(
                pieces,
                vec![
                    (
                        ptr,
                        Piece::Fill {
                            value,
                            len: CHUNK as u64
                        }
                    ),
                    (ptr + CHUNK as u64, Piece::Fill { value, len: 17 }),
                ]
            );
        }
        // One byte other than the rest: not a fill.
        let mut almost = vec![0u8; 9000];
        almost[8999] = 1;
        assert_eq!(one_value(&almost), None);
        assert_eq!(one_value(&almost[..8999]), Some(0));
    }

    #[test]
    fn a_header_can_be_rewritten_and_another_image_format_is_refused() {
        let (_, memory, bytes) = noise_stream(1);
        let changed = rewritten(&bytes, |i| i.next_handle = 10).unwrap();
        let (header, memories) = read_back(&changed).unwrap();
        assert_eq!(header.next_handle, 10);
        assert_eq!(memories, vec![memory]);
        let other = SessionImage {
            format: IMAGE_FORMAT + 1,
            ..image(&[])
        };
        let bytes = written(Vec::new(), &other, &[]).unwrap().0;
        assert!(read_back(&bytes).unwrap_err().detail.contains("format"));
    }
}
