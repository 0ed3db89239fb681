//! Virtual memory management on a [`Context`]'s device: address reservations,
//! physical allocations (`cuMemCreate`), their mappings and the device's
//! access to them. The caller keeps the tables; these are the driver's calls.

use crate::driver::{cu, to_usize, Context, DeviceId, Driver};
use crate::error::CudaError;
use crate::sys::*;

/// Pinned memory on device `ordinal`, as `cuMemCreate` and
/// `cuMemGetAllocationGranularity` take it.
fn pinned_on(ordinal: std::ffi::c_int) -> CUmemAllocationProp {
    CUmemAllocationProp {
        kind: CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: 0,
        location: CUmemLocation {
            kind: CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32_handle_meta_data: std::ptr::null_mut(),
        compression_type: 0,
        gpu_direct_rdma_capable: 0,
        usage: 0,
        reserved: [0; 4],
    }
}

impl Driver {
    /// The (minimum, recommended) granularity of pinned memory on `dev`,
    /// asked without a context.
    pub fn vmm_granularity(&self, dev: DeviceId) -> Result<(u64, u64), CudaError> {
        Ok((self.granularity(dev, false)?, self.granularity(dev, true)?))
    }

    /// The minimum (or recommended) granularity of pinned memory on `dev`.
    fn granularity(&self, dev: DeviceId, recommended: bool) -> Result<u64, CudaError> {
        let prop = pinned_on(dev.ordinal());
        let option = match recommended {
            true => CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,
            false => CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        };
        let mut granularity = 0usize;
        // SAFETY: an out-pointer and a properties struct that outlive the call.
        unsafe {
            cu!(
                self,
                cuMemGetAllocationGranularity(&mut granularity, &prop, option)
            )?
        };
        Ok(granularity as u64)
    }
}

impl Context {
    /// Pinned memory on this context's device.
    fn pinned_here(&self) -> CUmemAllocationProp {
        pinned_on(self.device().ordinal())
    }

    /// The minimum (or recommended) granularity of pinned device memory.
    pub fn vmm_granularity(&self, recommended: bool) -> Result<u64, CudaError> {
        self.make_current()?;
        self.driver.granularity(self.device(), recommended)
    }

    /// Reserves `size` bytes of device addresses aligned to `alignment`
    /// (0: the driver's default): their start.
    pub fn vmm_reserve(&self, size: u64, alignment: u64) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut ptr: CUdeviceptr = 0;
        let (size, alignment) = (to_usize(size)?, to_usize(alignment)?);
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe {
            cu!(
                self.driver,
                cuMemAddressReserve(&mut ptr, size, alignment, 0, 0)
            )?
        };
        Ok(ptr)
    }

    /// Reserves `size` bytes of device addresses asking for them at `addr`:
    /// the start the driver gave, which the caller compares (the address is
    /// a hint the driver may pass over).
    pub fn vmm_reserve_at(&self, size: u64, addr: u64) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut ptr: CUdeviceptr = 0;
        let size = to_usize(size)?;
        // SAFETY: `ptr` is a valid out-pointer; the hint is an address only.
        unsafe { cu!(self.driver, cuMemAddressReserve(&mut ptr, size, 0, addr, 0))? };
        Ok(ptr)
    }

    /// Gives back a whole reservation.
    pub fn vmm_address_free(&self, ptr: u64, size: u64) -> Result<(), CudaError> {
        self.make_current()?;
        let size = to_usize(size)?;
        // SAFETY: addresses only; the driver checks them.
        unsafe { cu!(self.driver, cuMemAddressFree(ptr, size)) }
    }

    /// A physical allocation of `size` bytes on this context's device: its
    /// handle (shareable with no other process).
    pub fn vmm_create(
        &self,
        size: u64,
        shareable: bool,
        compressed: bool,
    ) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut prop = self.pinned_here();
        if shareable {
            prop.requested_handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        }
        if compressed {
            prop.compression_type = CU_MEM_ALLOCATION_COMP_GENERIC;
        }
        let mut handle: CUmemGenericAllocationHandle = 0;
        let size = to_usize(size)?;
        // SAFETY: an out-pointer and a properties struct that outlive the call.
        unsafe { cu!(self.driver, cuMemCreate(&mut handle, size, &prop, 0))? };
        Ok(handle)
    }

    /// Whether physical allocation `handle` is compressible: the driver may
    /// not grant compression that was asked for.
    pub fn vmm_compressed(&self, handle: u64) -> Result<bool, CudaError> {
        self.make_current()?;
        let mut prop = self.pinned_here();
        // SAFETY: an out-pointer to a properties struct of the driver's layout.
        unsafe {
            cu!(
                self.driver,
                cuMemGetAllocationPropertiesFromHandle(&mut prop, handle)
            )?
        };
        Ok(prop.compression_type == CU_MEM_ALLOCATION_COMP_GENERIC)
    }

    /// A file descriptor for physical allocation `handle` (made shareable),
    /// which another process imports ([`Context::vmm_import`]).
    pub fn vmm_export(&self, handle: u64) -> Result<std::os::fd::OwnedFd, CudaError> {
        self.make_current()?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: `fd` is a valid out-pointer for the descriptor type asked.
        unsafe {
            cu!(
                self.driver,
                cuMemExportToShareableHandle(
                    (&mut fd as *mut std::ffi::c_int).cast(),
                    handle,
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0
                )
            )?
        };
        // SAFETY: the driver gave this process a descriptor of its own.
        Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
    }

    /// The physical allocation another process exported as `fd`: a handle here.
    pub fn vmm_import(&self, fd: std::os::fd::BorrowedFd<'_>) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd) as usize;
        // SAFETY: an out-pointer; the descriptor, passed as the driver takes
        // it (its number in the pointer), stays open for the call.
        unsafe {
            cu!(
                self.driver,
                cuMemImportFromShareableHandle(
                    &mut handle,
                    raw as *mut std::ffi::c_void,
                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                )
            )?
        };
        Ok(handle)
    }

    /// Drops the reference `cuMemCreate` gave: the memory goes once unmapped.
    pub fn vmm_release(&self, handle: u64) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: a handle value; the driver checks it.
        unsafe { cu!(self.driver, cuMemRelease(handle)) }
    }

    /// Maps the first `size` bytes of `handle` at `ptr`, in a reservation.
    pub fn vmm_map(&self, ptr: u64, size: u64, handle: u64) -> Result<(), CudaError> {
        self.make_current()?;
        let size = to_usize(size)?;
        // SAFETY: addresses and a handle value; the driver checks them.
        unsafe { cu!(self.driver, cuMemMap(ptr, size, 0, handle, 0)) }
    }

    /// Unmaps `[ptr, ptr + size)` (whole mappings).
    pub fn vmm_unmap(&self, ptr: u64, size: u64) -> Result<(), CudaError> {
        self.make_current()?;
        let size = to_usize(size)?;
        // SAFETY: addresses only; the driver checks them.
        unsafe { cu!(self.driver, cuMemUnmap(ptr, size)) }
    }

    /// Sets this context's device's access (`CU_MEM_ACCESS_FLAGS_PROT_*`)
    /// to the mapped `[ptr, ptr + size)`.
    pub fn vmm_set_access(&self, ptr: u64, size: u64, flags: u32) -> Result<(), CudaError> {
        self.make_current()?;
        let desc = CUmemAccessDesc {
            location: self.pinned_here().location,
            flags,
        };
        let size = to_usize(size)?;
        // SAFETY: one descriptor that outlives the call.
        unsafe { cu!(self.driver, cuMemSetAccess(ptr, size, &desc, 1)) }
    }
}
