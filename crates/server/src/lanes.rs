//! Which sessions take lanes (further TCP connections that carry a session's
//! large copies beside its first), under what key, and where a lane goes once it joins.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use cumux_protocol::{LaneJoin, LaneOffer};
use subtle::ConstantTimeEq;

use crate::locking::lock;

/// Lanes a session takes at most: more streams than this add no bandwidth
/// that one host's cores could fill.
pub const MOST_LANES: u32 = 16;

/// The sessions whose welcome offered lanes, until they end.
#[derive(Default)]
pub struct LaneRegistry {
    offered: Mutex<HashMap<u64, Offered>>,
    /// Bytes the lanes carried to the server, and from it.
    carried_in: AtomicU64,
    carried_out: Arc<AtomicU64>,
}

/// A lane's writing end, counting what it writes.
pub struct CountedWriter<W> {
    inner: W,
    count: Arc<AtomicU64>,
}

impl<W: Write> Write for CountedWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

struct Offered {
    key: [u8; 16],
    arrivals: Sender<JoinedLane>,
}

/// A lane that joined its session: what its connection reads, and its
/// writing end.
pub struct JoinedLane {
    /// Which of the session's lanes it is.
    pub index: u32,
    /// The bytes its connection read, in pieces (a buffer and how much of
    /// it holds bytes), in order; closed where the connection ended.
    pub pieces: Receiver<(Vec<u8>, usize)>,
    /// Where a piece's buffer goes back once read, to be filled again.
    pub spent: Sender<Vec<u8>>,
    pub writer: Box<dyn std::io::Write + Send>,
    /// Ends the lane's connection, both ways.
    pub close: Box<dyn Fn() + Send>,
}

/// A session's lanes as they join.
pub struct Arrivals {
    inbox: Receiver<JoinedLane>,
}

impl Arrivals {
    /// The next lane to join, waiting at most `patience`.
    pub fn next(&self, patience: std::time::Duration) -> Option<JoinedLane> {
        self.inbox.recv_timeout(patience).ok()
    }
}

impl LaneRegistry {
    /// Offers `session` lanes under a fresh random key; `None` where the
    /// system gave no random bytes (the session then has none).
    pub fn offer(&self, session: u64) -> Option<(LaneOffer, Arrivals)> {
        let mut key = [0u8; 16];
        getrandom::getrandom(&mut key)
            .map_err(|e| tracing::warn!(session, "no lanes: no random key: {e}"))
            .ok()?;
        let (arrivals, inbox) = channel();
        lock(&self.offered).insert(session, Offered { key, arrivals });
        let offer = LaneOffer {
            key,
            most: MOST_LANES,
        };
        Some((offer, Arrivals { inbox }))
    }

    /// Counts `n` bytes a lane's connection read.
    pub fn count_in(&self, n: usize) {
        self.carried_in.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// `writer`, counting what it writes among the bytes lanes carried out.
    pub fn counted<W: Write>(&self, writer: W) -> CountedWriter<W> {
        CountedWriter {
            inner: writer,
            count: Arc::clone(&self.carried_out),
        }
    }

    /// Bytes lanes carried to the server and from it, over its life.
    pub fn carried(&self) -> (u64, u64) {
        (
            self.carried_in.load(Ordering::Relaxed),
            self.carried_out.load(Ordering::Relaxed),
        )
    }

    /// Ends `session`'s offer: no lane joins it any more.
    pub fn withdraw(&self, session: u64) {
        lock(&self.offered).remove(&session);
    }

    /// Hands `lane` to the session `join` names, where its key is that
    /// session's and its index within the offer.
    pub fn join(&self, join: &LaneJoin, lane: JoinedLane) -> Result<(), Refused> {
        let offered = lock(&self.offered);
        let Some(entry) = offered.get(&join.session) else {
            return Err(Refused::NoSession);
        };
        if !bool::from(entry.key.ct_eq(&join.key)) || join.index >= MOST_LANES {
            return Err(Refused::WrongKey);
        }
        // Its connection ended a moment ago.
        entry.arrivals.send(lane).map_err(|_| Refused::NoSession)
    }
}

/// Why a lane did not join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No session takes lanes under that number: it ended (a short
    /// program's lanes may come after it), or never was.
    NoSession,
    /// The session's key is another, or the index past the offer: a guess.
    WrongKey,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn lane(index: u32) -> JoinedLane {
        let (_, pieces) = channel();
        let (spent, _) = channel();
        JoinedLane {
            index,
            pieces,
            spent,
            writer: Box::new(std::io::sink()),
            close: Box::new(|| {}),
        }
    }

    #[test]
    fn a_lane_joins_only_with_its_sessions_key_and_while_offered() {
        let registry = LaneRegistry::default();
        let (offer, arrivals) = registry.offer(7).expect("random bytes");
        let mut wrong = offer.key;
        wrong[3] ^= 1;
        let join = |session, key, index| LaneJoin {
            session,
            key,
            index,
        };
        let refused = |r: Result<(), Refused>| r.err();
        let wrong_key = registry.join(&join(7, wrong, 0), lane(0));
        assert_eq!(refused(wrong_key), Some(Refused::WrongKey));
        let no_session = registry.join(&join(8, offer.key, 0), lane(0));
        assert_eq!(refused(no_session), Some(Refused::NoSession));
        let past = join(7, offer.key, MOST_LANES);
        let past = registry.join(&past, lane(MOST_LANES));
        assert_eq!(refused(past), Some(Refused::WrongKey));
        assert!(arrivals.next(Duration::ZERO).is_none());
        assert!(registry.join(&join(7, offer.key, 1), lane(1)).is_ok());
        assert_eq!(arrivals.next(Duration::ZERO).map(|l| l.index), Some(1));
        // A session gone (its wire dropped, or its offer withdrawn) is no
        // guess: a short program's lanes may come after it ended.
        drop(arrivals);
        let gone = registry.join(&join(7, offer.key, 2), lane(2));
        assert_eq!(refused(gone), Some(Refused::NoSession));
        registry.withdraw(7);
        let gone = registry.join(&join(7, offer.key, 2), lane(2));
        assert_eq!(refused(gone), Some(Refused::NoSession));
    }
}
