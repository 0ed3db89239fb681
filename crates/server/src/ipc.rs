//! The memory and event handles (`cuIpcGetMemHandle`, `cuIpcGetEventHandle`)
//! this server's sessions gave out:
//! a session opens only a handle the server issued to a session of its own
//! tenant, so a handle guessed, forged or taken from another tenant opens
//! nothing. The handle bytes are the device driver's own.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::locking::lock;

/// What a handle names: device memory or an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpcKind {
    Memory,
    Event,
}

fn key(kind: IpcKind, handle: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(handle.len() + 1);
    key.push(kind as u8);
    key.extend_from_slice(handle);
    key
}

/// Who exported a handle.
struct Export {
    tenant: String,
    session: u64,
}

/// Every live handle, by its bytes.
#[derive(Default)]
pub struct IpcHandles {
    issued: Mutex<HashMap<Vec<u8>, Export>>,
}

impl IpcHandles {
    /// Records that `session` of `tenant` gave out `handle` of `kind`.
    pub fn issue(&self, kind: IpcKind, handle: &[u8], tenant: &str, session: u64) {
        let export = Export {
            tenant: tenant.to_string(),
            session,
        };
        lock(&self.issued).insert(key(kind, handle), export);
    }

    /// Whether a session of `tenant` may open `handle` as one of `kind`.
    pub fn may_open(&self, kind: IpcKind, handle: &[u8], tenant: &str) -> bool {
        lock(&self.issued)
            .get(&key(kind, handle))
            .is_some_and(|e| e.tenant == tenant)
    }

    /// Forgets the handles `session` gave out (it ended, and its memory with it).
    /// Whether `session` gave out a handle that is still valid.
    pub fn issued_by(&self, session: u64) -> bool {
        lock(&self.issued).values().any(|e| e.session == session)
    }

    pub fn withdraw(&self, session: u64) {
        lock(&self.issued).retain(|_, e| e.session != session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_issuing_tenant_opens_a_handle_while_its_session_lives() {
        use IpcKind::{Event, Memory};
        let handles = IpcHandles::default();
        handles.issue(Memory, &[7; 64], "alice", 3);
        assert!(handles.may_open(Memory, &[7; 64], "alice"));
        assert!(
            !handles.may_open(Event, &[7; 64], "alice"),
            "not an event's"
        );
        assert!(!handles.may_open(Memory, &[7; 64], "bob"));
        assert!(!handles.may_open(Memory, &[8; 64], "alice"));
        handles.withdraw(3);
        assert!(!handles.may_open(Memory, &[7; 64], "alice"));
    }
}
