//! A worker context's memory read back: a frame's worth a round trip, or a
//! span in pieces that the worker answers back to back, a piece of one byte
//! value as that value alone (a checkpoint's device reads, issue 17).

use std::io;

use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::{codes, encode, CuError, DevicePtr};

use super::context::{unexpected, WorkerContext};
use super::link::{io_err, Connection};
use super::wire::{WorkerRequest, WorkerValue, MAX_READ_SPAN};
use crate::device::pieces::{piece_count, Buffer, MemPiece, TakePiece};
use crate::locking::lock;

impl WorkerContext {
    /// Reads `buf` from `src` a frame's worth at a time, each part by the
    /// request `part` makes of its address and length.
    pub(super) fn read_chunks(
        &self,
        src: DevicePtr,
        buf: &mut [u8],
        part: impl Fn(DevicePtr, u64) -> WorkerRequest,
    ) -> Result<(), CuError> {
        let mut offset = 0u64;
        for chunk in buf.chunks_mut(MAX_CHUNK_BYTES) {
            let request = part(src.wrapping_add(offset), chunk.len() as u64);
            offset += chunk.len() as u64;
            match self.call(&request, &[], Some(chunk))? {
                WorkerValue::Bytes => {}
                other => return Err(unexpected(&other)),
            }
        }
        Ok(())
    }

    /// `DeviceContext::mem_read_pieces`: a [`WorkerRequest::MemReadPieces`]
    /// a span (of at most [`MAX_READ_SPAN`]), the worker reading its next
    /// piece while this side takes the last. A `take` that fails stops
    /// nothing in the worker: the span's other answers are read and dropped,
    /// so the connection stays in step.
    pub(super) fn read_pieces(
        &self,
        src: DevicePtr,
        len: u64,
        piece: usize,
        buffer: &mut Buffer<'_>,
        take: &mut TakePiece<'_>,
    ) -> Result<(), CuError> {
        piece_count(len, piece)?;
        if piece > MAX_CHUNK_BYTES {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("pieces of {piece} bytes"),
            ));
        }
        let mut offset = 0;
        while offset < len {
            let n = (len - offset).min(MAX_READ_SPAN / piece as u64 * piece as u64);
            self.read_span(src.wrapping_add(offset), n, piece, buffer, take)?;
            offset += n;
        }
        Ok(())
    }

    fn read_span(
        &self,
        src: DevicePtr,
        len: u64,
        piece: usize,
        buffer: &mut Buffer<'_>,
        take: &mut TakePiece<'_>,
    ) -> Result<(), CuError> {
        if let Some(e) = self.sticky() {
            return Err(e);
        }
        let request = WorkerRequest::MemReadPieces {
            src,
            len,
            piece: piece as u64,
        };
        let kind: &'static str = (&request).into();
        let mut slot = lock(&self.conn);
        let conn = self.connection(&mut slot)?;
        encode(&request)
            .map_err(io_err)
            .and_then(|bytes| conn.send_frames(&[&bytes]))
            .map_err(|e| self.died(&e))?;
        let mut taken = Ok(());
        let mut offset = 0;
        while offset < len {
            let n = (len - offset).min(piece as u64);
            let at = src.wrapping_add(offset);
            offset += n;
            let reply = self.receive(conn).map_err(|e| self.died(&e))?;
            if let Some(seq) = reply.marker {
                self.marked(seq, kind);
            }
            let got = match reply.result {
                Ok(WorkerValue::Fill(value)) => MemPiece::Fill { value, len: n },
                Ok(WorkerValue::Bytes) if taken.is_ok() => {
                    let mut buf = buffer(n as usize);
                    receive_into(conn, &mut buf).map_err(|e| self.died(&e))?;
                    MemPiece::Bytes(buf)
                }
                Ok(WorkerValue::Bytes) => {
                    let Connection { link, buf, .. } = conn;
                    link.recv_frame(buf).map_err(|e| self.died(&io_err(e)))?;
                    continue;
                }
                Ok(other) => {
                    let e = io_err(format!("{other:?} where a piece was due"));
                    return Err(self.died(&e));
                }
                // The worker's last answer to this request.
                Err(e) => {
                    if codes::is_fatal(e.code) {
                        lock(&self.sticky).get_or_insert_with(|| e.clone());
                    }
                    return Err(e);
                }
            };
            if taken.is_ok() {
                taken = take(at, got);
            }
        }
        taken
    }
}

/// The raw frame that follows a [`WorkerValue::Bytes`], straight into `out`.
fn receive_into(conn: &mut Connection, out: &mut [u8]) -> io::Result<()> {
    let Connection { link, buf, .. } = conn;
    link.recv_frame_into(buf, out)
}
