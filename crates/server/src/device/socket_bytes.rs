//! A copy's bytes on their way between a client's socket and the device,
//! handed over where they lie: what fills them in place and what sends them.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use cumux_protocol::{codes, CuError};

/// Fills a buffer (all of it) with a copy's next bytes, as they arrive from
/// a client's socket; called piece after piece, in order.
pub type FillBytes<'a> = dyn FnMut(&mut [u8]) -> io::Result<()> + 'a;

/// Sends a copy's next bytes (all of them) to a client's socket, from where
/// they lie; called piece after piece, in order.
pub type SendBytes<'a> = dyn FnMut(&[u8]) -> io::Result<()> + 'a;

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
