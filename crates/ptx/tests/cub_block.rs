//! CUB block primitives compiled by nvcc, run on the interpreter.

mod common;

use common::{linear, Device};

/// `fixtures/cub_block.ptx` on its own device memory.
fn cub_block() -> Device {
    Device::load(
        "cub_block.ptx",
        include_str!("fixtures/cub_block.ptx"),
        1 << 28,
    )
}

fn values(n: usize) -> Vec<i32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 3) as i32 % 100_000 - 50_000)
        .collect()
}

#[test]
fn cub_block_radix_sort() {
    let dev = cub_block();
    let blocks = 6;
    let v = values(512 * blocks);
    let (din, dout) = (dev.upload(&v), dev.alloc(v.len() * 4));
    dev.launch("block_sort", linear(blocks, 128), &[&din, &dout]);
    let got: Vec<i32> = dev.download(dout, v.len());
    for b in 0..blocks {
        let mut want = v[b * 512..(b + 1) * 512].to_vec();
        want.sort();
        assert_eq!(&got[b * 512..(b + 1) * 512], &want[..], "block {b}");
    }
}

#[test]
fn cub_block_scan_and_reduce() {
    let dev = cub_block();
    let blocks = 5;
    let v: Vec<i32> = values(256 * blocks).iter().map(|x| x % 1000).collect();
    let din = dev.upload(&v);
    let (dscan, dsums) = (dev.alloc(v.len() * 4), dev.alloc(blocks * 9 * 4));
    dev.launch(
        "block_scan_reduce",
        linear(blocks, 256),
        &[&din, &dscan, &dsums],
    );
    let scan: Vec<i32> = dev.download(dscan, v.len());
    let sums: Vec<i32> = dev.download(dsums, blocks * 9);
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
