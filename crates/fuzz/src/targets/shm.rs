//! The shared-memory ring as the server reads it: a client end writes honest
//! messages, raw records, stray ring positions and garbage bytes into a small
//! area, closes, and the server end receives and decodes until it reports an
//! error. Whatever the client wrote, the server end must answer with a message
//! or an error, never a panic, an out-of-bounds access or a wait that does not end.

use std::sync::atomic::Ordering;
use std::time::Duration;

use arbitrary::{Result, Unstructured};
use cumux_protocol::shm::{
    put_call_bulk, read_position_offset, write_position_offset, Endpoint, ShmArea, ShmError,
    ShmLayout, Side, HEADER_BYTES, MIN_RING_BYTES, RECORD_BYTES,
};
use cumux_protocol::{decode, encode, Request};

use super::calls::{self, Known};
use crate::engine::Target;
use crate::features::Features;
use crate::mutate::Rand;

pub static TARGET: Target = Target {
    name: "shm",
    check,
    seeds,
    dictionary: &[],
    max_len: 4096,
};

/// The smallest rings, so records straddle their ends and wrap quickly.
const LAYOUT: ShmLayout = ShmLayout {
    request_ring: MIN_RING_BYTES,
    reply_ring: MIN_RING_BYTES,
    request_bulk: MIN_RING_BYTES,
    reply_bulk: MIN_RING_BYTES,
};

/// The most messages the server end reads of one input.
const MAX_RECEIVES: usize = 32;

/// What the client end does, in order.
enum Op {
    /// An honest message through the endpoint.
    Send { msg: Vec<u8>, bulk: Vec<u8> },
    /// Raw bytes published as the next request-ring bytes.
    Publish(Vec<u8>),
    /// A position word (ring 0 or 2, write or read; its offset in the area) set to a value.
    Position { word: usize, value: u64 },
    /// Bytes written anywhere in the rings.
    Poke { offset: usize, bytes: Vec<u8> },
}

fn op(u: &mut Unstructured) -> Result<Op> {
    Ok(match u.int_in_range(0u8..=7)? {
        0..=3 => {
            let msg = if u.ratio(3u8, 4)? {
                let request = Request {
                    seq: u.arbitrary()?,
                    call: calls::call(u, &Known::default(), &[])?,
                };
                encode(&request).unwrap_or_default()
            } else {
                let n = u.int_in_range(0..=64)?;
                u.bytes(n.min(u.len()))?.to_vec()
            };
            let n = if u.ratio(1u8, 4)? {
                u.int_in_range(0..=900)?
            } else {
                0
            };
            Op::Send {
                msg,
                bulk: vec![0xb5; n],
            }
        }
        4 => {
            let mut record = [0u8; RECORD_BYTES];
            u.fill_buffer(&mut record)?;
            let mut bytes = record.to_vec();
            let n = u.int_in_range(0..=64)?;
            bytes.extend_from_slice(u.bytes(n.min(u.len()))?);
            Op::Publish(bytes)
        }
        5 => Op::Position {
            word: *u.choose(&[
                write_position_offset(0),
                read_position_offset(0),
                write_position_offset(2),
                read_position_offset(2),
            ])?,
            value: u.arbitrary()?,
        },
        _ => {
            let offset = u.int_in_range(0..=LAYOUT.total_bytes() - HEADER_BYTES - 1)?;
            let n = u.int_in_range(1..=16)?;
            Op::Poke {
                offset: HEADER_BYTES + offset,
                bytes: u.bytes(n.min(u.len()))?.to_vec(),
            }
        }
    })
}

/// Writes `bytes` at `offset` of the client's mapping, clipped to the area.
fn poke(area: &ShmArea, offset: usize, bytes: &[u8]) {
    let (base, len) = area.raw_parts();
    let n = bytes.len().min(len.saturating_sub(offset));
    // SAFETY: `offset + n <= len`, so the copy stays inside this process's
    // mapping of the area, which `area` keeps alive; the server end only ever
    // copies these bytes out of the area before it looks at them.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(offset), n) };
}

fn check(data: &[u8], features: &mut Features) {
    let (area, fd) = ShmArea::create(LAYOUT).expect("a small shared area");
    let server_area = ShmArea::attach(fd, LAYOUT).expect("the server maps it");
    let mut client = Endpoint::new(area, Side::Client, None, Duration::ZERO);
    let mut u = Unstructured::new(data);
    // Honest messages stop before the rings fill, or the send would wait for
    // a reader that is not running yet.
    let (mut ring_used, mut bulk_used) = (0usize, 0usize);
    while !u.is_empty() {
        let Ok(op) = op(&mut u) else { break };
        match op {
            Op::Send { msg, bulk } => {
                let (need, need_bulk) = (RECORD_BYTES + msg.len(), bulk.len());
                if ring_used + need > LAYOUT.request_ring as usize
                    || bulk_used + need_bulk > LAYOUT.request_bulk as usize
                {
                    continue;
                }
                features.add("send");
                client.send(&msg, &bulk).expect("the rings have room");
                ring_used += need;
                bulk_used += need_bulk;
            }
            Op::Publish(bytes) => {
                features.add("publish");
                let word = client.area().word64(write_position_offset(0));
                let at = word.load(Ordering::Relaxed);
                for (i, chunk) in bytes.chunks(1).enumerate() {
                    let ring_at = (at.wrapping_add(i as u64) % LAYOUT.request_ring as u64) as usize;
                    poke(client.area(), HEADER_BYTES + ring_at, chunk);
                }
                word.store(at.wrapping_add(bytes.len() as u64), Ordering::Release);
                // Honest sends after this overwrite what the endpoint thinks is free.
                ring_used = LAYOUT.request_ring as usize;
            }
            Op::Position { word, value } => {
                features.add(("position", word));
                // A moved read position could leave an honest send waiting for
                // room forever (or refused): no more of them.
                ring_used = LAYOUT.request_ring as usize;
                client.area().word64(word).store(value, Ordering::Release);
            }
            Op::Poke { offset, bytes } => {
                features.add("poke");
                poke(client.area(), offset, &bytes);
            }
        }
    }
    // The client goes: every wait of the server end ends at its closed flag.
    drop(client);
    let mut server = Endpoint::new(server_area, Side::Server, None, Duration::ZERO);
    server.set_wait_slice(Duration::from_micros(50));
    receive_all(&mut server, data.len().is_multiple_of(2), features);
}

/// Receives and decodes until the server end reports an error.
fn receive_all(server: &mut Endpoint, into_slice: bool, features: &mut Features) {
    let (mut msg, mut bulk) = (Vec::new(), Vec::new());
    for received in 0..MAX_RECEIVES {
        let got = if into_slice {
            // The server's other way: the record first, the bulk into a buffer of its length.
            server.recv_message(&mut msg).and_then(|len| {
                if len > 1 << 20 {
                    return Err(ShmError::Violation("too much bulk for this check".into()));
                }
                bulk.clear();
                bulk.resize(len, 0);
                server.recv_bulk_into(&mut bulk)
            })
        } else {
            server.recv(&mut msg, &mut bulk)
        };
        if let Err(e) = got {
            match e {
                ShmError::PeerGone => features.add(("gone", received.min(4))),
                ShmError::Violation(why) => features.add_message("violation", &why),
            }
            return;
        }
        match decode::<Request>(&msg) {
            Ok(mut request) => {
                let put = put_call_bulk(&mut request.call, std::mem::take(&mut bulk));
                features.add((<&str>::from(&request.call), put.is_ok()));
            }
            Err(e) => features.add(("undecodable", std::mem::discriminant(&e))),
        }
    }
    features.add("every receive answered");
}

/// Inputs of random bytes, which the ops above read as a mix of everything.
fn seeds() -> Vec<Vec<u8>> {
    let mut rand = Rand::seeded(0x5417);
    (0..32)
        .map(|i| {
            let mut bytes = vec![0u8; 64 + 32 * i];
            rand.fill(&mut bytes);
            bytes
        })
        .collect()
}
