//! The flusher's side of a connection: its batch written through the
//! connection's lock, never waiting for a thread that holds it.

use std::sync::Mutex;
use std::time::Instant;

use super::batch::{Flush, Flushing};
use super::Connection;

/// The flusher writes a batch through the connection's lock, never waiting
/// for it; a failure waits for the connection's next call.
impl Flush for Mutex<Connection> {
    fn flush_if_due(&self) -> Flushing {
        let mut conn = match self.try_lock() {
            Ok(conn) => conn,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Flushing::Busy,
        };
        match conn.batch.due_at() {
            Some(at) if at > Instant::now() => Flushing::NotYet(at),
            Some(_) => {
                conn.write_batch();
                Flushing::Done
            }
            None => Flushing::Done,
        }
    }

    fn flush_now(&self) {
        match self.try_lock() {
            Ok(mut conn) => conn.write_batch(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().write_batch(),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }
}

impl Connection {
    /// Writes the batch for the flusher, keeping a failure for the next call.
    fn write_batch(&mut self) {
        if let Err(e) = self.batch.flush(&mut self.stream) {
            self.flush_failed.get_or_insert(e.to_string());
        }
    }
}
