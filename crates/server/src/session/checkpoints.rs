//! Checkpoints as streams (issue 17): a session's state written from its
//! device straight into the file an admin's `cumux` passed (or into bytes,
//! for a connection that cannot pass one), and read back the same way, its
//! chunks packed and checked on a thread pool
//! ([`image_pipeline`](super::image_pipeline)).

use std::io::{BufReader, BufWriter, Write};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use cumux_protocol::{codes, Call, CuError, DevicePtr};

use super::core::err;
use super::file_writeback::Writeback;
use super::image::SessionImage;
use super::image_pipeline;
use super::image_stream::{extents, StreamReader, StreamWriter};
use super::memory_pipe::{read_allocations, Buffers, MemorySource, Put};
use super::stage_times::{Stage, StageTimes};
use super::{CallResult, Session};
use crate::device::DeviceContext;
use crate::moves::{Action, Checkpoint, CheckpointFile};

/// Buffering between a checkpoint stream and its file, for the small writes
/// and reads (chunks' heads); chunks themselves pass straight through.
const FILE_BUFFER: usize = 1 << 20;

/// A move's memory: read from the session's own context, piece by piece
/// (a piece of one value found by the device side goes as a fill).
pub(super) struct FromContext<'a> {
    ctx: &'a dyn DeviceContext,
}

impl<'a> FromContext<'a> {
    pub(super) fn new(ctx: &'a dyn DeviceContext) -> Self {
        FromContext { ctx }
    }
}

impl MemorySource for FromContext<'_> {
    fn pour(
        &mut self,
        allocations: &[(DevicePtr, u64)],
        buffers: &Buffers,
        put: &mut Put<'_>,
    ) -> Result<(), CuError> {
        read_allocations(self.ctx, allocations, buffers, put)
    }

    fn context(&self) -> Option<&dyn DeviceContext> {
        Some(self.ctx)
    }
}

/// What a checkpoint stream holds: bytes of memory, of them stored
/// compressed and as fills, and the stream's bytes.
struct Written {
    memory: u64,
    compressed: u64,
    filled: u64,
    size: u64,
}

impl Written {
    fn line(&self) -> String {
        let Written {
            memory,
            compressed,
            filled,
            size,
        } = self;
        format!(
            "{memory} bytes of memory ({compressed} of them compressed, {filled} one value \
             repeated) and the session's layout, {size} bytes written"
        )
    }
}

/// A descriptor an admin passed, as a regular file (a pipe or socket could
/// leave the session's thread waiting on it).
fn regular_file(file: &CheckpointFile) -> Result<&std::fs::File, CuError> {
    let meta = file.0.metadata().map_err(|e| {
        err(
            codes::INVALID_VALUE,
            format!("the checkpoint's descriptor: {e}"),
        )
    })?;
    if !meta.is_file() {
        return Err(err(
            codes::INVALID_VALUE,
            "the checkpoint's descriptor is not a regular file",
        ));
    }
    Ok(&file.0)
}

impl Session {
    /// `Call::SessionCheckpointFile`, `SessionRestoreFile` (admins only):
    /// the order, with the file whose descriptor came with the call.
    pub(super) fn file_order(&mut self, call: &Call) -> CallResult {
        let fd = self.take_incoming_fd();
        self.admin()?;
        let fd: OwnedFd = fd.map_err(|why| {
            err(
                codes::INVALID_VALUE,
                format!("no checkpoint file came with the call: {why}"),
            )
        })?;
        let file = CheckpointFile(Arc::new(std::fs::File::from(fd)));
        regular_file(&file)?;
        match *call {
            Call::SessionCheckpointFile {
                session,
                wait_ms,
                hold,
            } => {
                let action = match hold {
                    true => Action::Hold(Some(file)),
                    false => Action::Checkpoint(Some(file)),
                };
                self.order(session, action, wait_ms)
            }
            Call::SessionRestoreFile { session, wait_ms } => {
                self.order(session, Action::Restore(Checkpoint::File(file)), wait_ms)
            }
            _ => Err(err(codes::UNKNOWN, "not an order with a file")),
        }
    }

    /// The checkpoint stream of `image` (the session's state, its work
    /// drained), written into `file` and synced (then a line saying so
    /// comes back) or else into bytes (then they come back). A file the
    /// stream failed in is left empty, so nothing in it looks like a
    /// checkpoint. The line says where the time went ([`StageTimes`]).
    pub(super) fn checkpoint_into(
        &self,
        image: &SessionImage,
        file: Option<&CheckpointFile>,
    ) -> Result<Vec<u8>, CuError> {
        let started = Instant::now();
        let times = StageTimes::default();
        let Some(file) = file else {
            return self
                .write_stream(image, Vec::new(), &times)
                .map(|(bytes, ..)| bytes);
        };
        let out = regular_file(file)?;
        let written = self
            .write_stream(
                image,
                BufWriter::with_capacity(FILE_BUFFER, Writeback::new(out)),
                &times,
            )
            .and_then(|(out, said)| {
                let cannot = |e: std::io::Error| {
                    err(codes::UNKNOWN, format!("cannot write the checkpoint: {e}"))
                };
                let mut out = out.into_inner().map_err(|e| cannot(e.into_error()))?;
                times.timed(Stage::Sync, || out.sync()).map_err(cannot)?;
                Ok(said)
            });
        match written {
            Ok(said) => {
                let line = format!(
                    "{} {}",
                    said.line(),
                    times.summary(said.memory, started.elapsed(), image_pipeline::threads())
                );
                tracing::info!(session = self.id(), "checkpointed: {line}");
                Ok(line.into_bytes())
            }
            Err(e) => {
                let _ = out.set_len(0);
                Err(e)
            }
        }
    }

    /// `image`'s stream into `out`, memory read from the device a few
    /// pieces ahead and packed on a thread pool: `out`, and what was written.
    fn write_stream<W: Write>(
        &self,
        image: &SessionImage,
        out: W,
        times: &StageTimes,
    ) -> Result<(W, Written), CuError> {
        let mut writer = StreamWriter::start(out, image)?;
        image_pipeline::write_memory(self.ctx.as_ref(), &extents(image), &mut writer, times)?;
        let (memory, compressed, filled) = (writer.memory, writer.compressed, writer.filled);
        let (out, size) = times.timed(Stage::Write, || writer.finish())?;
        Ok((
            out,
            Written {
                memory,
                compressed,
                filled,
                size,
            },
        ))
    }

    /// `Action::Restore`: the session's state replaced by a checkpoint's,
    /// read and checked as it is rebuilt (a checkpoint that fails its
    /// checksum at the end leaves the session as it was).
    pub(super) fn restore(&mut self, from: &Checkpoint) -> Result<String, CuError> {
        match from {
            Checkpoint::Bytes(bytes) => {
                let (mut reader, image) = StreamReader::open(&bytes[..])?;
                self.restore_image(image, &mut reader)
            }
            Checkpoint::File(file) => {
                let input = BufReader::with_capacity(FILE_BUFFER, regular_file(file)?);
                let (mut reader, image) = StreamReader::open(input)?;
                self.restore_image(image, &mut reader)
            }
        }
    }
}
