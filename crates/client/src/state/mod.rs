//! The client's state: the connection and the device list cached at the
//! handshake (`client`), everything that changes behind the one lock
//! (`objects`), the handles the program holds (`handles`), this thread's
//! current contexts (`current`), which device each allocation is on
//! (`placements`) and the device address window (`window`).

pub mod client;
pub mod current;
pub mod handles;
pub mod objects;
pub mod placements;
pub mod pools;
pub mod window;

pub use client::{client, init, Client, StateGuard};
pub use current::{
    current_context, current_device, forget_context, pop_context, push_context, set_current_context,
};
pub use objects::*;
pub use placements::Placements;
pub use window::{device_window_reserved, is_device_ptr, DEVICE_VA_BASE, DEVICE_VA_END};
