//! WMMA (tensor-core) tiles on the interpreter, against host matrix products.

mod common;

use cumux_ptx::*;
use half::{bf16, f16};

fn launch(prog: &Program, mem: &DeviceMemory, name: &str, grid: [u32; 3], args: &[Vec<u8>]) {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    common::launch(prog, mem, name, grid, [32, 1, 1], 0, &args)
        .result
        .unwrap();
}

fn upload(mem: &DeviceMemory, bytes: Vec<u8>) -> u64 {
    common::upload(mem, &bytes)
}

/// The f16 (or bf16) bytes of `values`.
fn halves<H>(values: &[f32], from_f32: impl Fn(f32) -> H, to_le: impl Fn(H) -> [u8; 2]) -> Vec<u8> {
    common::le_bytes(values, |x| to_le(from_f32(x)))
}

/// The f32 values at `p`.
fn read_f32(mem: &DeviceMemory, p: u64, n: usize) -> Vec<f32> {
    common::words(&common::download(mem, p, n * 4), f32::from_le_bytes)
}

fn small(i: usize) -> f32 {
    ((i * 7 + 3) % 9) as f32 - 4.0
}

#[test]
fn wmma_f16_gemm_with_f32_accumulator() {
    let mem = DeviceMemory::new(1 << 24);
    let prog = Program::load(include_str!("fixtures/wmma.ptx"), &mem).unwrap();
    let n = 32usize;
    let a: Vec<f32> = (0..n * n).map(small).collect(); // row-major A
    let bt: Vec<f32> = (0..n * n).map(|i| small(i * 5 + 1)).collect(); // B[k][j] = bt[j*n+k]
    let da = upload(&mem, halves(&a, f16::from_f32, f16::to_le_bytes));
    let db = upload(&mem, halves(&bt, f16::from_f32, f16::to_le_bytes));
    let dc = mem.alloc((n * n * 4) as u64).unwrap();
    let args = [
        da.to_le_bytes().to_vec(),
        db.to_le_bytes().to_vec(),
        dc.to_le_bytes().to_vec(),
        (n as i32).to_le_bytes().to_vec(),
    ];
    launch(&prog, &mem, "wmma_gemm", [2, 2, 1], &args);
    let c: Vec<f32> = read_f32(&mem, dc, n * n);
    for i in 0..n {
        for j in 0..n {
            let want: f32 = 2.0 * (0..n).map(|k| a[i * n + k] * bt[j * n + k]).sum::<f32>();
            assert_eq!(c[i * n + j], want, "({i},{j})");
        }
    }
}

#[test]
fn wmma_bf16_column_major() {
    let mem = DeviceMemory::new(1 << 24);
    let prog = Program::load(include_str!("fixtures/wmma.ptx"), &mem).unwrap();
    let a: Vec<f32> = (0..256).map(small).collect(); // column-major: A[r][c] = a[c*16+r]
    let b: Vec<f32> = (0..256).map(|i| small(i + 4)).collect(); // row-major
    let cin: Vec<f32> = (0..256).map(|i| i as f32).collect(); // column-major
    let da = upload(&mem, halves(&a, bf16::from_f32, bf16::to_le_bytes));
    let db = upload(&mem, halves(&b, bf16::from_f32, bf16::to_le_bytes));
    let dcin = upload(&mem, cin.iter().flat_map(|x| x.to_le_bytes()).collect());
    let dc = mem.alloc(256 * 4).unwrap();
    let args = [da, db, dcin, dc].map(|p| p.to_le_bytes().to_vec());
    launch(&prog, &mem, "wmma_bf16", [1, 1, 1], &args);
    let c: Vec<f32> = read_f32(&mem, dc, 256);
    for r in 0..16 {
        for col in 0..16 {
            let want = cin[col * 16 + r]
                + (0..16)
                    .map(|k| a[k * 16 + r] * b[k * 16 + col])
                    .sum::<f32>();
            assert_eq!(c[col * 16 + r], want, "({r},{col})");
        }
    }
}

#[test]
fn wmma_f16_accumulator() {
    let mem = DeviceMemory::new(1 << 24);
    let prog = Program::load(include_str!("fixtures/wmma.ptx"), &mem).unwrap();
    let a: Vec<f32> = (0..256).map(small).collect();
    let b: Vec<f32> = (0..256).map(|i| small(i + 2)).collect();
    let da = upload(&mem, halves(&a, f16::from_f32, f16::to_le_bytes));
    let db = upload(&mem, halves(&b, f16::from_f32, f16::to_le_bytes));
    let dc = mem.alloc(512).unwrap();
    let args = [da, db, dc].map(|p| p.to_le_bytes().to_vec());
    launch(&prog, &mem, "wmma_half_acc", [1, 1, 1], &args);
    let c: Vec<f32> = common::download(&mem, dc, 512)
        .chunks(2)
        .map(|b| f16::from_le_bytes(b.try_into().unwrap()).to_f32())
        .collect();
    for r in 0..16 {
        for col in 0..16 {
            let want = 1.0
                + (0..16)
                    .map(|k| a[r * 16 + k] * b[k * 16 + col])
                    .sum::<f32>();
            assert_eq!(c[r * 16 + col], want, "({r},{col})");
        }
    }
}
