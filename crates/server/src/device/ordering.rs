//! What the backends that keep CUDA's stream order share: the stream and event
//! flags they read, the errors they give alike, and the steps of running
//! [`StreamWork`] that do not depend on the device.

use std::time::Instant;

use cumux_protocol::{codes, CuError, DevicePtr, Handle};

use super::signals::SignalArea;
use super::{MemFill, StreamWork};

/// `CU_STREAM_NON_BLOCKING`: the stream does not synchronize with the default stream.
pub const NON_BLOCKING: u32 = 0x1;
/// Device printf a stream order holds for its next waiting call, at most.
pub const MAX_STDOUT_BYTES: usize = 16 << 20;

/// `CU_EVENT_DISABLE_TIMING`: the event is an ordering point only.
pub const EVENT_DISABLE_TIMING: u32 = 0x2;

/// `CU_EVENT_INTERPROCESS`: an event other programs may open by handle.
pub const EVENT_INTERPROCESS: u32 = 0x4;

/// The error for a stream, event or graph handle the context does not have.
pub fn unknown(what: &str, h: Handle) -> CuError {
    CuError::new(codes::INVALID_HANDLE, format!("unknown {what} {h:#x}"))
}

/// Refuses a graph of anything but launches ([`super::StreamOrdered::graph_create`]).
pub fn launches_only(launches: &[StreamWork]) -> Result<(), CuError> {
    match launches.iter().all(|l| matches!(l, StreamWork::Launch(_))) {
        true => Ok(()),
        false => Err(not_a_launch()),
    }
}

/// The error for work other than a launch in a graph.
pub fn not_a_launch() -> CuError {
    CuError::new(codes::INVALID_VALUE, "a graph of launches only")
}

impl MemFill {
    /// Runs `fill_row` at the start of each of the fill's `height` rows,
    /// `pitch` bytes apart from `dst` on; stops at a failure.
    pub fn each_row(
        &self,
        mut fill_row: impl FnMut(DevicePtr) -> Result<(), CuError>,
    ) -> Result<(), CuError> {
        (0..self.height)
            .try_for_each(|row| fill_row(self.dst.wrapping_add(row.wrapping_mul(self.pitch))))
    }
}

/// Raises counter `slot` of `area` to `value` (the earlier work is done).
pub fn store_signal(area: &SignalArea, slot: u32, value: u64) -> Result<(), CuError> {
    match area.store(slot, value) {
        true => Ok(()),
        false => Err(CuError::new(
            codes::INVALID_VALUE,
            format!("signal slot {slot}"),
        )),
    }
}

/// The error of a [`StreamWork::Signal`] that reached no signal area.
pub fn no_signal_area() -> CuError {
    CuError::new(codes::INVALID_VALUE, "a signal without an area")
}

/// Milliseconds from `start` to `end`, negative when `end` came first.
pub fn elapsed_ms(start: Instant, end: Instant) -> f32 {
    if end >= start {
        ((end - start).as_secs_f64() * 1e3) as f32
    } else {
        -((start - end).as_secs_f64() * 1e3) as f32
    }
}

/// Appends `bytes` of device printf to `out`, keeping `out` within
/// [`MAX_STDOUT_BYTES`]; false when some of them were dropped.
pub fn append_printf(out: &mut Vec<u8>, bytes: &[u8]) -> bool {
    let room = MAX_STDOUT_BYTES.saturating_sub(out.len());
    out.extend_from_slice(&bytes[..bytes.len().min(room)]);
    bytes.len() <= room
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printf_past_the_cap_is_dropped_and_said_so() {
        let mut out = vec![b'x'; MAX_STDOUT_BYTES - 2];
        assert!(append_printf(&mut out, b"ab"));
        assert!(!append_printf(&mut out, b"c"));
        assert_eq!(out.len(), MAX_STDOUT_BYTES);
        assert!(out.ends_with(b"ab"));
    }
}
