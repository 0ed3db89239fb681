//! A checkpoint's file as the session writes it (issue 17): its pages handed
//! to the disk a slice at a time while the stream goes on, so that the sync
//! at its end finds little left and few dirty pages wait in the page cache.

use std::fs::File;
use std::io::{self, Seek, Write};
use std::os::fd::AsRawFd;

/// Bytes whose writeback starts at once, in one go.
const SLICE: u64 = 32 << 20;
/// Bytes written but not yet known on disk at most, before the writer
/// waits for the oldest slice (the disk's pace, where it is the slower).
const DIRTY: u64 = 8 * SLICE;

/// Writes into a file, starting each full slice's writeback.
pub(super) struct Writeback<'f> {
    file: &'f File,
    /// Where the first byte went, and bytes written since.
    base: u64,
    written: u64,
    /// Bytes whose writeback was started, and of them those waited for.
    started: u64,
    waited: u64,
}

impl<'f> Writeback<'f> {
    /// Writes at `file`'s own position.
    pub(super) fn new(file: &'f File) -> Self {
        let mut at = file;
        let base = at.stream_position().unwrap_or(0);
        Writeback {
            file,
            base,
            written: 0,
            started: 0,
            waited: 0,
        }
    }

    /// Everything written, on disk: the file's data synced.
    pub(super) fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// `sync_file_range` over `len` bytes from `from` (relative to the
    /// first write). Advice only: an error here shows again at the sync.
    fn range(&self, from: u64, len: u64, flags: libc::c_uint) {
        let (Ok(offset), Ok(len)) = (i64::try_from(self.base + from), i64::try_from(len)) else {
            return;
        };
        // SAFETY: the descriptor is the open file this writer borrows for
        // its whole life; the call reads no memory of ours.
        unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), offset, len, flags);
        }
    }
}

impl Write for Writeback<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = (&mut &*self.file).write(buf)?;
        self.written += n as u64;
        while self.written - self.started >= SLICE {
            self.range(self.started, SLICE, libc::SYNC_FILE_RANGE_WRITE);
            self.started += SLICE;
        }
        while self.started - self.waited > DIRTY {
            let all = libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER;
            self.range(self.waited, SLICE, all);
            self.waited += SLICE;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn bytes_land_in_order_after_a_start_and_slices_go_to_disk_as_they_fill() {
        let mut file = tempfile_in_target();
        file.write_all(b"head").unwrap();
        let piece: Vec<u8> = (0..(3 << 20)).map(|i| (i % 251) as u8).collect();
        let mut out = Writeback::new(&file);
        let rounds = (SLICE * 10 / piece.len() as u64 + 1) as usize;
        for _ in 0..rounds {
            out.write_all(&piece).unwrap();
        }
        assert!(out.started >= SLICE * 10 && out.waited > 0);
        assert!(out.started - out.waited <= DIRTY);
        out.sync().unwrap();
        let mut back = Vec::new();
        let mut read = &file;
        read.rewind().unwrap();
        read.read_to_end(&mut back).unwrap();
        assert_eq!(&back[..4], b"head");
        assert_eq!(back.len(), 4 + rounds * piece.len());
        assert!(back[4..].chunks(piece.len()).all(|c| c == &piece[..]));
    }

    /// 1 GiB into a file in the temp folder (`CUMUX_WRITEBACK_DIR` to pick
    /// another), in 4 MiB writes, then synced: plainly, and through
    /// [`Writeback`], alternating. Run with `cargo test -p cumux-server --lib
    /// file_writeback -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn throughput() {
        use std::time::Instant;
        let dir = std::env::var("CUMUX_WRITEBACK_DIR").unwrap_or_else(|_| "/tmp".into());
        let piece: Vec<u8> = (0..(4 << 20)).map(|i| (i * 7 % 251) as u8).collect();
        for round in 0..3 {
            for through in [false, true] {
                let path = std::path::Path::new(&dir).join("cumux-writeback-bench");
                let file = File::create(&path).unwrap();
                let started = Instant::now();
                let mut out = Writeback::new(&file);
                let mut plain = std::io::BufWriter::with_capacity(1 << 20, &file);
                let mut buffered = std::io::BufWriter::with_capacity(1 << 20, &mut out);
                // As a stream's records are: a head of 41 bytes, then the chunk.
                for _ in 0..256 {
                    let head = [1u8; 41];
                    match through {
                        true => buffered
                            .write_all(&head)
                            .and_then(|()| buffered.write_all(&piece)),
                        false => plain
                            .write_all(&head)
                            .and_then(|()| plain.write_all(&piece)),
                    }
                    .unwrap();
                }
                buffered.flush().unwrap();
                plain.flush().unwrap();
                drop((buffered, plain));
                let written = started.elapsed();
                out.sync().unwrap();
                println!(
                    "round {round}, {}: written {:.2} s, synced {:.2} s",
                    if through { "writeback" } else { "plain" },
                    written.as_secs_f64(),
                    started.elapsed().as_secs_f64()
                );
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    fn tempfile_in_target() -> File {
        let path = std::env::temp_dir().join(format!("cumux-writeback-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        file
    }
}
