//! How the loop makes a new input from one it has: a few byte-level edits
//! (bit flips, boundary values, inserted, deleted and copied ranges, a piece
//! of another input, a token of the target's dictionary), drawn from a seeded
//! ChaCha generator so that a run replays exactly from its seed.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// The loop's random source.
pub struct Rand(ChaCha8Rng);

impl Rand {
    pub fn seeded(seed: u64) -> Rand {
        Rand(ChaCha8Rng::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// True one time in `n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        self.0.fill_bytes(out);
    }
}

/// Values at the edges of integer ranges, where length and offset checks break.
const BOUNDARIES: [u64; 12] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

/// Applies one to eight edits to `input`, keeping it at most `max_len` bytes;
/// `other` is another input of the pool to splice from, `dictionary` the
/// target's tokens (keywords of a text format, magic numbers).
pub fn mutate(
    rand: &mut Rand,
    input: &mut Vec<u8>,
    other: &[u8],
    dictionary: &[&[u8]],
    max_len: usize,
) {
    let edits = 1 + rand.below(8);
    for _ in 0..edits {
        edit(rand, input, other, dictionary);
    }
    input.truncate(max_len);
}

fn edit(rand: &mut Rand, input: &mut Vec<u8>, other: &[u8], dictionary: &[&[u8]]) {
    let len = input.len();
    match rand.below(11) {
        // Flip one bit.
        0 if len > 0 => {
            let at = rand.below(len);
            input[at] ^= 1 << rand.below(8);
        }
        // A random byte.
        1 if len > 0 => {
            let at = rand.below(len);
            input[at] = rand.next_u64() as u8;
        }
        // Add or subtract a little.
        2 if len > 0 => {
            let at = rand.below(len);
            let delta = 1 + rand.below(16) as u8;
            input[at] = if rand.one_in(2) {
                input[at].wrapping_add(delta)
            } else {
                input[at].wrapping_sub(delta)
            };
        }
        // A boundary value, 1, 2, 4 or 8 bytes wide, little-endian.
        3 if len > 0 => {
            let width = 1 << rand.below(4);
            let value = BOUNDARIES[rand.below(BOUNDARIES.len())];
            let value = if rand.one_in(4) {
                value.wrapping_neg()
            } else {
                value
            };
            let at = rand.below(len);
            let n = width.min(len - at);
            input[at..at + n].copy_from_slice(&value.to_le_bytes()[..n]);
        }
        // Insert random bytes.
        4 => {
            let mut bytes = vec![0; 1 + rand.below(16)];
            rand.fill(&mut bytes);
            let at = rand.below(len + 1);
            input.splice(at..at, bytes);
        }
        // Delete a range.
        5 if len > 0 => {
            let at = rand.below(len);
            let n = 1 + rand.below((len - at).min(64));
            input.drain(at..at + n);
        }
        // Copy a range of the input over or into another place of it.
        6 if len > 1 => {
            let from = rand.below(len);
            let n = 1 + rand.below((len - from).min(64));
            let piece = input[from..from + n].to_vec();
            let at = rand.below(len + 1);
            if rand.one_in(2) {
                input.splice(at..at, piece);
            } else {
                let n = n.min(len - at.min(len));
                input[at.min(len)..at.min(len) + n].copy_from_slice(&piece[..n]);
            }
        }
        // A piece of another input.
        7 if !other.is_empty() => {
            let from = rand.below(other.len());
            let n = 1 + rand.below((other.len() - from).min(256));
            let at = rand.below(len + 1);
            input.splice(at..at, other[from..from + n].iter().copied());
        }
        // The start of this input, then the rest of another one.
        8 if !other.is_empty() => {
            let keep = rand.below(len + 1);
            let from = rand.below(other.len());
            input.truncate(keep);
            input.extend_from_slice(&other[from..]);
        }
        // A token of the dictionary.
        9 if !dictionary.is_empty() => {
            let token = dictionary[rand.below(dictionary.len())];
            let at = rand.below(len + 1);
            if rand.one_in(2) || at + token.len() > len {
                input.splice(at..at, token.iter().copied());
            } else {
                input[at..at + token.len()].copy_from_slice(token);
            }
        }
        // Cut the end off.
        10 if len > 0 => input.truncate(rand.below(len)),
        // The chosen edit does not apply to this input: add a byte instead.
        _ => {
            let at = rand.below(len + 1);
            input.insert(at, rand.next_u64() as u8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_the_same_mutations() {
        let run = |seed| {
            let mut rand = Rand::seeded(seed);
            let mut input = b"hello, fuzzer".to_vec();
            for _ in 0..200 {
                mutate(&mut rand, &mut input, b"other", &[b".reg"], 64);
                assert!(input.len() <= 64);
            }
            input
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }
}
