//! Function plans: the JSON document (`model`), its expressions (`expr`) and
//! element types (`dtype`), its checks alone (`validate`) and against kernels
//! and other functions (`link`), and its evaluation per invocation (`eval`).
//! Pure: no device, no server.

pub mod dtype;
pub mod eval;
pub mod expr;
pub mod link;
pub mod model;
pub mod validate;

pub use dtype::DType;
pub use validate::{BufferKind, Plan};

/// Reads and checks a plan document (all but what `link` checks).
pub fn parse(json: &[u8]) -> Result<Plan, String> {
    validate::check(&model::read(json)?)
}
