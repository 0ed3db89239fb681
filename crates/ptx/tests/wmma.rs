//! WMMA (tensor-core) tiles on the interpreter, against host matrix products.

use cumux_ptx::*;
use half::{bf16, f16};

fn launch(prog: &Program, mem: &DeviceMemory, name: &str, grid: [u32; 3], args: &[Vec<u8>]) {
    let k = prog.kernels().iter().find(|k| k.name == name).unwrap();
    let mut params = vec![0u8; k.params_bytes() as usize];
    for (p, v) in k.params.iter().zip(args) {
        params[p.offset as usize..p.offset as usize + v.len()].copy_from_slice(v);
    }
    let cfg = LaunchConfig {
        grid,
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
    };
    prog.launch(mem, name, &cfg, &params).result.unwrap();
}

fn upload(mem: &DeviceMemory, bytes: Vec<u8>) -> u64 {
    let p = mem.alloc(bytes.len() as u64).unwrap();
    mem.write(p, &bytes).unwrap();
    p
}

fn read(mem: &DeviceMemory, p: u64, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    mem.read(p, &mut b).unwrap();
    b
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
    let da = upload(
        &mem,
        a.iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
    );
    let db = upload(
        &mem,
        bt.iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
    );
    let dc = mem.alloc((n * n * 4) as u64).unwrap();
    let args = [
        da.to_le_bytes().to_vec(),
        db.to_le_bytes().to_vec(),
        dc.to_le_bytes().to_vec(),
        (n as i32).to_le_bytes().to_vec(),
    ];
    launch(&prog, &mem, "wmma_gemm", [2, 2, 1], &args);
    let c: Vec<f32> = read(&mem, dc, n * n * 4)
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
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
    let da = upload(
        &mem,
        a.iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
    );
    let db = upload(
        &mem,
        b.iter()
            .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
            .collect(),
    );
    let dcin = upload(&mem, cin.iter().flat_map(|x| x.to_le_bytes()).collect());
    let dc = mem.alloc(256 * 4).unwrap();
    let args = [da, db, dcin, dc].map(|p| p.to_le_bytes().to_vec());
    launch(&prog, &mem, "wmma_bf16", [1, 1, 1], &args);
    let c: Vec<f32> = read(&mem, dc, 1024)
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
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
    let da = upload(
        &mem,
        a.iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
    );
    let db = upload(
        &mem,
        b.iter()
            .flat_map(|x| f16::from_f32(*x).to_le_bytes())
            .collect(),
    );
    let dc = mem.alloc(512).unwrap();
    let args = [da, db, dc].map(|p| p.to_le_bytes().to_vec());
    launch(&prog, &mem, "wmma_half_acc", [1, 1, 1], &args);
    let c: Vec<f32> = read(&mem, dc, 512)
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
