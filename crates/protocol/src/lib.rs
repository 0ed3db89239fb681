//! The cumux wire protocol: message types, framing and the version handshake.
//! Client driver and server share exactly these types; nothing else crosses the wire.

pub mod address;
pub mod arrays;
pub mod framing;
pub mod hop_trace;
pub mod launch_checks;
pub mod memfd;
pub mod messages;
pub mod nvml_search;
pub mod pinned;
pub mod shm;
pub mod stream;
pub mod tls;
pub mod visible_devices;
pub mod vmm;

pub use arrays::ArrayCall;
pub use framing::{
    read_bulk, read_frame, read_frame_within, read_message, write_frame, write_message,
    write_message_head, FrameError, MAX_FRAME_BYTES,
};
pub use messages::*;
pub use vmm::{VmmCall, VmmProperties};

/// Bumped whenever a message type changes shape. Client and server must agree.
pub const PROTOCOL_VERSION: u32 = 33;

/// Unanswered calls (launches, async copies, event records) a client sends
/// before a [`Call::Fence`]: what it may have in flight beyond the launches the
/// server lets a session queue on its device.
pub const FENCE_EVERY: u32 = 256;

/// First bytes of every handshake, so a stray connection is recognised at once.
pub const MAGIC: u32 = 0x43_4d_55_58; // "CMUX"

/// Room an encoded message starts with: a launch, a copy or a reply fits,
/// so the common message takes one allocation, not a chain of growing ones.
const ENCODE_START_BYTES: usize = 256;

/// Encodes a message into its wire bytes (without the frame header).
pub fn encode<T: serde::Serialize>(msg: &T) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_extend(msg, Vec::with_capacity(ENCODE_START_BYTES))
}

/// Decodes wire bytes into a message; malformed input is an error, never a panic.
pub fn decode<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// Reads a reply as a socket carries it ([`write_message`]): the message,
/// then its data in a bulk frame of its own if one follows. The error says
/// what went wrong, for the reader's own message.
pub fn read_reply(r: &mut impl std::io::Read, buf: &mut Vec<u8>) -> Result<Reply, String> {
    let bulk = read_message(r, buf).map_err(|e| format!("no reply: {e}"))?;
    let mut reply: Reply = decode(buf).map_err(|e| format!("an undecodable reply: {e}"))?;
    if let Some(len) = bulk {
        let data = read_bulk(r, len).map_err(|e| format!("no reply data: {e}"))?;
        shm::put_reply_bulk(&mut reply, data)
            .map_err(|e| format!("reply data that does not fit the reply: {e}"))?;
    }
    Ok(reply)
}

/// What a client says when the server at `address` answers its hello with a
/// refusal: who was refused (`tenant`, the one it asked for, if any) and the
/// server's `reason`, verbatim; a server of another protocol version is named
/// as such.
pub fn refusal_text(
    address: &str,
    server_version: u32,
    tenant: Option<&str>,
    reason: &str,
) -> String {
    if server_version != PROTOCOL_VERSION {
        return format!(
            "the cumux server at {address} speaks protocol version {server_version} and refused \
             this client of version {PROTOCOL_VERSION} (use a cumux and a client driver of one \
             build): {reason}"
        );
    }
    match tenant {
        Some(name) => format!("the cumux server at {address} refused tenant {name:?}: {reason}"),
        None => format!("the cumux server at {address} refused the connection: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_read_as_refusals() {
        let text = refusal_text(
            "unix:/s",
            PROTOCOL_VERSION,
            Some("x"),
            "unknown tenant \"x\"",
        );
        assert_eq!(
            text,
            "the cumux server at unix:/s refused tenant \"x\": unknown tenant \"x\""
        );
        let text = refusal_text("unix:/s", PROTOCOL_VERSION, None, "too many sessions");
        assert!(text.ends_with("refused the connection: too many sessions"));
        let text = refusal_text("tcp:h:1", PROTOCOL_VERSION + 1, Some("x"), "mismatch");
        assert!(text.contains("protocol version") && text.ends_with(": mismatch"));
    }
}
