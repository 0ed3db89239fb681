//! Large copies on a socket (unix here; TCP and TLS take the same wire):
//! their bytes go between the socket and the CPU device's memory in place,
//! in order with small calls, and bad or broken copies end at most their
//! own connection.

mod common;

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use common::*;
use cumux_protocol::*;
use cumux_server::device::socket_bytes::in_place_bytes;

const MIB: usize = 1 << 20;

/// A driver's connection that stays on the socket, as over TCP.
fn socket_client(socket: &PathBuf) -> (BufReader<UnixStream>, UnixStream) {
    let (mut reader, mut writer) = raw_connect(socket);
    write_frame(
        &mut writer,
        &encode(&hello(PROTOCOL_VERSION, MAGIC)).unwrap(),
    )
    .unwrap();
    let mut buf = Vec::new();
    read_frame(&mut reader, &mut buf).unwrap();
    match decode::<HelloReply>(&buf).unwrap() {
        HelloReply::Welcome { shm: false, .. } => (reader, writer),
        other => panic!("{other:?}"),
    }
}

/// Sends `call` as the client driver does: a copy's data in a bulk frame.
fn send(writer: &mut UnixStream, seq: u64, mut call: Call) {
    let bulk = shm::take_call_bulk(&mut call);
    write_message(writer, &encode(&Request { seq, call }).unwrap(), &bulk).unwrap();
}

fn receive(reader: &mut BufReader<UnixStream>) -> Reply {
    read_reply(reader, &mut Vec::new()).expect("the server answers")
}

fn alloc(r: &mut BufReader<UnixStream>, w: &mut UnixStream, seq: u64, bytes: usize) -> u64 {
    send(
        w,
        seq,
        Call::MemAlloc {
            device: 0,
            bytes: bytes as u64,
        },
    );
    match receive(r).result {
        Ok(ReplyBody::Ptr(p)) => p,
        other => panic!("{other:?}"),
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 16) as u8)
        .collect()
}

/// Copies in and out, sent back to back with small calls between, arrive
/// whole and in order, their bytes moved in place (no buffer between the
/// socket and device memory: the device counts them).
#[test]
fn large_copies_go_in_place_and_keep_their_order_with_small_calls() {
    let (_server, socket, _dir) = cpu_server("socket-copies", 64 << 20);
    let (mut r, mut w) = socket_client(&socket);
    let p = alloc(&mut r, &mut w, 1, 8 * MIB);
    let (a, b, c) = (
        pattern(1, 3 * MIB),
        pattern(2, MIB + 5),
        pattern(6, 2 * MIB),
    );
    let before = in_place_bytes();
    let calls = vec![
        Call::MemcpyHtoD {
            dst: p,
            data: a.clone(),
            stream: None,
        },
        Call::MemGetInfo { device: 0 },
        Call::MemcpyHtoD {
            dst: p + 4 * MIB as u64,
            data: b.clone(),
            stream: None,
        },
        Call::MemcpyDtoH {
            src: p,
            bytes: a.len() as u64,
            stream: None,
        },
        Call::MemcpyDtoH {
            src: p + 4 * MIB as u64,
            bytes: 100,
            stream: None,
        },
        Call::MemcpyDtoH {
            src: p + 4 * MIB as u64,
            bytes: b.len() as u64,
            stream: None,
        },
        Call::MemGetInfo { device: 0 },
        // As the client driver sends a synchronous copy's chunks: in the
        // default stream's order, unanswered.
        Call::MemcpyHtoD {
            dst: p + 6 * MIB as u64,
            data: c.clone(),
            stream: Some(DEFAULT_STREAM),
        },
        Call::MemcpyDtoH {
            src: p + 6 * MIB as u64,
            bytes: c.len() as u64,
            stream: None,
        },
    ];
    let count = calls.len() - 1;
    let sending = {
        let mut w = w.try_clone().unwrap();
        std::thread::spawn(move || {
            for (i, call) in calls.into_iter().enumerate() {
                send(&mut w, i as u64 + 2, call);
            }
        })
    };
    let replies: Vec<Reply> = (0..count).map(|_| receive(&mut r)).collect();
    sending.join().unwrap();
    for (i, reply) in replies.iter().enumerate() {
        // The unanswered copy (seq 9) has no reply.
        let seq = if i < 7 { i + 2 } else { i + 3 };
        assert_eq!(reply.seq, seq as u64);
    }
    assert_eq!(replies[0].result, Ok(ReplyBody::Unit));
    assert!(matches!(replies[1].result, Ok(ReplyBody::MemInfo { .. })));
    assert_eq!(replies[2].result, Ok(ReplyBody::Unit));
    assert_eq!(replies[3].result, Ok(ReplyBody::Data(a.clone())));
    assert_eq!(replies[4].result, Ok(ReplyBody::Data(b[..100].to_vec())));
    assert_eq!(replies[5].result, Ok(ReplyBody::Data(b.clone())));
    assert!(matches!(replies[6].result, Ok(ReplyBody::MemInfo { .. })));
    assert_eq!(replies[7].result, Ok(ReplyBody::Data(c.clone())));
    // In place: the copies in and the large ones out.
    let moved = (2 * a.len() + 2 * b.len() + 2 * c.len()) as u64;
    assert!(in_place_bytes() - before >= moved);
}

/// A copy past its allocation is refused with its bytes skipped, and the
/// connection goes on; a read past it sends no bytes, only the refusal.
#[test]
fn copies_past_their_allocation_are_refused_and_the_connection_goes_on() {
    let (_server, socket, _dir) = cpu_server("socket-copies-bad", 64 << 20);
    let (mut r, mut w) = socket_client(&socket);
    let p = alloc(&mut r, &mut w, 1, MIB);
    let data = pattern(3, 2 * MIB);
    send(
        &mut w,
        2,
        Call::MemcpyHtoD {
            dst: p,
            data: data.clone(),
            stream: None,
        },
    );
    let refused = receive(&mut r);
    assert_eq!(refused.seq, 2);
    assert!(refused.result.is_err(), "{:?}", refused.result);
    send(
        &mut w,
        3,
        Call::MemcpyDtoH {
            src: p,
            bytes: 2 * MIB as u64,
            stream: None,
        },
    );
    let refused = receive(&mut r);
    assert_eq!(refused.seq, 3);
    assert!(refused.result.is_err(), "{:?}", refused.result);
    // Unknown stream: refused before any byte is taken.
    send(
        &mut w,
        4,
        Call::MemcpyHtoD {
            dst: p,
            data: data[..MIB].to_vec(),
            stream: Some(0xdead),
        },
    );
    send(
        &mut w,
        5,
        Call::MemcpyHtoD {
            dst: p,
            data: data[..MIB].to_vec(),
            stream: None,
        },
    );
    // The first is unanswered (its failure is kept for a waiting call).
    assert_eq!(receive(&mut r).seq, 5);
    send(
        &mut w,
        6,
        Call::MemcpyDtoH {
            src: p,
            bytes: MIB as u64,
            stream: None,
        },
    );
    let reply = receive(&mut r);
    assert_eq!(reply.seq, 6);
    assert_eq!(reply.result, Ok(ReplyBody::Data(data[..MIB].to_vec())));
}

/// A client that stops mid-copy (its bytes cut short, or gone before its
/// answer is read) ends only its own connection.
#[test]
fn a_client_gone_mid_copy_ends_only_its_connection() {
    let (server, socket, _dir) = cpu_server("socket-copies-cut", 64 << 20);
    {
        let (mut r, mut w) = socket_client(&socket);
        let p = alloc(&mut r, &mut w, 1, 4 * MIB);
        // A copy announced at 2 MiB, of which 1 MiB comes.
        let call = Call::MemcpyHtoD {
            dst: p,
            data: Vec::new(),
            stream: None,
        };
        let msg = encode(&Request { seq: 2, call }).unwrap();
        write_message_head(&mut w, &msg, 2 * MIB).unwrap();
        w.write_all(&pattern(4, MIB)).unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
        let mut buf = Vec::new();
        assert!(read_message(&mut r, &mut buf).is_err(), "no answer comes");
    }
    {
        let (mut r, mut w) = socket_client(&socket);
        let p = alloc(&mut r, &mut w, 1, 16 * MIB);
        // A large read whose asker goes away at once.
        send(
            &mut w,
            2,
            Call::MemcpyDtoH {
                src: p,
                bytes: 16 * MIB as u64,
                stream: None,
            },
        );
    }
    let good = Client::connect_with(&socket, "good", Some("team-a"), false);
    let data = pattern(5, 3 * MIB);
    let mut good = good;
    let p = good.alloc(data.len() as u64);
    good.write(p, &data);
    assert_eq!(good.read(p, data.len() as u64).unwrap(), data);
    drop(good);
    eventually("the sessions end", || server.registry().is_empty());
}
