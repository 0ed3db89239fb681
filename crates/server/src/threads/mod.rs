//! The server's own stream threads: CUDA stream order over a context that keeps
//! none of its own (the in-process CPU device, the model device), each stream a
//! thread that asks the device's scheduling gate before it runs a piece of work.

mod ordered;
mod workers;

pub use ordered::{LaunchMeter, ThreadedStreams, MAX_QUEUED_BYTES};
