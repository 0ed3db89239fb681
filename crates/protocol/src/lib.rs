//! The cumux wire protocol: message types, framing and the version handshake.
//! Client driver and server share exactly these types; nothing else crosses the wire.

pub mod framing;
pub mod hop_trace;
pub mod launch_checks;
mod memfd;
pub mod messages;
pub mod pinned;
pub mod shm;

pub use framing::{read_frame, read_frame_within, write_frame, FrameError, MAX_FRAME_BYTES};
pub use messages::*;

/// Bumped whenever a message type changes shape. Client and server must agree.
pub const PROTOCOL_VERSION: u32 = 5;

/// First bytes of every handshake, so a stray connection is recognised at once.
pub const MAGIC: u32 = 0x43_4d_55_58; // "CMUX"

/// Encodes a message into its wire bytes (without the frame header).
pub fn encode<T: serde::Serialize>(msg: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_stdvec(msg)
}

/// Decodes wire bytes into a message; malformed input is an error, never a panic.
pub fn decode<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}
