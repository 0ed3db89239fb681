//! Log set-up for every subcommand: `tracing` to stderr, filtered by `CUMUX_LOG`
//! or else `RUST_LOG` (env-filter syntax), `info` when neither is set.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber; later calls do nothing.
pub fn init() {
    let filter = ["CUMUX_LOG", "RUST_LOG"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| "info".to_string());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("cumux: ignoring log filter {filter:?}: {e}");
        EnvFilter::new("info")
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
