//! NVML's start, stop, error texts and versions. Versions are NVIDIA's where
//! its NVML stands behind (tools such as `nvidia-smi` check them against their
//! own), else cumux's.

use std::ffi::{c_char, c_int, c_uint, CStr};

use crate::state::{self, guard, nvidia_fn, out, out_str};
use crate::types::*;

/// The CUDA driver version cumux's client driver reports.
const CUDA_DRIVER_VERSION: c_int = 13000;

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard(|| state::init(0))
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    guard(|| state::init(0))
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(flags: c_uint) -> NvmlReturn {
    guard(|| state::init(flags))
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard(state::shutdown)
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let text: &'static CStr = match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
        NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

type TextFn = unsafe extern "C" fn(*mut c_char, c_uint) -> NvmlReturn;
type NumberFn = unsafe extern "C" fn(*mut c_int) -> NvmlReturn;

/// NVIDIA's answer to a version-text query where it stands behind, else `ours`.
fn text(name: &str, buf: *mut c_char, len: c_uint, ours: &str) -> NvmlReturn {
    // SAFETY: the version-text entry points all have `TextFn`'s type.
    match unsafe { nvidia_fn::<TextFn>(name) } {
        // SAFETY: the program's buffer and length, passed on.
        Some(f) => unsafe { f(buf, len) },
        None => guard(|| out_str(buf, len, ours)),
    }
}

/// NVIDIA's CUDA driver version where its NVML stands behind, else cumux's.
fn cuda_version(name: &str, version: *mut c_int) -> NvmlReturn {
    // SAFETY: both CUDA-version entry points have `NumberFn`'s type.
    match unsafe { nvidia_fn::<NumberFn>(name) } {
        // SAFETY: the program's pointer, passed on.
        Some(f) => unsafe { f(version) },
        None => guard(|| out(version, CUDA_DRIVER_VERSION)),
    }
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) -> NvmlReturn {
    let ours = concat!("cumux-", env!("CARGO_PKG_VERSION"));
    text("nvmlSystemGetDriverVersion", version, len, ours)
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, len: c_uint) -> NvmlReturn {
    text("nvmlSystemGetNVMLVersion", version, len, "13.0.cumux")
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> NvmlReturn {
    cuda_version("nvmlSystemGetCudaDriverVersion", version)
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    cuda_version("nvmlSystemGetCudaDriverVersion_v2", version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_before_init_say_uninitialized() {
        let mut count = 7;
        assert_eq!(
            crate::devices::nvmlDeviceGetCount_v2(&mut count),
            NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
        let mut buf = [0 as c_char; 4];
        assert_eq!(
            nvmlSystemGetNVMLVersion(buf.as_mut_ptr(), 4),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
    }
}
