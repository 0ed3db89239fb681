//! Replays every target's seeds and corpus folder (`crates/fuzz/corpus/TARGET`):
//! each input once, none may panic. Crashes the fuzzer found stay there as
//! regression cases.

use std::time::Duration;

use cumux_fuzz::engine::replay;
use cumux_fuzz::{corpus_root, targets};

fn replays_cleanly(name: &str) {
    let target = targets::by_name(name).expect("a target of that name");
    let failed = replay(target, &corpus_root(), Duration::from_secs(120));
    let report: Vec<String> = failed
        .iter()
        .map(|(input, panic)| format!("{input}: panic at {}: {}", panic.location, panic.message))
        .collect();
    assert!(report.is_empty(), "{name}:\n{}", report.join("\n"));
}

#[test]
fn wire() {
    replays_cleanly("wire");
}

#[test]
fn shm() {
    replays_cleanly("shm");
}

#[test]
fn session() {
    replays_cleanly("session");
}

#[test]
fn ptx_parse() {
    replays_cleanly("ptx_parse");
}

#[test]
fn ptx_run() {
    replays_cleanly("ptx_run");
}

#[test]
fn fatbin() {
    replays_cleanly("fatbin");
}

#[test]
fn config() {
    replays_cleanly("config");
}

#[test]
fn plan() {
    replays_cleanly("plan");
}

#[test]
fn checkpoint() {
    replays_cleanly("checkpoint");
}

#[test]
fn every_target_has_a_test_here() {
    let names: Vec<&str> = targets::all().iter().map(|t| t.name).collect();
    assert_eq!(
        names,
        [
            "wire",
            "shm",
            "session",
            "ptx_parse",
            "ptx_run",
            "fatbin",
            "config",
            "plan",
            "checkpoint"
        ]
    );
}
