//! Requests and replies as length-prefixed frames on a socket (unix, TCP or
//! TLS). Small calls go the connection thread's own way, read, handled,
//! answered; around large data a helper reads the next request and another
//! writes the reply, so that a large copy's chunks cross the network while
//! the device copies the one before.

use std::io::{Read, Write};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use cumux_protocol::shm::{self, ShmError};
use cumux_protocol::{decode, encode, read_bulk, read_message, write_message, FrameError};
use cumux_protocol::{Call, Reply, ReplyBody, Request};

use crate::locking::{lock, wait};

/// Data from this size on is read ahead or written behind by a helper.
const PIPELINED_BYTES: usize = 1 << 20;

/// Stack of a connection's helpers.
const HELPER_STACK: usize = 512 << 10;

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

/// A request, or why none came.
type Received = Result<Request, Unread>;

pub(super) struct SocketWire<R, W> {
    reading: Arc<Mutex<Reading<R>>>,
    writing: Arc<Mutex<W>>,
    behind: Arc<Behind>,
    /// The request being read ahead, if one is.
    ahead: Option<Receiver<Received>>,
    read_ahead: Option<Helper<Sender<Received>>>,
    write_behind: Option<Helper<Reply>>,
    /// Why the writing helper stopped, if it did.
    write_failed: Arc<Mutex<Option<String>>>,
    /// Ends a helper's wait on the socket for the next request, at the end.
    shut_reading: Box<dyn Fn() + Send>,
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

impl<R: Read + Send + 'static, W: Write + Send + 'static> SocketWire<R, W> {
    /// The wire of a socket read through `reader` and written through
    /// `writer`; `buf` holds what the handshake read; `shut_reading` ends a
    /// read of the socket that waits.
    pub(super) fn new(
        reader: R,
        writer: W,
        buf: Vec<u8>,
        shut_reading: impl Fn() + Send + 'static,
    ) -> SocketWire<R, W> {
        SocketWire {
            reading: Arc::new(Mutex::new(Reading { reader, buf })),
            writing: Arc::new(Mutex::new(writer)),
            behind: Arc::default(),
            ahead: None,
            read_ahead: None,
            write_behind: None,
            write_failed: Arc::default(),
            shut_reading: Box::new(shut_reading),
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

    /// The next request, read ahead already if the one before carried
    /// large data.
    pub(super) fn next_request(&mut self) -> Received {
        let request = match self.ahead.take() {
            Some(ahead) => ahead
                .recv()
                .unwrap_or_else(|_| Err(Unread::Broken("the connection's reader stopped".into()))),
            None => {
                let mut reading = lock(&self.reading);
                let Reading { reader, buf } = &mut *reading;
                read_request(reader, buf)
            }
        }?;
        if carried_bytes(&request.call) >= PIPELINED_BYTES {
            self.read_next_ahead().map_err(Unread::Broken)?;
        }
        Ok(request)
    }

    /// Sends `reply` after every reply before it; a large one is written by
    /// the helper while the session goes on.
    pub(super) fn send_reply(&mut self, reply: Reply) -> Result<(), String> {
        self.written()?;
        if matches!(&reply.result, Ok(ReplyBody::Data(d)) if d.len() >= PIPELINED_BYTES) {
            return self.write_behind(reply);
        }
        write_reply(&mut *lock(&self.writing), reply)
    }

    /// Starts reading the next request on the helper, while this one is handled.
    fn read_next_ahead(&mut self) -> Result<(), String> {
        if self.read_ahead.is_none() {
            let reading = Arc::clone(&self.reading);
            self.read_ahead = Some(Helper::start(
                "cumux-read-ahead",
                move |answer: Sender<Received>| {
                    let mut reading = lock(&reading);
                    let Reading { reader, buf } = &mut *reading;
                    let _ = answer.send(read_request(reader, buf));
                },
            )?);
        }
        let (answer, ahead) = channel();
        let helper = self.read_ahead.as_ref().expect("started above");
        helper
            .jobs
            .send(answer)
            .map_err(|_| "the connection's reader stopped".to_string())?;
        self.ahead = Some(ahead);
        Ok(())
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
        // A request being read ahead waits on the socket: end that wait.
        if let Some(helper) = self.read_ahead.take() {
            drop(helper.jobs);
            (self.shut_reading)();
            let _ = helper.thread.join();
        }
    }
}

/// The bytes a request brought with it (a copy's data, a module's image).
fn carried_bytes(call: &Call) -> usize {
    match call {
        Call::MemcpyHtoD { data, .. } => data.len(),
        _ => 0,
    }
}

fn read_request(reader: &mut impl Read, buf: &mut Vec<u8>) -> Received {
    let bulk_len = match read_message(reader, buf) {
        Ok(bulk_len) => bulk_len,
        Err(FrameError::Closed) => return Err(Unread::Closed),
        Err(e) => return Err(Unread::Broken(format!("bad frame: {e}"))),
    };
    let mut request: Request = decode(buf)
        .map_err(|e| Unread::Broken(format!("undecodable request ({} bytes): {e}", buf.len())))?;
    if let Some(len) = bulk_len {
        let bulk =
            read_bulk(reader, len).map_err(|e| Unread::Broken(format!("bad bulk frame: {e}")))?;
        shm::put_call_bulk(&mut request.call, bulk).map_err(|e| match e {
            ShmError::PeerGone => Unread::Closed,
            ShmError::Violation(why) => Unread::Broken(format!("shared area: {why}")),
        })?;
    }
    Ok(request)
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

    fn pattern(seed: u8) -> Vec<u8> {
        (0..BIG)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// A client's end of a socket pair and the wire on the other.
    fn connected() -> (UnixStream, SocketWire<UnixStream, UnixStream>) {
        let (client, server) = UnixStream::pair().unwrap();
        let shut = server.try_clone().unwrap();
        let reader = server.try_clone().unwrap();
        let wire = SocketWire::new(reader, server, Vec::new(), move || {
            let _ = shut.shutdown(std::net::Shutdown::Read);
        });
        (client, wire)
    }

    /// Large requests are read ahead and large replies written behind; every
    /// request arrives whole and every reply leaves whole, in order.
    #[test]
    fn large_and_small_messages_keep_their_order_both_ways() {
        let (mut client, mut wire) = connected();
        let calls = [
            Call::MemcpyHtoD {
                dst: 0x1000,
                data: pattern(1),
                stream: None,
            },
            Call::MemGetInfo { device: 0 },
            Call::MemcpyHtoD {
                dst: 0x2000,
                data: pattern(2),
                stream: None,
            },
            Call::MemcpyHtoD {
                dst: 0x3000,
                data: pattern(3),
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
            assert_eq!((request.seq, &request.call), (seq as u64 + 1, call));
        }
        sending.join().unwrap();
        let replies = [
            Ok(ReplyBody::Data(pattern(4))),
            Ok(ReplyBody::Unit),
            Ok(ReplyBody::Data(pattern(5))),
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

    /// A wire whose helper waits for a request that never comes still ends.
    #[test]
    fn dropping_the_wire_ends_a_read_ahead_that_waits() {
        let (mut client, mut wire) = connected();
        let sending = std::thread::spawn(move || {
            let call = Call::MemcpyHtoD {
                dst: 0,
                data: pattern(9),
                stream: None,
            };
            send_request(&mut client, 1, call);
            client
        });
        assert!(wire.next_request().is_ok());
        assert!(wire.ahead.is_some(), "the next request is being read ahead");
        let _client = sending.join().unwrap();
        drop(wire);
    }
}
