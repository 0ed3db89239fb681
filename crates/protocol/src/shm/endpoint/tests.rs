//! Tests of [`super::Endpoint`]: messages and payloads across the rings,
//! filled, visited and held in place, full rings, doorbells and hostile peers.

use super::*;
use crate::shm::layout::{read_position_offset, write_position_offset, ShmLayout, MIN_RING_BYTES};
use crate::shm::test_data::{pattern, SMALL};
use crate::shm::wait::DEFAULT_SPIN;
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::thread;

/// A client and a server endpoint over one area (two mappings of one memfd).
fn pair(layout: ShmLayout, spin: Duration) -> (Endpoint, Endpoint) {
    let (area, fd) = ShmArea::create(layout).unwrap();
    let server = ShmArea::attach(fd, layout).unwrap();
    (
        Endpoint::new(area, Side::Client, None, spin),
        Endpoint::new(server, Side::Server, None, spin),
    )
}

#[test]
fn messages_wrap_around_the_rings() {
    let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
    // Sizes that do not divide the ring, so records straddle its end; two
    // messages in flight at a time, so the bulk ring is not empty when the
    // second is sent and its payload straddles the end too.
    let message = |round: usize, k: usize| {
        (
            pattern((round + k) as u8, 1 + (round + k) * 7 % 1000),
            pattern(!(round as u8), (round * 13 + k * 5) % 3000),
        )
    };
    const ROUNDS: usize = 500;
    let echo = thread::spawn(move || {
        let (mut msg, mut bulk) = (Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            for k in 0..2 {
                server.recv(&mut msg, &mut bulk).unwrap();
                let (m, b) = message(round, k);
                assert_eq!((&msg, &bulk), (&m, &b), "round {round}");
            }
            let (m, b) = message(round, 0);
            server.send(&b, &m).unwrap();
        }
    });
    let (mut msg, mut bulk) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for k in 0..2 {
            let (m, b) = message(round, k);
            client.send(&m, &b).unwrap();
        }
        client.recv(&mut msg, &mut bulk).unwrap();
        let (m, b) = message(round, 0);
        assert_eq!((&msg, &bulk), (&b, &m), "round {round}");
    }
    echo.join().unwrap();
    let sent = client.stats();
    assert_eq!(sent.messages_sent, 2 * ROUNDS as u64);
    assert!(sent.bulk_bytes_sent > 100 * MIN_RING_BYTES as u64);
}

#[test]
fn a_payload_into_an_empty_bulk_ring_starts_at_its_beginning() {
    let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
    let mut out = vec![0u8; 1000];
    // Sent with the message, and filled ahead (a worker's copy to the host)
    // with a message of no bulk between, then read whole or held in place.
    for filled in [false, true] {
        for round in 0..20u8 {
            let data = pattern(round, 1000);
            if filled {
                let mut from = &data[..];
                let mut fill = |piece: &mut [u8]| io::Read::read_exact(&mut from, piece);
                assert!(client.fill_ahead(1000, &mut fill).unwrap().unwrap().is_ok());
                client.send(b"answer", &[]).unwrap();
                client.send_filled_ahead().unwrap();
            } else {
                client.send(b"copy", &data).unwrap();
            }
            // Each payload lands at the start of the ring, or right after the
            // last where it would fill the ring: the pages stay the same.
            let end = client.tx_pos[1] % SMALL.request_bulk as u64;
            assert!(end == 1000 || end == 2000, "{filled} round {round}: {end}");
            let mut msg = Vec::new();
            if filled {
                server.recv(&mut msg, &mut Vec::new()).unwrap();
                assert_eq!(msg, b"answer");
                assert_eq!(server.recv_message(&mut msg).unwrap(), 1000);
                let held = server.recv_bulk_held(1000).unwrap().unwrap();
                assert_eq!(held.pieces().concat(), data);
                // Its room goes back with the next request, before the
                // writer's next payload (as a server forwards the next call).
                drop(held);
                server.send(b"next", &[]).unwrap();
                client.recv(&mut msg, &mut Vec::new()).unwrap();
            } else {
                assert_eq!(server.recv_message(&mut msg).unwrap(), 1000);
                server.recv_bulk_into(&mut out).unwrap();
                assert_eq!(out, data);
            }
        }
    }
    // A bulk taken with the wrong length, or a message read over a pending
    // bulk, is refused.
    client.send(b"copy", &pattern(1, 1000)).unwrap();
    let mut msg = Vec::new();
    server.recv_message(&mut msg).unwrap();
    assert!(server.recv_message(&mut msg).is_err());
}

/// A payload visited in place by the reader arrives whole through a ring
/// smaller than it (wrapping).
#[test]
fn payloads_visited_in_place_cross_the_ring() {
    let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
    let len = 3 * MIN_RING_BYTES as usize + 123;
    let data = pattern(7, len);
    let sent = data.clone();
    let writer = thread::spawn(move || {
        client.send(b"m", &sent).unwrap();
        client
    });
    let mut msg = Vec::new();
    let bulk = server.recv_message(&mut msg).unwrap();
    assert_eq!((&msg[..], bulk), (&b"m"[..], len));
    let mut got = Vec::new();
    let mut visit = |piece: &[u8]| {
        got.extend_from_slice(piece);
        Ok(())
    };
    assert!(server.recv_bulk_visit(bulk, &mut visit).unwrap().is_ok());
    assert_eq!(got, data);
    let _client = writer.join().unwrap();
    // A visitor that fails still consumes the payload: the next message reads.
    let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
    client.send(b"a", &pattern(1, 1000)).unwrap();
    client.send(b"b", &[]).unwrap();
    let bulk = server.recv_message(&mut msg).unwrap();
    let mut visit = |_: &[u8]| Err(io::Error::other("socket gone"));
    assert!(server.recv_bulk_visit(bulk, &mut visit).unwrap().is_err());
    let mut bulk = Vec::new();
    server.recv(&mut msg, &mut bulk).unwrap();
    assert_eq!(msg, b"b");
}

#[test]
fn a_full_ring_blocks_the_writer_until_the_reader_drains_it() {
    let (mut client, mut server) = pair(SMALL, Duration::ZERO);
    let (done_tx, done_rx) = mpsc::channel();
    let writer = thread::spawn(move || {
        // Each message fills a quarter of the message ring: the fifth cannot fit.
        for i in 0..8u8 {
            client.send(&pattern(i, 1000), &[]).unwrap();
            done_tx.send(i).unwrap();
        }
        client
    });
    let mut sent = Vec::new();
    while let Ok(i) = done_rx.recv_timeout(Duration::from_millis(300)) {
        sent.push(i);
    }
    assert_eq!(
        sent.len(),
        4,
        "the writer should stop at a full ring: {sent:?}"
    );
    let (mut msg, mut bulk) = (Vec::new(), Vec::new());
    for i in 0..8u8 {
        server.recv(&mut msg, &mut bulk).unwrap();
        assert_eq!(msg, pattern(i, 1000));
    }
    let client = writer.join().unwrap();
    assert!(client.stats().sleeps >= 1, "{:?}", client.stats());
}

#[test]
fn a_reader_rings_a_sleeping_peer_only_when_it_frees_room_it_waits_for() {
    let (mut client, mut server) = pair(SMALL, Duration::ZERO);
    // Its sleeps outlast the test: only a bell can end them.
    client.set_wait_slice(Duration::from_secs(30));
    // A writer asleep on a full ring is rung by the reader that drains it.
    let writer = thread::spawn(move || {
        for i in 0..8u8 {
            client.send(&pattern(i, 1000), &[]).unwrap();
        }
        client
    });
    thread::sleep(Duration::from_millis(200));
    let (mut msg, mut bulk) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for i in 0..8u8 {
        server.recv(&mut msg, &mut bulk).unwrap();
        assert_eq!(msg, pattern(i, 1000));
    }
    let mut client = writer.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(client.stats().sleeps >= 1, "{:?}", client.stats());
    let wakes = server.stats().wakes;
    assert!(wakes >= 1, "{:?}", server.stats());
    // A peer asleep waiting for its answer is not rung by the reading of
    // its request (a ring that was never full), only by the answer.
    client.send(b"request", &[]).unwrap();
    let asker = thread::spawn(move || {
        let (mut msg, mut bulk) = (Vec::new(), Vec::new());
        client.recv(&mut msg, &mut bulk).unwrap();
        (client, msg)
    });
    thread::sleep(Duration::from_millis(200));
    server.recv(&mut msg, &mut bulk).unwrap();
    assert_eq!(msg, b"request");
    assert_eq!(server.stats().wakes, wakes, "{:?}", server.stats());
    server.send(b"answer", &[]).unwrap();
    let (client, msg) = asker.join().unwrap();
    assert_eq!(msg, b"answer");
    assert_eq!(server.stats().wakes, wakes + 1, "{:?}", server.stats());
    assert!(client.stats().sleeps >= 2, "{:?}", client.stats());
}

#[test]
fn reading_a_payload_that_restarts_the_bulk_ring_rings_no_sleeping_writer() {
    let (client, mut server) = pair(SMALL, Duration::ZERO);
    let mut client = Some(client);
    let (mut msg, mut bulk) = (Vec::new(), Vec::new());
    for round in 0..6u8 {
        let mut asking = client.take().unwrap();
        asking.set_wait_slice(Duration::from_secs(30));
        // Payloads of one length: one restarted at the ring's beginning
        // would end exactly where the last began, filling the ring.
        asking.send(b"request", &pattern(round, 1000)).unwrap();
        let asker = thread::spawn(move || {
            let (mut msg, mut bulk) = (Vec::new(), Vec::new());
            asking.recv(&mut msg, &mut bulk).unwrap();
            (asking, msg)
        });
        thread::sleep(Duration::from_millis(50));
        let wakes = server.stats().wakes;
        server.recv(&mut msg, &mut bulk).unwrap();
        assert_eq!(bulk, pattern(round, 1000));
        // The asker sleeps for its answer, not for room: reading its request
        // rings nothing; the answer rings once.
        assert_eq!(
            server.stats().wakes,
            wakes,
            "round {round}: {:?}",
            server.stats()
        );
        server.send(b"answer", &[]).unwrap();
        let (asked, msg) = asker.join().unwrap();
        assert_eq!(msg, b"answer");
        client = Some(asked);
    }
}

#[test]
fn messages_sent_together_wake_a_sleeping_peer_once() {
    let (mut client, mut server) = pair(SMALL, Duration::ZERO);
    server.set_wait_slice(Duration::from_secs(30));
    let sleeper = thread::spawn(move || {
        let (mut msg, mut bulk) = (Vec::new(), Vec::new());
        let mut got = Vec::new();
        for _ in 0..2 {
            server.recv(&mut msg, &mut bulk).unwrap();
            got.push((msg.clone(), bulk.clone()));
        }
        (server, got)
    });
    thread::sleep(Duration::from_millis(200));
    client.send_quiet(b"request", &[]).unwrap();
    assert_eq!(client.stats().wakes, 0, "{:?}", client.stats());
    client.send(&[], &pattern(3, 1000)).unwrap();
    let (server, got) = sleeper.join().unwrap();
    assert_eq!(got[0].0, b"request");
    assert_eq!(got[1].1, pattern(3, 1000));
    assert_eq!(client.stats().wakes, 1, "{:?}", client.stats());
    assert_eq!(server.stats().sleeps, 1, "{:?}", server.stats());
}

/// A held payload keeps its bytes while the writer streams a payload
/// larger than the ring through the rest of it, and it is dropped on
/// another thread meanwhile; held payloads give their room back in order.
/// One that would keep more than half the ring is not held, and stays
/// pending.
#[test]
fn a_held_payload_keeps_its_bytes_until_dropped() {
    let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
    let cap = MIN_RING_BYTES as usize;
    let mut msg = Vec::new();
    client.send(b"h", &pattern(1, 1000)).unwrap();
    assert_eq!(server.recv_message(&mut msg).unwrap(), 1000);
    let held = server.recv_bulk_held(1000).unwrap().expect("held");
    // The rest of the ring streams a payload larger than it.
    let big = pattern(2, 3 * cap);
    let sent = big.clone();
    let writer = thread::spawn(move || {
        client.send(b"big", &sent).unwrap();
        client
    });
    let dropping = thread::spawn(move || {
        thread::sleep(Duration::from_millis(50));
        assert_eq!(held.pieces().concat(), pattern(1, 1000));
        drop(held);
    });
    assert_eq!(server.recv_message(&mut msg).unwrap(), big.len());
    let mut out = vec![0u8; big.len()];
    server.recv_bulk_into(&mut out).unwrap();
    assert_eq!(out, big);
    dropping.join().unwrap();
    let mut client = writer.join().unwrap();
    // Held payloads released out of order give their room back in order
    // (the first starts over at the ring's beginning: small ones fit).
    client.send(b"a", &pattern(3, 300)).unwrap();
    client.send(b"b", &pattern(4, 300)).unwrap();
    server.recv_message(&mut msg).unwrap();
    let a = server.recv_bulk_held(300).unwrap().expect("held");
    server.recv_message(&mut msg).unwrap();
    let b = server.recv_bulk_held(300).unwrap().expect("held");
    drop(b);
    server.reap_held();
    assert_eq!(client.free_now(1).unwrap(), (cap - 600) as u64);
    assert_eq!(a.pieces().concat(), pattern(3, 300));
    drop(a);
    server.reap_held();
    assert_eq!(client.free_now(1).unwrap(), cap as u64);
    // More than half the ring is not held: taken another way instead.
    client.send(b"c", &pattern(5, cap / 2 + 1)).unwrap();
    let len = server.recv_message(&mut msg).unwrap();
    assert!(server.recv_bulk_held(len).unwrap().is_none());
    let mut out = vec![0u8; len];
    server.recv_bulk_into(&mut out).unwrap();
    assert_eq!(out, pattern(5, cap / 2 + 1));
}

#[test]
fn a_payload_larger_than_the_bulk_ring_streams_through_it() {
    let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
    let big = pattern(7, 3 << 20); // 768 times the 4 KiB bulk ring
    let expected = big.clone();
    let reader = thread::spawn(move || {
        let (mut msg, mut bulk) = (Vec::new(), Vec::new());
        server.recv(&mut msg, &mut bulk).unwrap();
        assert_eq!(msg, b"header");
        assert!(bulk == expected, "bulk payload garbled");
        // And one back, larger than the reply ring too.
        server.send(&pattern(1, 10_000), &bulk).unwrap();
        server
    });
    client.send(b"header", &big).unwrap();
    let (mut msg, mut bulk) = (Vec::new(), Vec::new());
    client.recv(&mut msg, &mut bulk).unwrap();
    assert_eq!(msg, pattern(1, 10_000));
    assert!(bulk == big);
    reader.join().unwrap();
}

#[test]
fn the_doorbell_wakes_a_sleeper() {
    let (mut client, mut server) = pair(SMALL, Duration::ZERO);
    // Sleeps far longer than the test may take: only the bell can end them.
    server.set_wait_slice(Duration::from_secs(30));
    let (tx, rx) = mpsc::channel();
    let sleeper = thread::spawn(move || {
        let (mut msg, mut bulk) = (Vec::new(), Vec::new());
        server.recv(&mut msg, &mut bulk).unwrap();
        tx.send(Instant::now()).unwrap();
        (server, msg)
    });
    thread::sleep(Duration::from_millis(200));
    let rang = Instant::now();
    client.send(b"wake up", &[]).unwrap();
    let woke = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the bell wakes it");
    assert!(woke - rang < Duration::from_secs(5));
    let (server, msg) = sleeper.join().unwrap();
    assert_eq!(msg, b"wake up");
    assert!(server.stats().sleeps >= 1, "{:?}", server.stats());
    assert!(client.stats().wakes >= 1, "{:?}", client.stats());
}

#[test]
fn a_peer_that_goes_away_is_noticed() {
    // It closes its end: the flag and the bell.
    let (client, mut server) = pair(SMALL, DEFAULT_SPIN);
    server.set_wait_slice(Duration::from_secs(30));
    let waiter = thread::spawn(move || server.recv(&mut Vec::new(), &mut Vec::new()));
    thread::sleep(Duration::from_millis(100));
    drop(client);
    assert_eq!(waiter.join().unwrap(), Err(ShmError::PeerGone));

    // It closed before we looked: its ring came before we sleep, so only
    // its flag tells us (a wait for the next ring would last a whole slice).
    let (client, mut server) = pair(SMALL, Duration::ZERO);
    server.set_wait_slice(Duration::from_secs(30));
    drop(client);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(server.recv(&mut Vec::new(), &mut Vec::new())));
    let seen = rx.recv_timeout(Duration::from_secs(5));
    assert_eq!(seen, Ok(Err(ShmError::PeerGone)));

    // It dies without a word: only its socket hangs up.
    let (a, b) = UnixStream::pair().unwrap();
    let (area, fd) = ShmArea::create(SMALL).unwrap();
    let server_area = ShmArea::attach(fd, SMALL).unwrap();
    let client = Endpoint::new(area, Side::Client, None, DEFAULT_SPIN);
    let mut server = Endpoint::new(server_area, Side::Server, Some(b.into()), DEFAULT_SPIN);
    server.set_wait_slice(Duration::from_millis(20));
    std::mem::forget(client); // no closed flag, no bell
    drop(a);
    assert_eq!(
        server.recv(&mut Vec::new(), &mut Vec::new()),
        Err(ShmError::PeerGone)
    );
}

#[test]
fn impossible_positions_and_lengths_are_violations() {
    let write_word = |ep: &Endpoint, offset: usize, value: u64| {
        ep.area().word64(offset).store(value, Ordering::Release);
    };
    // A request ring write position past its capacity.
    let (client, mut server) = pair(SMALL, DEFAULT_SPIN);
    write_word(&client, write_position_offset(0), 1 << 40);
    assert!(matches!(
        server.recv(&mut Vec::new(), &mut Vec::new()),
        Err(ShmError::Violation(_))
    ));
    // A reply ring read position ahead of what was written.
    let (client, mut server) = pair(SMALL, DEFAULT_SPIN);
    write_word(&client, read_position_offset(1), 1 << 40);
    assert!(matches!(
        server.send(b"x", &[]),
        Err(ShmError::Violation(_))
    ));
    // The same once the writer knows room free (it looks at the reader's
    // word only when that runs out): caught before it writes past the room.
    let (client, mut server) = pair(SMALL, DEFAULT_SPIN);
    server.send(b"x", &[]).unwrap();
    write_word(&client, read_position_offset(1), 1 << 40);
    let cap = SMALL.reply_ring as usize;
    let sent = (0..cap)
        .take_while(|_| server.send(&[7u8; 64], &[]).is_ok())
        .count();
    assert!(
        sent < cap / 64,
        "{sent} messages sent on a forged read position"
    );
    let after = server.send(b"x", &[]);
    assert!(
        matches!(after, Err(ShmError::Violation(_))),
        "{after:?} after {sent}"
    );
    // A record claiming an absurd length.
    for (msg_len, bulk_len) in [(u32::MAX, 0u64), (0, u64::MAX), (1 << 30, 1 << 40)] {
        let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
        let mut record = [0u8; RECORD_BYTES];
        record[..4].copy_from_slice(&msg_len.to_le_bytes());
        record[8..].copy_from_slice(&bulk_len.to_le_bytes());
        client.write_all(0, &record).unwrap();
        let got = server.recv(&mut Vec::new(), &mut Vec::new());
        assert!(matches!(got, Err(ShmError::Violation(_))), "{got:?}");
    }
}

/// Bytes filled ahead go after a message sent meanwhile (the answer that
/// says whether they are good); a payload of its own sent meanwhile takes
/// their place, and a ring without the room fills nothing.
#[test]
fn bytes_filled_ahead_follow_the_message_sent_meanwhile() {
    let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
    let data = pattern(8, 3000);
    let mut from = &data[..];
    let mut fill = |piece: &mut [u8]| io::Read::read_exact(&mut from, piece);
    assert!(client.fill_ahead(3000, &mut fill).unwrap().unwrap().is_ok());
    client.send(b"good", &[]).unwrap();
    client.send_filled_ahead().unwrap();
    let mut msg = Vec::new();
    assert_eq!(server.recv_message(&mut msg).unwrap(), 0);
    assert_eq!(msg, b"good");
    server.recv_bulk_vec(&mut Vec::new(), 0).unwrap();
    assert_eq!(server.recv_message(&mut msg).unwrap(), 3000);
    assert!(msg.is_empty());
    let mut out = vec![0u8; 3000];
    server.recv_bulk_into(&mut out).unwrap();
    assert_eq!(out, data);
    // Past the ring's end: the bytes wrap, and still arrive whole.
    let mut from = &data[..];
    let mut fill = |piece: &mut [u8]| io::Read::read_exact(&mut from, piece);
    assert!(client.fill_ahead(3000, &mut fill).unwrap().unwrap().is_ok());
    client.send_filled_ahead().unwrap();
    assert_eq!(server.recv_message(&mut msg).unwrap(), 3000);
    server.recv_bulk_into(&mut out).unwrap();
    assert_eq!(out, data);
    // A payload sent meanwhile: nothing is left to send.
    let mut fill = |piece: &mut [u8]| {
        piece.fill(1);
        Ok(())
    };
    assert!(client.fill_ahead(100, &mut fill).unwrap().is_some());
    client.send(b"own", &pattern(2, 50)).unwrap();
    assert!(client.send_filled_ahead().is_err());
    // No room: nothing filled.
    let cap = MIN_RING_BYTES as usize;
    assert!(client.fill_ahead(cap, &mut fill).unwrap().is_none());
    // Bytes that did not all come (a socket cut mid-copy) cannot be sent.
    let mut short = &data[..10];
    let mut fill = |piece: &mut [u8]| io::Read::read_exact(&mut short, piece);
    assert!(client.fill_ahead(100, &mut fill).unwrap().unwrap().is_err());
    assert!(client.send_filled_ahead().is_err());
}

/// A payload taken piece by piece lands where each piece is asked for;
/// what the taker leaves is consumed, and asking past its end fails.
#[test]
fn a_payload_taken_in_pieces_lands_where_asked() {
    let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
    let data = pattern(6, 3 * MIN_RING_BYTES as usize + 5);
    let sent = data.clone();
    let writer = thread::spawn(move || {
        client.send(b"w", &sent).unwrap();
        client.send(b"x", &pattern(1, 700)).unwrap();
        client
    });
    let mut msg = Vec::new();
    let len = server.recv_message(&mut msg).unwrap();
    let mut out = vec![0u8; len];
    let got = server
        .recv_bulk_taken(len, |read| {
            let (a, b) = out.split_at_mut(1000);
            read(a)?;
            read(b)?;
            read(&mut [0u8; 1])
        })
        .unwrap();
    assert!(got.is_err());
    assert_eq!(out, data);
    let len = server.recv_message(&mut msg).unwrap();
    let mut first = [0u8; 100];
    let got = server
        .recv_bulk_taken(len, |read| read(&mut first))
        .unwrap();
    assert!(got.is_ok());
    assert_eq!(&first[..], &pattern(1, 700)[..100]);
    let _client = writer.join().unwrap();
    // The rest was consumed: the next message reads.
    let mut client = _client;
    client.send(b"y", &[]).unwrap();
    server.recv(&mut msg, &mut Vec::new()).unwrap();
    assert_eq!(msg, b"y");
}

#[test]
fn a_longer_spin_lasts_for_the_next_message_only() {
    let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
    server.spin_longer_once(DEFAULT_SPIN / 2);
    assert_eq!(server.spin(), DEFAULT_SPIN, "shorter than usual: ignored");
    server.spin_longer_once(DEFAULT_SPIN * 4);
    assert_eq!(server.spin(), DEFAULT_SPIN * 4);
    client.send(b"x", &[]).unwrap();
    server.recv(&mut Vec::new(), &mut Vec::new()).unwrap();
    assert_eq!(server.spin(), DEFAULT_SPIN);
}
