//! Throughput of a shuffle-heavy reduction (warp collectives) on the
//! interpreter: `cargo run --release -p cumux-ptx --example shfl_bench`.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{find_kernel, pack_params};
use cumux_ptx::*;
use std::time::Instant;

fn main() {
    let mem = DeviceMemory::new(1 << 30);
    let prog = Program::load(include_str!("../tests/fixtures/basic.ptx"), &mem).unwrap();
    let n = 1usize << 22;
    let din = mem.alloc((n * 4) as u64).unwrap();
    mem.fill(din, &1f32.to_le_bytes(), n as u64).unwrap();
    let dout = mem.alloc(4).unwrap();
    let k = find_kernel(&prog, "reduce_sum");
    let params = pack_params(
        k,
        &[
            &din.to_le_bytes(),
            &dout.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    let cfg = LaunchConfig {
        grid: [(n / 256) as u32, 1, 1],
        block: [256, 1, 1],
        dynamic_shared_bytes: 32,
    };
    for _ in 0..3 {
        mem.fill(dout, &[0], 4).unwrap();
        let t = Instant::now();
        let r = prog.launch(&mem, "reduce_sum", &cfg, &params);
        let dt = t.elapsed().as_secs_f64();
        r.result.unwrap();
        let mut b = [0u8; 4];
        mem.read(dout, &mut b).unwrap();
        println!(
            "reduce_sum n={n}: {:.3} s, {} instr, {:.1} M instr/s, sum {}",
            dt,
            r.instructions,
            r.instructions as f64 / dt / 1e6,
            f32::from_le_bytes(b)
        );
    }
}
