//! The C types of the driver API that cross the ABI, laid out as cuda.h does.

use std::ffi::c_void;

pub type CUdevice = i32;
pub type CUdeviceptr = u64;
/// Every opaque handle (`CUcontext`, `CUmodule`, `CUstream` …) is a pointer
/// the client mints; it is never dereferenced.
pub type CuHandle = *mut c_void;

pub const CU_MEMORYTYPE_HOST: u32 = 1;
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;
pub const CU_MEMORYTYPE_ARRAY: u32 = 3;
pub const CU_MEMORYTYPE_UNIFIED: u32 = 4;

/// `CUDA_MEMCPY2D` (the `_v2` layout with `size_t` fields).
#[repr(C)]
pub struct CudaMemcpy2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

/// `CUDA_MEMCPY3D` (`_v2` layout).
#[repr(C)]
pub struct CudaMemcpy3D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

/// `CUlaunchAttribute`: an id and a 64-byte value union.
#[repr(C)]
pub struct CuLaunchAttribute {
    pub id: u32,
    pub pad: [u8; 4],
    pub value: [u8; 64],
}

/// `CUlaunchConfig`.
#[repr(C)]
pub struct CuLaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub stream: CuHandle,
    pub attrs: *mut CuLaunchAttribute,
    pub num_attrs: u32,
}

pub type CuHostFn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;
pub type CuStreamCallback =
    Option<unsafe extern "C" fn(stream: CuHandle, status: u32, user_data: *mut c_void)>;

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct CuUuid {
    pub bytes: [u8; 16],
}

/// `CUfunction_attribute` numbers.
pub mod func_attr {
    pub const MAX_THREADS_PER_BLOCK: i32 = 0;
    pub const SHARED_SIZE_BYTES: i32 = 1;
    pub const CONST_SIZE_BYTES: i32 = 2;
    pub const LOCAL_SIZE_BYTES: i32 = 3;
    pub const NUM_REGS: i32 = 4;
    pub const PTX_VERSION: i32 = 5;
    pub const BINARY_VERSION: i32 = 6;
    pub const CACHE_MODE_CA: i32 = 7;
    pub const MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
    pub const PREFERRED_SHARED_MEMORY_CARVEOUT: i32 = 9;
}

/// `CUdevice_attribute` numbers the client itself consults.
pub mod dev_attr {
    pub const MAX_THREADS_PER_BLOCK: u32 = 1;
    pub const MAX_BLOCK_DIM_X: u32 = 2;
    pub const MAX_BLOCK_DIM_Y: u32 = 3;
    pub const MAX_BLOCK_DIM_Z: u32 = 4;
    pub const MAX_GRID_DIM_X: u32 = 5;
    pub const MAX_GRID_DIM_Y: u32 = 6;
    pub const MAX_GRID_DIM_Z: u32 = 7;
    pub const MAX_SHARED_MEMORY_PER_BLOCK: u32 = 8;
    pub const COMPUTE_CAPABILITY_MAJOR: u32 = 75;
    pub const COMPUTE_CAPABILITY_MINOR: u32 = 76;
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: u32 = 97;
    pub const PCI_BUS_ID: u32 = 33;
    pub const PCI_DEVICE_ID: u32 = 34;
    pub const PCI_DOMAIN_ID: u32 = 50;
    /// One past the last attribute cuda.h 13.0 defines.
    pub const MAX: u32 = 148;
}
