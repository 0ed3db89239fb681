//! Runs the kernels of `tests/fixtures/ops.cu` on the interpreter with the
//! inputs of `tests/fixtures/ops_gpu_check.cu` and prints every result word in
//! the same format, so the two outputs can be diffed against a real GPU.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{download, int_ops_inputs, launch, le_bytes, upload, FLOAT_OPS_X, FLOAT_OPS_Y};
use cumux_ptx::*;

fn main() {
    let mem = DeviceMemory::new(1 << 26);
    let prog = Program::load(include_str!("../tests/fixtures/ops.ptx"), &mem).unwrap();
    let up = |b: Vec<u8>| upload(&mem, &b);
    let rd = |p: u64, n: usize| download(&mem, p, n);
    let run = |name: &str, threads: u32, args: &[Vec<u8>]| {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
        launch(&prog, &mem, name, [1, 1, 1], [threads, 1, 1], 0, &args)
            .result
            .unwrap();
    };
    let (xs, ys) = (FLOAT_OPS_X, FLOAT_OPS_Y);
    let dx = up(le_bytes(&xs, f32::to_le_bytes));
    let dy = up(le_bytes(&ys, f32::to_le_bytes));
    let dout = mem.alloc(17 * 20 * 4).unwrap();
    run(
        "float_ops",
        17,
        &[
            dx.to_le_bytes().to_vec(),
            dy.to_le_bytes().to_vec(),
            dout.to_le_bytes().to_vec(),
        ],
    );
    for (i, c) in rd(dout, 17 * 80).chunks(4).enumerate() {
        println!(
            "float {i} {:08x}",
            u32::from_le_bytes(c.try_into().unwrap())
        );
    }
    let n = 96;
    let (a, b) = int_ops_inputs(n);
    let da = up(a.iter().flat_map(|x| x.to_le_bytes()).collect());
    let db = up(b.iter().flat_map(|x| x.to_le_bytes()).collect());
    let dio = mem.alloc((n * 64) as u64).unwrap();
    run(
        "int_ops",
        n as u32,
        &[
            da.to_le_bytes().to_vec(),
            db.to_le_bytes().to_vec(),
            dio.to_le_bytes().to_vec(),
        ],
    );
    for (i, c) in rd(dio, n * 64).chunks(4).enumerate() {
        println!("int {i} {:08x}", u32::from_le_bytes(c.try_into().unwrap()));
    }
    let ins = [1.0f64, 3.0, 2.0, 2f64.powi(-60), 1.0 + 2f64.powi(-30)];
    let din = up(ins.iter().flat_map(|x| x.to_le_bytes()).collect());
    let dfin = up([2.0f32, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect());
    let ddo = mem.alloc(96).unwrap();
    let dfo = mem.alloc(20).unwrap();
    run(
        "directed",
        1,
        &[din, ddo, dfin, dfo].map(|p| p.to_le_bytes().to_vec()),
    );
    for (i, c) in rd(ddo, 96).chunks(8).enumerate() {
        println!("dir {i} {:016x}", u64::from_le_bytes(c.try_into().unwrap()));
    }
    for (i, c) in rd(dfo, 20).chunks(4).enumerate() {
        println!("dirf {i} {:08x}", u32::from_le_bytes(c.try_into().unwrap()));
    }
    let v: Vec<i32> = (0..64).map(|i| (i * 37 + 11) % 101 - 20).collect();
    let dv = up(v.iter().flat_map(|x| x.to_le_bytes()).collect());
    let dw = mem.alloc(64 * 48).unwrap();
    run(
        "warp_ops",
        64,
        &[dv.to_le_bytes().to_vec(), dw.to_le_bytes().to_vec()],
    );
    for (i, c) in rd(dw, 64 * 48).chunks(4).enumerate() {
        println!("warp {i} {:08x}", u32::from_le_bytes(c.try_into().unwrap()));
    }
    println!("status 0");
}
