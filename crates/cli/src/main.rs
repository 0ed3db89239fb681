//! The `cumux` binary: parses the command line and hands off to `cumux_cli`.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cumux_cli::logging::LogFormat;
use cumux_cli::{logging, mobility, run, serve, status, worker};
use cumux_server::Address;

#[derive(Parser)]
#[command(
    name = "cumux",
    version,
    about = "Share GPUs among unmodified CUDA programs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server that owns the devices.
    Serve(Box<serve::ServeOptions>),
    /// Register, invoke, list or remove serverless GPU functions (the
    /// functions API of `cumux serve --functions`).
    Fn(cumux_cli::fn_cmd::FnOptions),
    /// Run an unmodified CUDA program on cumux.
    Run {
        /// The server to use: unix:PATH or tcp:HOST:PORT; several, comma-separated, give the program the devices of each, one server after another (default: $CUMUX_SERVER, else the default socket).
        #[arg(long)]
        server: Option<String>,
        /// The tenant the program runs as.
        #[arg(long)]
        tenant: Option<String>,
        /// A pool file (TOML: [[servers]] with an address and, for TLS, a
        /// fingerprint): the program goes to the fewest servers whose
        /// devices fit, least loaded first, and cumux run says where.
        #[arg(long, conflicts_with = "server")]
        pool: Option<std::path::PathBuf>,
        /// How many devices the program gets from the pool (default 1).
        #[arg(long, requires = "pool")]
        gpus: Option<u32>,
        /// Memory free for the tenant on each device it gets from the pool
        /// (e.g. 20G).
        #[arg(long, requires = "pool", value_parser = cumux_cli::pool::memory_arg)]
        memory: Option<u64>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Show a server's devices and sessions (each server's, given several).
    Status {
        /// The server to ask: unix:PATH or tcp:HOST:PORT; several, comma-separated, are asked in turn (default: $CUMUX_SERVER, else the default socket).
        #[arg(long)]
        server: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Wait until the server answers, at most this long (e.g. 10s;
        /// 30s when given without a value), instead of failing at once.
        #[arg(long, value_name = "TIMEOUT", num_args = 0..=1,
              default_missing_value = "30s", value_parser = wait_arg)]
        wait: Option<std::time::Duration>,
    },
    /// List, change or remove a tenant while the server runs (admins only:
    /// the server's own user or root on its unix socket, or its admin token
    /// in CUMUX_TOKEN).
    Tenant {
        /// The server to change (default: $CUMUX_SERVER, else the default socket).
        #[arg(long)]
        server: Option<String>,
        #[command(subcommand)]
        command: cumux_cli::tenant::TenantCommand,
    },
    /// Move a running session to another device of its server, or to another
    /// server (admins only, of both), at its next call; its program sees a
    /// pause. To another server its program must run with CUMUX_RESUME=1.
    Migrate {
        /// The session (`cumux status` lists them).
        session: u64,
        /// The server's ordinal of the device to move it to, or another
        /// server's address (unix:PATH or tcp:HOST:PORT).
        #[arg(long)]
        to: String,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Move every session off a device (admins only).
    Drain {
        /// The server's ordinal of the device to empty.
        device: u32,
        /// Where its sessions go (default: the other device with the most
        /// memory free).
        #[arg(long)]
        to: Option<u32>,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Mark a device failed, or healthy again (admins only).
    Device {
        #[command(subcommand)]
        command: DeviceCommand,
    },
    /// Write a running session's state to a file (admins only).
    Checkpoint {
        session: u64,
        file: std::path::PathBuf,
        /// Hold the call the checkpoint is taken at unanswered (until the
        /// server stops, at most 10 minutes), so that `cumux serve --restore
        /// FILE` resumes the program (run with CUMUX_RESUME=1) after a restart.
        #[arg(long)]
        hold: bool,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// Replace a running session's state by a checkpoint's (admins only).
    Restore {
        file: std::path::PathBuf,
        /// The session to restore into.
        #[arg(long)]
        session: u64,
        #[command(flatten)]
        admin: AdminOptions,
    },
    /// The kubelet's device plugin: offers this node's GPU memory to pods
    /// and lists a cumux tenant for each container given some.
    DevicePlugin(cumux_cli::device_plugin::PluginOptions),
    /// Install this cumux and its client driver into a prefix (and, with
    /// --system, make every program on the host use the driver).
    Install(cumux_cli::install::InstallOptions),
    /// List the driver calls cumux's client answers and those it refuses
    /// (CUDA_ERROR_NOT_SUPPORTED), or look some up by name.
    Calls(cumux_cli::calls::CallsOptions),
    /// Serve one device context to the server that started this process (internal).
    #[command(hide = true)]
    Worker(worker::WorkerOptions),
}

/// `cumux device`: a device's health.
#[derive(clap::Subcommand)]
enum DeviceCommand {
    /// The device takes no new programs, and the server moves its sessions
    /// off it as its `on_device_failure` says (stay, migrate,
    /// migrate-to-cpu).
    Fail {
        /// The server's ordinal of the device.
        device: u32,
        /// Why, as `cumux status` and the log will say.
        #[arg(long, default_value = "marked failed by an admin")]
        reason: String,
        /// The server (default: $CUMUX_SERVER, else the default socket).
        #[arg(long)]
        server: Option<String>,
    },
    /// The device takes programs again.
    Ok {
        /// The server's ordinal of the device.
        device: u32,
        /// The server (default: $CUMUX_SERVER, else the default socket).
        #[arg(long)]
        server: Option<String>,
    },
}

/// Where an admin's command goes, and how long it waits for the session.
#[derive(clap::Args)]
struct AdminOptions {
    /// The server (default: $CUMUX_SERVER, else the default socket).
    #[arg(long)]
    server: Option<String>,
    /// How long to wait for the session's next call, when the move happens.
    #[arg(long, default_value = "30s", value_parser = wait_arg)]
    wait: std::time::Duration,
}

impl AdminOptions {
    fn address(&self) -> anyhow::Result<Address> {
        self.server
            .as_deref()
            .map_or_else(Address::from_env_or_default, Address::parse)
            .map_err(anyhow::Error::msg)
    }
}

/// A `--wait` timeout: a duration, zero allowed.
fn wait_arg(text: &str) -> Result<std::time::Duration, String> {
    cumux_cli::config::parse_drain_timeout(text).map_err(|e| format!("{e:#}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = match &cli.command {
        Command::Serve(options) => match options.log_format {
            Some(format) => {
                // Before any thread: the workers it starts log the same way.
                std::env::set_var(logging::FORMAT_ENV, format.name());
                format
            }
            None => LogFormat::from_env(),
        },
        _ => LogFormat::from_env(),
    };
    logging::init(log_format);
    let result = match cli.command {
        Command::Serve(options) => serve::serve(*options).map(|()| 0),
        Command::Run {
            server,
            tenant,
            pool,
            gpus,
            memory,
            mut command,
        } => {
            let program = command.remove(0);
            let ran = run::run(run::RunOptions {
                server,
                pool,
                gpus,
                memory,
                tenant,
                program,
                args: command,
            });
            match ran {
                Ok(code) => Ok(code),
                Err(e) => {
                    eprintln!("cumux run: {e}");
                    return ExitCode::from(u8::try_from(e.code).unwrap_or(1));
                }
            }
        }
        Command::Status { server, json, wait } => server
            .map_or_else(Address::list_from_env_or_default, |s| {
                Address::parse_list(&s)
            })
            .map_err(anyhow::Error::msg)
            .and_then(|addresses| status::status_of(&addresses, json, wait))
            .map(|()| 0),
        Command::Tenant { server, command } => server
            .map_or_else(Address::from_env_or_default, |s| Address::parse(&s))
            .map_err(anyhow::Error::msg)
            .and_then(|address| cumux_cli::tenant::tenant(&address, command))
            .map(|()| 0),
        Command::Migrate { session, to, admin } => admin
            .address()
            .and_then(|a| {
                let to = mobility::Destination::parse(&to)?;
                mobility::migrate(&a, session, &to, admin.wait)
            })
            .map(|()| 0),
        Command::Device { command } => {
            let (device, failed, server) = match command {
                DeviceCommand::Fail {
                    device,
                    reason,
                    server,
                } => (device, Some(reason), server),
                DeviceCommand::Ok { device, server } => (device, None, server),
            };
            server
                .map_or_else(Address::from_env_or_default, |s| Address::parse(&s))
                .map_err(anyhow::Error::msg)
                .and_then(|a| mobility::device_health(&a, device, failed))
                .map(|()| 0)
        }
        Command::Drain { device, to, admin } => admin
            .address()
            .and_then(|a| mobility::drain(&a, device, to, admin.wait))
            .map(|()| 0),
        Command::Checkpoint {
            session,
            file,
            hold,
            admin,
        } => admin
            .address()
            .and_then(|a| mobility::checkpoint(&a, session, &file, hold, admin.wait))
            .map(|()| 0),
        Command::Restore {
            file,
            session,
            admin,
        } => admin
            .address()
            .and_then(|a| mobility::restore(&a, &file, session, admin.wait))
            .map(|()| 0),
        Command::DevicePlugin(options) => cumux_cli::device_plugin::run(options).map(|()| 0),
        Command::Install(options) => cumux_cli::install::install(options).map(|()| 0),
        Command::Calls(options) => cumux_cli::calls::run(options).map(|()| 0),
        Command::Fn(options) => cumux_cli::fn_cmd::run(options).map(|()| 0),
        Command::Worker(options) => worker::worker(options).map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("cumux: {e:#}");
            ExitCode::from(1)
        }
    }
}
