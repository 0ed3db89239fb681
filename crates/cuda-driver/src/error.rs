//! The two error types: [`LoadError`] (no usable driver library) and
//! [`CudaError`] (a driver call failed, with the code and the driver's name for
//! it).

use std::fmt;

/// A driver call that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError {
    /// The `CUresult`.
    pub code: u32,
    /// The driver's name for it (`CUDA_ERROR_OUT_OF_MEMORY`), or `CUresult N`.
    pub name: String,
    /// The entry point that returned it.
    pub call: &'static str,
    /// More about it (a JIT log, why an image was refused); often empty.
    pub detail: String,
}

impl CudaError {
    pub fn new(code: u32, name: impl Into<String>, call: &'static str) -> Self {
        CudaError {
            code,
            name: name.into(),
            call,
            detail: String::new(),
        }
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.call, self.name, self.code)?;
        if !self.detail.is_empty() {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for CudaError {}

/// Why no driver could be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The library could not be opened (absent, wrong architecture, not a library).
    #[error("cannot load the NVIDIA driver library {library}: {reason}")]
    Open { library: String, reason: String },
    /// The library is cumux's own client driver, which must never serve cumux.
    #[error(
        "{library} is cumux's own client driver, not NVIDIA's; point \
         CUMUX_REAL_LIBCUDA at the system's libcuda.so.1"
    )]
    CumuxClient { library: String },
    /// The library lacks an entry point every CUDA driver has: not a CUDA driver.
    #[error("{library} is not a CUDA driver library: it has no {symbol}")]
    MissingSymbol {
        library: String,
        symbol: &'static str,
    },
    /// `cuInit` failed: no GPU, or the kernel module and library disagree.
    #[error("the CUDA driver {library} found no usable GPU: {error}")]
    Init { library: String, error: CudaError },
}
