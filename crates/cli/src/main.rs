//! The `cumux` binary: parses the command line and hands off to `cumux_cli`.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cumux_cli::{logging, run, serve, status, worker};
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
    Serve(serve::ServeOptions),
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
    Worker(worker::WorkerOptions),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init();
    let result = match cli.command {
        Command::Serve(options) => serve::serve(options).map(|()| 0),
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
