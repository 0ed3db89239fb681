//! Initialisation, versions, error strings, profiler markers and the
//! runtime's private tables (`cuGetExportTable`).

use std::ffi::{c_char, c_void};

use super::*;
use cumux_cuda_bindings::types::CUuuid;

driver_fn! {
    fn cuInit(flags: u32) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        crate::state::init().map(|_| ())
    }

    fn cuDriverGetVersion(version: *mut i32) {
        out(version, DRIVER_VERSION)
    }

    fn cuGetErrorName(code: u32, name: *mut *const c_char) {
        let (n, _) = crate::errors::lookup(code).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(name, n.as_ptr())
    }

    fn cuGetErrorString(code: u32, text: *mut *const c_char) {
        let (_, d) = crate::errors::lookup(code).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(text, d.as_ptr())
    }

    // Profiler markers: nothing records a profile, so starting and stopping
    // one succeed and do nothing.
    fn cuProfilerStart() {
        crate::state::client().map(|_| ())
    }

    fn cuProfilerStop() {
        crate::state::client().map(|_| ())
    }

    // cudaProfiler.h (its `CUoutput_mode`) is not among the headers read:
    // no signature to check this one against.
    unchecked fn cuProfilerInitialize(_config: *const c_char, _output: *const c_char, _mode: u32) {
        crate::state::client().map(|_| ())
    }

    fn cuGetExportTable(table: *mut *const c_void, id: *const CUuuid) {
        let id = read_in(id)?.bytes.map(|b| b as u8);
        let found = crate::dark_api::export_table(&id);
        out(table, found.unwrap_or(std::ptr::null()))?;
        found.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }
}
