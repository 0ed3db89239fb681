//! `cumux worker` (hidden): serves one device context to the server that
//! started it, over the socket on its fd 0; its fd 1 stays free for device
//! printf, which the server reads. Exits when the socket closes.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use anyhow::{anyhow, Context, Result};
use cumux_server::device::worker::{
    image_print_detector, local_device, nonce_from_hex, serve_worker, WorkerStdout,
};
use cumux_server::device::{default_memory_bytes, DEFAULT_LAUNCH_BUDGET};

/// What the server asked the worker to serve.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// `cpu` or `cuda`.
    pub device: String,
    pub ordinal: u32,
    pub memory: Option<u64>,
    /// Per-block instruction budget of a CPU device launch (0 = unlimited).
    pub launch_budget: Option<u64>,
    /// Hex nonce of the stdout markers.
    pub nonce: String,
}

fn flush_c_stdio() {
    // SAFETY: fflush(NULL) flushes every C output stream; no pointer is kept.
    unsafe { libc::fflush(std::ptr::null_mut()) };
}

pub fn worker(options: WorkerOptions) -> Result<()> {
    let nonce = nonce_from_hex(&options.nonce)
        .ok_or_else(|| anyhow!("--nonce takes 32 hex digits, not {:?}", options.nonce))?;
    let socket = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("fd 0 is not open")?;
    let conn = UnixStream::from(socket);
    // Its log lines share the server's stderr: name the worker in each.
    let _span = tracing::info_span!("worker", pid = std::process::id()).entered();
    let device = local_device(
        &options.device,
        options.ordinal,
        options.memory.unwrap_or_else(default_memory_bytes),
        options.launch_budget.unwrap_or(DEFAULT_LAUNCH_BUDGET),
    )
    .map_err(anyhow::Error::msg)?;
    let mut out = std::io::stdout();
    let mut stdout = WorkerStdout {
        out: &mut out,
        flush_c_stdio: &flush_c_stdio,
        nonce,
        image_may_print: &image_print_detector(&options.device),
    };
    serve_worker(&*device, conn, &mut stdout).context("the server connection failed")
}
