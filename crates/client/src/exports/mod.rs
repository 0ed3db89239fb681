//! The C ABI: one exported function per driver symbol. Bodies are thin; they
//! check and convert arguments and call into `state`. Every body runs inside
//! `guard`, so no panic crosses the ABI.

use std::ffi::{c_char, c_void, CStr};

use crate::errors::*;

/// Defines exported driver functions. `fn a | b (args) { body }` exports the
/// same body under each name (the `_ptds`/`_ptsz` forms share the legacy
/// form's signature). The body returns `CuResult<()>`.
macro_rules! driver_fn {
    () => {};
    (fn $name:ident $(| $alias:ident)* ($($sig:tt)*) $body:block $($rest:tt)*) => {
        driver_fn!(@def $name ($($sig)*) $body);
        driver_fn!(@aliases $name ($($sig)*) $($alias)*);
        driver_fn!($($rest)*);
    };
    (@def $name:ident ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        #[no_mangle]
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::errors::CUresult {
            $crate::guard(stringify!($name), move || $body)
        }
    };
    (@aliases $name:ident $sig:tt $($alias:ident)*) => {
        $( driver_fn!(@alias $name $alias $sig); )*
    };
    (@alias $name:ident $alias:ident ($($arg:ident: $ty:ty),* $(,)?)) => {
        #[no_mangle]
        #[allow(non_snake_case, clippy::missing_safety_doc)]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $crate::errors::CUresult {
            $name($($arg),*)
        }
    };
}

mod context;
mod cuda13x;
mod device;
mod graph;
mod init;
mod launch;
mod memory;
mod module;
mod stream;
mod stubs_generated;
mod tensor_map;

pub use context::*;
pub use cuda13x::*;
pub use device::*;
pub use graph::*;
pub use init::*;
pub use launch::*;
pub use memory::*;
pub use module::*;
pub use stream::*;
pub use stubs_generated::*;
pub use tensor_map::*;

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
