//! cumux's client driver: a `libcuda.so.1` replacement. Every CUDA driver entry
//! point is exported here; implemented ones forward to a cumux server through
//! `cumux-protocol`, the rest are stubs that log once and return
//! `CUDA_ERROR_NOT_SUPPORTED`.
//!
//! Map, from the program down: `exports/` is the C ABI (one file per API
//! area; each export is checked against its header signature in
//! `cumux-cuda-bindings`), over `abi` (the panic guard and argument helpers),
//! `logging` (the stderr logger) and `teardown` (whether the calling
//! thread's thread-locals are gone: it, or the program, is ending).
//! The exports work on `state`: the `Client` (connection, devices) and its
//! one lock over everything that changes (`State`). Feature modules sit on
//! `state`, never the other way round: `host_fn` (host functions in stream
//! order), `managed`, `pinned`, `staging` (large pageable copies), `graph`
//! (captured work), `link` (JIT linking for the CPU device). `transport` is
//! the connection (shared memory, unix socket or TCP); `dark_api` the
//! runtime's private export tables (with `integrity` and `tools_context`);
//! `entry_points` how `cuGetProcAddress` picks a symbol; `generated/` the
//! list of every exported symbol, implemented or stubbed (written by the
//! bindings' generator).
//!
//! A server object (stream, event, module, function) is named inside the
//! client by the server's handle, the one the wire carries; the program gets
//! it in a form of its own (`state::handles`). Handles are never
//! dereferenced; device pointers are the server's, in a window the client
//! reserves so no host allocation can take those addresses. Stream-ordered
//! calls go out without waiting; errors they cause come back at the next
//! synchronising call.

pub mod abi;
pub mod conditional;
pub mod conditions;
pub mod dark_api;
pub mod entry_points;
pub mod errors;
pub mod exports;
pub mod graph;
pub mod host_fn;
pub mod integrity;
pub mod jit_log;
pub mod link;
pub mod logging;
pub mod managed;
pub mod managed_guard;
pub mod mapped;
pub mod marks;
pub mod occupancy;
pub mod pinned;
pub mod resume;
pub mod routing;
pub mod staging;
pub mod state;
pub mod teardown;
pub mod tools_context;
pub mod tools_module;
pub mod transport;
