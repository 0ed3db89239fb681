//! Requests and replies as length-prefixed frames on a socket (unix, TCP or
//! TLS), on the connection's own thread. A large copy's bytes go between the
//! socket and the device where they lie: read straight into device memory
//! (or a worker's ring), written straight from it; a worker's answer and
//! other large replies are written by a helper while the session goes on.

use std::io::{self, Read, Write};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use cumux_protocol::shm::{self, HeldBulk, ShmError};
use cumux_protocol::{decode, encode, read_bulk, read_message, write_message, FrameError};
use cumux_protocol::{write_message_head, Call, CuError, Reply, ReplyBody, Request};

use super::lane_wire::{AheadReader, LanePlan, LaneUse};
use crate::device::socket_bytes::SendBytes;
use crate::lanes::{Arrivals, JoinedLane};
use crate::locking::{lock, wait};
use crate::session::{Session, SocketCopy};

/// How long a call planned on a lane waits for that lane to join.
const LANE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Replies with data from this size on are written behind by a helper.
const PIPELINED_BYTES: usize = 1 << 20;

/// A copy of this size or more goes between the socket and the device in
/// place: above it, a buffer's copy costs more than the call's own work.
pub(super) const IN_PLACE_BYTES: usize = 64 << 10;

/// Stack of a connection's helper.
const HELPER_STACK: usize = 512 << 10;

/// Copies held in a worker's ring and handed to the helper, at most (6 MiB
/// of the client driver's 1 MiB pieces, within the half of a worker's 16 MiB
/// ring a hold may keep): past them, a copy's bytes are copied out of the
/// ring for the helper, as other large replies are, so that the worker and
/// this thread never wait for the socket (on 2 busy cores that waiting cost
/// more than the copy).
const HELD_AHEAD: usize = 6;

/// A call's answer, where it has one.
type Answer = Result<ReplyBody, CuError>;

/// Why no request came.
pub(super) enum Unread {
    /// The client closed the connection.
    Closed,
    /// Bytes that are not the protocol, or a broken link.
    Broken(String),
}

/// The reading end: the socket and the frame buffer.
struct Reading<R> {
    reader: R,
    buf: Vec<u8>,
}

/// Replies handed to the writing helper and not yet written.
#[derive(Default)]
struct Behind {
    pending: Mutex<usize>,
    written: Condvar,
}

/// What the writing helper writes.
enum Job {
    Reply(Reply),
    /// A copy's answer: its encoded reply, whose bulk is `bytes`.
    Copy {
        head: Vec<u8>,
        bytes: CopyBytes,
    },
}

/// A copy's bytes for the helper: held in a worker's ring, or copied out.
enum CopyBytes {
    Held(HeldBulk),
    Owned(Vec<u8>),
}

impl CopyBytes {
    fn pieces(&self) -> [&[u8]; 2] {
        match self {
            CopyBytes::Held(held) => held.pieces(),
            CopyBytes::Owned(data) => [data, &[]],
        }
    }
}

/// The writing end: the socket, and the helper that writes behind.
struct Writing<W> {
    writer: Arc<Mutex<W>>,
    behind: Arc<Behind>,
    helper: Option<Helper<Job>>,
    /// Why the writing helper stopped, if it did.
    failed: Arc<Mutex<Option<String>>>,
}

pub(super) struct SocketWire<R, W> {
    reading: Reading<R>,
    writing: Writing<W>,
    /// The length of the last request's copy bytes, still on the socket
    /// (or on the lane it came on).
    in_place: Option<(usize, Option<usize>)>,
    /// The session's lanes, where its welcome offered them.
    lanes: Option<Lanes>,
    /// The lane the last request's reply goes on (`None`: this socket).
    reply_lane: Option<usize>,
    /// Printf output taken for a reply that did not go (a copy refused
    /// before its bytes were sent): the next reply's.
    stdout: Vec<u8>,
    /// Where a unix socket keeps the descriptor that came with a call.
    fds: Option<super::fd_inbox::FdInbox>,
}

/// A session's lanes: those that joined, by index, and the plan of the
/// calls that use them.
struct Lanes {
    arrivals: Arrivals,
    joined: Vec<Option<Lane>>,
    plan: Option<LanePlan>,
}

/// One lane: its bytes, read ahead by its connection, and its writing end.
struct Lane {
    reader: AheadReader,
    writing: Writing<Box<dyn Write + Send>>,
    close: Box<dyn Fn() + Send>,
}

impl Drop for Lane {
    fn drop(&mut self) {
        (self.close)();
    }
}

impl Lanes {
    /// Lane `index`, waiting for it to join where it has not yet.
    fn lane(&mut self, index: usize) -> Result<&mut Lane, Unread> {
        while self.joined.get(index).is_none_or(Option::is_none) {
            let Some(joined) = self.arrivals.next(LANE_PATIENCE) else {
                return Err(Unread::Broken(format!(
                    "lane {index} did not join within {} s",
                    LANE_PATIENCE.as_secs()
                )));
            };
            let JoinedLane {
                index: at,
                pieces,
                spent,
                writer,
                close,
            } = joined;
            let lane = Lane {
                reader: AheadReader::new(pieces, spent),
                writing: Writing::new(writer),
                close,
            };
            let at = at as usize;
            if self.joined.len() <= at {
                self.joined.resize_with(at + 1, || None);
            }
            if self.joined[at].is_some() {
                return Err(Unread::Broken(format!("lane {at} joined twice")));
            }
            self.joined[at] = Some(lane);
        }
        Ok(self.joined[index].as_mut().expect("joined above"))
    }
}

/// A thread of the connection's and the channel of its jobs.
struct Helper<T> {
    jobs: Sender<T>,
    thread: JoinHandle<()>,
}

impl<T: Send + 'static> Helper<T> {
    fn start(name: &str, work: impl FnMut(T) + Send + 'static) -> Result<Helper<T>, String> {
        let (jobs, inbox) = channel::<T>();
        let mut work = work;
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .stack_size(HELPER_STACK)
            .spawn(move || inbox.into_iter().for_each(&mut work))
            .map_err(|e| format!("cannot start the connection's {name}: {e}"))?;
        Ok(Helper { jobs, thread })
    }
}

impl<R: Read, W: Write + Send + 'static> SocketWire<R, W> {
    /// The wire of a socket read through `reader` and written through
    /// `writer`; `buf` holds what the handshake read.
    pub(super) fn new(reader: R, writer: W, buf: Vec<u8>) -> SocketWire<R, W> {
        SocketWire {
            reading: Reading { reader, buf },
            writing: Writing::new(writer),
            in_place: None,
            lanes: None,
            reply_lane: None,
            stdout: Vec::new(),
            fds: None,
        }
    }

    /// The wire, taking descriptors that come with calls from `fds`.
    pub(super) fn with_fds(mut self, fds: Option<super::fd_inbox::FdInbox>) -> Self {
        self.fds = fds;
        self
    }

    /// The wire, with lanes that join as `arrivals` brings them.
    pub(super) fn with_lanes(mut self, arrivals: Option<Arrivals>) -> Self {
        self.lanes = arrivals.map(|arrivals| Lanes {
            arrivals,
            joined: Vec::new(),
            plan: None,
        });
        self
    }

    /// The descriptor that came with the call just read, if one did.
    pub(super) fn take_fd(&mut self) -> Option<std::os::fd::OwnedFd> {
        self.fds.as_ref().and_then(|fds| fds.take())
    }

    /// The next request. A `MemcpyHtoD` of [`IN_PLACE_BYTES`] or more comes
    /// with empty `data`, its bytes left on the socket for
    /// [`SocketWire::handle`] to read where they go. A `Call::Lanes` is
    /// taken here: the calls it plans come from (or answer on) the lanes.
    pub(super) fn next_request(&mut self) -> Result<Request, Unread> {
        if let Some((left, lane)) = self.in_place.take() {
            // Never handled (a wire used without `handle`): skip them.
            skip(self.reader(lane)?, left).map_err(Unread::Broken)?;
        }
        self.reply_lane = None;
        loop {
            let used = self.planned();
            let source = match used {
                Some(LaneUse::Request(lane)) => Some(lane),
                _ => None,
            };
            let Reading { reader, buf } = &mut self.reading;
            let (request, in_place) = match (source, self.lanes.as_mut()) {
                (None, _) => read_request(reader, buf)?,
                (Some(lane), Some(lanes)) => read_request(&mut lanes.lane(lane)?.reader, buf)?,
                (Some(lane), None) => return Err(Unread::Broken(format!("no lane {lane}"))),
            };
            if let Call::Lanes {
                count,
                lanes,
                replies,
            } = request.call
            {
                self.plan(count, lanes, replies, used.is_some())?;
                continue;
            }
            self.in_place = in_place.map(|len| (len, source));
            if let Some(LaneUse::Reply(lane)) = used {
                self.reply_lane = Some(lane);
            }
            return Ok(request);
        }
    }

    /// Where the plan of the last `Call::Lanes` has the next call travel.
    fn planned(&mut self) -> Option<LaneUse> {
        let lanes = self.lanes.as_mut()?;
        let (used, more) = lanes.plan.as_mut()?.take();
        if !more {
            lanes.plan = None;
        }
        Some(used)
    }

    /// Takes a `Call::Lanes` (not itself one of a plan's calls).
    fn plan(&mut self, count: u32, lanes: u32, replies: bool, planned: bool) -> Result<(), Unread> {
        let Some(set) = self.lanes.as_mut().filter(|_| !planned) else {
            return Err(Unread::Broken(match planned {
                true => "a call on lanes planned calls on lanes".into(),
                false => "calls on lanes, but the session has no lanes".into(),
            }));
        };
        set.plan = LanePlan::new(count, lanes, replies).map_err(Unread::Broken)?;
        Ok(())
    }

    /// The reader of this socket, or of lane `lane`.
    fn reader(&mut self, lane: Option<usize>) -> Result<&mut dyn Read, Unread> {
        match (lane, self.lanes.as_mut()) {
            (None, _) => Ok(&mut self.reading.reader),
            (Some(lane), Some(lanes)) => Ok(&mut lanes.lane(lane)?.reader),
            (Some(lane), None) => Err(Unread::Broken(format!("no lane {lane}"))),
        }
    }

    /// Has `session` handle `call` (request `seq`): a large copy's bytes go
    /// between the socket and the device in place. `Err`: why the
    /// connection ends (the socket failed mid-copy).
    pub(super) fn handle(
        &mut self,
        session: &mut Session,
        call: Call,
        seq: u64,
    ) -> Result<Option<Answer>, String> {
        if let Some((len, lane)) = self.in_place.take() {
            return self.handle_incoming(session, call, len, lane);
        }
        match call {
            Call::MemcpyDtoH { bytes, .. } if bytes as usize >= IN_PLACE_BYTES => {
                let bytes = bytes as usize;
                let stdout = &mut self.stdout;
                match (self.reply_lane, self.lanes.as_mut()) {
                    (Some(lane), Some(lanes)) => {
                        let writing = &mut lanes.lane(lane).map_err(unread_text)?.writing;
                        outgoing(writing, stdout, session, call, seq, bytes)
                    }
                    _ => outgoing(&mut self.writing, stdout, session, call, seq, bytes),
                }
            }
            call => Ok(session.handle(call)),
        }
    }

    /// A `MemcpyHtoD` whose `len` bytes are read from the socket where the
    /// device takes them; what the session did not take is skipped.
    fn handle_incoming(
        &mut self,
        session: &mut Session,
        call: Call,
        len: usize,
        lane: Option<usize>,
    ) -> Result<Option<Answer>, String> {
        let reader = self.reader(lane).map_err(unread_text)?;
        let mut left = len;
        let mut failed = None;
        let mut fill = |piece: &mut [u8]| -> io::Result<()> {
            let read = match piece.len() <= left {
                true => reader.read_exact(piece),
                false => Err(io::Error::other("more bytes asked for than the copy has")),
            };
            match read {
                Ok(()) => left -= piece.len(),
                Err(ref e) => failed = Some(e.to_string()),
            }
            read
        };
        let result = session.handle_socket_copy(call, SocketCopy::Incoming(len, &mut fill));
        if let Some(why) = failed {
            return Err(format!("a copy's bytes did not arrive: {why}"));
        }
        skip(reader, left)?;
        Ok(result)
    }

    /// Sends `reply` after every reply before it; a large one is written by
    /// the helper while the session goes on.
    pub(super) fn send_reply(&mut self, mut reply: Reply) -> Result<(), String> {
        if !self.stdout.is_empty() {
            let mut stdout = std::mem::take(&mut self.stdout);
            stdout.append(&mut reply.stdout);
            reply.stdout = stdout;
        }
        match (self.reply_lane.take(), self.lanes.as_mut()) {
            (Some(lane), Some(lanes)) => lanes.lane(lane).map_err(unread_text)?.writing.send(reply),
            _ => self.writing.send(reply),
        }
    }
}

/// A `MemcpyDtoH` of `bytes` whose answer is written from where the
/// bytes lie, its header before the first of them: at once, or (bytes
/// held in a worker's ring) by the helper while the session goes on.
fn outgoing<W: Write + Send + 'static>(
    writing: &mut Writing<W>,
    held_stdout: &mut Vec<u8>,
    session: &mut Session,
    call: Call,
    seq: u64,
    bytes: usize,
) -> Result<Option<Answer>, String> {
    held_stdout.extend(session.take_stdout());
    let mut out = CopyOut {
        writing,
        seq,
        bytes,
        stdout: Some(std::mem::take(held_stdout)),
        sent: 0,
        behind: false,
        failed: None,
    };
    let result = session.handle_socket_copy(call, SocketCopy::Outgoing(&mut out));
    let CopyOut {
        stdout,
        sent,
        behind,
        failed,
        ..
    } = out;
    if let Some(why) = failed {
        return Err(format!("cannot send a copy's bytes: {why}"));
    }
    if let Some(stdout) = stdout {
        // Refused or failed before its bytes: answered as any call.
        *held_stdout = stdout;
        return Ok(result);
    }
    match result {
        Some(Ok(_)) if sent == bytes && behind => Ok(None),
        Some(Ok(_)) if sent == bytes => lock(&writing.writer)
            .flush()
            .map(|()| None)
            .map_err(|e| format!("cannot send: {e}")),
        other => Err(format!(
            "a copy failed after {sent} of its {bytes} bytes were sent: {other:?}"
        )),
    }
}

/// Where a `MemcpyDtoH`'s bytes go: the socket, after the reply's header.
struct CopyOut<'a, W> {
    writing: &'a mut Writing<W>,
    seq: u64,
    bytes: usize,
    /// The printf text the header carries, until the header goes.
    stdout: Option<Vec<u8>>,
    sent: usize,
    /// Whether the helper writes the bytes (held in a worker's ring).
    behind: bool,
    failed: Option<String>,
}

impl<W: Write + Send + 'static> CopyOut<'_, W> {
    /// The reply's header, encoded, and the printf text it takes (once).
    fn head(&mut self) -> io::Result<Option<Vec<u8>>> {
        let Some(stdout) = self.stdout.take() else {
            return Ok(None);
        };
        let reply = Reply {
            seq: self.seq,
            result: Ok(ReplyBody::Data(Vec::new())),
            stdout,
        };
        encode(&reply).map(Some).map_err(io::Error::other)
    }

    fn noted(&mut self, result: io::Result<()>) -> io::Result<()> {
        if let Err(e) = &result {
            self.failed.get_or_insert(e.to_string());
        }
        result
    }
}

impl<W: Write + Send + 'static> SendBytes for CopyOut<'_, W> {
    fn send(&mut self, piece: &[u8]) -> io::Result<()> {
        let written = (|| {
            if self.sent + piece.len() > self.bytes || self.behind {
                return Err(io::Error::other("more bytes sent than the copy has"));
            }
            if let Some(head) = self.head()? {
                // Earlier replies leave first.
                self.writing.written().map_err(io::Error::other)?;
                let mut writer = lock(&self.writing.writer);
                write_message_head(&mut *writer, &head, self.bytes).map_err(io::Error::other)?;
            }
            lock(&self.writing.writer).write_all(piece)?;
            self.sent += piece.len();
            Ok(())
        })();
        self.noted(written)
    }

    fn send_held(&mut self, held: HeldBulk) -> io::Result<()> {
        if self.sent > 0 || held.len() != self.bytes {
            return held.pieces().iter().try_for_each(|piece| self.send(piece));
        }
        if *lock(&self.writing.behind.pending) >= HELD_AHEAD {
            return self.send_owned(held.pieces().concat());
        }
        self.behind(CopyBytes::Held(held))
    }

    fn send_owned(&mut self, data: Vec<u8>) -> io::Result<()> {
        if self.sent > 0 || data.len() != self.bytes {
            return self.send(&data);
        }
        self.behind(CopyBytes::Owned(data))
    }
}

impl<W: Write + Send + 'static> CopyOut<'_, W> {
    /// Hands all of the copy's bytes, with the reply's header, to the helper.
    fn behind(&mut self, bytes: CopyBytes) -> io::Result<()> {
        let queued = (|| {
            let head = self
                .head()?
                .ok_or_else(|| io::Error::other("a copy sent twice"))?;
            self.writing
                .behind(Job::Copy { head, bytes })
                .map_err(io::Error::other)?;
            self.sent = self.bytes;
            self.behind = true;
            Ok(())
        })();
        self.noted(queued)
    }
}

impl<W: Write + Send + 'static> Writing<W> {
    fn new(writer: W) -> Self {
        Writing {
            writer: Arc::new(Mutex::new(writer)),
            behind: Arc::default(),
            helper: None,
            failed: Arc::default(),
        }
    }

    /// Sends `reply` after every reply before it on this socket; a large one
    /// is written by the helper while the session goes on.
    fn send(&mut self, reply: Reply) -> Result<(), String> {
        if matches!(&reply.result, Ok(ReplyBody::Data(d)) if d.len() >= PIPELINED_BYTES) {
            return self.behind(Job::Reply(reply));
        }
        self.written()?;
        write_reply(&mut *lock(&self.writer), reply)
    }

    /// Hands `job` to the writing helper.
    fn behind(&mut self, job: Job) -> Result<(), String> {
        if let Some(why) = lock(&self.failed).clone() {
            return Err(why);
        }
        if self.helper.is_none() {
            let writer = Arc::clone(&self.writer);
            let behind = Arc::clone(&self.behind);
            let failed = Arc::clone(&self.failed);
            self.helper = Some(Helper::start("cumux-write-behind", move |job| {
                if lock(&failed).is_none() {
                    if let Err(e) = write_job(&mut *lock(&writer), job) {
                        *lock(&failed) = Some(e);
                    }
                }
                *lock(&behind.pending) -= 1;
                behind.written.notify_all();
            })?);
        }
        *lock(&self.behind.pending) += 1;
        let helper = self.helper.as_ref().expect("started above");
        if helper.jobs.send(job).is_err() {
            *lock(&self.behind.pending) -= 1;
            return Err("the connection's writer stopped".into());
        }
        Ok(())
    }

    /// Waits until every job handed to the helper is written.
    fn written(&self) -> Result<(), String> {
        let mut pending = lock(&self.behind.pending);
        while *pending > 0 {
            pending = wait(&self.behind.written, pending);
        }
        match lock(&self.failed).clone() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

impl<W> Drop for Writing<W> {
    fn drop(&mut self) {
        // Every reply leaves before the connection closes.
        if let Some(helper) = self.helper.take() {
            drop(helper.jobs);
            let _ = helper.thread.join();
        }
    }
}

/// The next request on `reader`, and the length of its copy bytes left
/// there to be read in place.
fn read_request(
    reader: &mut impl Read,
    buf: &mut Vec<u8>,
) -> Result<(Request, Option<usize>), Unread> {
    let bulk_len = match read_message(reader, buf) {
        Ok(bulk_len) => bulk_len,
        Err(FrameError::Closed) => return Err(Unread::Closed),
        Err(e) => return Err(Unread::Broken(format!("bad frame: {e}"))),
    };
    let mut request: Request = decode(buf)
        .map_err(|e| Unread::Broken(format!("undecodable request ({} bytes): {e}", buf.len())))?;
    let Some(len) = bulk_len else {
        return Ok((request, None));
    };
    if let Call::MemcpyHtoD { data, .. } = &request.call {
        if len >= IN_PLACE_BYTES && data.is_empty() {
            return Ok((request, Some(len)));
        }
    }
    let bulk =
        read_bulk(reader, len).map_err(|e| Unread::Broken(format!("bad bulk frame: {e}")))?;
    shm::put_call_bulk(&mut request.call, bulk).map_err(|e| match e {
        ShmError::PeerGone => Unread::Closed,
        ShmError::Violation(why) => Unread::Broken(format!("shared area: {why}")),
    })?;
    Ok((request, None))
}

fn unread_text(unread: Unread) -> String {
    match unread {
        Unread::Closed => "the connection closed".into(),
        Unread::Broken(why) => why,
    }
}

/// Reads and drops `len` bytes of `reader`: a copy's bytes nobody took.
fn skip(reader: &mut (impl Read + ?Sized), len: usize) -> Result<(), String> {
    if len == 0 {
        return Ok(());
    }
    let copied = io::copy(&mut reader.take(len as u64), &mut io::sink())
        .map_err(|e| format!("a copy's bytes did not arrive: {e}"))?;
    match copied as usize == len {
        true => Ok(()),
        false => Err(format!("a copy's bytes ended after {copied} of {len}")),
    }
}

fn write_job(writer: &mut impl Write, job: Job) -> Result<(), String> {
    let (head, bytes) = match job {
        Job::Reply(reply) => return write_reply(writer, reply),
        Job::Copy { head, bytes } => (head, bytes),
    };
    (|| {
        let pieces = bytes.pieces();
        let len = pieces[0].len() + pieces[1].len();
        write_message_head(writer, &head, len).map_err(io::Error::other)?;
        pieces
            .iter()
            .try_for_each(|piece| writer.write_all(piece))?;
        writer.flush()
    })()
    .map_err(|e| format!("cannot send a copy's bytes: {e}"))
}

fn write_reply(writer: &mut impl Write, mut reply: Reply) -> Result<(), String> {
    // A copy's data goes from where it lies, not through the encoder.
    let bulk = shm::take_reply_bulk(&mut reply);
    let bytes = encode(&reply).map_err(|e| format!("cannot encode a reply: {e}"))?;
    write_message(writer, &bytes, &bulk).map_err(|e| format!("cannot send: {e}"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;

    use cumux_protocol::{read_bulk, CuError};

    use super::*;

    const BIG: usize = 3 << 20;

    fn send_request(to: &mut UnixStream, seq: u64, mut call: Call) {
        let bulk = shm::take_call_bulk(&mut call);
        let bytes = encode(&Request { seq, call }).unwrap();
        write_message(to, &bytes, &bulk).unwrap();
    }

    fn read_reply(from: &mut UnixStream) -> Reply {
        let mut buf = Vec::new();
        let bulk_len = read_message(from, &mut buf).unwrap();
        let mut reply: Reply = decode(&buf).unwrap();
        if let Some(len) = bulk_len {
            shm::put_reply_bulk(&mut reply, read_bulk(from, len).unwrap()).unwrap();
        }
        reply
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// A client's end of a socket pair and the wire on the other.
    fn connected() -> (UnixStream, SocketWire<UnixStream, UnixStream>) {
        let (client, server) = UnixStream::pair().unwrap();
        let reader = server.try_clone().unwrap();
        (client, SocketWire::new(reader, server, Vec::new()))
    }

    /// A large copy's bytes stay on the socket (the request comes with
    /// empty data), small ones come with theirs; bytes nobody took are
    /// skipped before the next request, which arrives whole. Large replies
    /// are written behind and every reply leaves whole, in order.
    #[test]
    fn large_and_small_messages_keep_their_order_both_ways() {
        let (mut client, mut wire) = connected();
        let small = pattern(9, IN_PLACE_BYTES - 1);
        let calls = [
            Call::MemcpyHtoD {
                dst: 0x1000,
                data: pattern(1, BIG),
                stream: None,
            },
            Call::MemGetInfo { device: 0 },
            Call::MemcpyHtoD {
                dst: 0x2000,
                data: small.clone(),
                stream: None,
            },
            Call::MemcpyHtoD {
                dst: 0x3000,
                data: pattern(3, BIG),
                stream: None,
            },
            Call::MemGetInfo { device: 1 },
        ];
        let sending = {
            let mut client = client.try_clone().unwrap();
            let calls = calls.clone();
            std::thread::spawn(move || {
                for (seq, call) in calls.into_iter().enumerate() {
                    send_request(&mut client, seq as u64 + 1, call);
                }
            })
        };
        for (seq, call) in calls.iter().enumerate() {
            let request = wire.next_request().ok().expect("a request");
            let want = match call {
                Call::MemcpyHtoD { dst, data, stream } if data.len() >= IN_PLACE_BYTES => {
                    assert_eq!(wire.in_place, Some((data.len(), None)));
                    Call::MemcpyHtoD {
                        dst: *dst,
                        data: Vec::new(),
                        stream: *stream,
                    }
                }
                call => {
                    assert_eq!(wire.in_place, None);
                    call.clone()
                }
            };
            assert_eq!((request.seq, &request.call), (seq as u64 + 1, &want));
        }
        sending.join().unwrap();
        let replies = [
            Ok(ReplyBody::Data(pattern(4, BIG))),
            Ok(ReplyBody::Unit),
            Ok(ReplyBody::Data(pattern(5, BIG))),
            Err(CuError::new(1, "a failure after a large reply")),
            Ok(ReplyBody::Data(vec![7; 100])),
        ];
        let reading = std::thread::spawn(move || {
            (1..=5).map(|_| read_reply(&mut client)).collect::<Vec<_>>()
        });
        for (seq, result) in replies.iter().enumerate() {
            let reply = Reply {
                seq: seq as u64 + 1,
                result: result.clone(),
                stdout: Vec::new(),
            };
            wire.send_reply(reply).unwrap();
        }
        drop(wire);
        let got = reading.join().unwrap();
        for (seq, (reply, result)) in got.iter().zip(&replies).enumerate() {
            assert_eq!((reply.seq, &reply.result), (seq as u64 + 1, result));
        }
    }

    /// A copy's bytes held in a worker's ring go to the helper: `send_held`
    /// returns with the client reading nothing yet (writing them itself
    /// would block, the socket holding less), for two copies, one being
    /// written and one waiting; both arrive whole and in order, and their
    /// room in the ring comes back once written.
    #[test]
    fn held_copies_are_written_behind_while_the_session_goes_on() {
        use std::sync::mpsc::channel;
        use std::time::Duration;

        let layout = shm::DEFAULT_LAYOUT;
        let (area, fd) = shm::ShmArea::create(layout).unwrap();
        let mapped = shm::ShmArea::attach(fd, layout).unwrap();
        let mut worker = shm::Endpoint::new(area, shm::Side::Client, None, Duration::ZERO);
        let mut ours = shm::Endpoint::new(mapped, shm::Side::Server, None, Duration::ZERO);
        let (mut client, mut wire) = connected();
        let copies = [pattern(1, 1 << 20), pattern(2, (1 << 20) + 3)];
        let (done, queued) = channel();
        let sending = {
            let copies = copies.clone();
            std::thread::spawn(move || {
                for (i, data) in copies.iter().enumerate() {
                    worker.send(&[], data).unwrap();
                    assert_eq!(ours.recv_message(&mut Vec::new()).unwrap(), data.len());
                    let held = ours.recv_bulk_held(data.len()).unwrap().expect("held");
                    let mut out = CopyOut {
                        writing: &mut wire.writing,
                        seq: i as u64 + 1,
                        bytes: data.len(),
                        stdout: Some(b"hi".to_vec()),
                        sent: 0,
                        behind: false,
                        failed: None,
                    };
                    out.send_held(held).unwrap();
                    assert!(out.behind && out.stdout.is_none() && out.failed.is_none());
                }
                done.send(()).unwrap();
                (worker, ours, wire)
            })
        };
        queued
            .recv_timeout(Duration::from_secs(20))
            .expect("held copies are handed over without waiting for the client");
        for (i, data) in copies.iter().enumerate() {
            let reply = read_reply(&mut client);
            assert_eq!(reply.seq, i as u64 + 1);
            assert_eq!(reply.result, Ok(ReplyBody::Data(data.clone())));
            assert_eq!(reply.stdout, b"hi");
        }
        let (mut worker, mut ours, wire) = sending.join().unwrap();
        wire.writing.written().unwrap();
        // Once written, their room goes back at our next receive.
        worker.send(b"next", &[]).unwrap();
        ours.recv(&mut Vec::new(), &mut Vec::new()).unwrap();
        let mut fill = |piece: &mut [u8]| {
            piece.fill(0);
            Ok(())
        };
        let whole = layout.request_bulk as usize;
        assert!(worker.fill_ahead(whole, &mut fill).unwrap().is_some());
    }

    /// Copy bytes cut short by the client end the connection, clearly.
    #[test]
    fn a_copy_cut_short_is_a_broken_connection() {
        let (mut client, mut wire) = connected();
        let call = Call::MemcpyHtoD {
            dst: 0,
            data: Vec::new(),
            stream: None,
        };
        let msg = encode(&Request { seq: 1, call }).unwrap();
        let sending = std::thread::spawn(move || {
            write_message_head(&mut client, &msg, BIG).unwrap();
            client.write_all(&pattern(1, BIG / 2)).unwrap();
        });
        assert!(wire.next_request().is_ok());
        match wire.next_request() {
            Err(Unread::Broken(why)) => assert!(why.contains("copy"), "{why}"),
            _ => panic!("the connection should break"),
        }
        sending.join().unwrap();
    }

    /// A lane of session 1 joined through `registry`: what the test feeds
    /// it (as its connection would read it) and the client's end of its
    /// writing side.
    fn joined_lane(
        registry: &crate::lanes::LaneRegistry,
        key: [u8; 16],
        index: u32,
    ) -> (std::sync::mpsc::SyncSender<(Vec<u8>, usize)>, UnixStream) {
        let (feed, pieces) = std::sync::mpsc::sync_channel(64);
        let (spent, _) = std::sync::mpsc::channel();
        let (client, server) = UnixStream::pair().unwrap();
        let lane = JoinedLane {
            index,
            pieces,
            spent,
            writer: Box::new(server),
            close: Box::new(|| {}),
        };
        let join = cumux_protocol::LaneJoin {
            session: 1,
            key,
            index,
        };
        assert!(registry.join(&join, lane).is_ok());
        (feed, client)
    }

    /// `frames` as a lane's connection reads them: in pieces of odd sizes.
    fn feed_frames(feed: &std::sync::mpsc::SyncSender<(Vec<u8>, usize)>, frames: &[(u64, Call)]) {
        let mut bytes = Vec::new();
        for (seq, call) in frames {
            send_request_to(&mut bytes, *seq, call.clone());
        }
        for piece in bytes.chunks(100_003) {
            feed.send((piece.to_vec(), piece.len())).unwrap();
        }
    }

    fn send_request_to(to: &mut Vec<u8>, seq: u64, mut call: Call) {
        let bulk = shm::take_call_bulk(&mut call);
        let bytes = encode(&Request { seq, call }).unwrap();
        write_message(to, &bytes, &bulk).unwrap();
    }

    /// Calls a `Call::Lanes` plans come from the lanes in turn (a large
    /// copy's bytes left on its lane, skipped where nobody takes them), or
    /// answer there; calls before and after it stay on the connection.
    #[test]
    fn calls_planned_on_lanes_come_and_answer_there_in_turn() {
        let registry = crate::lanes::LaneRegistry::default();
        let (offer, arrivals) = registry.offer(1).unwrap();
        let (mut client, wire) = connected();
        let mut wire = wire.with_lanes(Some(arrivals));
        let (feed0, mut lane0) = joined_lane(&registry, offer.key, 0);
        let (feed1, mut lane1) = joined_lane(&registry, offer.key, 1);
        let small = pattern(4, 1000);
        let plan = |count, replies| Call::Lanes {
            count,
            lanes: 2,
            replies,
        };
        send_request(&mut client, 1, plan(3, false));
        let big = Call::MemcpyHtoD {
            dst: 0x1000,
            data: pattern(2, BIG),
            stream: None,
        };
        let small_copy = Call::MemcpyHtoD {
            dst: 0x2000,
            data: small.clone(),
            stream: None,
        };
        feed_frames(&feed0, &[(2, big), (4, small_copy.clone())]);
        feed_frames(&feed1, &[(3, Call::MemGetInfo { device: 0 })]);
        send_request(&mut client, 5, Call::MemGetInfo { device: 0 });
        let first = wire.next_request().ok().unwrap();
        assert_eq!(first.seq, 2);
        assert_eq!(wire.in_place, Some((BIG, Some(0))));
        let seqs: Vec<_> = (0..3)
            .map(|_| {
                let request = wire.next_request().ok().unwrap();
                if request.seq == 4 {
                    assert_eq!(request.call, small_copy);
                }
                request.seq
            })
            .collect();
        assert_eq!(seqs, [3, 4, 5]);
        // Replies on the lanes: requests 7 and 8 answer on lanes 0 and 1,
        // 9 on the connection.
        send_request(&mut client, 6, plan(2, true));
        for seq in 7..=9 {
            send_request(&mut client, seq, Call::MemGetInfo { device: 0 });
        }
        for seq in 7..=9 {
            let request = wire.next_request().ok().unwrap();
            assert_eq!(request.seq, seq);
            let reply = Reply {
                seq,
                result: Ok(ReplyBody::Unit),
                stdout: Vec::new(),
            };
            wire.send_reply(reply).unwrap();
        }
        assert_eq!(read_reply(&mut lane0).seq, 7);
        assert_eq!(read_reply(&mut lane1).seq, 8);
        assert_eq!(read_reply(&mut client).seq, 9);
        // A plan that a lane sends, or one with no lanes, breaks the wire.
        send_request(&mut client, 10, plan(1, false));
        feed_frames(&feed0, &[(11, plan(1, false))]);
        assert!(matches!(wire.next_request(), Err(Unread::Broken(_))));
        let (mut client, mut wire) = connected();
        send_request(&mut client, 1, plan(1, false));
        assert!(matches!(wire.next_request(), Err(Unread::Broken(_))));
    }

    /// A plan that names a lane which never joins ends the wire within
    /// `LANE_PATIENCE`, saying which: a client cannot hold the session's
    /// thread waiting for it.
    #[test]
    fn a_lane_that_never_joins_breaks_the_wire_in_time() {
        let registry = crate::lanes::LaneRegistry::default();
        let (offer, arrivals) = registry.offer(1).unwrap();
        let (mut client, wire) = connected();
        let mut wire = wire.with_lanes(Some(arrivals));
        let (feed0, _lane0) = joined_lane(&registry, offer.key, 0);
        let plan = Call::Lanes {
            count: 2,
            lanes: 2,
            replies: false,
        };
        send_request(&mut client, 1, plan);
        feed_frames(&feed0, &[(2, Call::MemGetInfo { device: 0 })]);
        assert_eq!(wire.next_request().ok().map(|r| r.seq), Some(2));
        let started = std::time::Instant::now();
        match wire.next_request() {
            Err(Unread::Broken(why)) => assert!(why.contains("lane 1 did not join"), "{why}"),
            _ => panic!("the wire should break"),
        }
        assert!(started.elapsed() < LANE_PATIENCE * 2);
    }
}
