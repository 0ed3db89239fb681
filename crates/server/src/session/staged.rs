//! Session images larger than one frame on an admin's connection (issue 17):
//! a checkpoint's image staged there and read in pieces, and an image written
//! there in pieces for the connection's next restore or park.

use cumux_protocol::{codes, CuError, ReplyBody, IMAGE_PIECE_BYTES};

use super::core::err;
use super::{CallResult, Session};

/// The most bytes an image staged for a restore or park may have.
pub const MAX_STAGED_BYTES: u64 = 1 << 36;

impl Session {
    /// What an order answered: the bytes themselves where one reply carries
    /// them, else staged on this connection, to be read in pieces.
    pub(super) fn answer_of(&self, said: Vec<u8>) -> ReplyBody {
        if said.len() <= IMAGE_PIECE_BYTES {
            return ReplyBody::Data(said);
        }
        let bytes = said.len() as u64;
        *self.staged_out.borrow_mut() = said;
        ReplyBody::ImageStaged { bytes }
    }

    /// `Call::ImageRead`: a piece of the image staged by this connection's
    /// last checkpoint; the image goes once its last byte is read.
    pub(super) fn image_read(&self, offset: u64, bytes: u64) -> CallResult {
        let mut staged = self.staged_out.borrow_mut();
        let len = staged.len() as u64;
        let end = offset.checked_add(bytes).filter(|&end| end <= len);
        let Some(end) = end.filter(|_| bytes <= IMAGE_PIECE_BYTES as u64) else {
            return Err(err(
                codes::INVALID_VALUE,
                format!(
                    "{bytes} bytes at {offset} of a staged image of {len} (at most \
                     {IMAGE_PIECE_BYTES} a piece)"
                ),
            ));
        };
        let piece = staged[offset as usize..end as usize].to_vec();
        if end == len {
            *staged = Vec::new();
        }
        Ok(ReplyBody::Data(piece))
    }

    /// `Call::ImageWrite`: a piece of an image for the next restore or park;
    /// a piece at 0 starts a new one.
    pub(super) fn image_write(&self, offset: u64, data: &[u8]) -> CallResult {
        let mut staged = self.staged_in.borrow_mut();
        if offset == 0 {
            *staged = Vec::new();
        }
        let len = staged.len() as u64;
        if offset != len || data.len() > IMAGE_PIECE_BYTES {
            return Err(err(
                codes::INVALID_VALUE,
                format!(
                    "a piece of {} bytes at {offset} of an image staged to {len} (pieces go in \
                     order, at most {IMAGE_PIECE_BYTES} each)",
                    data.len()
                ),
            ));
        }
        if len + data.len() as u64 > MAX_STAGED_BYTES {
            return Err(err(
                codes::OUT_OF_MEMORY,
                format!("an image past {MAX_STAGED_BYTES} bytes"),
            ));
        }
        staged.extend_from_slice(data);
        Ok(ReplyBody::Unit)
    }

    /// The image a restore or park names: its own, or (empty) the one this
    /// connection staged, taken.
    pub(super) fn image_or_staged(&self, image: &[u8]) -> Result<Vec<u8>, CuError> {
        if !image.is_empty() {
            return Ok(image.to_vec());
        }
        let staged = std::mem::take(&mut *self.staged_in.borrow_mut());
        if staged.is_empty() {
            return Err(err(
                codes::INVALID_VALUE,
                "an empty image, and none staged (Call::ImageWrite)",
            ));
        }
        Ok(staged)
    }
}
