//! End to end on the CUDA 13.5 runtime: programs built with `-cudart shared`
//! run through `cumux run` against `cumux serve --device cpu` with the 13.5
//! `libcudart.so.13` (PyPI `nvidia-cuda-runtime==13.5.37`, which
//! `scripts/setup-nvcc` installs into `.venv/cuda135`) first on
//! `LD_LIBRARY_PATH`. The 13.5 runtime asks the driver for more than 13.0's
//! does (the tools context export table, integrity checks 13050–13052); each
//! test checks from the client's log that it was the 13.5 runtime that ran.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{wait_bounded, RunOutput, ServerProc};

const LIMIT: Duration = Duration::from_secs(180);

/// `.venv/cuda135/nvidia/cu13/lib`, holding the 13.5 `libcudart.so.13`.
/// Missing is a failure, not a skip: CI runs `scripts/setup-nvcc` first.
fn runtime_135_lib() -> PathBuf {
    let lib = cumux_testkit::workspace_root().join(".venv/cuda135/nvidia/cu13/lib");
    assert!(
        lib.join("libcudart.so.13").is_file(),
        "the CUDA 13.5 runtime is not installed: {} has no libcudart.so.13; run \
         `scripts/setup-nvcc` from the workspace root (it pip-installs \
         nvidia-cuda-runtime==13.5.37 into .venv/cuda135)",
        lib.display()
    );
    lib
}

/// A folder where `-lcudart` finds the 13.5 runtime (PyPI ships only the
/// versioned name), at a fixed place so the compile cache can reuse builds.
fn cudart_link_dir() -> PathBuf {
    let target = runtime_135_lib().join("libcudart.so.13");
    common::linked_folder("cumux-cudart135", "libcudart.so", &target)
}

/// A folder where `-lcuda` finds the client driver itself.
fn driver_link_dir() -> PathBuf {
    common::driver_link_folder("cumux-link135")
}

/// `source` built with the runtime as a shared library, linked against 13.5's.
fn shared_runtime_program(source: PathBuf, extra: &[&str]) -> PathBuf {
    let search = format!("-L{}", cudart_link_dir().display());
    let mut args = vec!["-cudart", "shared", search.as_str()];
    args.extend_from_slice(extra);
    cumux_testkit::compile_program(source, &args)
}

fn corpus(name: &str) -> PathBuf {
    shared_runtime_program(cumux_testkit::corpus_source(name), &[])
}

fn driver(name: &str, extra: &[&str]) -> PathBuf {
    shared_runtime_program(common::driver_source(name), extra)
}

/// Runs `program` through cumux with the 13.5 runtime first on the library
/// path and the client logging at debug level.
fn run_135(server: &ServerProc, program: &Path, args: &[&str]) -> RunOutput {
    let mut command: Command = server.command(program, args);
    command
        .env("LD_LIBRARY_PATH", runtime_135_lib())
        .env("CUMUX_LOG", "debug");
    wait_bounded(command.spawn().expect("cumux run starts"), LIMIT)
}

/// The program passed, and the runtime that ran it was 13.5's.
fn passes_on_135(server: &ServerProc, program: &Path, args: &[&str]) -> RunOutput {
    let out = run_135(server, program, args);
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    assert!(
        out.stdout.lines().any(|l| {
            let l = l.trim();
            l == "PASS" || l.contains(": PASS")
        }),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr
            .contains("cuGetExportTable(21318c60-9714-3248-8ca6-41ff7324c8f2): answered"),
        "the 13.5 runtime did not run (it asks for the tools context table; 13.0 does not): {}",
        out.describe()
    );
    assert!(
        !out.stderr.contains("unknown table"),
        "the runtime asked for a table cumux does not answer: {}",
        out.describe()
    );
    out
}

#[test]
fn corpus_programs_on_the_135_runtime() {
    let server = ServerProc::start("rt135-corpus");
    for name in ["vector_add", "reduce_shfl", "printf_kernel", "matmul_tiled"] {
        let out = passes_on_135(&server, &corpus(name), &[]);
        assert!(
            out.stderr
                .contains("dark API integrity check: version 13050"),
            "{name}: no 13.5 integrity check: {}",
            out.describe()
        );
    }
}

#[test]
fn driver_programs_on_the_135_runtime() {
    let server = ServerProc::start("rt135-driver");
    for name in [
        "device_query",
        "streams_events",
        "host_callback",
        "graph_capture",
        "managed_memory",
        "memcpy_to_symbol",
        "pinned_memory",
        "threads",
        "launch_limits",
    ] {
        passes_on_135(&server, &driver(name, &[]), &[]);
    }
}

#[test]
fn per_thread_default_stream_on_the_135_runtime() {
    let server = ServerProc::start("rt135-ptds");
    let program = driver("streams_events", &["--default-stream", "per-thread"]);
    passes_on_135(&server, &program, &[]);
}

#[test]
fn driver_api_program_on_the_135_runtime() {
    let link = format!("-L{}", driver_link_dir().display());
    let program = driver("driver_api", &[&link, "-lcuda"]);
    let fatbin = cumux_testkit::workspace_root().join("crates/fatbin/tests/fixtures/zstd.fatbin");
    let server = ServerProc::start("rt135-driverapi");
    passes_on_135(&server, &program, &[fatbin.to_str().unwrap()]);
}

#[test]
fn relocatable_device_code_on_the_135_runtime() {
    let helper = common::driver_source("rdc_helper");
    let program = driver("rdc_program", &["-rdc=true", helper.to_str().unwrap()]);
    let server = ServerProc::start("rt135-rdc");
    passes_on_135(&server, &program, &[]);
}
