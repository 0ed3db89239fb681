//! cumux's client driver: a `libcuda.so.1` replacement. Every CUDA driver entry
//! point is exported here; implemented ones forward to a cumux server through
//! `cumux-protocol`, the rest are stubs that log once and return
//! `CUDA_ERROR_NOT_SUPPORTED`.
//!
//! Map: `exports/` is the C ABI (thin, one file per API area), `state` the
//! client's tables (contexts, modules, streams, allocations), `transport` the
//! connection (unix socket or TCP), `dark_api` the runtime's private export
//! tables (with `integrity`, the answer to the runtime's self-check),
//! `entry_points` the `cuGetProcAddress` table generated from the toolkit
//! headers by `gen/entry_points.py`, `host_fn` host functions in stream order,
//! `link` JIT linking and relocatable device code for the CPU device.
//!
//! Handles given to the program are minted here and never dereferenced;
//! device pointers are the server's, in a window the client reserves so no
//! host allocation can take those addresses. Stream-ordered calls go out
//! without waiting; errors they cause come back at the next synchronising
//! call.

pub mod abi;
pub mod dark_api;
pub mod entry_points;
pub mod errors;
pub mod exports;
pub mod graph;
pub mod host_fn;
pub mod integrity;
pub mod link;
pub mod managed;
pub mod mapped;
pub mod occupancy;
pub mod pinned;
pub mod staging;
pub mod state;
pub mod tools_context;
pub mod transport;
