//! Requests and replies as length-prefixed frames on a socket (unix, TCP or
//! TLS), on the connection's own thread. A large copy's bytes go between the
//! socket and the device where they lie: read straight into device memory
//! (or a worker's ring), written straight from it; other large replies are
//! written by a helper while the session goes on.

use std::io::{self, Read, Write};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use cumux_protocol::shm::{self, ShmError};
use cumux_protocol::{decode, encode, read_bulk, read_message, write_message, FrameError};
use cumux_protocol::{write_message_head, Call, CuError, Reply, ReplyBody, Request};

use super::Ending;
use crate::locking::{lock, wait};
use crate::session::{Session, SocketCopy};

/// Replies with data from this size on are written behind by a helper.
const PIPELINED_BYTES: usize = 1 << 20;

/// A copy of this size or more goes between the socket and the device in
/// place: above it, a buffer's copy costs more than the call's own work.
pub(super) const IN_PLACE_BYTES: usize = 64 << 10;

/// Stack of a connection's helper.
const HELPER_STACK: usize = 512 << 10;

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

pub(super) struct SocketWire<R, W> {
    reading: Reading<R>,
    writing: Arc<Mutex<W>>,
    behind: Arc<Behind>,
    write_behind: Option<Helper<Reply>>,
    /// Why the writing helper stopped, if it did.
    write_failed: Arc<Mutex<Option<String>>>,
    /// The length of the last request's copy bytes, still on the socket.
    in_place: Option<usize>,
    /// Printf output taken for a reply that did not go (a copy refused
    /// before its bytes were sent): the next reply's.
    stdout: Vec<u8>,
    /// Where a unix socket keeps the descriptor that came with a call.
    fds: Option<super::fd_inbox::FdInbox>,
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
            writing: Arc::new(Mutex::new(writer)),
            behind: Arc::default(),
            write_behind: None,
            write_failed: Arc::default(),
            in_place: None,
            stdout: Vec::new(),
            fds: None,
        }
    }

    /// The wire, taking descriptors that come with calls from `fds`.
    pub(super) fn with_fds(mut self, fds: Option<super::fd_inbox::FdInbox>) -> Self {
        self.fds = fds;
        self
    }

    /// The descriptor that came with the call just read, if one did.
    pub(super) fn take_fd(&mut self) -> Option<std::os::fd::OwnedFd> {
        self.fds.as_ref().and_then(|fds| fds.take())
    }

    /// The next request. A `MemcpyHtoD` of [`IN_PLACE_BYTES`] or more comes
    /// with empty `data`, its bytes left on the socket for
    /// [`SocketWire::handle`] to read where they go.
    pub(super) fn next_request(&mut self) -> Result<Request, Unread> {
        if let Some(left) = self.in_place.take() {
            // Never handled (a wire used without `handle`): skip them.
            skip(&mut self.reading.reader, left).map_err(Unread::Broken)?;
        }
        let Reading { reader, buf } = &mut self.reading;
        let bulk_len = match read_message(reader, buf) {
            Ok(bulk_len) => bulk_len,
            Err(FrameError::Closed) => return Err(Unread::Closed),
            Err(e) => return Err(Unread::Broken(format!("bad frame: {e}"))),
        };
        let mut request: Request = decode(buf).map_err(|e| {
            Unread::Broken(format!("undecodable request ({} bytes): {e}", buf.len()))
        })?;
        let Some(len) = bulk_len else {
            return Ok(request);
        };
        if let Call::MemcpyHtoD { data, .. } = &request.call {
            if len >= IN_PLACE_BYTES && data.is_empty() {
                self.in_place = Some(len);
                return Ok(request);
            }
        }
        let bulk =
            read_bulk(reader, len).map_err(|e| Unread::Broken(format!("bad bulk frame: {e}")))?;
        shm::put_call_bulk(&mut request.call, bulk).map_err(|e| match e {
            ShmError::PeerGone => Unread::Closed,
            ShmError::Violation(why) => Unread::Broken(format!("shared area: {why}")),
        })?;
        Ok(request)
    }

    /// Has `session` handle `call` (request `seq`): a large copy's bytes go
    /// between the socket and the device in place. `Err`: the connection
    /// ends (the socket failed mid-copy).
    pub(super) fn handle(
        &mut self,
        session: &mut Session,
        call: Call,
        seq: u64,
    ) -> Result<Option<Answer>, Ending> {
        if let Some(len) = self.in_place.take() {
            return self.handle_incoming(session, call, len);
        }
        match call {
            Call::MemcpyDtoH { bytes, .. } if bytes as usize >= IN_PLACE_BYTES => {
                self.handle_outgoing(session, call, seq, bytes as usize)
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
    ) -> Result<Option<Answer>, Ending> {
        let reader = &mut self.reading.reader;
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
            return Err(Ending::Broken(format!(
                "a copy's bytes did not arrive: {why}"
            )));
        }
        skip(reader, left).map_err(Ending::Broken)?;
        Ok(result)
    }

    /// A `MemcpyDtoH` of `bytes` whose answer is written from where the
    /// bytes lie: its header before the first of them.
    fn handle_outgoing(
        &mut self,
        session: &mut Session,
        call: Call,
        seq: u64,
        bytes: usize,
    ) -> Result<Option<Answer>, Ending> {
        // Earlier replies leave first.
        self.written().map_err(Ending::Broken)?;
        self.stdout.extend(session.take_stdout());
        let mut writer = lock(&self.writing);
        let mut stdout = Some(std::mem::take(&mut self.stdout));
        let mut sent = 0usize;
        let mut failed = None;
        let mut send = |piece: &[u8]| -> io::Result<()> {
            let written = (|| {
                if let Some(stdout) = stdout.take() {
                    let reply = Reply {
                        seq,
                        result: Ok(ReplyBody::Data(Vec::new())),
                        stdout,
                    };
                    let msg = encode(&reply).map_err(io::Error::other)?;
                    write_message_head(&mut *writer, &msg, bytes).map_err(io::Error::other)?;
                }
                if sent + piece.len() > bytes {
                    return Err(io::Error::other("more bytes sent than the copy has"));
                }
                writer.write_all(piece)?;
                sent += piece.len();
                Ok(())
            })();
            if let Err(e) = &written {
                failed = Some(e.to_string());
            }
            written
        };
        let result = session.handle_socket_copy(call, SocketCopy::Outgoing(&mut send));
        let committed = stdout.is_none();
        if let Some(why) = failed {
            return Err(Ending::Broken(format!("cannot send a copy's bytes: {why}")));
        }
        if !committed {
            // Refused or failed before its bytes: answered as any call.
            self.stdout = stdout.unwrap_or_default();
            return Ok(result);
        }
        match result {
            Some(Ok(_)) if sent == bytes => {
                writer
                    .flush()
                    .map_err(|e| Ending::Broken(format!("cannot send: {e}")))?;
                Ok(None)
            }
            other => Err(Ending::Broken(format!(
                "a copy failed after {sent} of its {bytes} bytes were sent: {other:?}"
            ))),
        }
    }

    /// Sends `reply` after every reply before it; a large one is written by
    /// the helper while the session goes on.
    pub(super) fn send_reply(&mut self, mut reply: Reply) -> Result<(), String> {
        self.written()?;
        if !self.stdout.is_empty() {
            let mut stdout = std::mem::take(&mut self.stdout);
            stdout.append(&mut reply.stdout);
            reply.stdout = stdout;
        }
        if matches!(&reply.result, Ok(ReplyBody::Data(d)) if d.len() >= PIPELINED_BYTES) {
            return self.write_behind(reply);
        }
        write_reply(&mut *lock(&self.writing), reply)
    }

    /// Hands a reply with large data to the writing helper.
    fn write_behind(&mut self, reply: Reply) -> Result<(), String> {
        if self.write_behind.is_none() {
            let writing = Arc::clone(&self.writing);
            let behind = Arc::clone(&self.behind);
            let failed = Arc::clone(&self.write_failed);
            self.write_behind = Some(Helper::start("cumux-write-behind", move |reply| {
                if lock(&failed).is_none() {
                    if let Err(e) = write_reply(&mut *lock(&writing), reply) {
                        *lock(&failed) = Some(e);
                    }
                }
                *lock(&behind.pending) -= 1;
                behind.written.notify_all();
            })?);
        }
        *lock(&self.behind.pending) += 1;
        let helper = self.write_behind.as_ref().expect("started above");
        if helper.jobs.send(reply).is_err() {
            *lock(&self.behind.pending) -= 1;
            return Err("the connection's writer stopped".into());
        }
        Ok(())
    }

    /// Waits until every reply handed to the helper is written.
    fn written(&self) -> Result<(), String> {
        let mut pending = lock(&self.behind.pending);
        while *pending > 0 {
            pending = wait(&self.behind.written, pending);
        }
        match lock(&self.write_failed).clone() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

impl<R, W> Drop for SocketWire<R, W> {
    fn drop(&mut self) {
        // Every reply leaves before the connection closes.
        if let Some(helper) = self.write_behind.take() {
            drop(helper.jobs);
            let _ = helper.thread.join();
        }
    }
}

/// Reads and drops `len` bytes of `reader`: a copy's bytes nobody took.
fn skip(reader: &mut impl Read, len: usize) -> Result<(), String> {
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
                    assert_eq!(wire.in_place, Some(data.len()));
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
}
