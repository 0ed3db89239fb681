//! The memory handles (`cuIpcGetMemHandle`) this server's sessions gave out:
//! a session opens only a handle the server issued to a session of its own
//! tenant, so a handle guessed, forged or taken from another tenant opens
//! nothing. The handle bytes are the device driver's own.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::locking::lock;

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
    /// Records that `session` of `tenant` gave out `handle`.
    pub fn issue(&self, handle: &[u8], tenant: &str, session: u64) {
        let export = Export {
            tenant: tenant.to_string(),
            session,
        };
        lock(&self.issued).insert(handle.to_vec(), export);
    }

    /// Whether a session of `tenant` may open `handle`.
    pub fn may_open(&self, handle: &[u8], tenant: &str) -> bool {
        lock(&self.issued)
            .get(handle)
            .is_some_and(|e| e.tenant == tenant)
    }

    /// Forgets the handles `session` gave out (it ended, and its memory with it).
    pub fn withdraw(&self, session: u64) {
        lock(&self.issued).retain(|_, e| e.session != session);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_issuing_tenant_opens_a_handle_while_its_session_lives() {
        let handles = IpcHandles::default();
        handles.issue(&[7; 64], "alice", 3);
        assert!(handles.may_open(&[7; 64], "alice"));
        assert!(!handles.may_open(&[7; 64], "bob"));
        assert!(!handles.may_open(&[8; 64], "alice"));
        handles.withdraw(3);
        assert!(!handles.may_open(&[7; 64], "alice"));
    }
}
