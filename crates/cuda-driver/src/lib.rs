//! A safe layer over the system's NVIDIA driver (`libcuda.so.1`), loaded at run
//! time so cumux builds and tests where no CUDA exists. It refuses cumux's own
//! client driver; every call returns `Result<_, CudaError>` and nothing panics.
//!
//! Map: [`sys`] is the raw ABI (types, constants, the entry-point table);
//! [`driver`] loads the library and owns devices and contexts; [`objects`] has
//! streams, events, pinned buffers, modules and functions; [`image`] checks and
//! reads module images before the driver sees them; [`capture`] catches device
//! `printf`, which the driver writes to the process's stdout; [`vmm`] has
//! reservations, physical allocations and their mappings; [`arrays`] has CUDA
//! arrays, copies to and from them, texture and surface objects.

pub mod arrays;
pub mod capture;
pub mod driver;
pub mod error;
pub mod green;
pub mod image;
pub mod ipc;
pub mod objects;
pub mod sys;
pub mod tensor_map;
pub mod vmm;

pub use arrays::CopyPlace;
pub use driver::{
    Context, DeviceId, Driver, MemsetValue, CUMUX_CLIENT_MARKERS, LIBCUDA_SONAME,
    MAX_DEVICE_ATTRIBUTE, REAL_LIBCUDA_ENV,
};
pub use error::{CudaError, LoadError};
pub use image::{CodeChoice, ImageKind};
pub use objects::{
    Event, Function, FunctionAttributes, GraphExec, HostRegistration, LaunchAttr, LaunchConfig,
    Module, PinnedBuffer, Stream,
};
pub use tensor_map::{TensorShape, TensorTile, TENSOR_MAP_BYTES};
