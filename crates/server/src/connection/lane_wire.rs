//! A session's lanes as its connection reads them: each lane's bytes as the
//! lane's own thread read them ahead, and the turn `Call::Lanes` gives them.

use std::io::{self, Read};
use std::sync::mpsc::{Receiver, Sender};

use crate::lanes::MOST_LANES;

/// Reads what a lane's connection read ahead (decrypted, on its own thread),
/// piece by piece; the end of the lane's connection is the end of its bytes.
pub(super) struct AheadReader {
    pieces: Receiver<(Vec<u8>, usize)>,
    spent: Sender<Vec<u8>>,
    current: Vec<u8>,
    len: usize,
    at: usize,
}

impl AheadReader {
    pub(super) fn new(pieces: Receiver<(Vec<u8>, usize)>, spent: Sender<Vec<u8>>) -> Self {
        AheadReader {
            pieces,
            spent,
            current: Vec::new(),
            len: 0,
            at: 0,
        }
    }
}

impl Read for AheadReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        while self.at == self.len {
            let done = std::mem::take(&mut self.current);
            if done.capacity() > 0 {
                // Gone where the lane's connection ended: nothing to fill.
                let _ = self.spent.send(done);
            }
            let Ok((piece, len)) = self.pieces.recv() else {
                return Ok(0);
            };
            self.len = len.min(piece.len());
            (self.current, self.at) = (piece, 0);
        }
        let n = out.len().min(self.len - self.at);
        out[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Where the next calls of a [`cumux_protocol::Call::Lanes`] go: `left`
/// calls, each on the next of lanes `0..lanes` in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LanePlan {
    left: u32,
    lanes: u32,
    next: u32,
    replies: bool,
}

/// Where one call of a plan travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LaneUse {
    /// The call's frame comes on this lane.
    Request(usize),
    /// The call comes on the connection, its reply goes on this lane.
    Reply(usize),
}

impl LanePlan {
    /// The plan of a `Call::Lanes`; `None` for no calls. `Err`: lanes the
    /// session cannot have.
    pub(super) fn new(count: u32, lanes: u32, replies: bool) -> Result<Option<LanePlan>, String> {
        if lanes == 0 || lanes > MOST_LANES {
            return Err(format!(
                "calls on {lanes} lanes (a session has 1 to {MOST_LANES})"
            ));
        }
        Ok((count > 0).then_some(LanePlan {
            left: count,
            lanes,
            next: 0,
            replies,
        }))
    }

    /// Where the next call goes, and whether calls are left after it.
    pub(super) fn take(&mut self) -> (LaneUse, bool) {
        let lane = self.next as usize;
        self.next = (self.next + 1) % self.lanes;
        self.left -= 1;
        let used = match self.replies {
            true => LaneUse::Reply(lane),
            false => LaneUse::Request(lane),
        };
        (used, self.left > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, sync_channel};

    #[test]
    fn a_plan_takes_its_lanes_in_turn_and_ends() {
        let mut plan = LanePlan::new(5, 2, false).unwrap().unwrap();
        let taken: Vec<_> = (0..5).map(|_| plan.take()).collect();
        assert_eq!(
            taken,
            [
                (LaneUse::Request(0), true),
                (LaneUse::Request(1), true),
                (LaneUse::Request(0), true),
                (LaneUse::Request(1), true),
                (LaneUse::Request(0), false),
            ]
        );
        let mut replies = LanePlan::new(1, 3, true).unwrap().unwrap();
        assert_eq!(replies.take(), (LaneUse::Reply(0), false));
        assert_eq!(LanePlan::new(0, 3, true), Ok(None));
        assert!(LanePlan::new(4, 0, false).is_err());
        assert!(LanePlan::new(4, MOST_LANES + 1, false).is_err());
    }

    #[test]
    fn an_ahead_reader_reads_its_pieces_in_order_and_returns_them() {
        let (pieces_to, pieces) = sync_channel(4);
        let (spent, spent_back) = channel();
        let mut reader = AheadReader::new(pieces, spent);
        pieces_to.send((b"abcdef".to_vec(), 4)).unwrap();
        pieces_to.send((b"xyz".to_vec(), 3)).unwrap();
        drop(pieces_to);
        let mut all = Vec::new();
        reader.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"abcdxyz");
        assert_eq!(spent_back.try_iter().count(), 2);
    }
}
