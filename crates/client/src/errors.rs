//! `CUresult` codes, their names and descriptions (for `cuGetErrorName` and
//! `cuGetErrorString`), and the client's error type.

use std::ffi::CStr;

pub type CUresult = u32;
/// What every client operation returns: `Err` carries the `CUresult`.
pub type CuResult<T> = Result<T, CUresult>;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_DEVICE_UNAVAILABLE: CUresult = 46;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NO_BINARY_FOR_GPU: CUresult = 209;
pub const CUDA_ERROR_INVALID_PTX: CUresult = 218;
pub const CUDA_ERROR_INVALID_SOURCE: CUresult = 300;
pub const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: CUresult = 701;
pub const CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED: CUresult = 712;
pub const CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: CUresult = 713;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// `(name, description)` of a code, or `None` for a code CUDA does not define.
pub fn lookup(code: CUresult) -> Option<(&'static CStr, &'static CStr)> {
    crate::entry_points::generated::ERRORS
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
