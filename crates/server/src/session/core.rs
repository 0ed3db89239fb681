//! [`SessionCore`]: a session's sticky and fatal errors and its printf output,
//! and the small error helpers every part of the session uses.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use cumux_protocol::{codes, CuError, Handle};

use crate::device::ordering::append_printf;
use crate::status::SessionStats;
use crate::tenants::TenantCounters;

/// Printf output a session may hold before further output is dropped.
pub use crate::device::ordering::MAX_STDOUT_BYTES;

pub(super) use crate::locking::lock;

pub(super) fn err(code: u32, detail: impl Into<String>) -> CuError {
    CuError::new(code, detail)
}

/// Logs a device call that failed while a session let go of what it held:
/// an error, unless the context itself is gone (a fatal code: its memory
/// went with it, as after a hang-up stopped its worker), then a debug line.
pub(super) fn release_failed(session: u64, what: std::fmt::Arguments<'_>, e: &CuError) {
    match codes::is_fatal(e.code) {
        true => tracing::debug!(session, %e, "{what} failed with its context gone"),
        false => tracing::error!(session, %e, "{what} failed"),
    }
}

pub(super) fn invalid_handle(what: &str, h: Handle) -> CuError {
    err(
        codes::INVALID_HANDLE,
        format!("unknown {what} handle {h:#x}"),
    )
}

/// A session's errors and output, as its calls meet them.
pub struct SessionCore {
    pub id: u64,
    /// A fatal fault: the context is unusable; never cleared.
    fatal: Mutex<Option<CuError>>,
    /// A failure of stream-ordered work, returned by the next synchronizing call.
    sticky: Mutex<Option<CuError>>,
    stdout: Mutex<Vec<u8>>,
    pub stats: Arc<SessionStats>,
    /// The tenant's counters: a fatal fault counts there once per session.
    counters: Option<Arc<TenantCounters>>,
}

impl SessionCore {
    pub fn new(id: u64, stats: Arc<SessionStats>, counters: Option<Arc<TenantCounters>>) -> Self {
        SessionCore {
            id,
            fatal: Mutex::new(None),
            sticky: Mutex::new(None),
            stdout: Mutex::new(Vec::new()),
            stats,
            counters,
        }
    }

    pub fn fatal(&self) -> Option<CuError> {
        lock(&self.fatal).clone()
    }

    /// Records a failure of stream-ordered work: fatal codes poison the context.
    pub fn fail(&self, err: CuError) {
        if codes::is_fatal(err.code) {
            tracing::warn!(session = self.id, %err, "fatal device error: the context is now unusable");
            let mut fatal = lock(&self.fatal);
            if let (None, Some(counters)) = (&*fatal, &self.counters) {
                counters.faults.fetch_add(1, Ordering::Relaxed);
            }
            fatal.get_or_insert(err);
        } else {
            tracing::debug!(session = self.id, %err, "stream-ordered call failed");
            lock(&self.sticky).get_or_insert(err);
        }
    }

    /// The error a synchronizing call returns: the fatal one, else the sticky one (cleared).
    pub fn take_error(&self) -> Option<CuError> {
        self.fatal().or_else(|| lock(&self.sticky).take())
    }

    /// Whether a synchronizing call would return something now: a failure
    /// or printf text. A client's mark is left out then (`Call::Mark`).
    pub fn holds_news(&self) -> bool {
        lock(&self.fatal).is_some()
            || lock(&self.sticky).is_some()
            || !lock(&self.stdout).is_empty()
    }

    pub fn append_stdout(&self, bytes: &[u8]) {
        if !append_printf(&mut lock(&self.stdout), bytes) {
            tracing::warn!(
                session = self.id,
                "device printf output over {MAX_STDOUT_BYTES} bytes dropped"
            );
        }
    }

    pub fn take_stdout(&self) -> Vec<u8> {
        std::mem::take(&mut *lock(&self.stdout))
    }
}
