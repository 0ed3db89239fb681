//! Global accesses affine in the thread (`jit::hoist`) on both engines: blocks inside
//! their allocations run them unchecked, others check each group and fault as interpreted.

mod common;

use common::config;
use cumux_ptx::{
    hoisted_blocks, hoisted_loop_sites, DeviceMemory, Engine, LaunchConfig, LaunchLimits,
    LaunchReport, Program,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Words in each buffer.
const WORDS: usize = 16 << 10;

/// The counter of hoisted blocks is the process's: one test at a time.
static ONE: Mutex<()> = Mutex::new(());

/// The loop accesses the last launch hoisted (`hoisted_loop_sites`).
static LOOPED: AtomicU64 = AtomicU64::new(0);

/// Runs `kernel` on `engine` with one worker: its 8-byte parameters
/// buffers of [`WORDS`] words starting as `inputs`, its 4-byte one
/// `scalar`; the report, the buffers, and the blocks hoisted.
fn run_on(
    engine: Engine,
    ptx: &str,
    kernel: &str,
    cfg: LaunchConfig,
    inputs: &[Vec<u32>],
    scalar: u32,
) -> (LaunchReport, Vec<Vec<u8>>, u64) {
    let mem = DeviceMemory::new(16 << 20);
    let mut program = Program::load(ptx, &mem).expect("fixture loads");
    program.set_engine(engine);
    let info = common::find_kernel(&program, kernel).clone();
    let mut params = vec![0u8; info.params_bytes() as usize];
    let mut bufs = Vec::new();
    for p in &info.params {
        let at = p.offset as usize;
        if p.size == 8 {
            let buf = mem.alloc(WORDS as u64 * 4).expect("buffer");
            let input = inputs.get(bufs.len()).cloned().unwrap_or_default();
            mem.write(buf, &common::to_bytes(&input)).expect("upload");
            params[at..at + 8].copy_from_slice(&buf.to_le_bytes());
            bufs.push(buf);
        } else {
            params[at..at + 4].copy_from_slice(&scalar.to_le_bytes());
        }
    }
    let limits = LaunchLimits {
        workers: 1,
        ..LaunchLimits::NONE
    };
    let (before, looped) = (hoisted_blocks(), hoisted_loop_sites());
    let report = program.launch_with(&mem, kernel, &cfg, &params, &limits);
    let hoisted = hoisted_blocks() - before;
    LOOPED.store(hoisted_loop_sites() - looped, Ordering::Relaxed);
    let outs = bufs
        .iter()
        .map(|&b| {
            let mut out = vec![0u8; WORDS * 4];
            mem.read(b, &mut out).expect("download");
            out
        })
        .collect();
    (report, outs, hoisted)
}

/// Both engines on one launch, which must agree; the compiler's report,
/// last buffer as words, and the blocks it hoisted.
fn both(
    kernel: &str,
    cfg: LaunchConfig,
    inputs: &[Vec<u32>],
    scalar: u32,
) -> (LaunchReport, Vec<u32>, u64) {
    both_in(&common::fixture("hoist.ptx"), kernel, cfg, inputs, scalar)
}

/// [`both`] for a kernel of `ptx`.
fn both_in(
    ptx: &str,
    kernel: &str,
    cfg: LaunchConfig,
    inputs: &[Vec<u32>],
    scalar: u32,
) -> (LaunchReport, Vec<u32>, u64) {
    let interp = run_on(Engine::Interpreter, ptx, kernel, cfg, inputs, scalar);
    let jit = run_on(Engine::Compiler, ptx, kernel, cfg, inputs, scalar);
    assert_eq!(interp.0, jit.0, "{kernel}: the engines' reports differ");
    assert!(interp.1 == jit.1, "{kernel}: the engines' memory differs");
    let last = common::from_bytes::<u32>(jit.1.last().expect("a buffer"));
    (jit.0, last, jit.2)
}

fn floats(f: impl Fn(usize) -> f32) -> Vec<u32> {
    (0..WORDS).map(|i| f(i).to_bits()).collect()
}

#[test]
fn blocks_inside_their_allocations_run_unchecked_and_the_rest_check_each_group() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let (a, b) = (floats(|i| i as f32 * 0.5), floats(|i| 3.0 - i as f32));
    // 64 blocks of 256 cover the buffers exactly; 16 more lie past their
    // end, every lane guarded off (`i < n`): none of them faults
    for (grid, n) in [(64, WORDS as u32), (80, WORDS as u32)] {
        let cfg = config([grid, 1, 1], [256, 1, 1], 0);
        let (report, c, hoisted) = both("hoist_add", cfg, &[a.clone(), b.clone()], n);
        report.result.expect("no lane past the end runs");
        for (i, &got) in c.iter().enumerate() {
            let want = f32::from_bits(a[i]) + f32::from_bits(b[i]);
            assert_eq!(got, want.to_bits(), "word {i}");
        }
        assert_eq!(
            hoisted, 64,
            "grid {grid}: the blocks inside hoisted their checks"
        );
    }
}

#[test]
fn a_block_whose_stores_pass_the_end_faults_where_the_interpreter_does() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let a: Vec<u32> = (0..WORDS as u32).collect();
    // 4 x 4 blocks of 256 threads store at i + k: up to the last word,
    // then 1 and 5 words past it (from threads 4095 and 4091 on)
    let cfg = config([4, 4, 1], [256, 1, 1], 0);
    for (past, fault) in [(0, None), (1, Some(4095)), (5, Some(4091))] {
        let k = (WORDS - 4096 + past) as u32;
        let (report, c, hoisted) = both("hoist_shift", cfg, std::slice::from_ref(&a), k);
        match fault {
            None => {
                report.result.expect("every store inside");
                assert_eq!(hoisted, 16, "every block hoisted its checks");
            }
            Some(t) => {
                let f = report.result.expect_err("a store past the end");
                assert_eq!(f.cu_code(), 700, "{f:?}");
                // (the last block checked each group, and the thread loop
                // ran the group that failed)
                assert_eq!(hoisted, 15, "the blocks before the last hoisted");
                for (i, &got) in c.iter().enumerate().skip(k as usize) {
                    let want = if i - (k as usize) < t {
                        a[i - k as usize] + 1
                    } else {
                        0
                    };
                    assert_eq!(got, want, "word {i} (thread {})", i - k as usize);
                }
            }
        }
    }
}

#[test]
fn rows_of_a_2d_block_are_checked_together_and_fault_past_the_end() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let a: Vec<u32> = (0..WORDS as u32).map(|i| i * 3).collect();
    // 16 blocks of 32 x 4 threads, rows of w words: w = 32 keeps every
    // row inside; w = 1024 puts rows 16 on (block 4 on) past the end
    let cfg = config([16, 1, 1], [32, 4, 1], 0);
    for (w, hoisted_want) in [(32u32, 16), (1024, 4)] {
        let (report, c, hoisted) = both("hoist_rows", cfg, std::slice::from_ref(&a), w);
        assert_eq!(hoisted, hoisted_want, "w {w}: the blocks inside hoisted");
        let rows = if w == 32 { 64 } else { 16 };
        for row in 0..rows {
            for x in 0..32 {
                let i = (row * w + x) as usize;
                assert_eq!(c[i], a[i] + i as u32, "w {w}: row {row}, x {x}");
            }
        }
        match w {
            32 => report.result.expect("every row inside"),
            _ => {
                let f = report.result.expect_err("row 16 past the end");
                assert_eq!(f.cu_code(), 700, "{f:?}");
            }
        }
    }
}

#[test]
fn a_counted_loop_is_checked_over_its_trips_and_its_last_trip_past_the_end_faults() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let a: Vec<u32> = (0..WORDS as u32).map(|i| i * 5).collect();
    // 4 blocks of 256 threads (W = 1,024), ceil(n / 2) trips of W words:
    // 16 trips cover the buffers exactly, the 17th passes their end (a
    // count rounded down would take the blocks as inside); n below 1
    // skips the loop
    let cfg = config([4, 1, 1], [256, 1, 1], 0);
    let w = 1024usize;
    for (n, trips, hoisted_want) in [(32, 16, 4), (31, 16, 4), (7, 4, 4), (0, 0, 4), (33, 17, 0)] {
        let (report, c, hoisted) = both("hoist_loop", cfg, std::slice::from_ref(&a), n);
        assert_eq!(hoisted, hoisted_want, "n {n}: the blocks hoisted");
        // (a load and a store in the loop, each block's)
        let looped = LOOPED.load(Ordering::Relaxed);
        assert_eq!(
            looped,
            2 * hoisted_want,
            "n {n}: the loop's accesses hoisted"
        );
        if trips * w > WORDS {
            let f = report.result.expect_err("the last trip past the end");
            assert_eq!(f.cu_code(), 700, "{f:?}");
            continue;
        }
        report.result.expect("every trip inside");
        for (i, &got) in c.iter().enumerate() {
            let j = i / w;
            let want = if j < trips { a[i] + 2 * j as u32 } else { 0 };
            assert_eq!(got, want, "n {n}: word {i}");
        }
    }
}

#[test]
fn the_tiled_matmuls_tile_loads_are_checked_once_a_block_over_every_tile() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source("matmul_tiled"));
    let kernel = "_Z12matmul_tiledPKfS0_Pfiii";
    let (a, b) = (
        floats(|i| (i % 7) as f32 - 3.0),
        floats(|i| (i % 5) as f32 * 0.5),
    );
    // M = N = K = 128: A, B and C fill their buffers exactly, every block
    // hoists its two tile loads (and its store); 129 (9 x 9 blocks) reads
    // A past its end: a fault where the interpreter faults
    for (n, grid, hoisted_want) in [(128u32, 8, Some(64)), (129, 9, None)] {
        let cfg = config([grid, grid, 1], [16, 16, 1], 0);
        let (report, c, hoisted) = both_in(&ptx, kernel, cfg, &[a.clone(), b.clone()], n);
        let looped = LOOPED.load(Ordering::Relaxed);
        match hoisted_want {
            Some(want) => {
                report.result.expect("every access inside");
                assert_eq!(hoisted, want, "n {n}: the blocks hoisted");
                assert_eq!(looped, 2 * want, "n {n}: each block's two tile loads");
                let n = n as usize;
                for (i, &got) in c.iter().enumerate().step_by(97) {
                    let (row, col) = (i / n, i % n);
                    let want: f32 = (0..n)
                        .map(|k| f32::from_bits(a[row * n + k]) * f32::from_bits(b[k * n + col]))
                        .sum();
                    assert!((f32::from_bits(got) - want).abs() < 1e-2, "C[{row}][{col}]");
                }
            }
            None => {
                let f = report.result.expect_err("A read past its end");
                assert_eq!(f.cu_code(), 700, "{f:?}");
                assert!(hoisted < 81, "n {n}: {hoisted} blocks hoisted");
            }
        }
    }
}

#[test]
fn a_grid_stride_loop_is_checked_each_group_and_the_access_before_it_still_hoisted() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let a: Vec<u32> = (0..WORDS as u32).map(|i| i * 7).collect();
    // 4 blocks of 256 threads over n words; n = WORDS + 1 runs one
    // thread's last trip past the end
    let cfg = config([4, 1, 1], [256, 1, 1], 0);
    for n in [WORDS as u32, 3000, WORDS as u32 + 1] {
        let (report, c, hoisted) = both("hoist_stride", cfg, std::slice::from_ref(&a), n);
        // (past the end, block 0's thread 0 faults in its last trip: the
        // launch ends there)
        let want = if n as usize > WORDS { 1 } else { 4 };
        assert_eq!(hoisted, want, "n {n}: the accesses before the loop hoisted");
        assert_eq!(LOOPED.load(Ordering::Relaxed), 0, "n {n}: none in it");
        if n as usize > WORDS {
            let f = report.result.expect_err("a trip past the end");
            assert_eq!(f.cu_code(), 700, "{f:?}");
            continue;
        }
        report.result.expect("every trip inside");
        for (i, &got) in c.iter().enumerate() {
            let want = if i < n as usize { a[i] + 1 } else { 0 };
            assert_eq!(got, want, "n {n}: word {i}");
        }
    }
}
