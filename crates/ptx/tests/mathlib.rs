//! CUDA's math library (compiled to plain PTX) run on the interpreter and
//! compared with the host libm: exercises carries, local-memory tables,
//! directed-rounding fma and the f64 paths.

mod common;

use common::{linear, Device, Scalar};

/// Runs kernel `name` of `mathlib.cu` on `xs`, one thread each: the
/// `per_input` results of each input in turn.
fn run<T: Scalar>(name: &str, xs: &[T], per_input: usize) -> Vec<T> {
    let dev = Device::load("mathlib.ptx", include_str!("fixtures/mathlib.ptx"), 1 << 28);
    let n = xs.len();
    let din = dev.upload(xs);
    let dout = dev.alloc(n * per_input * T::SIZE);
    dev.launch(
        name,
        linear(n.div_ceil(64), 64),
        &[&din, &dout, &(n as i32)],
    );
    dev.download(dout, n * per_input)
}

fn close(got: f64, want: f64, rel: f64) -> bool {
    if want.is_nan() {
        return got.is_nan();
    }
    if want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= rel * want.abs().max(1e-30) || (got - want).abs() < 1e-30
}

#[test]
fn float_math_library() {
    let xs: Vec<f32> = (0..200)
        .map(|i| (i as f32 - 100.0) * 0.37)
        .chain([1e4, -3e5, 0.0, -0.0, 1e-7])
        .collect();
    let out = run("mathf", &xs, 16);
    for (i, &x) in xs.iter().enumerate() {
        let o = &out[16 * i..16 * i + 16];
        let want: [f32; 16] = [
            x.exp(),
            (x.abs() + 1e-3).ln(),
            x.sin(),
            x.cos(),
            x.tan(),
            x.abs().powf(1.7),
            x.abs().sqrt(),
            x.atan2(0.75),
            x.tanh(),
            libm_erf(x as f64) as f32,
            x.cbrt(),
            x % 1.3,
            x.exp2(),
            (x.abs() + 1.0).log10(),
            (x * 0.1).clamp(-1.0, 1.0).asin(),
            x.hypot(2.0),
        ];
        for k in 0..16 {
            // trig results near zero are compared absolutely
            let ok = close(o[k] as f64, want[k] as f64, 4e-6)
                || (matches!(k, 2..=4) && (o[k] - want[k]).abs() < 1e-6);
            assert!(ok, "x={x} fn {k}: got {} want {}", o[k], want[k]);
        }
    }
}

/// erf by its series / continued fraction, accurate to ~1e-12 (host reference).
fn libm_erf(x: f64) -> f64 {
    if x.abs() < 2.5 {
        let mut sum = x;
        let mut term = x;
        for n in 1..80 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // continued fraction for erfc
        let ax = x.abs();
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (ax + f);
        }
        let erfc = (-ax * ax).exp() / std::f64::consts::PI.sqrt() / (ax + f);
        (1.0 - erfc).copysign(x)
    }
}

#[test]
fn double_math_library() {
    let xs: Vec<f64> = (0..150)
        .map(|i| (i as f64 - 75.0) * 0.413)
        .chain([1e5, -2.5e6, 0.0])
        .collect();
    let out = run("mathd", &xs, 8);
    for (i, &x) in xs.iter().enumerate() {
        let o = &out[8 * i..8 * i + 8];
        let want = [
            x.exp(),
            (x.abs() + 1e-3).ln(),
            x.sin(),
            x.cos(),
            x.abs().powf(1.7),
            x.abs().sqrt(),
            x.atan(),
            ((x * 1e6) as i64 / 7 % 1000) as f64,
        ];
        for k in 0..8 {
            let ok = close(o[k], want[k], 1e-14)
                || (matches!(k, 2 | 3) && (o[k] - want[k]).abs() < 1e-15);
            assert!(ok, "x={x} fn {k}: got {} want {}", o[k], want[k]);
        }
    }
}
