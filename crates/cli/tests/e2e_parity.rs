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

/// A program of tests/cuda/driver written for one of issue 22's items (and
/// run natively by the GPU smoke), built with `flags`; it must print `PASS`.
fn driver_passes(name: &str, flags: &[&str]) -> RunOutput {
    let program = cumux_testkit::compile_program(common::driver_source(name), flags);
    let server = ServerProc::start(name);
    let out = server.run(&program, &[], LIMIT);
    out.assert_passed();
    out
}

/// Item 1: PTX for compute_75, 80 and 90 only: the device runs compute_75's
/// and says so (`ptxVersion`, `cub::PtxVersion`, `__CUDA_ARCH__` agree).
#[test]
fn the_ptx_a_kernel_ran_is_the_one_it_reports() {
    let mut flags = Vec::new();
    for arch in ["75", "80", "90"] {
        flags.push("-gencode".to_string());
        flags.push(format!("arch=compute_{arch},code=compute_{arch}"));
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = driver_passes("ptx_choice", &flags);
    assert!(
        out.stdout.contains("ran compute_75 on a 7.5 device"),
        "{}",
        out.describe()
    );
}

/// Item 2: every kind of shared access through a 32-bit address that wrapped.
#[test]
fn shared_accesses_through_wrapped_addresses() {
    driver_passes("shared_wrap", &[]);
}

/// Item 3: device function pointers from the host, mutual recursion through
/// a table, a recursive quicksort, a stack raised past the default.
#[test]
fn function_pointers_recursion_and_the_stack_they_need() {
    driver_passes("indirect_recursion", &[]);
}

/// Item 4: the largest co-resident cooperative grid syncs; one block more is
/// refused at the call with 720, and the context goes on.
#[test]
fn a_full_cooperative_grid_syncs_and_one_block_more_is_refused() {
    driver_passes("grid_sync_full", &[]);
}

/// Item 5: the device heap across kernels, constructors and destructors,
/// running out and taking allocations again.
#[test]
fn the_device_heap_outlives_its_kernel() {
    driver_passes("device_heap", &[]);
}

/// Memory and events shared between two programs (`cudaIpc*`): a child's
/// kernel fills the parent's buffer, and the parent's stream waits for the
/// child's record of the parent's event; forged handles open nothing.
#[test]
fn two_programs_share_memory_and_an_event() {
    let out = driver_passes("ipc_programs", &[]);
    let in_workers = common::e2e_device() == "worker-cpu";
    assert_eq!(
        out.stdout.contains("no events shared"),
        in_workers,
        "{}",
        out.describe()
    );
}

/// Dynamic parallelism: nested launches through device-made streams, a
/// recursive quicksort, a tail launch, bad launches' codes in the kernel and a
/// child's bad write failing the host's launch with 700.
#[test]
fn device_side_launches_run_after_their_parent() {
    let out = driver_passes("device_launch", &["-rdc=true", "-lcudadevrt"]);
    assert!(
        out.stdout.contains("launches nest 2048 deep"),
        "{}",
        out.describe()
    );
}

/// Item 6: three ways to fail an assert, each 710 and sticky.
#[test]
fn failed_asserts_are_710_wherever_they_fail() {
    let out = driver_passes("assert_code", &[]);
    assert_eq!(
        out.stdout.matches(": cudaErrorAssert").count(),
        3,
        "{}",
        out.describe()
    );
}

/// Item 7: cp.async with cuda::barrier (mbarrier), cuda::pipeline, the
/// pipeline primitives and cooperative groups, double-buffered.
#[test]
fn async_copies_through_barriers_and_pipelines() {
    driver_passes("async_copies", &["-arch=sm_80"]);
}

/// Item 8: the printf FIFO reads back what was set and holds what a GPU's does.
#[test]
fn the_printf_fifo_is_kept_and_used() {
    let link = format!("-L{}", common::driver_link_folder("cumux-link").display());
    let out = driver_passes("printf_fifo", &[&link, "-lcuda"]);
    assert!(out.stdout.contains("24000 lines"), "{}", out.describe());
}

/// CUB's tile descriptors (`tests/cuda/driver/tile_descriptors.cu`): a
/// `st.relaxed.gpu.v2.u64` pair published by one
/// block and read back by two others whole, never half new and half old
/// (on a device of 3 threads, so that the three blocks run at once).
#[test]
fn ordered_16_byte_pairs_are_never_torn() {
    let name = "tile_descriptors";
    let args = [
        "--device",
        &common::e2e_device(),
        "--memory",
        "256M",
        "--threads",
        "3",
    ]
    .map(String::from);
    let server = ServerProc::spawn(common::TempDir::new(name), &args, &[]);
    let program = cumux_testkit::compile_program(common::driver_source(name), &[]);
    let out = server.run(&program, &[], LIMIT);
    out.assert_passed();
}

/// Pinned host memory reached by the program's pointer (zero-copy), in this
/// process's CPU device and in a CPU worker: a memset, atomics, a kernel
/// over mapped vectors and device-to-device copies in and out of it.
#[test]
fn kernels_reach_pinned_host_memory_by_its_pointer() {
    let program = cumux_testkit::compile_program(common::driver_source("zero_copy_kernel"), &[]);
    for device in ["cpu", "worker-cpu"] {
        let dir = common::TempDir::new("zero-copy");
        let args = ["--device", device, "--memory", "1G"].map(String::from);
        let server = ServerProc::spawn(dir, &args, &[]);
        let out = server.run(&program, &[], LIMIT);
        assert!(
            out.code() == Some(0) && out.stdout.contains("PASS"),
            "on {device}: {}",
            out.describe()
        );
    }
}
