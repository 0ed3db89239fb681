//! CUB block primitives compiled by nvcc, run on the interpreter.

use cumux_ptx::*;

fn launch(prog: &Program, mem: &DeviceMemory, name: &str, grid: u32, block: u32, ptrs: &[u64]) {
    let k = prog.kernels().iter().find(|k| k.name == name).unwrap();
    let mut params = vec![0u8; k.params_bytes() as usize];
    for (p, v) in k.params.iter().zip(ptrs) {
        params[p.offset as usize..p.offset as usize + 8].copy_from_slice(&v.to_le_bytes());
    }
    let cfg = LaunchConfig {
        grid: [grid, 1, 1],
        block: [block, 1, 1],
        dynamic_shared_bytes: 0,
    };
    prog.launch(mem, name, &cfg, &params).result.unwrap();
}

fn upload(mem: &DeviceMemory, v: &[i32]) -> u64 {
    let p = mem.alloc((v.len() * 4) as u64).unwrap();
    mem.write(
        p,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    )
    .unwrap();
    p
}

fn download(mem: &DeviceMemory, p: u64, n: usize) -> Vec<i32> {
    let mut b = vec![0u8; n * 4];
    mem.read(p, &mut b).unwrap();
    b.chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
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
