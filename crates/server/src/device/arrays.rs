//! CUDA arrays as the device layer takes them ([`ArrayOp`], and copies through
//! [`super::DeviceContext::array_copy`]): the session has checked every handle
//! and replaced it by the backend's own id; a backend still fails cleanly.

use cumux_protocol::arrays::{ArrayShape, Resource, TextureDesc, ViewDesc};
use serde::{Deserialize, Serialize};

/// One array operation on a context ([`super::DeviceContext::array`]):
/// answered by the backend's id of what it made, else 0. `bytes` is what
/// the session charged the tenant for an array, which the device counts as
/// its memory in use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ArrayOp {
    /// An array: its id.
    Create {
        shape: ArrayShape,
        bytes: u64,
    },
    Destroy {
        array: u64,
        bytes: u64,
    },
    /// A mipmapped array of `levels` levels: its id.
    CreateMipmapped {
        shape: ArrayShape,
        levels: u32,
        bytes: u64,
    },
    /// Level `level` of a mipmapped array, as an array: its id (the
    /// mipmapped array owns it).
    Level {
        mipmap: u64,
        level: u32,
    },
    DestroyMipmapped {
        mipmap: u64,
        bytes: u64,
    },
    /// A texture object over `resource`, whose arrays are backend ids and
    /// whose memory the session checked: the driver's object.
    TextureCreate {
        resource: Resource,
        texture: TextureDesc,
        view: Option<ViewDesc>,
    },
    TextureDestroy {
        texture: u64,
    },
    /// A surface object over an array (its id): the driver's object.
    SurfaceCreate {
        array: u64,
    },
    SurfaceDestroy {
        surface: u64,
    },
}

/// What a device without CUDA arrays answers.
pub fn no_arrays() -> cumux_protocol::CuError {
    cumux_protocol::CuError::new(
        cumux_protocol::codes::NOT_SUPPORTED,
        "this device has no CUDA arrays (arrays, textures and surfaces need a GPU)",
    )
}
