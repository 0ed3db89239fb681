//! WMMA (tensor-core) tiles on the interpreter, against host matrix products.

mod common;

use common::{config, Device};
use half::{bf16, f16};

/// `fixtures/wmma.ptx` on its own device memory.
fn wmma() -> Device {
    Device::load("wmma.ptx", include_str!("fixtures/wmma.ptx"), 1 << 24)
}

/// The bits of `values` as f16 (or bf16) by `to_bits`.
fn halves(values: &[f32], to_bits: impl Fn(f32) -> u16) -> Vec<u16> {
    values.iter().map(|&x| to_bits(x)).collect()
}

fn small(i: usize) -> f32 {
    ((i * 7 + 3) % 9) as f32 - 4.0
}

#[test]
fn wmma_f16_gemm_with_f32_accumulator() {
    let dev = wmma();
    let n = 32usize;
    let a: Vec<f32> = (0..n * n).map(small).collect(); // row-major A
    let bt: Vec<f32> = (0..n * n).map(|i| small(i * 5 + 1)).collect(); // B[k][j] = bt[j*n+k]
    let f16_bits = |x| f16::from_f32(x).to_bits();
    let da = dev.upload(&halves(&a, f16_bits));
    let db = dev.upload(&halves(&bt, f16_bits));
    let dc = dev.alloc(n * n * 4);
    let cfg = config([2, 2, 1], [32, 1, 1], 0);
    dev.launch("wmma_gemm", cfg, &[&da, &db, &dc, &(n as i32)]);
    let c: Vec<f32> = dev.download(dc, n * n);
    for i in 0..n {
        for j in 0..n {
            let want: f32 = 2.0 * (0..n).map(|k| a[i * n + k] * bt[j * n + k]).sum::<f32>();
            assert_eq!(c[i * n + j], want, "({i},{j})");
        }
    }
}

#[test]
fn wmma_bf16_column_major() {
    let dev = wmma();
    let a: Vec<f32> = (0..256).map(small).collect(); // column-major: A[r][c] = a[c*16+r]
    let b: Vec<f32> = (0..256).map(|i| small(i + 4)).collect(); // row-major
    let cin: Vec<f32> = (0..256).map(|i| i as f32).collect(); // column-major
    let bf16_bits = |x| bf16::from_f32(x).to_bits();
    let da = dev.upload(&halves(&a, bf16_bits));
    let db = dev.upload(&halves(&b, bf16_bits));
    let (dcin, dc) = (dev.upload(&cin), dev.alloc(256 * 4));
    let cfg = config([1, 1, 1], [32, 1, 1], 0);
    dev.launch("wmma_bf16", cfg, &[&da, &db, &dcin, &dc]);
    let c: Vec<f32> = dev.download(dc, 256);
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
    let dev = wmma();
    let a: Vec<f32> = (0..256).map(small).collect();
    let b: Vec<f32> = (0..256).map(|i| small(i + 2)).collect();
    let f16_bits = |x| f16::from_f32(x).to_bits();
    let (da, db) = (
        dev.upload(&halves(&a, f16_bits)),
        dev.upload(&halves(&b, f16_bits)),
    );
    let dc = dev.alloc(512);
    dev.launch(
        "wmma_half_acc",
        config([1, 1, 1], [32, 1, 1], 0),
        &[&da, &db, &dc],
    );
    let c: Vec<f32> = dev
        .download::<u16>(dc, 256)
        .into_iter()
        .map(|bits| f16::from_bits(bits).to_f32())
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

/// Integer `wmma` (which a 7.5 GPU has) is refused at load, naming the
/// element type: never run as floats.
#[test]
fn integer_wmma_is_refused_naming_its_types() {
    let ptx = r#"
.version 7.0
.target sm_75
.address_size 64
.visible .entry imma(.param .u64 a)
{
  .reg .b32 %r<3>;
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [a];
  wmma.load.a.sync.aligned.row.m16n16k16.global.s8 {%r1, %r2}, [%rd1], 16;
  ret;
}
"#;
    let mem = cumux_ptx::DeviceMemory::new(1 << 20);
    let err = cumux_ptx::Program::load(ptx, &mem).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.cu_code(), 218, "{text}");
    assert!(
        text.contains("element type .s8") && text.contains("line 10"),
        "{text}"
    );
}
