//! Throughput of a shuffle-heavy reduction (warp collectives) on the
//! interpreter: `cargo run --release -p cumux-ptx --example shfl_bench`.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{config, pack_params, Device};
use std::time::Instant;

fn main() {
    let dev = Device::load(
        "basic.ptx",
        include_str!("../tests/fixtures/basic.ptx"),
        1 << 30,
    );
    let n = 1usize << 22;
    let din = dev.alloc(n * 4);
    dev.mem.fill(din, &1f32.to_le_bytes(), n as u64).unwrap();
    let dout = dev.alloc(4);
    let params = pack_params(dev.kernel("reduce_sum"), &[&din, &dout, &(n as i32)]);
    let cfg = config([(n / 256) as u32, 1, 1], [256, 1, 1], 32);
    for _ in 0..3 {
        dev.mem.fill(dout, &[0], 4).unwrap();
        let t = Instant::now();
        let r = dev.program.launch(&dev.mem, "reduce_sum", &cfg, &params);
        let dt = t.elapsed().as_secs_f64();
        r.result.unwrap();
        println!(
            "reduce_sum n={n}: {:.3} s, {} instr, {:.1} M instr/s, sum {}",
            dt,
            r.instructions,
            r.instructions as f64 / dt / 1e6,
            dev.download::<f32>(dout, 1)[0]
        );
    }
}
