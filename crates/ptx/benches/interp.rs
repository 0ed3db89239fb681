//! Interpreter throughput benchmark: runs corpus kernels (a 1 M-element vector add
//! and a 512×512 tiled matrix multiply) on the PTX interpreter and prints wall
//! time (min and median of a few repetitions) and PTX instructions per second.
//! Run with `cargo bench -p cumux-ptx`; `CUMUX_BENCH_REPS` sets the repetitions.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{config, linear, pack_params, Device, KernelArg};
use cumux_ptx::{Engine, LaunchConfig};
use std::time::{Duration, Instant};

/// Corpus program `source` compiled to PTX and loaded on 64 MiB of memory,
/// run on the interpreter whatever `CUMUX_PTX_ENGINE` says.
fn corpus(source: &str) -> Device {
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source(source));
    let mut dev = Device::load(source, &ptx, 64 << 20);
    dev.program.set_engine(Engine::Interpreter);
    dev
}

struct Measurement {
    name: &'static str,
    instructions: u64,
    times: Vec<Duration>,
}

impl Measurement {
    fn print(&mut self) {
        self.times.sort();
        let min = self.times[0];
        let median = self.times[self.times.len() / 2];
        println!(
            "{:<24} {:>12} instr  min {:>9.3} s  median {:>9.3} s  {:>8.1} M instr/s (best)  {:>8.1} M instr/s (median)",
            self.name,
            self.instructions,
            min.as_secs_f64(),
            median.as_secs_f64(),
            self.instructions as f64 / min.as_secs_f64() / 1e6,
            self.instructions as f64 / median.as_secs_f64() / 1e6,
        );
    }
}

/// Times `reps` launches of `kernel` (parameters packed once, outside the
/// timing); `check` then verifies the results.
fn run_reps(
    name: &'static str,
    reps: usize,
    dev: &Device,
    kernel: &str,
    cfg: LaunchConfig,
    args: &[&dyn KernelArg],
    check: impl Fn(),
) -> Measurement {
    let info = dev.kernel(kernel);
    let params = pack_params(info, args);
    let mut times = Vec::with_capacity(reps);
    let mut instructions = 0;
    for _ in 0..reps {
        let start = Instant::now();
        let report = dev.program.launch(&dev.mem, &info.name, &cfg, &params);
        report.result.expect("the kernel ran");
        instructions = report.instructions;
        times.push(start.elapsed());
    }
    check();
    Measurement {
        name,
        instructions,
        times,
    }
}

fn vector_add(reps: usize) -> Measurement {
    let dev = corpus("vector_add");
    let n = 1usize << 20;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (n - i) as f32 * 0.5).collect();
    let (da, db) = (dev.upload(&a), dev.upload(&b));
    let dc = dev.upload(&vec![0.0f32; n]);
    run_reps(
        "vector_add n=1M",
        reps,
        &dev,
        "vector_add",
        linear(n / 256, 256),
        &[&da, &db, &dc, &(n as i32)],
        || {
            let c: Vec<f32> = dev.download(dc, n);
            for i in (0..n).step_by(997) {
                assert_eq!(c[i], a[i] + b[i], "vector_add result {i}");
            }
        },
    )
}

fn matmul(reps: usize) -> Measurement {
    let dev = corpus("matmul_tiled");
    let n = 512usize;
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 7) % 17) as f32 * 0.125 - 1.0)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| ((i * 5) % 13) as f32 * 0.25 - 1.5)
        .collect();
    let (da, db) = (dev.upload(&a), dev.upload(&b));
    let dc = dev.upload(&vec![0.0f32; n * n]);
    let dim = n as i32;
    let tiles = (n / 16) as u32;
    run_reps(
        "matmul_tiled 512x512",
        reps,
        &dev,
        "matmul_tiled",
        config([tiles, tiles, 1], [16, 16, 1], 0),
        &[&da, &db, &dc, &dim, &dim, &dim],
        || {
            let c: Vec<f32> = dev.download(dc, n * n);
            for (row, col) in [(0, 0), (17, 300), (511, 511), (256, 3)] {
                let want: f64 = (0..n)
                    .map(|k| f64::from(a[row * n + k]) * f64::from(b[k * n + col]))
                    .sum();
                let got = f64::from(c[row * n + col]);
                assert!(
                    (got - want).abs() <= 1e-3 * want.abs().max(1.0),
                    "matmul C[{row}][{col}] = {got}, expected {want}"
                );
            }
        },
    )
}

fn main() {
    let reps = std::env::var("CUMUX_BENCH_REPS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(3usize)
        .max(1);
    println!("PTX interpreter, {reps} repetitions each");
    vector_add(reps).print();
    matmul(reps).print();
}
