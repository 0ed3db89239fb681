//! The C ABI's edge: `guard`, which every exported function runs its body in
//! (no panic unwinds across it; the logger is set up), and the helpers that
//! read the program's arguments and write its out-pointers.

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::errors::{self, *};
use crate::{logging, teardown};

/// The driver version cumux reports: CUDA 13.0.
pub const DRIVER_VERSION: i32 = 13000;

/// Runs an exported function's body: converts its `Result` into a `CUresult`
/// and keeps any panic from unwinding across the C ABI.
pub(crate) fn guard(name: &'static str, body: impl FnOnce() -> CuResult<()>) -> CUresult {
    logging::init();
    // Makes this thread's teardown marker at its first call.
    teardown::thread_ending();
    let _inside = crate::managed_guard::Inside::enter();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => {
            tracing::trace!("{name} -> CUDA_SUCCESS");
            CUDA_SUCCESS
        }
        Ok(Err(code)) => {
            tracing::debug!("{name} -> {}", errors::name(code));
            code
        }
        Err(_) => {
            tracing::error!("{name} panicked; returning CUDA_ERROR_UNKNOWN");
            CUDA_ERROR_UNKNOWN
        }
    }
}

/// Writes `value` through an out-pointer the program passed.
pub(crate) fn out<T>(ptr: *mut T, value: T) -> CuResult<()> {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the driver API contract makes it point to a T.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Writes through an optional out-pointer (null means "not wanted").
pub(crate) fn out_opt<T>(ptr: *mut T, value: T) {
    if !ptr.is_null() {
        // SAFETY: as in `out`.
        unsafe { ptr.write_unaligned(value) };
    }
}

/// `CUDA_ERROR_INVALID_VALUE` for a null pointer the program must pass.
pub(crate) fn non_null<T>(ptr: *const T) -> CuResult<()> {
    if ptr.is_null() {
        Err(CUDA_ERROR_INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// What another export returned, for an entry point that forwards to it.
pub(crate) fn forwarded(code: CUresult) -> CuResult<()> {
    match code {
        CUDA_SUCCESS => Ok(()),
        e => Err(e),
    }
}

/// Reads a struct the program passed by pointer.
pub(crate) fn read_in<'a, T>(ptr: *const T) -> CuResult<&'a T> {
    // SAFETY: the driver API contract makes a non-null pointer refer to a live T.
    unsafe { ptr.as_ref() }.ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// A NUL-terminated string argument.
pub(crate) fn c_str<'a>(ptr: *const c_char) -> CuResult<&'a str> {
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null and NUL-terminated per the API contract.
    unsafe { CStr::from_ptr(ptr) }
        .to_str()
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)
}

/// A host buffer argument of `len` bytes.
pub(crate) fn host_bytes<'a>(ptr: *const c_void, len: usize) -> CuResult<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the program promises `len` readable bytes at `ptr`.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// A writable host buffer argument of `len` bytes.
pub(crate) fn host_bytes_mut<'a>(ptr: *mut c_void, len: usize) -> CuResult<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if ptr.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the program promises `len` writable bytes at `ptr`.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), len) })
}

pub(crate) fn handle(h: *mut c_void) -> usize {
    h as usize
}

pub(crate) fn to_ptr(h: usize) -> *mut c_void {
    h as *mut c_void
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver call made after the thread's storage is torn down (as the
    /// CUDA runtime's `atexit` handler does) logs nothing and returns; it
    /// used to panic in the logger, outside `guard`'s catch, and abort.
    #[test]
    fn calls_after_thread_storage_is_gone_do_not_abort() {
        struct CallsOnDrop;
        impl Drop for CallsOnDrop {
            fn drop(&mut self) {
                assert!(teardown::thread_ending());
                let r = guard("late", || panic!("logged at error level"));
                assert_eq!(r, CUDA_ERROR_UNKNOWN);
            }
        }
        thread_local!(static LATE: CallsOnDrop = const { CallsOnDrop });
        std::thread::spawn(|| {
            // Registered first, so destroyed last: after the logger's
            // buffer and the teardown marker.
            LATE.with(|_| ());
            let r = guard("early", || panic!("logged at error level"));
            assert_eq!(r, CUDA_ERROR_UNKNOWN);
            assert!(!teardown::thread_ending());
        })
        .join()
        .unwrap();
    }

    /// A thread-local made between a thread's first driver call and its
    /// first logged event is torn down after the logger's buffer but before
    /// the marker of that first call; a driver call from its destructor that
    /// logs must not reach the torn-down buffer.
    #[test]
    fn calls_that_log_while_the_thread_ends_do_not_abort() {
        static RESULT: std::sync::Mutex<Option<CUresult>> = std::sync::Mutex::new(None);
        struct LogsOnDrop;
        impl Drop for LogsOnDrop {
            fn drop(&mut self) {
                let r = guard("late", || {
                    tracing::warn!("logged while the thread ends");
                    Err(CUDA_ERROR_DEINITIALIZED)
                });
                *RESULT.lock().unwrap() = Some(r);
            }
        }
        thread_local!(static BETWEEN: LogsOnDrop = const { LogsOnDrop });
        std::thread::spawn(|| {
            assert_eq!(guard("first", || Ok(())), CUDA_SUCCESS);
            BETWEEN.with(|_| ());
            let r = guard("logs", || {
                tracing::warn!("the thread's first event");
                Ok(())
            });
            assert_eq!(r, CUDA_SUCCESS);
        })
        .join()
        .unwrap();
        assert_eq!(*RESULT.lock().unwrap(), Some(CUDA_ERROR_DEINITIALIZED));
    }
}
