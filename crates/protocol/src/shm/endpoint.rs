//! One side's end of an area: sends messages and their bulk payloads on one
//! direction's rings and receives them from the other's, spinning and then
//! sleeping while it waits, and noticing a peer that went away.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::area::ShmArea;
use super::layout::{
    ShmError, Side, MAX_BULK_BYTES, OFF_BELL, OFF_CLOSED, OFF_SLEEPING, RECORD_BYTES,
};
use super::ring::Ring;
use super::wait::{
    futex_wait, futex_wake, involuntary_switches, socket_hung_up, PAUSES_PER_CHECK, PREEMPTED,
    WAIT_SLICE,
};
use crate::framing::MAX_FRAME_BYTES;
use crate::hop_trace::{self, Hop};

/// Largest piece of a payload published at once (see `Endpoint::write_all`).
const PUBLISH_BYTES: usize = 256 << 10;

/// One side's end of an area: sends on one direction, receives on the other.
pub struct Endpoint {
    area: ShmArea,
    side: Side,
    /// (message ring, bulk ring) this side writes and their private positions.
    tx: [Ring; 2],
    tx_pos: [u64; 2],
    /// (message ring, bulk ring) this side reads and their private positions.
    rx: [Ring; 2],
    rx_pos: [u64; 2],
    /// The most a wait spins before sleeping, and what it spins now: halved
    /// and quartered when spinning loses the core, doubled back when it pays.
    spin: Duration,
    spin_budget: Duration,
    slice: Duration,
    /// The socket whose hang-up means the peer is gone.
    liveness: Option<OwnedFd>,
    last_liveness: Instant,
    stats: EndpointStats,
    /// (bytes to skip, bulk bytes) of a message whose bulk is still to be read.
    pending_bulk: Option<(u64, usize)>,
    /// Whether we rang the peer's doorbell since our last wait.
    woke_peer: bool,
    /// Whether we took bytes from a full ring since we last rang the peer: a
    /// writer may be waiting for room (it waits only on a full ring).
    room_freed: bool,
    /// The waiting thread's involuntary context switches at the last look.
    switches: i64,
}

/// Counters of one endpoint, for benchmarks and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    pub messages_sent: u64,
    pub messages_received: u64,
    pub bulk_bytes_sent: u64,
    pub bulk_bytes_received: u64,
    /// Times this side went to sleep on its doorbell.
    pub sleeps: u64,
    /// Times this side rang the peer's doorbell (a futex wake).
    pub wakes: u64,
}

/// A message's bulk payload: bytes, or bytes a writer fills in place.
enum Payload<'a> {
    Bytes(&'a [u8]),
    Filled {
        len: usize,
        fill: &'a mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    },
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::Bytes(bytes) => bytes.len(),
            Payload::Filled { len, .. } => *len,
        }
    }
}

impl Endpoint {
    /// This side's end of `area`. `liveness` is the connection's socket (or a
    /// clone of it): its hang-up means the peer is gone.
    pub fn new(area: ShmArea, side: Side, liveness: Option<OwnedFd>, spin: Duration) -> Endpoint {
        let l = area.layout();
        let (tx, rx) = match side {
            Side::Client => (
                [Ring::new(&l, 0), Ring::new(&l, 2)],
                [Ring::new(&l, 1), Ring::new(&l, 3)],
            ),
            Side::Server => (
                [Ring::new(&l, 1), Ring::new(&l, 3)],
                [Ring::new(&l, 0), Ring::new(&l, 2)],
            ),
        };
        // Start where the area's words say (zero in a fresh area); from here on
        // only our private copies count.
        let tx_pos = tx.map(|r| area.word64(r.write_word).load(Ordering::Acquire));
        let rx_pos = rx.map(|r| area.word64(r.read_word).load(Ordering::Acquire));
        Endpoint {
            area,
            side,
            tx,
            tx_pos,
            rx,
            rx_pos,
            spin,
            spin_budget: spin,
            slice: WAIT_SLICE,
            liveness,
            last_liveness: Instant::now(),
            stats: EndpointStats::default(),
            pending_bulk: None,
            woke_peer: false,
            room_freed: false,
            switches: involuntary_switches(),
        }
    }

    /// Spins for up to `spin` before sleeping, from the next wait on.
    pub fn set_spin(&mut self, spin: Duration) {
        self.spin = spin;
        self.spin_budget = spin;
    }

    /// The most a wait spins before sleeping.
    pub fn spin(&self) -> Duration {
        self.spin
    }

    /// How long one sleep lasts before the peer's liveness is checked ([`WAIT_SLICE`]).
    pub fn set_wait_slice(&mut self, slice: Duration) {
        self.slice = slice;
    }

    pub fn stats(&self) -> EndpointStats {
        self.stats
    }

    pub fn area(&self) -> &ShmArea {
        &self.area
    }

    /// Sends one message: `msg` through the message ring and `bulk` through the
    /// bulk ring, each streamed in pieces when larger than its ring.
    pub fn send(&mut self, msg: &[u8], bulk: &[u8]) -> Result<(), ShmError> {
        self.send_quiet(msg, bulk)?;
        self.notify_peer();
        Ok(())
    }

    /// Sends one message as [`Endpoint::send`] does, but rings a sleeping
    /// peer only if a ring fills meanwhile: for a message another follows at
    /// once, whose `send` rings for both (the peer wakes once, to both).
    pub fn send_quiet(&mut self, msg: &[u8], bulk: &[u8]) -> Result<(), ShmError> {
        self.send_record(msg, Payload::Bytes(bulk)).map(|_| ())
    }

    /// Sends one message as [`Endpoint::send_quiet`] does, its `len` bulk
    /// bytes written by `fill` straight into the ring, a piece at a time (a
    /// copy's data read from a client's socket). Where `fill` fails, the rest
    /// of the payload is zeros, so the record stays whole for the peer, and
    /// the inner result says why.
    pub fn send_quiet_filled(
        &mut self,
        msg: &[u8],
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> Result<io::Result<()>, ShmError> {
        self.send_record(msg, Payload::Filled { len, fill })
    }

    fn send_record(&mut self, msg: &[u8], bulk: Payload<'_>) -> Result<io::Result<()>, ShmError> {
        let bulk_len = bulk.len();
        if msg.len() > MAX_FRAME_BYTES || bulk_len > MAX_BULK_BYTES {
            return Err(ShmError::Violation(format!(
                "message of {} + {} bytes is over the limit",
                msg.len(),
                bulk_len
            )));
        }
        self.check_open()?;
        // When the bulk ring is empty, the payload starts over at its beginning:
        // back-to-back copies then reuse the same (mapped, cached) pages instead
        // of faulting their way through the whole ring. Only where it ends
        // before `at`: the ring never fills by the skip (a full ring tells
        // the reader that the writer may be waiting for room, and it would
        // ring a writer asleep for its answer for nothing).
        let cap = self.tx[1].cap;
        let at = self.tx_pos[1] & (cap - 1);
        let skip = if bulk_len > 0 && (bulk_len as u64) < at && self.free(1)? == cap {
            cap - at
        } else {
            0
        };
        let mut record = [0u8; RECORD_BYTES];
        record[..4].copy_from_slice(&(msg.len() as u32).to_le_bytes());
        record[4..8].copy_from_slice(&(skip as u32).to_le_bytes());
        record[8..].copy_from_slice(&(bulk_len as u64).to_le_bytes());
        self.write_all(0, &record)?;
        self.write_all(0, msg)?;
        if skip > 0 {
            self.tx_pos[1] = self.tx_pos[1].wrapping_add(skip);
            self.tx[1].publish_write(&self.area, self.tx_pos[1]);
        }
        let filled = match bulk {
            Payload::Bytes(bytes) => {
                self.write_all(1, bytes)?;
                Ok(())
            }
            Payload::Filled { len, fill } => self.write_filled(1, len, fill)?,
        };
        self.stats.messages_sent += 1;
        self.stats.bulk_bytes_sent += bulk_len as u64;
        Ok(filled)
    }

    /// Rings a sleeping peer for what was sent with [`Endpoint::send_quiet`].
    pub fn ring(&mut self) {
        self.notify_peer();
    }

    /// Receives one message into `msg` and `bulk` (both cleared first), waiting
    /// for it as long as the peer lives. Lengths are checked before anything is
    /// allocated, and buffers grow only with the bytes that actually arrive.
    pub fn recv(&mut self, msg: &mut Vec<u8>, bulk: &mut Vec<u8>) -> Result<(), ShmError> {
        let bulk_len = self.recv_message(msg)?;
        bulk.clear();
        self.recv_bulk_vec(bulk, bulk_len)
    }

    /// Receives one message's record and message bytes into `msg`; its bulk
    /// payload (of the length returned) must be taken next, with
    /// [`Endpoint::recv_bulk_vec`] or [`Endpoint::recv_bulk_into`].
    pub fn recv_message(&mut self, msg: &mut Vec<u8>) -> Result<usize, ShmError> {
        if self.pending_bulk.is_some() {
            return Err(ShmError::Violation(
                "a message read before the last one's bulk".into(),
            ));
        }
        let mut record = [0u8; RECORD_BYTES];
        self.read_exact(0, &mut record)?;
        let msg_len = u32::from_le_bytes(record[..4].try_into().expect("4 bytes")) as usize;
        let skip = u32::from_le_bytes(record[4..8].try_into().expect("4 bytes")) as u64;
        let bulk_len = u64::from_le_bytes(record[8..].try_into().expect("8 bytes"));
        if msg_len > MAX_FRAME_BYTES || bulk_len > MAX_BULK_BYTES as u64 || skip >= self.rx[1].cap {
            return Err(ShmError::Violation(format!(
                "record header claims {msg_len} + {bulk_len} bytes after skipping {skip}"
            )));
        }
        msg.clear();
        self.read_into(0, msg, msg_len)?;
        self.pending_bulk = Some((skip, bulk_len as usize));
        Ok(bulk_len as usize)
    }

    /// The pending bulk payload's length, once its skipped bytes are consumed.
    fn take_pending(&mut self, len: usize) -> Result<(), ShmError> {
        match self.pending_bulk.take() {
            Some((skip, pending)) if pending == len => {
                let mut left = skip as usize;
                while left > 0 {
                    let n = self.wait_available(1)?.min(left);
                    self.consumed(1, n);
                    left -= n;
                }
                Ok(())
            }
            other => Err(ShmError::Violation(format!(
                "bulk of {len} bytes taken where {other:?} is pending"
            ))),
        }
    }

    fn received(&mut self, len: usize) {
        self.release_room();
        self.stats.messages_received += 1;
        self.stats.bulk_bytes_received += len as u64;
    }

    /// Receives the pending bulk payload of `len` bytes into `bulk` (appended),
    /// growing it as the bytes arrive.
    pub fn recv_bulk_vec(&mut self, bulk: &mut Vec<u8>, len: usize) -> Result<(), ShmError> {
        self.take_pending(len)?;
        self.read_into(1, bulk, len)?;
        self.received(len);
        Ok(())
    }

    /// Receives the pending bulk payload straight into `out`, whose length must be the payload's.
    pub fn recv_bulk_into(&mut self, out: &mut [u8]) -> Result<(), ShmError> {
        self.take_pending(out.len())?;
        self.read_exact(1, out)?;
        self.received(out.len());
        Ok(())
    }

    /// Hands the pending bulk payload of `len` bytes to `visit` where it
    /// lies in the ring, a piece at a time (a copy's data written to a
    /// client's socket); after a failure of `visit` the rest is consumed
    /// unseen, and the inner result says why.
    pub fn recv_bulk_visit(
        &mut self,
        len: usize,
        visit: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<io::Result<()>, ShmError> {
        self.take_pending(len)?;
        let visited = self.read_visited(1, len, visit)?;
        self.received(len);
        Ok(visited)
    }

    /// Free bytes of the ring this side writes; an impossible read position is a violation.
    fn free(&self, lane: usize) -> Result<u64, ShmError> {
        self.tx[lane].free(&self.area, self.tx_pos[lane])
    }

    /// Bytes waiting in the ring this side reads; an impossible write position is a violation.
    fn available(&self, lane: usize) -> Result<u64, ShmError> {
        self.rx[lane].available(&self.area, self.rx_pos[lane])
    }

    fn write_all(&mut self, lane: usize, mut bytes: &[u8]) -> Result<(), ShmError> {
        while !bytes.is_empty() {
            let free = self.free(lane)?;
            if free == 0 {
                self.notify_peer();
                self.wait(|me| Ok(me.free(lane)? > 0))?;
                continue;
            }
            // Large payloads are published in pieces, so the reader copies one
            // out while we copy the next in.
            let n = (free as usize).min(bytes.len()).min(PUBLISH_BYTES);
            self.tx[lane].copy_in(&self.area, self.tx_pos[lane], &bytes[..n]);
            bytes = &bytes[n..];
            self.tx_pos[lane] = self.tx_pos[lane].wrapping_add(n as u64);
            self.tx[lane].publish_write(&self.area, self.tx_pos[lane]);
            if !bytes.is_empty() {
                self.notify_peer();
            }
        }
        Ok(())
    }

    /// [`Endpoint::write_all`] of `len` bytes that `fill` writes into the
    /// ring's free space itself; after a failure of `fill`, zeros.
    fn write_filled(
        &mut self,
        lane: usize,
        mut len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> Result<io::Result<()>, ShmError> {
        let mut failed = None;
        while len > 0 {
            let free = self.free(lane)?;
            if free == 0 {
                self.notify_peer();
                self.wait(|me| Ok(me.free(lane)? > 0))?;
                continue;
            }
            let n = (free as usize).min(len).min(PUBLISH_BYTES);
            for (at, k) in self.tx[lane].pieces(&self.area, self.tx_pos[lane], n) {
                if k == 0 {
                    continue;
                }
                // SAFETY: `pieces` keeps `[at, at + k)` inside the ring, and
                // the free bytes after our write position are ours alone
                // until published (a peer that writes them anyway only
                // garbles its own messages, as in `Ring::copy_in`).
                let piece = unsafe { std::slice::from_raw_parts_mut(at, k) };
                if failed.is_none() {
                    failed = fill(piece).err();
                }
                if failed.is_some() {
                    piece.fill(0);
                }
            }
            len -= n;
            self.tx_pos[lane] = self.tx_pos[lane].wrapping_add(n as u64);
            self.tx[lane].publish_write(&self.area, self.tx_pos[lane]);
            if len > 0 {
                self.notify_peer();
            }
        }
        Ok(failed.map_or(Ok(()), Err))
    }

    /// Hands `len` bytes of `lane` to `visit` where they lie in the ring, a
    /// piece at a time; after a failure of `visit` the rest is consumed unseen.
    fn read_visited(
        &mut self,
        lane: usize,
        mut len: usize,
        visit: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> Result<io::Result<()>, ShmError> {
        let mut failed = None;
        while len > 0 {
            let n = self.wait_available(lane)?.min(len);
            for (at, k) in self.rx[lane].pieces(&self.area, self.rx_pos[lane], n) {
                if k == 0 || failed.is_some() {
                    continue;
                }
                // SAFETY: `pieces` keeps `[at, at + k)` inside the ring, among
                // the bytes the peer published and no longer writes (one that
                // does only garbles what its own reader gets).
                let piece = unsafe { std::slice::from_raw_parts(at, k) };
                failed = visit(piece).err();
            }
            self.consumed(lane, n);
            len -= n;
        }
        Ok(failed.map_or(Ok(()), Err))
    }

    fn consumed(&mut self, lane: usize, n: usize) {
        // A writer waits for room only when it found the ring full, and then
        // writes nothing more: the first bytes taken after it are taken from
        // a full ring.
        if self
            .available(lane)
            .map_or(true, |a| a >= self.rx[lane].cap)
        {
            self.room_freed = true;
        }
        self.rx_pos[lane] = self.rx_pos[lane].wrapping_add(n as u64);
        self.rx[lane].publish_read(&self.area, self.rx_pos[lane]);
    }

    /// Lets a writer waiting for room go on: rings the peer if we freed room
    /// in a full ring since we last did (else it is not waiting for us, and a
    /// ring would only wake it for nothing).
    fn release_room(&mut self) {
        if std::mem::take(&mut self.room_freed) {
            self.notify_peer();
        }
    }

    /// Waits until `lane` has bytes to read; how many.
    fn wait_available(&mut self, lane: usize) -> Result<usize, ShmError> {
        let avail = self.available(lane)?;
        if avail > 0 {
            return Ok(avail as usize);
        }
        // Let a writer waiting for room go on before we sleep.
        self.release_room();
        self.wait(|me| Ok(me.available(lane)? > 0))?;
        Ok(self.available(lane)? as usize)
    }

    fn read_exact(&mut self, lane: usize, out: &mut [u8]) -> Result<(), ShmError> {
        let mut done = 0;
        while done < out.len() {
            let n = self.wait_available(lane)?.min(out.len() - done);
            // SAFETY: `out[done..done + n]` is valid for writes.
            unsafe {
                self.rx[lane].copy_out(&self.area, self.rx_pos[lane], out.as_mut_ptr().add(done), n)
            };
            self.consumed(lane, n);
            done += n;
        }
        Ok(())
    }

    /// Appends `len` bytes of `lane` to `vec`, growing it as they arrive.
    fn read_into(&mut self, lane: usize, vec: &mut Vec<u8>, len: usize) -> Result<(), ShmError> {
        // Room for all of it at once: a payload larger than the ring comes in
        // pieces, which must not move what came before.
        vec.reserve(len);
        let mut left = len;
        while left > 0 {
            let n = self.wait_available(lane)?.min(left);
            vec.reserve(n);
            let at = vec.len();
            // SAFETY: `reserve` made room for `n` more bytes after `at`; the copy
            // initialises exactly those bytes before `set_len` exposes them.
            unsafe {
                let dst = vec.as_mut_ptr().add(at);
                self.rx[lane].copy_out(&self.area, self.rx_pos[lane], dst, n);
                vec.set_len(at + n);
            }
            self.consumed(lane, n);
            left -= n;
        }
        Ok(())
    }

    fn bell(&self, side: Side) -> &AtomicU32 {
        self.area.word32(OFF_BELL[side.index()])
    }

    fn sleeping(&self, side: Side) -> &AtomicU32 {
        self.area.word32(OFF_SLEEPING[side.index()])
    }

    fn closed(&self, side: Side) -> &AtomicU32 {
        self.area.word32(OFF_CLOSED[side.index()])
    }

    /// Rings the peer's doorbell if it is (or may be) asleep. Called after
    /// publishing a position; the fence orders that store before the load of the
    /// peer's sleep flag, pairing with the fence in `wait`.
    fn notify_peer(&mut self) {
        fence(Ordering::SeqCst);
        let peer = self.side.peer();
        if self.sleeping(peer).load(Ordering::Relaxed) != 0 {
            self.bell(peer).fetch_add(1, Ordering::Release);
            futex_wake(self.bell(peer));
            self.stats.wakes += 1;
            self.woke_peer = true;
        }
    }

    fn check_open(&mut self) -> Result<(), ShmError> {
        if self.closed(self.side.peer()).load(Ordering::Acquire) != 0 {
            return Err(ShmError::PeerGone);
        }
        Ok(())
    }

    /// Whether the peer still lives: its closed flag, and its socket (checked at
    /// most once per wait slice).
    fn check_alive(&mut self, force: bool) -> Result<(), ShmError> {
        self.check_open()?;
        if !force && self.last_liveness.elapsed() < self.slice {
            return Ok(());
        }
        self.last_liveness = Instant::now();
        if let Some(fd) = &self.liveness {
            if socket_hung_up(fd.as_fd()) {
                return Err(ShmError::PeerGone);
            }
        }
        Ok(())
    }

    /// Whether another task took this thread's core since the last look (not
    /// only the host, briefly): its involuntary context switches rose.
    fn another_task_ran(&mut self) -> bool {
        let now = involuntary_switches();
        let ran = now > self.switches;
        self.switches = now;
        ran
    }

    /// Waits until `ready` holds: spins for the spin time, then sleeps on this
    /// side's doorbell in bounded slices, checking between them that the peer lives.
    fn wait(
        &mut self,
        mut ready: impl FnMut(&Self) -> Result<bool, ShmError>,
    ) -> Result<(), ShmError> {
        // Spin while it pays: for the current budget, unless we lose the core
        // meanwhile (a spinner that gets preempted waits out other tasks' time
        // slices, milliseconds, where a sleeper is woken at once).
        // A peer we just woke may have been queued on our core, where it waits
        // until we block or yield (a spinner keeps its core up to its slice):
        // hand the core over once before spinning.
        if std::mem::take(&mut self.woke_peer) {
            std::thread::yield_now();
        }
        let started = Instant::now();
        let mut last = started;
        loop {
            if ready(self)? {
                self.spin_budget = (self.spin_budget * 2).min(self.spin);
                return Ok(());
            }
            let now = Instant::now();
            if now - last > PREEMPTED && self.another_task_ran() {
                hop_trace::mark(Hop::SpinLost, "");
                self.spin_budget /= 4;
                break;
            }
            if now - started >= self.spin_budget {
                break;
            }
            last = now;
            for _ in 0..PAUSES_PER_CHECK {
                std::hint::spin_loop();
            }
        }
        let me = self.side;
        loop {
            let seen = self.bell(me).load(Ordering::Acquire);
            self.sleeping(me).store(1, Ordering::Relaxed);
            // Pairs with the fence in `notify_peer`: either the peer sees our flag
            // and rings, or we see what it published.
            fence(Ordering::SeqCst);
            if ready(self)? {
                self.sleeping(me).store(0, Ordering::Relaxed);
                return Ok(());
            }
            self.stats.sleeps += 1;
            hop_trace::mark(Hop::Sleep, "");
            let timed_out = futex_wait(self.bell(me), seen, self.slice);
            hop_trace::mark(Hop::Wake, "");
            self.sleeping(me).store(0, Ordering::Relaxed);
            if ready(self)? {
                // Win back the budget a lost core took away.
                self.spin_budget = (self.spin_budget * 2)
                    .max(Duration::from_micros(1))
                    .min(self.spin);
                return Ok(());
            }
            self.check_alive(timed_out)?;
        }
    }
}

impl Drop for Endpoint {
    /// Tells the peer at once, so a side waiting on us need not wait for the socket.
    fn drop(&mut self) {
        self.closed(self.side).store(1, Ordering::Release);
        let peer = self.side.peer();
        self.bell(peer).fetch_add(1, Ordering::Release);
        futex_wake(self.bell(peer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::layout::{ShmLayout, MIN_RING_BYTES, OFF_POS};
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
        for round in 0..20u8 {
            client.send(b"copy", &pattern(round, 1000)).unwrap();
            // Each payload lands at the start of the ring, or right after the
            // last where it would fill the ring: the pages stay the same.
            let end = client.tx_pos[1] % SMALL.request_bulk as u64;
            assert!(end == 1000 || end == 2000, "round {round}: {end}");
            let mut msg = Vec::new();
            assert_eq!(server.recv_message(&mut msg).unwrap(), 1000);
            server.recv_bulk_into(&mut out).unwrap();
            assert_eq!(out, pattern(round, 1000));
        }
        // A bulk taken with the wrong length, or a message read over a pending
        // bulk, is refused.
        client.send(b"copy", &pattern(1, 1000)).unwrap();
        let mut msg = Vec::new();
        server.recv_message(&mut msg).unwrap();
        assert!(server.recv_message(&mut msg).is_err());
    }

    /// A payload filled in place from a reader and visited in place by the
    /// other side arrives whole through a ring smaller than it (wrapping);
    /// a reader that fails leaves the record whole, its rest zeros.
    #[test]
    fn payloads_filled_and_visited_in_place_cross_the_ring() {
        let (mut client, mut server) = pair(SMALL, DEFAULT_SPIN);
        let len = 3 * MIN_RING_BYTES as usize + 123;
        let data = pattern(7, len);
        let sent = data.clone();
        let writer = thread::spawn(move || {
            let mut from = &sent[..];
            let mut fill = |piece: &mut [u8]| io::Read::read_exact(&mut from, piece);
            assert!(client
                .send_quiet_filled(b"m", len, &mut fill)
                .unwrap()
                .is_ok());
            client.ring();
            let mut short = &sent[..10];
            let mut fill = |piece: &mut [u8]| io::Read::read_exact(&mut short, piece);
            let failed = client.send_quiet_filled(b"n", 100, &mut fill).unwrap();
            assert!(failed.is_err());
            client.ring();
            client
        });
        let mut msg = Vec::new();
        for (name, want) in [(&b"m"[..], data.clone()), (b"n", vec![0u8; 100])] {
            let bulk = server.recv_message(&mut msg).unwrap();
            assert_eq!((&msg[..], bulk), (name, want.len()));
            let mut got = Vec::new();
            let mut visit = |piece: &[u8]| {
                got.extend_from_slice(piece);
                Ok(())
            };
            assert!(server.recv_bulk_visit(bulk, &mut visit).unwrap().is_ok());
            assert_eq!(got, want);
        }
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
        write_word(&client, OFF_POS, 1 << 40);
        assert!(matches!(
            server.recv(&mut Vec::new(), &mut Vec::new()),
            Err(ShmError::Violation(_))
        ));
        // A reply ring read position ahead of what was written.
        let (client, mut server) = pair(SMALL, DEFAULT_SPIN);
        write_word(&client, OFF_POS + 16 + 8, 1 << 40);
        assert!(matches!(
            server.send(b"x", &[]),
            Err(ShmError::Violation(_))
        ));
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
}
