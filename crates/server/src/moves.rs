//! Orders to move, checkpoint or restore a session (issue 17), from an
//! admin's connection to the session's own thread, which carries them out at
//! its next call: the clean point where none of its calls is half done.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cumux_protocol::{codes, CuError};

use crate::locking::lock;

/// What a session is asked to do with its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Move to the server's device of this ordinal.
    MoveTo(u32),
    /// Write its state as a checkpoint stream into the file, else answer
    /// the stream's bytes.
    Checkpoint(Option<CheckpointFile>),
    /// Replace its state by this checkpoint's.
    Restore(Checkpoint),
    /// [`Action::Checkpoint`] taken at the start of its call, then hold that
    /// call until it is released ([`Orders::release`]).
    Hold(Option<CheckpointFile>),
}

/// A checkpoint file an admin's `cumux` opened and passed by its descriptor.
#[derive(Debug, Clone)]
pub struct CheckpointFile(pub Arc<std::fs::File>);

impl PartialEq for CheckpointFile {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CheckpointFile {}

/// A checkpoint stream to restore: its bytes, or the file holding them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkpoint {
    Bytes(Vec<u8>),
    File(CheckpointFile),
}

/// How a held session goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// With its held call, as if nothing happened.
    CarryOn,
    /// Its held call answered "moved to this server address", and it ends.
    MovedTo(String),
}

/// How long a session stays held at most, released or not: then it carries
/// on (its checkpoint is only a checkpoint).
pub const HOLD_LIMIT: Duration = Duration::from_secs(600);

/// Images a server keeps for programs to resume, at most.
pub const MAX_PARKED: usize = 1024;

/// A held checkpoint kept for the program that will resume it.
pub struct Parked {
    /// The session image, as its checkpoint stream.
    pub image: Vec<u8>,
    /// Its tenant: only the same tenant's program takes it.
    pub tenant: String,
}

impl Action {
    /// The kind of order, as metrics name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Action::MoveTo(_) => "move",
            Action::Checkpoint(_) => "checkpoint",
            Action::Restore(_) => "restore",
            Action::Hold(_) => "hold",
        }
    }

    fn describe(&self) -> String {
        match self {
            Action::MoveTo(device) => format!("move to device {device}"),
            Action::Checkpoint(_) => "checkpoint".into(),
            Action::Restore(_) => "restore".into(),
            Action::Hold(_) => "checkpoint and hold".into(),
        }
    }
}

/// An order and where its answer goes: what the session says it did (a
/// checkpoint's bytes, or a line), or why it did nothing.
pub struct Order {
    pub action: Action,
    pub answer: SyncSender<Result<Vec<u8>, CuError>>,
}

/// The orders waiting for their sessions' next call.
#[derive(Default)]
pub struct Orders {
    /// Whether any order waits: the check every call makes.
    any: AtomicBool,
    waiting: Mutex<HashMap<u64, Order>>,
    /// What each session with an order is at, for `cumux status`.
    notes: Mutex<HashMap<u64, String>>,
    /// Where to release each held session.
    holds: Mutex<HashMap<u64, SyncSender<Release>>>,
    /// Held checkpoints by resume key, for their programs to resume.
    parked: Mutex<HashMap<u64, Parked>>,
    /// Orders answered over the server's life, by kind and outcome.
    answered: Mutex<std::collections::BTreeMap<(&'static str, &'static str), u64>>,
}

impl Orders {
    /// Gives `session` `action` to do; refused if it has one waiting already.
    pub fn post(
        &self,
        session: u64,
        action: Action,
    ) -> Result<Receiver<Result<Vec<u8>, CuError>>, CuError> {
        let (answer, receiver) = sync_channel(1);
        let mut waiting = lock(&self.waiting);
        if waiting.contains_key(&session) {
            return Err(CuError::new(
                codes::NOT_READY,
                format!("session {session} has an order waiting already"),
            ));
        }
        self.note(
            session,
            format!("{}: waiting for its next call", action.describe()),
        );
        waiting.insert(session, Order { action, answer });
        self.any.store(true, Ordering::Release);
        Ok(receiver)
    }

    /// The order waiting for `session`, taken: the session carries it out.
    pub fn take(&self, session: u64) -> Option<Order> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut waiting = lock(&self.waiting);
        let order = waiting.remove(&session);
        self.any.store(!waiting.is_empty(), Ordering::Release);
        if let Some(order) = &order {
            self.note(
                session,
                format!("{}: draining its work", order.action.describe()),
            );
        }
        order
    }

    /// Says what `session`'s order is at (shown by `cumux status`).
    pub fn note(&self, session: u64, note: String) {
        lock(&self.notes).insert(session, note);
    }

    /// What `session`'s order is at, while it has one.
    pub fn noted(&self, session: u64) -> Option<String> {
        lock(&self.notes).get(&session).cloned()
    }

    /// Counts an order of `kind` answered, done (`ok`) or refused.
    pub fn count_answer(&self, kind: &'static str, ok: bool) {
        let outcome = if ok { "done" } else { "refused" };
        *lock(&self.answered).entry((kind, outcome)).or_default() += 1;
    }

    /// Orders answered so far: (kind, outcome, how many).
    pub fn answered(&self) -> Vec<(&'static str, &'static str, u64)> {
        lock(&self.answered)
            .iter()
            .map(|(&(kind, outcome), &n)| (kind, outcome, n))
            .collect()
    }

    /// `session`'s order is done (or withdrawn).
    pub fn done(&self, session: u64) {
        lock(&self.notes).remove(&session);
    }

    /// Whether `session` has an order waiting (not yet taken).
    pub fn is_waiting(&self, session: u64) -> bool {
        self.any.load(Ordering::Acquire) && lock(&self.waiting).contains_key(&session)
    }

    /// Waits up to `patience` for `session` to take and carry out its order;
    /// one not taken by then is withdrawn. One taken is waited for to its end
    /// (a session carries an order out in bounded time).
    pub fn wait(
        &self,
        session: u64,
        receiver: &Receiver<Result<Vec<u8>, CuError>>,
        patience: Duration,
    ) -> Result<Vec<u8>, CuError> {
        match receiver.recv_timeout(patience) {
            Ok(answer) => return answer,
            Err(RecvTimeoutError::Disconnected) => return Err(gone(session)),
            Err(RecvTimeoutError::Timeout) => {}
        }
        {
            let mut waiting = lock(&self.waiting);
            if waiting.remove(&session).is_some() {
                self.any.store(!waiting.is_empty(), Ordering::Release);
                self.done(session);
                return Err(CuError::new(
                    codes::NOT_READY,
                    format!(
                        "session {session} made no call within {:.0?}, so it was left as it is \
                         (a session is moved between two of its calls)",
                        patience
                    ),
                ));
            }
        }
        receiver.recv().unwrap_or_else(|_| Err(gone(session)))
    }

    /// `session` is held: what releases it comes through the receiver.
    pub fn hold(&self, session: u64) -> Receiver<Release> {
        let (release, receiver) = sync_channel(1);
        lock(&self.holds).insert(session, release);
        receiver
    }

    /// `session` is no longer held.
    pub fn unhold(&self, session: u64) {
        lock(&self.holds).remove(&session);
    }

    /// Releases a held session; refused if it is not held.
    pub fn release(&self, session: u64, how: Release) -> Result<(), CuError> {
        let held = lock(&self.holds).remove(&session);
        match held.map(|release| release.send(how)) {
            Some(Ok(())) => Ok(()),
            _ => Err(CuError::new(
                codes::INVALID_VALUE,
                format!("session {session} is not held (cumux checkpoint --hold holds one)"),
            )),
        }
    }

    /// Keeps a held checkpoint under its resume `key`.
    pub fn park(&self, key: u64, parked: Parked) -> Result<(), CuError> {
        let mut all = lock(&self.parked);
        if all.len() >= MAX_PARKED && !all.contains_key(&key) {
            return Err(CuError::new(
                codes::OUT_OF_MEMORY,
                format!("the server keeps {MAX_PARKED} checkpoints to resume already"),
            ));
        }
        all.insert(key, parked);
        Ok(())
    }

    /// The checkpoint parked under `key`, taken (a program resumes it once).
    pub fn unpark(&self, key: u64) -> Option<Parked> {
        lock(&self.parked).remove(&key)
    }

    /// Drops the order of a session that ended before taking it.
    pub fn forget(&self, session: u64) {
        if self.any.load(Ordering::Acquire) {
            let mut waiting = lock(&self.waiting);
            waiting.remove(&session);
            self.any.store(!waiting.is_empty(), Ordering::Release);
        }
        self.done(session);
    }
}

fn gone(session: u64) -> CuError {
    CuError::new(
        codes::INVALID_VALUE,
        format!("session {session} ended before it carried out the order"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_is_taken_once_and_withdrawn_when_nobody_takes_it() {
        let orders = Orders::default();
        let answer = orders.post(7, Action::MoveTo(1)).unwrap();
        assert!(orders
            .noted(7)
            .unwrap()
            .contains("waiting for its next call"));
        assert!(orders.post(7, Action::Checkpoint(None)).is_err());
        assert!(orders.take(8).is_none());
        let order = orders.take(7).unwrap();
        assert_eq!(order.action, Action::MoveTo(1));
        assert!(orders
            .noted(7)
            .unwrap()
            .contains("move to device 1: draining"));
        assert!(orders.take(7).is_none());
        order.answer.send(Ok(b"moved".to_vec())).unwrap();
        let said = orders.wait(7, &answer, Duration::from_secs(1)).unwrap();
        assert_eq!(said, b"moved");
        // Nobody takes it: withdrawn, with the reason.
        let answer = orders.post(9, Action::MoveTo(0)).unwrap();
        let e = orders
            .wait(9, &answer, Duration::from_millis(20))
            .unwrap_err();
        assert!(e.detail.contains("made no call"), "{e:?}");
        assert!(!orders.is_waiting(9));
        assert!(orders.noted(9).is_none());
    }
}
