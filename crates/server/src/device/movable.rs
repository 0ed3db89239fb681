//! What a backend offers for moving a session's state to another context
//! (issue 17): allocations and module globals placed at the addresses the
//! program holds, in the address window the session started in.

use std::sync::Arc;

use cumux_protocol::{CuError, DevicePtr};

use super::{DeviceContext, LoadedModule, ModuleId};

/// A context whose memory can be laid out again elsewhere at the same
/// addresses. Only a backend whose addresses it chooses itself (the CPU
/// device) offers it; a GPU's are the driver's.
pub trait MovableContext: Send + Sync {
    /// The address window the context hands out addresses in: a context
    /// made for the moved session on another device takes the same one.
    fn window(&self) -> u32;
    /// Allocates `bytes` at `ptr` (zero-filled).
    fn alloc_at(&self, ptr: DevicePtr, bytes: u64) -> Result<(), CuError>;
    /// The device memory loading `module` allocated, in the order it did.
    fn module_blocks(&self, module: ModuleId) -> Vec<DevicePtr>;
    /// Loads `image` so that its loading allocates exactly `blocks`, in
    /// order (its globals where the source context had them); a load that
    /// allocates otherwise fails and leaves nothing behind.
    fn module_load_at(&self, image: &[u8], blocks: &[DevicePtr]) -> Result<LoadedModule, CuError>;
}

/// A device that can make a context in a given address window.
pub trait MovableDevice {
    /// A new context whose addresses lie in `window` (another device's, the
    /// one a moved session's program holds pointers in).
    fn create_context_in_window(&self, window: u32) -> Result<Arc<dyn DeviceContext>, CuError>;
}
