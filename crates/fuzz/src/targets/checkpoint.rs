//! Checkpoint files (`cumux restore FILE`, `cumux serve --restore`): the
//! server's reader of the stream (`session::image_stream`) answers any bytes
//! with an image or an error, never a panic; and a valid stream, made from
//! the input and then changed by it (bytes flipped, cut short), is refused
//! or reads back exactly as written, never as other memory.

use cumux_server::session::image::{Allocation, SessionImage};
use cumux_server::session::image_stream::{read_whole, verified, written};

use crate::engine::Target;
use crate::features::Features;

pub static TARGET: Target = Target {
    name: "checkpoint",
    check,
    seeds,
    dictionary: &[
        b"CUMUXCKP",
        &[3, 0, 0, 0],
        &[2, 0, 0, 0],
        &[0, 0, 0x40, 0],
        &[0xff; 4],
    ],
    max_len: 16 << 10,
};

/// The most allocations and changes of one input.
const MAX_ALLOCATIONS: usize = 3;
const MAX_CHANGES: usize = 4;

fn check(data: &[u8], features: &mut Features) {
    // Any bytes: the reader's answer.
    match verified(data) {
        Ok(image) => features.add(("raw read", image.allocations.len().min(4))),
        Err(e) => features.add_message("raw refused", &e.detail),
    }
    let Some((image, memory, changes)) = stream_of(data) else {
        return;
    };
    let (stream, _) = written(Vec::new(), &image, &memory).expect("a stream in memory");
    let mut changed = stream.clone();
    for &(at, flip) in &changes.flips {
        let at = at as usize % changed.len();
        changed[at] ^= flip;
    }
    if let Some(cut) = changes.cut {
        changed.truncate(cut as usize % changed.len());
    }
    match read_whole(&changed) {
        Ok((read, bytes)) => {
            features.add(("read back", changed == stream));
            assert!(read == image, "a changed stream read back another image");
            assert!(bytes == memory, "a changed stream read back other memory");
        }
        Err(e) => {
            assert!(
                changed != stream,
                "a stream as written is refused: {}",
                e.detail
            );
            features.add_message("refused", &e.detail);
        }
    }
}

/// Edits to a stream: bytes xor-ed at offsets, and where it is cut.
struct Changes {
    flips: Vec<(u32, u8)>,
    cut: Option<u32>,
}

/// An image of up to [`MAX_ALLOCATIONS`] small allocations, their memory
/// (zeros, one value, runs or the input's own bytes) and the changes, all
/// taken from `data`.
fn stream_of(data: &[u8]) -> Option<(SessionImage, Vec<u8>, Changes)> {
    let mut data = data.iter().copied();
    let mut next = || data.next();
    let count = usize::from(next()?) % (MAX_ALLOCATIONS + 1);
    let mut image = SessionImage::empty(1);
    let mut memory = Vec::new();
    let mut at = 0x7f00_0000_0000u64;
    for _ in 0..count {
        let size = u16::from_le_bytes([next()?, next()?]) % 6000;
        let kind = next()?;
        let bytes: Vec<u8> = match kind % 4 {
            0 => vec![0; size as usize],
            1 => vec![kind; size as usize],
            2 => (0..size).map(|i| (i / 512) as u8).collect(),
            _ => (0..size).map(|_| next().unwrap_or(kind)).collect(),
        };
        image.allocations.push(Allocation {
            ptr: at,
            size: u64::from(size),
        });
        at += u64::from(size).next_multiple_of(256) + 256;
        memory.extend_from_slice(&bytes);
    }
    let mut flips = Vec::new();
    for _ in 0..usize::from(next().unwrap_or(0)) % (MAX_CHANGES + 1) {
        let at = u32::from_le_bytes([next()?, next()?, next()?, next()?]);
        flips.push((at, next()?.max(1)));
    }
    let cut = match next() {
        Some(b) if b % 2 == 1 => Some(u32::from_le_bytes([next()?, next()?, 0, 0])),
        _ => None,
    };
    image.next_handle = u64::from(next().unwrap_or(0));
    Some((image, memory, Changes { flips, cut }))
}

/// Inputs of each memory kind, with and without changes; and a whole stream
/// as the raw reader's seed.
fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![
        vec![3, 0x10, 0x00, 0, 0x00, 0x04, 1, 0x40, 0x01, 2, 0, 0],
        vec![
            2, 0x20, 0x00, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
            20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 0x00, 0x10, 2, 1, 100, 0, 0, 0,
            0x40, 1, 50, 0,
        ],
        vec![1, 0x00, 0x08, 0x5a, 0, 1, 0xff, 0, 0],
    ];
    let (image, memory, _) = stream_of(&seeds[0]).expect("a seed makes a stream");
    seeds.push(written(Vec::new(), &image, &memory).expect("a stream").0);
    seeds
}
