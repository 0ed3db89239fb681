//! What this process gave out by IPC handle. The driver refuses to open its
//! own process's handles, yet in `shared` mode (and for a program's contexts
//! in one worker) exporter and opener are one process: there, opening a
//! handle is the very allocation or event it names.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use cumux_cuda_driver::Event;
use cumux_protocol::DevicePtr;

use crate::locking::lock;

type IpcHandle = [u8; 64];

/// Allocations by handle: (base, size).
static MEMORY: Mutex<Option<HashMap<IpcHandle, (DevicePtr, u64)>>> = Mutex::new(None);
/// Events by handle, as long as they live.
static EVENTS: Mutex<Option<HashMap<IpcHandle, Weak<Event>>>> = Mutex::new(None);

pub(super) fn note_memory(handle: IpcHandle, base: DevicePtr, size: u64) {
    lock(&MEMORY)
        .get_or_insert_with(HashMap::new)
        .insert(handle, (base, size));
}

/// The allocation this process gave `handle` out for, if any.
pub(super) fn memory(handle: &IpcHandle) -> Option<(DevicePtr, u64)> {
    lock(&MEMORY).as_ref()?.get(handle).copied()
}

/// Whether `base` is an allocation this process gave out (an opened alias
/// of it closes without the driver).
pub(super) fn is_memory(base: DevicePtr) -> bool {
    lock(&MEMORY)
        .as_ref()
        .is_some_and(|m| m.values().any(|&(b, _)| b == base))
}

/// The allocation at `base` is freed: its handles name nothing any more.
pub(super) fn forget_memory(base: DevicePtr) {
    if let Some(m) = lock(&MEMORY).as_mut() {
        m.retain(|_, &mut (b, _)| b != base);
    }
}

pub(super) fn note_event(handle: IpcHandle, event: &Arc<Event>) {
    let mut events = lock(&EVENTS);
    let events = events.get_or_insert_with(HashMap::new);
    events.retain(|_, e| e.strong_count() > 0);
    events.insert(handle, Arc::downgrade(event));
}

/// The live event this process gave `handle` out for, if any.
pub(super) fn event(handle: &IpcHandle) -> Option<Arc<Event>> {
    lock(&EVENTS).as_ref()?.get(handle)?.upgrade()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_found_until_freed() {
        let h = [7u8; 64];
        assert_eq!(memory(&h), None);
        note_memory(h, 0x7000, 4096);
        assert_eq!(memory(&h), Some((0x7000, 4096)));
        assert!(is_memory(0x7000));
        forget_memory(0x7000);
        assert_eq!(memory(&h), None);
        assert!(!is_memory(0x7000));
    }
}
