//! Device memory shared between processes (`cuIpc*MemHandle`): a handle for
//! an allocation of one process's context, opened in another's, which then
//! reaches the same memory directly (across NVLink or PCIe where the devices
//! differ); and peer access between two contexts of one process.

use crate::driver::{cu, Context};
use crate::error::CudaError;
use crate::sys::*;

impl Context {
    /// The driver's handle for the allocation at `base`.
    pub fn ipc_get_mem_handle(&self, base: u64) -> Result<[u8; 64], CudaError> {
        self.make_current()?;
        let mut handle = CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `handle` is a valid out-pointer; the driver checks `base`.
        unsafe { cu!(self.driver(), cuIpcGetMemHandle(&mut handle, base))? };
        Ok(handle.reserved)
    }

    /// Opens another process's allocation, with peer access enabled where
    /// it lies on another device: its base in this process.
    pub fn ipc_open_mem_handle(&self, handle: [u8; 64]) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut base = 0;
        let handle = CUipcMemHandle { reserved: handle };
        // SAFETY: `base` is a valid out-pointer; the handle is plain bytes
        // the driver checks.
        unsafe {
            cu!(
                self.driver(),
                cuIpcOpenMemHandle(&mut base, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
            )?
        };
        Ok(base)
    }

    /// Lets kernels of this context reach `peer`'s memory (a context of
    /// this process on another device); already enabled is no error.
    pub fn enable_peer_access(&self, peer: &Context) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: `peer.raw` is a live context of this process.
        match unsafe { cu!(self.driver(), cuCtxEnablePeerAccess(peer.raw, 0)) } {
            Err(e) if e.code == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
            other => other,
        }
    }

    /// Takes back [`Context::enable_peer_access`].
    pub fn disable_peer_access(&self, peer: &Context) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: `peer.raw` is a live context of this process.
        unsafe { cu!(self.driver(), cuCtxDisablePeerAccess(peer.raw)) }
    }

    /// Closes memory [`Context::ipc_open_mem_handle`] opened at `base`.
    pub fn ipc_close_mem_handle(&self, base: u64) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: the driver checks that `base` is memory it opened.
        unsafe { cu!(self.driver(), cuIpcCloseMemHandle(base)) }
    }
}
