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

/// `fixtures/imma.ptx` (integer tiles) on its own device memory.
fn imma() -> Device {
    Device::load("imma.ptx", include_str!("fixtures/imma.ptx"), 1 << 24)
}

/// `c += a * b` on the host, 16 of `k` at a time as each `wmma.mma` adds
/// them: `a` 16 x `k` row-major, `b` stored as 16 columns of `k`, `c`
/// 16 x 16 row-major; each step's sum wrapped or clamped to i32.
fn imma_host(a: &[i64], b: &[i64], c: &[i32], k: usize, clamp: bool) -> Vec<i32> {
    (0..256)
        .map(|e| {
            let (i, j) = (e / 16, e % 16);
            (0..k).step_by(16).fold(c[e], |acc, k0| {
                let step: i64 = (k0..k0 + 16).map(|kk| a[i * k + kk] * b[j * k + kk]).sum();
                let sum = acc as i64 + step;
                if clamp {
                    sum.clamp(i32::MIN as i64, i32::MAX as i64) as i32
                } else {
                    sum as i32
                }
            })
        })
        .collect()
}

/// Integer `wmma` (`.s8`/`.u8` into `.s32`, as a 7.2+ GPU and so the CPU
/// device's 7.5 have it): exact sums, wrapping, or clamped by `.satfinite`.
#[test]
fn integer_wmma_sums_exactly_wraps_and_saturates() {
    let dev = imma();
    let k = 48usize;
    let bytes = |mul: usize, add: usize| -> Vec<u8> {
        (0..16 * k).map(|i| ((i * mul + add) % 256) as u8).collect()
    };
    let (a_bytes, b_bytes) = (bytes(37, 11), bytes(53, 5));
    // accumulators near both ends of the range, so that sums pass them
    let c: Vec<i32> = (0..256)
        .map(|e: i32| match e % 3 {
            0 => i32::MAX - 1000,
            1 => i32::MIN + 1000,
            _ => e * 1000 - 7,
        })
        .collect();
    // (kernel, signed inputs, .satfinite)
    for (kernel, signed, clamp) in [
        ("imma_s8", true, false),
        ("imma_u8", false, false),
        ("imma_s8_sat", true, true),
    ] {
        let value = |v: &[u8]| -> Vec<i64> {
            v.iter()
                .map(|&x| if signed { x as i8 as i64 } else { x as i64 })
                .collect()
        };
        let (a, b) = (value(&a_bytes), value(&b_bytes));
        let da = dev.upload(&a_bytes);
        let db = dev.upload(&b_bytes);
        let dc = dev.upload(&c);
        dev.launch(
            kernel,
            config([1, 1, 1], [32, 1, 1], 0),
            &[&da, &db, &dc, &(k as i32)],
        );
        let got: Vec<i32> = dev.download(dc, 256);
        let want = imma_host(&a, &b, &c, k, clamp);
        assert_eq!(got, want, "{kernel}");
        if clamp {
            assert!(
                got.contains(&i32::MAX) || got.contains(&i32::MIN),
                "{kernel}: nothing clamped"
            );
        }
    }
}

/// `wmma.mma` of mixed integer and float types is refused at load, naming
/// its element types: never run as one or the other.
#[test]
fn mixed_wmma_types_are_refused_naming_them() {
    let ptx = r#"
.version 7.0
.target sm_75
.address_size 64
.visible .entry mixed()
{
  .reg .b32 %r<20>;
  wmma.mma.sync.aligned.row.col.m16n16k16.s32.f16.f16.s32 {%r1, %r2, %r3, %r4, %r5, %r6, %r7, %r8}, {%r9, %r10}, {%r11, %r12}, {%r1, %r2, %r3, %r4, %r5, %r6, %r7, %r8};
  ret;
}
"#;
    let mem = cumux_ptx::DeviceMemory::new(1 << 20);
    let err = cumux_ptx::Program::load(ptx, &mem).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.cu_code(), 218, "{text}");
    assert!(
        text.contains("element type .s32.f16.f16.s32") && text.contains("line 8"),
        "{text}"
    );
}

/// Float `wmma.mma` with `.satfinite` (which nvcc no longer emits, but PTX
/// allows): an f16 sum past the type's range is its largest finite value,
/// where without it the sum is infinite.
#[test]
fn float_wmma_satfinite_clamps_to_the_largest_finite_value() {
    let plain = include_str!("fixtures/wmma.ptx");
    let sat = plain.replace("m16n16k16.f16.f16 ", "m16n16k16.f16.f16.satfinite ");
    assert_ne!(plain, sat, "the fixture's f16 wmma.mma");
    let big: Vec<u16> = vec![f16::from_f32(200.0).to_bits(); 256];
    for (ptx, want) in [(plain, f16::INFINITY), (sat.as_str(), f16::MAX)] {
        let dev = Device::load("wmma.ptx", ptx, 1 << 24);
        let (da, db) = (dev.upload(&big), dev.upload(&big));
        let dc = dev.alloc(512);
        dev.launch(
            "wmma_half_acc",
            config([1, 1, 1], [32, 1, 1], 0),
            &[&da, &db, &dc],
        );
        let c: Vec<u16> = dev.download(dc, 256);
        assert!(
            c.iter().all(|&bits| f16::from_bits(bits) == want),
            "{:?}",
            f16::from_bits(c[0])
        );
    }
}
