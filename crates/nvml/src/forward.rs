//! The entry points of NVIDIA's NVML that cumux does not answer itself: each
//! jumps to NVIDIA's function once `fill` has found it, else says it cannot.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use crate::types::{NvmlReturn, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_UNINITIALIZED};

include!(concat!(env!("OUT_DIR"), "/forwarded.rs"));

/// Where each forwarded entry point goes (slots as in `FORWARDED`); null
/// while NVIDIA's NVML is not behind this one. The entry points read a slot
/// with a plain load, which an `AtomicPtr` is laid out for.
static FORWARD: [AtomicPtr<c_void>; FORWARDED.len()] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; FORWARDED.len()];

/// Whether the program has initialised NVML at least once.
static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// What a forwarded entry point answers when nothing stands behind it: the
/// program has not called `nvmlInit` yet, or this machine's NVML cannot answer
/// for the tenant's devices (there is none, or the devices are remote).
extern "C" fn absent() -> NvmlReturn {
    if INITIALIZED.load(Ordering::Relaxed) {
        NVML_ERROR_FUNCTION_NOT_FOUND
    } else {
        NVML_ERROR_UNINITIALIZED
    }
}

/// The program has initialised NVML.
pub fn mark_initialized() {
    INITIALIZED.store(true, Ordering::Relaxed);
}

/// Points every forwarded entry point at `lookup`'s function of that name
/// (or at none); returns how many were found.
pub fn fill(lookup: impl Fn(&str) -> Option<*mut c_void>) -> usize {
    let mut found = 0;
    for (slot, name) in FORWARD.iter().zip(FORWARDED) {
        let target = lookup(name).unwrap_or(std::ptr::null_mut());
        found += usize::from(!target.is_null());
        slot.store(target, Ordering::Release);
    }
    found
}

/// Forwards nothing: every forwarded entry point answers as `absent` does.
pub fn clear() {
    fill(|_| None);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for one of NVIDIA's entry points.
    extern "C" fn answer(a: u32, b: *mut u32) -> NvmlReturn {
        // SAFETY: the test passes a valid pointer.
        unsafe { *b = a * 2 };
        40
    }

    #[test]
    fn forwarded_calls_reach_the_function_found_with_their_arguments() {
        let name = "nvmlDeviceGetTemperature";
        let slot = FORWARDED.iter().position(|n| *n == name).unwrap();
        // SAFETY: every forwarded entry point takes the C ABI; this one is
        // called with the stand-in's signature.
        let entry: extern "C" fn(u32, *mut u32) -> NvmlReturn =
            unsafe { std::mem::transmute(nvmlDeviceGetTemperature as extern "C" fn()) };
        let mut out = 0;
        assert_eq!(entry(1, &mut out), absent());
        fill(|n| (n == name).then_some(answer as *mut c_void));
        assert!(!FORWARD[slot].load(Ordering::Relaxed).is_null());
        assert_eq!(entry(21, &mut out), 40);
        assert_eq!(out, 42);
        clear();
        assert_eq!(entry(21, &mut out), absent());
    }

    #[test]
    fn entry_points_answered_here_are_not_forwarded() {
        for ours in [
            "nvmlInit_v2",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetCount_v2",
        ] {
            assert!(!FORWARDED.contains(&ours), "{ours} is forwarded");
        }
        assert!(FORWARDED.contains(&"nvmlDeviceGetTemperature"));
        assert!(!FORWARDED.contains(&"nvmlInternalGetExportTable"));
    }
}
