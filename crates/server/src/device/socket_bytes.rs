//! A copy's bytes on their way between a client's socket and the device,
//! handed over where they lie: what fills them in place and what sends them.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use cumux_protocol::shm::HeldBulk;
use cumux_protocol::{codes, CuError};

/// Fills a buffer (all of it) with a copy's next bytes, as they arrive from
/// a client's socket; called piece after piece, in order.
pub type FillBytes<'a> = dyn FnMut(&mut [u8]) -> io::Result<()> + 'a;

/// Where a copy's bytes go to a client's socket.
pub trait SendBytes {
    /// Sends the copy's next bytes (all of them) from where they lie, before
    /// it returns; called piece after piece, in order.
    fn send(&mut self, piece: &[u8]) -> io::Result<()>;

    /// Sends all of the copy's bytes, held where they lie in a ring until
    /// they are sent: maybe later, while the caller goes on (a worker's next
    /// read then overlaps this one's sending). Only in place of every
    /// [`SendBytes::send`].
    fn send_held(&mut self, held: HeldBulk) -> io::Result<()> {
        held.pieces().iter().try_for_each(|piece| self.send(piece))
    }

    /// Sends all of the copy's bytes, copied out of where they lay into
    /// `data`: maybe later, as [`SendBytes::send_held`].
    fn send_owned(&mut self, data: Vec<u8>) -> io::Result<()> {
        self.send(&data)
    }
}

/// The failure of a copy whose bytes did not arrive.
pub fn not_arrived(e: io::Error) -> CuError {
    CuError::new(
        codes::UNKNOWN,
        format!("the copy's bytes did not arrive: {e}"),
    )
}

/// The failure of a copy whose bytes could not be sent.
pub fn not_sent(e: io::Error) -> CuError {
    CuError::new(
        codes::UNKNOWN,
        format!("the copy's bytes were not sent: {e}"),
    )
}

/// The `len` bytes `fill` yields, in a buffer (where they cannot go in place).
pub fn gathered(len: usize, fill: &mut FillBytes<'_>) -> Result<Vec<u8>, CuError> {
    let mut data = vec![0u8; len];
    fill(&mut data).map_err(not_arrived)?;
    Ok(data)
}

/// Bytes a device took or gave in place (no buffer between it and the
/// socket), over the process's life: for tests and benchmarks.
static IN_PLACE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Counts `n` bytes moved in place.
pub fn count_in_place(n: usize) {
    IN_PLACE_BYTES.fetch_add(n as u64, Ordering::Relaxed);
}

/// [`IN_PLACE_BYTES`] so far.
pub fn in_place_bytes() -> u64 {
    IN_PLACE_BYTES.load(Ordering::Relaxed)
}
