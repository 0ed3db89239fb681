//! Serverless GPU functions: a module plus a declarative plan, registered once
//! and invoked with data, run through the server's own sessions.
//! `plan` is the pure model, `tensors` the data format, `service` the registry
//! and requests, `lane` a tenant's session on a device, `job` where a lane's
//! job meets its waiter, `invoke` one run, `metrics` their counters.

pub mod failure;
pub mod invoke;
pub mod job;
pub mod lane;
pub mod metrics;
pub mod plan;
pub mod service;
pub mod tensors;

pub use failure::Failure;
pub use service::{Functions, Limits, Placement};
