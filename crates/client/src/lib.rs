//! cumux's client driver: a `libcuda.so.1` replacement. Every CUDA driver entry
//! point is exported here; implemented ones forward to a cumux server through
//! `cumux-protocol`, the rest are stubs that log once and return
//! `CUDA_ERROR_NOT_SUPPORTED`.
//!
//! Map: `exports/` is the C ABI (thin, one file per API area), `state` the
//! client's tables (contexts, modules, streams, allocations), `transport` the
//! connection (unix socket or TCP), `dark_api` the runtime's private export
//! tables (with `integrity`, the answer to the runtime's self-check),
//! `entry_points` the `cuGetProcAddress` table generated from the toolkit
//! headers by `gen/entry_points.py`, `host_fn` host functions in stream order,
//! `link` JIT linking and relocatable device code for the CPU device.
//!
//! Handles given to the program are minted here and never dereferenced;
//! device pointers are the server's, in a window the client reserves so no
//! host allocation can take those addresses. Stream-ordered calls go out
//! without waiting; errors they cause come back at the next synchronising
//! call.

pub mod dark_api;
pub mod entry_points;
pub mod errors;
pub mod exports;
pub mod graph;
pub mod host_fn;
pub mod integrity;
pub mod link;
pub mod managed;
pub mod mapped;
pub mod occupancy;
pub mod pinned;
pub mod staging;
pub mod state;
pub mod tools_context;
pub mod transport;
pub mod types;

use std::panic::{catch_unwind, AssertUnwindSafe};

use errors::{CUresult, CuResult, CUDA_ERROR_UNKNOWN, CUDA_SUCCESS};

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

/// Defines one exported stub per driver symbol cumux does not implement: it
/// says so on stderr the first time it is called and returns
/// `CUDA_ERROR_NOT_SUPPORTED`. Arguments are ignored, which the C calling
/// convention allows.
#[macro_export]
macro_rules! not_implemented_stubs {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            #[allow(non_snake_case)]
            pub extern "C" fn $name() -> $crate::errors::CUresult {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| $crate::errors::report_not_implemented(stringify!($name)));
                $crate::errors::CUDA_ERROR_NOT_SUPPORTED
            }
        )*
    };
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
