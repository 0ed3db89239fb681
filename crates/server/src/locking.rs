//! [`lock`]: takes a mutex even when a thread panicked while holding it. Every
//! lock of this crate guards state that a panic cannot leave half-changed (it
//! is swapped or pushed whole), so the data is still good to use.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking it over from a holder that panicked.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
