//! Initialisation, versions, error strings and the two ways the runtime finds
//! entry points: `cuGetProcAddress` and `cuGetExportTable`.

use std::ffi::{c_char, c_void};

use super::*;
use crate::entry_points::{self, SymbolStatus};
use crate::types::CuUuid;

/// The driver version cumux reports: CUDA 13.0.
pub const DRIVER_VERSION: i32 = 13000;

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

    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: i32, flags: u64) {
        proc_address(symbol, pfn, version, flags, std::ptr::null_mut())
    }

    fn cuGetProcAddress_v2(
        symbol: *const c_char,
        pfn: *mut *mut c_void,
        version: i32,
        flags: u64,
        status: *mut u32
    ) {
        proc_address(symbol, pfn, version, flags, status)
    }

    // Profiler markers: nothing records a profile, so starting and stopping
    // one succeed and do nothing.
    fn cuProfilerStart() {
        crate::state::client().map(|_| ())
    }

    fn cuProfilerStop() {
        crate::state::client().map(|_| ())
    }

    fn cuProfilerInitialize(_config: *const c_char, _output: *const c_char, _mode: u32) {
        crate::state::client().map(|_| ())
    }

    fn cuGetExportTable(table: *mut *const c_void, id: *const CuUuid) {
        let id = read_in(id)?;
        let found = crate::dark_api::export_table(&id.bytes);
        out(table, found.unwrap_or(std::ptr::null()))?;
        found.map(|_| ()).ok_or(CUDA_ERROR_INVALID_VALUE)
    }
}

fn proc_address(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut u32,
) -> CuResult<()> {
    let name = c_str(symbol)?;
    if pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let found = entry_points::resolve(name, version, flags)
        .and_then(|e| entry_points::symbol_address(e.symbol).ok_or(SymbolStatus::SymbolNotFound));
    match found {
        Ok(f) => {
            tracing::debug!("cuGetProcAddress({name}, {version}, {flags}) found");
            out(pfn, f as *mut c_void)?;
            out_opt(status, SymbolStatus::Success as u32);
            Ok(())
        }
        Err(s) => {
            tracing::debug!("cuGetProcAddress({name}, {version}, {flags}) -> {s:?}");
            out(pfn, std::ptr::null_mut())?;
            out_opt(status, s as u32);
            Err(CUDA_ERROR_NOT_FOUND)
        }
    }
}
