//! The fuzz targets, one file each, and the list the tests and the runner
//! take them from. `calls` builds the arbitrary calls `wire`, `shm` and
//! `session` share.

pub mod calls;
pub mod checkpoint;
pub mod config;
pub mod fatbin;
pub mod plan;
pub mod ptx;
pub mod session;
pub mod shm;
pub mod wire;

use crate::engine::Target;

/// Every target, in the order the runner takes them.
pub fn all() -> [&'static Target; 9] {
    [
        &wire::TARGET,
        &shm::TARGET,
        &session::TARGET,
        &ptx::PARSE,
        &ptx::RUN,
        &fatbin::TARGET,
        &config::TARGET,
        &plan::TARGET,
        &checkpoint::TARGET,
    ]
}

/// The target called `name`.
pub fn by_name(name: &str) -> Option<&'static Target> {
    all().into_iter().find(|t| t.name == name)
}
