//! A tenant's NVML (`libnvidia-ml.so.1`, which `cumux run` puts in front of
//! NVIDIA's): the tenant's devices in its `CUDA_VISIBLE_DEVICES` order, memory
//! total = its quota and used = its own, its own processes and utilization,
//! answered by the cumux server. Every other entry point of NVIDIA's NVML goes
//! to NVIDIA's own library (`forward`) on the tenant's devices, where this
//! machine has it and it knows those devices; otherwise it answers
//! `NVML_ERROR_FUNCTION_NOT_FOUND`.

mod devices;
mod export_table;
mod forward;
mod real;
mod state;
mod system;
mod types;
mod usage;
mod view;

pub use real::REAL_NVML_ENV;
pub use types::*;
