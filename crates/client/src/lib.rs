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
pub mod occupancy;
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

/// Installs the stderr logger once; the level comes from `CUMUX_LOG` (default warn).
pub(crate) fn logging_init() {
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
