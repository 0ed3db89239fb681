//! [`Link`]: one connection between the server and a worker, carrying frames on
//! the socket at first and through a shared-memory area once both sides agree;
//! and [`Connection`], the server's end of one, which makes the offer.
//!
//! A connection starts on its unix socket with length-prefixed frames. The
//! server then offers an area ([`Link::offer_area`]): it creates a sealed memfd
//! (`shm::ShmArea::create`), sends the offer request with the memfd attached
//! (`SCM_RIGHTS`) and waits for the answer on the socket. A worker that maps it
//! answers yes and switches ([`Link::accept_area`]); the server switches once it
//! reads the yes, so no frame is ever in flight on both paths. From then on each
//! frame is one message of the area (in its bulk ring from [`BULK_THRESHOLD`]
//! bytes on), in the order sent, and the socket carries only descriptors (a
//! one-byte tag each, sent before the frame that needs it) and liveness: its
//! hang-up is what tells either side that the other is gone. A refusal, or an
//! area that cannot be made, leaves the connection on the socket. Posts may
//! be held back from the worker's doorbell ([`Connection::post_frames`]):
//! published without ringing, for the next request that waits to ring once
//! for all.

use std::io::{self, BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use cumux_protocol::shm::{self, Endpoint, ShmArea, ShmError, ShmLayout, Side, BULK_THRESHOLD};
use cumux_protocol::{codes, decode, encode, read_frame, write_frame, CuError, FrameError};
use serde::Serialize;

use super::wire::{WorkerReply, WorkerRequest, WorkerValue};
use crate::device::socket_bytes::SendBytes;
use crate::device::spin::{answer_spin_time, SpinReader};

/// `socket` keeps every worker connection on its socket; anything else (or
/// nothing) lets the server offer shared memory.
pub const TRANSPORT_ENV: &str = "CUMUX_WORKER_TRANSPORT";

/// The rings of a worker connection's area: 1 MiB message rings and 16 MiB
/// bulk rings, pages allocated as they are first touched.
pub const WORKER_LAYOUT: ShmLayout = shm::DEFAULT_LAYOUT;

/// How long the server waits for a worker's answer to an offer.
const OFFER_WAIT: Duration = Duration::from_secs(30);
/// How long a worker waits for a descriptor the server announced.
const FD_WAIT: Duration = Duration::from_secs(10);
/// The byte sent with each descriptor once frames travel through the area.
const FD_TAG: u8 = 0xfd;

/// An I/O error that says `e`.
pub fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// Whether the server offers workers shared memory ([`TRANSPORT_ENV`]).
pub fn shm_wanted() -> bool {
    std::env::var(TRANSPORT_ENV)
        .map(|v| v.trim() != "socket")
        .unwrap_or(true)
}

/// One connection's frames, on the socket or through an area.
pub struct Link {
    /// The socket, read for frames until the switch and for descriptors after it.
    reader: BufReader<SpinReader>,
    writer: UnixStream,
    shm: Option<Endpoint>,
    /// Whether the next frame is the first after a synchronize's mark, and
    /// whether the last such wait outlasted the usual spin.
    after_mark: bool,
    mark_waits_long: bool,
}

fn violation(e: ShmError) -> io::Error {
    match e {
        ShmError::PeerGone => io::Error::new(io::ErrorKind::BrokenPipe, "the peer went away"),
        ShmError::Violation(why) => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("shared-memory link: {why}"),
        ),
    }
}

impl Link {
    /// A link on `stream`, whose reads poll for `spin` before they block.
    pub fn new(stream: UnixStream, spin: Duration) -> io::Result<Link> {
        let writer = stream.try_clone()?;
        Ok(Link {
            reader: BufReader::new(SpinReader::new(stream, spin)),
            writer,
            shm: None,
            after_mark: false,
            mark_waits_long: false,
        })
    }

    /// A synchronize's mark went to the device: its client calls again as
    /// soon as the work is done. Where the last wait after such a mark
    /// outlasted the usual spin (work longer than it: a worker asleep by its
    /// end costs the next call a wake-up), the next frame is polled for up
    /// to `long`. Shorter work is left alone: polling longer after every
    /// launch and synchronize made that round trip slower on the H200.
    pub fn after_sync_mark(&mut self, long: Duration) {
        let Some(ep) = &mut self.shm else {
            return;
        };
        self.after_mark = true;
        if self.mark_waits_long {
            ep.spin_longer_once(long);
        }
    }

    /// After the frame a wait after a mark took `waited` for came (the
    /// endpoint spins as usual again): what that says of the next one.
    fn after_frame(&mut self, waited: Duration) {
        self.after_mark = false;
        if let Some(ep) = &self.shm {
            self.mark_waits_long = waited > ep.spin();
        }
    }

    /// Whether frames travel through a shared-memory area.
    pub fn is_shm(&self) -> bool {
        self.shm.is_some()
    }

    /// The socket (for timeouts and shutdown).
    pub fn socket(&self) -> &UnixStream {
        &self.writer
    }

    /// Polls (or spins) for `spin` before sleeping, from the next wait on.
    pub fn set_spin(&mut self, spin: Duration) {
        self.reader.get_mut().set_spin(spin);
        if let Some(ep) = &mut self.shm {
            ep.set_spin(spin);
        }
    }

    /// Sends one frame.
    pub fn send_frame(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.shm {
            None => write_frame(&mut self.writer, bytes).map_err(frame_err),
            Some(ep) if bytes.len() >= BULK_THRESHOLD => ep.send(&[], bytes).map_err(violation),
            Some(ep) => ep.send(bytes, &[]).map_err(violation),
        }
    }

    /// Sends `frames` in order; on shared memory a sleeping worker is rung
    /// once, after the last, so that it wakes to all of them (a request and
    /// the data that follows it).
    pub fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        let Some((last, first)) = frames.split_last() else {
            return Ok(());
        };
        self.send_frames_quiet(first)?;
        self.send_frame(last)
    }

    /// Sends `frames` in order without ringing a sleeping worker (on shared
    /// memory; a ring that fills meanwhile rings): the next frame sent with
    /// [`Link::send_frames`], or [`Link::ring`], wakes it to them.
    pub fn send_frames_quiet(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        match &mut self.shm {
            None => {
                for frame in frames {
                    write_frame(&mut self.writer, frame).map_err(frame_err)?;
                }
                Ok(())
            }
            Some(ep) => {
                for frame in frames {
                    match frame.len() >= BULK_THRESHOLD {
                        true => ep.send_quiet(&[], frame),
                        false => ep.send_quiet(frame, &[]),
                    }
                    .map_err(violation)?;
                }
                Ok(())
            }
        }
    }

    /// Sends, without ringing (as [`Link::send_frames_quiet`]), `request`
    /// and a frame of the `len` bytes `fill` yields, once they all came: on
    /// shared memory written by `fill` straight into the bulk ring's free
    /// room ahead of the request (where it has the room now), else into a
    /// buffer. Where `fill` fails nothing is sent, so a copy cut short
    /// writes nothing. Outer error: the link; inner: `fill`.
    pub fn send_filled_quiet(
        &mut self,
        request: &[u8],
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<io::Result<()>> {
        // (A request of its own bulk would take the bytes' place.)
        let ahead = match request.len() < BULK_THRESHOLD {
            true => self.fill_ahead(len, fill)?,
            false => None,
        };
        match ahead {
            Some(Ok(())) => {
                self.send_frames_quiet(&[request])?;
                let ep = self
                    .shm
                    .as_mut()
                    .ok_or_else(|| io_err("no shared memory"))?;
                ep.send_filled_ahead_quiet().map_err(violation)?;
                Ok(Ok(()))
            }
            Some(Err(e)) => Ok(Err(e)),
            None => {
                let mut data = vec![0u8; len];
                if let Err(e) = fill(&mut data) {
                    return Ok(Err(e));
                }
                self.send_frames_quiet(&[request, &data])?;
                Ok(Ok(()))
            }
        }
    }

    /// Fills the next frame, of `len` bytes, in place with `fill` (shared
    /// memory, from [`BULK_THRESHOLD`] on, where the ring has the room now)
    /// for [`Link::send_filled_ahead`] to send after other frames. `None`,
    /// nothing filled, elsewhere; inner error: `fill`.
    pub fn fill_ahead(
        &mut self,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<Option<io::Result<()>>> {
        match &mut self.shm {
            Some(ep) if len >= BULK_THRESHOLD => ep.fill_ahead(len, fill).map_err(violation),
            _ => Ok(None),
        }
    }

    /// Sends the frame [`Link::fill_ahead`] filled.
    pub fn send_filled_ahead(&mut self) -> io::Result<()> {
        match &mut self.shm {
            Some(ep) => ep.send_filled_ahead().map_err(violation),
            None => Err(io_err("no frame was filled ahead")),
        }
    }

    /// Receives one frame of `len` bytes and hands it to `send`: on shared
    /// memory from where it lies in the ring, held there for `send` to send
    /// in its own time where the ring has room to spare, else copied out for
    /// it (`scratch` holds any
    /// other frame, which is an error). Outer error: the link (or a frame of
    /// another length); inner: `send`, the frame consumed all the same.
    pub fn recv_frame_sent(
        &mut self,
        scratch: &mut Vec<u8>,
        len: usize,
        send: &mut dyn SendBytes,
    ) -> io::Result<io::Result<()>> {
        if let Some(ep) = &mut self.shm {
            let bulk = ep.recv_message(scratch).map_err(violation)?;
            if scratch.is_empty() && bulk == len {
                if let Some(held) = ep.recv_bulk_held(len).map_err(violation)? {
                    return Ok(send.send_held(held));
                }
                // The ring cannot keep more: the bytes go out of it.
                let mut data = Vec::new();
                ep.recv_bulk_vec(&mut data, len).map_err(violation)?;
                return Ok(send.send_owned(data));
            }
            ep.recv_bulk_vec(scratch, bulk).map_err(violation)?;
        } else {
            read_frame(&mut self.reader, scratch).map_err(frame_err)?;
        }
        if scratch.len() != len {
            return Err(io_err(format!(
                "a frame of {} bytes where {len} were due",
                scratch.len()
            )));
        }
        Ok(send.send(scratch))
    }

    /// Rings a sleeping peer for frames sent quietly.
    pub fn ring(&mut self) {
        if let Some(ep) = &mut self.shm {
            ep.ring();
        }
    }

    /// Sends `msg`, encoded, as one frame.
    pub fn send_message<T: Serialize>(&mut self, msg: &T) -> io::Result<()> {
        let bytes = encode(msg).map_err(io_err)?;
        self.send_frame(&bytes)
    }

    /// Sends one frame with `fd` attached: on the socket in the same message,
    /// or, on shared memory, on the socket (with a tag byte) before the frame.
    pub fn send_frame_with_fd(&mut self, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
        if self.shm.is_some() {
            shm::send_with_fd(&self.writer, &[FD_TAG], fd)?;
            return self.send_frame(bytes);
        }
        let mut framed = Vec::with_capacity(4 + bytes.len());
        framed.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        framed.extend_from_slice(bytes);
        shm::send_with_fd(&self.writer, &framed, fd)
    }

    /// Receives one frame into `buf`. [`FrameError::Closed`]: the peer closed
    /// the connection (or, on shared memory, went away).
    pub fn recv_frame(&mut self, buf: &mut Vec<u8>) -> Result<(), FrameError> {
        let Some(ep) = &mut self.shm else {
            return read_frame(&mut self.reader, buf);
        };
        // (timed only where the wait follows a synchronize's mark)
        let started = self.after_mark.then(std::time::Instant::now);
        let received = ep
            .recv_message(buf)
            .and_then(|bulk| ep.recv_bulk_vec(buf, bulk));
        if let Some(started) = started {
            self.after_frame(started.elapsed());
        }
        match received {
            Ok(()) => Ok(()),
            Err(ShmError::PeerGone) => Err(FrameError::Closed),
            Err(e) => Err(FrameError::Io(violation(e))),
        }
    }

    /// Receives one frame and hands `take` its length and a reader of its
    /// bytes, piece after piece (as `Endpoint::recv_bulk_taken`): on shared
    /// memory straight from the ring, else from `scratch`. What `take`
    /// leaves is consumed.
    pub fn recv_frame_taken<T>(
        &mut self,
        scratch: &mut Vec<u8>,
        take: impl FnOnce(usize, &mut dyn FnMut(&mut [u8]) -> io::Result<()>) -> T,
    ) -> io::Result<T> {
        if let Some(ep) = &mut self.shm {
            let bulk = ep.recv_message(scratch).map_err(violation)?;
            if scratch.is_empty() && bulk > 0 {
                return ep
                    .recv_bulk_taken(bulk, |read| take(bulk, read))
                    .map_err(violation);
            }
            ep.recv_bulk_vec(scratch, bulk).map_err(violation)?;
        } else {
            read_frame(&mut self.reader, scratch).map_err(frame_err)?;
        }
        let len = scratch.len();
        let mut from = &scratch[..];
        Ok(take(len, &mut |out| io::Read::read_exact(&mut from, out)))
    }

    /// Receives one frame of exactly `out`'s length into `out` (on shared
    /// memory straight from the ring; `scratch` holds any other frame,
    /// which is an error).
    pub fn recv_frame_into(&mut self, scratch: &mut Vec<u8>, out: &mut [u8]) -> io::Result<()> {
        let unexpected =
            |n: usize| io_err(format!("a frame of {n} bytes where {} were due", out.len()));
        let Some(ep) = &mut self.shm else {
            read_frame(&mut self.reader, scratch).map_err(frame_err)?;
            if scratch.len() != out.len() {
                return Err(unexpected(scratch.len()));
            }
            out.copy_from_slice(scratch);
            return Ok(());
        };
        let bulk = ep.recv_message(scratch).map_err(violation)?;
        if scratch.is_empty() && bulk == out.len() {
            return ep.recv_bulk_into(out).map_err(violation);
        }
        ep.recv_bulk_vec(scratch, bulk).map_err(violation)?;
        if scratch.len() != out.len() {
            return Err(unexpected(scratch.len()));
        }
        out.copy_from_slice(scratch);
        Ok(())
    }

    /// The descriptor that came with the last frame (on the socket), or the
    /// next one announced on the socket (on shared memory), waited for briefly.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        if self.shm.is_none() {
            return self.reader.get_mut().take_fd();
        }
        let _ = self.writer.set_read_timeout(Some(FD_WAIT));
        let mut tag = [0u8; 1];
        let read = self.reader.read_exact(&mut tag);
        let _ = self.writer.set_read_timeout(None);
        match read {
            Ok(()) if tag[0] == FD_TAG => self.reader.get_mut().take_fd(),
            Ok(()) => {
                tracing::warn!(
                    "worker link: byte {:#x} where a descriptor's tag belongs",
                    tag[0]
                );
                None
            }
            Err(e) => {
                tracing::warn!("worker link: no descriptor came: {e}");
                None
            }
        }
    }

    /// Server side: offers the worker an area of `layout`. `request` encodes
    /// the offer; `answer` reads the worker's reply frame (`Err`: a refusal).
    /// `Ok(Err(why))`: the link stays on the socket; `Err`: the socket failed.
    pub fn offer_area(
        &mut self,
        layout: ShmLayout,
        spin: Duration,
        request: &[u8],
        answer: impl FnOnce(&[u8]) -> Result<(), String>,
    ) -> io::Result<Result<(), String>> {
        if self.shm.is_some() {
            return Ok(Ok(()));
        }
        let (area, fd) = match ShmArea::create(layout) {
            Ok(made) => made,
            Err(e) => return Ok(Err(format!("cannot create an area: {e}"))),
        };
        self.send_frame_with_fd(request, fd.as_fd())?;
        drop(fd);
        let _ = self.writer.set_read_timeout(Some(OFFER_WAIT));
        let mut reply = Vec::new();
        let read = read_frame(&mut self.reader, &mut reply);
        let _ = self.writer.set_read_timeout(None);
        read.map_err(frame_err)?;
        if let Err(why) = answer(&reply) {
            return Ok(Err(why));
        }
        self.switch(area, Side::Client, spin)?;
        Ok(Ok(()))
    }

    /// Worker side: maps the area offered with the last frame; after the
    /// answer is sent on the socket, [`Link::switch_to`] makes it the path.
    pub fn accept_area(&mut self, layout: ShmLayout) -> Result<ShmArea, String> {
        if self.shm.is_some() {
            return Err("the connection is already on shared memory".into());
        }
        let fd = self
            .reader
            .get_mut()
            .take_fd()
            .ok_or("no memfd came with the offer")?;
        ShmArea::attach(fd, layout)
    }

    /// Worker side: frames travel through `area` from now on.
    pub fn switch_to(&mut self, area: ShmArea) -> io::Result<()> {
        let spin = self.reader.get_ref().spin();
        self.switch(area, Side::Server, spin)
    }

    fn switch(&mut self, area: ShmArea, side: Side, spin: Duration) -> io::Result<()> {
        if !self.reader.buffer().is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "bytes on the socket after the switch to shared memory",
            ));
        }
        let liveness = OwnedFd::from(self.writer.try_clone()?);
        self.shm = Some(Endpoint::new(area, side, Some(liveness), spin));
        Ok(())
    }
}

fn frame_err(e: FrameError) -> io::Error {
    match e {
        FrameError::Io(e) => e,
        FrameError::Closed => io::Error::new(io::ErrorKind::UnexpectedEof, "the socket closed"),
        other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
    }
}

/// The server's end of a connection to a worker: its link, the buffer
/// replies are read into, and whether posts go unrung.
pub struct Connection {
    pub link: Link,
    pub buf: Vec<u8>,
    held: Held,
}

/// Posts held back from the worker's doorbell ([`Connection::post_frames`]):
/// each published as it comes (a worker that polls takes it at once), a
/// sleeping worker rung only by the next request that waits for an answer
/// (or [`Connection::ring`]), so that it wakes once to the whole batch.
#[derive(Default)]
struct Held {
    /// Frames were published without a ring since the last one.
    unrung: bool,
}

impl Connection {
    /// A connection over `stream`, still on the socket.
    pub fn new(stream: UnixStream) -> Result<Connection, CuError> {
        let link = Link::new(stream, answer_spin_time()).map_err(|e| {
            CuError::new(
                codes::UNKNOWN,
                format!("cannot clone the worker socket: {e}"),
            )
        })?;
        Ok(Connection {
            link,
            buf: Vec::new(),
            held: Held::default(),
        })
    }

    /// Rings a sleeping worker for what was posted unrung.
    pub fn ring(&mut self) {
        if std::mem::take(&mut self.held.unrung) {
            self.link.ring();
        }
    }

    /// Posts `frames` (a request no answer comes for, and its data); `held`:
    /// without ringing a sleeping worker.
    pub fn post_frames(&mut self, frames: &[&[u8]], held: bool) -> io::Result<()> {
        match held {
            true => {
                self.held.unrung = true;
                self.link.send_frames_quiet(frames)
            }
            false => self.send_frames(frames),
        }
    }

    /// Posts `request` (encoded, no answer comes) and a frame of the `len`
    /// bytes `fill` writes in place ([`Link::send_filled_quiet`]): neither
    /// where `fill` fails. `held`: without ringing a sleeping worker.
    pub fn post_filled(
        &mut self,
        request: &[u8],
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
        held: bool,
    ) -> io::Result<io::Result<()>> {
        let filled = self.link.send_filled_quiet(request, len, fill)?;
        match held {
            true => self.held.unrung = true,
            false => {
                self.held.unrung = false;
                self.link.ring();
            }
        }
        Ok(filled)
    }

    /// Sends `frames` in order: a sleeping worker is rung once, after the
    /// last, to them and to whatever was posted unrung before them.
    pub fn send_frames(&mut self, frames: &[&[u8]]) -> io::Result<()> {
        self.held.unrung = false;
        self.link.send_frames(frames)
    }

    /// Sends `msg`, encoded, as one frame (ringing as [`Connection::send_frames`]).
    pub fn send_message<T: Serialize>(&mut self, msg: &T) -> io::Result<()> {
        let bytes = encode(msg).map_err(io_err)?;
        self.send_frames(&[&bytes])
    }

    /// Sends one frame with `fd` attached (ringing as [`Connection::send_frames`]).
    pub fn send_frame_with_fd(&mut self, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
        self.held.unrung = false;
        self.link.send_frame_with_fd(bytes, fd)
    }

    /// Moves the connection onto shared memory unless `CUMUX_WORKER_TRANSPORT`
    /// says `socket`; a worker that refuses, or an area that cannot be made,
    /// leaves it on the socket. An error: the socket itself failed.
    pub fn offer_shm(&mut self) -> io::Result<()> {
        if !shm_wanted() {
            tracing::debug!("worker connection on its socket (CUMUX_WORKER_TRANSPORT=socket)");
            return Ok(());
        }
        let request = encode(&WorkerRequest::ShmAttach {
            layout: WORKER_LAYOUT,
        })
        .map_err(io_err)?;
        let answer = |bytes: &[u8]| match decode::<WorkerReply>(bytes) {
            Ok(WorkerReply {
                result: Ok(WorkerValue::Unit),
                ..
            }) => Ok(()),
            Ok(WorkerReply { result: Err(e), .. }) => Err(e.to_string()),
            Ok(other) => Err(format!("answered {other:?}")),
            Err(e) => Err(format!("an undecodable answer: {e}")),
        };
        let spin = answer_spin_time();
        match self
            .link
            .offer_area(WORKER_LAYOUT, spin, &request, answer)?
        {
            Ok(()) => tracing::debug!("worker connection on shared memory"),
            Err(why) => tracing::info!("worker connection stays on its socket: {why}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Link, Link) {
        let (a, b) = UnixStream::pair().unwrap();
        (
            Link::new(a, Duration::ZERO).unwrap(),
            Link::new(b, Duration::from_micros(20)).unwrap(),
        )
    }

    /// The worker's side of an offer of [`WORKER_LAYOUT`]: accepted, switched.
    fn accept_offer(worker: &mut Link) {
        let mut buf = Vec::new();
        worker.recv_frame(&mut buf).unwrap();
        let area = worker.accept_area(WORKER_LAYOUT).unwrap();
        worker.send_frame(b"yes").unwrap();
        worker.switch_to(area).unwrap();
    }

    /// The server's side: offers [`WORKER_LAYOUT`], which the worker accepts.
    fn offer(server: &mut Link) {
        let offered = server
            .offer_area(WORKER_LAYOUT, Duration::ZERO, b"offer", |_| Ok(()))
            .unwrap();
        assert_eq!(offered, Ok(()));
    }

    /// A pair switched to shared memory by an offer: the server's side, and
    /// the worker's, which runs `then` on a thread of its own.
    fn switched<T: Send + 'static>(
        then: impl FnOnce(Link) -> T + Send + 'static,
    ) -> (Link, std::thread::JoinHandle<T>) {
        let (mut server, mut worker) = pair();
        let peer = std::thread::spawn(move || {
            accept_offer(&mut worker);
            then(worker)
        });
        offer(&mut server);
        (server, peer)
    }

    /// Rings of 4 KiB and bulk rings of `bulk` bytes.
    fn small_layout(bulk: u32) -> ShmLayout {
        ShmLayout {
            request_ring: 4 << 10,
            reply_ring: 4 << 10,
            request_bulk: bulk,
            reply_bulk: bulk,
        }
    }

    /// How a worker answers an offer: "yes" takes it; anything else is `refusal`.
    fn answer(refusal: &'static str) -> impl Fn(&[u8]) -> Result<(), String> {
        move |b| match b {
            b"yes" => Ok(()),
            _ => Err(refusal.to_string()),
        }
    }

    /// Both sides switch through an offer; frames small and large, and a
    /// descriptor, then arrive in order.
    #[test]
    fn an_accepted_offer_carries_frames_and_descriptors_in_order() {
        let (mut server, mut worker) = pair();
        let layout = small_layout(8 << 10);
        let peer = std::thread::spawn(move || {
            let mut buf = Vec::new();
            worker.recv_frame(&mut buf).unwrap();
            assert_eq!(buf, b"offer");
            let area = worker.accept_area(layout).unwrap();
            worker.send_frame(b"yes").unwrap();
            worker.switch_to(area).unwrap();
            assert!(worker.is_shm());
            let mut seen = Vec::new();
            loop {
                match worker.recv_frame(&mut buf) {
                    Ok(()) if buf == b"fd" => {
                        assert!(worker.take_fd().is_some());
                        seen.push(buf.clone());
                    }
                    Ok(()) => {
                        worker.send_frame(&buf).unwrap();
                        seen.push(buf.clone());
                    }
                    Err(FrameError::Closed) => return seen,
                    Err(e) => panic!("{e}"),
                }
            }
        });
        let offered = server
            .offer_area(layout, Duration::ZERO, b"offer", answer("no"))
            .unwrap();
        assert_eq!(offered, Ok(()));
        let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mut back = Vec::new();
        for frame in [&b"small"[..], &big[..], &[][..]] {
            server.send_frame(frame).unwrap();
            server.recv_frame(&mut back).unwrap();
            assert_eq!(back, frame);
        }
        let (x, _y) = UnixStream::pair().unwrap();
        server.send_frame_with_fd(b"fd", x.as_fd()).unwrap();
        drop(server);
        let seen = peer.join().unwrap();
        assert_eq!(seen.len(), 4);
        assert_eq!(seen[3], b"fd");
    }

    /// Held posts reach a worker asleep on shared memory only with the next
    /// request that waits (or a ring): it wakes once, to all of them in order.
    #[test]
    fn held_posts_wake_a_sleeping_worker_once_with_the_next_request() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (server, peer) = switched(move |mut worker| {
            worker.set_spin(Duration::ZERO);
            // Its sleeps outlast the test: only a ring (or a hang-up) ends them.
            if let Some(ep) = &mut worker.shm {
                ep.set_wait_slice(Duration::from_secs(30));
            }
            let mut buf = Vec::new();
            while worker.recv_frame(&mut buf).is_ok() {
                tx.send(buf.clone()).unwrap();
            }
        });
        let mut conn = Connection {
            link: server,
            buf: Vec::new(),
            held: Held::default(),
        };
        let wakes = |c: &Connection| c.link.shm.as_ref().unwrap().stats().wakes;
        let quiet = Duration::from_millis(200);
        // Let the worker fall asleep first.
        std::thread::sleep(quiet);
        conn.post_frames(&[b"write", &[7u8; 4096]], true).unwrap();
        conn.post_frames(&[b"launch"], true).unwrap();
        assert!(
            rx.recv_timeout(quiet).is_err(),
            "a held post woke the worker"
        );
        conn.send_frames(&[b"read"]).unwrap();
        let got: Vec<Vec<u8>> = (0..4)
            .map(|_| rx.recv_timeout(quiet * 10).unwrap())
            .collect();
        assert_eq!(got[0], b"write");
        assert_eq!(got[1], vec![7u8; 4096]);
        assert_eq!((&got[2][..], &got[3][..]), (&b"launch"[..], &b"read"[..]));
        assert_eq!(wakes(&conn), 1);
        // A held post goes with a ring alone too; an unheld one rings itself.
        std::thread::sleep(quiet);
        conn.post_frames(&[b"scrub"], true).unwrap();
        assert!(rx.recv_timeout(quiet).is_err());
        conn.ring();
        assert_eq!(rx.recv_timeout(quiet * 10).unwrap(), b"scrub");
        std::thread::sleep(quiet);
        conn.post_frames(&[b"posted"], false).unwrap();
        assert_eq!(rx.recv_timeout(quiet * 10).unwrap(), b"posted");
        assert_eq!(wakes(&conn), 3);
        drop(conn);
        peer.join().unwrap();
    }

    /// A request whose bytes `fill` cuts short is not sent, nor any of its
    /// bytes, on shared memory and on the socket; a whole one after it is.
    #[test]
    fn a_filled_frame_cut_short_sends_nothing() {
        for shm in [true, false] {
            let receive = |mut worker: Link| {
                let mut frames = Vec::new();
                let mut buf = Vec::new();
                while worker.recv_frame(&mut buf).is_ok() {
                    frames.push(std::mem::take(&mut buf));
                }
                frames
            };
            let (mut server, peer) = match shm {
                true => switched(receive),
                false => {
                    let (server, worker) = pair();
                    (server, std::thread::spawn(move || receive(worker)))
                }
            };
            let len = 3 << 20;
            let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8 + 1).collect();
            let mut short = &data[..len / 2];
            let mut fill = |piece: &mut [u8]| io::Read::read_exact(&mut short, piece);
            let cut = server.send_filled_quiet(b"cut", len, &mut fill).unwrap();
            assert!(cut.is_err());
            let mut whole = &data[..];
            let mut fill = |piece: &mut [u8]| io::Read::read_exact(&mut whole, piece);
            let sent = server.send_filled_quiet(b"whole", len, &mut fill).unwrap();
            assert!(sent.is_ok());
            server.send_frame(b"end").unwrap();
            drop(server);
            let frames = peer.join().unwrap();
            assert_eq!(frames.len(), 3, "shm {shm}");
            assert_eq!(frames[0], b"whole");
            assert!(frames[1] == data, "shm {shm}: the whole frame differs");
            assert_eq!(frames[2], b"end");
        }
    }

    /// A refused offer leaves both sides on the socket.
    #[test]
    fn a_refused_offer_stays_on_the_socket() {
        let (mut server, mut worker) = pair();
        let peer = std::thread::spawn(move || {
            let mut buf = Vec::new();
            worker.recv_frame(&mut buf).unwrap();
            worker.send_frame(b"no").unwrap();
            worker.recv_frame(&mut buf).unwrap();
            buf
        });
        let offered = server
            .offer_area(WORKER_LAYOUT, Duration::ZERO, b"offer", answer("refused"))
            .unwrap();
        assert_eq!(offered, Err("refused".to_string()));
        assert!(!server.is_shm());
        server.send_frame(b"after").unwrap();
        assert_eq!(peer.join().unwrap(), b"after");
    }

    /// An offer whose memfd is smaller than its layout says, or that comes
    /// without one, is refused with a clear reason; the link stays usable.
    #[test]
    fn a_malformed_offer_is_refused_with_a_reason() {
        let (mut server, mut worker) = pair();
        let (_area, fd) = ShmArea::create(small_layout(4 << 10)).unwrap();
        server.send_frame_with_fd(b"offer", fd.as_fd()).unwrap();
        let mut buf = Vec::new();
        worker.recv_frame(&mut buf).unwrap();
        let why = worker.accept_area(WORKER_LAYOUT).unwrap_err();
        assert!(why.contains("the layout needs"), "{why}");
        server.send_frame(b"bare offer").unwrap();
        worker.recv_frame(&mut buf).unwrap();
        let why = worker.accept_area(WORKER_LAYOUT).unwrap_err();
        assert!(why.contains("no memfd"), "{why}");
        assert!(!worker.is_shm());
        server.send_frame(b"still here").unwrap();
        worker.recv_frame(&mut buf).unwrap();
        assert_eq!(buf, b"still here");
    }

    /// After a synchronize's mark the worker polls longer for the next frame
    /// only where the last wait after such a mark outlasted its usual spin,
    /// and spins as usual again once the frame came.
    #[test]
    fn a_wait_after_a_mark_polls_longer_only_after_a_long_one() {
        let (first_sent, first_in) = std::sync::mpsc::channel();
        let (mut server, peer) = switched(move |mut worker| {
            let mut buf = Vec::new();
            // A usual spin that a busy machine's hiccups stay under.
            let usual = Duration::from_millis(5);
            worker.shm.as_mut().unwrap().set_spin(usual);
            let long = usual * 4;
            let mut spins = Vec::new();
            for _ in 0..3 {
                worker.after_sync_mark(long);
                spins.push(worker.shm.as_ref().unwrap().spin());
                if spins.len() == 1 {
                    first_in.recv().unwrap();
                }
                worker.recv_frame(&mut buf).unwrap();
            }
            (usual, long, spins, worker.shm.as_ref().unwrap().spin())
        });
        // The first wait finds its frame there, the second outlasts the usual spin.
        server.send_frame(b"at once").unwrap();
        first_sent.send(()).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        server.send_frame(b"late").unwrap();
        server.send_frame(b"at once").unwrap();
        let (usual, long, spins, after) = peer.join().unwrap();
        assert_eq!(spins, [usual, usual, long]);
        assert_eq!(after, usual);
    }

    /// A write position the peer could never have written is an error of the
    /// link, named as such, not a crash or an out-of-bounds read.
    #[test]
    fn a_corrupt_area_fails_the_link_clearly() {
        let (server, peer) = switched(|mut worker| {
            let mut buf = Vec::new();
            worker.recv_frame(&mut buf).map(|()| buf)
        });
        // The request ring's write position, far past anything written.
        let ep = server.shm.as_ref().unwrap();
        ep.area()
            .word64(shm::write_position_offset(0))
            .store(u64::MAX / 2, std::sync::atomic::Ordering::Release);
        shm::ring_doorbell(ep.area(), Side::Server);
        match peer.join().unwrap() {
            Err(FrameError::Io(e)) => {
                assert!(e.to_string().contains("shared-memory link"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// A server that dies (its socket gone, its area left as it was) ends the
    /// worker's wait for the next request: the worker then exits.
    #[test]
    fn a_dead_server_ends_the_workers_wait() {
        let (server, peer) = switched(|mut worker| worker.recv_frame(&mut Vec::new()));
        std::thread::sleep(Duration::from_millis(20));
        let _ = server.socket().shutdown(std::net::Shutdown::Both);
        std::mem::forget(server);
        assert!(matches!(peer.join().unwrap(), Err(FrameError::Closed)));
    }

    /// A worker killed mid-wait (its socket gone, its area left as it was)
    /// ends the server's wait with an error, not a hang.
    #[test]
    fn a_peer_whose_socket_goes_fails_the_wait() {
        let (mut server, peer) = switched(|mut worker| {
            let mut buf = Vec::new();
            worker.recv_frame(&mut buf).unwrap();
            // Gone without closing its end of the area, as a killed process is.
            let _ = worker.socket().shutdown(std::net::Shutdown::Both);
            std::mem::forget(worker);
        });
        server.send_frame(b"call").unwrap();
        peer.join().unwrap();
        let mut buf = Vec::new();
        assert!(matches!(
            server.recv_frame(&mut buf),
            Err(FrameError::Closed)
        ));
    }
}
