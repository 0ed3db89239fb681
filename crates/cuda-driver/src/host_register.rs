//! [`HostRegistration`]: host memory the process mapped itself (a shared file),
//! registered with the driver so the device can read and write it directly.

use std::ffi::c_void;
use std::sync::Arc;

use crate::driver::{cu, Context};
use crate::error::CudaError;
use crate::sys::*;

/// `[ptr, ptr + len)` registered with a context; unregistered on drop.
pub struct HostRegistration {
    ctx: Arc<Context>,
    ptr: usize,
    device_ptr: u64,
}

impl std::fmt::Debug for HostRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostRegistration({:#x})", self.ptr)
    }
}

impl HostRegistration {
    /// Registers the mapping at `ptr` of `len` bytes (page-aligned, mapped by the
    /// caller, which keeps it mapped until this is dropped).
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must stay mapped for as long as the registration lives.
    pub unsafe fn new(ctx: &Arc<Context>, ptr: usize, len: usize) -> Result<Self, CudaError> {
        ctx.make_current()?;
        let raw = ptr as *mut c_void;
        // SAFETY: the caller keeps the range mapped (see above).
        unsafe {
            cu!(
                ctx.driver,
                cuMemHostRegister(raw, len, CU_MEMHOSTREGISTER_DEVICEMAP)
            )?
        };
        let mut device_ptr: CUdeviceptr = 0;
        // SAFETY: `device_ptr` is a valid out-pointer; `raw` was just registered.
        let got = unsafe {
            cu!(
                ctx.driver,
                cuMemHostGetDevicePointer(&mut device_ptr, raw, 0)
            )
        };
        let registration = HostRegistration {
            ctx: Arc::clone(ctx),
            ptr,
            device_ptr,
        };
        got.map(|()| registration)
    }

    /// The address the device uses for the start of the range.
    pub fn device_ptr(&self) -> u64 {
        self.device_ptr
    }
}

// SAFETY: the registration is an address and a context handle, both usable from
// any thread.
unsafe impl Send for HostRegistration {}
// SAFETY: as for Send; nothing is mutated after construction.
unsafe impl Sync for HostRegistration {}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.ctx.make_current().is_ok() {
            // SAFETY: `ptr` was registered by `new` and is unregistered once.
            let _ = unsafe {
                cu!(
                    self.ctx.driver,
                    cuMemHostUnregister(self.ptr as *mut c_void)
                )
            };
        }
    }
}
