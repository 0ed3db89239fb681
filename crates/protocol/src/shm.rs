//! The shared-memory transport of same-host clients: a sealed memfd both sides
//! map, holding per direction a message ring and a bulk ring, and a futex doorbell per side.
//!
//! Layout of the area (offsets in bytes): a 4 KiB header of cache-line-separated
//! words (each ring's write and read positions, each side's doorbell, sleep flag
//! and closed flag), then the request ring, the reply ring, the request bulk ring
//! and the reply bulk ring, each a power of two. A message on a direction is a
//! 16-byte record header (`msg_len: u32`, `0u32`, `bulk_len: u64`) and the
//! message's encoded bytes in the message ring, then `bulk_len` bytes in the bulk
//! ring. Both rings are byte streams: a record or a bulk payload larger than its
//! ring streams through it in pieces while the other side drains it.
//!
//! Positions are `u64` byte counts that only grow; the free-running indices are
//! masked into the ring. Each side keeps its own positions privately and only
//! publishes them: what it reads of the other side's (positions, lengths, flags)
//! is checked before use, and bytes are copied out of the area before anything
//! decodes them, so a hostile peer can make a call fail, never read or write out
//! of bounds. Waits are bounded slices: a side spins briefly, then sleeps on its
//! own futex word with a timeout, checking between slices that the peer is alive
//! (its closed flag, and `POLLHUP` on the socket the connection came over).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use serde::{Deserialize, Serialize};

use crate::framing::MAX_FRAME_BYTES;
use crate::hop_trace::{self, Hop};
use crate::messages::{Call, Reply, ReplyBody};

/// The sizes of the four rings of an area, chosen by the client and checked by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmLayout {
    pub request_ring: u32,
    pub reply_ring: u32,
    pub request_bulk: u32,
    pub reply_bulk: u32,
}

/// 1 MiB message rings and 16 MiB bulk rings: 34 MiB of address space, pages
/// allocated as they are first touched.
pub const DEFAULT_LAYOUT: ShmLayout = ShmLayout {
    request_ring: 1 << 20,
    reply_ring: 1 << 20,
    request_bulk: 16 << 20,
    reply_bulk: 16 << 20,
};

/// Smallest and largest ring a layout may have.
pub const MIN_RING_BYTES: u32 = 4 << 10;
pub const MAX_RING_BYTES: u32 = 64 << 20;

/// Byte buffers of at least this size travel in the bulk ring, not inside the message.
pub const BULK_THRESHOLD: usize = 512;

/// Largest bulk payload of one message (a copy chunk is at most `MAX_CHUNK_BYTES`).
pub const MAX_BULK_BYTES: usize = MAX_FRAME_BYTES;

/// Largest piece of a payload published at once (see `Endpoint::write_all`).
const PUBLISH_BYTES: usize = 256 << 10;

/// How long a side spins before sleeping, unless `CUMUX_SHM_SPIN_US` says
/// otherwise. Longer than a futex wake-up takes (≈ 40-50 µs on the 2-core
/// development VM), so a short call is caught awake: on the CPU device a launch
/// plus synchronize takes ≈ 50 µs at 50 µs of spin and 75-160 µs at 20 µs.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

/// A gap this long between two checks of a spinning waiter means it may have
/// lost its core: to another task (the thread's involuntary context switches
/// rose, see [`involuntary_switches`]), or only for a moment to the host
/// (a virtual CPU taken by the hypervisor, an interrupt), which is no reason
/// to stop spinning.
const PREEMPTED: Duration = Duration::from_micros(20);

/// Pause instructions between two looks of a spinning waiter. A pause takes
/// ~140 cycles on recent Intel cores, so 32 of them let a message wait ~2 µs
/// unseen; 4 (~0.3 µs) cut the H100 host's synchronize round trip p50 from
/// 10.3 to 7.7 µs.
const PAUSES_PER_CHECK: u32 = 4;

/// How long one futex sleep lasts before the peer's liveness is checked again.
pub const WAIT_SLICE: Duration = Duration::from_millis(50);

/// Bytes of the header; the request ring starts here.
pub const HEADER_BYTES: usize = 4096;
/// Bytes of a record header in a message ring.
pub const RECORD_BYTES: usize = 16;
const AREA_MAGIC: u64 = 0x4d48_5358_554d_5543; // "CUMUXSHM"

// Header words, one cache line each (offsets into the area).
const OFF_MAGIC: usize = 0;
/// Ring `i`'s write position is the u64 at `OFF_POS + 16 * i`, its read position
/// 8 bytes later; rings in order request, reply, request bulk, reply bulk.
pub const OFF_POS: usize = 64;
/// By side (client, server): the futex word that side sleeps on.
pub const OFF_BELL: [usize; 2] = [640, 704];
/// By side: nonzero while that side sleeps (or is about to).
pub const OFF_SLEEPING: [usize; 2] = [644, 708];
/// By side: nonzero once that side has closed its end.
pub const OFF_CLOSED: [usize; 2] = [648, 712];

impl ShmLayout {
    fn rings(&self) -> [u32; 4] {
        [
            self.request_ring,
            self.reply_ring,
            self.request_bulk,
            self.reply_bulk,
        ]
    }

    /// Every ring a power of two within the limits.
    pub fn check(&self) -> Result<(), String> {
        for size in self.rings() {
            if !size.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&size) {
                return Err(format!(
                    "ring of {size} bytes: a ring is a power of two from {MIN_RING_BYTES} to {MAX_RING_BYTES}"
                ));
            }
        }
        Ok(())
    }

    /// Bytes of the whole area: the header and the four rings.
    pub fn total_bytes(&self) -> usize {
        HEADER_BYTES + self.rings().iter().map(|&r| r as usize).sum::<usize>()
    }

    /// Offset of ring `i` (request, reply, request bulk, reply bulk).
    fn ring_offset(&self, i: usize) -> usize {
        HEADER_BYTES + self.rings()[..i].iter().map(|&r| r as usize).sum::<usize>()
    }
}

/// Which end of the area this process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    /// Index of the side's words in `OFF_BELL`, `OFF_SLEEPING`, `OFF_CLOSED`.
    pub fn index(self) -> usize {
        match self {
            Side::Client => 0,
            Side::Server => 1,
        }
    }
    fn peer(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// What went wrong on the shared-memory link.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShmError {
    /// The peer closed the link, died, or hung up its socket.
    #[error("the peer went away")]
    PeerGone,
    /// The peer wrote something no honest peer writes; the link is unusable.
    #[error("protocol violation: {0}")]
    Violation(String),
}

/// A mapped area.
pub struct ShmArea {
    map: MmapRaw,
    layout: ShmLayout,
}

impl std::fmt::Debug for ShmArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmArea")
            .field("layout", &self.layout)
            .finish()
    }
}

impl ShmArea {
    /// Creates a sealed memfd of `layout`'s size and maps it; the descriptor is
    /// what the server gets. Sealed against shrinking, so a mapping of it never
    /// faults past its end.
    pub fn create(layout: ShmLayout) -> io::Result<(ShmArea, OwnedFd)> {
        layout
            .check()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a NUL-terminated name and valid flags; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"cumux-shm".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = File::from(fd);
        file.set_len(layout.total_bytes() as u64)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor this function owns.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let area = ShmArea::map(&file, layout)?;
        area.word64(OFF_MAGIC).store(AREA_MAGIC, Ordering::Relaxed);
        Ok((area, file.into()))
    }

    /// Maps an area a client sent. The descriptor must be a memfd on tmpfs,
    /// sealed against shrinking and at least as large as `layout` says, so
    /// nothing the client does later can make an access to it fault.
    pub fn attach(fd: OwnedFd, layout: ShmLayout) -> Result<ShmArea, String> {
        layout.check()?;
        // SAFETY: fcntl on a descriptor owned by this function.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(format!(
                "not a sealable memfd: {}",
                io::Error::last_os_error()
            ));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err("the memfd is not sealed against shrinking".into());
        }
        // SAFETY: an all-zero statfs is a valid value for the kernel to overwrite.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: fstatfs writes into `fs`, which is valid for writes.
        if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut fs) } < 0 {
            return Err(format!("fstatfs: {}", io::Error::last_os_error()));
        }
        if fs.f_type != libc::TMPFS_MAGIC {
            // hugetlbfs memfds can fault (SIGBUS) when the huge page pool runs dry.
            return Err(format!(
                "the memfd lives on fs type {:#x}, not tmpfs",
                fs.f_type
            ));
        }
        let file = File::from(fd);
        let size = file.metadata().map_err(|e| format!("fstat: {e}"))?.len();
        if size < layout.total_bytes() as u64 {
            return Err(format!(
                "the memfd holds {size} bytes, the layout needs {}",
                layout.total_bytes()
            ));
        }
        ShmArea::map(&file, layout).map_err(|e| format!("mmap: {e}"))
    }

    fn map(file: &File, layout: ShmLayout) -> io::Result<ShmArea> {
        let map = MmapOptions::new().len(layout.total_bytes()).map_raw(file)?;
        Ok(ShmArea { map, layout })
    }

    pub fn layout(&self) -> ShmLayout {
        self.layout
    }

    /// The start of the mapping and its length, for tests that play a hostile peer.
    pub fn raw_parts(&self) -> (*mut u8, usize) {
        (self.map.as_mut_ptr(), self.map.len())
    }

    /// The u64 header word at `offset` (one of the `OFF_*` words).
    pub fn word64(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= HEADER_BYTES);
        // SAFETY: `offset` is an aligned header word inside the mapping (asserted),
        // which lives as long as `self`; the peer touches these words only
        // atomically, and any value it leaves there is a valid u64.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    /// The u32 header word at `offset` (one of the `OFF_*` words).
    pub fn word32(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= HEADER_BYTES);
        // SAFETY: as in `word64`, for an aligned 4-byte header word.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU32>() }
    }
}

/// One byte ring as seen from one side: where its data lies and which header
/// words hold its positions.
#[derive(Debug, Clone, Copy)]
struct Ring {
    data: usize,
    cap: u64,
    write_word: usize,
    read_word: usize,
}

impl Ring {
    fn new(layout: &ShmLayout, i: usize) -> Ring {
        Ring {
            data: layout.ring_offset(i),
            cap: layout.rings()[i] as u64,
            write_word: OFF_POS + 16 * i,
            read_word: OFF_POS + 16 * i + 8,
        }
    }
}

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

impl Endpoint {
    /// This side's end of `area`. `liveness` is the connection's socket (or a
    /// clone of it): its hang-up means the peer is gone.
    pub fn new(area: ShmArea, side: Side, liveness: Option<OwnedFd>, spin: Duration) -> Endpoint {
        let l = area.layout;
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
        if msg.len() > MAX_FRAME_BYTES || bulk.len() > MAX_BULK_BYTES {
            return Err(ShmError::Violation(format!(
                "message of {} + {} bytes is over the limit",
                msg.len(),
                bulk.len()
            )));
        }
        self.check_open()?;
        // When the bulk ring is empty, the payload starts over at its beginning:
        // back-to-back copies then reuse the same (mapped, cached) pages instead
        // of faulting their way through the whole ring.
        let cap = self.tx[1].cap;
        let at = self.tx_pos[1] & (cap - 1);
        let skip = if !bulk.is_empty() && at != 0 && self.free(1)? == cap {
            cap - at
        } else {
            0
        };
        let mut record = [0u8; RECORD_BYTES];
        record[..4].copy_from_slice(&(msg.len() as u32).to_le_bytes());
        record[4..8].copy_from_slice(&(skip as u32).to_le_bytes());
        record[8..].copy_from_slice(&(bulk.len() as u64).to_le_bytes());
        self.write_all(0, &record)?;
        self.write_all(0, msg)?;
        if skip > 0 {
            self.tx_pos[1] = self.tx_pos[1].wrapping_add(skip);
            let ring = self.tx[1];
            self.area
                .word64(ring.write_word)
                .store(self.tx_pos[1], Ordering::Release);
        }
        self.write_all(1, bulk)?;
        self.notify_peer();
        self.stats.messages_sent += 1;
        self.stats.bulk_bytes_sent += bulk.len() as u64;
        Ok(())
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
        self.notify_peer();
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

    /// Free bytes of the ring this side writes; an impossible read position is a violation.
    fn free(&self, lane: usize) -> Result<u64, ShmError> {
        let ring = self.tx[lane];
        let peer_read = self.area.word64(ring.read_word).load(Ordering::Acquire);
        let used = self.tx_pos[lane].wrapping_sub(peer_read);
        if used > ring.cap {
            return Err(ShmError::Violation(format!(
                "read position {peer_read} of a ring written to {}",
                self.tx_pos[lane]
            )));
        }
        Ok(ring.cap - used)
    }

    /// Bytes waiting in the ring this side reads; an impossible write position is a violation.
    fn available(&self, lane: usize) -> Result<u64, ShmError> {
        let ring = self.rx[lane];
        let peer_write = self.area.word64(ring.write_word).load(Ordering::Acquire);
        let avail = peer_write.wrapping_sub(self.rx_pos[lane]);
        if avail > ring.cap {
            return Err(ShmError::Violation(format!(
                "write position {peer_write} of a ring read to {}",
                self.rx_pos[lane]
            )));
        }
        Ok(avail)
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
            self.copy_in(lane, &bytes[..n]);
            bytes = &bytes[n..];
            self.tx_pos[lane] = self.tx_pos[lane].wrapping_add(n as u64);
            let ring = self.tx[lane];
            self.area
                .word64(ring.write_word)
                .store(self.tx_pos[lane], Ordering::Release);
            if !bytes.is_empty() {
                self.notify_peer();
            }
        }
        Ok(())
    }

    /// Copies `bytes` (at most the free space) into the tx ring at its position.
    fn copy_in(&self, lane: usize, bytes: &[u8]) {
        let ring = self.tx[lane];
        let at = (self.tx_pos[lane] & (ring.cap - 1)) as usize;
        let first = bytes.len().min(ring.cap as usize - at);
        let base = self.area.map.as_mut_ptr();
        // SAFETY: `at + first <= cap` and the wrapped rest is `<= cap - first`
        // (callers pass at most the free space, itself at most `cap`), so both
        // copies stay inside the ring, which lies inside the mapping. The bytes
        // between the peer's read position and ours are ours alone to write; a
        // peer that writes them anyway only garbles its own messages.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(ring.data + at), first);
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr().add(first),
                base.add(ring.data),
                bytes.len() - first,
            );
        }
    }

    /// Copies `n` bytes (at most the available ones) out of the rx ring to `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for `n` bytes of writes.
    unsafe fn copy_out(&self, lane: usize, dst: *mut u8, n: usize) {
        let ring = self.rx[lane];
        let at = (self.rx_pos[lane] & (ring.cap - 1)) as usize;
        let first = n.min(ring.cap as usize - at);
        let base = self.area.map.as_ptr();
        // SAFETY: both source ranges lie inside the ring (as in `copy_in`); the
        // caller vouches for `dst`. The peer may be writing these bytes as we
        // copy them (it should not): the copy then holds garbage, which the
        // decoder rejects like any other.
        unsafe {
            std::ptr::copy_nonoverlapping(base.add(ring.data + at), dst, first);
            std::ptr::copy_nonoverlapping(base.add(ring.data), dst.add(first), n - first);
        }
    }

    fn consumed(&mut self, lane: usize, n: usize) {
        self.rx_pos[lane] = self.rx_pos[lane].wrapping_add(n as u64);
        let ring = self.rx[lane];
        self.area
            .word64(ring.read_word)
            .store(self.rx_pos[lane], Ordering::Release);
    }

    /// Waits until `lane` has bytes to read; how many.
    fn wait_available(&mut self, lane: usize) -> Result<usize, ShmError> {
        let avail = self.available(lane)?;
        if avail > 0 {
            return Ok(avail as usize);
        }
        // Let a writer waiting for room go on before we sleep.
        self.notify_peer();
        self.wait(|me| Ok(me.available(lane)? > 0))?;
        Ok(self.available(lane)? as usize)
    }

    fn read_exact(&mut self, lane: usize, out: &mut [u8]) -> Result<(), ShmError> {
        let mut done = 0;
        while done < out.len() {
            let n = self.wait_available(lane)?.min(out.len() - done);
            // SAFETY: `out[done..done + n]` is valid for writes.
            unsafe { self.copy_out(lane, out.as_mut_ptr().add(done), n) };
            self.consumed(lane, n);
            done += n;
        }
        Ok(())
    }

    /// Appends `len` bytes of `lane` to `vec`, growing it as they arrive.
    fn read_into(&mut self, lane: usize, vec: &mut Vec<u8>, len: usize) -> Result<(), ShmError> {
        let mut left = len;
        while left > 0 {
            let n = self.wait_available(lane)?.min(left);
            vec.reserve(n);
            let at = vec.len();
            // SAFETY: `reserve` made room for `n` more bytes after `at`; the copy
            // initialises exactly those bytes before `set_len` exposes them.
            unsafe {
                self.copy_out(lane, vec.as_mut_ptr().add(at), n);
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

/// This thread's involuntary context switches so far: times the kernel gave
/// its core to another task while it could still run.
fn involuntary_switches() -> i64 {
    // SAFETY: an all-zero rusage is valid; getrusage fills the one we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    usage.ru_nivcsw
}

/// Rings `side`'s doorbell, as the other side does after publishing: bumps
/// its futex word and wakes it. Harmless when there is nothing to see.
pub fn ring_doorbell(area: &ShmArea, side: Side) {
    let bell = area.word32(OFF_BELL[side.index()]);
    bell.fetch_add(1, Ordering::Release);
    futex_wake(bell);
}

/// Sleeps while `word` holds `expected`, at most `timeout`; whether it timed out.
/// A shared (not process-private) futex: the word lives in memory two processes map.
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned u32 at `word` (valid for the call) and
    // `ts` (valid for reads); it returns at a wake, a timeout, a signal or at once
    // if the value differs, all of which callers handle by re-checking.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
    rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT)
}

/// Wakes a sleeper on `word`.
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address of `word` as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Whether the socket's peer hung up. Bytes waiting on it are not a hang-up:
/// after the switch to shared memory the socket carries only the memfds of
/// pinned regions ([`crate::pinned`]), which the server reads with their call.
fn socket_hung_up(fd: BorrowedFd<'_>) -> bool {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no waiting.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    rc > 0 && pfd.revents != 0
}

/// How long a client spins for an answer by default on hosts of 8 or more
/// cores: longer than most waits for a kernel, as CUDA itself spins while a
/// program synchronizes (see `cumux_server::device::spin::WAIT_SPIN`).
pub const ANSWER_SPIN: Duration = Duration::from_micros(1000);

/// The client's spin for answers: `CUMUX_SHM_SPIN_US`, else [`ANSWER_SPIN`] on
/// hosts of 8 or more cores, else [`DEFAULT_SPIN`].
pub fn answer_spin_from_env() -> Duration {
    if std::env::var("CUMUX_SHM_SPIN_US").is_ok() {
        return spin_from_env();
    }
    match std::thread::available_parallelism() {
        Ok(n) if n.get() >= 8 => ANSWER_SPIN,
        _ => DEFAULT_SPIN,
    }
}

/// `CUMUX_SHM_SPIN_US`, else [`DEFAULT_SPIN`].
pub fn spin_from_env() -> Duration {
    std::env::var("CUMUX_SHM_SPIN_US")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_micros)
        .unwrap_or(DEFAULT_SPIN)
}

/// Sends `bytes` on a unix socket with `fd` attached (`SCM_RIGHTS`), in one message.
pub fn send_with_fd(socket: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw: RawFd = fd.as_raw_fd();
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the fields that matter are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, which has room for one cmsg carrying one
    // descriptor (CMSG_SPACE above); CMSG_FIRSTHDR is non-null for that size and
    // CMSG_DATA points inside it. `iov` and `bytes` outlive the sendmsg call.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), raw);
        libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != bytes.len() {
        // A short send of a few bytes on a fresh socket: send the rest plainly.
        use std::io::Write;
        let mut s = socket;
        s.write_all(&bytes[sent as usize..])?;
    }
    Ok(())
}

/// Receives up to `buf.len()` bytes from a unix socket and the first descriptor
/// that came with them (any others are closed). 0 bytes: the peer closed.
pub fn recv_with_fd(socket: &UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut fds = Vec::new();
    let got = recv_with_fds(socket.as_fd(), buf, 0, &mut fds)?;
    let first = if fds.is_empty() {
        None
    } else {
        Some(fds.swap_remove(0))
    };
    Ok((got, first))
}

/// One `recvmsg` of up to `buf.len()` bytes with `flags` (`MSG_DONTWAIT`…),
/// retried on `EINTR`; descriptors that came with the bytes are appended to
/// `fds` (close-on-exec). 0 bytes: the peer closed.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: libc::c_int,
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    const MAX_FDS: usize = 4;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) };
    let mut control = vec![0u64; (space as usize).div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: an all-zero msghdr is valid; the fields that matter are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let got = loop {
        // SAFETY: `msg` describes `buf` and `control`, both valid for writes of
        // the lengths given.
        let n =
            unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: walking the control messages the kernel wrote into `control`, with
    // the CMSG macros, which stay within `msg_controllen`; each SCM_RIGHTS
    // payload holds whole descriptors that now belong to this process.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let payload = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                for i in 0..payload / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(got)
}

/// Moves a call's byte buffer out of it when it is large enough to travel in
/// the bulk ring; an empty vector otherwise.
pub fn take_call_bulk(call: &mut Call) -> Vec<u8> {
    match call {
        Call::MemcpyHtoD { data: b, .. }
        | Call::ModuleLoad { image: b }
        | Call::Launch { params: b, .. }
            if b.len() >= BULK_THRESHOLD =>
        {
            std::mem::take(b)
        }
        _ => Vec::new(),
    }
}

/// Puts a bulk payload back into the call it came with. A payload for a call
/// that has no byte buffer, or whose buffer also came inline, is a violation.
pub fn put_call_bulk(call: &mut Call, bulk: Vec<u8>) -> Result<(), ShmError> {
    if bulk.is_empty() {
        return Ok(());
    }
    match call {
        Call::MemcpyHtoD { data: b, .. }
        | Call::ModuleLoad { image: b }
        | Call::Launch { params: b, .. }
            if b.is_empty() =>
        {
            *b = bulk;
            Ok(())
        }
        _ => Err(ShmError::Violation(
            "a bulk payload for a call that takes none".into(),
        )),
    }
}

/// Moves a reply's data out of it when large enough to travel in the bulk ring.
pub fn take_reply_bulk(reply: &mut Reply) -> Vec<u8> {
    match &mut reply.result {
        Ok(ReplyBody::Data(d)) if d.len() >= BULK_THRESHOLD => std::mem::take(d),
        _ => Vec::new(),
    }
}

/// Puts a bulk payload back into the reply it came with.
pub fn put_reply_bulk(reply: &mut Reply, bulk: Vec<u8>) -> Result<(), ShmError> {
    if bulk.is_empty() {
        return Ok(());
    }
    match &mut reply.result {
        Ok(ReplyBody::Data(d)) if d.is_empty() => {
            *d = bulk;
            Ok(())
        }
        _ => Err(ShmError::Violation(
            "a bulk payload for a reply that takes none".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;

    const SMALL: ShmLayout = ShmLayout {
        request_ring: MIN_RING_BYTES,
        reply_ring: MIN_RING_BYTES,
        request_bulk: MIN_RING_BYTES,
        reply_bulk: MIN_RING_BYTES,
    };

    /// A client and a server endpoint over one area (two mappings of one memfd).
    fn pair(layout: ShmLayout, spin: Duration) -> (Endpoint, Endpoint) {
        let (area, fd) = ShmArea::create(layout).unwrap();
        let server = ShmArea::attach(fd, layout).unwrap();
        (
            Endpoint::new(area, Side::Client, None, spin),
            Endpoint::new(server, Side::Server, None, spin),
        )
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
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
            // Each payload lands at the start of the ring: the pages stay the same.
            assert_eq!(client.tx_pos[1] % SMALL.request_bulk as u64, 1000);
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

    #[test]
    fn only_sealed_tmpfs_memfds_of_the_right_size_attach() {
        let (_, fd) = ShmArea::create(SMALL).unwrap();
        let big = ShmLayout {
            request_bulk: MAX_RING_BYTES,
            ..SMALL
        };
        let err = ShmArea::attach(fd, big).unwrap_err();
        assert!(err.contains("needs"), "{err}");

        // SAFETY: a NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: just created, owned by nobody else.
        let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
        File::from(unsealed.try_clone().unwrap())
            .set_len(SMALL.total_bytes() as u64)
            .unwrap();
        let err = ShmArea::attach(unsealed, SMALL).unwrap_err();
        assert!(err.contains("seal"), "{err}");

        let path = std::env::temp_dir().join(format!("cumux-shm-test-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        file.set_len(SMALL.total_bytes() as u64).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(ShmArea::attach(file.into(), SMALL).is_err());

        let odd = ShmLayout {
            reply_ring: 5000,
            ..SMALL
        };
        assert!(ShmArea::create(odd).is_err());
    }

    #[test]
    fn descriptors_pass_over_a_unix_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let (area, fd) = ShmArea::create(SMALL).unwrap();
        send_with_fd(&a, b"attach", fd.as_fd()).unwrap();
        let mut buf = [0u8; 64];
        let (n, got) = recv_with_fd(&b, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"attach");
        let other = ShmArea::attach(got.expect("a descriptor"), SMALL).unwrap();
        let mut client = Endpoint::new(area, Side::Client, None, DEFAULT_SPIN);
        let mut server = Endpoint::new(other, Side::Server, None, DEFAULT_SPIN);
        client.send(b"over the memfd", &[]).unwrap();
        let (mut msg, mut bulk) = (Vec::new(), Vec::new());
        server.recv(&mut msg, &mut bulk).unwrap();
        assert_eq!(msg, b"over the memfd");
    }

    #[test]
    fn large_byte_buffers_move_to_the_bulk_ring_and_back() {
        let data = pattern(3, 4096);
        let mut call = Call::MemcpyHtoD {
            dst: 1,
            data: data.clone(),
            stream: None,
        };
        let bulk = take_call_bulk(&mut call);
        assert_eq!(bulk, data);
        put_call_bulk(&mut call, bulk).unwrap();
        assert!(matches!(&call, Call::MemcpyHtoD { data: d, .. } if *d == data));
        // Small ones stay inline.
        let mut small = Call::MemcpyHtoD {
            dst: 1,
            data: vec![1, 2, 3],
            stream: None,
        };
        assert!(take_call_bulk(&mut small).is_empty());
        // A payload for a call without a buffer, or one already filled, is refused.
        assert!(put_call_bulk(&mut Call::ContextSynchronize, vec![1]).is_err());
        assert!(put_call_bulk(&mut small, vec![1]).is_err());

        let mut reply = Reply {
            seq: 1,
            result: Ok(ReplyBody::Data(data.clone())),
            stdout: Vec::new(),
        };
        let bulk = take_reply_bulk(&mut reply);
        assert_eq!(bulk.len(), 4096);
        put_reply_bulk(&mut reply, bulk).unwrap();
        assert_eq!(reply.result, Ok(ReplyBody::Data(data)));
        let mut unit = Reply {
            seq: 1,
            result: Ok(ReplyBody::Unit),
            stdout: Vec::new(),
        };
        assert!(put_reply_bulk(&mut unit, vec![1]).is_err());
    }
}
