//! The shape of a shared area: the four ring sizes a client chooses, the
//! header words and their offsets, the two sides, and what can go wrong on
//! the link.

use serde::{Deserialize, Serialize};

use crate::framing::MAX_FRAME_BYTES;

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

/// Largest bulk payload of one message (a copy chunk is at most `MAX_CHUNK_BYTES`).
pub const MAX_BULK_BYTES: usize = MAX_FRAME_BYTES;

/// Bytes of the header; the request ring starts here.
pub const HEADER_BYTES: usize = 4096;
/// Bytes of a record header in a message ring.
pub const RECORD_BYTES: usize = 16;
pub(super) const AREA_MAGIC: u64 = 0x4d48_5358_554d_5543; // "CUMUXSHM"

// Header words (offsets into the area). Each word one side writes often
// lies alone in a block of `POS_STRIDE` bytes: the position a side publishes
// for every message shares no cache line (nor the pair of lines that cores
// fetch together) with a word the other side writes, so a spinning reader's
// looks do not take the line from the writer between its publishes.
pub(super) const OFF_MAGIC: usize = 0;
/// Bytes from one position word to the next.
pub const POS_STRIDE: usize = 128;
/// The first position word: ring `i`'s write position is at
/// [`write_position_offset`]`(i)`, its read position at
/// [`read_position_offset`]`(i)`; rings in order request, reply, request
/// bulk, reply bulk.
pub(super) const OFF_POS: usize = 128;
/// By side (client, server): the futex word that side sleeps on.
pub const OFF_BELL: [usize; 2] = [1152, 1280];
/// By side: nonzero while that side sleeps (or is about to).
pub const OFF_SLEEPING: [usize; 2] = [1156, 1284];
/// By side: nonzero once that side has closed its end.
pub const OFF_CLOSED: [usize; 2] = [1160, 1288];

/// Offset of ring `i`'s write position (a `u64`, written by its writer).
pub const fn write_position_offset(i: usize) -> usize {
    OFF_POS + 2 * POS_STRIDE * i
}

/// Offset of ring `i`'s read position (a `u64`, written by its reader).
pub const fn read_position_offset(i: usize) -> usize {
    write_position_offset(i) + POS_STRIDE
}

impl ShmLayout {
    pub(super) fn rings(&self) -> [u32; 4] {
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
    pub(super) fn ring_offset(&self, i: usize) -> usize {
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
    pub(super) fn peer(self) -> Side {
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
