//! Runs the kernels of the CUDA corpus (`tests/cuda/corpus/*.cu`) directly on the
//! PTX interpreter: each source is compiled to PTX with nvcc (via cumux-testkit),
//! launched with inputs made here, and checked against a reference computed in Rust.

#[path = "../common/mod.rs"]
mod common;
mod features;
mod harness;
mod kernels;
mod numeric;
