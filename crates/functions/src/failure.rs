//! Why a request about functions failed: each kind is one HTTP status, and
//! the body says what went wrong and where (a device error names its CUDA code).

use cumux_protocol::CuError;
use serde_json::{json, Value as Json};

/// A refused or failed request.
#[derive(Debug, Clone, PartialEq)]
pub enum Failure {
    /// A bad plan, module, input or parameter (400).
    BadRequest(String),
    /// No token, or one this server does not know (401).
    Unauthorized(String),
    /// Another tenant's function (403).
    Forbidden(String),
    /// No such function (404).
    NotFound(String),
    /// The request conflicts with what exists (409): a function others call.
    Conflict(String),
    /// Data over the limit (413).
    TooLarge(String),
    /// Too many invocations queued for the tenant's device (503).
    Busy(String),
    /// The invocation's deadline passed (504).
    Deadline(String),
    /// The device failed the work (500), with the CUDA error.
    Device { during: String, error: CuError },
    /// The server could not do what it should have (500).
    Internal(String),
}

/// `CUDA_ERROR_…`, the name cuda.h gives `code`.
pub fn cuda_error_name(code: u32) -> String {
    cumux_cuda_bindings::errors::ERRORS
        .iter()
        .find(|(c, _, _)| *c == code)
        .map_or_else(
            || format!("CUresult {code}"),
            |(_, name, _)| name.to_string_lossy().into_owned(),
        )
}

impl Failure {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Failure::BadRequest(_) => 400,
            Failure::Unauthorized(_) => 401,
            Failure::Forbidden(_) => 403,
            Failure::NotFound(_) => 404,
            Failure::Conflict(_) => 409,
            Failure::TooLarge(_) => 413,
            Failure::Busy(_) => 503,
            Failure::Deadline(_) => 504,
            Failure::Device { .. } | Failure::Internal(_) => 500,
        }
    }

    /// The JSON body: `{"error": TEXT}`, and for a device error its
    /// `cuda_error` name and `code`.
    pub fn body(&self) -> Json {
        match self {
            Failure::Device { during, error } => {
                let name = cuda_error_name(error.code);
                json!({
                    "error": format!("{during}: {name}: {}", error.detail),
                    "cuda_error": name,
                    "code": error.code,
                })
            }
            other => json!({ "error": other.to_string() }),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::BadRequest(s)
            | Failure::Unauthorized(s)
            | Failure::Forbidden(s)
            | Failure::NotFound(s)
            | Failure::Conflict(s)
            | Failure::TooLarge(s)
            | Failure::Busy(s)
            | Failure::Deadline(s)
            | Failure::Internal(s) => f.write_str(s),
            Failure::Device { during, error } => {
                write!(
                    f,
                    "{during}: {}: {}",
                    cuda_error_name(error.code),
                    error.detail
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_errors_carry_their_cuda_name() {
        let f = Failure::Device {
            during: "launches[0]".into(),
            error: CuError::new(700, "oob: store to 0x10"),
        };
        assert_eq!(f.status(), 500);
        assert_eq!(f.body()["cuda_error"], "CUDA_ERROR_ILLEGAL_ADDRESS");
        assert_eq!(
            f.to_string(),
            "launches[0]: CUDA_ERROR_ILLEGAL_ADDRESS: oob: store to 0x10"
        );
    }
}
