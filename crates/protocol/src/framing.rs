//! Length-prefixed frames over any byte stream: a little-endian u32 length, then
//! the encoded message. After the handshake a message's bulk bytes (a copy's
//! data, a module's image) may follow it in a frame of their own, which the
//! header's top bit announces, so that they are written and read where they
//! lie instead of through the encoder. Oversized or truncated frames are
//! errors, never panics.

use std::io::{self, Read, Write};

/// Largest frame either side accepts; bulk copies are split into chunks below it.
pub const MAX_FRAME_BYTES: usize = 80 << 20;

/// Largest payload of one copy chunk, leaving room for the message around it.
pub const MAX_CHUNK_BYTES: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {len} bytes exceeds the limit of {limit}")]
    TooLarge { len: usize, limit: usize },
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
}

/// Payloads up to this size are sent with their header in one write.
const COALESCE_BYTES: usize = 64 << 10;

/// Writes one frame: header and payload in a single write where it is small.
pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> Result<(), FrameError> {
    if payload.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len: payload.len(),
            limit: MAX_FRAME_BYTES,
        });
    }
    let header = (payload.len() as u32).to_le_bytes();
    if payload.len() > COALESCE_BYTES {
        // Copying a bulk payload costs more than a second write.
        w.write_all(&header)?;
        w.write_all(payload)?;
        w.flush()?;
        return Ok(());
    }
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&header);
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    // A TLS stream sends what it holds (elsewhere flushing is free).
    w.flush()?;
    Ok(())
}

/// The header bit that says a bulk frame follows the message.
const BULK_FOLLOWS: u32 = 1 << 31;

/// Writes a message (`msg`, encoded) and, if not empty, its bulk bytes in a
/// frame of their own, written from where they lie.
pub fn write_message(w: &mut impl Write, msg: &[u8], bulk: &[u8]) -> Result<(), FrameError> {
    for len in [msg.len(), bulk.len()] {
        if len > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge {
                len,
                limit: MAX_FRAME_BYTES,
            });
        }
    }
    let flag = if bulk.is_empty() { 0 } else { BULK_FOLLOWS };
    let mut head = Vec::with_capacity(8 + msg.len());
    head.extend_from_slice(&(msg.len() as u32 | flag).to_le_bytes());
    head.extend_from_slice(msg);
    if !bulk.is_empty() {
        head.extend_from_slice(&(bulk.len() as u32).to_le_bytes());
        if bulk.len() <= COALESCE_BYTES {
            head.extend_from_slice(bulk);
            w.write_all(&head)?;
            w.flush()?;
            return Ok(());
        }
    }
    w.write_all(&head)?;
    if bulk.len() > COALESCE_BYTES {
        w.write_all(bulk)?;
    }
    w.flush()?;
    Ok(())
}

/// Writes a message (`msg`, encoded) and the header of the bulk frame of
/// `bulk_len` bytes that follows it, which the caller writes next, from
/// wherever they lie, and then flushes: [`write_message`] in two steps.
pub fn write_message_head(
    w: &mut impl Write,
    msg: &[u8],
    bulk_len: usize,
) -> Result<(), FrameError> {
    for len in [msg.len(), bulk_len] {
        if len > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge {
                len,
                limit: MAX_FRAME_BYTES,
            });
        }
    }
    let mut head = Vec::with_capacity(8 + msg.len());
    head.extend_from_slice(&(msg.len() as u32 | BULK_FOLLOWS).to_le_bytes());
    head.extend_from_slice(msg);
    head.extend_from_slice(&(bulk_len as u32).to_le_bytes());
    w.write_all(&head)?;
    Ok(())
}

/// Reads a message into `buf`, as [`write_message`] or [`write_frame`]
/// wrote it; `Some(len)` when a bulk frame of `len` bytes follows, which the
/// caller reads next ([`read_bulk`], or `read_exact` where it should land).
pub fn read_message(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<Option<usize>, FrameError> {
    let header = read_header(r)?;
    let len = (header & !BULK_FOLLOWS) as usize;
    read_body(r, buf, len, MAX_FRAME_BYTES)?;
    if header & BULK_FOLLOWS == 0 {
        return Ok(None);
    }
    let bulk = match read_header(r) {
        Err(FrameError::Closed) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
        other => other? as usize,
    };
    if bulk > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len: bulk,
            limit: MAX_FRAME_BYTES,
        });
    }
    Ok(Some(bulk))
}

/// A bulk frame's `len` bytes (its length read by [`read_message`]). The
/// memory is the system's zeroed pages, taken only as the bytes arrive.
pub fn read_bulk(r: &mut impl Read, len: usize) -> Result<Vec<u8>, FrameError> {
    let mut bulk = vec![0u8; len];
    r.read_exact(&mut bulk)?;
    Ok(bulk)
}

fn read_header(r: &mut impl Read) -> Result<u32, FrameError> {
    let mut header = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(u32::from_le_bytes(header))
}

/// Reads one frame into `buf` (reused between calls). A clean EOF before the
/// header is `Closed`; EOF inside a frame is an I/O error.
pub fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<(), FrameError> {
    read_frame_within(r, buf, MAX_FRAME_BYTES)
}

/// [`read_frame`] of a frame that may have at most `limit` bytes (a hello).
pub fn read_frame_within(
    r: &mut impl Read,
    buf: &mut Vec<u8>,
    limit: usize,
) -> Result<(), FrameError> {
    let len = read_header(r)? as usize;
    read_body(r, buf, len, limit)
}

/// A frame's `len` bytes into `buf`.
fn read_body(
    r: &mut impl Read,
    buf: &mut Vec<u8>,
    len: usize,
    limit: usize,
) -> Result<(), FrameError> {
    if len > limit {
        return Err(FrameError::TooLarge { len, limit });
    }
    // Grow with the bytes that actually arrive, so a header that merely claims
    // a large frame costs the reader nothing.
    buf.clear();
    buf.reserve(len.min(1 << 20));
    let got = r.by_ref().take(len as u64).read_to_end(buf)?;
    if got < len {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_limits() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello").unwrap();
        write_frame(&mut wire, b"").unwrap();
        let mut r = &wire[..];
        let mut buf = Vec::new();
        read_frame(&mut r, &mut buf).unwrap();
        assert_eq!(buf, b"hello");
        read_frame(&mut r, &mut buf).unwrap();
        assert!(buf.is_empty());
        assert!(matches!(
            read_frame(&mut r, &mut buf),
            Err(FrameError::Closed)
        ));

        let huge = ((MAX_FRAME_BYTES + 1) as u32).to_le_bytes();
        assert!(matches!(
            read_frame(&mut &huge[..], &mut buf),
            Err(FrameError::TooLarge { .. })
        ));
        let mut hello = Vec::new();
        write_frame(&mut hello, &[7u8; 100]).unwrap();
        match read_frame_within(&mut &hello[..], &mut buf, 99) {
            Err(
                e @ FrameError::TooLarge {
                    len: 100,
                    limit: 99,
                },
            ) => {
                assert_eq!(e.to_string(), "frame of 100 bytes exceeds the limit of 99")
            }
            other => panic!("{other:?}"),
        }
        let mut messages = Vec::new();
        write_message(&mut messages, b"call", &[9u8; 100]).unwrap();
        write_message(&mut messages, b"big", &vec![3u8; COALESCE_BYTES + 1]).unwrap();
        write_message(&mut messages, b"none", &[]).unwrap();
        write_message_head(&mut messages, b"head", 3).unwrap();
        messages.extend_from_slice(b"abc");
        write_frame(&mut messages, b"plain").unwrap();
        let mut r = &messages[..];
        assert_eq!(read_message(&mut r, &mut buf).unwrap(), Some(100));
        assert_eq!(buf, b"call");
        assert_eq!(read_bulk(&mut r, 100).unwrap(), vec![9u8; 100]);
        assert_eq!(
            read_message(&mut r, &mut buf).unwrap(),
            Some(COALESCE_BYTES + 1)
        );
        assert_eq!(
            read_bulk(&mut r, COALESCE_BYTES + 1).unwrap()[COALESCE_BYTES],
            3
        );
        assert_eq!(read_message(&mut r, &mut buf).unwrap(), None);
        assert_eq!(buf, b"none");
        assert_eq!(read_message(&mut r, &mut buf).unwrap(), Some(3));
        assert_eq!(
            (&buf[..], read_bulk(&mut r, 3).unwrap()),
            (&b"head"[..], b"abc".to_vec())
        );
        assert_eq!(read_message(&mut r, &mut buf).unwrap(), None);
        assert_eq!(buf, b"plain");
        // A bulk frame announced but never sent, or past the limit.
        let mut cut = Vec::new();
        write_message(&mut cut, b"x", &[1u8; 10]).unwrap();
        cut.truncate(5);
        assert!(matches!(
            read_message(&mut &cut[..], &mut buf),
            Err(FrameError::Io(_))
        ));
        let mut huge = Vec::new();
        huge.extend_from_slice(&(1u32 | BULK_FOLLOWS).to_le_bytes());
        huge.push(b'x');
        huge.extend_from_slice(&((MAX_FRAME_BYTES + 1) as u32).to_le_bytes());
        assert!(matches!(
            read_message(&mut &huge[..], &mut buf),
            Err(FrameError::TooLarge { .. })
        ));
        let truncated = [5u8, 0, 0, 0, b'a'];
        assert!(matches!(
            read_frame(&mut &truncated[..], &mut buf),
            Err(FrameError::Io(_))
        ));
    }
}
