//! Memory in pieces (a checkpoint's device reads, issue 17): bytes, or one
//! byte value repeated where the device side found it so; and
//! `DeviceContext::mem_read_pieces` for a context with no faster one.

use cumux_protocol::{codes, CuError, DevicePtr};

/// Memory on its way from or to a device: bytes, or one byte value `len` times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemPiece {
    Bytes(Vec<u8>),
    Fill { value: u8, len: u64 },
}

impl MemPiece {
    /// The bytes of memory it stands for.
    pub fn len(&self) -> u64 {
        match self {
            MemPiece::Bytes(bytes) => bytes.len() as u64,
            MemPiece::Fill { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Hands out a buffer of the length asked for (its bytes whatever they were).
pub type Buffer<'a> = dyn FnMut(usize) -> Vec<u8> + 'a;
/// Reads bytes at a device address into a buffer (a context's `mem_read`).
pub type ReadInto<'a> = dyn FnMut(DevicePtr, &mut [u8]) -> Result<(), CuError> + 'a;
/// Takes the next piece read and its device address, in order.
pub type TakePiece<'a> = dyn FnMut(DevicePtr, MemPiece) -> Result<(), CuError> + 'a;

/// The byte value all of `bytes` is, if it is one.
pub fn one_value(bytes: &[u8]) -> Option<u8> {
    let &first = bytes.first()?;
    // A fold without early exit vectorises; blocks keep the exit early.
    let same = |block: &[u8]| block.iter().fold(0u8, |acc, &b| acc | (b ^ first)) == 0;
    bytes.chunks(4096).all(same).then_some(first)
}

/// `len` bytes from `src` in pieces of at most `piece` bytes, checked first.
pub fn piece_count(len: u64, piece: usize) -> Result<u64, CuError> {
    if piece == 0 {
        return Err(CuError::new(codes::INVALID_VALUE, "pieces of 0 bytes"));
    }
    Ok(len.div_ceil(piece as u64))
}

/// [`DeviceContext::mem_read_pieces`] one piece at a time with `read` (a
/// context's `mem_read`): every piece comes as bytes.
pub fn read_one_by_one(
    read: &mut ReadInto<'_>,
    src: DevicePtr,
    len: u64,
    piece: usize,
    buffer: &mut Buffer<'_>,
    take: &mut TakePiece<'_>,
) -> Result<(), CuError> {
    piece_count(len, piece)?;
    let mut offset = 0;
    while offset < len {
        let n = (len - offset).min(piece as u64) as usize;
        let mut buf = buffer(n);
        read(src + offset, &mut buf)?;
        take(src + offset, MemPiece::Bytes(buf))?;
        offset += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_is_found_only_where_every_byte_is_it() {
        assert_eq!(one_value(&[7; 10_000]), Some(7));
        assert_eq!(one_value(&[]), None);
        let mut bytes = vec![0u8; 10_000];
        bytes[9_999] = 1;
        assert_eq!(one_value(&bytes), None);
        assert_eq!(piece_count(9, 4).unwrap(), 3);
        assert!(piece_count(9, 0).is_err());
    }
}
