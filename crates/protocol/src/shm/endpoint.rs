//! One side's end of an area: sends messages and their bulk payloads on one
//! direction's rings and receives them from the other's, spinning and then
//! sleeping while it waits, and noticing a peer that went away.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::area::ShmArea;
use super::held::HeldBulk;
use super::layout::{
    ShmError, Side, MAX_BULK_BYTES, OFF_BELL, OFF_CLOSED, OFF_SLEEPING, RECORD_BYTES,
};
use super::ring::Ring;
use super::wait::{
    futex_wait, futex_wake, involuntary_switches, pause_between_looks, socket_hung_up, PREEMPTED,
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
    /// The peer's read position of each ring we write, as last loaded: room
    /// known free without a look at the peer's word (whose cache line the
    /// peer writes after every message it takes).
    tx_peer_read: [u64; 2],
    /// (message ring, bulk ring) this side reads and their private positions.
    rx: [Ring; 2],
    rx_pos: [u64; 2],
    /// The most a wait spins before sleeping, and what it spins now: halved
    /// and quartered when spinning loses the core, doubled back when it pays.
    spin: Duration,
    spin_budget: Duration,
    /// The usual spin while the wait for the next message spins longer
    /// ([`Endpoint::spin_longer_once`]).
    usual_spin: Option<Duration>,
    slice: Duration,
    /// The socket whose hang-up means the peer is gone.
    liveness: Option<OwnedFd>,
    last_liveness: Instant,
    stats: EndpointStats,
    /// (bytes to skip, bulk bytes) of a message whose bulk is still to be read.
    pending_bulk: Option<(u64, usize)>,
    /// Bulk payloads received but held in the ring ([`HeldBulk`]), oldest
    /// first: where each starts and the flag its drop raises. The read
    /// position published for the bulk ring stays at the oldest one's start.
    held: VecDeque<(u64, Arc<AtomicBool>)>,
    /// Bytes filled ahead in the bulk ring and not yet sent
    /// ([`Endpoint::fill_ahead`]): how many, after how many skipped.
    ahead: Option<Ahead>,
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

/// How far into the bulk ring payloads go before one starts over at its
/// beginning: past a core's private cache, so that the writer does not take
/// back lines the reader still holds (back-to-back 1 MiB copies to the host
/// over TCP ran 8 % slower reusing the same megabyte on the H200's host,
/// and as fast as walking the whole ring from 4 MiB on).
const REUSE_DISTANCE: u64 = 4 << 20;

/// Bytes filled ahead in the bulk ring ([`Endpoint::fill_ahead`]): `len`
/// of them, after `skip` bytes passed over to start at the ring's beginning.
#[derive(Debug, Clone, Copy)]
struct Ahead {
    len: usize,
    skip: u64,
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
        // Nothing known free yet: the first write looks at the peer's word.
        let tx_peer_read = [0, 1].map(|i| tx_pos[i].wrapping_sub(tx[i].cap));
        let rx_pos = rx.map(|r| area.word64(r.read_word).load(Ordering::Acquire));
        Endpoint {
            area,
            side,
            tx,
            tx_pos,
            tx_peer_read,
            rx,
            rx_pos,
            spin,
            spin_budget: spin,
            usual_spin: None,
            slice: WAIT_SLICE,
            liveness,
            last_liveness: Instant::now(),
            stats: EndpointStats::default(),
            pending_bulk: None,
            held: VecDeque::new(),
            ahead: None,
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

    /// Spins for up to `long` (where longer than the usual spin) in the wait
    /// for the next message only, then as usual again: for a side whose peer
    /// calls again as soon as work it waits for is done, however long that
    /// takes (a side asleep by then costs the call a wake-up).
    pub fn spin_longer_once(&mut self, long: Duration) {
        if long > self.spin {
            self.usual_spin.get_or_insert(self.spin);
            self.set_spin(long);
        }
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
        let bulk_len = bulk.len();
        if msg.len() > MAX_FRAME_BYTES || bulk_len > MAX_BULK_BYTES {
            return Err(ShmError::Violation(format!(
                "message of {} + {} bytes is over the limit",
                msg.len(),
                bulk_len
            )));
        }
        self.check_open()?;
        self.reap_held();
        if bulk_len > 0 {
            // A payload of its own goes where bytes filled ahead lay.
            self.ahead = None;
        }
        let skip = self.restart_skip(bulk_len)?;
        let mut record = [0u8; RECORD_BYTES];
        record[..4].copy_from_slice(&(msg.len() as u32).to_le_bytes());
        record[4..8].copy_from_slice(&(skip as u32).to_le_bytes());
        record[8..].copy_from_slice(&(bulk_len as u64).to_le_bytes());
        self.write_record(&record, msg)?;
        if skip > 0 {
            self.tx_pos[1] = self.tx_pos[1].wrapping_add(skip);
            self.tx[1].publish_write(&self.area, self.tx_pos[1]);
        }
        self.write_all(1, bulk)?;
        self.stats.messages_sent += 1;
        self.stats.bulk_bytes_sent += bulk_len as u64;
        Ok(())
    }

    /// Fills the bulk ring's next `len` bytes with `fill`, in place, for a
    /// payload sent later by [`Endpoint::send_filled_ahead`]: messages
    /// without bulk may go first (the answer that says whether the bytes are
    /// good, or the request they belong to, known only once they are all
    /// there), and bytes that did not all come are never sent. `Ok(None)`,
    /// nothing filled, where the ring has not that much room free now.
    pub fn fill_ahead(
        &mut self,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> Result<Option<io::Result<()>>, ShmError> {
        self.check_open()?;
        self.reap_held();
        if len == 0 || len > MAX_BULK_BYTES || self.free(1, len as u64)? < len as u64 {
            return Ok(None);
        }
        let skip = self.restart_skip(len)?;
        let start = self.tx_pos[1].wrapping_add(skip);
        let mut filled = Ok(());
        for (at, k) in self.tx[1].pieces(&self.area, start, len) {
            if k == 0 || filled.is_err() {
                continue;
            }
            // SAFETY: `pieces` keeps `[at, at + k)` inside the ring, among
            // the free bytes after our write position, ours alone until
            // published (a peer that writes them anyway only garbles its
            // own messages, as in `Ring::copy_in`).
            let piece = unsafe { std::slice::from_raw_parts_mut(at, k) };
            filled = fill(piece);
        }
        // Bytes that did not all come cannot be sent.
        self.ahead = filled.is_ok().then_some(Ahead { len, skip });
        Ok(Some(filled))
    }

    /// Where a payload of `len` bytes goes in the bulk ring: the bytes to
    /// skip before it. When the ring is empty and the write position is
    /// [`REUSE_DISTANCE`] in, a payload starts over at its beginning:
    /// back-to-back copies then reuse the same (mapped) pages instead of
    /// faulting their way through the whole ring (16 MiB of first touches:
    /// 0.6 ms a MiB on the H200's host, 1.2 on a virtual machine). Only where
    /// it ends before the write position: the ring never fills by the skip
    /// (a full ring tells the reader that the writer may be waiting for
    /// room, and it would ring a writer asleep for its answer for nothing).
    fn restart_skip(&mut self, len: usize) -> Result<u64, ShmError> {
        let cap = self.tx[1].cap;
        let at = self.tx_pos[1] & (cap - 1);
        let reuse_after = REUSE_DISTANCE.min(cap / 4);
        Ok(
            if len > 0 && (len as u64) < at && at >= reuse_after && self.free(1, cap)? == cap {
                cap - at
            } else {
                0
            },
        )
    }

    /// Sends a message with no bytes of its own whose bulk payload is the
    /// bytes [`Endpoint::fill_ahead`] left in the ring (none there: a
    /// violation), and rings the peer.
    pub fn send_filled_ahead(&mut self) -> Result<(), ShmError> {
        self.send_filled_ahead_quiet()?;
        self.notify_peer();
        Ok(())
    }

    /// [`Endpoint::send_filled_ahead`] without ringing a sleeping peer (as
    /// [`Endpoint::send_quiet`]).
    pub fn send_filled_ahead_quiet(&mut self) -> Result<(), ShmError> {
        let Some(Ahead { len, skip }) = self.ahead.take() else {
            return Err(ShmError::Violation("no bytes were filled ahead".into()));
        };
        self.check_open()?;
        let mut record = [0u8; RECORD_BYTES];
        record[4..8].copy_from_slice(&(skip as u32).to_le_bytes());
        record[8..].copy_from_slice(&(len as u64).to_le_bytes());
        self.write_all(0, &record)?;
        self.tx_pos[1] = self.tx_pos[1].wrapping_add(skip + len as u64);
        self.tx[1].publish_write(&self.area, self.tx_pos[1]);
        self.stats.messages_sent += 1;
        self.stats.bulk_bytes_sent += len as u64;
        Ok(())
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
        self.reap_held();
        let mut record = [0u8; RECORD_BYTES];
        let avail = self.wait_available(0);
        if let Some(usual) = self.usual_spin.take() {
            self.set_spin(usual);
        }
        let avail = avail?;
        let whole = avail >= RECORD_BYTES && {
            // SAFETY: `record` is valid for RECORD_BYTES bytes of writes.
            unsafe {
                self.rx[0].copy_out(
                    &self.area,
                    self.rx_pos[0],
                    record.as_mut_ptr(),
                    RECORD_BYTES,
                )
            };
            avail
                >= RECORD_BYTES
                    + u32::from_le_bytes(record[..4].try_into().expect("4 bytes")) as usize
        };
        if !whole {
            self.read_exact(0, &mut record)?;
        }
        let msg_len = u32::from_le_bytes(record[..4].try_into().expect("4 bytes")) as usize;
        let skip = u32::from_le_bytes(record[4..8].try_into().expect("4 bytes")) as u64;
        let bulk_len = u64::from_le_bytes(record[8..].try_into().expect("8 bytes"));
        if msg_len > MAX_FRAME_BYTES || bulk_len > MAX_BULK_BYTES as u64 || skip >= self.rx[1].cap {
            return Err(ShmError::Violation(format!(
                "record header claims {msg_len} + {bulk_len} bytes after skipping {skip}"
            )));
        }
        msg.clear();
        if whole {
            msg.reserve(msg_len);
            // SAFETY: `reserve` made room for `msg_len` bytes, which the copy
            // initialises before `set_len` exposes them; they are among the
            // bytes available (checked above).
            unsafe {
                let at = self.rx_pos[0].wrapping_add(RECORD_BYTES as u64);
                self.rx[0].copy_out(&self.area, at, msg.as_mut_ptr(), msg_len);
                msg.set_len(msg_len);
            }
            // The whole message was in (as its writer publishes it): the read
            // position moves past the record and the message at once.
            self.consumed(0, RECORD_BYTES + msg_len);
        } else {
            self.read_into(0, msg, msg_len)?;
        }
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

    /// Takes the pending bulk payload of `len` bytes with `take`, handed a
    /// reader that copies the payload's next bytes into each buffer it is
    /// given (all of it; past the payload's end, an error), piece after
    /// piece: a copy's bytes go from the ring to where they land. What
    /// `take` leaves is consumed unseen; a broken link fails the reader and
    /// then this.
    pub fn recv_bulk_taken<T>(
        &mut self,
        len: usize,
        take: impl FnOnce(&mut dyn FnMut(&mut [u8]) -> io::Result<()>) -> T,
    ) -> Result<T, ShmError> {
        self.take_pending(len)?;
        let mut left = len;
        let mut broken = None;
        let taken = take(&mut |out: &mut [u8]| {
            if out.len() > left {
                return Err(io::Error::other(
                    "more bytes asked for than the payload has",
                ));
            }
            if broken.is_some() {
                return Err(io::Error::other("the link broke"));
            }
            match self.read_exact(1, out) {
                Ok(()) => {
                    left -= out.len();
                    Ok(())
                }
                Err(e) => {
                    let why = io::Error::other(format!("{e:?}"));
                    broken = Some(e);
                    Err(why)
                }
            }
        });
        if let Some(e) = broken {
            return Err(e);
        }
        while left > 0 {
            let n = self.wait_available(1)?.min(left);
            self.consumed(1, n);
            left -= n;
        }
        self.received(len);
        Ok(taken)
    }

    /// Takes the pending bulk payload of `len` bytes where it lies in the
    /// ring: the peer writes no more over it until the [`HeldBulk`] is
    /// dropped (its room goes back at this side's next receive or send).
    /// `Ok(None)`, the payload still pending, where holding it would keep
    /// more than half the ring from the peer (so a writer always has room to
    /// stream through), or for an empty one.
    pub fn recv_bulk_held(&mut self, len: usize) -> Result<Option<HeldBulk>, ShmError> {
        self.reap_held();
        let cap = self.rx[1].cap;
        let held = self.rx_pos[1].wrapping_sub(self.read_published(1));
        match self.pending_bulk {
            // (A writer skips to the ring's start only in an empty ring:
            // then nothing is held, and the skipped bytes go back at once.)
            Some((_, pending)) if pending == len => {
                if len == 0 || held + len as u64 > cap / 2 {
                    return Ok(None);
                }
            }
            // Not the pending payload: a violation.
            _ => return self.take_pending(len).map(|()| None),
        }
        self.take_pending(len)?;
        while self.available(1)? < len as u64 {
            self.release_room();
            self.wait(|me| Ok(me.available(1)? >= len as u64))?;
        }
        let start = self.rx_pos[1];
        let base = self.area.base() as usize;
        let pieces = self.rx[1]
            .pieces(&self.area, start, len)
            .map(|(at, n)| (at as usize - base, n));
        let (bulk, done) = HeldBulk::new(self.area.mapping(), pieces);
        self.held.push_back((start, done));
        self.rx_pos[1] = start.wrapping_add(len as u64);
        self.received(len);
        Ok(Some(bulk))
    }

    /// The read position `lane` publishes: where this side has read to, or
    /// in the bulk ring the start of the oldest payload still held.
    fn read_published(&self, lane: usize) -> u64 {
        match (lane, self.held.front()) {
            (1, Some(&(start, _))) => start,
            _ => self.rx_pos[lane],
        }
    }

    /// Whether the oldest held payload was dropped: its room is ours to give
    /// back (a wait ends for it, see [`Endpoint::wait`]).
    fn held_dropped(&self) -> bool {
        self.held
            .front()
            .is_some_and(|(_, done)| done.load(Ordering::Acquire))
    }

    /// Gives the peer back the room of the held payloads dropped since,
    /// oldest first (a later one dropped first waits for those before it).
    fn reap_held(&mut self) {
        let before = self.read_published(1);
        while let Some((_, done)) = self.held.front() {
            if !done.load(Ordering::Acquire) {
                break;
            }
            self.held.pop_front();
        }
        let now = self.read_published(1);
        if now == before {
            return;
        }
        // A writer waits for room only on a ring it found full.
        let was_full = self.rx[1]
            .available(&self.area, before)
            .map_or(true, |a| a >= self.rx[1].cap);
        self.rx[1].publish_read(&self.area, now);
        if was_full {
            self.room_freed = true;
            self.release_room();
        }
    }

    /// Free bytes of the ring this side writes, at least `want` if known
    /// without a look at the peer's read position, else as that says now;
    /// an impossible read position is a violation.
    fn free(&mut self, lane: usize, want: u64) -> Result<u64, ShmError> {
        let cap = self.tx[lane].cap;
        // We never write past the room we saw, so this span is at most `cap`.
        let known = cap - self.tx_pos[lane].wrapping_sub(self.tx_peer_read[lane]);
        if known >= want {
            return Ok(known);
        }
        match self.free_now(lane) {
            Ok(free) => {
                self.tx_peer_read[lane] = self.tx_pos[lane].wrapping_sub(cap - free);
                Ok(free)
            }
            Err(e) => {
                // Nothing known free any more: every later write looks again.
                self.tx_peer_read[lane] = self.tx_pos[lane].wrapping_sub(cap);
                Err(e)
            }
        }
    }

    /// Free bytes of the ring this side writes, as the peer's read position
    /// says now; an impossible one is a violation.
    fn free_now(&self, lane: usize) -> Result<u64, ShmError> {
        self.tx[lane].free(&self.area, self.tx_pos[lane])
    }

    /// Bytes waiting in the ring this side reads; an impossible write position is a violation.
    fn available(&self, lane: usize) -> Result<u64, ShmError> {
        self.rx[lane].available(&self.area, self.rx_pos[lane])
    }

    /// Writes a record header and its message on the message ring, published
    /// at once where both fit: the reader then finds the whole message at its
    /// first look, and the position's cache line moves once, not twice.
    fn write_record(&mut self, record: &[u8], msg: &[u8]) -> Result<(), ShmError> {
        let len = (record.len() + msg.len()) as u64;
        if self.free(0, len)? < len {
            self.write_all(0, record)?;
            return self.write_all(0, msg);
        }
        let ring = self.tx[0];
        ring.copy_in(&self.area, self.tx_pos[0], record);
        let at = self.tx_pos[0].wrapping_add(record.len() as u64);
        ring.copy_in(&self.area, at, msg);
        self.tx_pos[0] = self.tx_pos[0].wrapping_add(len);
        ring.publish_write(&self.area, self.tx_pos[0]);
        Ok(())
    }

    fn write_all(&mut self, lane: usize, mut bytes: &[u8]) -> Result<(), ShmError> {
        while !bytes.is_empty() {
            let free = self.free(lane, bytes.len().min(PUBLISH_BYTES) as u64)?;
            if free == 0 {
                self.notify_peer();
                self.wait(|me| Ok(me.free_now(lane)? > 0))?;
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
        if self.rx[lane]
            .available(&self.area, self.read_published(lane))
            .map_or(true, |a| a >= self.rx[lane].cap)
        {
            self.room_freed = true;
        }
        self.rx_pos[lane] = self.rx_pos[lane].wrapping_add(n as u64);
        self.rx[lane].publish_read(&self.area, self.read_published(lane));
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
        loop {
            let avail = self.available(lane)?;
            if avail > 0 {
                return Ok(avail as usize);
            }
            // Let a writer waiting for room go on before we sleep.
            self.release_room();
            self.wait(|me| Ok(me.available(lane)? > 0))?;
        }
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

    /// Waits until `ready` holds, or a held payload was seen dropped (its
    /// room then goes back to the peer; the caller checks `ready` again):
    /// spins for the spin time, then sleeps on this side's doorbell in
    /// bounded slices, checking between them that the peer lives.
    fn wait(
        &mut self,
        mut ready: impl FnMut(&Self) -> Result<bool, ShmError>,
    ) -> Result<(), ShmError> {
        let waited = self.wait_for(|me| Ok(ready(me)? || me.held_dropped()));
        self.reap_held();
        waited
    }

    fn wait_for(
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
            pause_between_looks();
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
            // A peer that closed before we set our flag rang a bell we had
            // already seen: its closed flag says so, and no ring will come.
            if let Err(gone) = self.check_open() {
                self.sleeping(me).store(0, Ordering::Relaxed);
                return Err(gone);
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
mod tests;
