//! Runs the kernels of `tests/fixtures/ops.cu` on the interpreter with the
//! inputs of `tests/fixtures/ops_gpu_check.cu` and prints every result word in
//! the same format, so the two outputs can be diffed against a real GPU.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{int_ops_inputs, linear, Device, KernelArg, FLOAT_OPS_X, FLOAT_OPS_Y};

fn main() {
    let dev = Device::load(
        "ops.ptx",
        include_str!("../tests/fixtures/ops.ptx"),
        1 << 26,
    );
    let run = |name: &str, threads: usize, args: &[&dyn KernelArg]| {
        dev.launch(name, linear(1, threads), args);
    };
    let (dx, dy) = (dev.upload(&FLOAT_OPS_X), dev.upload(&FLOAT_OPS_Y));
    let dout = dev.alloc(17 * 20 * 4);
    run("float_ops", 17, &[&dx, &dy, &dout]);
    for (i, w) in dev.download::<u32>(dout, 17 * 20).iter().enumerate() {
        println!("float {i} {w:08x}");
    }
    let n = 96;
    let (a, b) = int_ops_inputs(n);
    let (da, db) = (dev.upload(&a), dev.upload(&b));
    let dio = dev.alloc(n * 64);
    run("int_ops", n, &[&da, &db, &dio]);
    for (i, w) in dev.download::<u32>(dio, n * 16).iter().enumerate() {
        println!("int {i} {w:08x}");
    }
    let ins = [1.0f64, 3.0, 2.0, 2f64.powi(-60), 1.0 + 2f64.powi(-30)];
    let (din, dfin) = (dev.upload(&ins), dev.upload(&[2.0f32, 3.0]));
    let (ddo, dfo) = (dev.alloc(96), dev.alloc(20));
    run("directed", 1, &[&din, &ddo, &dfin, &dfo]);
    for (i, w) in dev.download::<u64>(ddo, 12).iter().enumerate() {
        println!("dir {i} {w:016x}");
    }
    for (i, w) in dev.download::<u32>(dfo, 5).iter().enumerate() {
        println!("dirf {i} {w:08x}");
    }
    let v: Vec<i32> = (0..64).map(|i| (i * 37 + 11) % 101 - 20).collect();
    let (dv, dw) = (dev.upload(&v), dev.alloc(64 * 48));
    run("warp_ops", 64, &[&dv, &dw]);
    for (i, w) in dev.download::<u32>(dw, 64 * 12).iter().enumerate() {
        println!("warp {i} {w:08x}");
    }
    println!("status 0");
}
