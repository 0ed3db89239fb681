//! Clients that write garbage into their shared-memory area: impossible ring
//! positions, absurd record lengths, undecodable records, stray bulk payloads,
//! bogus doorbells, bad descriptors at attach. The server closes only that
//! connection (or keeps it on the socket), never hangs or crashes, keeps
//! serving everyone else and leaks nothing.

mod common;

use std::io::{BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use cumux_protocol::shm::{
    self, Endpoint, ShmArea, ShmLayout, Side, HEADER_BYTES, OFF_CLOSED, RECORD_BYTES,
};
use cumux_protocol::*;

/// Small rings, so hostile positions and streams are cheap to reach.
const LAYOUT: ShmLayout = ShmLayout {
    request_ring: 64 << 10,
    reply_ring: 64 << 10,
    request_bulk: 64 << 10,
    reply_bulk: 64 << 10,
};

/// A connection whose server took its shared area: the socket halves and the
/// area (this process's mapping of it).
struct Attached {
    reader: BufReader<UnixStream>,
    /// The socket's sending half, held so the connection stays open.
    _writer: UnixStream,
    area: ShmArea,
    /// The memfd behind `area` (the server got a copy).
    fd: OwnedFd,
}

fn hello_shm(h: &Harness) -> (BufReader<UnixStream>, UnixStream) {
    let (mut reader, mut writer) = raw_connect(&h.socket);
    let mut hi = hello(PROTOCOL_VERSION, MAGIC);
    hi.shm = true;
    write_frame(&mut writer, &encode(&hi).unwrap()).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut reader, &mut buf).unwrap();
    match decode::<HelloReply>(&buf).unwrap() {
        HelloReply::Welcome { shm: true, .. } => (reader, writer),
        other => panic!("{other:?}"),
    }
}

fn attach(h: &Harness) -> Attached {
    let (mut reader, writer) = hello_shm(h);
    let (area, fd) = ShmArea::create(LAYOUT).unwrap();
    send_attach(&writer, LAYOUT, fd.as_fd());
    let mut buf = Vec::new();
    read_frame(&mut reader, &mut buf).unwrap();
    let answer: ShmAttached = decode(&buf).unwrap();
    assert_eq!(answer.result, Ok(()));
    Attached {
        reader,
        _writer: writer,
        area,
        fd,
    }
}

impl Attached {
    fn word(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        self.area.word64(offset)
    }

    /// Writes `bytes` at `offset` of the area.
    fn poke(&self, offset: usize, bytes: &[u8]) {
        let (base, len) = self.area.raw_parts();
        assert!(offset + bytes.len() <= len);
        // SAFETY: the range lies inside this process's mapping of the area
        // (asserted); the server only ever copies these bytes out.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(offset), bytes.len()) };
    }

    /// Publishes `bytes` as the next request-ring bytes, as a client would.
    fn publish_request_bytes(&self, bytes: &[u8]) {
        let at = self
            .word(shm::write_position_offset(0))
            .load(Ordering::Relaxed);
        self.poke(HEADER_BYTES + at as usize, bytes);
        self.word(shm::write_position_offset(0))
            .store(at + bytes.len() as u64, Ordering::Release);
        shm::ring_doorbell(&self.area, Side::Server);
    }

    /// Whether the server closes the socket within `limit`.
    fn closed_within(&mut self, limit: Duration) -> bool {
        self.reader.get_ref().set_read_timeout(Some(limit)).unwrap();
        let mut sink = [0u8; 256];
        matches!(self.reader.read(&mut sink), Ok(0)) || matches!(self.reader.read(&mut sink), Ok(0))
    }

    fn expect_closed(mut self, what: &str) {
        assert!(
            self.closed_within(Duration::from_secs(20)),
            "{what}: the server kept the connection open"
        );
    }
}

/// A record header: message length, bulk bytes to skip, bulk length.
fn record(msg_len: u32, skip: u32, bulk_len: u64) -> Vec<u8> {
    let mut r = msg_len.to_le_bytes().to_vec();
    r.extend_from_slice(&skip.to_le_bytes());
    r.extend_from_slice(&bulk_len.to_le_bytes());
    assert_eq!(r.len(), RECORD_BYTES);
    r
}

fn good_client_works(h: &Harness) {
    let c = Client::connect_with(&h.socket, "good", Some("team-a"), true);
    assert!(c.uses_shm());
    let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
    assert_client_works(c, &data);
}

#[test]
fn impossible_ring_positions_close_the_connection() {
    let h = Harness::start("shm-positions");
    let cap = LAYOUT.request_ring as u64;
    for bad in [cap + 1, 1 << 40, u64::MAX, u64::MAX / 2] {
        let a = attach(&h);
        a.word(shm::write_position_offset(0))
            .store(bad, Ordering::Release);
        shm::ring_doorbell(&a.area, Side::Server);
        a.expect_closed(&format!("request write position {bad}"));
    }
    // A reply ring read position ahead of anything the server wrote: it fails
    // at its first reply.
    for bad in [1u64 << 40, cap * 3] {
        let a = attach(&h);
        a.word(shm::read_position_offset(1))
            .store(bad, Ordering::Release);
        let request = encode(&Request {
            seq: 1,
            call: Call::MemGetInfo { device: 0 },
        })
        .unwrap();
        a.publish_request_bytes(&[record(request.len() as u32, 0, 0), request].concat());
        a.expect_closed(&format!("reply read position {bad}"));
    }
    // A bulk ring write position out of range, once a record asks for bulk.
    let a = attach(&h);
    a.word(shm::write_position_offset(2))
        .store(u64::MAX - 5, Ordering::Release);
    let request = encode(&Request {
        seq: 1,
        call: Call::MemcpyHtoD {
            dst: 0,
            data: Vec::new(),
            stream: None,
        },
    })
    .unwrap();
    a.publish_request_bytes(&[record(request.len() as u32, 0, 4096), request].concat());
    a.expect_closed("bulk write position");
    good_client_works(&h);
    h.all_released();
}

#[test]
fn absurd_lengths_and_garbage_records_close_the_connection() {
    let h = Harness::start("shm-records");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("a 4 GiB message", record(u32::MAX, 0, 0)),
        ("a message over the frame limit", record(80 << 20 | 1, 0, 0)),
        ("an exabyte of bulk", record(8, 0, 1 << 60)),
        ("u64::MAX bulk", record(0, 0, u64::MAX)),
        (
            "a skip past the bulk ring",
            record(4, LAYOUT.request_bulk, 0),
        ),
        ("a skip of u32::MAX", record(4, u32::MAX, 0)),
        (
            "an undecodable message",
            [record(20, 0, 0), vec![0xff; 20]].concat(),
        ),
        ("an empty message", record(0, 0, 0)),
    ];
    for (what, bytes) in cases {
        let a = attach(&h);
        a.publish_request_bytes(&bytes);
        a.expect_closed(what);
    }
    // Well-formed records with bulk where it does not belong.
    let stray = |call: Call| {
        let a = attach(&h);
        let area = ShmArea::attach(dup(&a), LAYOUT).unwrap();
        let mut ep = Endpoint::new(area, Side::Client, None, shm::DEFAULT_SPIN);
        let msg = encode(&Request { seq: 1, call }).unwrap();
        ep.send(&msg, &[9u8; 1000]).unwrap();
        std::mem::forget(ep); // its drop would close the area for us
        a
    };
    stray(Call::ContextSynchronize).expect_closed("bulk for a call that takes none");
    stray(Call::MemcpyHtoD {
        dst: 0,
        data: vec![1, 2, 3],
        stream: None,
    })
    .expect_closed("bulk for a buffer that came inline");
    good_client_works(&h);
    h.all_released();
}

/// Another mapping of `a`'s area, for a second client-side view of it.
fn dup(a: &Attached) -> OwnedFd {
    a.fd.try_clone().unwrap()
}

#[test]
fn a_half_written_record_holds_only_its_own_connection() {
    let h = Harness::start("shm-partial");
    // Claims 1000 message bytes, writes 10, and stays connected.
    let a = attach(&h);
    a.publish_request_bytes(&[record(1000, 0, 0), vec![0; 10]].concat());
    // Everyone else is served meanwhile.
    good_client_works(&h);
    // When it goes, its session goes too.
    drop(a);
    h.all_released();

    // Claims bulk it never sends.
    let a = attach(&h);
    let request = encode(&Request {
        seq: 1,
        call: Call::ModuleLoad { image: Vec::new() },
    })
    .unwrap();
    a.publish_request_bytes(&[record(request.len() as u32, 0, 50 << 20), request].concat());
    good_client_works(&h);
    drop(a);
    h.all_released();
}

#[test]
fn a_client_that_closes_its_end_or_dies_ends_its_session() {
    let h = Harness::start("shm-closed");
    // Sets its closed flag and rings.
    let a = attach(&h);
    a.area
        .word32(OFF_CLOSED[Side::Client.index()])
        .store(1, Ordering::Release);
    shm::ring_doorbell(&a.area, Side::Server);
    a.expect_closed("closed flag");
    // Dies without a word: its socket hangs up, the server notices between sleeps.
    let a = attach(&h);
    let started = Instant::now();
    drop(a);
    h.all_released();
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn bogus_doorbells_are_harmless() {
    let h = Harness::start("shm-bells");
    let a = attach(&h);
    let area = ShmArea::attach(dup(&a), LAYOUT).unwrap();
    let mut ep = Endpoint::new(area, Side::Client, None, shm::DEFAULT_SPIN);
    let stop = Arc::new(AtomicBool::new(false));
    let ringer = {
        let stop = Arc::clone(&stop);
        let bells = ShmArea::attach(dup(&a), LAYOUT).unwrap();
        std::thread::spawn(move || {
            let mut rung = 0u64;
            while !stop.load(Ordering::Relaxed) {
                shm::ring_doorbell(&bells, Side::Server);
                // And flip the server's sleep flag about, for good measure.
                bells
                    .word32(shm::OFF_SLEEPING[Side::Server.index()])
                    .store(rung as u32 & 1, Ordering::Relaxed);
                rung += 1;
            }
            rung
        })
    };
    // Calls on the rung connection still work, and so do other clients.
    let (mut msg, mut bulk) = (Vec::new(), Vec::new());
    for seq in 1..=200u64 {
        let req = encode(&Request {
            seq,
            call: Call::MemGetInfo { device: 0 },
        })
        .unwrap();
        ep.send(&req, &[]).unwrap();
        ep.recv(&mut msg, &mut bulk).unwrap();
        let reply: Reply = decode(&msg).unwrap();
        assert_eq!(reply.seq, seq);
        assert!(matches!(reply.result, Ok(ReplyBody::MemInfo { .. })));
    }
    good_client_works(&h);
    stop.store(true, Ordering::Relaxed);
    assert!(ringer.join().unwrap() > 100);
    drop(ep);
    drop(a);
    h.all_released();
}

#[test]
fn random_garbage_in_the_area_never_hurts_the_server() {
    let h = Harness::start("shm-fuzz");
    let seed = 0x5eed_5a4d_0000_0001;
    let closed_by_server = survive(&h, seed, (60, 20), good_client_works, |rng| {
        let mut a = attach(&h);
        let ring_bytes = LAYOUT.total_bytes() - HEADER_BYTES;
        match rng.below(4) {
            // Random positions.
            0 => {
                for i in 0..4 {
                    for at in [shm::write_position_offset(i), shm::read_position_offset(i)] {
                        a.word(at).store(rng.next_u64(), Ordering::Release);
                    }
                }
            }
            // Random bytes over the rings, then a plausible write position.
            1 => {
                let bytes: Vec<u8> = (0..4096).map(|_| rng.next_u64() as u8).collect();
                a.poke(HEADER_BYTES, &bytes);
                a.word(shm::write_position_offset(0))
                    .store(1 + rng.below(LAYOUT.request_ring as u64), Ordering::Release);
            }
            // Random bytes everywhere, header included.
            2 => {
                let bytes: Vec<u8> = (0..HEADER_BYTES + 8192)
                    .map(|_| rng.next_u64() as u8)
                    .collect();
                a.poke(0, &bytes);
            }
            // A valid record around random message bytes.
            _ => {
                let len = 1 + rng.below(300) as usize;
                let body: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                let bulk = rng.below(2) * rng.below(ring_bytes as u64);
                a.publish_request_bytes(&[record(len as u32, 0, bulk), body].concat());
            }
        }
        shm::ring_doorbell(&a.area, Side::Server);
        // Either the server sees the garbage and hangs up, or it waits for more
        // bytes: then the client's leaving must end the session.
        u64::from(a.closed_within(Duration::from_millis(500)))
    });
    assert!(
        closed_by_server > 20,
        "only {closed_by_server} of 60 closed"
    );
}

#[test]
fn bad_descriptors_at_attach_keep_the_connection_on_the_socket() {
    let h = Harness::start("shm-attach");
    let try_attach = |fd: Option<OwnedFd>, layout: ShmLayout| -> Result<(), String> {
        let (mut reader, mut writer) = hello_shm(&h);
        match &fd {
            Some(fd) => send_attach(&writer, layout, fd.as_fd()),
            None => {
                let attach = encode(&ShmAttach { layout }).unwrap();
                write_frame(&mut writer, &attach).unwrap();
            }
        }
        let mut buf = Vec::new();
        read_frame(&mut reader, &mut buf).unwrap();
        let answer: ShmAttached = decode(&buf).unwrap();
        // Refused or not, the socket still carries calls.
        let req = encode(&Request {
            seq: 1,
            call: Call::MemGetInfo { device: 0 },
        })
        .unwrap();
        if answer.result.is_err() {
            write_frame(&mut writer, &req).unwrap();
            read_frame(&mut reader, &mut buf).unwrap();
            let reply: Reply = decode(&buf).unwrap();
            assert!(matches!(reply.result, Ok(ReplyBody::MemInfo { .. })));
        }
        answer.result
    };
    let memfd = |sealed: bool, bytes: usize| -> OwnedFd {
        if sealed {
            let layout = ShmLayout {
                request_ring: shm::MIN_RING_BYTES,
                reply_ring: shm::MIN_RING_BYTES,
                request_bulk: shm::MIN_RING_BYTES,
                reply_bulk: shm::MIN_RING_BYTES,
            };
            assert!(bytes == layout.total_bytes());
            return ShmArea::create(layout).unwrap().1;
        }
        let path = std::env::temp_dir().join(format!("cumux-hostile-{}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(bytes as u64).unwrap();
        std::fs::remove_file(&path).unwrap();
        f.into()
    };
    // No descriptor at all.
    let err = try_attach(None, LAYOUT).unwrap_err();
    assert!(err.contains("descriptor"), "{err}");
    // A plain file (no seals).
    let err = try_attach(Some(memfd(false, LAYOUT.total_bytes())), LAYOUT).unwrap_err();
    assert!(err.contains("seal"), "{err}");
    // A sealed memfd too small for the layout it claims.
    let small = 4096 + 4 * shm::MIN_RING_BYTES as usize;
    let err = try_attach(Some(memfd(true, small)), LAYOUT).unwrap_err();
    assert!(err.contains("needs"), "{err}");
    // A layout that is no layout.
    let odd = ShmLayout {
        reply_bulk: 12345,
        ..LAYOUT
    };
    let err = try_attach(Some(memfd(true, small)), odd).unwrap_err();
    assert!(err.contains("power of two"), "{err}");
    // A socket where a memfd belongs.
    let (x, _y) = UnixStream::pair().unwrap();
    let err = try_attach(Some(x.into()), LAYOUT).unwrap_err();
    assert!(err.contains("memfd"), "{err}");
    // Garbage where the attach frame belongs: that connection ends.
    let (reader, mut writer) = hello_shm(&h);
    write_frame(&mut writer, &[0xff; 40]).unwrap();
    let (area, fd) = ShmArea::create(LAYOUT).unwrap();
    let mut a = Attached {
        reader,
        _writer: writer,
        area,
        fd,
    };
    assert!(a.closed_within(Duration::from_secs(20)));
    good_client_works(&h);
    h.all_released();
}

#[test]
fn status_says_which_clients_use_shared_memory() {
    let h = Harness::start("shm-status");
    let shm_client = Client::connect_with(&h.socket, "over-shm", None, true);
    let socket_client = Client::connect_with(&h.socket, "over-socket", None, false);
    assert!(shm_client.uses_shm() && !socket_client.uses_shm());
    let status =
        cumux_server::server_status(&h.server, &cumux_server::status::StatusScope::Everything);
    let transport_of = |program: &str| {
        status
            .sessions
            .iter()
            .find(|s| s.program == program)
            .map(|s| s.transport.clone())
    };
    assert_eq!(transport_of("over-shm").as_deref(), Some("shm"));
    assert_eq!(transport_of("over-socket").as_deref(), Some("unix"));
}
