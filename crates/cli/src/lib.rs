//! The `cumux` command line: `serve` runs the server, `run` starts an unmodified
//! program on cumux's client driver, `status` shows what a server is doing.
//! Each subcommand lives in its own module; `main.rs` only parses arguments.

pub mod calls;
pub mod checkpoint_file;
pub mod config;
pub mod device_plugin;
pub mod fn_client;
pub mod fn_cmd;
pub mod functions_http;
pub mod https;
pub mod install;
pub mod logging;
pub mod metrics_http;
pub mod mobility;
pub mod notify;
pub mod pool;
pub mod probe;
pub mod run;
pub mod self_signed;
pub mod serve;
pub mod signals;
pub mod status;
pub mod tenant;
pub mod worker;
