//! The flusher's side of a connection: its batch taken under the connection's
//! lock (never waiting for a thread that holds it) and written with it let go.

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::batch::{Flush, Flushing};
use super::{locked, Connection};

/// The flusher takes a batch through the connection's lock, never waiting
/// for it, and writes it ([`write_behind`]); a failure waits for the
/// connection's next call.
impl Flush for Mutex<Connection> {
    fn flush_if_due(&self) -> Flushing {
        let conn = match self.try_lock() {
            Ok(conn) => conn,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Flushing::Busy,
        };
        match conn.batch.due_at() {
            Some(at) if at > Instant::now() => Flushing::NotYet(at),
            Some(_) => {
                write_behind(conn);
                Flushing::Done
            }
            None => Flushing::Done,
        }
    }

    fn flush_now(&self) {
        match self.try_lock() {
            Ok(conn) => write_behind(conn),
            Err(std::sync::TryLockError::Poisoned(p)) => write_behind(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }
}

/// Takes `conn`'s batch and writes it with the connection's lock let go, so
/// that the program's thread encodes its next calls meanwhile; a failure
/// waits for the connection's next call. The wire's lock, taken before the
/// connection's is let go, keeps the batches in order: a thread that writes
/// next waits for it.
fn write_behind(mut conn: MutexGuard<'_, Connection>) {
    let wire = Arc::clone(&conn.wire);
    let mut wire = locked(&wire);
    let bytes = conn.batch.take();
    drop(conn);
    let written = wire
        .stream
        .write_all(&bytes)
        .and_then(|()| wire.stream.flush());
    if let Err(e) = written {
        wire.failed.get_or_insert(e.to_string());
    }
}
