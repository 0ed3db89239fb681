//! Large copies in chunks on a connection: through shared memory one call
//! after another, on a socket every chunk's request out before any answer is read.

use cumux_protocol::{self as proto, Call};

use super::{Connection, SOCKET_CHUNK_BYTES};
use crate::errors::*;

impl Connection {
    /// How large copies are cut: a frame's most through shared memory,
    /// [`SOCKET_CHUNK_BYTES`] on a socket.
    fn chunks(&self) -> usize {
        match self.shm {
            Some(_) => proto::framing::MAX_CHUNK_BYTES,
            None => SOCKET_CHUNK_BYTES,
        }
    }

    /// [`Link::calls_with_chunks`]: through shared memory one call after
    /// another; on a socket every chunk is sent before the answers are read,
    /// so that the round trips overlap (a remote server's RTT is paid once).
    pub fn calls_with_chunks(
        &mut self,
        bytes: &[u8],
        call: impl Fn(u64, &[u8]) -> Call,
    ) -> CuResult<()> {
        let size = self.chunks();
        // Unanswered calls (a copy on a stream) go one after another anyway.
        let at = |i: usize| (i * size) as u64;
        let forget = bytes
            .chunks(size)
            .next()
            .is_some_and(|chunk| call(0, chunk).is_fire_and_forget());
        if let Some(done) = self.chunks_on_lanes(bytes, size, forget, &call) {
            return done;
        }
        // A resumable connection has one answered call out at a time.
        if self.shm.is_some() || forget || self.resume.is_some() {
            for (i, chunk) in bytes.chunks(size).enumerate() {
                self.call_with_bytes(call(at(i), chunk), chunk)?;
            }
            return Ok(());
        }
        if self.dead {
            return Err(CUDA_ERROR_DEVICE_UNAVAILABLE);
        }
        let first = self.seq + 1;
        for (i, chunk) in bytes.chunks(size).enumerate() {
            self.seq += 1;
            let seq = self.seq;
            self.send(seq, call(at(i), chunk), Some(chunk))?;
        }
        self.answers(first)
    }

    /// [`Link::calls_into_chunks`]: the requests all leave first on a socket
    /// (they are small), then each answer lands in its chunk.
    pub fn calls_into_chunks(
        &mut self,
        out: &mut [u8],
        call: impl Fn(u64, &[u8]) -> Call,
    ) -> CuResult<()> {
        let size = self.chunks();
        let at = |i: usize| (i * size) as u64;
        let forget = out
            .chunks(size)
            .next()
            .is_some_and(|chunk| call(0, chunk).is_fire_and_forget());
        if self.shm.is_some() || forget || self.resume.is_some() {
            for (i, chunk) in out.chunks_mut(size).enumerate() {
                let c = call(at(i), chunk);
                self.call_into(c, chunk)?;
            }
            return Ok(());
        }
        if self.dead {
            return Err(CUDA_ERROR_DEVICE_UNAVAILABLE);
        }
        if let Some(done) = self.chunks_from_lanes(out, size, &call) {
            return done;
        }
        let first = self.seq + 1;
        for (i, chunk) in out.chunks(size).enumerate() {
            self.seq += 1;
            let seq = self.seq;
            self.send(seq, call(at(i), chunk), None)?;
        }
        let mut failed = None;
        for (i, chunk) in out.chunks_mut(size).enumerate() {
            let seq = first + i as u64;
            match self.receive_from_socket_into(seq, chunk) {
                Ok(()) => {}
                Err(e) if self.dead => return Err(e),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
