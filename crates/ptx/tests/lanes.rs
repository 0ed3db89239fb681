//! The compiler's lane kernel (issue 22) on both engines with the same inputs:
//! same memory, fault and instruction count; blocks that run in step, and
//! blocks whose lanes part and run again thread by thread (`fixtures/lanes.ptx`).

mod common;

use common::config;
use cumux_ptx::{
    lane_blocks, DeviceMemory, Engine, LaunchConfig, LaunchLimits, LaunchReport, Program,
};

const BUFFER_BYTES: usize = 64 << 10;

/// Runs `kernel` on `engine`: its 8-byte parameters buffers starting as
/// `inputs` (in order), each 4-byte one `scalar`; the report and buffers.
fn run_on(
    engine: Engine,
    kernel: &str,
    cfg: LaunchConfig,
    inputs: &[Vec<u8>],
    scalar: u32,
    workers: usize,
) -> (LaunchReport, Vec<Vec<u8>>) {
    let mem = DeviceMemory::new(16 << 20);
    let mut program = Program::load(&common::fixture("lanes.ptx"), &mem).expect("fixture loads");
    program.set_engine(engine);
    let info = common::find_kernel(&program, kernel).clone();
    let mut params = vec![0u8; info.params_bytes() as usize];
    let mut bufs = Vec::new();
    for p in &info.params {
        let at = p.offset as usize;
        if p.size == 8 {
            let buf = mem.alloc(BUFFER_BYTES as u64).expect("buffer");
            let input = inputs.get(bufs.len()).cloned().unwrap_or_default();
            mem.write(buf, &input).expect("upload");
            params[at..at + 8].copy_from_slice(&buf.to_le_bytes());
            bufs.push(buf);
        } else {
            params[at..at + 4].copy_from_slice(&scalar.to_le_bytes());
        }
    }
    let limits = LaunchLimits {
        workers,
        ..LaunchLimits::NONE
    };
    let report = program.launch_with(&mem, kernel, &cfg, &params, &limits);
    let outs = bufs
        .iter()
        .map(|&b| {
            let mut out = vec![0u8; BUFFER_BYTES];
            mem.read(b, &mut out).expect("download");
            out
        })
        .collect();
    (report, outs)
}

/// Both engines on the same launch, with one worker and two; they must
/// agree. The compiler's report and first buffer as words.
fn both(
    kernel: &str,
    cfg: LaunchConfig,
    inputs: &[Vec<u8>],
    scalar: u32,
) -> (LaunchReport, Vec<u32>) {
    let interp = run_on(Engine::Interpreter, kernel, cfg, inputs, scalar, 1);
    let mut last = None;
    for workers in [1, 2] {
        let jit = run_on(Engine::Compiler, kernel, cfg, inputs, scalar, workers);
        if workers == 1 {
            assert_eq!(interp.0, jit.0, "{kernel}: the engines' reports differ");
        } else {
            assert_eq!(
                interp.0.result, jit.0.result,
                "{kernel}: two workers' result"
            );
        }
        assert!(
            interp.1 == jit.1,
            "{kernel} ({workers} workers): the engines' memory differs"
        );
        last = Some(jit);
    }
    let (report, bufs) = last.expect("ran");
    let words = bufs[0]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (report, words)
}

fn floats(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn every_kind_of_op_runs_in_step_as_the_interpreter_runs_it() {
    let (ran, _) = lane_blocks();
    for (block, inputs) in [
        (64, floats((0..1024).map(|i| i as f32 * 0.25 + 1.0))),
        // negatives, zeros, NaNs and infinities among the inputs
        (
            128,
            floats((0..1024).map(|i| match i % 7 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => -0.0,
                3 => -(i as f32),
                _ => i as f32 / 3.0,
            })),
        ),
    ] {
        let (report, out) = both(
            "lanes_mix",
            config([3, 1, 1], [block, 1, 1], 0),
            &[vec![], inputs],
            0,
        );
        report.result.expect("the kernel runs");
        assert!(out.iter().any(|&w| w != 0), "the kernel wrote its results");
    }
    let (ran_after, _) = lane_blocks();
    assert!(
        ran_after >= ran + 6,
        "the blocks ran in step: {ran} then {ran_after}"
    );
}

#[test]
fn a_block_whose_lanes_part_is_undone_and_runs_thread_by_thread() {
    let (_, undone) = lane_blocks();
    let (report, out) = both("lanes_split", config([2, 1, 1], [64, 1, 1], 0), &[], 0);
    report.result.expect("the kernel runs");
    for (t, &got) in out[..128].iter().enumerate() {
        let want = if t % 2 == 0 { 10 } else { 101 };
        assert_eq!(got, want, "thread {t}: its 1 added once");
    }
    let (_, undone_after) = lane_blocks();
    assert!(undone_after > undone, "a block's lanes parted");
}

#[test]
fn atomics_hand_out_tickets_in_thread_order() {
    let (report, out) = both("lanes_atomic", config([1, 1, 1], [32, 1, 1], 0), &[], 0);
    report.result.expect("the kernel runs");
    assert_eq!(out[0], 32, "every thread took a ticket");
    for t in 0..32usize {
        assert_eq!(out[16 + t], 1, "thread {t}'s word: 1 added once");
        assert_eq!(out[48 + t], t as u32, "thread {t}'s ticket");
    }
}

#[test]
fn a_fault_in_one_lane_counts_and_leaves_memory_as_the_interpreter() {
    for which in [0, 1, 5, 30, 99] {
        let (report, out) = both("lanes_fault", config([1, 1, 1], [32, 1, 1], 0), &[], which);
        if which < 32 {
            report
                .result
                .expect_err("the read past shared memory faults");
        } else {
            report.result.expect("no thread reads past shared memory");
            assert_eq!(out[..32], [1; 32]);
        }
    }
}

#[test]
fn bar_arrive_and_barriers_with_counts_compile_and_resolve_as_interpreted() {
    let mem = DeviceMemory::new(1 << 20);
    let program = Program::load(&common::fixture("lanes.ptx"), &mem).expect("lanes.ptx loads");
    program
        .compiled("named_bars")
        .expect("the compiler takes it");
    let (report, out) = both("named_bars", config([2, 1, 1], [128, 1, 1], 0), &[], 0);
    report.result.expect("the kernel runs");
    for g in 0..256u32 {
        let t = g % 128;
        let want = if t < 64 { 7 } else { 2 * (3 * (t - 64) + 1) };
        assert_eq!(out[g as usize], want + 1000, "thread {g}");
    }
}

fn words(values: impl IntoIterator<Item = u32>) -> Vec<u8> {
    values.into_iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn a_kernel_without_barriers_whose_lanes_part_has_its_block_undone() {
    let (_, undone) = lane_blocks();
    let input = words((0..1024).map(|i| i * 7));
    let (report, out) = both(
        "flat_diverge",
        config([4, 1, 1], [64, 1, 1], 0),
        std::slice::from_ref(&input),
        0,
    );
    report.result.expect("the kernel runs");
    for (t, &got) in out[..256].iter().enumerate() {
        let x = t as u32 * 7 + 1;
        let want = if t % 2 == 0 { x * 10 } else { x + 100 };
        assert_eq!(got, want, "thread {t}: its 1 added once");
    }
    let (_, undone_after) = lane_blocks();
    assert!(undone_after > undone, "a block's lanes parted");
}

#[test]
fn a_kernel_without_barriers_runs_in_step_and_a_bounds_check_inside_a_group_undoes_its_block() {
    for n in [256, 203, 201, 1, 0] {
        let (ran, _) = lane_blocks();
        let input = words(0..1024);
        let (report, out) = both(
            "flat_tail",
            config([4, 1, 1], [64, 1, 1], 0),
            std::slice::from_ref(&input),
            n,
        );
        report.result.expect("the kernel runs");
        for (i, &got) in out[..300].iter().enumerate() {
            let want = if (i as u32) < n {
                i as u32 + 3
            } else {
                i as u32
            };
            assert_eq!(got, want, "word {i} (n {n})");
        }
        let (ran_after, _) = lane_blocks();
        if n == 256 {
            // four blocks in step, on one worker and on two
            assert!(
                ran_after >= ran + 8,
                "blocks ran in step: {ran} then {ran_after}"
            );
        }
    }
}

#[test]
fn a_64_bit_address_out_of_bounds_in_one_lane_faults_there_with_700() {
    for kernel in ["wide_fault_store", "wide_fault_load"] {
        for which in [0, 1, 3, 6, 130, 255, 999] {
            let (_, undone) = lane_blocks();
            let input = words(0..1024);
            let (report, out) = both(
                kernel,
                config([4, 1, 1], [64, 1, 1], 0),
                std::slice::from_ref(&input),
                which,
            );
            if which < 256 {
                let fault = report.result.expect_err("the lane's access faults");
                assert!(
                    matches!(fault, cumux_ptx::Fault::IllegalAddress { .. }),
                    "{kernel} ({which}): {fault:?}"
                );
                assert_eq!(fault.cu_code(), 700, "{kernel} ({which})");
                // the threads before it ran, the faulting one to its fault
                assert_eq!(out[which as usize], which + 1, "{kernel}: thread {which}");
                let (_, undone_after) = lane_blocks();
                assert!(
                    undone_after > undone,
                    "{kernel}: the block ran in step first"
                );
            } else {
                report.result.expect("every address is in bounds");
                // its 1 added, and for the load that word added again
                let want = if kernel == "wide_fault_store" { 6 } else { 12 };
                assert_eq!(out[5], want, "{kernel}: word 5");
            }
        }
    }
}

#[test]
fn a_lane_by_lane_op_that_reads_its_own_destination_keeps_it() {
    let (report, out) = both("flat_or_pred", config([1, 1, 1], [16, 1, 1], 0), &[], 0);
    report.result.expect("the kernel runs");
    for (t, &got) in out[..16].iter().enumerate() {
        assert_eq!(got, u32::from(!(3..9).contains(&t)), "thread {t}");
    }
}

#[test]
fn two_accesses_off_one_consecutive_index_still_check_their_own_bounds() {
    let input = words(0..16384);
    // two blocks of 64: every address inside; four: thread 128's second
    // access runs past `inp`'s end
    for (blocks, faults) in [(2u32, false), (4, true)] {
        let (_, undone) = lane_blocks();
        let (report, out) = both(
            "offset_fault",
            config([blocks, 1, 1], [64, 1, 1], 0),
            &[words(0..1024), input.clone()],
            0,
        );
        if faults {
            let fault = report.result.expect_err("thread 128's load faults");
            assert_eq!(fault.cu_code(), 700, "{fault:?}");
            let (_, undone_after) = lane_blocks();
            assert!(undone_after > undone, "the block ran in step first");
        } else {
            report.result.expect("every address is in bounds");
            for (i, &got) in out[..128].iter().enumerate() {
                assert_eq!(got, i as u32 + 16256 + i as u32, "word {i}");
            }
        }
    }
}

#[test]
fn accesses_whose_index_is_not_affine_in_the_thread_run_lane_by_lane() {
    let (ran, _) = lane_blocks();
    let (report, out) = both(
        "flat_gather",
        config([4, 1, 1], [64, 1, 1], 0),
        &[vec![], words((0..1024).map(|i| i * 3))],
        0,
    );
    report.result.expect("the kernel runs");
    for i in 0..256u32 {
        let flags = match i {
            0..100 => 321000,
            201.. => 1000,
            _ => 0,
        };
        assert_eq!(
            out[(255 - i) as usize],
            ((37 * i) & 255) * 3 + flags,
            "thread {i}"
        );
    }
    let (ran_after, _) = lane_blocks();
    assert!(ran_after >= ran + 8, "the blocks ran in step");
}

#[test]
fn a_lone_shared_store_past_the_array_faults_as_the_interpreter() {
    for which in [0, 1] {
        let (report, out) = both(
            "shared_tail",
            config([2, 1, 1], [64, 1, 1], 256),
            &[],
            which,
        );
        if which == 0 {
            report.result.expect("every store is inside the array");
            for (t, &got) in out[..64].iter().enumerate() {
                assert_eq!(got, t as u32 + 7, "thread {t}");
            }
        } else {
            let fault = report.result.expect_err("the last thread's store faults");
            assert_eq!(fault.cu_code(), 700, "{fault:?}");
        }
    }
}

#[test]
fn a_lane_varying_value_plus_a_consecutive_address_is_checked_again() {
    let (report, out) = both(
        "offset_mixed",
        config([4, 1, 1], [64, 1, 1], 0),
        &[words(0..2048)],
        0,
    );
    report.result.expect("the kernel runs");
    for i in 0..256u32 {
        let (own, far) = (i as usize, i as usize + 1024);
        if i % 2 == 0 {
            assert_eq!(out[own], i + 6, "word {i}: 1 and 5 added");
        } else {
            assert_eq!(out[own], i + 1, "word {i}: 1 added");
            assert_eq!(out[far], far as u32 + 5, "word {far}: 5 added");
        }
    }
}

#[test]
fn shared_bases_whose_lanes_are_known_before_the_run_read_as_interpreted() {
    // 16 x 4: a group's lanes share a row (the row's base is one word for
    // all, the column's consecutive, known from the registers' strides);
    // 2 x 8: a group spans two rows, so the row's base differs between its
    // lanes (wrong where the strides were taken without `%ntid.x` a
    // multiple of 4: such a block runs on the thread loop); in both, the
    // base a lane-varying guard moves differs
    for block in [[16, 4, 1], [2, 8, 1]] {
        let (ran, _) = lane_blocks();
        let (report, out) = both("shared_strides", config([1, 1, 1], block, 0), &[], 0);
        report.result.expect("the kernel runs");
        let (ran_after, _) = lane_blocks();
        if block[0] % 4 == 0 {
            assert!(ran_after > ran, "{block:?}: the blocks ran in step");
        }
        let word = |i: u32| 3 * i + 1;
        for ty in 0..block[1] {
            for tx in 0..block[0] {
                let t = (ty * block[0] + tx) as usize;
                let got = &out[3 * t..3 * t + 3];
                let want = [
                    word(ty * 16 + 1),
                    word(tx + 16),
                    word(ty * 16 + 2 * (tx & 1)),
                ];
                assert_eq!(got, want, "{block:?}: thread ({tx}, {ty})");
            }
        }
    }
}

#[test]
fn a_strided_index_that_wraps_inside_a_group_faults_where_interpreted() {
    // `i + s` wraps past 2^31 (or 2^32) between the group's lanes 2 and 3,
    // or 1 and 2, or not
    for kernel in ["strided_wrap", "strided_wrap_u"] {
        let top: u32 = if kernel == "strided_wrap" {
            0x8000_0000
        } else {
            0
        };
        for (s, first_fault) in [
            (0, None),
            (top.wrapping_sub(4), None),
            (top.wrapping_sub(3), Some(3)),
            (top.wrapping_sub(2), Some(2)),
            (top.wrapping_sub(1), Some(1)),
        ] {
            let input = words(0..1024);
            let (report, out) = both(
                kernel,
                config([1, 1, 1], [64, 1, 1], 0),
                std::slice::from_ref(&input),
                s,
            );
            match first_fault {
                None => {
                    report.result.expect("nothing wraps");
                    for (i, &got) in out[..64].iter().enumerate() {
                        let want = if i < 4 { 2 * i as u32 } else { i as u32 };
                        assert_eq!(got, want, "{kernel} ({s:#x}): word {i}");
                    }
                }
                Some(t) => {
                    let fault = report.result.expect_err("the wrapped lanes fault");
                    assert_eq!(fault.cu_code(), 700, "{kernel} ({s:#x}): {fault:?}");
                    for (i, &got) in out[..64].iter().enumerate() {
                        let want = if i < t { 2 * i as u32 } else { i as u32 };
                        assert_eq!(got, want, "{kernel} ({s:#x}): word {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn strided_addresses_not_consecutive_or_past_the_end_run_as_interpreted() {
    let last = (BUFFER_BYTES / 4) as u32;
    // lanes 8 bytes apart: lane by lane; past the end: the group whose
    // words straddle it faults at its first lane outside
    for (k, faults) in [(0, false), (1, false), (last - 250, true)] {
        let input = words(0..last);
        let (report, out) = both(
            "strided_skip",
            config([2, 1, 1], [64, 1, 1], 0),
            std::slice::from_ref(&input),
            k,
        );
        if faults {
            let fault = report
                .result
                .expect_err("thread 125's word is past the end");
            assert_eq!(fault.cu_code(), 700, "{fault:?}");
            assert_eq!(
                out[last as usize - 2],
                last - 2 + 124 + 1,
                "thread 124 stored"
            );
            continue;
        }
        report.result.expect("every address is inside");
        for t in 0..128u32 {
            let w = (2 * t + k) as usize;
            assert_eq!(out[w], w as u32 + t + 1, "thread {t} (k {k})");
        }
    }
    for (k, faults) in [(0, false), (last - 6, true)] {
        // word k + 6 is past the end: the second group straddles it
        let (report, out) = both(
            "strided_rows",
            config([1, 1, 1], [8, 1, 1], 0),
            &[words(0..last)],
            k,
        );
        if faults {
            let fault = report.result.expect_err("a lane past the end faults");
            assert_eq!(fault.cu_code(), 700, "{fault:?}");
            assert_eq!(out[last as usize - 1], last - 1 + 6, "thread 5 stored");
        } else {
            report.result.expect("every address is inside");
        }
    }
}

#[test]
fn strided_registers_of_a_block_whose_groups_span_rows_read_as_interpreted() {
    // 16 x 4: a group's lanes consecutive; 2 x 8: a group spans two rows,
    // its index's lanes not consecutive (the strides do not hold)
    for block in [[16, 4, 1], [2, 8, 1], [6, 2, 1]] {
        let (report, out) = both(
            "strided_rows",
            config([1, 1, 1], block, 0),
            &[words(0..1024)],
            3,
        );
        report.result.expect("the kernel runs");
        for y in 0..block[1] {
            for x in 0..block[0] {
                let i = 16 * y + x;
                let w = (i + 3) as usize;
                assert_eq!(out[w], w as u32 + i + 1, "{block:?}: thread ({x}, {y})");
            }
        }
    }
}

#[test]
fn threads_of_one_call_that_stop_apart_are_taken_one_by_one() {
    // 64 threads: groups of lanes; 62: the thread loop alone
    for block in [64, 62] {
        let (report, out) = both("stops_apart", config([1, 1, 1], [block, 1, 1], 0), &[], 0);
        report.result.expect("the kernel runs");
        for (t, &got) in out[..64].iter().enumerate() {
            let want = match t as u32 {
                t if t >= block => 0,
                t if t < 8 => 1,
                _ => 3,
            };
            assert_eq!(got, want, "word {t} (block {block})");
        }
    }
}

#[test]
fn a_predicate_written_again_guards_with_its_new_value() {
    let (report, out) = both("pred_rewritten", config([1, 1, 1], [64, 1, 1], 0), &[], 0);
    report.result.expect("the kernel runs");
    for (i, &got) in out[..64].iter().enumerate() {
        let want = if i >= 6 { 1 } else { 2 } + if i >= 5 { 10 } else { 20 };
        assert_eq!(got, want, "word {i}");
    }
}

#[test]
fn a_group_whose_last_word_is_past_the_allocation_faults_at_that_thread() {
    // the 64 KiB buffer holds 16,384 words: from word 16,377 the second
    // group's 16 bytes end 4 bytes past it (700 at its last thread, as
    // interpreted: `both`; the first group's access, inside, filled the
    // access's cache), from 16,376 they end at its end
    for (k, fault) in [(16_377, true), (16_376, false)] {
        let (report, _) = both(
            "strided_rows",
            config([1, 1, 1], [8, 1, 1], 0),
            &[words(0..16_384)],
            k,
        );
        match report.result {
            Err(e) if fault => assert_eq!(e.cu_code(), 700, "{e}"),
            r => assert_eq!(r.is_ok(), !fault, "offset {k}: {r:?}"),
        }
    }
}

#[test]
fn a_shared_word_misaligned_past_an_aligned_low_end_faults_as_interpreted() {
    for which in [0, 2] {
        let (ran, _) = lane_blocks();
        let (report, out) = both(
            "shared_halves",
            config([2, 1, 1], [64, 1, 1], 512),
            &[],
            which,
        );
        if which == 0 {
            report.result.expect("every load is aligned");
            let (ran_after, _) = lane_blocks();
            assert!(ran_after > ran, "the blocks ran in step");
            for (t, &got) in out[..64].iter().enumerate() {
                assert_eq!(got, t as u32, "thread {t}");
            }
        } else {
            let fault = report.result.expect_err("the word's load is misaligned");
            assert_eq!(fault.cu_code(), 716, "{fault:?}");
        }
    }
}

#[test]
fn lazily_made_registers_read_memory_and_lanes_as_interpreted() {
    // fails where a load made late passes a store, where a guarded write
    // is taken to end a lazy register's life, or where one read only in
    // the next block is left unmade
    let which = 32;
    let (ran, _) = lane_blocks();
    let (report, out) = both("lazy_regs", config([1, 1, 1], [64, 1, 1], 512), &[], which);
    report.result.expect("the kernel runs");
    let (ran_after, _) = lane_blocks();
    assert!(ran_after > ran, "the block ran in step");
    for t in 0..64u32 {
        let own = if t < which { 10.0 } else { t as f32 + 4.0 };
        assert_eq!(f32::from_bits(out[t as usize]), own, "thread {t}");
        let next = 2.0 * t as f32 + 5.0;
        assert_eq!(
            f32::from_bits(out[64 + t as usize]),
            next,
            "thread {t}'s next block"
        );
    }
}

#[test]
fn a_group_that_parts_or_faults_restarts_its_block_from_itself() {
    // the words before the failed group's were stored unlogged, once: a
    // block run again from its start would add to them twice
    for (kernel, which) in [
        ("restart_part", 70),
        ("restart_part", 1000),
        ("restart_fault", 70),
    ] {
        let (_, parted) = lane_blocks();
        let (report, out) = both(
            kernel,
            config([2, 1, 1], [64, 1, 1], 0),
            &[words(0..1024)],
            which,
        );
        let upto = match kernel {
            "restart_fault" => {
                let fault = report.result.expect_err("thread 70's load faults");
                assert_eq!(fault.cu_code(), 700, "{fault:?}");
                // (thread 70 stored its 1, then faulted)
                71
            }
            _ => {
                report.result.expect("the kernel runs");
                128
            }
        };
        for (i, &got) in out[..130].iter().enumerate() {
            let i = i as u32;
            let want = match i {
                i if i >= upto => i,
                i if i == which && kernel == "restart_part" => i + 100,
                i => i + 1,
            };
            assert_eq!(got, want, "{kernel} ({which}): word {i}");
        }
        let (_, parted_after) = lane_blocks();
        if which < 128 {
            assert!(parted_after > parted, "{kernel}: a group failed");
        }
    }
}

#[test]
fn predicates_combined_from_setps_guard_as_interpreted() {
    // `k` inside a group (13), at a group's start (16), past the block
    for k in [13, 16, 100] {
        let (ran, _) = lane_blocks();
        let (report, out) = both("pred_logic", config([1, 1, 1], [64, 1, 1], 0), &[], k);
        report.result.expect("the kernel runs");
        let (ran_after, _) = lane_blocks();
        assert!(ran_after > ran, "k {k}: the blocks ran in step");
        for (t, &got) in out[..64].iter().enumerate() {
            let t = t as u32;
            let (p1, p2) = (t & 7 < 3, t >= k);
            let want = (p1 | p2) as u32
                + 2 * !(p1 & p2) as u32
                + 4 * (p1 ^ p2) as u32
                + 8 * !(32..48).contains(&t) as u32;
            assert_eq!(got, want, "k {k}: word {t}");
        }
    }
}

#[test]
fn registers_kept_in_the_lane_file_between_blocks_read_as_interpreted() {
    // `k` inside a group (13), at a group's start (16)
    for k in [13, 16] {
        let (ran, _) = lane_blocks();
        // (two blocks: the second's lanes start from the first's lane file)
        let (report, out) = both("resident", config([2, 1, 1], [64, 1, 1], 0), &[], k);
        report.result.expect("the kernel runs");
        let (ran_after, _) = lane_blocks();
        assert!(ran_after > ran, "k {k}: the blocks ran in step");
        let r4 = |t: u32| 3 * t + if t < k { 100 } else { 0 } + 7;
        for (t, &got) in out[..64].iter().enumerate() {
            let t = t as u32;
            assert_eq!(got, 4 * r4(t) + r4(t ^ 1) + t, "k {k}: word {t}");
        }
    }
}

#[test]
fn products_of_block_wide_registers_made_once_read_as_interpreted() {
    let (ran, _) = lane_blocks();
    let (report, out) = both("special_products", config([5, 1, 1], [32, 1, 1], 0), &[], 0);
    report.result.expect("the kernel runs");
    let (ran_after, _) = lane_blocks();
    assert!(ran_after > ran, "the blocks ran in step");
    for (i, &got) in out[..160].iter().enumerate() {
        let (c, t) = (i as u32 / 32, i as u32 % 32);
        let want = c * 32 + (c + t) * 32 + t + (c + t) * 32;
        assert_eq!(got, want, "word {i}");
    }
}

#[test]
fn predicates_whose_masks_are_kept_negated_guard_as_interpreted() {
    for k in [13, 16, 100] {
        let (ran, _) = lane_blocks();
        let (report, out) = both("pred_negated", config([1, 1, 1], [64, 1, 1], 0), &[], k);
        report.result.expect("the kernel runs");
        let (ran_after, _) = lane_blocks();
        assert!(ran_after > ran, "k {k}: the blocks ran in step");
        for (t, &got) in out[..64].iter().enumerate() {
            let t = t as u32;
            let (p1, p2, p3, p4) = (t & 7 >= 3, t <= k, t & 7 != 5, t < k);
            let want = (p1 | p2) as u32
                + 2 * !(p1 & p3) as u32
                + 4 * (p1 ^ p4) as u32
                + 8 * (p2 & p4) as u32
                + 16 * !(p3 | p4) as u32
                + 32 * p1 as u32
                + 64 * (t >> 2 & 1 == 0) as u32
                + 128 * (t >= 16) as u32;
            assert_eq!(got, want, "k {k}: word {t}");
        }
    }
}

#[test]
fn a_stop_goes_on_at_its_own_resume_point_only_where_the_next_group_resumes_there() {
    // k at a group's start (16, 32), inside one (18: that block's lanes
    // part), past the threads that stay (48: all take A)
    for k in [16, 32, 18, 48] {
        let (ran, _) = lane_blocks();
        let (report, out) = both("resume_apart", config([2, 1, 1], [64, 1, 1], 0), &[], k);
        report.result.expect("the kernel runs");
        let (ran_after, _) = lane_blocks();
        if k % 4 == 0 {
            assert!(ran_after > ran, "k {k}: the blocks ran in step");
        }
        for (t, &got) in out[..64].iter().enumerate() {
            let t = t as u32;
            let want = match t {
                48.. => 5,
                t if t < k => t + 7 + 100,
                t => t + 70,
            };
            assert_eq!(got, want, "k {k}: word {t}");
        }
    }
}
