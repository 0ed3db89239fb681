//! Thousands of random and mutated frames thrown at a live server, from a fixed
//! seed: every connection must end without hanging, the server must keep
//! answering a well-behaved client, and no session may leak memory.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::{Duration, Instant};

use common::*;
use cumux_protocol::*;

use cumux_testkit::Rng;

/// A plausible call: real opcodes with a mix of valid-looking and wild values.
fn random_call(rng: &mut Rng) -> Call {
    let handle = |rng: &mut Rng| {
        rng.pick(&[
            0,
            1,
            2,
            0x100,
            0x101,
            0x102,
            0x103,
            0x104,
            0x105,
            0x106,
            u64::MAX,
            0x7f00_0000_0000,
        ])
    };
    let ptr = |rng: &mut Rng| {
        rng.pick(&[
            0,
            1,
            u64::MAX,
            0x7f00_0000_0000,
            0x7f00_0000_0100,
            0x7eff_ffff_ffff,
        ])
        .wrapping_add(rng.below(64))
    };
    let size = |rng: &mut Rng| rng.pick(&[0, 1, 4, 255, 4096, 1 << 40, u64::MAX]);
    let stream = |rng: &mut Rng| {
        if rng.below(2) == 0 {
            None
        } else {
            Some(handle(rng))
        }
    };
    match rng.below(23) {
        0 => Call::MemAlloc {
            device: rng.below(3) as u32,
            bytes: size(rng).min(1 << 41),
        },
        1 => Call::MemFree { ptr: ptr(rng) },
        2 => Call::MemGetInfo {
            device: rng.below(2) as u32,
        },
        3 => Call::MemAddressRange { ptr: ptr(rng) },
        4 => Call::MemcpyHtoD {
            dst: ptr(rng),
            data: rng.bytes_below(300),
            stream: stream(rng),
        },
        5 => Call::MemcpyDtoH {
            src: ptr(rng),
            bytes: size(rng),
            stream: stream(rng),
        },
        6 => Call::MemcpyDtoD {
            dst: ptr(rng),
            src: ptr(rng),
            bytes: size(rng),
            stream: stream(rng),
        },
        7 => Call::Memset {
            dst: ptr(rng),
            value: rng.next_u64() as u32,
            elem_bytes: rng.below(6) as u8,
            count: size(rng),
            pitch: size(rng),
            height: rng.pick(&[0, 1, 2, u64::MAX]),
            stream: stream(rng),
        },
        8 => Call::ModuleLoad {
            image: match rng.below(3) {
                0 => b"model:print,fault,panic;g:64".to_vec(),
                1 => rng.bytes_below(200),
                _ => b"model:nope".to_vec(),
            },
        },
        9 => Call::ModuleUnload {
            module: handle(rng),
        },
        10 => Call::Launch {
            function: handle(rng),
            grid: [rng.below(3) as u32, 1, rng.pick(&[1, u32::MAX])],
            block: [rng.pick(&[0, 1, 32, 1024, 4096]), 1, 1],
            shared_bytes: rng.pick(&[0, 1 << 20]),
            stream: handle(rng),
            params: rng.bytes_below(24),
            attributes: vec![
                LaunchAttribute::ClusterDim([rng.pick(&[0, 1, 2, 16, u32::MAX]), 1, 1]),
                LaunchAttribute::Priority(rng.next_u64() as i32),
            ],
        },
        11 => Call::StreamCreate {
            flags: rng.pick(&[0, 1, 2, u32::MAX]),
            priority: rng.next_u64() as i32,
        },
        12 => Call::StreamDestroy {
            stream: handle(rng),
        },
        13 => Call::StreamSynchronize {
            stream: handle(rng),
        },
        14 => Call::StreamQuery {
            stream: handle(rng),
        },
        15 => Call::StreamWaitEvent {
            stream: handle(rng),
            event: handle(rng),
        },
        16 => Call::EventCreate {
            flags: rng.pick(&[0, 2, 0x100]),
        },
        17 => Call::EventRecord {
            event: handle(rng),
            stream: handle(rng),
        },
        18 => Call::EventQuery { event: handle(rng) },
        19 => Call::EventElapsed {
            start: handle(rng),
            end: handle(rng),
        },
        20 => Call::EventDestroy { event: handle(rng) },
        21 => Call::TensorMapEncode {
            request: TensorMapRequest {
                data_type: rng.below(20) as u32,
                rank: rng.pick(&[0, 1, 2, 5, 6, u32::MAX]),
                global_address: ptr(rng),
                global_dim: (0..rng.below(7)).map(|_| rng.next_u64()).collect(),
                global_strides: (0..rng.below(7)).map(|_| rng.next_u64()).collect(),
                element_strides: (0..rng.below(7)).map(|_| rng.next_u64() as u32).collect(),
                interleave: 0,
                swizzle: rng.below(5) as u32,
                l2_promotion: 0,
                oob_fill: 0,
                layout: TensorMapLayout::Tiled {
                    box_dim: (0..rng.below(7)).map(|_| rng.next_u64() as u32).collect(),
                },
            },
        },
        _ => Call::ContextSynchronize,
    }
}

fn mutate(rng: &mut Rng, mut bytes: Vec<u8>) -> Vec<u8> {
    for _ in 0..=rng.below(4) {
        match rng.below(5) {
            0 if !bytes.is_empty() => {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] ^= 1 << rng.below(8);
            }
            1 if !bytes.is_empty() => {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = rng.next_u64() as u8;
            }
            2 => bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize),
            3 => {
                let at = rng.below(bytes.len() as u64 + 1) as usize;
                let extra = rng.bytes_below(8);
                bytes.splice(at..at, extra);
            }
            _ => bytes.extend(rng.bytes_below(16)),
        }
    }
    bytes
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// The bytes of one hostile connection, and how many frames they hold.
fn hostile_stream(rng: &mut Rng) -> (Vec<u8>, usize) {
    let good_hello = encode(&hello(PROTOCOL_VERSION, MAGIC)).unwrap();
    let mut wire = Vec::new();
    let mut frames = 1;
    match rng.below(6) {
        // Garbage with no framing at all.
        0 => wire.extend(rng.bytes_below(64)),
        // A huge or lying length prefix.
        1 => {
            wire.extend(
                rng.pick(&[u32::MAX, 80 << 20, (80 << 20) + 1, 1000])
                    .to_le_bytes(),
            );
            wire.extend(rng.bytes_below(32));
        }
        // A mutated hello.
        2 => wire.extend(frame(&mutate(rng, good_hello))),
        // A good hello, then mutated requests.
        3 | 4 => {
            wire.extend(frame(&good_hello));
            for seq in 0..rng.below(20) {
                let call = random_call(rng);
                let bytes = encode(&Request { seq, call }).unwrap();
                let bytes = if rng.below(3) == 0 {
                    bytes
                } else {
                    mutate(rng, bytes)
                };
                wire.extend(frame(&bytes));
                frames += 1;
            }
        }
        // A good hello, then well-formed requests with wild values.
        _ => {
            wire.extend(frame(&good_hello));
            for seq in 0..rng.below(40) {
                let bytes = encode(&Request {
                    seq,
                    call: random_call(rng),
                })
                .unwrap();
                wire.extend(frame(&bytes));
                frames += 1;
            }
        }
    }
    (wire, frames)
}

/// Sends `wire`, closes the sending half and expects the server to end the
/// connection (it must not hang on anything it was sent).
fn throw(h: &Harness, wire: &[u8]) {
    let (mut reader, mut writer) = raw_connect(&h.socket);
    // The server may close early on garbage; a failed write is fine.
    let _ = writer.write_all(wire);
    let _ = writer.shutdown(Shutdown::Write);
    let started = Instant::now();
    let mut sink = [0u8; 4096];
    loop {
        match reader.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the server kept the connection open"
        );
    }
}

fn good_client_works(h: &Harness) {
    assert_client_works(h.client(), &[5; 64]);
}

#[test]
fn hostile_frames_never_hurt_the_server() {
    let h = Harness::start("hostile");
    let frames = survive(
        &h,
        0x5eed_cafe_f00d_0001,
        (1000, 100),
        good_client_works,
        |rng| {
            let (wire, n) = hostile_stream(rng);
            throw(&h, &wire);
            n as u64
        },
    );
    assert!(frames > 5000, "threw only {frames} frames");
}
