//! The PTX engines side by side (issue 22): the corpus's 512×512 tiled matmul
//! and 1 M-element vector add on the interpreter, on the compiler and in plain
//! Rust on all cores, in one run (`bench/cpu/ptx_engines.sh`;
//! `CUMUX_BENCH_REPS` sets the repetitions, `CUMUX_BENCH_ENGINES=compiler`
//! leaves the interpreter out, `CUMUX_BENCH_ONLY=matmul` or `vector_add` runs
//! one of the two, for profiling).

use cumux_ptx::{DeviceMemory, Engine, LaunchConfig, Program};
use std::time::{Duration, Instant};

const N: usize = 512;
const TILE: usize = 16;
const VEC: usize = 1 << 20;

fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn floats_of(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The best and median of `times`.
fn best_median(times: &mut [Duration]) -> (f64, f64) {
    times.sort();
    (times[0].as_secs_f64(), times[times.len() / 2].as_secs_f64())
}

/// One benchmark kernel: its PTX, its inputs, the shape of its launch.
struct Case<'a> {
    ptx: &'a str,
    kernel: &'a str,
    inputs: [&'a [f32]; 2],
    out_len: usize,
    /// Scalar parameters after the three pointers.
    ints: &'a [i32],
    cfg: LaunchConfig,
}

/// One engine's run of a case: times, instructions counted, the output.
struct Run {
    times: Vec<Duration>,
    instructions: u64,
    out: Vec<f32>,
}

/// `case` on `engine`, `reps` times.
fn on_engine(case: &Case<'_>, engine: Engine, reps: usize) -> Run {
    let mem = DeviceMemory::new(64 << 20);
    let mut program = Program::load(case.ptx, &mem).expect("the corpus kernel loads");
    program.set_engine(engine);
    let kernel = program
        .kernels()
        .iter()
        .find(|k| k.name.contains(case.kernel))
        .expect("the kernel")
        .clone();
    if engine == Engine::Compiler {
        let start = Instant::now();
        program
            .compiled(&kernel.name)
            .expect("the compiler takes the kernel");
        println!(
            "compile ({})      {:>9.4} s",
            case.kernel,
            start.elapsed().as_secs_f64()
        );
    }
    let mut params = Vec::new();
    for input in case.inputs {
        let d = mem.alloc(input.len() as u64 * 4).expect("an input");
        mem.write(d, &bytes_of(input)).expect("upload");
        params.extend_from_slice(&d.to_le_bytes());
    }
    let dc = mem.alloc(case.out_len as u64 * 4).expect("the output");
    params.extend_from_slice(&dc.to_le_bytes());
    for v in case.ints {
        params.extend_from_slice(&v.to_le_bytes());
    }
    let mut times = Vec::new();
    let mut instructions = 0;
    for _ in 0..reps {
        let start = Instant::now();
        let report = program.launch(&mem, &kernel.name, &case.cfg, &params);
        times.push(start.elapsed());
        report.result.expect("the kernel ran");
        instructions = report.instructions;
    }
    let mut out = vec![0u8; case.out_len * 4];
    mem.read(dc, &mut out).expect("download");
    Run {
        times,
        instructions,
        out: floats_of(&out),
    }
}

/// `C = A·B` in plain Rust, rows spread over every core.
fn plain_matmul(a: &[f32], b: &[f32], c: &mut [f32]) {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows = N.div_ceil(workers);
    std::thread::scope(|s| {
        for (w, chunk) in c.chunks_mut(rows * N).enumerate() {
            s.spawn(move || {
                for (r, crow) in chunk.chunks_mut(N).enumerate() {
                    let i = w * rows + r;
                    crow.fill(0.0);
                    for k in 0..N {
                        let aik = a[i * N + k];
                        for (cj, bkj) in crow.iter_mut().zip(&b[k * N..(k + 1) * N]) {
                            *cj += aik * bkj;
                        }
                    }
                }
            });
        }
    });
}

/// `c = a + b` in plain Rust, spread over every core.
fn plain_add(a: &[f32], b: &[f32], c: &mut [f32]) {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let part = c.len().div_ceil(workers);
    std::thread::scope(|s| {
        for (w, chunk) in c.chunks_mut(part).enumerate() {
            s.spawn(move || {
                let lo = w * part;
                for (k, ck) in chunk.iter_mut().enumerate() {
                    *ck = a[lo + k] + b[lo + k];
                }
            });
        }
    });
}

/// Runs `case` on both engines and `plain`, prints the table; `close` checks
/// plain's output against the compiler's.
fn bench(
    case: &Case<'_>,
    reps: usize,
    interpreter: bool,
    plain: impl Fn(&mut [f32]),
    close: impl Fn(f32, f32) -> bool,
) {
    let jit = on_engine(case, Engine::Compiler, reps);
    let interp = interpreter.then(|| on_engine(case, Engine::Interpreter, reps));
    if let Some(i) = &interp {
        assert_eq!(
            i.instructions, jit.instructions,
            "both engines count the same instructions"
        );
        assert!(
            i.out
                .iter()
                .zip(&jit.out)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "the compiler's output differs from the interpreter's"
        );
    }
    let mut c_plain = vec![0.0f32; case.out_len];
    let mut t_plain = Vec::new();
    for _ in 0..reps.max(5) {
        let start = Instant::now();
        plain(&mut c_plain);
        t_plain.push(start.elapsed());
    }
    for (x, y) in c_plain.iter().zip(&jit.out) {
        assert!(close(*x, *y), "plain {x} vs compiled {y}");
    }
    let instr = jit.instructions;
    println!(
        "{:<24} {:>9} {:>9} {:>14}",
        "engine", "best s", "median s", "M PTX instr/s"
    );
    let mut t_jit = jit.times;
    let (bj, mj) = best_median(&mut t_jit);
    if let Some(mut i) = interp {
        let (bi, mi) = best_median(&mut i.times);
        println!(
            "{:<24} {bi:>9.4} {mi:>9.4} {:>14.1}",
            "interpreter",
            instr as f64 / bi / 1e6
        );
        println!(
            "{:<24} {bj:>9.4} {mj:>9.4} {:>14.1}",
            "compiler",
            instr as f64 / bj / 1e6
        );
        println!("interpreter / compiler   {:>9.1}x (best)", bi / bj);
    } else {
        println!(
            "{:<24} {bj:>9.4} {mj:>9.4} {:>14.1}",
            "compiler",
            instr as f64 / bj / 1e6
        );
    }
    let (bp, mp) = best_median(&mut t_plain);
    println!("{:<24} {bp:>9.4} {mp:>9.4}", "plain Rust (all cores)");
    println!("compiler / plain Rust    {:>9.1}x (best)", bj / bp);
    println!("PTX instructions         {instr}");
}

fn main() {
    let reps = std::env::var("CUMUX_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3usize)
        .max(1);
    let interpreter = std::env::var("CUMUX_BENCH_ENGINES").map_or(true, |e| e != "compiler");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let only = std::env::var("CUMUX_BENCH_ONLY").ok();
    let runs = |case: &str| only.as_deref().is_none_or(|o| o == case);

    if runs("matmul") {
        matmul_case(reps, interpreter, cores);
    }
    if runs("vector_add") {
        vector_add_case(reps, interpreter, cores);
    }
}

/// The 512×512 tiled matmul on both engines and in plain Rust.
fn matmul_case(reps: usize, interpreter: bool, cores: usize) {
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source("matmul_tiled"));
    let a: Vec<f32> = (0..N * N)
        .map(|i| ((i * 7) % 17) as f32 * 0.125 - 1.0)
        .collect();
    let b: Vec<f32> = (0..N * N)
        .map(|i| ((i * 5) % 13) as f32 * 0.25 - 1.5)
        .collect();
    println!("matmul_tiled {N}x{N}, {reps} repetitions each, {cores} cores");
    let tiles = (N / TILE) as u32;
    let matmul = Case {
        ptx: &ptx,
        kernel: "matmul_tiled",
        inputs: [&a, &b],
        out_len: N * N,
        ints: &[N as i32; 3],
        cfg: LaunchConfig {
            grid: [tiles, tiles, 1],
            block: [TILE as u32, TILE as u32, 1],
            dynamic_shared_bytes: 0,
        },
    };
    bench(
        &matmul,
        reps,
        interpreter,
        |c| plain_matmul(&a, &b, c),
        |x, y| (x - y).abs() <= 1e-3 * x.abs().max(1.0),
    );
}

/// The 1 M-element vector add on both engines and in plain Rust.
fn vector_add_case(reps: usize, interpreter: bool, cores: usize) {
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source("vector_add"));
    let a: Vec<f32> = (0..VEC).map(|i| (i % 1000) as f32 * 0.5).collect();
    let b: Vec<f32> = (0..VEC).map(|i| (i % 77) as f32 - 3.0).collect();
    println!();
    println!("vector_add {VEC} elements, {reps} repetitions each, {cores} cores");
    let add = Case {
        ptx: &ptx,
        kernel: "vector_add",
        inputs: [&a, &b],
        out_len: VEC,
        ints: &[VEC as i32],
        cfg: LaunchConfig {
            grid: [(VEC / 256) as u32, 1, 1],
            block: [256, 1, 1],
            dynamic_shared_bytes: 0,
        },
    };
    bench(
        &add,
        reps,
        interpreter,
        |c| plain_add(&a, &b, c),
        |x, y| x.to_bits() == y.to_bits(),
    );
}
