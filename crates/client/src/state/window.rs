//! The CPU device's address window: the client reserves it in the program's
//! address space at start, so a device pointer of the CPU device never
//! aliases host memory (and managed memory can be mapped there).

use std::sync::atomic::{AtomicBool, Ordering};

/// First device address the server hands out, and the end of its window.
pub const DEVICE_VA_BASE: u64 = 0x2000_0000_0000;
pub const DEVICE_VA_END: u64 = 0x3000_0000_0000;

static WINDOW_RESERVED: AtomicBool = AtomicBool::new(false);

/// Keeps host allocations out of the server's device window, so a pointer's
/// value alone says whether it is device or host memory.
pub(crate) fn reserve_device_window() {
    let len = (DEVICE_VA_END - DEVICE_VA_BASE) as usize;
    // SAFETY: mapping fresh anonymous PROT_NONE memory at a fixed address that
    // MAP_FIXED_NOREPLACE refuses to take if anything is mapped there already.
    let p = unsafe {
        libc::mmap(
            DEVICE_VA_BASE as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE
                | libc::MAP_ANONYMOUS
                | libc::MAP_NORESERVE
                | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED || p as u64 != DEVICE_VA_BASE {
        tracing::debug!("could not reserve the device address window");
    } else {
        WINDOW_RESERVED.store(true, Ordering::Relaxed);
    }
}

/// Whether this process holds the device address window (so managed
/// allocations can be mapped at their device addresses).
pub fn device_window_reserved() -> bool {
    WINDOW_RESERVED.load(Ordering::Relaxed)
}

/// Whether `p` lies in the CPU device's address window. Only the CPU device
/// hands out addresses there; a GPU's are wherever its driver put them, so
/// use `State::is_device_memory` to tell device from host pointers.
pub fn is_device_ptr(p: u64) -> bool {
    (DEVICE_VA_BASE..DEVICE_VA_END).contains(&p)
}
