//! `cumux-fuzz`: runs fuzz targets for longer than the tests do, one after
//! another, and prints what each did (`scripts/fuzz` builds and runs it with
//! the `fuzz` profile: optimised, with overflow checks and debug assertions).
//! A crash is saved into the target's corpus folder, where the corpus test
//! replays it from then on.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use cumux_fuzz::engine::{Run, RunOptions, RunStats};
use cumux_fuzz::{corpus_root, panics, targets};

/// Runs the named fuzz targets (all of them if none is named) for a time each.
#[derive(Parser)]
#[command(name = "cumux-fuzz")]
struct Args {
    /// Targets to run: wire, shm, session, ptx_parse, ptx_run, fatbin, config, plan, checkpoint.
    targets: Vec<String>,
    /// Seconds per target (default: $CUMUX_FUZZ_SECS, else 60).
    #[arg(long)]
    secs: Option<u64>,
    /// Seed of the random source (default: $CUMUX_FUZZ_SEED, else from the
    /// clock; printed, so a run replays).
    #[arg(long)]
    seed: Option<u64>,
    /// Stop a target after this many checks.
    #[arg(long)]
    max_execs: Option<u64>,
    /// A check that runs longer than this many seconds is a hang.
    #[arg(long, default_value_t = 30)]
    hang_secs: u64,
    /// Print the counters every this many seconds (0: never).
    #[arg(long, default_value_t = 30)]
    progress_secs: u64,
    /// Print a JSON line of each target's figures at the end.
    #[arg(long)]
    json: bool,
    /// Check this file once with the one target named, panics shown as they
    /// come (set RUST_BACKTRACE=1 for the stack): to debug a saved crash.
    #[arg(long)]
    replay: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let chosen: Vec<_> = if args.targets.is_empty() {
        targets::all().to_vec()
    } else {
        let mut chosen = Vec::new();
        for name in &args.targets {
            match targets::by_name(name) {
                Some(t) => chosen.push(t),
                None => {
                    let names: Vec<_> = targets::all().iter().map(|t| t.name).collect();
                    eprintln!("no target {name:?}; targets: {}", names.join(", "));
                    return ExitCode::from(2);
                }
            }
        }
        chosen
    };
    if let Some(path) = &args.replay {
        let [target] = chosen[..] else {
            eprintln!("--replay takes one target");
            return ExitCode::from(2);
        };
        let input = match std::fs::read(path) {
            Ok(input) => input,
            Err(e) => {
                eprintln!("cannot read {}: {e}", path.display());
                return ExitCode::from(2);
            }
        };
        target.check_once(&input);
        println!("{}: {} passes", target.name, path.display());
        return ExitCode::SUCCESS;
    }
    let secs = args
        .secs
        .or_else(|| env_number("CUMUX_FUZZ_SECS"))
        .unwrap_or(60);
    let seed = args
        .seed
        .or_else(|| env_number("CUMUX_FUZZ_SEED"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    panics::install();
    let mut crashed = false;
    for target in chosen {
        let options = RunOptions {
            duration: Duration::from_secs(secs),
            max_execs: args.max_execs,
            seed,
            corpus: corpus_root(),
            save: true,
            hang_limit: Duration::from_secs(args.hang_secs),
            progress: (args.progress_secs > 0).then(|| Duration::from_secs(args.progress_secs)),
        };
        eprintln!("cumux-fuzz {}: seed {seed}, {} s", target.name, secs);
        let stats = Run::new(target, options).run();
        print_stats(&stats, args.json);
        crashed |= !stats.crashes.is_empty();
    }
    for (location, count) in panics::background() {
        println!("panics on other threads: {count} at {location}");
    }
    if crashed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The number in the environment variable `name`, if it holds one.
fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

fn print_stats(stats: &RunStats, json: bool) {
    let secs = stats.wall.as_secs_f64();
    println!(
        "{}: {:.1} s, {} checks ({:.0}/s), started from {}, pool {}, features {}, slowest {:.3} s, crashes {}",
        stats.target,
        secs,
        stats.execs,
        stats.execs as f64 / secs.max(1e-9),
        stats.started_with,
        stats.pool,
        stats.features,
        stats.slowest.as_secs_f64(),
        stats.crashes.len()
    );
    for crash in &stats.crashes {
        println!(
            "  crash x{} at {}: {}{}",
            crash.count,
            crash.panic.location,
            crash.panic.message,
            crash
                .saved
                .as_ref()
                .map(|p| format!(" (saved as {})", p.display()))
                .unwrap_or_default()
        );
    }
    if json {
        println!(
            "{{\"target\":\"{}\",\"seed\":{},\"wall_s\":{:.1},\"executions\":{},\"pool\":{},\"features\":{},\"slowest_s\":{:.3},\"crashes\":{}}}",
            stats.target,
            stats.seed,
            secs,
            stats.execs,
            stats.pool,
            stats.features,
            stats.slowest.as_secs_f64(),
            stats.crashes.len()
        );
    }
}
