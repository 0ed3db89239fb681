//! Large copies on a socket through a worker process (`--device worker-cpu`,
//! the path a GPU takes): every byte checked, refusals and cut-short clients.
//!
//! A client that stays on the socket (as over TCP) asks for a region in the
//! client driver's pieces, all before reading an answer: the server asks the
//! worker for the next piece while it writes the last, straight from the
//! worker's ring. Pieces of odd sizes, a refusal and small copies among them
//! arrive whole and in order; a client gone with its answers unread ends
//! only its own connection. A copy in whose bytes the client's socket is
//! cut writes nothing, the device memory keeping what it held.

mod common;

use std::io::{BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use common::*;
use cumux_protocol::*;

const MIB: usize = 1 << 20;

/// The client driver's piece of a copy on a socket.
const PIECE: usize = MIB;

struct Raw {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    seq: u64,
}

impl Raw {
    /// A driver's connection that stays on the socket.
    fn connect(server: &ServerProc, program: &str) -> Raw {
        let path = server.address.trim_start_matches("unix:");
        let writer = UnixStream::connect(path).unwrap();
        let mut reader = BufReader::new(writer.try_clone().unwrap());
        let mut writer = writer;
        write_frame(&mut writer, &encode(&driver_hello(program)).unwrap()).unwrap();
        let mut buf = Vec::new();
        read_frame(&mut reader, &mut buf).unwrap();
        match decode::<HelloReply>(&buf).unwrap() {
            HelloReply::Welcome { shm: false, .. } => Raw {
                reader,
                writer,
                seq: 0,
            },
            other => panic!("{other:?}"),
        }
    }

    /// Sends `call` as the client driver does (a copy's data in a bulk
    /// frame); its sequence number.
    fn send(&mut self, mut call: Call) -> u64 {
        self.seq += 1;
        let bulk = shm::take_call_bulk(&mut call);
        let msg = encode(&Request {
            seq: self.seq,
            call,
        })
        .unwrap();
        write_message(&mut self.writer, &msg, &bulk).unwrap();
        self.seq
    }

    fn receive(&mut self) -> Reply {
        let mut buf = Vec::new();
        let bulk = read_message(&mut self.reader, &mut buf).expect("an answer");
        let mut reply: Reply = decode(&buf).unwrap();
        if let Some(len) = bulk {
            let bytes = read_bulk(&mut self.reader, len).unwrap();
            shm::put_reply_bulk(&mut reply, bytes).unwrap();
        }
        reply
    }

    fn call(&mut self, call: Call) -> Result<ReplyBody, CuError> {
        let seq = self.send(call);
        let reply = self.receive();
        assert_eq!(reply.seq, seq);
        reply.result
    }

    fn alloc(&mut self, bytes: usize) -> u64 {
        let bytes = bytes as u64;
        match self.call(Call::MemAlloc { device: 0, bytes }) {
            Ok(ReplyBody::Ptr(p)) => p,
            other => panic!("{other:?}"),
        }
    }

    /// Writes `data` at `dst` in the driver's pieces, all sent first.
    fn write(&mut self, dst: u64, data: &[u8]) {
        let seqs: Vec<u64> = data
            .chunks(PIECE)
            .enumerate()
            .map(|(i, piece)| {
                self.send(Call::MemcpyHtoD {
                    dst: dst + (i * PIECE) as u64,
                    data: piece.to_vec(),
                    stream: None,
                })
            })
            .collect();
        for seq in seqs {
            let reply = self.receive();
            assert_eq!((reply.seq, reply.result), (seq, Ok(ReplyBody::Unit)));
        }
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 16) as u8)
        .collect()
}

fn worker_server(tag: &str) -> ServerProc {
    let args = ["--device", "worker-cpu", "--memory", "1G"].map(String::from);
    ServerProc::spawn(TempDir::new(tag), &args, &[("CUMUX_WORKER_SPARES", "0")])
}

fn read_call(src: u64, bytes: usize) -> Call {
    Call::MemcpyDtoH {
        src,
        bytes: bytes as u64,
        stream: None,
    }
}

#[test]
fn pieces_read_through_a_worker_arrive_whole_and_in_order() {
    let server = worker_server("worker-socket-copies");
    let mut c = Raw::connect(&server, "pieces");
    let size = 12 * MIB;
    let p = c.alloc(size);
    let len = 9 * MIB + 12345;
    let data = pattern(3, len);
    c.write(p, &data);
    // The region in pieces, a refusal (past the allocation), a small copy
    // and a piece of another size among them: all asked for at once.
    let mut asked: Vec<(u64, Option<std::ops::Range<usize>>)> = Vec::new();
    for (i, piece) in data.chunks(PIECE).enumerate() {
        let at = i * PIECE;
        let seq = c.send(read_call(p + at as u64, piece.len()));
        asked.push((seq, Some(at..at + piece.len())));
        match i {
            2 => {
                let seq = c.send(read_call(p + (size - 1000) as u64, PIECE));
                asked.push((seq, None));
            }
            4 => {
                let seq = c.send(read_call(p + 7, 100));
                asked.push((seq, Some(7..107)));
            }
            6 => {
                let seq = c.send(read_call(p + 99, 3 * MIB + 1));
                asked.push((seq, Some(99..99 + 3 * MIB + 1)));
            }
            _ => {}
        }
    }
    for (seq, range) in asked {
        let reply = c.receive();
        assert_eq!(reply.seq, seq);
        match range {
            Some(range) => {
                let Ok(ReplyBody::Data(got)) = reply.result else {
                    panic!("piece {seq}: {:?}", reply.result)
                };
                assert!(got == data[range], "piece {seq} differs");
            }
            None => assert!(reply.result.is_err(), "{:?}", reply.result),
        }
    }
    // A client gone with many pieces asked for and none read ends only its
    // own connection.
    {
        let mut gone = Raw::connect(&server, "gone");
        let q = gone.alloc(16 * MIB);
        for i in 0..16 {
            gone.send(read_call(q + (i * PIECE) as u64, PIECE));
        }
        gone.writer.flush().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let tail = c.call(read_call(p + (len - PIECE - 5) as u64, PIECE + 5));
    assert_eq!(tail, Ok(ReplyBody::Data(data[len - PIECE - 5..].to_vec())));
    let mut again = Raw::connect(&server, "again");
    let q = again.alloc(2 * MIB);
    let more = pattern(9, 2 * MIB - 1);
    again.write(q, &more);
    assert_eq!(
        again.call(read_call(q, more.len())),
        Ok(ReplyBody::Data(more))
    );
}

/// The `len` bytes at `src`, read by `session`.
fn read_back(session: &mut cumux_server::session::Session, src: u64, len: usize) -> Vec<u8> {
    match session.handle(read_call(src, len)) {
        Some(Ok(ReplyBody::Data(got))) => got,
        other => panic!("no read: {other:?}"),
    }
}

/// A `MemcpyHtoD` of several MiB whose client's socket is shut down partway
/// through its bytes, handed to a session as the server's connection hands
/// it (`SocketCopy::Incoming`, the bytes read from the socket into the
/// worker's ring), the session kept to look at the memory afterwards: no
/// byte of the copy reaches device memory (neither the part that came nor
/// zeros for the rest), the next wait says the copy failed, and the worker
/// and the server go on serving.
#[test]
fn a_copy_cut_short_on_its_socket_writes_nothing_through_a_worker() {
    use cumux_server::device::backends::CpuSpec;
    use cumux_server::session::SocketCopy;
    use cumux_server::worker::device::{cpu_worker_device, Sharing};

    let spec = CpuSpec {
        memory: 256 << 20,
        launch_budget: 0,
        threads: 1,
    };
    let device = cpu_worker_device(PathBuf::from(CUMUX), 0, &spec, Sharing::Isolated, None)
        .expect("a worker-cpu device");
    let server = cumux_server::Server::new(vec![device]);
    let mut session = tenant_session(&server, "cut", "t");
    let len = 4 * MIB;
    let Some(Ok(ReplyBody::Ptr(p))) = session.handle(Call::MemAlloc {
        device: 0,
        bytes: len as u64,
    }) else {
        panic!("no allocation")
    };
    let old = pattern(1, len);
    let written = session.handle(Call::MemcpyHtoD {
        dst: p,
        data: old.clone(),
        stream: None,
    });
    assert_eq!(written, Some(Ok(ReplyBody::Unit)));
    // As the client driver sends a synchronous copy's piece (in the default
    // stream's order, unanswered); its socket shut down after 2.5 MiB.
    let new = pattern(2, len);
    let cut = 5 * MIB / 2 + 77;
    let (mut client, socket) = UnixStream::pair().unwrap();
    let sending = {
        let new = new.clone();
        std::thread::spawn(move || {
            client.write_all(&new[..cut]).unwrap();
            client.shutdown(std::net::Shutdown::Both).unwrap();
        })
    };
    let mut reader = BufReader::new(socket);
    let mut fill = |piece: &mut [u8]| reader.read_exact(piece);
    let copy = Call::MemcpyHtoD {
        dst: p,
        data: Vec::new(),
        stream: Some(DEFAULT_STREAM),
    };
    session.handle_socket_copy(copy, SocketCopy::Incoming(len, &mut fill));
    sending.join().unwrap();
    let waited = session.handle(Call::ContextSynchronize);
    let got = read_back(&mut session, p, len);
    let zeros = got.iter().filter(|&&b| b == 0).count();
    let arrived = (0..len)
        .filter(|&i| got[i] == new[i] && got[i] != old[i])
        .count();
    assert!(
        got == old,
        "the cut copy reached device memory: {arrived} of its bytes, {zeros} zeros"
    );
    assert!(
        matches!(waited, Some(Err(_))),
        "the cut copy was taken as done: {waited:?}"
    );
    // The session, its worker and the server go on.
    let mut whole = &new[..];
    let mut fill = |piece: &mut [u8]| whole.read_exact(piece);
    let copy = Call::MemcpyHtoD {
        dst: p,
        data: Vec::new(),
        stream: Some(DEFAULT_STREAM),
    };
    session.handle_socket_copy(copy, SocketCopy::Incoming(len, &mut fill));
    assert!(
        read_back(&mut session, p, len) == new,
        "a whole copy after the cut one"
    );
    let mut other = tenant_session(&server, "after", "t");
    let Some(Ok(ReplyBody::Ptr(q))) = other.handle(Call::MemAlloc {
        device: 0,
        bytes: MIB as u64,
    }) else {
        panic!("no allocation for a new session")
    };
    let more = pattern(9, MIB);
    let written = other.handle(Call::MemcpyHtoD {
        dst: q,
        data: more.clone(),
        stream: None,
    });
    assert_eq!(written, Some(Ok(ReplyBody::Unit)));
    assert_eq!(
        other.handle(read_call(q, MIB)),
        Some(Ok(ReplyBody::Data(more)))
    );
}
