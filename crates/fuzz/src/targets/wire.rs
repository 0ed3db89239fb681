//! The wire decoder: whatever bytes come in decode to a message or an error,
//! never a panic, as a hello, a request, a reply or a stream of frames; a
//! decoded request encodes and decodes back to itself. Inputs that start with
//! byte 0 build a valid request from the rest instead ([`calls`]) and check
//! that encoding, framing and the bulk split all give it back unchanged.

use std::mem::discriminant;

use arbitrary::Unstructured;
use cumux_protocol::shm::{put_call_bulk, take_call_bulk};
use cumux_protocol::{
    decode, encode, read_bulk, read_frame, read_message, write_frame, write_message, Hello,
    HelloReply, Reply, Request, ShmAttach, ShmAttached,
};

use super::calls::{self, Known};
use crate::engine::Target;
use crate::features::Features;
use crate::mutate::Rand;

pub static TARGET: Target = Target {
    name: "wire",
    check,
    seeds,
    dictionary: &[
        &[0x58, 0x55, 0x4d, 0x43],
        &[0xff, 0xff, 0xff, 0xff, 0x0f],
        &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
        &[0x00, 0x02, 0x00, 0x00],
    ],
    max_len: 4096,
};

fn check(data: &[u8], features: &mut Features) {
    if data.first() == Some(&0) {
        let mut u = Unstructured::new(&data[1..]);
        if let Ok(request) = structured(&mut u) {
            round_trip(request, features);
        }
        return;
    }
    decode_all(data, features);
    // The same bytes as a stream of frames.
    let mut stream = data;
    let mut buf = Vec::new();
    let mut frames = 0u32;
    while read_frame(&mut stream, &mut buf).is_ok() {
        frames += 1;
        match decode::<Request>(&buf) {
            Ok(r) => features.add(("frame request", <&str>::from(&r.call))),
            Err(e) => features.add(("frame error", discriminant(&e))),
        }
    }
    features.add(("frames", frames.min(4)));
    // And as a socket's messages, each perhaps with a bulk frame after it.
    let mut stream = data;
    let mut messages = 0u32;
    while let Ok(bulk) = read_message(&mut stream, &mut buf) {
        messages += 1;
        let mut request = decode::<Request>(&buf);
        if let Some(len) = bulk {
            let Ok(bytes) = read_bulk(&mut stream, len) else {
                features.add(("bulk", "cut"));
                break;
            };
            if let Ok(r) = request.as_mut() {
                features.add(("bulk put", put_call_bulk(&mut r.call, bytes).is_ok()));
            }
        }
        features.add(("message", request.is_ok()));
    }
    features.add(("messages", messages.min(4)));
}

/// Every message type a server or a client decodes.
fn decode_all(data: &[u8], features: &mut Features) {
    match decode::<Request>(data) {
        Ok(request) => {
            features.add(("request", <&str>::from(&request.call)));
            features.add(("fire and forget", request.call.is_fire_and_forget()));
            let again = encode(&request).expect("a decoded request encodes");
            let back = decode::<Request>(&again).expect("and decodes back");
            assert_eq!(back, request, "a request survives encode and decode");
        }
        Err(e) => features.add(("request error", discriminant(&e))),
    }
    features.add(("hello", decode::<Hello>(data).is_ok()));
    features.add(("hello reply", decode::<HelloReply>(data).is_ok()));
    features.add(("reply", decode::<Reply>(data).is_ok()));
    features.add(("shm attach", decode::<ShmAttach>(data).is_ok()));
    features.add(("shm attached", decode::<ShmAttached>(data).is_ok()));
    // The tag a pinned region's memfd comes with, and its length.
    features.add(("pair", decode::<(u32, u32)>(data).is_ok()));
}

fn structured(u: &mut Unstructured) -> arbitrary::Result<Request> {
    Ok(Request {
        seq: u.arbitrary()?,
        call: calls::call(u, &Known::default(), &[])?,
    })
}

/// `request` encodes, frames, splits off its bulk and comes back unchanged.
fn round_trip(request: Request, features: &mut Features) {
    features.add(("structured", <&str>::from(&request.call)));
    let bytes = encode(&request).expect("a request encodes");
    assert_eq!(decode::<Request>(&bytes).expect("and decodes"), request);
    let mut wire = Vec::new();
    write_frame(&mut wire, &bytes).expect("a small frame is written");
    let mut buf = Vec::new();
    read_frame(&mut &wire[..], &mut buf).expect("and read back");
    assert_eq!(buf, bytes);
    let mut split = request.clone();
    let bulk = take_call_bulk(&mut split.call);
    features.add(("bulk", !bulk.is_empty()));
    let inline = encode(&split).expect("the rest encodes");
    let mut back: Request = decode(&inline).expect("and decodes");
    put_call_bulk(&mut back.call, bulk.clone()).expect("the bulk goes back");
    assert_eq!(back, request, "the bulk split loses nothing");
    // As the socket carries it: the message, then its bulk in a frame of its own.
    let mut wire = Vec::new();
    write_message(&mut wire, &inline, &bulk).expect("a message is written");
    let mut reader = &wire[..];
    let len = read_message(&mut reader, &mut buf).expect("and read back");
    assert_eq!(buf, inline);
    let mut again: Request = decode(&buf).expect("and decodes");
    if let Some(len) = len {
        let bytes = read_bulk(&mut reader, len).expect("its bulk follows");
        put_call_bulk(&mut again.call, bytes).expect("and goes back");
    }
    assert_eq!(again, request, "the socket's bulk frame loses nothing");
}

/// Encoded requests of every kind, raw and framed, and a hello.
fn seeds() -> Vec<Vec<u8>> {
    let mut rand = Rand::seeded(0x5eed);
    let mut out = Vec::new();
    for _ in 0..96 {
        let mut noise = vec![0u8; 256];
        rand.fill(&mut noise);
        let Ok(request) = structured(&mut Unstructured::new(&noise)) else {
            continue;
        };
        let bytes = encode(&request).expect("a request encodes");
        let mut framed = Vec::new();
        write_frame(&mut framed, &bytes).expect("a small frame is written");
        out.push(bytes);
        out.push(framed);
        let mut with_marker = vec![0u8];
        with_marker.extend_from_slice(&noise);
        out.push(with_marker);
    }
    let hello = Hello {
        magic: cumux_protocol::MAGIC,
        version: cumux_protocol::PROTOCOL_VERSION,
        pid: 1,
        role: cumux_protocol::ClientRole::Driver,
        program: "fuzz".into(),
        tenant: Some("team".into()),
        token: None,
        shm: true,
        visible_devices: None,
        join: None,
        resume: None,
        lane: None,
    };
    out.push(encode(&hello).expect("a hello encodes"));
    out
}
