//! `mma.sync` and `ldmatrix` on the interpreter, compared word for word with
//! what an H100 produced for the same kernels and inputs (fixtures/mma_h100.txt,
//! from fixtures/mma_gpu_check.cu).

mod common;

use cumux_ptx::*;
use half::{bf16, f16};

fn le16(v: impl Iterator<Item = u16>) -> Vec<u8> {
    v.flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn mma_and_ldmatrix_match_an_h100() {
    let mem = DeviceMemory::new(1 << 24);
    let prog = Program::load(include_str!("fixtures/mma.ptx"), &mem).unwrap();
    let up = |b: Vec<u8>| common::upload(&mem, &b);
    let h = |x: i64| f16::from_f32(x as f32).to_bits();
    let bh = |x: i64| bf16::from_f32(x as f32).to_bits();
    let a = up(le16((0..256).map(|i| h((i * 7 + 3) % 9 - 4))));
    let b = up(le16((0..128).map(|i| h((i * 3 + 2) % 5 - 2))));
    let c = up((0..128).flat_map(|i| (i as f32).to_le_bytes()).collect());
    let ab = up(le16((0..256).map(|i| bh((i * 5 + 1) % 7 - 3))));
    let bb = up(le16((0..128).map(|i| bh((i * 11 + 4) % 9 - 4))));
    let ah = up(le16((0..128).map(|i| h((i * 13 + 5) % 7 - 3))));
    let bh2 = up(le16((0..64).map(|i| h((i * 3 + 1) % 5 - 2))));
    let raw = up(le16((0..256u32).map(|i| (i * 257 + 3) as u16)));
    let d = mem.alloc(512).unwrap();
    let m = mem.alloc(1024).unwrap();
    let l = mem.alloc(32 * 11 * 4).unwrap();
    let run = |name: &str, ptrs: &[u64]| {
        let k = prog.kernels().iter().find(|k| k.name == name).unwrap();
        let mut params = vec![0u8; k.params_bytes() as usize];
        for (p, v) in k.params.iter().zip(ptrs) {
            params[p.offset as usize..p.offset as usize + 8].copy_from_slice(&v.to_le_bytes());
        }
        let cfg = LaunchConfig {
            grid: [1, 1, 1],
            block: [32, 1, 1],
            dynamic_shared_bytes: 0,
        };
        prog.launch(&mem, name, &cfg, &params).result.unwrap();
    };
    run("mma_f16", &[a, b, c, d]);
    run("ldm", &[raw, l]);
    run("mma_more", &[ab, bb, ah, bh2, m]);
    let words = |p: u64, n: usize| {
        let mut v = vec![0u8; n * 4];
        mem.read(p, &mut v).unwrap();
        v.chunks(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect::<Vec<_>>()
    };
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
