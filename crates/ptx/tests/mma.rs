//! `mma.sync` and `ldmatrix` on the interpreter, compared word for word with
//! what an H100 produced for the same kernels and inputs (fixtures/mma_h100.txt,
//! from fixtures/mma_gpu_check.cu).

mod common;

use common::{linear, Device, KernelArg};
use half::{bf16, f16};

#[test]
fn mma_and_ldmatrix_match_an_h100() {
    let dev = Device::load("mma.ptx", include_str!("fixtures/mma.ptx"), 1 << 24);
    let up = |v: Vec<u16>| dev.upload(&v);
    let h = |x: i64| f16::from_f32(x as f32).to_bits();
    let bh = |x: i64| bf16::from_f32(x as f32).to_bits();
    let a = up((0..256).map(|i| h((i * 7 + 3) % 9 - 4)).collect());
    let b = up((0..128).map(|i| h((i * 3 + 2) % 5 - 2)).collect());
    let c = dev.upload(&(0..128).map(|i| i as f32).collect::<Vec<_>>());
    let ab = up((0..256).map(|i| bh((i * 5 + 1) % 7 - 3)).collect());
    let bb = up((0..128).map(|i| bh((i * 11 + 4) % 9 - 4)).collect());
    let ah = up((0..128).map(|i| h((i * 13 + 5) % 7 - 3)).collect());
    let bh2 = up((0..64).map(|i| h((i * 3 + 1) % 5 - 2)).collect());
    let raw = up((0..256u32).map(|i| (i * 257 + 3) as u16).collect());
    let (d, m, l) = (dev.alloc(512), dev.alloc(1024), dev.alloc(32 * 11 * 4));
    let run = |name: &str, ptrs: &[u64]| {
        let args: Vec<&dyn KernelArg> = ptrs.iter().map(|p| p as &dyn KernelArg).collect();
        dev.launch(name, linear(1, 32), &args);
    };
    run("mma_f16", &[a, b, c, d]);
    run("ldm", &[raw, l]);
    run("mma_more", &[ab, bb, ah, bh2, m]);
    let words = |p: u64, n: usize| dev.download::<u32>(p, n);
    let mut ours = String::new();
    for (i, w) in words(d, 128).iter().enumerate() {
        ours += &format!("d {i} {}\n", f32::from_bits(*w));
    }
    for (i, w) in words(l, 32 * 11).iter().enumerate() {
        ours += &format!("l {i} {w:08x}\n");
    }
    for (i, w) in words(m, 256).iter().enumerate() {
        ours += &format!("m {i} {}\n", f32::from_bits(*w));
    }
    ours += "status 0\n";
    let gpu = include_str!("fixtures/mma_h100.txt");
    for (k, (g, o)) in gpu.lines().zip(ours.lines()).enumerate() {
        assert_eq!(g, o, "line {k}");
    }
    assert_eq!(gpu.lines().count(), ours.lines().count());
}
