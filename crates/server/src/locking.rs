//! [`lock`] and the condition-variable waits [`wait`] and [`wait_timeout`]:
//! they take a mutex even when a thread panicked while holding it. Every lock
//! of this crate guards state that a panic cannot leave half-changed (it is
//! swapped or pushed whole), so the data is still good to use.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Locks `m`, taking it over from a holder that panicked.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits on `cv`, giving up `guard` meanwhile; the lock again, as [`lock`] takes it.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|p| p.into_inner())
}

/// [`wait`] for at most `timeout`.
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, timeout)
        .unwrap_or_else(|p| p.into_inner())
        .0
}
