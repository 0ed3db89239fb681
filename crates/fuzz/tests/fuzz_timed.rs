//! A short fuzzing run of every target: `CUMUX_FUZZ_SECS` seconds each
//! (default 3), from seed `CUMUX_FUZZ_SEED` (default fixed, so a run replays).
//! A crash fails the test and is saved into the target's corpus folder;
//! `scripts/fuzz` runs the same targets for longer.

use std::time::Duration;

use cumux_fuzz::engine::{Run, RunOptions};
use cumux_fuzz::{corpus_root, targets};

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.trim().parse().ok()
}

fn fuzz_briefly(name: &str) {
    let target = targets::by_name(name).expect("a target of that name");
    let options = RunOptions {
        duration: Duration::from_secs(env_number("CUMUX_FUZZ_SECS").unwrap_or(3)),
        max_execs: None,
        seed: env_number("CUMUX_FUZZ_SEED").unwrap_or(0xc0ffee),
        corpus: corpus_root(),
        save: true,
        hang_limit: Duration::from_secs(120),
        progress: None,
    };
    let stats = Run::new(target, options).run();
    assert!(stats.execs > 0, "{name}: nothing ran");
    let report: Vec<String> = stats
        .crashes
        .iter()
        .map(|c| {
            let shown = &c.input[..c.input.len().min(512)];
            let hex: String = shown.iter().map(|b| format!("{b:02x}")).collect();
            format!(
                "panic at {}: {} ({} inputs; saved as {:?}; first bytes {hex})",
                c.panic.location, c.panic.message, c.count, c.saved
            )
        })
        .collect();
    assert!(
        report.is_empty(),
        "{name}, seed {}, {} checks:\n{}",
        stats.seed,
        stats.execs,
        report.join("\n")
    );
}

#[test]
fn wire() {
    fuzz_briefly("wire");
}

#[test]
fn shm() {
    fuzz_briefly("shm");
}

#[test]
fn session() {
    fuzz_briefly("session");
}

#[test]
fn ptx_parse() {
    fuzz_briefly("ptx_parse");
}

#[test]
fn ptx_run() {
    fuzz_briefly("ptx_run");
}

#[test]
fn fatbin() {
    fuzz_briefly("fatbin");
}

#[test]
fn config() {
    fuzz_briefly("config");
}

#[test]
fn plan() {
    fuzz_briefly("plan");
}

#[test]
fn checkpoint() {
    fuzz_briefly("checkpoint");
}
