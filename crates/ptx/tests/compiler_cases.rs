//! The compiler's tricky cases (issue 22) on both engines with the same inputs:
//! same memory, fault and instruction count, and the result the kernel means
//! (`fixtures/compiler_cases.ptx`).

mod common;

use common::config;
use cumux_ptx::{DeviceMemory, Engine, Fault, LaunchConfig, LaunchLimits, LaunchReport, Program};
use std::sync::atomic::AtomicBool;

const BUFFER_BYTES: usize = 256 << 10;

/// Runs `kernel` on `engine`: each 8-byte parameter a buffer starting as
/// `input`, each 4-byte one `scalar`; the report and the first buffer.
fn run_on(
    engine: Engine,
    kernel: &str,
    cfg: LaunchConfig,
    input: &[u8],
    scalar: u32,
    limits: &LaunchLimits<'_>,
) -> (LaunchReport, Vec<u8>) {
    let mem = DeviceMemory::new(16 << 20);
    let mut program =
        Program::load(&common::fixture("compiler_cases.ptx"), &mem).expect("fixture loads");
    program.set_engine(engine);
    if engine == Engine::Compiler {
        program
            .compiled(kernel)
            .expect("the compiler takes the kernel");
    }
    let info = common::find_kernel(&program, kernel).clone();
    let buf = mem.alloc(BUFFER_BYTES as u64).expect("buffer");
    mem.write(buf, input).expect("upload");
    let mut params = vec![0u8; info.params_bytes() as usize];
    for p in &info.params {
        let at = p.offset as usize;
        if p.size == 8 {
            params[at..at + 8].copy_from_slice(&buf.to_le_bytes());
        } else {
            params[at..at + 4].copy_from_slice(&scalar.to_le_bytes());
        }
    }
    let report = program.launch_with(&mem, kernel, &cfg, &params, limits);
    let mut out = vec![0u8; BUFFER_BYTES];
    mem.read(buf, &mut out).expect("download");
    (report, out)
}

/// Both engines on the same launch; they must agree. The compiler's outcome.
fn both(
    kernel: &str,
    cfg: LaunchConfig,
    input: &[u8],
    scalar: u32,
    limits: &LaunchLimits<'_>,
) -> (LaunchReport, Vec<u32>) {
    let interp = run_on(Engine::Interpreter, kernel, cfg, input, scalar, limits);
    let jit = run_on(Engine::Compiler, kernel, cfg, input, scalar, limits);
    assert_eq!(interp.0, jit.0, "{kernel}: the engines' reports differ");
    assert!(interp.1 == jit.1, "{kernel}: the engines' memory differs");
    let words = jit
        .1
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (jit.0, words)
}

fn words(values: impl IntoIterator<Item = u32>) -> Vec<u8> {
    let mut out: Vec<u8> = values.into_iter().flat_map(|v| v.to_le_bytes()).collect();
    out.resize(BUFFER_BYTES, 0);
    out
}

const ONE_WORKER: LaunchLimits<'static> = LaunchLimits {
    workers: 1,
    ..LaunchLimits::NONE
};

#[test]
fn a_barrier_inside_a_loop_splits_the_loop_and_keeps_its_registers() {
    let input = words((0..4 * 256).map(|i| i * 3 + 1));
    for workers in [1, 2] {
        let limits = LaunchLimits {
            workers,
            ..LaunchLimits::NONE
        };
        let (report, out) = both(
            "tree",
            config([4, 1, 1], [256, 1, 1], 0),
            &input,
            0,
            &limits,
        );
        report.result.expect("the reduction runs");
        for b in 0..4u32 {
            let want: u32 = (b * 256..(b + 1) * 256).map(|i| i * 3 + 1).sum();
            assert_eq!(out[b as usize], want, "block {b}'s sum");
        }
    }
}

#[test]
fn divergent_paths_meet_at_different_barriers_of_one_id() {
    let (report, out) = both(
        "diverge",
        config([1, 1, 1], [64, 1, 1], 0),
        &words([]),
        0,
        &ONE_WORKER,
    );
    report.result.expect("the kernel runs");
    for t in 0..64u32 {
        let own = if t % 2 == 0 { t * 5 } else { t * 7 };
        assert_eq!(out[t as usize], own + (t ^ 1) * 3, "thread {t}");
    }
}

#[test]
fn threads_that_exit_do_not_hold_a_barrier() {
    let (report, out) = both(
        "early_exit",
        config([1, 1, 1], [96, 1, 1], 0),
        &words([]),
        0,
        &ONE_WORKER,
    );
    report.result.expect("the kernel runs");
    for t in 0..40u32 {
        assert_eq!(out[t as usize], 39 - t + 1000, "thread {t}");
    }
    assert_eq!(out[40], 0, "thread 40 exited first");
}

#[test]
fn a_spin_on_shared_memory_yields_to_the_thread_that_sets_it() {
    let (report, out) = both(
        "spin",
        config([2, 1, 1], [64, 1, 1], 0),
        &words([]),
        0,
        &ONE_WORKER,
    );
    report.result.expect("the spin ends");
    assert_eq!(out[0], 1);
}

#[test]
fn a_loop_past_the_block_budget_times_out_at_the_same_count() {
    let limits = LaunchLimits {
        per_block: 200_000,
        workers: 1,
        ..LaunchLimits::NONE
    };
    let (report, _) = both(
        "forever",
        config([2, 1, 1], [4, 1, 1], 0),
        &words([]),
        0,
        &limits,
    );
    let fault = report.result.expect_err("the budget stops it");
    assert_eq!(fault.cu_code(), 702, "{fault}");
}

#[test]
fn a_cancelled_launch_stops_on_both_engines() {
    let cancel = AtomicBool::new(true);
    let limits = LaunchLimits {
        cancel: Some(&cancel),
        workers: 1,
        ..LaunchLimits::NONE
    };
    let (report, _) = both(
        "forever",
        config([2, 1, 1], [4, 1, 1], 0),
        &words([]),
        0,
        &limits,
    );
    assert!(
        matches!(report.result, Err(Fault::Cancelled(_))),
        "{report:?}"
    );
}

#[test]
fn bad_accesses_fault_like_the_interpreter() {
    let cfg = config([2, 1, 1], [8, 1, 1], 0);
    let (report, out) = both("bad", cfg, &words([]), 0, &ONE_WORKER);
    report.result.expect("the good round trip runs");
    assert_eq!(out[0], 77);
    // global, shared, misaligned, local, vector, generic
    let codes = [700, 700, 716, 700, 716, 700];
    for (which, code) in (1..=6).zip(codes) {
        let (report, _) = both("bad", cfg, &words([]), which, &ONE_WORKER);
        let fault = report
            .result
            .expect_err(&format!("case {which}: a bad access faults"));
        assert_eq!(fault.cu_code(), code, "case {which}: {fault}");
    }
}

#[test]
fn a_program_with_compiled_kernels_moves_between_threads() {
    fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<Program>();
}

#[test]
fn a_warp_collective_no_lane_can_complete_is_the_interpreters_deadlock() {
    let (report, _) = both(
        "warp_deadlock",
        config([1, 1, 1], [32, 1, 1], 0),
        &words([]),
        0,
        &ONE_WORKER,
    );
    let fault = report.result.expect_err("the warp deadlocks");
    assert!(fault.to_string().contains("deadlock"), "{fault}");
}

#[test]
fn warp_collectives_in_divergent_code_match_the_interpreter() {
    let (report, out) = both(
        "warp_mix",
        config([2, 1, 1], [64, 1, 1], 0),
        &words([]),
        0,
        &ONE_WORKER,
    );
    report.result.expect("the kernel runs");
    for t in 0..64usize {
        let lane = (t % 32) as u32;
        let [active, redux, matched, up] = [0, 1, 2, 3].map(|k| out[t * 4 + k]);
        let odd = lane % 2 == 1;
        assert_eq!(
            active,
            if odd { 0xaaaa_aaaa } else { 0x5555_5555 },
            "thread {t}"
        );
        // the odd lanes of the warp: (32t/32 .. ) summed by their tids
        let base = (t / 32 * 32) as u32;
        let odd_sum: u32 = (0..32).filter(|l| l % 2 == 1).map(|l| base + l).sum();
        assert_eq!(redux, if odd { odd_sum } else { 7 }, "thread {t}");
        assert_eq!(matched, 0xf << (lane / 4 * 4), "thread {t}");
        let want_up = if lane >= 3 {
            t as u32 - 3 + 1
        } else {
            t as u32
        };
        assert_eq!(up, want_up, "thread {t}");
    }
}

#[test]
fn one_check_of_a_blocks_shared_accesses_keeps_each_accesss_fault() {
    let cfg = config([1, 1, 1], [4, 1, 1], 0);
    let (report, out) = both("shared_span", cfg, &words([]), 0, &ONE_WORKER);
    report.result.expect("in bounds");
    assert_eq!(out[..3], [8, 4, 8], "the last thread's values");
    let (report, _) = both("shared_span", cfg, &words([]), 2, &ONE_WORKER);
    assert_eq!(report.result.expect_err("misaligned").cu_code(), 716);
    let (report, out) = both("shared_span", cfg, &words([]), 0xffff_fff0, &ONE_WORKER);
    report
        .result
        .expect("wrapped 32-bit shared addresses stay in the window");
    assert_eq!(out[..3], [8, 4, 8]);
    // shifted past the end: once only the last access is out, thread 0
    // faults there with the stores before it done
    let mut last_only = 0;
    for which in (8..4096).step_by(8) {
        let (report, out) = both("shared_span", cfg, &words([]), which, &ONE_WORKER);
        if let Err(fault) = report.result {
            assert_eq!(fault.cu_code(), 700, "shift {which}: {fault}");
            last_only += (out[..3] == [0, 1, 2]) as u32;
        }
    }
    assert!(last_only > 0, "no shift faulted at the last access only");
}

#[test]
fn a_parameter_read_past_the_launchs_buffer_faults_where_the_interpreter_faults() {
    // the compiled code loads its parameters before its thread loop; a read
    // past them takes its own checked path, after the reads before it
    let (report, out) = both(
        "param_past",
        config([1, 1, 1], [4, 1, 1], 0),
        &words([]),
        9,
        &ONE_WORKER,
    );
    let fault = report
        .result
        .expect_err("a read past the parameters faults");
    assert_eq!(fault.cu_code(), 700, "{fault}");
    assert_eq!(out[..2], [9, 0], "the store before the bad read happened");
}

#[test]
fn bar_red_reduces_the_blocks_predicates_on_the_compiler() {
    for workers in [1, 2] {
        let limits = LaunchLimits {
            workers,
            ..LaunchLimits::NONE
        };
        let (report, out) = both(
            "bar_red",
            config([2, 1, 1], [96, 1, 1], 0),
            &words([]),
            0,
            &limits,
        );
        report.result.expect("the reductions run");
        for t in 0..96 {
            assert_eq!(out[t * 3..t * 3 + 3], [32, 0, 1], "thread {t}");
        }
    }
}

#[test]
fn a_register_a_block_never_set_reads_0_after_a_barrier() {
    // one worker runs block 0 (which sets the register) before the others
    let (report, out) = both(
        "stale",
        config([3, 1, 1], [32, 1, 1], 0),
        &words([]),
        0,
        &ONE_WORKER,
    );
    report.result.expect("the kernel runs");
    assert_eq!(out[..3], [77, 0, 0]);
}
