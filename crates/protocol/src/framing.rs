//! Length-prefixed frames over any byte stream: a little-endian u32 length, then
//! the encoded message. Oversized or truncated frames are errors, never panics.

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
    let len = u32::from_le_bytes(header) as usize;
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
        let truncated = [5u8, 0, 0, 0, b'a'];
        assert!(matches!(
            read_frame(&mut &truncated[..], &mut buf),
            Err(FrameError::Io(_))
        ));
    }
}
