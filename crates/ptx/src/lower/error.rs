//! The two ways lowering refuses a module: PTX the interpreter does not
//! support (`Unsupported`), and PTX that is wrong (`Invalid`), each with its line.

use crate::module_info::LoadError;

/// PTX this interpreter does not support.
pub(super) fn unsupported_at(line: u32, what: impl Into<String>) -> LoadError {
    LoadError::Unsupported {
        what: what.into(),
        line,
    }
}

/// PTX that is malformed.
pub(super) fn invalid(line: u32, what: impl AsRef<str>) -> LoadError {
    LoadError::Invalid(format!("line {line}: {}", what.as_ref()))
}
