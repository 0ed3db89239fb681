//! `cumux worker` (hidden): serves one device context to the server that
//! started it, over the socket on its fd 0; its fd 1 stays free for device
//! printf, which the server reads. Exits when the socket closes, or when the
//! server dies (even while a kernel that never ends holds its threads); a
//! terminal's Ctrl-C is the server's to act on, not the worker's.

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use anyhow::{anyhow, Context, Result};
use cumux_server::device::backends::{default_memory_bytes, CpuSpec};
use cumux_server::device::DEFAULT_LAUNCH_BUDGET;
use cumux_server::worker::process::{
    image_print_detector, local_device, serve_worker_beside, WorkerStdout,
};
use cumux_server::worker::wire::nonce_from_hex;

/// What the server asked the worker to serve.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerOptions {
    /// cpu or cuda.
    #[arg(long)]
    pub device: String,
    #[arg(long, default_value_t = 0)]
    pub ordinal: u32,
    #[arg(long, value_parser = crate::config::memory_arg)]
    pub memory: Option<u64>,
    /// Instruction budget of a CPU device launch, its blocks together (0 = unlimited).
    #[arg(long)]
    pub launch_budget: Option<u64>,
    /// Host threads a CPU device runs a launch's blocks on (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Serve the GPU's primary context (a `shared` device's worker: green
    /// contexts share its modules and memory).
    #[arg(long)]
    pub primary_context: bool,
    /// Hex nonce of the stdout markers.
    #[arg(long)]
    pub nonce: String,
}

fn flush_c_stdio() {
    // SAFETY: fflush(NULL) flushes every C output stream; no pointer is kept.
    unsafe { libc::fflush(std::ptr::null_mut()) };
}

/// How often the worker looks whether its server still lives.
const PARENT_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

/// Ends this process once its parent (the server) is gone: the worker was
/// reparented. A kernel that never ends keeps the serving threads busy, so the
/// closed socket alone would not end it, and a leftover worker holds its GPU
/// context and memory. (`PR_SET_PDEATHSIG` follows the thread that spawned the
/// worker, which may end long before the server.)
fn exit_with_parent() {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let watcher = std::thread::Builder::new()
        .name("cumux-parent-watch".into())
        .spawn(move || loop {
            std::thread::sleep(PARENT_CHECK);
            // SAFETY: as above.
            if unsafe { libc::getppid() } != parent {
                eprintln!("cumux worker: the server is gone; exiting");
                // SAFETY: _exit ends the process at once, without running
                // destructors that might wait for the busy threads.
                unsafe { libc::_exit(1) };
            }
        });
    if let Err(e) = watcher {
        tracing::warn!("cannot watch the server's life: {e}");
    }
}

pub fn worker(options: WorkerOptions) -> Result<()> {
    // As the server: freed buffers go back to the system (a shared worker
    // serves every session of its device for the server's life).
    cumux_server::freed_memory::keep_thresholds_fixed();
    exit_with_parent();
    // A terminal's Ctrl-C reaches the whole process group; the server decides
    // when its workers stop (it drains first), so the worker lets it pass.
    if let Err(e) = signal_hook::flag::register(
        signal_hook::consts::SIGINT,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    ) {
        tracing::warn!("cannot set SIGINT aside: {e}");
    }
    let nonce = nonce_from_hex(&options.nonce)
        .ok_or_else(|| anyhow!("--nonce takes 32 hex digits, not {:?}", options.nonce))?;
    let socket = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .context("fd 0 is not open")?;
    let conn = UnixStream::from(socket);
    // Its log lines share the server's stderr: name the worker in each.
    let _span = tracing::info_span!("worker", pid = std::process::id()).entered();
    let cpu = CpuSpec {
        memory: options.memory.unwrap_or_else(default_memory_bytes),
        launch_budget: options.launch_budget.unwrap_or(DEFAULT_LAUNCH_BUDGET),
        threads: options.threads,
    };
    let device = local_device(
        &options.device,
        options.ordinal,
        &cpu,
        options.primary_context,
    )
    .map_err(anyhow::Error::msg)?;
    // A program's contexts on its other devices join this process.
    let open_other = |n| local_device(&options.device, n, &cpu, options.primary_context);
    let mut out = std::io::stdout();
    let mut stdout = WorkerStdout {
        out: &mut out,
        flush_c_stdio: &flush_c_stdio,
        nonce,
        image_may_print: &image_print_detector(),
    };
    serve_worker_beside(&*device, &open_other, conn, &mut stdout)
        .context("the server connection failed")
}
