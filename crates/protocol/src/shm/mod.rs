//! The shared-memory transport of same-host clients: a sealed memfd both sides
//! map, holding per direction a message ring and a bulk ring, and a futex doorbell per side.
//!
//! Layout of the area (offsets in bytes): a 4 KiB header of words (each
//! ring's write and read positions, each alone in 128 bytes, and each side's
//! doorbell, sleep flag and closed flag), then the request ring, the reply ring, the request bulk ring
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
//!
//! Files by job: [`layout`] (ring sizes, header words, sides), [`area`] (the
//! memfd and its mapping), [`ring`] (one ring's checked copies), [`endpoint`]
//! (sending and receiving), [`held`] (a payload kept where it lies),
//! [`wait`] (spinning, futex sleeps, liveness),
//! [`bulk`] (what travels in the bulk ring) and [`fd_passing`] (descriptors
//! over the socket). This file only gathers their public items.

mod area;
mod bulk;
mod endpoint;
mod fd_passing;
mod held;
mod layout;
mod ring;
#[cfg(test)]
mod test_data;
mod wait;

pub use area::ShmArea;
pub use bulk::{put_call_bulk, put_reply_bulk, take_call_bulk, take_reply_bulk, BULK_THRESHOLD};
pub use endpoint::{Endpoint, EndpointStats};
pub use fd_passing::{peer_credentials, recv_with_fd, recv_with_fds, send_with_fd};
pub use held::HeldBulk;
pub use layout::{read_position_offset, write_position_offset};
pub use layout::{
    ShmError, ShmLayout, Side, DEFAULT_LAYOUT, HEADER_BYTES, MAX_BULK_BYTES, MAX_RING_BYTES,
    MIN_RING_BYTES, OFF_BELL, OFF_CLOSED, OFF_SLEEPING, POS_STRIDE, RECORD_BYTES,
};
pub use wait::{
    answer_spin_from_env, pause_between_looks, ring_doorbell, spin_from_env, ANSWER_SPIN,
    DEFAULT_SPIN, WAIT_SLICE,
};
