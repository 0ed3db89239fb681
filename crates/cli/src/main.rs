//! The `cumux` binary: parses the command line and hands off to `cumux_cli`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cumux_cli::{config, logging, run, serve, status, worker};
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
    Serve {
        /// Which devices to serve: auto (GPUs if any, else the CPU device), cpu or cuda.
        #[arg(long)]
        device: Option<String>,
        /// Where to listen: unix:PATH or tcp:HOST:PORT.
        #[arg(long)]
        listen: Option<String>,
        /// A TOML config file: device, listen, memory, policy (also per device, in
        /// [devices.N] tables), and the tenant table.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Device memory of the CPU device, e.g. 4G (default: a quarter of RAM, at most 16 GiB).
        #[arg(long, value_parser = parse_memory)]
        memory: Option<u64>,
        /// Instructions one thread block of a launch may execute on the CPU device
        /// before the launch fails with CUDA_ERROR_LAUNCH_TIMEOUT (702), like the
        /// driver's watchdog; it stops a kernel that never ends (default
        /// 20000000000, minutes of interpretation; 0 = unlimited).
        #[arg(long)]
        launch_budget: Option<u64>,
        /// How each device shares its time among tenants: fifo (default: no scheduler,
        /// launches go in arrival order), fair (weighted shares of device time) or
        /// priority (latency-critical tenants first). It sets every device's policy
        /// but those a config's [devices.N] table gives a policy of their own.
        #[arg(long)]
        policy: Option<String>,
        /// How a GPU gives sessions contexts: isolated (default: a context per
        /// session, each in a process of its own; a fault stays with its
        /// session) or shared (one context, each session on streams of its
        /// own, kernels side by side; a fault fails every session on it).
        #[arg(long)]
        sharing: Option<String>,
        /// Resets a GPU context whose queued work makes no progress for this long
        /// (e.g. 30s, 2m): a kernel that never ends then fails with
        /// CUDA_ERROR_LAUNCH_TIMEOUT (702) instead of holding the GPU; in shared
        /// mode every session on the context fails with it. Default: never. Keep it
        /// far above the longest kernel a tenant may run.
        #[arg(long, value_parser = parse_timeout)]
        kernel_timeout: Option<std::time::Duration>,
    },
    /// Run an unmodified CUDA program on cumux.
    Run {
        /// The server to use: unix:PATH or tcp:HOST:PORT (default: $CUMUX_SERVER, else the default socket).
        #[arg(long)]
        server: Option<String>,
        /// The tenant the program runs as.
        #[arg(long)]
        tenant: Option<String>,
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Show a server's devices and sessions.
    Status {
        /// The server to ask (default: $CUMUX_SERVER, else the default socket).
        #[arg(long)]
        server: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Serve one device context to the server that started this process (internal).
    #[command(hide = true)]
    Worker {
        /// cpu or cuda.
        #[arg(long)]
        device: String,
        #[arg(long, default_value_t = 0)]
        ordinal: u32,
        #[arg(long, value_parser = parse_memory)]
        memory: Option<u64>,
        /// Per-block instruction budget of a CPU device launch (0 = unlimited).
        #[arg(long)]
        launch_budget: Option<u64>,
        /// Hex nonce of the stdout markers.
        #[arg(long)]
        nonce: String,
    },
}

fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    config::parse_duration(text).map_err(|e| format!("{e:#}"))
}

fn parse_memory(text: &str) -> Result<u64, String> {
    config::parse_bytes(text).map_err(|e| format!("{e:#}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init();
    let result = match cli.command {
        Command::Serve {
            device,
            listen,
            config,
            memory,
            launch_budget,
            policy,
            sharing,
            kernel_timeout,
        } => serve::serve(serve::ServeOptions {
            device,
            listen,
            config,
            memory,
            launch_budget,
            policy,
            sharing,
            kernel_timeout,
        })
        .map(|()| 0),
        Command::Run {
            server,
            tenant,
            mut command,
        } => {
            let program = command.remove(0);
            run::run(run::RunOptions {
                server,
                tenant,
                program,
                args: command,
            })
        }
        Command::Status { server, json } => server
            .map_or_else(Address::from_env_or_default, |s| Address::parse(&s))
            .map_err(anyhow::Error::msg)
            .and_then(|address| status::status(&address, json))
            .map(|()| 0),
        Command::Worker {
            device,
            ordinal,
            memory,
            launch_budget,
            nonce,
        } => worker::worker(worker::WorkerOptions {
            device,
            ordinal,
            memory,
            launch_budget,
            nonce,
        })
        .map(|()| 0),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("cumux: {e:#}");
            ExitCode::from(1)
        }
    }
}
