//! Interpreter throughput benchmark: runs corpus kernels (a 1 M-element vector add
//! and a 512×512 tiled matrix multiply) on the PTX interpreter and prints wall
//! time (min and median of a few repetitions) and PTX instructions per second.
//! Run with `cargo bench -p cumux-ptx`; `CUMUX_BENCH_REPS` sets the repetitions.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{download, find_kernel, le_bytes, pack_params, upload, words};
use cumux_ptx::{DeviceMemory, LaunchConfig, Program};
use std::time::{Duration, Instant};

/// The kernel's full name and its packed parameter buffer.
fn pack(program: &Program, kernel: &str, args: &[&[u8]]) -> (String, Vec<u8>) {
    let info = find_kernel(program, kernel);
    (info.name.clone(), pack_params(info, args))
}

fn upload_f32(mem: &DeviceMemory, values: &[f32]) -> u64 {
    upload(mem, &le_bytes(values, f32::to_le_bytes))
}

fn download_f32(mem: &DeviceMemory, ptr: u64, count: usize) -> Vec<f32> {
    words(&download(mem, ptr, count * 4), f32::from_le_bytes)
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

fn run_reps(
    name: &'static str,
    reps: usize,
    mut launch: impl FnMut() -> u64,
    check: impl Fn(),
) -> Measurement {
    let mut times = Vec::with_capacity(reps);
    let mut instructions = 0;
    for _ in 0..reps {
        let start = Instant::now();
        instructions = launch();
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
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source("vector_add"));
    let mem = DeviceMemory::new(64 << 20);
    let program = Program::load(&ptx, &mem).expect("load vector_add PTX");
    let n = 1usize << 20;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (n - i) as f32 * 0.5).collect();
    let (da, db) = (upload_f32(&mem, &a), upload_f32(&mem, &b));
    let dc = upload_f32(&mem, &vec![0.0; n]);
    let (kernel, params) = pack(
        &program,
        "vector_add",
        &[
            &da.to_le_bytes(),
            &db.to_le_bytes(),
            &dc.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    let config = LaunchConfig {
        grid: [(n / 256) as u32, 1, 1],
        block: [256, 1, 1],
        dynamic_shared_bytes: 0,
    };
    run_reps(
        "vector_add n=1M",
        reps,
        || {
            let report = program.launch(&mem, &kernel, &config, &params);
            report.result.expect("vector_add ran");
            report.instructions
        },
        || {
            let c = download_f32(&mem, dc, n);
            for i in (0..n).step_by(997) {
                assert_eq!(c[i], a[i] + b[i], "vector_add result {i}");
            }
        },
    )
}

fn matmul(reps: usize) -> Measurement {
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source("matmul_tiled"));
    let mem = DeviceMemory::new(64 << 20);
    let program = Program::load(&ptx, &mem).expect("load matmul_tiled PTX");
    let n = 512usize;
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 7) % 17) as f32 * 0.125 - 1.0)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| ((i * 5) % 13) as f32 * 0.25 - 1.5)
        .collect();
    let (da, db) = (upload_f32(&mem, &a), upload_f32(&mem, &b));
    let dc = upload_f32(&mem, &vec![0.0; n * n]);
    let dim = (n as i32).to_le_bytes();
    let (kernel, params) = pack(
        &program,
        "matmul_tiled",
        &[
            &da.to_le_bytes(),
            &db.to_le_bytes(),
            &dc.to_le_bytes(),
            &dim,
            &dim,
            &dim,
        ],
    );
    let config = LaunchConfig {
        grid: [(n / 16) as u32, (n / 16) as u32, 1],
        block: [16, 16, 1],
        dynamic_shared_bytes: 0,
    };
    run_reps(
        "matmul_tiled 512x512",
        reps,
        || {
            let report = program.launch(&mem, &kernel, &config, &params);
            report.result.expect("matmul_tiled ran");
            report.instructions
        },
        || {
            let c = download_f32(&mem, dc, n * n);
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
