//! The C ABI's edge: `guard`, which every exported function runs its body in
//! (no panic unwinds across it; the logger is set up), and the helpers that
//! read the program's arguments and write its out-pointers.

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::errors::{self, *};

/// The driver version cumux reports: CUDA 13.0.
pub const DRIVER_VERSION: i32 = 13000;

/// Runs an exported function's body: converts its `Result` into a `CUresult`
/// and keeps any panic from unwinding across the C ABI.
pub(crate) fn guard(name: &'static str, body: impl FnOnce() -> CuResult<()>) -> CUresult {
    logging_init();
    thread_storage_alive();
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

/// Whether this thread's thread-local storage is still there. `exit`
/// destroys it before it runs `atexit` handlers, and the CUDA runtime's
/// handler unloads its modules through the driver then; the logger formats
/// in thread-local storage, so an event logged there panicked, outside
/// `guard`'s catch when `guard` itself logged, and aborted the program.
/// `guard` touches this on every call, so it exists (and is torn down) on
/// every thread that calls the driver.
fn thread_storage_alive() -> bool {
    struct Alive;
    impl Drop for Alive {
        fn drop(&mut self) {}
    }
    thread_local!(static ALIVE: Alive = const { Alive });
    ALIVE.try_with(|_| ()).is_ok()
}

/// Drops every event once this thread's storage is torn down (see
/// [`thread_storage_alive`]).
struct SkipWhenStorageGone;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SkipWhenStorageGone {
    fn event_enabled(
        &self,
        _event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        thread_storage_alive()
    }
}

/// Installs the stderr logger once; the level comes from `CUMUX_LOG` (default warn).
pub(crate) fn logging_init() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = std::env::var("CUMUX_LOG").unwrap_or_else(|_| "warn".into());
        let filter = tracing_subscriber::EnvFilter::try_new(&filter)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(false)
            .finish()
            .with(SkipWhenStorageGone)
            .try_init();
    });
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
                assert!(!thread_storage_alive());
                let r = guard("late", || panic!("logged at error level"));
                assert_eq!(r, CUDA_ERROR_UNKNOWN);
            }
        }
        thread_local!(static LATE: CallsOnDrop = const { CallsOnDrop });
        std::thread::spawn(|| {
            // Registered first, so destroyed last: after the logger's
            // buffer and `thread_storage_alive`'s marker.
            LATE.with(|_| ());
            let r = guard("early", || panic!("logged at error level"));
            assert_eq!(r, CUDA_ERROR_UNKNOWN);
            assert!(thread_storage_alive());
        })
        .join()
        .unwrap();
    }
}
