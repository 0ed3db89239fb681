//! Requests and replies as length-prefixed frames on a socket (unix, TCP or
//! TLS). Small calls go the connection thread's own way, read, handled,
//! answered; around large data a helper reads the next request and another
//! writes the reply, so that a large copy's chunks cross the network while
//! the device copies the one before.

use std::io::{BufReader, Read};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use cumux_protocol::shm;
use cumux_protocol::{decode, encode, read_bulk, read_message, write_message, FrameError};
use cumux_protocol::{Call, Reply, Request};

use super::{shm_ending, Ending, Socket, Wire};
use crate::locking::lock;

/// Data from this size on is read ahead or written behind by a helper.
const PIPELINED_BYTES: usize = 1 << 20;

/// Stack of a connection's helpers.
const HELPER_STACK: usize = 512 << 10;

/// The reading end: the buffered socket and the frame buffer.
struct Reading {
    reader: BufReader<Socket>,
    buf: Vec<u8>,
}

/// Replies handed to the writing helper and not yet written.
#[derive(Default)]
struct Behind {
    pending: Mutex<usize>,
    written: Condvar,
}

pub(super) struct SocketWire {
    reading: Arc<Mutex<Reading>>,
    writing: Arc<Mutex<Socket>>,
    behind: Arc<Behind>,
    /// The request being read ahead, if one is.
    ahead: Option<Receiver<Result<Request, Ending>>>,
    read_ahead: Option<Helper<Sender<Result<Request, Ending>>>>,
    write_behind: Option<Helper<Reply>>,
    /// Why the writing helper stopped, if it did.
    write_failed: Arc<Mutex<Option<String>>>,
    /// The socket, to end a helper's wait for the next request at the end.
    socket: Socket,
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

impl SocketWire {
    pub(super) fn start(
        reader: BufReader<Socket>,
        writer: Socket,
        buf: Vec<u8>,
    ) -> Result<SocketWire, String> {
        let socket = writer
            .try_clone()
            .map_err(|e| format!("cannot clone the socket: {e}"))?;
        Ok(SocketWire {
            reading: Arc::new(Mutex::new(Reading { reader, buf })),
            writing: Arc::new(Mutex::new(writer)),
            behind: Arc::default(),
            ahead: None,
            read_ahead: None,
            write_behind: None,
            write_failed: Arc::default(),
            socket,
        })
    }

    /// Starts reading the next request on the helper, while this one is handled.
    fn read_next_ahead(&mut self) -> Result<(), String> {
        if self.read_ahead.is_none() {
            let reading = Arc::clone(&self.reading);
            self.read_ahead = Some(Helper::start(
                "cumux-read-ahead",
                move |answer: Sender<Result<Request, Ending>>| {
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
                    if let Err(e) = write_reply(&mut lock(&writing), reply) {
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
            pending = self
                .behind
                .written
                .wait(pending)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        match lock(&self.write_failed).clone() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

impl Wire for SocketWire {
    fn receive(&mut self) -> Result<Request, Ending> {
        let request = match self.ahead.take() {
            Some(ahead) => ahead
                .recv()
                .unwrap_or_else(|_| Err(Ending::Broken("the connection's reader stopped".into()))),
            None => {
                let mut reading = lock(&self.reading);
                let Reading { reader, buf } = &mut *reading;
                read_request(reader, buf)
            }
        }?;
        if carried_bytes(&request.call) >= PIPELINED_BYTES {
            self.read_next_ahead().map_err(Ending::Broken)?;
        }
        Ok(request)
    }

    fn reply(&mut self, reply: Reply) -> Result<(), String> {
        // Replies leave in order: after every one handed to the helper.
        self.written()?;
        if matches!(&reply.result, Ok(cumux_protocol::ReplyBody::Data(d)) if d.len() >= PIPELINED_BYTES)
        {
            return self.write_behind(reply);
        }
        write_reply(&mut lock(&self.writing), reply)
    }
}

impl Drop for SocketWire {
    fn drop(&mut self) {
        // Every reply leaves before the connection closes.
        if let Some(helper) = self.write_behind.take() {
            drop(helper.jobs);
            let _ = helper.thread.join();
        }
        // A request being read ahead waits on the socket: end that wait.
        if let Some(helper) = self.read_ahead.take() {
            drop(helper.jobs);
            self.socket.shut_reading();
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

fn read_request(reader: &mut impl Read, buf: &mut Vec<u8>) -> Result<Request, Ending> {
    let bulk_len = match read_message(reader, buf) {
        Ok(bulk_len) => bulk_len,
        Err(FrameError::Closed) => return Err(Ending::Closed),
        Err(e) => return Err(Ending::Broken(format!("bad frame: {e}"))),
    };
    let mut request: Request = decode(buf)
        .map_err(|e| Ending::Broken(format!("undecodable request ({} bytes): {e}", buf.len())))?;
    if let Some(len) = bulk_len {
        let bulk =
            read_bulk(reader, len).map_err(|e| Ending::Broken(format!("bad bulk frame: {e}")))?;
        shm::put_call_bulk(&mut request.call, bulk).map_err(shm_ending)?;
    }
    Ok(request)
}

fn write_reply(writer: &mut Socket, mut reply: Reply) -> Result<(), String> {
    // A copy's data goes from where it lies, not through the encoder.
    let bulk = shm::take_reply_bulk(&mut reply);
    let bytes = encode(&reply).map_err(|e| format!("cannot encode a reply: {e}"))?;
    write_message(writer, &bytes, &bulk).map_err(|e| format!("cannot send: {e}"))
}
