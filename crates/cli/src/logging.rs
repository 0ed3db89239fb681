//! Log set-up for every subcommand: `tracing` to stderr, filtered by `CUMUX_LOG`
//! or else `RUST_LOG` (env-filter syntax), `info` when neither is set; plain
//! text (colours only on a terminal, never with `NO_COLOR`) or JSON lines.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The variable that picks the log format (`text` or `json`); `cumux serve
/// --log-format` sets it for the server and the workers it starts.
pub const FORMAT_ENV: &str = "CUMUX_LOG_FORMAT";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// One line of text per event.
    #[default]
    Text,
    /// One JSON object per line (for a log collector).
    Json,
}

impl LogFormat {
    /// The name `--log-format` and `CUMUX_LOG_FORMAT` take.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }

    /// `CUMUX_LOG_FORMAT`, else text; an unknown value is reported and ignored.
    pub fn from_env() -> LogFormat {
        match std::env::var(FORMAT_ENV).ok().as_deref().map(str::trim) {
            None | Some("") | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                eprintln!("cumux: ignoring {FORMAT_ENV}={other:?}: expected text or json");
                LogFormat::Text
            }
        }
    }
}

/// Whether text logs may carry colours: only on a terminal, and not under
/// `NO_COLOR` (any non-empty value).
pub fn colours_wanted(stderr_is_terminal: bool, no_color: Option<&str>) -> bool {
    stderr_is_terminal && no_color.is_none_or(str::is_empty)
}

/// The log filter unless `CUMUX_LOG` or `RUST_LOG` says otherwise: cumux's
/// own lines at info; the CPU device's code generator only when something
/// goes wrong (at info it logs every function it compiles).
const DEFAULT_FILTER: &str = "info,cranelift_jit=warn,cranelift_codegen=warn";

/// Installs the global subscriber; later calls do nothing.
pub fn init(format: LogFormat) {
    let filter = ["CUMUX_LOG", "RUST_LOG"]
        .iter()
        .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()))
        .unwrap_or_else(|| DEFAULT_FILTER.to_string());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("cumux: ignoring log filter {filter:?}: {e}");
        EnvFilter::new(DEFAULT_FILTER)
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => {
            let no_color = std::env::var("NO_COLOR").ok();
            builder
                .with_ansi(colours_wanted(
                    std::io::stderr().is_terminal(),
                    no_color.as_deref(),
                ))
                .try_init()
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(colours_wanted(true, None));
        assert!(colours_wanted(true, Some("")));
        assert!(!colours_wanted(true, Some("1")));
        assert!(!colours_wanted(false, None));
    }
}
