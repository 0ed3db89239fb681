//! NVML's return codes and the structures cumux's NVML fills in, laid out as
//! NVIDIA's `nvml.h` lays them out.

use std::ffi::{c_uint, c_ulonglong};

pub type NvmlReturn = c_uint;
pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: NvmlReturn = 13;
pub const NVML_ERROR_GPU_IS_LOST: NvmlReturn = 15;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2`: the structure's size and version 2, as NVML marks it.
pub const NVML_MEMORY_V2: c_uint = std::mem::size_of::<NvmlMemoryV2>() as c_uint | (2 << 24);

/// `nvmlUtilization_t`: percentages of the last sample period.
#[repr(C)]
pub struct NvmlUtilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlProcessInfo_t` (the `_v2` and `_v3` entry points share it).
#[repr(C)]
pub struct NvmlProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlProcessInfo_v1_t`, which the unversioned entry points fill.
#[repr(C)]
pub struct NvmlProcessInfoV1 {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
}

/// NVML's "no instance" id for processes outside MIG.
pub const NO_INSTANCE: c_uint = 0xFFFF_FFFF;
