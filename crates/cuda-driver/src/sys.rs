//! The raw driver ABI this crate uses: handle types, the few constants it needs
//! and the table of entry points, each resolved by its exact versioned name
//! (the `_v2` forms where `cuda.h` maps the plain name to one).

use std::ffi::{c_char, c_int, c_uint, c_void};

use libloading::Library;

pub type CUresult = c_uint;
pub type CUdevice = c_int;
pub type CUdeviceptr = u64;

/// Declares each `HANDLE = TAG`: an opaque driver object `TAG`, only ever
/// seen through pointers, and `HANDLE`, a pointer to one.
macro_rules! opaque_handles {
    ($($handle:ident = $tag:ident;)*) => {
        $(
            #[repr(C)]
            pub struct $tag {
                _private: [u8; 0],
            }
            pub type $handle = *mut $tag;
        )*
    };
}

opaque_handles! {
    CUcontext = CUctx_st;
    CUstream = CUstream_st;
    CUevent = CUevent_st;
    CUmodule = CUmod_st;
    CUfunction = CUfunc_st;
    CUgraph = CUgraph_st;
    CUgraphExec = CUgraphExec_st;
    CUgreenCtx = CUgreenCtx_st;
    CUdevResourceDesc = CUdevResourceDesc_st;
}

/// `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: only this thread's unsafe calls end a capture.
pub const CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: c_uint = 1;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUipcMemHandle {
    pub reserved: [u8; 64],
}

/// `CU_MEM_ALLOCATION_COMP_GENERIC`: compressible memory.
pub const CU_MEM_ALLOCATION_COMP_GENERIC: u8 = 1;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
pub const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_uint = 1;

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`.
pub const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// `CUuuid`: 16 bytes.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CUuuid {
    pub bytes: [c_char; 16],
}

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NO_DEVICE: CUresult = 100;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
pub const CUDA_ERROR_INVALID_CONTEXT: CUresult = 201;
pub const CUDA_ERROR_NO_BINARY_FOR_GPU: CUresult = 209;
pub const CUDA_ERROR_INVALID_PTX: CUresult = 218;
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
pub const CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED: CUresult = 704;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_NOT_READY: CUresult = 600;
pub const CUDA_ERROR_ILLEGAL_ADDRESS: CUresult = 700;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

/// `CU_LAUNCH_PARAM_*` markers of `cuLaunchKernel`'s `extra` array.
pub const CU_LAUNCH_PARAM_END: usize = 0x00;

/// `CUlaunchAttribute`: an id, padding, and a 64-byte value union.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: c_uint,
    pub pad: [u8; 4],
    pub value: [u32; 16],
}

/// `CUlaunchConfig` (56 bytes): geometry, stream and attributes.
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid_dim: [c_uint; 3],
    pub block_dim: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub num_attrs: c_uint,
}
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;

/// `CUdevice_attribute` values this crate names.
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: c_int = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: c_int = 34;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: c_int = 50;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;

/// `CUjit_option` values: the JIT's error log buffer and its size.
pub const CU_JIT_ERROR_LOG_BUFFER: c_int = 5;
pub const CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES: c_int = 6;

/// `CUfunction_attribute` values.
pub const CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: c_int = 0;
pub const CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: c_int = 1;
pub const CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: c_int = 2;
pub const CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: c_int = 3;
pub const CU_FUNC_ATTRIBUTE_NUM_REGS: c_int = 4;
pub const CU_FUNC_ATTRIBUTE_PTX_VERSION: c_int = 5;
pub const CU_FUNC_ATTRIBUTE_BINARY_VERSION: c_int = 6;
pub const CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;

/// `CU_STREAM_NON_BLOCKING`: no implicit synchronization with the null stream.
pub const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_DISABLE_TIMING`.
pub const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
/// `CU_MEMHOSTALLOC_PORTABLE`: allocated pinned memory every context of the
/// process counts as pinned.
pub const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x1;
/// `CU_MEMHOSTREGISTER_PORTABLE`: registered host memory every context of the
/// process counts as pinned (and, with `DEVICEMAP`, reaches).
pub const CU_MEMHOSTREGISTER_PORTABLE: c_uint = 0x1;
/// `CU_MEMHOSTREGISTER_DEVICEMAP`: registered host memory the device can address.
pub const CU_MEMHOSTREGISTER_DEVICEMAP: c_uint = 0x2;
/// `CU_CTX_SCHED_BLOCKING_SYNC`: a synchronizing thread sleeps instead of spinning.
pub const CU_CTX_SCHED_BLOCKING_SYNC: c_uint = 0x4;

/// `CUmemLocation`: where memory is (`CU_MEM_LOCATION_TYPE_DEVICE` and an ordinal).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CUmemLocation {
    pub kind: c_uint,
    pub id: c_int,
}

/// `CUmemAllocationProp` (32 bytes): what `cuMemCreate` makes.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAllocationProp {
    pub kind: c_uint,
    pub requested_handle_types: c_uint,
    pub location: CUmemLocation,
    pub win32_handle_meta_data: *mut c_void,
    pub compression_type: u8,
    pub gpu_direct_rdma_capable: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// `CUmemAccessDesc` (12 bytes): a location's access to a mapped range.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_uint,
}

/// `CUmemGenericAllocationHandle`.
pub type CUmemGenericAllocationHandle = u64;
/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 1;
/// `CU_MEM_ALLOC_GRANULARITY_MINIMUM` / `_RECOMMENDED`.
pub const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0;
pub const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_uint = 1;

/// `CUDA_ARRAY3D_DESCRIPTOR` (40 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: c_uint,
    pub num_channels: c_uint,
    pub flags: c_uint,
}

/// `CUmemorytype` values of a copy's ends.
pub const CU_MEMORYTYPE_HOST: c_uint = 1;
pub const CU_MEMORYTYPE_DEVICE: c_uint = 2;
pub const CU_MEMORYTYPE_ARRAY: c_uint = 3;

/// `CUDA_MEMCPY3D` (200 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUDA_MEMCPY3D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: c_uint,
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
    pub dst_memory_type: c_uint,
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

/// `CUresourcetype` values.
pub const CU_RESOURCE_TYPE_ARRAY: c_uint = 0;
pub const CU_RESOURCE_TYPE_MIPMAPPED_ARRAY: c_uint = 1;
pub const CU_RESOURCE_TYPE_LINEAR: c_uint = 2;
pub const CU_RESOURCE_TYPE_PITCH2D: c_uint = 3;

/// `CUDA_RESOURCE_DESC` (144 bytes): the type, its union as eight-byte
/// words (a handle or pointer first; format and channels share word 1),
/// and flags.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CUDA_RESOURCE_DESC {
    pub res_type: c_uint,
    pub res: [u64; 16],
    pub flags: c_uint,
}

/// `CUDA_TEXTURE_DESC` (104 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CUDA_TEXTURE_DESC {
    pub address_mode: [c_uint; 3],
    pub filter_mode: c_uint,
    pub flags: c_uint,
    pub max_anisotropy: c_uint,
    pub mipmap_filter_mode: c_uint,
    pub mipmap_level_bias: f32,
    pub min_mipmap_level_clamp: f32,
    pub max_mipmap_level_clamp: f32,
    pub border_color: [f32; 4],
    pub reserved: [c_int; 12],
}

/// `CUDA_RESOURCE_VIEW_DESC` (112 bytes).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct CUDA_RESOURCE_VIEW_DESC {
    pub format: c_uint,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub first_mipmap_level: c_uint,
    pub last_mipmap_level: c_uint,
    pub first_layer: c_uint,
    pub last_layer: c_uint,
    pub reserved: [c_uint; 16],
}

const _: () = assert!(std::mem::size_of::<CUDA_ARRAY3D_DESCRIPTOR>() == 40);
const _: () = assert!(std::mem::size_of::<CUDA_MEMCPY3D>() == 200);
const _: () = assert!(std::mem::size_of::<CUDA_RESOURCE_DESC>() == 144);
const _: () = assert!(std::mem::size_of::<CUDA_TEXTURE_DESC>() == 104);
const _: () = assert!(std::mem::size_of::<CUDA_RESOURCE_VIEW_DESC>() == 112);

/// Declares [`Api`]: one optional fn pointer per entry point, resolved from the
/// first name in its list that the library exports.
macro_rules! driver_api {
    ($( $field:ident [$($sym:literal),+] ($($arg:ty),*); )*) => {
        /// The entry points of a loaded `libcuda.so.1`. A `None` is a symbol this
        /// library lacks (an older driver); calls through it fail with
        /// `CUDA_ERROR_NOT_SUPPORTED` instead of crashing.
        #[allow(non_snake_case)]
        pub struct Api {
            $( pub $field: Option<unsafe extern "C" fn($($arg),*) -> CUresult>, )*
        }

        impl Api {
            pub(crate) fn resolve(lib: &Library) -> Api {
                Api {
                    $( $field: [$($sym),+].into_iter().find_map(|name| {
                        // SAFETY: the fn type is the prototype `cuda.h` gives this
                        // exact (versioned) symbol name; the pointer is only used
                        // while `lib` stays loaded (the `Driver` owns both).
                        unsafe { lookup::<unsafe extern "C" fn($($arg),*) -> CUresult>(lib, name) }
                    }), )*
                }
            }
        }
    };
}

/// The symbol `name` of `lib` as a `T`.
///
/// # Safety
/// `T` must be the symbol's real type (a fn pointer of its C prototype).
pub(crate) unsafe fn lookup<T: Copy>(lib: &Library, name: &str) -> Option<T> {
    let mut bytes = Vec::with_capacity(name.len() + 1);
    bytes.extend_from_slice(name.as_bytes());
    bytes.push(0);
    // SAFETY: the caller vouches for `T`; the NUL-terminated name is ours.
    unsafe { lib.get::<T>(&bytes).ok().map(|sym| *sym) }
}

type Ptr = *mut c_void;
type CPtr = *const c_void;

driver_api! {
    cuInit ["cuInit"] (c_uint);
    cuDriverGetVersion ["cuDriverGetVersion"] (*mut c_int);
    cuGetErrorName ["cuGetErrorName"] (CUresult, *mut *const c_char);
    cuGetErrorString ["cuGetErrorString"] (CUresult, *mut *const c_char);

    cuDeviceGetCount ["cuDeviceGetCount"] (*mut c_int);
    cuDeviceGet ["cuDeviceGet"] (*mut CUdevice, c_int);
    cuDeviceGetName ["cuDeviceGetName"] (*mut c_char, c_int, CUdevice);
    cuDeviceGetUuid ["cuDeviceGetUuid_v2", "cuDeviceGetUuid"] (*mut CUuuid, CUdevice);
    cuDeviceTotalMem ["cuDeviceTotalMem_v2"] (*mut usize, CUdevice);
    cuDeviceGetAttribute ["cuDeviceGetAttribute"] (*mut c_int, c_int, CUdevice);
    cuDeviceCanAccessPeer ["cuDeviceCanAccessPeer"] (*mut c_int, CUdevice, CUdevice);
    cuDeviceGetP2PAttribute ["cuDeviceGetP2PAttribute"] (*mut c_int, c_int, CUdevice, CUdevice);
    cuCtxEnablePeerAccess ["cuCtxEnablePeerAccess"] (CUcontext, c_uint);
    cuCtxDisablePeerAccess ["cuCtxDisablePeerAccess"] (CUcontext);

    cuDevicePrimaryCtxRetain ["cuDevicePrimaryCtxRetain"] (*mut CUcontext, CUdevice);
    cuDevicePrimaryCtxRelease ["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"] (CUdevice);
    cuCtxCreate ["cuCtxCreate_v2"] (*mut CUcontext, c_uint, CUdevice);
    // CUDA 13's form; a null `CUctxCreateParams*` makes it the `_v2` call.
    cuCtxCreate_v4 ["cuCtxCreate_v4"] (*mut CUcontext, *mut c_void, c_uint, CUdevice);
    cuCtxDestroy ["cuCtxDestroy_v2"] (CUcontext);
    // Green contexts (`green`): the `CUdevResource` arguments are its bytes.
    cuDeviceGetDevResource ["cuDeviceGetDevResource"] (CUdevice, Ptr, c_int);
    cuDevSmResourceSplitByCount ["cuDevSmResourceSplitByCount"] (Ptr, *mut c_uint, CPtr, Ptr, c_uint, c_uint);
    cuDevResourceGenerateDesc ["cuDevResourceGenerateDesc"] (*mut CUdevResourceDesc, Ptr, c_uint);
    cuGreenCtxCreate ["cuGreenCtxCreate"] (*mut CUgreenCtx, CUdevResourceDesc, CUdevice, c_uint);
    cuGreenCtxDestroy ["cuGreenCtxDestroy"] (CUgreenCtx);
    cuCtxFromGreenCtx ["cuCtxFromGreenCtx"] (*mut CUcontext, CUgreenCtx);
    cuCtxSetCurrent ["cuCtxSetCurrent"] (CUcontext);
    cuCtxGetCurrent ["cuCtxGetCurrent"] (*mut CUcontext);
    cuCtxSynchronize ["cuCtxSynchronize"] ();
    cuCtxGetLimit ["cuCtxGetLimit"] (*mut usize, c_uint);
    cuCtxSetLimit ["cuCtxSetLimit"] (c_uint, usize);

    cuStreamCreateWithPriority ["cuStreamCreateWithPriority"] (*mut CUstream, c_uint, c_int);
    cuStreamDestroy ["cuStreamDestroy_v2"] (CUstream);
    cuStreamSynchronize ["cuStreamSynchronize"] (CUstream);
    cuStreamQuery ["cuStreamQuery"] (CUstream);
    cuStreamWaitEvent ["cuStreamWaitEvent"] (CUstream, CUevent, c_uint);

    cuEventCreate ["cuEventCreate"] (*mut CUevent, c_uint);
    cuEventRecord ["cuEventRecord"] (CUevent, CUstream);
    cuEventQuery ["cuEventQuery"] (CUevent);
    cuEventSynchronize ["cuEventSynchronize"] (CUevent);
    cuEventElapsedTime ["cuEventElapsedTime", "cuEventElapsedTime_v2"] (*mut f32, CUevent, CUevent);
    cuEventDestroy ["cuEventDestroy_v2"] (CUevent);

    cuMemAlloc ["cuMemAlloc_v2"] (*mut CUdeviceptr, usize);
    cuMemFree ["cuMemFree_v2"] (CUdeviceptr);
    cuMemGetInfo ["cuMemGetInfo_v2"] (*mut usize, *mut usize);
    cuMemGetAddressRange ["cuMemGetAddressRange_v2"] (*mut CUdeviceptr, *mut usize, CUdeviceptr);
    cuMemHostAlloc ["cuMemHostAlloc"] (*mut Ptr, usize, c_uint);
    cuMemFreeHost ["cuMemFreeHost"] (Ptr);
    cuMemHostRegister ["cuMemHostRegister_v2", "cuMemHostRegister"] (Ptr, usize, c_uint);
    cuMemHostUnregister ["cuMemHostUnregister"] (Ptr);
    cuMemcpyHtoDAsync ["cuMemcpyHtoDAsync_v2"] (CUdeviceptr, CPtr, usize, CUstream);
    cuMemcpyDtoHAsync ["cuMemcpyDtoHAsync_v2"] (Ptr, CUdeviceptr, usize, CUstream);
    cuMemcpyDtoDAsync ["cuMemcpyDtoDAsync_v2"] (CUdeviceptr, CUdeviceptr, usize, CUstream);
    cuMemsetD8 ["cuMemsetD8_v2"] (CUdeviceptr, u8, usize);
    cuMemsetD16 ["cuMemsetD16_v2"] (CUdeviceptr, u16, usize);
    cuMemsetD32 ["cuMemsetD32_v2"] (CUdeviceptr, u32, usize);
    cuMemsetD8Async ["cuMemsetD8Async"] (CUdeviceptr, u8, usize, CUstream);
    cuMemsetD16Async ["cuMemsetD16Async"] (CUdeviceptr, u16, usize, CUstream);
    cuMemsetD32Async ["cuMemsetD32Async"] (CUdeviceptr, u32, usize, CUstream);

    cuModuleLoadData ["cuModuleLoadData"] (*mut CUmodule, CPtr);
    cuModuleLoadDataEx ["cuModuleLoadDataEx"] (*mut CUmodule, CPtr, c_uint, *mut c_int, *mut Ptr);
    cuModuleUnload ["cuModuleUnload"] (CUmodule);
    cuModuleGetFunction ["cuModuleGetFunction"] (*mut CUfunction, CUmodule, *const c_char);
    cuModuleGetGlobal ["cuModuleGetGlobal_v2"] (*mut CUdeviceptr, *mut usize, CUmodule, *const c_char);
    cuModuleGetFunctionCount ["cuModuleGetFunctionCount"] (*mut c_uint, CUmodule);
    cuModuleEnumerateFunctions ["cuModuleEnumerateFunctions"] (*mut CUfunction, c_uint, CUmodule);
    cuFuncGetName ["cuFuncGetName"] (*mut *const c_char, CUfunction);
    cuFuncLoad ["cuFuncLoad"] (CUfunction);
    cuFuncGetParamInfo ["cuFuncGetParamInfo"] (CUfunction, usize, *mut usize, *mut usize);
    cuFuncGetAttribute ["cuFuncGetAttribute"] (*mut c_int, c_int, CUfunction);
    cuFuncSetAttribute ["cuFuncSetAttribute"] (CUfunction, c_int, c_int);
    cuOccupancyMaxActiveClusters ["cuOccupancyMaxActiveClusters"] (*mut c_int, CUfunction, *const CUlaunchConfig);
    cuOccupancyMaxPotentialClusterSize ["cuOccupancyMaxPotentialClusterSize"] (*mut c_int, CUfunction, *const CUlaunchConfig);
    cuTensorMapEncodeTiled ["cuTensorMapEncodeTiled"] (
        Ptr, c_uint, c_uint, Ptr, *const u64, *const u64, *const c_uint, *const c_uint,
        c_uint, c_uint, c_uint, c_uint
    );
    cuTensorMapEncodeIm2col ["cuTensorMapEncodeIm2col"] (
        Ptr, c_uint, c_uint, Ptr, *const u64, *const u64, *const c_int, *const c_int,
        c_uint, c_uint, *const c_uint, c_uint, c_uint, c_uint, c_uint
    );
    cuTensorMapEncodeIm2colWide ["cuTensorMapEncodeIm2colWide"] (
        Ptr, c_uint, c_uint, Ptr, *const u64, *const u64, c_int, c_int,
        c_uint, c_uint, *const c_uint, c_uint, c_uint, c_uint, c_uint, c_uint
    );
    cuMemHostGetDevicePointer ["cuMemHostGetDevicePointer_v2"] (*mut CUdeviceptr, Ptr, c_uint);
    cuStreamWriteValue64 ["cuStreamWriteValue64_v2", "cuStreamWriteValue64"] (CUstream, CUdeviceptr, u64, c_uint);
    cuStreamBeginCapture ["cuStreamBeginCapture_v2"] (CUstream, c_uint);
    cuStreamEndCapture ["cuStreamEndCapture"] (CUstream, *mut CUgraph);
    cuGraphInstantiateWithFlags ["cuGraphInstantiateWithFlags"] (*mut CUgraphExec, CUgraph, u64);
    cuGraphLaunch ["cuGraphLaunch"] (CUgraphExec, CUstream);
    cuGraphExecDestroy ["cuGraphExecDestroy"] (CUgraphExec);
    cuGraphDestroy ["cuGraphDestroy"] (CUgraph);
    cuMemGetAllocationGranularity ["cuMemGetAllocationGranularity"] (*mut usize, *const CUmemAllocationProp, c_uint);
    cuIpcGetEventHandle ["cuIpcGetEventHandle"] (*mut CUipcMemHandle, CUevent);
    cuIpcOpenEventHandle ["cuIpcOpenEventHandle"] (*mut CUevent, CUipcMemHandle);
    cuIpcGetMemHandle ["cuIpcGetMemHandle"] (*mut CUipcMemHandle, CUdeviceptr);
    cuIpcOpenMemHandle ["cuIpcOpenMemHandle_v2"] (*mut CUdeviceptr, CUipcMemHandle, c_uint);
    cuIpcCloseMemHandle ["cuIpcCloseMemHandle"] (CUdeviceptr);
    cuMemExportToShareableHandle ["cuMemExportToShareableHandle"] (Ptr, CUmemGenericAllocationHandle, c_uint, u64);
    cuMemImportFromShareableHandle ["cuMemImportFromShareableHandle"] (*mut CUmemGenericAllocationHandle, Ptr, c_uint);
    cuMemAddressReserve ["cuMemAddressReserve"] (*mut CUdeviceptr, usize, usize, CUdeviceptr, u64);
    cuMemAddressFree ["cuMemAddressFree"] (CUdeviceptr, usize);
    cuMemCreate ["cuMemCreate"] (*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, u64);
    cuMemGetAllocationPropertiesFromHandle ["cuMemGetAllocationPropertiesFromHandle"] (*mut CUmemAllocationProp, CUmemGenericAllocationHandle);
    cuMemRelease ["cuMemRelease"] (CUmemGenericAllocationHandle);
    cuMemMap ["cuMemMap"] (CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, u64);
    cuMemUnmap ["cuMemUnmap"] (CUdeviceptr, usize);
    cuMemSetAccess ["cuMemSetAccess"] (CUdeviceptr, usize, *const CUmemAccessDesc, usize);
    cuArray3DCreate ["cuArray3DCreate_v2"] (*mut Ptr, *const CUDA_ARRAY3D_DESCRIPTOR);
    cuArrayDestroy ["cuArrayDestroy"] (Ptr);
    cuMipmappedArrayCreate ["cuMipmappedArrayCreate"] (*mut Ptr, *const CUDA_ARRAY3D_DESCRIPTOR, c_uint);
    cuMipmappedArrayGetLevel ["cuMipmappedArrayGetLevel"] (*mut Ptr, Ptr, c_uint);
    cuMipmappedArrayDestroy ["cuMipmappedArrayDestroy"] (Ptr);
    cuMemcpy3DAsync ["cuMemcpy3DAsync_v2"] (*const CUDA_MEMCPY3D, CUstream);
    cuTexObjectCreate ["cuTexObjectCreate"] (
        *mut u64, *const CUDA_RESOURCE_DESC, *const CUDA_TEXTURE_DESC, *const CUDA_RESOURCE_VIEW_DESC
    );
    cuTexObjectDestroy ["cuTexObjectDestroy"] (u64);
    cuSurfObjectCreate ["cuSurfObjectCreate"] (*mut u64, *const CUDA_RESOURCE_DESC);
    cuSurfObjectDestroy ["cuSurfObjectDestroy"] (u64);
    cuLaunchKernelEx ["cuLaunchKernelEx"] (*const CUlaunchConfig, CUfunction, *mut Ptr, *mut Ptr);
    cuLaunchKernel ["cuLaunchKernel"] (
        CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream,
        *mut Ptr, *mut Ptr
    );
}
