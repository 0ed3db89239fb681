//! Numerics of the corpus against host models: Black-Scholes, half-precision
//! arithmetic with directed rounding, and the math library in ulps.

use crate::harness::*;

/// Results per thread of `half_precision.cu`.
const HALF_RESULTS: usize = 18;
/// Results per thread of `math_funcs.cu`, one per function.
const FUNCS: usize = 20;

fn normal_cdf(d: f64) -> f64 {
    let (a1, a2, a3, a4, a5) = (
        0.319_381_53,
        -0.356_563_782,
        1.781_477_937,
        -1.821_255_978,
        1.330_274_429,
    );
    let k = 1.0 / (1.0 + 0.231_641_9 * d.abs());
    let value = 0.398_942_280_401_432_7
        * (-0.5 * d * d).exp()
        * (k * (a1 + k * (a2 + k * (a3 + k * (a4 + k * a5)))));
    if d > 0.0 {
        1.0 - value
    } else {
        value
    }
}

#[test]
fn black_scholes() {
    let module = corpus("black_scholes");
    let n = 500;
    let (rate, volatility) = (0.02f32, 0.30f32);
    let mut rng = Rng(7);
    let spot = rng.uniform_f32s(n, 5.0, 30.0);
    let strike = rng.uniform_f32s(n, 1.0, 100.0);
    let years = rng.uniform_f32s(n, 0.25, 10.0);
    let (dcall, dput) = (module.alloc(n * 4), module.alloc(n * 4));
    let (dspot, dstrike, dyears) = (
        module.upload(&spot),
        module.upload(&strike),
        module.upload(&years),
    );
    module.launch(
        "black_scholes",
        linear(n.div_ceil(128), 128),
        &[
            &dcall,
            &dput,
            &dspot,
            &dstrike,
            &dyears,
            &rate,
            &volatility,
            &(n as i32),
        ],
    );
    let call: Vec<f32> = module.download(dcall, n);
    let put: Vec<f32> = module.download(dput, n);
    let (r, v) = (f64::from(rate), f64::from(volatility));
    for i in 0..n {
        let (s, x, t) = (
            f64::from(spot[i]),
            f64::from(strike[i]),
            f64::from(years[i]),
        );
        let d1 = ((s / x).ln() + (r + 0.5 * v * v) * t) / (v * t.sqrt());
        let d2 = d1 - v * t.sqrt();
        let discount = (-r * t).exp();
        let want_call = s * normal_cdf(d1) - x * discount * normal_cdf(d2);
        let want_put = x * discount * (1.0 - normal_cdf(d2)) - s * (1.0 - normal_cdf(d1));
        let bound = 1e-3 * s.max(1.0);
        assert!(
            (f64::from(call[i]) - want_call).abs() <= bound,
            "call[{i}] = {} expected {want_call}",
            call[i]
        );
        assert!(
            (f64::from(put[i]) - want_put).abs() <= bound,
            "put[{i}] = {} expected {want_put}",
            put[i]
        );
    }
}

/// Rounds `x` to a half with a directed rounding mode: 'z' toward zero,
/// 'd' toward -inf, 'u' toward +inf.
fn f16_directed(x: f32, mode: char) -> u16 {
    let nearest = half::f16::from_f32(x);
    let value = nearest.to_f32();
    let bits = nearest.to_bits();
    // Neighbours of `bits` one step larger or smaller in magnitude.
    let away = bits + 1;
    let toward = bits - 1;
    let too_big = value > x;
    let too_small = value < x;
    match mode {
        'z' if value.abs() > x.abs() => toward,
        'd' if too_big => {
            if x >= 0.0 {
                toward
            } else {
                away
            }
        }
        'u' if too_small => {
            if x >= 0.0 {
                away
            } else {
                toward
            }
        }
        _ => bits,
    }
}

fn ulp_distance16(x: u16, y: u16) -> u32 {
    if (x ^ y) & 0x8000 != 0 {
        u32::from(x & 0x7fff) + u32::from(y & 0x7fff)
    } else {
        u32::from((x & 0x7fff).abs_diff(y & 0x7fff))
    }
}

#[test]
fn half_precision() {
    use half::{bf16, f16};
    let module = corpus("half_precision");
    let n = 2048;
    let mut rng = Rng(9);
    let [mut a, b, c] =
        [(-8.0, 8.0), (-4.0, 4.0), (-16.0, 16.0)].map(|(lo, hi)| rng.uniform_f32s(n, lo, hi));
    a[0] = 65504.0;
    a[1] = 1e-6;
    a[2] = 70000.0;
    a[3] = -1e-9;
    let (da, db, dc) = (module.upload(&a), module.upload(&b), module.upload(&c));
    let (dout, dints) = (module.alloc(HALF_RESULTS * n * 2), module.alloc(2 * n * 4));
    module.launch(
        "half_precision",
        linear(n / 128, 128),
        &[&da, &db, &dc, &dout, &dints, &(n as i32)],
    );
    let out: Vec<u16> = module.download(dout, HALF_RESULTS * n);
    let ints: Vec<i32> = module.download(dints, 2 * n);
    let h = |v: f64| f16::from_f64(v).to_bits();
    let bfb = |v: f32| bf16::from_f32(v).to_bits();
    for i in 0..n {
        let (ha, hb, hc) = (
            f16::from_f32(a[i]),
            f16::from_f32(b[i]),
            f16::from_f32(c[i]),
        );
        let (xa, xb, xc) = (ha.to_f64(), hb.to_f64(), hc.to_f64());
        let (ba, bb, bc) = (
            bf16::from_f32(a[i]),
            bf16::from_f32(b[i]),
            bf16::from_f32(c[i]),
        );
        let (fa, fb, fc) = (ba.to_f32(), bb.to_f32(), bc.to_f32());
        let want: [u16; HALF_RESULTS] = [
            ha.to_bits(),
            f16_directed(a[i], 'z'),
            f16_directed(a[i], 'd'),
            f16_directed(a[i], 'u'),
            h(xa + xb),
            h(xa - xb),
            h(xa * xb),
            h(xa.mul_add(xb, xc)),
            h(xa * xc),
            h(xb * xa),
            h(i as f64 - 1000.0),
            ba.to_bits(),
            (a[i].to_bits() >> 16) as u16,
            bfb(fa + fb),
            bfb(fa - fb),
            bfb(fa * fb),
            bfb(bf16::from_f32(fa * fb).to_f32() + fc),
            bfb(fa * 3.0),
        ];
        for (k, &expected) in want.iter().enumerate() {
            let got = out[HALF_RESULTS * i + k];
            let allowed = if k == 7 { 1 } else { 0 };
            assert!(
                ulp_distance16(got, expected) <= allowed,
                "element {i} (a={}) result {k}: got {got:#06x} expected {expected:#06x}",
                a[i]
            );
        }
        let scaled_half = f16::from_f64(xa * 100.0).to_f64();
        let want_h = if scaled_half.is_infinite() {
            if scaled_half > 0.0 {
                i32::MAX
            } else {
                i32::MIN
            }
        } else {
            scaled_half.trunc() as i32
        };
        let want_b = bf16::from_f32(fa * 100.0).to_f32().trunc() as i32;
        assert_eq!(ints[2 * i], want_h, "element {i}: half to int");
        assert_eq!(ints[2 * i + 1], want_b, "element {i}: bfloat16 to int");
    }
}

/// erf by its Maclaurin series, accurate to ~1e-10 for |x| <= 4 (enough to
/// judge a float result in ulps).
fn erf(x: f64) -> f64 {
    if x.abs() > 6.0 {
        return x.signum();
    }
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0f64;
    while term.abs() > 1e-17 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn ulp_of(v: f64) -> f64 {
    let a = v.abs();
    if a < f64::from(f32::MIN_POSITIVE) {
        return 2f64.powi(-149);
    }
    2f64.powi(a.log2().floor() as i32 - 23)
}

#[test]
fn math_funcs() {
    let module = corpus("math_funcs");
    let n = 2048;
    let mut rng = Rng(10);
    let pi = std::f64::consts::PI;
    let mut x = rng.uniform_f32s(n, -100.0, 100.0);
    let mut p: Vec<f32> = (0..n)
        .map(|_| 10f64.powf(rng.uniform(-30.0, 30.0)) as f32)
        .collect();
    let t = rng.uniform_f32s(n, -pi, pi);
    let y = rng.uniform_f32s(n, -80.0, 80.0);
    let q = rng.uniform_f32s(n, 0.1, 10.0);
    x[..6].copy_from_slice(&[1e5, -3.0e7, 1e20, 1e38, 0.0, -0.0]);
    p[..4].copy_from_slice(&[1.0, 2.0, 0.5, 1e-38]);
    let inputs = [&x, &p, &t, &y, &q].map(|values| module.upload(values));
    let dout = module.alloc(FUNCS * n * 4);
    module.launch(
        "math_funcs",
        linear(n / 128, 128),
        &[&to_bytes(&inputs), &dout, &(n as i32)],
    );
    let out: Vec<f32> = module.download(dout, FUNCS * n);
    let names = [
        "sinf",
        "cosf",
        "tanf",
        "expf",
        "exp2f",
        "logf",
        "log2f",
        "log10f",
        "powf",
        "sqrtf",
        "rsqrtf",
        "tanhf",
        "atan2f",
        "erff",
        "cbrtf",
        "__sinf",
        "__cosf",
        "__expf",
        "__logf",
        "__fdividef",
    ];
    // Documented maximum errors in ulps; 0 means correctly rounded.
    let max_ulps = [
        2.0, 2.0, 4.0, 2.0, 2.0, 1.0, 1.0, 2.0, 4.0, 0.0, 2.0, 2.0, 3.0, 2.0, 1.0, 0.0, 0.0, 0.0,
        3.0, 2.0,
    ];
    for i in 0..n {
        let (dx, dp, dt, dy, dq) = (
            f64::from(x[i]),
            f64::from(p[i]),
            f64::from(t[i]),
            f64::from(y[i]),
            f64::from(q[i]),
        );
        let y16 = f64::from(y[i] / 16.0);
        let y10 = f64::from(y[i] / 10.0);
        let y20 = f64::from(y[i] / 20.0);
        let y8 = f64::from(y[i] / 8.0);
        let t45 = f64::from(t[i] * 0.45);
        let reference = [
            dx.sin(),
            dx.cos(),
            t45.tan(),
            dy.exp(),
            dy.exp2(),
            dp.ln(),
            dp.log2(),
            dp.log10(),
            dq.powf(y16),
            dp.sqrt(),
            1.0 / dp.sqrt(),
            y10.tanh(),
            dt.atan2(dy),
            erf(y20),
            dx.cbrt(),
            dt.sin(),
            dt.cos(),
            y8.exp(),
            dp.ln(),
            dt / dq,
        ];
        for k in 0..FUNCS {
            let got = f64::from(out[FUNCS * i + k]);
            let want = reference[k];
            let err = (got - want).abs();
            let ok = match k {
                15 => err <= 2f64.powf(-21.41),
                16 => err <= 2f64.powf(-21.19),
                // 2 + floor(|1.173 x|) documented; an H100 measured 2.1 near -0.72.
                17 => err / ulp_of(want) <= 3.0 + (1.173 * y8).abs().floor(),
                18 if (0.5..=2.0).contains(&dp) => err <= 2f64.powf(-21.41),
                _ if max_ulps[k] == 0.0 => err / ulp_of(want) <= 0.5,
                _ => err / ulp_of(want) <= max_ulps[k],
            };
            assert!(
                ok,
                "{} at element {i}: got {got:e} expected {want:e} ({:.2} ulp)",
                names[k],
                err / ulp_of(want)
            );
        }
    }
}
