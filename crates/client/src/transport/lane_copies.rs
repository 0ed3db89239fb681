//! Large copies over a session's lanes: a host-to-device copy's chunks written
//! on every lane at once, a device-to-host copy's answers read from every lane at once.

use cumux_protocol::{self as proto, Call, Request};

use super::lane_streams::{Frame, LANE_CHUNKS};
use super::Connection;
use crate::errors::*;

impl Connection {
    /// The lanes a copy of `len` bytes in chunks of `size` goes on: `None`
    /// where it goes on the connection (no lanes open, or too few chunks).
    fn lanes_for(&mut self, len: usize, size: usize) -> Option<usize> {
        // Shared memory moves more than any socket; a resumable connection
        // keeps its calls to send again on one.
        if self.dead || self.shm.is_some() || self.resume.is_some() {
            return None;
        }
        if len.div_ceil(size) < LANE_CHUNKS {
            return None;
        }
        self.lanes.ready().map(|lanes| lanes.count())
    }

    /// Sends the plan of `count` calls on `lanes` lanes, with every call
    /// before it: the server takes the lanes' frames only from it on.
    fn send_plan(&mut self, count: usize, lanes: usize, replies: bool) -> CuResult<()> {
        self.seq += 1;
        let plan = Call::Lanes {
            count: count as u32,
            lanes: lanes as u32,
            replies,
        };
        self.send(self.seq, plan, None)?;
        let flushed = self.batch.flush(&mut super::locked(&self.wire).stream);
        flushed.map_err(|e| self.lost(format!("cannot send calls: {e}")))
    }

    /// [`Connection::calls_with_chunks`] over the lanes, where the copy
    /// takes them: each chunk's frame on the next lane, the answers here
    /// (none where the calls are unanswered, `forget`: a window's worth
    /// then waits for a fence, as other unanswered calls do).
    pub(super) fn chunks_on_lanes(
        &mut self,
        bytes: &[u8],
        size: usize,
        forget: bool,
        call: &impl Fn(u64, &[u8]) -> Call,
    ) -> Option<CuResult<()>> {
        let lanes = self.lanes_for(bytes.len(), size)?;
        Some((|| {
            if let Some(code) = self.fatal.filter(|_| forget) {
                return Err(code);
            }
            let count = bytes.len().div_ceil(size);
            self.send_plan(count, lanes, false)?;
            let first = self.seq + 1;
            let mut frames: Vec<Frame<'_>> = Vec::with_capacity(count);
            for (i, chunk) in bytes.chunks(size).enumerate() {
                let seq = first + i as u64;
                let c = call((i * size) as u64, chunk);
                if forget {
                    self.touched.note(&c);
                }
                self.quiet.sent(seq, &c);
                let msg = proto::encode(&Request { seq, call: c })
                    .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
                frames.push((msg, chunk));
            }
            self.seq += count as u64;
            let sent = match self.lanes.ready() {
                Some(lanes) => lanes.send(&frames),
                None => Err("the lanes closed".into()),
            };
            sent.map_err(|why| self.lost(format!("a copy's lane failed: {why}")))?;
            if !forget {
                return self.answers(first);
            }
            self.unanswered += count as u32;
            if self.unanswered >= super::SOCKET_FENCE_EVERY {
                self.unanswered = 0;
                self.pipelined_fence()?;
            }
            Ok(())
        })())
    }

    /// [`Connection::calls_into_chunks`] over the lanes, where the copy
    /// takes them: the requests here, each answer on the next lane, read
    /// straight into its chunk.
    pub(super) fn chunks_from_lanes(
        &mut self,
        out: &mut [u8],
        size: usize,
        call: &impl Fn(u64, &[u8]) -> Call,
    ) -> Option<CuResult<()>> {
        let lanes = self.lanes_for(out.len(), size)?;
        Some((|| {
            let count = out.len().div_ceil(size);
            self.send_plan(count, lanes, true)?;
            let first = self.seq + 1;
            for (i, chunk) in out.chunks(size).enumerate() {
                self.seq += 1;
                self.send(self.seq, call((i * size) as u64, chunk), None)?;
            }
            let into: Vec<&mut [u8]> = out.chunks_mut(size).collect();
            let received = match self.lanes.ready() {
                Some(lanes) => lanes.receive(first, into),
                None => Err("the lanes closed".into()),
            };
            let replies =
                received.map_err(|why| self.lost(format!("a copy's lane failed: {why}")))?;
            let mut failed = None;
            for reply in replies {
                if let Some(Err(e)) = self.answer(reply.seq, reply) {
                    failed = failed.or(Some(e));
                }
            }
            failed.map_or(Ok(()), Err)
        })())
    }
}
