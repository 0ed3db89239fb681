//! The CUDA driver API as NVIDIA's headers declare it: the C typedefs
//! (`types`), one function-pointer type per exported symbol (`pfn`), every
//! enumerator (`consts`) and `CUresult` (`errors`), and the `cuGetProcAddress`
//! table (`entry_points`), and which symbols the client answers and which it
//! refuses (`census`). The generator also writes the client's list of every
//! exported symbol (`crates/client/src/generated/symbols.rs`).
//!
//! Everything but this file is written by `gen/generate.py` from the headers
//! `scripts/setup-nvcc` installs (CUDA 13.0 and the 13.5 runtime's, united);
//! `tests/generated_up_to_date.rs` reruns it and fails if the output moved.

pub mod census;
pub mod consts;
pub mod entry_points;
pub mod errors;
pub mod pfn;
pub mod types;
