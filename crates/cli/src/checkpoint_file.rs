//! The checkpoint file (`cumux checkpoint`, `cumux restore`): a versioned
//! header, the session's image compressed by zstd as it streams to disk, and
//! a SHA-256 of all before it, so a truncated or foreign file is refused.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"CUMUXCKP";
/// The layout this cumux writes and reads.
pub const FORMAT: u32 = 1;
/// The payload is zstd-compressed.
const ZSTD: u32 = 1;
/// Magic, format, flags, the image's length.
const HEADER: usize = 8 + 4 + 4 + 8;
const TRAILER: usize = 32;
/// The largest image a file may say it holds (the protocol's frame limit
/// bounds what a server sends anyway).
const MAX_IMAGE: u64 = 1 << 36;
/// zstd's fast level: memory images are mostly zeros and repeated values,
/// and a faster level would not shrink them much further.
const LEVEL: i32 = 1;

/// Bytes on their way to the file, hashed as they pass.
struct Hashing<W: Write> {
    inner: W,
    hash: Sha256,
    written: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `image` to `path` (through a file beside it, renamed when
/// complete, so no half-written file takes the name); the file's size.
pub fn write(path: &Path, image: &[u8]) -> Result<u64> {
    let partial = path.with_extension("partial");
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut out = Hashing {
        inner: BufWriter::new(file),
        hash: Sha256::new(),
        written: 0,
    };
    let wrote = (|| -> std::io::Result<u64> {
        out.write_all(MAGIC)?;
        out.write_all(&FORMAT.to_le_bytes())?;
        out.write_all(&ZSTD.to_le_bytes())?;
        out.write_all(&(image.len() as u64).to_le_bytes())?;
        let mut encoder = zstd::stream::Encoder::new(&mut out, LEVEL)?;
        encoder.write_all(image)?;
        encoder.finish()?;
        let digest = out.hash.clone().finalize();
        out.inner.write_all(&digest)?;
        out.inner.flush()?;
        out.inner.get_ref().sync_all()?;
        Ok(out.written + TRAILER as u64)
    })();
    let size = match wrote {
        Ok(size) => size,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e).with_context(|| format!("cannot write {}", partial.display()));
        }
    };
    std::fs::rename(&partial, path)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), path.display()))?;
    Ok(size)
}

/// The image in the checkpoint at `path`, or why it is refused.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    decode(&bytes).with_context(|| format!("{} is refused", path.display()))
}

/// The image in a checkpoint file's bytes.
pub fn decode(bytes: &[u8]) -> Result<Vec<u8>> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        bail!("it is not a cumux checkpoint (no CUMUXCKP header)");
    }
    if bytes.len() < HEADER + TRAILER {
        bail!(
            "it is truncated: {} bytes, not even a header and checksum",
            bytes.len()
        );
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default());
    let (format, flags) = (word(8), word(12));
    if format != FORMAT {
        bail!("it is a checkpoint of format {format}; this cumux reads format {FORMAT}");
    }
    let (body, checksum) = bytes.split_at(bytes.len() - TRAILER);
    if Sha256::digest(body).as_slice() != checksum {
        bail!("its checksum does not match: the file is truncated or corrupt");
    }
    let length = u64::from_le_bytes(bytes[16..24].try_into().unwrap_or_default());
    if length > MAX_IMAGE {
        bail!("it says it holds {length} bytes, past the {MAX_IMAGE} a checkpoint may");
    }
    let payload = &body[HEADER..];
    let image = match flags {
        0 => payload.to_vec(),
        ZSTD => zstd::bulk::decompress(payload, length as usize)
            .context("its compressed image does not unpack")?,
        other => bail!("it has flags {other:#x} this cumux does not know"),
    };
    if image.len() as u64 != length {
        bail!(
            "its image is {} bytes, its header says {length}",
            image.len()
        );
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_reads_back_and_truncated_corrupt_or_foreign_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("cumux-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.ckpt");
        let image: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i / 7).to_le_bytes())
            .collect();
        let size = write(&path, &image).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, size);
        assert!(size < image.len() as u64 / 2, "compressed: {size}");
        assert_eq!(read(&path).unwrap(), image);
        let why = |bytes: &[u8]| format!("{:#}", decode(bytes).unwrap_err());
        assert!(why(&bytes[..bytes.len() - 1]).contains("checksum"));
        assert!(why(&bytes[..bytes.len() / 2]).contains("checksum"));
        assert!(why(&bytes[..10]).contains("truncated"));
        let mut flipped = bytes.clone();
        flipped[HEADER + 3] ^= 1;
        assert!(why(&flipped).contains("checksum"));
        assert!(why(b"\x7fELF and so on").contains("not a cumux checkpoint"));
        let mut future = bytes.clone();
        future[8] = 9;
        assert!(why(&future).contains("format 9"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
