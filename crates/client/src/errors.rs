//! The client's error type, and the `CUresult` codes (from the headers, through
//! `cumux-cuda-bindings`) with their names and descriptions (for
//! `cuGetErrorName` and `cuGetErrorString`).

use std::ffi::CStr;

pub use cumux_cuda_bindings::errors::*;
pub use cumux_cuda_bindings::types::CUresult;

/// What every client operation returns: `Err` carries the `CUresult`.
pub type CuResult<T> = Result<T, CUresult>;

/// `(name, description)` of a code, or `None` for a code CUDA does not define.
pub fn lookup(code: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    ERRORS
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, d)| (*n, *d))
}

/// The name of a code, for logs.
pub fn name(code: CUresult) -> String {
    match lookup(code) {
        Some((n, _)) => n.to_string_lossy().into_owned(),
        None => format!("CUresult({code})"),
    }
}

/// Said once per stubbed entry point, straight to stderr so it shows whatever
/// the log level.
pub fn report_not_implemented(symbol: &str) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "cumux: {symbol} is not implemented (CUDA_ERROR_NOT_SUPPORTED)"
    );
}
