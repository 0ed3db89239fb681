//! [`StdoutTap`]: the server's reader of a worker's stdout pipe, which carries
//! the context's device printf with a marker after each flushing call's output
//! ([`super::wire::marker_bytes`]); a reply names its marker, and the server
//! waits here until that marker has come through before it hands out the text
//! that came before it. Text belongs to the marker after it, so connections
//! that share one worker (`shared` mode) each get only their own calls' text.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::wire::{MARKER_PREFIX, NONCE_BYTES};
use crate::locking::{lock, wait_timeout};

/// How long a reply waits for its printf output to come through the pipe.
const MARKER_WAIT: Duration = Duration::from_secs(10);
/// Printf bytes kept per context between launches at most.
const STDOUT_CAP: usize = 64 << 20;

/// Printf text read from a worker's stdout, and the markers seen so far.
#[derive(Default)]
struct TapState {
    /// The text before each marker not yet handed out, by marker.
    marked: BTreeMap<u64, Vec<u8>>,
    /// Text after the latest marker: it belongs to the next one.
    loose: Vec<u8>,
    /// Bytes held in `marked` and `loose`.
    held: usize,
    seen: u64,
    eof: bool,
}

/// One worker's printf text read so far, and the markers it has passed.
#[derive(Default)]
pub struct StdoutTap {
    state: Mutex<TapState>,
    changed: Condvar,
}

impl StdoutTap {
    fn keep(state: &mut TapState, bytes: &[u8]) {
        let room = STDOUT_CAP.saturating_sub(state.held);
        if bytes.len() > room {
            tracing::warn!("worker printf output over {STDOUT_CAP} bytes dropped");
        }
        let kept = &bytes[..bytes.len().min(room)];
        state.loose.extend_from_slice(kept);
        state.held += kept.len();
    }

    /// Marker `seq` came: the loose text is its own.
    fn close_marker(state: &mut TapState, seq: u64) {
        let text = std::mem::take(&mut state.loose);
        state
            .marked
            .entry(seq)
            .or_default()
            .extend_from_slice(&text);
        state.seen = state.seen.max(seq);
    }

    /// Reads `pipe` to its end, splitting text from markers.
    pub fn read_all(&self, mut pipe: impl Read, nonce: [u8; NONCE_BYTES]) {
        let mut needle = MARKER_PREFIX.to_vec();
        needle.extend_from_slice(&nonce);
        let whole = needle.len() + 8;
        let mut pending: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let n = match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            pending.extend_from_slice(&chunk[..n]);
            let mut state = lock(&self.state);
            loop {
                match find(&pending, &needle) {
                    Some(at) if pending.len() >= at + whole => {
                        Self::keep(&mut state, &pending[..at]);
                        let mut seq = [0u8; 8];
                        seq.copy_from_slice(&pending[at + needle.len()..at + whole]);
                        Self::close_marker(&mut state, u64::from_le_bytes(seq));
                        pending.drain(..at + whole);
                    }
                    Some(at) => {
                        Self::keep(&mut state, &pending[..at]);
                        pending.drain(..at);
                        break;
                    }
                    None => {
                        // The tail may be the start of a marker: keep it back.
                        let cut = pending.len().saturating_sub(whole - 1);
                        Self::keep(&mut state, &pending[..cut]);
                        pending.drain(..cut);
                        break;
                    }
                }
            }
            drop(state);
            self.changed.notify_all();
        }
        let mut state = lock(&self.state);
        Self::keep(&mut state, &pending);
        state.eof = true;
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until marker `seq` has been read (or the pipe ended).
    pub fn wait_for(&self, seq: u64) {
        let deadline = Instant::now() + MARKER_WAIT;
        let mut state = lock(&self.state);
        while state.seen < seq && !state.eof {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(seq, "worker printf marker never came; output may be late");
                return;
            }
            state = wait_timeout(&self.changed, state, left);
        }
    }

    /// The text of `markers` (a connection's own, in order; drained), with
    /// what the worker printed after its last marker once its pipe has ended.
    pub fn take(&self, markers: &mut Vec<u64>) -> Vec<u8> {
        let mut state = lock(&self.state);
        let mut text = Vec::new();
        for seq in markers.drain(..) {
            if let Some(part) = state.marked.remove(&seq) {
                state.held -= part.len();
                text.extend_from_slice(&part);
            }
        }
        if state.eof {
            let rest = std::mem::take(&mut state.loose);
            state.held -= rest.len();
            text.extend_from_slice(&rest);
        }
        text
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::wire::{marker_bytes, new_nonce};

    #[test]
    fn the_tap_splits_text_from_markers_across_reads() {
        let nonce = new_nonce();
        let mut stream = b"hello ".to_vec();
        stream.extend(marker_bytes(&nonce, 1));
        stream.extend_from_slice(b"world\n");
        // A marker of another nonce is text.
        stream.extend(marker_bytes(&[0; NONCE_BYTES], 9));
        stream.extend(marker_bytes(&nonce, 2));
        stream.extend_from_slice(b"tail");
        /// Hands out one byte per read, so markers straddle reads.
        struct Trickle(Vec<u8>, usize);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.1 >= self.0.len() || buf.is_empty() {
                    return Ok(0);
                }
                buf[0] = self.0[self.1];
                self.1 += 1;
                Ok(1)
            }
        }
        let tap = StdoutTap::default();
        tap.read_all(Trickle(stream, 0), nonce);
        assert_eq!(lock(&tap.state).seen, 2);
        assert!(lock(&tap.state).eof);
        // Each marker's text is its own; the pipe has ended, so the text after
        // the last marker goes to whoever takes next.
        assert_eq!(tap.take(&mut vec![1]), b"hello tail");
        let mut want = b"world\n".to_vec();
        want.extend(marker_bytes(&[0; NONCE_BYTES], 9));
        assert_eq!(tap.take(&mut vec![2]), want);
        assert_eq!(lock(&tap.state).held, 0);
    }

    /// Two connections of one worker: each gets the text before its own
    /// markers, whichever of them takes first.
    #[test]
    fn connections_get_only_their_own_markers_text() {
        let nonce = new_nonce();
        let mut stream = b"a1 ".to_vec();
        stream.extend(marker_bytes(&nonce, 1));
        stream.extend_from_slice(b"b2 ");
        stream.extend(marker_bytes(&nonce, 2));
        stream.extend_from_slice(b"a3 ");
        stream.extend(marker_bytes(&nonce, 3));
        let tap = StdoutTap::default();
        tap.read_all(&stream[..], nonce);
        assert_eq!(tap.take(&mut vec![2]), b"b2 ");
        assert_eq!(tap.take(&mut vec![1, 3]), b"a1 a3 ");
    }
}
