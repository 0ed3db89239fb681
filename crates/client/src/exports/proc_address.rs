//! `cuGetProcAddress`: the address of every exported symbol, implemented or
//! stubbed, by the (name, CUDA version, per-thread flag) a runtime asks for
//! (see `crate::entry_points::resolve`).

use std::ffi::{c_char, c_void};

use super::symbols::symbol_address;
use crate::abi::{c_str, out, out_opt};
use crate::entry_points::{self, SymbolStatus};
use crate::errors::*;

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
        .and_then(|e| symbol_address(e.symbol).ok_or(SymbolStatus::SymbolNotFound));
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

driver_fn! {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_has_an_address() {
        for e in cumux_cuda_bindings::entry_points::ENTRY_POINTS {
            assert!(symbol_address(e.symbol).is_some(), "{}", e.symbol);
        }
    }
}
