//! Worker-backed devices: each session's context lives in a `cumux worker`
//! child process, so a GPU fault or a driver crash takes down that process only
//! and each session's device `printf` reaches a stdout pipe of its own. This
//! folder holds both sides of that link: the server's and the worker process's.
//!
//! Wire ([`wire`]): the worker's fd 0 is one end of a socket pair; requests and
//! replies are postcard frames and bulk bytes (copies, images) travel as raw
//! frames right after their header: on the socket at first, then through a
//! shared-memory area ([`link`]). The worker's fd 1 is a pipe the server reads
//! on a thread ([`stdout_tap`]): after every call that can flush printf the
//! worker writes a marker (a per-worker nonce and a sequence number) there, and
//! the reply names that number, so the server knows the call's output has all
//! arrived. Calls of one connection are serialised by a mutex on it (several
//! stream threads wait on each other); stream-ordered work is posted unanswered.
//!
//! Each device keeps one spare worker warm (driver loaded, context created;
//! [`spawn`]), so a session's first call rarely waits for a process to start.
//!
//! Cost, measured on the H100 against contexts in the server process: a
//! launch+sync round trip takes about 16 µs more (≈ 69 vs 53 µs); a whole
//! `cumux run` of vector_add takes ≈ 30 ms with the spare, ≈ 170 ms without,
//! ≈ 400 ms with in-process contexts (370 ms natively).
//!
//! Map: [`device`] is the [`crate::device::Device`] sessions see; [`context`]
//! one context (or one connection to a shared one) in a worker; [`shared`] a
//! session's view of a `shared`-mode context, [`shared_limits`] the limits its
//! sessions asked for; [`colocation`] keeps one program's
//! contexts on several devices in one process; [`watchdog`] resets contexts whose
//! kernels never end; [`process`] is the worker process's own loop, with
//! [`regions`] its table of pinned host regions; [`arrays`] sends a context's
//! CUDA array calls to its worker; [`reads`] reads a context's memory back,
//! a span's pieces answered back to back.

pub mod arrays;
pub mod colocation;
pub mod context;
pub mod device;
pub mod fencing;
pub mod link;
pub mod movable;
pub mod process;
pub mod reads;
pub mod regions;
pub mod shared;
pub mod shared_limits;
pub mod spawn;
pub mod stdout_tap;
pub mod watchdog;
pub mod wire;
