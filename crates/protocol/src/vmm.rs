//! The virtual memory management calls (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess` …) as they travel in [`crate::Call::Vmm`], and
//! the facts of the driver's API both sides check them against.

use serde::{Deserialize, Serialize};

use crate::{DevicePtr, Handle};

/// `CU_MEM_ACCESS_FLAGS_PROT_NONE`: a mapping starts so.
pub const ACCESS_NONE: u64 = 0;
/// `CU_MEM_ACCESS_FLAGS_PROT_READ`.
pub const ACCESS_READ: u64 = 1;
/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const ACCESS_READWRITE: u64 = 3;

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`: the one shareable handle type a
/// physical allocation may ask for (PyTorch's expandable segments always do).
/// Asking is allowed; exporting is not supported yet.
pub const HANDLE_TYPE_POSIX_FD: u64 = 1;

/// The host page size the driver wants reservation sizes and hints to be a
/// multiple of.
pub const HOST_PAGE: u64 = 4096;

/// Whether `flags` is one of the `CU_MEM_ACCESS_FLAGS_PROT_*` values.
pub fn is_access_flags(flags: u64) -> bool {
    matches!(flags, ACCESS_NONE | ACCESS_READ | ACCESS_READWRITE)
}

/// One virtual memory call. The session answers each with a [`crate::ReplyBody`]:
/// `Value` (granularity, access flags), `Ptr` (a reservation), `Handle` (a
/// physical allocation), `VmmProperties` or `Unit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum VmmCall {
    /// `cuMemGetAllocationGranularity` for pinned memory on `device`:
    /// answered by `Value`.
    Granularity { device: u32, recommended: bool },
    /// `cuMemAddressReserve`: answered by `Ptr`. `hint` is only a hint.
    Reserve {
        size: u64,
        alignment: u64,
        hint: DevicePtr,
    },
    /// `cuMemAddressFree` of a whole reservation.
    Free { ptr: DevicePtr, size: u64 },
    /// `cuMemCreate` of pinned memory on `device`, asking for the shareable
    /// `handle_types` (`CU_MEM_HANDLE_TYPE_*` bits): answered by `Handle`.
    Create {
        device: u32,
        size: u64,
        handle_types: u64,
        /// Compressible memory asked for (`CU_MEM_ALLOCATION_COMP_GENERIC`):
        /// the device grants it or not, as the driver does; the properties
        /// say which.
        compressed: bool,
    },
    /// `cuMemRelease`: drops one reference to a physical allocation.
    Release { handle: Handle },
    /// `cuMemMap` of `handle`'s bytes from `offset` at `[ptr, ptr + size)`.
    Map {
        ptr: DevicePtr,
        size: u64,
        offset: u64,
        handle: Handle,
    },
    /// `cuMemUnmap` of whole mappings covering `[ptr, ptr + size)`.
    Unmap { ptr: DevicePtr, size: u64 },
    /// `cuMemSetAccess` of `device` to the mapped `[ptr, ptr + size)`;
    /// `flags` is a `CU_MEM_ACCESS_FLAGS_PROT_*`.
    SetAccess {
        ptr: DevicePtr,
        size: u64,
        device: u32,
        flags: u64,
    },
    /// `cuMemGetAccess` of `device` at `ptr`: answered by `Value`.
    GetAccess { ptr: DevicePtr, device: u32 },
    /// `cuMemRetainAllocationHandle`: the handle mapped at `ptr`, one more
    /// reference to it; answered by `Handle`.
    Retain { ptr: DevicePtr },
    /// `cuMemGetAllocationPropertiesFromHandle`: answered by `VmmProperties`.
    Properties { handle: Handle },
    /// `cuMemExportToShareableHandle` as a file descriptor: answered by
    /// `Unit`, the descriptor following on the socket (`SCM_RIGHTS`, after a
    /// [`crate::pinned::FD_TAG`] byte). It is the device driver's own, so
    /// the process it is passed to imports the very memory.
    Export { handle: Handle },
    /// `cuMemImportFromShareableHandle` of the descriptor that follows the
    /// call on the socket: answered by `Handle`.
    Import,
}

/// What `cuMemGetAllocationPropertiesFromHandle` reports of a physical
/// allocation (pinned memory on a device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmmProperties {
    pub device: u32,
    pub handle_types: u64,
    /// Compressible, as asked and granted.
    pub compressed: bool,
}
