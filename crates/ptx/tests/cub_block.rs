//! CUB block primitives compiled by nvcc, run on the interpreter.

mod common;

use cumux_ptx::*;

fn launch(prog: &Program, mem: &DeviceMemory, name: &str, grid: u32, block: u32, ptrs: &[u64]) {
    let args: Vec<[u8; 8]> = ptrs.iter().map(|p| p.to_le_bytes()).collect();
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    common::launch(prog, mem, name, [grid, 1, 1], [block, 1, 1], 0, &args)
        .result
        .unwrap();
}

fn upload(mem: &DeviceMemory, v: &[i32]) -> u64 {
    common::upload(mem, &common::le_bytes(v, i32::to_le_bytes))
}

fn download(mem: &DeviceMemory, p: u64, n: usize) -> Vec<i32> {
    common::words(&common::download(mem, p, n * 4), i32::from_le_bytes)
}

fn values(n: usize) -> Vec<i32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 3) as i32 % 100_000 - 50_000)
        .collect()
}

#[test]
fn cub_block_radix_sort() {
    let mem = DeviceMemory::new(1 << 28);
    let prog = Program::load(include_str!("fixtures/cub_block.ptx"), &mem).unwrap();
    let blocks = 6;
    let v = values(512 * blocks);
    let (din, dout) = (upload(&mem, &v), mem.alloc((v.len() * 4) as u64).unwrap());
    launch(&prog, &mem, "block_sort", blocks as u32, 128, &[din, dout]);
    let got = download(&mem, dout, v.len());
    for b in 0..blocks {
        let mut want = v[b * 512..(b + 1) * 512].to_vec();
        want.sort();
        assert_eq!(&got[b * 512..(b + 1) * 512], &want[..], "block {b}");
    }
}

#[test]
fn cub_block_scan_and_reduce() {
    let mem = DeviceMemory::new(1 << 28);
    let prog = Program::load(include_str!("fixtures/cub_block.ptx"), &mem).unwrap();
    let blocks = 5;
    let v: Vec<i32> = values(256 * blocks).iter().map(|x| x % 1000).collect();
    let din = upload(&mem, &v);
    let dscan = mem.alloc((v.len() * 4) as u64).unwrap();
    let dsums = mem.alloc((blocks * 9 * 4) as u64).unwrap();
    launch(
        &prog,
        &mem,
        "block_scan_reduce",
        blocks as u32,
        256,
        &[din, dscan, dsums],
    );
    let scan = download(&mem, dscan, v.len());
    let sums = download(&mem, dsums, blocks * 9);
    for b in 0..blocks {
        let chunk = &v[b * 256..(b + 1) * 256];
        let mut acc = 0;
        for (i, x) in chunk.iter().enumerate() {
            assert_eq!(scan[b * 256 + i], acc, "block {b} scan {i}");
            acc += x;
        }
        assert_eq!(sums[b * 9], *chunk.iter().max().unwrap(), "block {b} max");
        for w in 0..8 {
            assert_eq!(
                sums[b * 9 + 1 + w],
                chunk[w * 32..(w + 1) * 32].iter().sum::<i32>(),
                "block {b} warp {w}"
            );
        }
    }
}
