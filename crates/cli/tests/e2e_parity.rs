//! What a GPU runs, the CPU device runs (issue 22): the programs of
//! tests/cuda/parity, built by nvcc and run unmodified through `cumux run`.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{RunOutput, ServerProc};

const LIMIT: Duration = Duration::from_secs(180);

/// The parity program `name.cu` built by nvcc with `flags`.
fn program(name: &str, flags: &[&str]) -> PathBuf {
    let source = cumux_testkit::workspace_root()
        .join("tests/cuda/parity")
        .join(format!("{name}.cu"));
    cumux_testkit::compile_program(source, flags)
}

/// Runs `name` built with `flags` on a server of its own; it must print
/// `NAME: PASS` and exit 0.
fn passes(name: &str, flags: &[&str]) -> RunOutput {
    let server = ServerProc::start(name);
    let out = server.run(&program(name, flags), &[], LIMIT);
    server.assert_pass(&out, name);
    out
}

#[test]
fn a_failed_device_assert_is_cuda_error_assert() {
    let out = passes("device_assert", &[]);
    // the file as nvcc was given it, then the line as a GPU prints it
    let line = "device_assert.cu:14: void checked(int *): block: [1,0,0], thread: [5,0,0] \
                Assertion `!(blockIdx.x == 1 && threadIdx.x == 5)` failed.";
    assert!(
        out.stdout.lines().any(|l| l.ends_with(line)),
        "no assertion line: {}",
        out.describe()
    );
}

#[test]
fn every_limit_reads_back_what_was_set() {
    let out = passes("limits", &[]);
    assert!(
        out.stdout.contains("limits kernel 42"),
        "{}",
        out.describe()
    );
}

#[test]
fn cp_async_copies_reach_shared_memory() {
    passes("cp_async", &["-arch=sm_80"]);
}

#[test]
fn the_ptx_of_the_reported_capability_runs_else_a_newer_one() {
    // compute_75 and compute_90: the device (7.5) runs compute_75
    passes(
        "multi_arch",
        &[
            "-gencode",
            "arch=compute_75,code=compute_75",
            "-gencode",
            "arch=compute_90,code=compute_90",
        ],
    );
    // compute_80 alone: it runs that, with reserved shared memory
    passes(
        "multi_arch",
        &["-gencode", "arch=compute_80,code=compute_80"],
    );
}

#[test]
fn a_jit_error_fills_the_programs_error_log() {
    let link = format!("-L{}", common::driver_link_folder("cumux-link").display());
    let server = ServerProc::start("jit_log");
    let out = server.run(&program("jit_log", &[&link, "-lcuda"]), &[], LIMIT);
    server.assert_pass(&out, "jit_log");
    assert!(out.stdout.contains("frobnicate"), "{}", out.describe());
}

#[test]
fn shared_window_addresses_wrap_at_32_bits() {
    passes("shared_window", &[]);
}

#[test]
fn grid_sync_in_a_cooperative_launch() {
    passes("grid_sync", &[]);
}

#[test]
fn device_malloc_and_new() {
    passes("device_malloc", &[]);
}

#[test]
fn indirect_calls_virtual_functions_and_recursion() {
    passes("indirect_calls", &[]);
}

/// Every corpus program built with compute_90 PTX alone (newer than the
/// device's 7.5): the device runs that PTX, and what it uses.
#[test]
fn corpus_programs_built_for_sm90_only_run() {
    let server = ServerProc::start("corpus90");
    let flags = ["-gencode", "arch=compute_90,code=compute_90"];
    let mut names: Vec<String> = std::fs::read_dir(cumux_testkit::corpus_dir())
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let cu = path.extension().is_some_and(|x| x == "cu");
            cu.then(|| path.file_stem().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    assert!(names.len() >= 20, "corpus programs: {names:?}");
    for name in names {
        let program = cumux_testkit::compile_program(cumux_testkit::corpus_source(&name), &flags);
        let out = server.run(&program, &[], LIMIT);
        server.assert_pass(&out, &name);
    }
}
