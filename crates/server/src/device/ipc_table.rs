//! Handles this server process gives out for what another context may open
//! (the CPU device's `cuIpc*` memory and events): 64 random bytes each, naming
//! the object without keeping it alive, so a handle of a freed one opens nothing.

use std::collections::HashMap;
use std::sync::{Mutex, Weak};

use cumux_protocol::{codes, CuError, IPC_HANDLE_BYTES};

use crate::locking::lock;

/// What a table holds: a weak name of an object, which may have gone.
pub trait WeakName: Clone {
    fn is_live(&self) -> bool;
}

impl<T> WeakName for Weak<T> {
    fn is_live(&self) -> bool {
        self.strong_count() > 0
    }
}

impl WeakName for cumux_ptx::SharedAllocation {
    fn is_live(&self) -> bool {
        cumux_ptx::SharedAllocation::is_live(self)
    }
}

/// Handles and what each names.
pub struct HandleTable<T> {
    entries: Mutex<HashMap<[u8; IPC_HANDLE_BYTES], T>>,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        HandleTable {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: WeakName> HandleTable<T> {
    /// A new handle naming `item` (the names of gone objects are dropped).
    pub fn issue(&self, item: T) -> Result<Vec<u8>, CuError> {
        let mut handle = [0u8; IPC_HANDLE_BYTES];
        getrandom::getrandom(&mut handle).map_err(|e| {
            CuError::new(codes::UNKNOWN, format!("no random bytes for a handle: {e}"))
        })?;
        let mut entries = lock(&self.entries);
        entries.retain(|_, item| item.is_live());
        entries.insert(handle, item);
        Ok(handle.to_vec())
    }

    /// What `handle` names, if it was issued here and its object lives.
    pub fn find(&self, handle: &[u8]) -> Option<T> {
        let key: [u8; IPC_HANDLE_BYTES] = handle.try_into().ok()?;
        lock(&self.entries)
            .get(&key)
            .filter(|item| item.is_live())
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_handle_names_its_object_while_it_lives() {
        let table = HandleTable::default();
        let object = Arc::new(5u32);
        let handle = table.issue(Arc::downgrade(&object)).unwrap();
        assert_eq!(handle.len(), IPC_HANDLE_BYTES);
        let found = table.find(&handle).and_then(|w| w.upgrade());
        assert_eq!(found.as_deref(), Some(&5));
        drop(found);
        let mut forged = handle.clone();
        forged[3] ^= 1;
        assert!(table.find(&forged).is_none());
        assert!(table.find(&handle[..32]).is_none());
        let other = table.issue(Arc::downgrade(&object)).unwrap();
        assert_ne!(other, handle, "random, not derived from the object");
        drop(object);
        assert!(table.find(&handle).is_none(), "its object is gone");
    }
}
