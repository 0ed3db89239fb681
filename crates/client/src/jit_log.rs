//! The JIT logs a program asks for in a module load's options
//! (`CU_JIT_ERROR_LOG_BUFFER`, `CU_JIT_INFO_LOG_BUFFER` and their sizes), filled as the driver fills them.

use std::ffi::c_void;

use cumux_cuda_bindings::consts::*;
use cumux_cuda_bindings::types::CUjit_option;

/// More options than CUDA defines: a count past it is not trusted.
const MAX_OPTIONS: usize = 64;

/// Writes `error` into the program's error log buffer (and nothing into its
/// info log), each NUL-terminated and cut to its buffer's size, and the bytes
/// written (without the NUL) into the size options, as the driver reports them.
pub(crate) fn fill(n: u32, opts: *const CUjit_option, vals: *mut *mut c_void, error: &str) {
    let n = n as usize;
    if n == 0 || n > MAX_OPTIONS || opts.is_null() || vals.is_null() {
        return;
    }
    // SAFETY: the program passes `n` options and `n` values (checked non-null
    // and bounded above); each is read or written once, in place.
    let (opts, vals) = unsafe {
        (
            std::slice::from_raw_parts(opts, n),
            std::slice::from_raw_parts_mut(vals, n),
        )
    };
    let slot = |option: u32| opts.iter().position(|o| *o == option);
    for (text, buffer, size) in [
        (
            error,
            CU_JIT_ERROR_LOG_BUFFER,
            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ),
        (
            "",
            CU_JIT_INFO_LOG_BUFFER,
            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        ),
    ] {
        let (Some(b), Some(s)) = (slot(buffer), slot(size)) else {
            continue;
        };
        let (ptr, capacity) = (vals[b].cast::<u8>(), vals[s] as usize);
        if ptr.is_null() || capacity == 0 {
            continue;
        }
        let bytes = &text.as_bytes()[..text.len().min(capacity - 1)];
        // SAFETY: the program gave a buffer of `capacity` bytes at `ptr`; at
        // most `capacity - 1` bytes and the NUL are written.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len());
            ptr.add(bytes.len()).write(0);
        }
        vals[s] = bytes.len() as *mut c_void;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_log_is_cut_to_its_buffer_and_its_length_reported() {
        let mut error = [0x7fu8; 8];
        let mut info = [0x7fu8; 4];
        let opts = [
            CU_JIT_ERROR_LOG_BUFFER,
            CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            CU_JIT_INFO_LOG_BUFFER,
            CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut vals: [*mut c_void; 4] = [
            error.as_mut_ptr().cast(),
            error.len() as *mut c_void,
            info.as_mut_ptr().cast(),
            info.len() as *mut c_void,
        ];
        fill(
            4,
            opts.as_ptr(),
            vals.as_mut_ptr(),
            "line 6: unknown instruction",
        );
        assert_eq!(&error, b"line 6:\0");
        assert_eq!(vals[1] as usize, 7);
        assert_eq!(info[0], 0);
        assert_eq!(vals[3] as usize, 0);
        // no options, or a count past any CUDA defines: nothing is touched
        fill(0, opts.as_ptr(), vals.as_mut_ptr(), "x");
        fill(1000, opts.as_ptr(), vals.as_mut_ptr(), "x");
        assert_eq!(&error, b"line 6:\0");
    }
}
