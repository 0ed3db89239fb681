//! The PTX engines side by side (issue 22): the corpus's 512×512 tiled matmul
//! on the interpreter, on the compiler and in plain Rust on all cores, in one
//! run (`bench/cpu/ptx_engines.sh`; `CUMUX_BENCH_REPS` sets the repetitions).

use cumux_ptx::{DeviceMemory, Engine, LaunchConfig, Program};
use std::time::{Duration, Instant};

const N: usize = 512;
const TILE: usize = 16;

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

/// `C = A·B` on `engine`, `reps` times; the times, the instruction count
/// and the product.
fn on_engine(
    ptx: &str,
    engine: Engine,
    reps: usize,
    a: &[f32],
    b: &[f32],
) -> (Vec<Duration>, u64, Vec<f32>) {
    let mem = DeviceMemory::new(64 << 20);
    let mut program = Program::load(ptx, &mem).expect("matmul_tiled loads");
    program.set_engine(engine);
    let kernel = program
        .kernels()
        .iter()
        .find(|k| k.name.contains("matmul_tiled"))
        .expect("the matmul kernel")
        .clone();
    if engine == Engine::Compiler {
        let start = Instant::now();
        program
            .compiled(&kernel.name)
            .expect("the compiler takes matmul_tiled");
        println!(
            "compile (the kernel)     {:>9.4} s",
            start.elapsed().as_secs_f64()
        );
    }
    let bytes = (N * N * 4) as u64;
    let (da, db, dc) = (
        mem.alloc(bytes).expect("A"),
        mem.alloc(bytes).expect("B"),
        mem.alloc(bytes).expect("C"),
    );
    mem.write(da, &bytes_of(a)).expect("upload A");
    mem.write(db, &bytes_of(b)).expect("upload B");
    let mut params = Vec::new();
    for p in [da, db, dc] {
        params.extend_from_slice(&p.to_le_bytes());
    }
    for _ in 0..3 {
        params.extend_from_slice(&(N as i32).to_le_bytes());
    }
    let tiles = (N / TILE) as u32;
    let cfg = LaunchConfig {
        grid: [tiles, tiles, 1],
        block: [TILE as u32, TILE as u32, 1],
        dynamic_shared_bytes: 0,
    };
    let mut times = Vec::new();
    let mut instructions = 0;
    for _ in 0..reps {
        let start = Instant::now();
        let report = program.launch(&mem, &kernel.name, &cfg, &params);
        times.push(start.elapsed());
        report.result.expect("the kernel ran");
        instructions = report.instructions;
    }
    let mut out = vec![0u8; N * N * 4];
    mem.read(dc, &mut out).expect("download C");
    (times, instructions, floats_of(&out))
}

/// `C = A·B` in plain Rust, rows spread over every core.
fn plain(a: &[f32], b: &[f32], c: &mut [f32]) {
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

fn main() {
    let reps = std::env::var("CUMUX_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3usize)
        .max(1);
    let source = cumux_testkit::corpus_source("matmul_tiled");
    let ptx = cumux_testkit::compile_ptx(source);
    let a: Vec<f32> = (0..N * N)
        .map(|i| ((i * 7) % 17) as f32 * 0.125 - 1.0)
        .collect();
    let b: Vec<f32> = (0..N * N)
        .map(|i| ((i * 5) % 13) as f32 * 0.25 - 1.5)
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("matmul_tiled {N}x{N}, {reps} repetitions each, {cores} cores");

    let (mut t_interp, instr, c_interp) = on_engine(&ptx, Engine::Interpreter, reps, &a, &b);
    let (mut t_jit, instr_jit, c_jit) = on_engine(&ptx, Engine::Compiler, reps, &a, &b);
    assert_eq!(instr, instr_jit, "both engines count the same instructions");
    assert!(
        c_interp
            .iter()
            .zip(&c_jit)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "the compiler's product differs from the interpreter's"
    );
    let mut c_plain = vec![0.0f32; N * N];
    let mut t_plain = Vec::new();
    for _ in 0..reps.max(5) {
        let start = Instant::now();
        plain(&a, &b, &mut c_plain);
        t_plain.push(start.elapsed());
    }
    for (x, y) in c_plain.iter().zip(&c_jit) {
        assert!(
            (x - y).abs() <= 1e-3 * x.abs().max(1.0),
            "plain {x} vs compiled {y}"
        );
    }

    let (bi, mi) = best_median(&mut t_interp);
    let (bj, mj) = best_median(&mut t_jit);
    let (bp, mp) = best_median(&mut t_plain);
    println!(
        "{:<24} {:>9} {:>9} {:>14}",
        "engine", "best s", "median s", "M PTX instr/s"
    );
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
    println!("{:<24} {bp:>9.4} {mp:>9.4}", "plain Rust (all cores)");
    println!("interpreter / compiler   {:>9.1}x (best)", bi / bj);
    println!("compiler / plain Rust    {:>9.1}x (best)", bj / bp);
    println!("PTX instructions         {instr}");
}
