//! Instruction families checked against host models: warp ops with partial
//! masks, integer bit ops, float rounding modes, f16/bf16 and printf formats.

mod common;

use common::{int_ops_inputs, linear, Device, Scalar, FLOAT_OPS_X, FLOAT_OPS_Y};
use cumux_ptx::LaunchLimits;

/// `fixtures/ops.ptx` on its own device memory.
fn ops() -> Device {
    Device::load("ops.ptx", include_str!("fixtures/ops.ptx"), 1 << 28)
}

/// Runs `name(a, b, out)` as one block, a thread per element of `a` and
/// `b`: the `per_thread` result words of each thread in turn.
fn binary_kernel<T: Scalar>(name: &str, a: &[T], b: &[T], per_thread: usize) -> Vec<u32> {
    let dev = ops();
    let n = a.len();
    let (da, db, dout) = (dev.upload(a), dev.upload(b), dev.alloc(n * per_thread * 4));
    dev.launch(name, linear(1, n), &[&da, &db, &dout]);
    dev.download(dout, n * per_thread)
}

#[test]
fn warp_ops_with_partial_masks() {
    let dev = ops();
    let n = 64usize;
    let v: Vec<i32> = (0..n as i32).map(|i| (i * 37 + 11) % 101 - 20).collect();
    let (din, dout) = (dev.upload(&v), dev.alloc(n * 12 * 4));
    dev.launch("warp_ops", linear(1, n), &[&din, &dout]);
    let out: Vec<u32> = dev.download(dout, n * 12);
    let odd_count = v.iter().filter(|x| *x & 1 != 0).count() as u32;
    for t in 0..n {
        let base = t / 32 * 32;
        let l = t % 32;
        let w = &v[base..base + 32];
        let o = &out[12 * t..12 * t + 12];
        assert_eq!(o[0], w[5] as u32, "t{t} idx");
        let up = if l % 16 >= 3 { w[l - 3] } else { w[l] };
        assert_eq!(o[1], up as u32, "t{t} up");
        let down = if l % 8 + 2 < 8 { w[l + 2] } else { w[l] };
        assert_eq!(o[2], down as u32, "t{t} down");
        assert_eq!(o[3], w[l ^ 9] as u32, "t{t} bfly");
        if l < 16 {
            assert_eq!(o[4], w[15] as u32, "t{t} half idx");
            let ballot = (0..16)
                .filter(|&k| w[k] & 1 != 0)
                .fold(0u32, |m, k| m | 1 << k);
            assert_eq!(o[5], ballot, "t{t} half ballot");
        } else {
            let sum = w[16..].iter().fold(0u32, |a, x| a.wrapping_add(*x as u32));
            assert_eq!(o[4], sum, "t{t} redux add");
            assert_eq!(
                o[5],
                w[16..].iter().map(|x| *x as u32).max().unwrap(),
                "t{t} redux max"
            );
        }
        let m = (0..32)
            .filter(|&k| w[k] & 3 == w[l] & 3)
            .fold(0u32, |m, k| m | 1 << k);
        assert_eq!(o[6], m, "t{t} match");
        assert_eq!(o[7], *w.iter().min().unwrap() as u32, "t{t} redux min");
        assert_eq!(
            o[8],
            w.iter().fold(0u32, |a, x| a | *x as u32),
            "t{t} redux or"
        );
        assert_eq!(o[9] != 0, w.contains(&77), "t{t} any");
        assert_eq!(o[10] != 0, w.iter().all(|x| *x >= 0), "t{t} all");
        assert_eq!(o[11], odd_count, "t{t} syncthreads_count");
    }
}

fn prmt(x: u32, y: u32, s: u32) -> u32 {
    let bytes = ((y as u64) << 32) | x as u64;
    (0..4).fold(0u32, |r, k| {
        let sel = (s >> (4 * k)) & 7;
        r | ((((bytes >> (8 * sel)) & 0xff) as u32) << (8 * k))
    })
}

#[test]
fn integer_ops() {
    let n = 96usize;
    let (a, b) = int_ops_inputs(n);
    let out = binary_kernel("int_ops", &a, &b, 16);
    for t in 0..n {
        let (x, y) = (a[t], b[t]);
        let (sx, sy) = (x as i32, y as i32);
        let o = &out[16 * t..16 * t + 16];
        let wide = ((y as u64) << 32) | x as u64;
        let ffs = |v: u64| if v == 0 { 0 } else { v.trailing_zeros() + 1 };
        let want = [
            x.reverse_bits(),
            x.count_ones() + 100 * x.leading_zeros(),
            prmt(x, y, 0x7531),
            ((wide << (y & 31)) >> 32) as u32,
            (wide >> (y & 63).min(32)) as u32,
            ((x as u64 * y as u64) >> 32) as u32,
            ((sx as i64 * sy as i64) >> 32) as u32,
            x.checked_div(y).unwrap_or(0),
            if sy == 0 {
                0
            } else {
                sx.wrapping_rem(sy) as u32
            },
            (x >> (y & 31)) & ((1u32 << ((y >> 8) & 15)) - 1),
            (sx >> (y & 31)) as u32,
            ffs(x as u64) + 64 * ffs(y as u64),
            ((x as u64 * y as u64) >> 32) as u32,
            ((sx as i64 - sy as i64).unsigned_abs() as u32).wrapping_add(7),
            (sx.min(sy) as u32) ^ x.max(y),
            (0..4).fold(5u32, |acc, k| {
                acc.wrapping_add(((x >> (8 * k)) & 0xff) * ((y >> (8 * k)) & 0xff))
            }),
        ];
        for k in 0..16 {
            assert_eq!(o[k], want[k], "thread {t} result {k}: x={x:#x} y={y:#x}");
        }
    }
}

#[derive(Clone, Copy)]
enum Dir {
    Zero,
    Down,
    Up,
}

/// Rounds an exactly known f64 to f32 in a direction.
fn round_dir(x: f64, dir: Dir) -> f32 {
    let r = x as f32;
    if r.is_nan() || (r as f64) == x {
        return r;
    }
    match dir {
        Dir::Zero if (r as f64).abs() > x.abs() => {
            if r > 0.0 {
                r.next_down()
            } else {
                r.next_up()
            }
        }
        Dir::Down if (r as f64) > x => r.next_down(),
        Dir::Up if (r as f64) < x => r.next_up(),
        _ => r,
    }
}

fn same(a: u32, b: f32) -> bool {
    a == b.to_bits() || (f32::from_bits(a).is_nan() && b.is_nan())
}

#[test]
fn float_rounding_modes_and_halves() {
    let (xs, ys) = (FLOAT_OPS_X, FLOAT_OPS_Y);
    let n = xs.len();
    let out = binary_kernel("float_ops", &xs, &ys, 20);
    for t in 0..n {
        let (x, y) = (xs[t], ys[t]);
        let o = &out[20 * t..20 * t + 20];
        let sum = x as f64 + y as f64;
        let prod = x as f64 * y as f64;
        let ctx = format!("thread {t}: x={x} y={y}");
        assert!(
            same(o[0], round_dir(sum, Dir::Zero)),
            "{ctx} add.rz {:e}",
            f32::from_bits(o[0])
        );
        // IEEE: an exact zero sum of opposite-signed operands is -0 when rounding down
        let down = if sum == 0.0 && x.is_sign_negative() != y.is_sign_negative() {
            -0.0
        } else {
            round_dir(sum, Dir::Down)
        };
        assert!(same(o[1], down), "{ctx} add.rm");
        assert!(same(o[2], round_dir(sum, Dir::Up)), "{ctx} add.rp");
        assert!(same(o[3], round_dir(prod, Dir::Zero)), "{ctx} mul.rz");
        assert!(same(o[4], x / y), "{ctx} div.rn");
        if (x / y).is_nan() {
            assert_eq!(o[4], 0x7fff_ffff, "{ctx} canonical NaN");
        }
        assert!(same(o[5], x.abs().sqrt()), "{ctx} sqrt.rn");
        assert!(same(o[6], 1.0 / y), "{ctx} rcp.rn");
        let x10 = x * 10.0;
        let sat_i32 = |v: f32| v.clamp(i32::MIN as f32, i32::MAX as f32) as i32 as u32;
        assert_eq!(o[7], sat_i32(x10.round_ties_even()), "{ctx} cvt.rni");
        assert_eq!(o[8], sat_i32(x10.floor()), "{ctx} cvt.rmi");
        assert_eq!(o[9], sat_i32(x10.ceil()), "{ctx} cvt.rpi");
        assert_eq!(o[10], (x.abs() * 10.0) as u32, "{ctx} cvt.rzi.u32");
        // saturation maps NaN and -0 to +0 (checked against an H100)
        let sat = if x.is_nan() || x <= 0.0 {
            0.0
        } else {
            x.min(1.0)
        };
        assert!(same(o[11], sat), "{ctx} sat");
        assert!(same(o[12], x.mul_add(y, 1.0)), "{ctx} fma");
        assert!(
            same(
                o[13],
                x.floor() + y.ceil() + x.trunc() + y.round_ties_even()
            ),
            "{ctx} round"
        );
        assert!(same(o[14], x * ((y as f64 / 3.0) as f32)), "{ctx} f64 div");
        assert!(
            same(o[15], x.copysign(y) + x.min(y) + x.max(y)),
            "{ctx} copysign/min/max"
        );
        let h = half::f16::from_f32(x).to_bits() as u32;
        let bh = half::bf16::from_f32(y).to_bits() as u32;
        assert_eq!(o[16], h | bh << 16, "{ctx} f16/bf16 conversion");
        let hs = (half::f16::from_f32(x) + half::f16::from_f32(y)).to_f32();
        assert!(same(o[17], hs), "{ctx} f16 add");
        let q = x / y;
        let flags = q.is_nan() as u32
            + 2 * q.is_infinite() as u32
            + 4 * (x < y) as u32
            + 8 * x.is_nan() as u32;
        assert_eq!(o[18], flags, "{ctx} flags");
        let big = x * 1e6;
        let as_i64 = if big.is_nan() {
            0
        } else {
            big.clamp(i64::MIN as f32, i64::MAX as f32) as i64
        };
        assert!(same(o[19], as_i64 as f32), "{ctx} i64 round trip");
    }
}

#[test]
fn printf_formats() {
    let dev = ops();
    let s = dev.alloc(16);
    dev.mem.write(s, b"hello\0").unwrap();
    let pi = std::f64::consts::PI;
    let r = dev.launch(
        "fmt",
        linear(1, 1),
        &[&42i32, &0xBEEFu32, &(-1_234_567_890_123i64), &pi, &s],
    );
    let text = String::from_utf8(r.stdout).unwrap();
    assert_eq!(
        text,
        "[   42|42   |00042|beef|BEEF|0137357|48879|-1234567890123|18446742839141661493|Q|hello|he|%]\n\
         [3.141593|3.142e+00|3.14159|1e-05|1.23457e+08|    3.1416|3.1       |+42]\n"
    );
}

/// A block keeps the printf text its context's FIFO holds, and drops what
/// does not fit, as a full FIFO does.
#[test]
fn printf_keeps_what_the_fifo_holds() {
    let dev = ops();
    let s = dev.alloc(16);
    dev.mem.write(s, b"hello\0").unwrap();
    let args: [&dyn common::KernelArg; 5] = [&42i32, &0xBEEFu32, &-1i64, &0.5f64, &s];
    let whole = dev.launch("fmt", linear(1, 1), &args).stdout;
    let first = whole.iter().position(|b| *b == b'\n').unwrap() + 1;
    assert!(first < whole.len());
    for (fifo, kept) in [(whole.len(), whole.len()), (whole.len() - 1, first), (0, 0)] {
        let limits = LaunchLimits {
            printf_fifo: fifo,
            ..LaunchLimits::NONE
        };
        let r = dev.launch_limited("fmt", linear(1, 1), &args, &limits);
        assert_eq!(r.stdout, whole[..kept], "a FIFO of {fifo} bytes");
    }
}

#[test]
fn directed_rounding_f64_and_f32() {
    let dev = ops();
    let ins = [1.0f64, 3.0, 2.0, 2f64.powi(-60), 1.0 + 2f64.powi(-30)];
    let (din, fin) = (dev.upload(&ins), dev.upload(&[2.0f32, 3.0]));
    let (dout, fout) = (dev.alloc(12 * 8), dev.alloc(5 * 4));
    dev.launch("directed", linear(1, 1), &[&din, &dout, &fin, &fout]);
    let out: Vec<u64> = dev.download(dout, 12);
    let third = 0x3FD5_5555_5555_5555u64; // rn(1/3), below the exact value
    let sqrt2 = 0x3FF6_A09E_667F_3BCDu64; // rn(sqrt 2), above the exact value
    let p2 = (1.0 + 2f64.powi(-29)).to_bits(); // rn((1+2^-30)^2), below exact
    let want = [
        third + 1,
        third,
        (-2.0f64 / 3.0).to_bits(), // rn(-2/3) = -0x3FE5..55, already toward zero
        sqrt2 - 1,
        sqrt2,
        1f64.next_up().to_bits(),
        (-(1f64.next_up())).to_bits(),
        (-1.0f64).to_bits(),
        p2 + 1,
        p2,
        third + 1,
        1.0f64.to_bits(),
    ];
    for (k, (g, w)) in out.iter().zip(want).enumerate() {
        assert_eq!(
            *g,
            w,
            "f64 result {k}: got {:e} want {:e}",
            f64::from_bits(*g),
            f64::from_bits(w)
        );
    }
    let f: Vec<u32> = dev.download(fout, 5);
    assert_eq!(
        f,
        vec![
            0x3FB5_04F3,
            0x3FB5_04F4,
            0x3EAA_AAAB,
            0x3EAA_AAAA,
            0x3EAA_AAAA
        ]
    );
}
