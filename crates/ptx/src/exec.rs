//! The interpreter: runs one launch of a lowered kernel. Blocks run in
//! parallel on host threads; inside a block, threads run one at a time up to
//! the next collective (barrier or warp op), which is resolved exactly.

use crate::ir::*;
use crate::launch::{Fault, LaunchConfig, LaunchReport};
use crate::memory::{atomic_load, atomic_rmw, atomic_store, DeviceMemory, MemView, DEVICE_VA_BASE};
use crate::printf;
use half::{bf16, f16};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Generic-address window of the per-thread local space.
pub const LOCAL_WINDOW: u64 = 0x1000_0000_0000;
/// Generic-address window of the per-block shared space.
pub const SHARED_WINDOW: u64 = 0x1100_0000_0000;
/// Generic-address window of the kernel parameter space.
pub const PARAM_WINDOW: u64 = 0x1200_0000_0000;
const WINDOW_SIZE: u64 = 1 << 32;
/// Per-thread local memory limit (frames and call stack).
const LOCAL_LIMIT: usize = 512 * 1024;
const MAX_CALL_DEPTH: usize = 4096;
/// Device printf output kept per block and per launch (bytes).
const PRINTF_LIMIT: usize = 1 << 20;
/// Registers plus local memory of all threads of one block (bytes).
const BLOCK_MEMORY_LIMIT: usize = 256 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ready,
    AtWarp,
    AtBar,
    Exited,
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    func: u32,
    call_pc: u32,
    rbase: u32,
    lbase: u32,
}

struct Thread {
    pc: u32,
    func: u32,
    rbase: u32,
    lbase: u32,
    frames: Vec<Frame>,
    status: Status,
    clock: u64,
    regs: Vec<u64>,
    local: Vec<u64>,
}

/// Launch-wide, read-only facts.
struct Geo<'a> {
    prog: &'a Module,
    mem: &'a MemView<'a>,
    params: &'a [u64],
    params_len: u64,
    ntid: [u32; 3],
    nctaid: [u32; 3],
    dyn_bytes: u32,
    shared_bytes: u64,
    start_ns: u64,
    kernel: u32,
    /// Instructions a block may execute before the launch fails.
    budget: u64,
    /// Bytes of registers plus local memory one thread may use (call stack).
    stack_limit: usize,
    /// Run the lanes of a warp in lockstep (module uses volatile accesses).
    lockstep: bool,
}

/// Per-worker mutable state of the block being run.
struct Block {
    ctaid: [u32; 3],
    smid: u32,
    shared: Vec<u64>,
    out: Vec<u8>,
    cache: (u64, u64, usize),
    arrivals: [u32; 16],
    instructions: u64,
    warp_live: Vec<u32>,
}

enum Stop {
    Collective,
    Exit,
    /// Step budget used up; the thread stays ready.
    Yield,
}

#[inline]
fn sext(v: u64, bits: u32) -> i64 {
    if bits >= 64 {
        v as i64
    } else {
        let s = 64 - bits;
        ((v << s) as i64) >> s
    }
}

fn bytes_of(v: &mut [u64]) -> &mut [u8] {
    let len = v.len() * 8;
    // SAFETY: any u64 buffer may be viewed as bytes; the view borrows `v` mutably.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, len) }
}

#[inline]
fn f32_of(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

#[inline]
fn ftz32(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// Rounds an f64 to f32 with a directed mode.
fn round_f32(x: f64, rnd: Rnd) -> f32 {
    let r = x as f32;
    if r.is_nan() || r.is_infinite() && x.is_infinite() {
        return r;
    }
    let rd = r as f64;
    match rnd {
        Rnd::Rz => {
            if rd.abs() > x.abs() {
                r.next_toward_zero()
            } else {
                r
            }
        }
        Rnd::Rm => {
            if rd > x {
                r.next_down()
            } else {
                r
            }
        }
        Rnd::Rp => {
            if rd < x {
                r.next_up()
            } else {
                r
            }
        }
        _ => r,
    }
}

trait TowardZero {
    fn next_toward_zero(self) -> Self;
}
impl TowardZero for f32 {
    fn next_toward_zero(self) -> f32 {
        if self > 0.0 {
            self.next_down()
        } else if self < 0.0 {
            self.next_up()
        } else {
            self
        }
    }
}

/// Round an integer (as i128) to f64/f32 with a directed mode.
fn int_to_float(v: i128, dt: Ty, rnd: Rnd) -> u64 {
    match dt {
        Ty::F64 => {
            let r = v as f64;
            let adj = match rnd {
                Rnd::Rz if (r as i128).abs() > v.abs() => r.next_toward_zero64(),
                Rnd::Rm if (r as i128) > v => r.next_down(),
                Rnd::Rp if (r as i128) < v => r.next_up(),
                _ => r,
            };
            adj.to_bits()
        }
        Ty::F32 => {
            let r = v as f32;
            let adj = match rnd {
                Rnd::Rz if (r as i128).abs() > v.abs() => r.next_toward_zero(),
                Rnd::Rm if (r as i128) > v => r.next_down(),
                Rnd::Rp if (r as i128) < v => r.next_up(),
                _ => r,
            };
            adj.to_bits() as u64
        }
        Ty::F16 => f16::from_f64(v as f64).to_bits() as u64,
        Ty::BF16 => bf16::from_f64(v as f64).to_bits() as u64,
        _ => 0,
    }
}

trait TowardZero64 {
    fn next_toward_zero64(self) -> Self;
}
impl TowardZero64 for f64 {
    fn next_toward_zero64(self) -> f64 {
        if self > 0.0 {
            self.next_down()
        } else if self < 0.0 {
            self.next_up()
        } else {
            self
        }
    }
}

/// Rounds an f64 to f16/bf16 bits with the given mode.
fn round_half(x: f64, bf: bool, rnd: Rnd) -> u64 {
    let bits = if bf {
        bf16::from_f64(x).to_bits()
    } else {
        f16::from_f64(x).to_bits()
    };
    let v = |b: u16| {
        if bf {
            bf16::from_bits(b).to_f64()
        } else {
            f16::from_bits(b).to_f64()
        }
    };
    let rv = v(bits);
    if x.is_nan() || rv == x {
        return bits as u64;
    }
    let neg = bits & 0x8000 != 0;
    // stepping the magnitude of a non-NaN half: bits +- 1 within its sign
    let mag_down = |b: u16| if b & 0x7fff == 0 { b } else { b - 1 };
    let mag_up = |b: u16| b.wrapping_add(1);
    let r = match rnd {
        Rnd::Rz if rv.abs() > x.abs() => mag_down(bits),
        Rnd::Rm if rv > x => {
            if neg {
                mag_up(bits)
            } else {
                mag_down(bits)
            }
        }
        Rnd::Rp if rv < x => {
            if neg {
                mag_down(bits)
            } else {
                mag_up(bits)
            }
        }
        _ => bits,
    };
    r as u64
}

/// Sign of (exact result - rounded result) for an f64 operation, from
/// error-free transformations: -1, 0 or 1.
fn residual_sign(op: FOp, x: f64, y: f64, r: f64) -> i32 {
    if !r.is_finite() || !x.is_finite() || !y.is_finite() {
        return 0;
    }
    let e = match op {
        FOp::Add | FOp::Sub => {
            let y = if op == FOp::Sub { -y } else { y };
            // two-sum: exact error of r = x + y
            let bv = r - x;
            let av = r - bv;
            (x - av) + (y - bv)
        }
        FOp::Mul => x.mul_add(y, -r),
        FOp::Div => {
            // x - r*y has the sign of (x/y - r) times the sign of y
            let rem = (-r).mul_add(y, x);
            if y < 0.0 {
                -rem
            } else {
                rem
            }
        }
        _ => 0.0,
    };
    if e > 0.0 {
        1
    } else if e < 0.0 {
        -1
    } else {
        0
    }
}

/// Moves a round-to-nearest f64 result to the directed-rounding result given
/// the sign of the exact residual.
fn adjust_f64(r: f64, sign: i32, rnd: Rnd) -> f64 {
    match (rnd, sign) {
        (Rnd::Rm, -1) => r.next_down(),
        (Rnd::Rp, 1) => r.next_up(),
        (Rnd::Rz, -1) if r > 0.0 => r.next_down(),
        (Rnd::Rz, 1) if r < 0.0 => r.next_up(),
        _ => r,
    }
}

/// `sqrt` and `rcp` with a directed rounding mode.
fn directed_unary(op: UnOp, t: Ty, a: u64, rnd: Rnd, ftz: bool) -> u64 {
    if t == Ty::F32 {
        let mut x = f32_of(a);
        if ftz {
            x = ftz32(x);
        }
        let x = x as f64;
        let exact = if op == UnOp::Sqrt { x.sqrt() } else { 1.0 / x };
        // f64 results of f32 inputs are within half an f64 ulp: directed rounding
        // to f32 from them is exact except in vanishingly rare ties
        let r = round_f32(exact, rnd);
        return (if ftz { ftz32(r) } else { r }).to_bits() as u64;
    }
    let x = f64::from_bits(a);
    let (r, sign) = if op == UnOp::Sqrt {
        let r = x.sqrt();
        let e = (-r).mul_add(r, x);
        (
            r,
            if e > 0.0 {
                1
            } else if e < 0.0 {
                -1
            } else {
                0
            },
        )
    } else {
        let r = 1.0 / x;
        (r, residual_sign(FOp::Div, 1.0, x, r))
    };
    if !r.is_finite() {
        return r.to_bits();
    }
    adjust_f64(r, sign, rnd).to_bits()
}

fn round_int(x: f64, rnd: Rnd) -> f64 {
    match rnd {
        Rnd::Rni | Rnd::Rn => x.round_ties_even(),
        Rnd::Rmi | Rnd::Rm => x.floor(),
        Rnd::Rpi | Rnd::Rp => x.ceil(),
        _ => x.trunc(),
    }
}

/// Reads a float-typed value as f64 (f16/bf16/f32/f64).
#[inline]
fn fval(v: u64, t: Ty) -> f64 {
    match t {
        Ty::F32 => f32_of(v) as f64,
        Ty::F64 => f64::from_bits(v),
        Ty::F16 => f16::from_bits(v as u16).to_f64(),
        Ty::BF16 => bf16::from_bits(v as u16).to_f64(),
        _ => f64::from_bits(v),
    }
}

/// NaN results as the GPU produces them: the canonical all-ones-mantissa NaN.
#[inline]
fn canon_nan(v: u64, t: Ty) -> u64 {
    match t {
        Ty::F32 if f32_of(v).is_nan() => 0x7fff_ffff,
        Ty::F64 if f64::from_bits(v).is_nan() => 0x7fff_ffff_ffff_ffff,
        Ty::F16 if v & 0x7fff > 0x7c00 => 0x7fff,
        Ty::BF16 if v & 0x7fff > 0x7f80 => 0x7fff,
        Ty::F16x2 | Ty::BF16x2 => {
            let et = if t == Ty::F16x2 { Ty::F16 } else { Ty::BF16 };
            canon_nan(v & 0xffff, et) | canon_nan((v >> 16) & 0xffff, et) << 16
        }
        _ => v,
    }
}

fn to_fbits(x: f64, t: Ty) -> u64 {
    match t {
        Ty::F32 => (x as f32).to_bits() as u64,
        Ty::F16 => f16::from_f64(x).to_bits() as u64,
        Ty::BF16 => bf16::from_f64(x).to_bits() as u64,
        _ => x.to_bits(),
    }
}

fn fop(op: FOp, x: f64, y: f64) -> f64 {
    match op {
        FOp::Add => x + y,
        FOp::Sub => x - y,
        FOp::Mul => x * y,
        FOp::Div => x / y,
        FOp::Min => {
            if x.is_nan() {
                y
            } else if y.is_nan() {
                x
            } else if x == y {
                if x.is_sign_negative() {
                    x
                } else {
                    y
                }
            } else {
                x.min(y)
            }
        }
        FOp::Max => {
            if x.is_nan() {
                y
            } else if y.is_nan() {
                x
            } else if x == y {
                if x.is_sign_positive() {
                    x
                } else {
                    y
                }
            } else {
                x.max(y)
            }
        }
        FOp::Copysign => y.copysign(x),
    }
}

/// `.sat`: clamp to [+0, 1]; NaN and -0 become +0 (as the GPU does).
fn sat01(x: f64) -> f64 {
    if x.is_nan() || x <= 0.0 {
        0.0
    } else if x > 1.0 {
        1.0
    } else {
        x
    }
}

/// An exact zero sum of operands with opposite signs is -0 when rounding
/// toward minus infinity (IEEE 754), +0 otherwise.
fn zero_sign(r: f64, x: f64, y_eff: f64, rnd: Rnd) -> f64 {
    if r == 0.0 && rnd == Rnd::Rm && x.is_sign_negative() != y_eff.is_sign_negative() {
        -0.0
    } else {
        r
    }
}

fn float_bin(op: FOp, t: Ty, a: u64, b: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    let satf = |x: f64| if sat { sat01(x) } else { x };
    match t {
        Ty::F32 => {
            let (mut x, mut y) = (f32_of(a), f32_of(b));
            if ftz {
                x = ftz32(x);
                y = ftz32(y);
            }
            let r = match (op, rnd) {
                (FOp::Add, Rnd::Default | Rnd::Rn) => x + y,
                (FOp::Sub, Rnd::Default | Rnd::Rn) => x - y,
                (FOp::Mul, Rnd::Default | Rnd::Rn) => x * y,
                (FOp::Div, Rnd::Default | Rnd::Rn) => x / y,
                (FOp::Min | FOp::Max | FOp::Copysign, _) => fop(op, x as f64, y as f64) as f32,
                (FOp::Add | FOp::Sub, _) => {
                    let ye = if op == FOp::Sub { -y } else { y };
                    let r = round_f32(fop(op, x as f64, y as f64), rnd);
                    zero_sign(r as f64, x as f64, ye as f64, rnd) as f32
                }
                _ => round_f32(fop(op, x as f64, y as f64), rnd),
            };
            let r = if sat { satf(r as f64) as f32 } else { r };
            (if ftz { ftz32(r) } else { r }).to_bits() as u64
        }
        Ty::F64 => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            let r = fop(op, x, y);
            let r = match rnd {
                Rnd::Rz | Rnd::Rm | Rnd::Rp => adjust_f64(r, residual_sign(op, x, y, r), rnd),
                _ => r,
            };
            let r = match op {
                FOp::Add => zero_sign(r, x, y, rnd),
                FOp::Sub => zero_sign(r, x, -y, rnd),
                _ => r,
            };
            satf(r).to_bits()
        }
        Ty::F16 | Ty::BF16 => to_fbits(satf(fop(op, fval(a, t), fval(b, t))), t),
        Ty::F16x2 | Ty::BF16x2 => {
            let et = if t == Ty::F16x2 { Ty::F16 } else { Ty::BF16 };
            let lo = float_bin(op, et, a & 0xffff, b & 0xffff, rnd, ftz, sat);
            let hi = float_bin(
                op,
                et,
                (a >> 16) & 0xffff,
                (b >> 16) & 0xffff,
                rnd,
                ftz,
                sat,
            );
            lo | (hi << 16)
        }
        _ => 0,
    }
}

fn int_bin(op: IntOp, t: Ty, a: u64, b: u64) -> u64 {
    let bits = t.bits();
    let mask = t.mask();
    let s = t.signed();
    match op {
        IntOp::Add => a.wrapping_add(b) & mask,
        IntOp::Sub => a.wrapping_sub(b) & mask,
        IntOp::MulLo => a.wrapping_mul(b) & mask,
        IntOp::Mul24Lo => {
            let (x, y) = if s {
                (sext(a, 24) as u64, sext(b, 24) as u64)
            } else {
                (a & 0xff_ffff, b & 0xff_ffff)
            };
            x.wrapping_mul(y) & mask
        }
        IntOp::MulHi => {
            if s {
                let p = (sext(a, bits) as i128) * (sext(b, bits) as i128);
                ((p >> bits) as u64) & mask
            } else {
                let p = ((a & mask) as u128) * ((b & mask) as u128);
                ((p >> bits) as u64) & mask
            }
        }
        IntOp::MulWide => {
            let wmask = if bits >= 32 {
                u64::MAX
            } else {
                (1u64 << (2 * bits)) - 1
            };
            if s {
                ((sext(a, bits) as i128 * sext(b, bits) as i128) as u64) & wmask
            } else {
                (((a & mask) as u128 * (b & mask) as u128) as u64) & wmask
            }
        }
        IntOp::Div | IntOp::Rem => {
            if s {
                let (x, y) = (sext(a, bits), sext(b, bits));
                if y == 0 {
                    return if op == IntOp::Div { mask } else { a & mask };
                }
                let r = if op == IntOp::Div {
                    x.wrapping_div(y)
                } else {
                    x.wrapping_rem(y)
                };
                r as u64 & mask
            } else {
                let (x, y) = (a & mask, b & mask);
                if y == 0 {
                    return if op == IntOp::Div { mask } else { x };
                }
                if op == IntOp::Div {
                    x / y
                } else {
                    x % y
                }
            }
        }
        IntOp::Min | IntOp::Max => {
            let less = if s {
                sext(a, bits) < sext(b, bits)
            } else {
                (a & mask) < (b & mask)
            };
            let pick_a = if op == IntOp::Min { less } else { !less };
            (if pick_a { a } else { b }) & mask
        }
        IntOp::And => a & b & mask,
        IntOp::Or => (a | b) & mask,
        IntOp::Xor => (a ^ b) & mask,
        IntOp::Shl => {
            let n = b & 0xffff_ffff;
            if n >= bits as u64 {
                0
            } else {
                (a << n) & mask
            }
        }
        IntOp::Shr => {
            let n = (b & 0xffff_ffff).min(bits as u64 - 1 + !s as u64);
            if s {
                (sext(a, bits) >> n.min(63)) as u64 & mask
            } else if n >= bits as u64 {
                0
            } else {
                ((a & mask) >> n) & mask
            }
        }
        IntOp::AddSat | IntOp::SubSat => {
            let (x, y) = (sext(a, bits) as i128, sext(b, bits) as i128);
            let r = if op == IntOp::AddSat { x + y } else { x - y };
            let (lo, hi) = (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1);
            (r.clamp(lo, hi) as u64) & mask
        }
        IntOp::Bmsk => {
            let (p, l) = (a & 0xff, b & 0xff);
            let p = p.min(32);
            let l = l.min(32 - p);
            (((1u64 << l) - 1) << p) & 0xffff_ffff
        }
    }
}

fn un_op(op: UnOp, t: Ty, a: u64, ftz: bool, sat: bool) -> u64 {
    let bits = t.bits();
    let mask = t.mask();
    match op {
        UnOp::Not => !a & mask,
        UnOp::Cnot => ((a & mask) == 0) as u64,
        UnOp::Neg => a.wrapping_neg() & mask,
        UnOp::Abs => (sext(a, bits).wrapping_abs() as u64) & mask,
        UnOp::Popc => (a & mask).count_ones() as u64,
        UnOp::Clz => ((a & mask).leading_zeros() - (64 - bits)) as u64,
        UnOp::Brev => ((a & mask).reverse_bits() >> (64 - bits)) & mask,
        UnOp::Bfind | UnOp::BfindShift => {
            let v = if t.signed() && sext(a, bits) < 0 {
                !a & mask
            } else {
                a & mask
            };
            if v == 0 {
                0xffff_ffff
            } else {
                let pos = 63 - v.leading_zeros() as u64;
                if op == UnOp::BfindShift {
                    bits as u64 - 1 - pos
                } else {
                    pos
                }
            }
        }
        UnOp::FNeg => match t {
            Ty::F32 | Ty::F64 | Ty::F16 | Ty::BF16 => a ^ (1u64 << (bits - 1)),
            Ty::F16x2 | Ty::BF16x2 => a ^ 0x8000_8000,
            _ => a,
        },
        UnOp::FAbs => match t {
            Ty::F32 | Ty::F64 | Ty::F16 | Ty::BF16 => a & !(1u64 << (bits - 1)) & mask,
            Ty::F16x2 | Ty::BF16x2 => a & 0x7fff_7fff,
            _ => a,
        },
        _ => {
            if matches!(t, Ty::F16x2 | Ty::BF16x2) {
                let et = if t == Ty::F16x2 { Ty::F16 } else { Ty::BF16 };
                let lo = un_op(op, et, a & 0xffff, ftz, sat);
                let hi = un_op(op, et, (a >> 16) & 0xffff, ftz, sat);
                return lo | (hi << 16);
            }
            let mut x = fval(a, t);
            if ftz && t == Ty::F32 {
                x = ftz32(x as f32) as f64;
            }
            let r = match op {
                UnOp::Sqrt => {
                    if t == Ty::F32 {
                        (x as f32).sqrt() as f64
                    } else {
                        x.sqrt()
                    }
                }
                UnOp::Rsqrt => 1.0 / x.sqrt(),
                UnOp::Rcp => {
                    if t == Ty::F32 {
                        (1.0f32 / x as f32) as f64
                    } else {
                        1.0 / x
                    }
                }
                UnOp::Sin => x.sin(),
                UnOp::Cos => x.cos(),
                UnOp::Ex2 => x.exp2(),
                UnOp::Lg2 => x.log2(),
                UnOp::Tanh => x.tanh(),
                _ => x,
            };
            let r = if sat { sat01(r) } else { r };
            if t == Ty::F32 && ftz {
                ftz32(r as f32).to_bits() as u64
            } else {
                to_fbits(r, t)
            }
        }
    }
}

fn compare(cmp: Cmp, t: Ty, a: u64, b: u64) -> bool {
    if t.is_float() {
        let (x, y) = (fval(a, t), fval(b, t));
        let un = x.is_nan() || y.is_nan();
        return match cmp {
            Cmp::Eq => !un && x == y,
            Cmp::Ne => !un && x != y,
            Cmp::Lt | Cmp::Lo => !un && x < y,
            Cmp::Le | Cmp::Ls => !un && x <= y,
            Cmp::Gt | Cmp::Hi => !un && x > y,
            Cmp::Ge | Cmp::Hs => !un && x >= y,
            Cmp::Equ => un || x == y,
            Cmp::Neu => un || x != y,
            Cmp::Ltu => un || x < y,
            Cmp::Leu => un || x <= y,
            Cmp::Gtu => un || x > y,
            Cmp::Geu => un || x >= y,
            Cmp::Num => !un,
            Cmp::Nan => un,
        };
    }
    let bits = t.bits();
    let (ua, ub) = (a & t.mask(), b & t.mask());
    let (sa, sb) = (sext(a, bits), sext(b, bits));
    let signed = t.signed();
    match cmp {
        Cmp::Eq | Cmp::Equ => ua == ub,
        Cmp::Ne | Cmp::Neu => ua != ub,
        Cmp::Lt | Cmp::Ltu => {
            if signed {
                sa < sb
            } else {
                ua < ub
            }
        }
        Cmp::Le | Cmp::Leu => {
            if signed {
                sa <= sb
            } else {
                ua <= ub
            }
        }
        Cmp::Gt | Cmp::Gtu => {
            if signed {
                sa > sb
            } else {
                ua > ub
            }
        }
        Cmp::Ge | Cmp::Geu => {
            if signed {
                sa >= sb
            } else {
                ua >= ub
            }
        }
        Cmp::Lo => ua < ub,
        Cmp::Ls => ua <= ub,
        Cmp::Hi => ua > ub,
        Cmp::Hs => ua >= ub,
        Cmp::Num => true,
        Cmp::Nan => false,
    }
}

fn cvt(a: u64, dt: Ty, st: Ty, rnd: Rnd, sat: bool, ftz: bool) -> u64 {
    if st.is_float() {
        let mut x = fval(a, st);
        if ftz && st == Ty::F32 {
            x = ftz32(x as f32) as f64;
        }
        if dt.is_float() {
            if matches!(rnd, Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi) {
                x = round_int(x, rnd);
            }
            if sat {
                x = sat01(x);
            }
            return match dt {
                Ty::F32 => {
                    let r = if st == Ty::F64 {
                        round_f32(x, rnd)
                    } else {
                        x as f32
                    };
                    (if ftz { ftz32(r) } else { r }).to_bits() as u64
                }
                Ty::F16 | Ty::BF16 => round_half(x, dt == Ty::BF16, rnd),
                _ => to_fbits(x, dt),
            };
        }
        // float -> int: round then saturate to the destination range
        if x.is_nan() {
            return 0;
        }
        let r = round_int(x, rnd);
        let bits = dt.bits();
        let v: i128 = if dt.signed() {
            let lo = -(1i128 << (bits - 1));
            let hi = (1i128 << (bits - 1)) - 1;
            (r.clamp(lo as f64, hi as f64) as i128).clamp(lo, hi)
        } else {
            let hi = (1u128 << bits) - 1;
            (r.clamp(0.0, hi as f64) as u128).min(hi) as i128
        };
        return (v as u64) & dt.mask();
    }
    // integer source
    let v: i128 = if st.signed() {
        sext(a, st.bits()) as i128
    } else {
        (a & st.mask()) as i128
    };
    if dt.is_float() {
        let r = int_to_float(v, dt, if rnd == Rnd::Default { Rnd::Rn } else { rnd });
        if sat {
            let x = sat01(fval(r, dt));
            return to_fbits(x, dt);
        }
        return r;
    }
    if sat {
        let bits = dt.bits();
        let (lo, hi) = if dt.signed() {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        } else {
            (0, (1i128 << bits) - 1)
        };
        return (v.clamp(lo, hi) as u64) & dt.mask();
    }
    if dt.signed() && dt.bits() < st.bits().max(1) || !dt.signed() {
        (v as u64) & dt.mask()
    } else {
        // widening to a signed type keeps the sign in the low bits
        (v as u64) & dt.mask()
    }
}

fn prmt(a: u64, b: u64, c: u64, mode: u8) -> u64 {
    let bytes = ((b & 0xffff_ffff) << 32) | (a & 0xffff_ffff);
    let byte = |i: u64| (bytes >> ((i & 7) * 8)) & 0xff;
    let n = c & 3;
    let mut r = 0u64;
    for k in 0..4u64 {
        let v = match mode {
            1 => byte(n + k),                 // f4e
            2 => byte((n + 8 - k) & 7),       // b4e
            3 => byte(n),                     // rc8
            4 => byte(k.max(n)),              // ecl
            5 => byte(k.min(n)),              // ecr
            6 => byte((n & 1) * 2 + (k & 1)), // rc16
            _ => {
                let sel = (c >> (4 * k)) & 0xf;
                let x = byte(sel & 7);
                if sel & 8 != 0 {
                    if x & 0x80 != 0 {
                        0xff
                    } else {
                        0
                    }
                } else {
                    x
                }
            }
        };
        r |= v << (8 * k);
    }
    r
}

/// `.relu`: negative (non-NaN) values become +0.
fn relu(v: u64, t: Ty) -> u64 {
    match t {
        Ty::F16x2 | Ty::BF16x2 => {
            let et = if t == Ty::F16x2 { Ty::F16 } else { Ty::BF16 };
            relu(v & 0xffff, et) | relu((v >> 16) & 0xffff, et) << 16
        }
        _ => {
            let x = fval(v, t);
            if x < 0.0 {
                0
            } else {
                v
            }
        }
    }
}

fn lop3(a: u64, b: u64, c: u64, lut: u8) -> u64 {
    let mut r = 0u64;
    for i in 0..8u8 {
        if lut & (1 << i) != 0 {
            let x = if i & 4 != 0 { a } else { !a };
            let y = if i & 2 != 0 { b } else { !b };
            let z = if i & 1 != 0 { c } else { !c };
            r |= x & y & z;
        }
    }
    r & 0xffff_ffff
}

#[allow(clippy::too_many_arguments)]
fn tern(op: TernOp, t: Ty, a: u64, b: u64, c: u64, rnd: Rnd, ftz: bool, sat: bool) -> u64 {
    let bits = t.bits();
    let mask = t.mask();
    match op {
        TernOp::MadLo => a.wrapping_mul(b).wrapping_add(c) & mask,
        TernOp::Mad24Lo => int_bin(IntOp::Mul24Lo, t, a, b).wrapping_add(c) & mask,
        TernOp::MadHi => {
            if sat && t == Ty::S32 {
                let p = int_bin(IntOp::MulHi, t, a, b);
                return int_bin(IntOp::AddSat, t, p, c);
            }
            int_bin(IntOp::MulHi, t, a, b).wrapping_add(c) & mask
        }
        TernOp::MadWide => {
            let w = int_bin(IntOp::MulWide, t, a, b);
            let wmask = if bits >= 32 {
                u64::MAX
            } else {
                (1u64 << (2 * bits)) - 1
            };
            w.wrapping_add(c) & wmask
        }
        TernOp::Fma => match t {
            Ty::F32 => {
                let (mut x, mut y, mut z) = (f32_of(a), f32_of(b), f32_of(c));
                if ftz {
                    x = ftz32(x);
                    y = ftz32(y);
                    z = ftz32(z);
                }
                let r = match rnd {
                    Rnd::Rz | Rnd::Rm | Rnd::Rp => {
                        round_f32((x as f64).mul_add(y as f64, z as f64), rnd)
                    }
                    _ => x.mul_add(y, z),
                };
                let r = if sat { sat01(r as f64) as _ } else { r };
                (if ftz { ftz32(r) } else { r }).to_bits() as u64
            }
            Ty::F64 => f64::from_bits(a)
                .mul_add(f64::from_bits(b), f64::from_bits(c))
                .to_bits(),
            Ty::F16 | Ty::BF16 => {
                let r = fval(a, t).mul_add(fval(b, t), fval(c, t));
                let r = if sat { sat01(r) } else { r };
                to_fbits(r, t)
            }
            Ty::F16x2 | Ty::BF16x2 => {
                let et = if t == Ty::F16x2 { Ty::F16 } else { Ty::BF16 };
                let lo = tern(op, et, a & 0xffff, b & 0xffff, c & 0xffff, rnd, ftz, sat);
                let hi = tern(
                    op,
                    et,
                    (a >> 16) & 0xffff,
                    (b >> 16) & 0xffff,
                    (c >> 16) & 0xffff,
                    rnd,
                    ftz,
                    sat,
                );
                lo | (hi << 16)
            }
            _ => 0,
        },
        TernOp::Selp => {
            if c & 1 != 0 {
                a & mask
            } else {
                b & mask
            }
        }
        TernOp::Bfe => {
            let pos = (b & 0xff) as u32;
            let len = (c & 0xff) as u32;
            let v = a & mask;
            if t.signed() {
                let sbit = if len == 0 {
                    false
                } else {
                    let msb = (pos + len - 1).min(bits - 1);
                    (v >> msb) & 1 != 0
                };
                if len == 0 {
                    return if sbit { mask } else { 0 };
                }
                let mut r = 0u64;
                for i in 0..bits {
                    let bit = if i < len && pos + i < bits {
                        (v >> (pos + i)) & 1
                    } else {
                        sbit as u64
                    };
                    r |= bit << i;
                }
                r & mask
            } else {
                if pos >= bits || len == 0 {
                    return 0;
                }
                let l = len.min(bits);
                let m = if l >= 64 { u64::MAX } else { (1u64 << l) - 1 };
                (v >> pos) & m & mask
            }
        }
        TernOp::Sad => {
            let d = if t.signed() {
                (sext(a, bits) - sext(b, bits)).unsigned_abs()
            } else {
                (a & mask).abs_diff(b & mask)
            };
            d.wrapping_add(c) & mask
        }
        TernOp::Slct => {
            let ge = if t == Ty::F32 {
                f32_of(c) >= 0.0
            } else {
                sext(c, 32) >= 0
            };
            if ge {
                a
            } else {
                b
            }
        }
        TernOp::Shfl | TernOp::Shfr => {
            let n = if t == Ty::U8 {
                (c & 0xffff_ffff).min(32)
            } else {
                c & 31
            };
            let wide = ((b & 0xffff_ffff) << 32) | (a & 0xffff_ffff);
            if op == TernOp::Shfl {
                ((wide << n) >> 32) & 0xffff_ffff
            } else {
                (wide >> n) & 0xffff_ffff
            }
        }
        TernOp::Dp4a | TernOp::Dp2aLo | TernOp::Dp2aHi => {
            let (asg, bsg) = match t {
                Ty::S64 => (true, true),
                Ty::S32 => (true, false),
                Ty::S16 => (false, true),
                _ => (false, false),
            };
            let byte = |v: u64, k: u32, sg: bool, w: u32| -> i64 {
                let x = (v >> (k * w)) & ((1u64 << w) - 1);
                if sg {
                    sext(x, w)
                } else {
                    x as i64
                }
            };
            let mut acc = if asg || bsg {
                sext(c, 32)
            } else {
                (c & 0xffff_ffff) as i64
            };
            if op == TernOp::Dp4a {
                for k in 0..4 {
                    acc = acc.wrapping_add(byte(a, k, asg, 8).wrapping_mul(byte(b, k, bsg, 8)));
                }
            } else {
                let base = if op == TernOp::Dp2aHi { 2 } else { 0 };
                for k in 0..2 {
                    acc = acc.wrapping_add(byte(a, k, asg, 16).wrapping_mul(byte(
                        b,
                        base + k,
                        bsg,
                        8,
                    )));
                }
            }
            acc as u64 & 0xffff_ffff
        }
    }
}

fn atom_apply(op: AtomOp, t: Ty, old: u64, b: u64, c: u64) -> Option<u64> {
    let mask = t.mask();
    let old = old & mask;
    Some(match op {
        AtomOp::Add => {
            if t.is_float() {
                float_bin(FOp::Add, t, old, b, Rnd::Rn, false, false)
            } else {
                old.wrapping_add(b) & mask
            }
        }
        AtomOp::Min | AtomOp::Max => {
            if t.is_float() {
                float_bin(
                    if op == AtomOp::Min {
                        FOp::Min
                    } else {
                        FOp::Max
                    },
                    t,
                    old,
                    b,
                    Rnd::Rn,
                    false,
                    false,
                )
            } else {
                int_bin(
                    if op == AtomOp::Min {
                        IntOp::Min
                    } else {
                        IntOp::Max
                    },
                    t,
                    old,
                    b,
                )
            }
        }
        AtomOp::Inc => {
            if old >= (b & mask) {
                0
            } else {
                old + 1
            }
        }
        AtomOp::Dec => {
            if old == 0 || old > (b & mask) {
                b & mask
            } else {
                old - 1
            }
        }
        AtomOp::Exch => b & mask,
        AtomOp::Cas => {
            if old == b & mask {
                c & mask
            } else {
                return None;
            }
        }
        AtomOp::And => old & b,
        AtomOp::Or => (old | b) & mask,
        AtomOp::Xor => (old ^ b) & mask,
    })
}

impl<'a> Geo<'a> {
    fn fault_addr(&self, addr: u64, what: &str, line: u32) -> Fault {
        Fault::IllegalAddress {
            addr,
            detail: format!("{what} of address {addr:#x} at line {line}"),
        }
    }
}

impl Block {
    /// Host pointer for `size` bytes at `addr` in space `sp` (already checked).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn ptr(
        &mut self,
        g: &Geo<'_>,
        local: &mut Vec<u64>,
        sp: Sp,
        addr: u64,
        size: u32,
        write: bool,
        line: u32,
    ) -> Result<*mut u8, Fault> {
        let align = size.min(16) as u64;
        if addr & (align - 1) != 0 {
            return Err(Fault::MisalignedAddress {
                addr,
                detail: format!("{size}-byte access at line {line}"),
            });
        }
        let what = if write { "write" } else { "read" };
        let (sp, addr) = match sp {
            Sp::Generic => {
                if addr >= DEVICE_VA_BASE {
                    (Sp::Global, addr)
                } else if (SHARED_WINDOW..SHARED_WINDOW + WINDOW_SIZE).contains(&addr) {
                    (Sp::Shared, addr - SHARED_WINDOW)
                } else if (LOCAL_WINDOW..LOCAL_WINDOW + WINDOW_SIZE).contains(&addr) {
                    (Sp::Local, addr - LOCAL_WINDOW)
                } else if (PARAM_WINDOW..PARAM_WINDOW + WINDOW_SIZE).contains(&addr) {
                    (Sp::Param, addr - PARAM_WINDOW)
                } else {
                    return Err(g.fault_addr(addr, what, line));
                }
            }
            s => (s, addr),
        };
        let end = addr.checked_add(size as u64);
        match sp {
            Sp::Global => {
                let (base, len, p) = self.cache;
                if addr >= base && end.is_some_and(|e| e <= base + len) && p != 0 {
                    return Ok((p as *mut u8).wrapping_add((addr - base) as usize));
                }
                match g.mem.resolve(addr, size as u64) {
                    Some((base, len, p)) => {
                        self.cache = (base, len, p as usize);
                        Ok(p.wrapping_add((addr - base) as usize))
                    }
                    None => Err(g.fault_addr(addr, what, line)),
                }
            }
            Sp::Shared => match end {
                Some(e) if e <= g.shared_bytes => {
                    Ok((self.shared.as_mut_ptr() as *mut u8).wrapping_add(addr as usize))
                }
                _ => Err(g.fault_addr(SHARED_WINDOW.wrapping_add(addr), what, line)),
            },
            Sp::Local => match end {
                Some(e) if e <= local.len() as u64 * 8 => {
                    Ok((local.as_mut_ptr() as *mut u8).wrapping_add(addr as usize))
                }
                _ => Err(g.fault_addr(LOCAL_WINDOW.wrapping_add(addr), what, line)),
            },
            _ => match end {
                Some(e) if e <= g.params_len && !write => {
                    Ok((g.params.as_ptr() as *mut u8).wrapping_add(addr as usize))
                }
                _ => Err(g.fault_addr(PARAM_WINDOW.wrapping_add(addr), what, line)),
            },
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn load(
        &mut self,
        g: &Geo<'_>,
        local: &mut Vec<u64>,
        sp: Sp,
        addr: u64,
        size: u32,
        line: u32,
    ) -> Result<u64, Fault> {
        let p = self.ptr(g, local, sp, addr, size, false, line)?;
        // SAFETY: `ptr` checked bounds and alignment against a live buffer (device
        // allocation under the launch's read lock, or this block's/thread's own memory).
        Ok(unsafe { atomic_load(p, size) })
    }

    #[allow(clippy::too_many_arguments)]
    fn store(
        &mut self,
        g: &Geo<'_>,
        local: &mut Vec<u64>,
        sp: Sp,
        addr: u64,
        size: u32,
        v: u64,
        line: u32,
    ) -> Result<(), Fault> {
        let p = self.ptr(g, local, sp, addr, size, true, line)?;
        // SAFETY: as in `load`.
        unsafe { atomic_store(p, size, v) };
        Ok(())
    }

    fn cstring(&mut self, g: &Geo<'_>, local: &mut Vec<u64>, addr: u64) -> Option<Vec<u8>> {
        let mut s = Vec::new();
        for k in 0..65536u64 {
            let c = self
                .load(g, local, Sp::Generic, addr.wrapping_add(k), 1, 0)
                .ok()? as u8;
            if c == 0 {
                return Some(s);
            }
            s.push(c);
        }
        Some(s)
    }
}

#[inline]
fn rd(regs: &[u64], rbase: u32, lbase: u32, s: Src) -> u64 {
    match s {
        Src::Reg(r) => regs.get((rbase + r) as usize).copied().unwrap_or(0),
        Src::Imm(v) => v,
        Src::Frame(o) => (lbase as u64).wrapping_add(o as u64),
    }
}

#[inline]
fn wr(regs: &mut [u64], rbase: u32, d: u32, v: u64) {
    if let Some(slot) = regs.get_mut((rbase.wrapping_add(d)) as usize) {
        *slot = v;
    }
}

fn special(g: &Geo<'_>, b: &Block, clock: u64, tid: [u32; 3], lin: u32, r: SReg) -> u64 {
    let lane = lin % 32;
    match r {
        SReg::Tid(d) => tid[d as usize % 3] as u64,
        SReg::Ntid(9) => 1,
        SReg::Ntid(d) => g.ntid[d as usize % 3] as u64,
        SReg::Ctaid(d) => b.ctaid[d as usize % 3] as u64,
        SReg::Nctaid(d) => g.nctaid[d as usize % 3] as u64,
        SReg::Laneid => lane as u64,
        SReg::Warpid => (lin / 32) as u64,
        SReg::Nwarpid => (g.ntid.iter().product::<u32>()).div_ceil(32) as u64,
        SReg::Smid => b.smid as u64,
        SReg::Nsmid => 132,
        SReg::Gridid => 1,
        SReg::Clock => clock & 0xffff_ffff,
        SReg::Clock64 => clock,
        SReg::Globaltimer => g.start_ns.wrapping_add(clock),
        SReg::LanemaskEq => 1u64 << lane,
        SReg::LanemaskLt => (1u64 << lane) - 1,
        SReg::LanemaskLe => ((1u64 << lane) << 1).wrapping_sub(1) & 0xffff_ffff,
        SReg::LanemaskGt => !(((1u64 << lane) << 1).wrapping_sub(1)) & 0xffff_ffff,
        SReg::LanemaskGe => !((1u64 << lane) - 1) & 0xffff_ffff,
        SReg::DynSmem => g.dyn_bytes as u64,
        SReg::TotalSmem => g.shared_bytes,
        SReg::Zero => 0,
    }
}

fn lin_to_tid(lin: u32, ntid: [u32; 3]) -> [u32; 3] {
    let x = lin % ntid[0].max(1);
    let y = (lin / ntid[0].max(1)) % ntid[1].max(1);
    let z = lin / (ntid[0].max(1) * ntid[1].max(1));
    [x, y, z]
}

/// Copies `size` bytes inside a thread's local memory.
fn local_copy(local: &mut [u64], dst: u32, src: u32, size: u32) -> bool {
    let bytes = bytes_of(local);
    let (d, s, n) = (dst as usize, src as usize, size as usize);
    if d + n > bytes.len() || s + n > bytes.len() {
        return false;
    }
    bytes.copy_within(s..s + n, d);
    true
}

fn local_put(local: &mut [u64], dst: u32, v: u64, size: u32) -> bool {
    let bytes = bytes_of(local);
    let (d, n) = (dst as usize, size.min(8) as usize);
    if d + n > bytes.len() {
        return false;
    }
    bytes[d..d + n].copy_from_slice(&v.to_le_bytes()[..n]);
    true
}

fn local_get(local: &mut [u64], src: u32, size: u32) -> Option<u64> {
    let bytes = bytes_of(local);
    let (s, n) = (src as usize, size.min(8) as usize);
    let mut b = [0u8; 8];
    b[..n].copy_from_slice(bytes.get(s..s + n)?);
    Some(u64::from_le_bytes(b))
}

/// Runs one thread until it reaches a collective, exits or faults.
fn run_thread<const SINGLE_STEP: bool>(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    lin: u32,
) -> Result<Stop, Fault> {
    let funcs = &g.prog.funcs;
    let tid = lin_to_tid(lin, g.ntid);
    let mut func = &funcs[th.func as usize];
    let mut pc = th.pc;
    let mut count: u64 = 0;
    let result = loop {
        if SINGLE_STEP && count >= 1 {
            break Ok(Stop::Yield);
        }
        let Some(inst) = func.code.get(pc as usize) else {
            break Err(Fault::Failed(format!(
                "pc {pc} out of range in {}",
                func.name
            )));
        };
        count += 1;
        let (rbase, lbase) = (th.rbase, th.lbase);
        if inst.guard != NONE {
            let gv = rd(&th.regs, rbase, lbase, Src::Reg(inst.guard)) & 1 != 0;
            if gv == inst.guard_neg {
                pc += 1;
                continue;
            }
        }
        let regs = &mut th.regs;
        macro_rules! r {
            ($s:expr) => {
                rd(regs, rbase, lbase, $s)
            };
        }
        match &inst.op {
            Op::Mov { d, a, mask } => {
                let v = r!(*a) & mask;
                wr(regs, rbase, *d, v);
            }
            Op::Int { op, t, d, a, b: bb } => {
                let v = int_bin(*op, *t, r!(*a), r!(*bb));
                wr(regs, rbase, *d, v);
            }
            Op::Float {
                op,
                t,
                d,
                a,
                b: bb,
                rnd,
                ftz,
                sat,
            } => {
                let v = float_bin(*op, *t, r!(*a), r!(*bb), *rnd, *ftz, *sat);
                let v = if *op == FOp::Copysign {
                    v
                } else {
                    canon_nan(v, *t)
                };
                wr(regs, rbase, *d, v);
            }
            Op::Un {
                op,
                t,
                d,
                a,
                rnd,
                ftz,
                sat,
            } => {
                let v = match (op, t, rnd) {
                    (UnOp::Sqrt | UnOp::Rcp, Ty::F32 | Ty::F64, Rnd::Rz | Rnd::Rm | Rnd::Rp) => {
                        directed_unary(*op, *t, r!(*a), *rnd, *ftz)
                    }
                    _ => un_op(*op, *t, r!(*a), *ftz, *sat),
                };
                let v = if t.is_float() && !matches!(op, UnOp::FNeg | UnOp::FAbs) {
                    canon_nan(v, *t)
                } else {
                    v
                };
                wr(regs, rbase, *d, v);
            }
            Op::Tern {
                op,
                t,
                d,
                a,
                b: bb,
                c,
                rnd,
                ftz,
                sat,
            } => {
                let v = tern(*op, *t, r!(*a), r!(*bb), r!(*c), *rnd, *ftz, *sat);
                let v = if *op == TernOp::Fma {
                    canon_nan(v, *t)
                } else {
                    v
                };
                wr(regs, rbase, *d, v);
            }
            Op::Bfi {
                t,
                d,
                a,
                b: bb,
                c,
                e,
            } => {
                let bits = t.bits() as u64;
                let (av, bv) = (r!(*a), r!(*bb));
                let pos = r!(*c) & 0xff;
                let len = r!(*e) & 0xff;
                let v = if pos >= bits || len == 0 {
                    bv & t.mask()
                } else {
                    let l = len.min(bits - pos);
                    let m = if l >= 64 {
                        u64::MAX
                    } else {
                        ((1u64 << l) - 1) << pos
                    };
                    ((bv & !m) | ((av << pos) & m)) & t.mask()
                };
                wr(regs, rbase, *d, v);
            }
            Op::Prmt {
                d,
                a,
                b: bb,
                c,
                mode,
            } => {
                let v = prmt(r!(*a), r!(*bb), r!(*c), *mode);
                wr(regs, rbase, *d, v);
            }
            Op::Relu { d, t } => {
                let v = relu(r!(Src::Reg(*d)), *t);
                wr(regs, rbase, *d, v);
            }
            Op::Lop3 {
                d,
                a,
                b: bb,
                c,
                lut,
            } => {
                let v = lop3(r!(*a), r!(*bb), r!(*c), *lut);
                wr(regs, rbase, *d, v);
            }
            Op::Setp {
                cmp,
                t,
                d,
                d2,
                a,
                b: bb,
                bop,
                c,
                cneg,
                ftz: _,
            } => {
                let p = compare(*cmp, *t, r!(*a), r!(*bb));
                let cv = (r!(*c) & 1 != 0) != *cneg;
                let f = |x: bool| match bop {
                    BoolOp::None => x,
                    BoolOp::And => x && cv,
                    BoolOp::Or => x || cv,
                    BoolOp::Xor => x ^ cv,
                };
                wr(regs, rbase, *d, f(p) as u64);
                if *d2 != NONE {
                    wr(regs, rbase, *d2, f(!p) as u64);
                }
            }
            Op::Set {
                cmp,
                t,
                dt,
                d,
                a,
                b: bb,
            } => {
                let p = compare(*cmp, *t, r!(*a), r!(*bb));
                let v = if dt.is_float() {
                    if p {
                        to_fbits(1.0, *dt)
                    } else {
                        0
                    }
                } else if p {
                    dt.mask()
                } else {
                    0
                };
                wr(regs, rbase, *d, v);
            }
            Op::Testp { d, a, t, kind } => {
                let x = fval(r!(*a), *t);
                let v = match kind {
                    0 => x.is_finite(),
                    1 => x.is_infinite(),
                    2 => !x.is_nan(),
                    3 => x.is_nan(),
                    4 => {
                        if *t == Ty::F32 {
                            (x as f32).is_normal()
                        } else {
                            x.is_normal()
                        }
                    }
                    _ => {
                        if *t == Ty::F32 {
                            (x as f32).is_subnormal()
                        } else {
                            x.is_subnormal()
                        }
                    }
                };
                wr(regs, rbase, *d, v as u64);
            }
            Op::Cvt {
                d,
                a,
                dt,
                st,
                rnd,
                sat,
                ftz,
            } => {
                let v = cvt(r!(*a), *dt, *st, *rnd, *sat, *ftz);
                let v = if dt.is_float() { canon_nan(v, *dt) } else { v };
                wr(regs, rbase, *d, v);
            }
            Op::Pack { d, parts, bits } => {
                let mut v = 0u64;
                let m = if *bits >= 64 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                };
                for (k, p) in parts.iter().enumerate() {
                    let sh = (k as u32).saturating_mul(*bits);
                    if sh < 64 {
                        v |= (r!(*p) & m) << sh;
                    }
                }
                wr(regs, rbase, *d, v);
            }
            Op::Unpack { ds, a, bits } => {
                let v = r!(*a);
                let m = if *bits >= 64 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                };
                for (k, d) in ds.iter().enumerate() {
                    let sh = (k as u32).saturating_mul(*bits);
                    let part = if sh < 64 { (v >> sh) & m } else { 0 };
                    wr(regs, rbase, *d, part);
                }
            }
            Op::Ld {
                sp,
                size,
                n,
                ds,
                addr,
                off,
                sext: se,
            } => {
                let a = r!(*addr).wrapping_add(*off as u64);
                let total = size * (*n as u32);
                // alignment of the whole vector
                if total > *size && !a.is_multiple_of(total.min(16) as u64) {
                    break Err(Fault::MisalignedAddress {
                        addr: a,
                        detail: format!("{total}-byte vector load at line {}", inst.line),
                    });
                }
                let mut k = 0;
                let res = loop {
                    if k >= *n as usize {
                        break Ok(());
                    }
                    let ea = a.wrapping_add((k as u64) * *size as u64);
                    match b.load(g, &mut th.local, *sp, ea, *size, inst.line) {
                        Ok(mut v) => {
                            if *se {
                                v = sext(v, size * 8) as u64;
                            }
                            wr(&mut th.regs, rbase, ds[k], v);
                        }
                        Err(e) => break Err(e),
                    }
                    k += 1;
                };
                if let Err(e) = res {
                    break Err(e);
                }
            }
            Op::St {
                sp,
                size,
                n,
                vals,
                addr,
                off,
            } => {
                let a = r!(*addr).wrapping_add(*off as u64);
                let total = size * (*n as u32);
                if total > *size && !a.is_multiple_of(total.min(16) as u64) {
                    break Err(Fault::MisalignedAddress {
                        addr: a,
                        detail: format!("{total}-byte vector store at line {}", inst.line),
                    });
                }
                let mut vs = [0u64; 4];
                for k in 0..(*n as usize).min(4) {
                    vs[k] = r!(vals[k]);
                }
                let mut res = Ok(());
                for (k, v) in vs.iter().enumerate().take(*n as usize) {
                    let ea = a.wrapping_add((k as u64) * *size as u64);
                    if let Err(e) = b.store(g, &mut th.local, *sp, ea, *size, *v, inst.line) {
                        res = Err(e);
                        break;
                    }
                }
                if let Err(e) = res {
                    break Err(e);
                }
            }
            Op::Atom {
                sp,
                op,
                t,
                d,
                addr,
                off,
                b: bb,
                c,
            } => {
                let a = r!(*addr).wrapping_add(*off as u64);
                let (bv, cv) = (r!(*bb), r!(*c));
                let size = t.bytes();
                let p = match b.ptr(g, &mut th.local, *sp, a, size, true, inst.line) {
                    Ok(p) => p,
                    Err(e) => break Err(e),
                };
                let (op, t) = (*op, *t);
                // SAFETY: `ptr` checked bounds and alignment (size 2, 4 or 8) of a live buffer.
                let old = unsafe { atomic_rmw(p, size, |o| atom_apply(op, t, o, bv, cv)) };
                if *d != NONE {
                    wr(&mut th.regs, rbase, *d, old);
                }
            }
            Op::Cvta {
                d,
                a,
                sp,
                to_generic,
            } => {
                let v = r!(*a);
                let win = match sp {
                    Sp::Shared => SHARED_WINDOW,
                    Sp::Local => LOCAL_WINDOW,
                    Sp::Param => PARAM_WINDOW,
                    _ => 0,
                };
                let out = if *to_generic {
                    if win == 0 {
                        v
                    } else {
                        v.wrapping_add(win)
                    }
                } else if win == 0 {
                    v
                } else {
                    v.wrapping_sub(win)
                };
                wr(regs, rbase, *d, out);
            }
            Op::Isspacep { d, a, sp } => {
                let v = r!(*a);
                let is = match sp {
                    Sp::Shared => (SHARED_WINDOW..SHARED_WINDOW + WINDOW_SIZE).contains(&v),
                    Sp::Local => (LOCAL_WINDOW..LOCAL_WINDOW + WINDOW_SIZE).contains(&v),
                    Sp::Param => (PARAM_WINDOW..PARAM_WINDOW + WINDOW_SIZE).contains(&v),
                    _ => v >= DEVICE_VA_BASE,
                };
                wr(regs, rbase, *d, is as u64);
            }
            Op::Special { d, r } => {
                let clock = th.clock.wrapping_add(count);
                let v = special(g, b, clock, tid, lin, *r);
                wr(&mut th.regs, rbase, *d, v);
            }
            Op::Bra { target } => {
                if *target <= pc && b.instructions.wrapping_add(count) > g.budget {
                    break Err(Fault::Timeout(format!(
                        "instruction limit of {} per block exceeded at line {}",
                        g.budget, inst.line
                    )));
                }
                pc = *target;
                continue;
            }
            Op::Call(info) => {
                let fidx = match info.target {
                    None => info.func,
                    Some(t) => {
                        let v = r!(t);
                        let idx = v.wrapping_sub(FUNC_WIN);
                        match funcs.get(idx as usize) {
                            Some(f)
                                if idx < funcs.len() as u64
                                    && f.params.len() == info.args.len() =>
                            {
                                idx as u32
                            }
                            _ => {
                                break Err(Fault::IllegalAddress {
                                    addr: v,
                                    detail: format!(
                                        "indirect call to a bad function address at line {}",
                                        inst.line
                                    ),
                                })
                            }
                        }
                    }
                };
                let callee = match funcs.get(fidx as usize) {
                    Some(f) => f,
                    None => break Err(Fault::Failed("call to unknown function".into())),
                };
                if b.instructions.wrapping_add(count) > g.budget {
                    break Err(Fault::Timeout(format!(
                        "instruction limit of {} per block exceeded at line {}",
                        g.budget, inst.line
                    )));
                }
                if th.frames.len() >= MAX_CALL_DEPTH {
                    break Err(Fault::IllegalAddress {
                        addr: 0,
                        detail: format!("call stack overflow at line {}", inst.line),
                    });
                }
                let new_rbase = rbase + func.nregs;
                let new_lbase = (lbase + func.frame_bytes).div_ceil(16) * 16;
                let need_regs = (new_rbase + callee.nregs) as usize;
                let need_local = (new_lbase as usize + callee.frame_bytes as usize).div_ceil(8);
                if need_local * 8 > LOCAL_LIMIT || (need_regs + need_local) * 8 > g.stack_limit {
                    break Err(Fault::IllegalAddress {
                        addr: LOCAL_WINDOW + new_lbase as u64,
                        detail: format!("stack overflow at line {}", inst.line),
                    });
                }
                if th.regs.len() < need_regs {
                    th.regs.resize(need_regs, 0);
                }
                if th.local.len() < need_local {
                    th.local.resize(need_local, 0);
                }
                let mut ok = true;
                for (arg, &(poff, psize)) in info.args.iter().zip(&callee.params) {
                    match *arg {
                        ArgLoc::Frame { off, size } => {
                            ok &= local_copy(
                                &mut th.local,
                                new_lbase + poff,
                                lbase + off,
                                size.min(psize),
                            );
                        }
                        ArgLoc::Val { src, size } => {
                            let v = rd(&th.regs, rbase, lbase, src);
                            ok &= local_put(&mut th.local, new_lbase + poff, v, size.min(psize));
                        }
                    }
                }
                if !ok {
                    break Err(Fault::Failed("bad call arguments".into()));
                }
                th.frames.push(Frame {
                    func: th.func,
                    call_pc: pc,
                    rbase,
                    lbase,
                });
                // callee registers start zeroed
                for v in &mut th.regs[new_rbase as usize..need_regs] {
                    *v = 0;
                }
                th.func = fidx;
                th.rbase = new_rbase;
                th.lbase = new_lbase;
                func = callee;
                pc = 0;
                continue;
            }
            Op::Ret => {
                let Some(fr) = th.frames.pop() else {
                    if let Some(m) = b.warp_live.get_mut((lin / 32) as usize) {
                        *m &= !(1u32 << (lin % 32));
                    }
                    th.status = Status::Exited;
                    break Ok(Stop::Exit);
                };
                let caller = &funcs[fr.func as usize];
                if let Some(Inst {
                    op: Op::Call(info), ..
                }) = caller.code.get(fr.call_pc as usize)
                {
                    for (ret, &(roff, rsize)) in info.rets.iter().zip(&func.rets) {
                        match *ret {
                            ArgLoc::Frame { off, size } => {
                                local_copy(
                                    &mut th.local,
                                    fr.lbase + off,
                                    lbase + roff,
                                    size.min(rsize),
                                );
                            }
                            ArgLoc::Val {
                                src: Src::Reg(r),
                                size,
                            } => {
                                let v = local_get(&mut th.local, lbase + roff, size.min(rsize))
                                    .unwrap_or(0);
                                wr(&mut th.regs, fr.rbase, r, v);
                            }
                            ArgLoc::Val { .. } => {}
                        }
                    }
                }
                th.func = fr.func;
                th.rbase = fr.rbase;
                th.lbase = fr.lbase;
                func = caller;
                pc = fr.call_pc + 1;
                continue;
            }
            Op::Printf { fmt, args, ret } => {
                let get = |th: &mut Thread, l: &ArgLoc| -> u64 {
                    match *l {
                        ArgLoc::Frame { off, size } => {
                            local_get(&mut th.local, lbase + off, size.min(8)).unwrap_or(0)
                        }
                        ArgLoc::Val { src, .. } => rd(&th.regs, rbase, lbase, src),
                    }
                };
                let fptr = get(th, fmt);
                let aptr = get(th, args);
                let Some(fmt_bytes) = b.cstring(g, &mut th.local, fptr) else {
                    break Err(g.fault_addr(fptr, "printf format read", inst.line));
                };
                let local = &mut th.local;
                let cell = std::cell::RefCell::new((&mut *b, local));
                let text = printf::format(
                    &fmt_bytes,
                    |off, size| {
                        let mut c = cell.borrow_mut();
                        let (blk, loc) = &mut *c;
                        blk.load(g, loc, Sp::Generic, aptr.wrapping_add(off), size, 0)
                            .ok()
                    },
                    |p| {
                        let mut c = cell.borrow_mut();
                        let (blk, loc) = &mut *c;
                        blk.cstring(g, loc, p)
                    },
                );
                let n = text.len() as u64;
                // like the driver's bounded printf FIFO: excess output is dropped
                if b.out.len() + text.len() <= PRINTF_LIMIT {
                    b.out.extend_from_slice(&text);
                }
                if let Some(r) = ret {
                    match *r {
                        ArgLoc::Frame { off, size } => {
                            local_put(&mut th.local, lbase + off, n, size);
                        }
                        ArgLoc::Val {
                            src: Src::Reg(d), ..
                        } => wr(&mut th.regs, rbase, d, n),
                        _ => {}
                    }
                }
            }
            Op::Exit => {
                if let Some(m) = b.warp_live.get_mut((lin / 32) as usize) {
                    *m &= !(1u32 << (lin % 32));
                }
                th.status = Status::Exited;
                break Ok(Stop::Exit);
            }
            Op::Trap(msg) => {
                break Err(Fault::Trap {
                    detail: format!(
                        "{msg} at line {} (thread {lin}, block {:?})",
                        inst.line, b.ctaid
                    ),
                });
            }
            Op::Bar {
                wait: false,
                id,
                count: cnt,
                ..
            } => {
                let id = (r!(*id) & 15) as usize;
                let _ = cnt;
                b.arrivals[id] = b.arrivals[id].wrapping_add(1);
            }
            Op::Bar { .. } => {
                th.pc = pc;
                th.status = Status::AtBar;
                th.clock = th.clock.wrapping_add(count);
                b.instructions += count;
                return Ok(Stop::Collective);
            }
            Op::Carry {
                kind,
                t,
                d,
                a,
                b: bb,
                c,
                cin,
                cout,
                cc,
            } => {
                let bits = t.bits();
                let mask = t.mask() as u128;
                let (x, y, z) = (
                    r!(*a) as u128 & mask,
                    r!(*bb) as u128 & mask,
                    r!(*c) as u128 & mask,
                );
                let flag = if *cin {
                    r!(Src::Reg(*cc)) as u128 & 1
                } else {
                    0
                };
                let (v, carry) = match kind {
                    CarryKind::Add => {
                        let r = x + y + flag;
                        (r, (r >> bits) & 1)
                    }
                    CarryKind::Sub => {
                        let sub = y + flag;
                        (x.wrapping_sub(sub), (x < sub) as u128)
                    }
                    CarryKind::MadLo | CarryKind::MadHi => {
                        let p = x * y;
                        let part = if *kind == CarryKind::MadHi {
                            p >> bits
                        } else {
                            p & mask
                        };
                        let r = part + z + flag;
                        (r, (r >> bits) & 1)
                    }
                };
                wr(regs, rbase, *d, (v & mask) as u64);
                if *cout {
                    wr(regs, rbase, *cc, carry as u64);
                }
            }
            Op::CpAsync {
                dst,
                doff,
                src,
                soff,
                size,
                src_size,
            } => {
                let da = r!(*dst).wrapping_add(*doff as u64);
                let sa = r!(*src).wrapping_add(*soff as u64);
                let n = (r!(*src_size) as u32).min(*size);
                let mut res = Ok(());
                for k in 0..*size as u64 {
                    let v = if (k as u32) < n {
                        match b.load(
                            g,
                            &mut th.local,
                            Sp::Generic,
                            sa.wrapping_add(k),
                            1,
                            inst.line,
                        ) {
                            Ok(v) => v,
                            Err(e) => {
                                res = Err(e);
                                break;
                            }
                        }
                    } else {
                        0
                    };
                    if let Err(e) = b.store(
                        g,
                        &mut th.local,
                        Sp::Shared,
                        da.wrapping_add(k),
                        1,
                        v,
                        inst.line,
                    ) {
                        res = Err(e);
                        break;
                    }
                }
                if let Err(e) = res {
                    break Err(e);
                }
            }
            Op::WmmaLoad {
                ety,
                row,
                ds,
                sp,
                addr,
                off,
                stride,
            } => {
                let base = r!(*addr).wrapping_add(*off as u64);
                let stride = r!(*stride) & 0xffff_ffff;
                let lane = lin % 32;
                let es = ety.bytes();
                let per_reg = if es == 2 { 2 } else { 1 };
                let mut res = Ok(());
                for (j, d) in ds.iter().enumerate() {
                    let mut v = 0u64;
                    for h in 0..per_reg {
                        let slot = (j * per_reg + h) % 8;
                        let e = lane as u64 * 8 + slot as u64;
                        let (r_, c_) = (e / 16, e % 16);
                        let idx = if *row {
                            r_ * stride + c_
                        } else {
                            c_ * stride + r_
                        };
                        let a = base.wrapping_add(idx.wrapping_mul(es as u64));
                        match b.load(g, &mut th.local, *sp, a, es, inst.line) {
                            Ok(x) => v |= x << (16 * h),
                            Err(e) => {
                                res = Err(e);
                                break;
                            }
                        }
                    }
                    wr(&mut th.regs, rbase, *d, v);
                }
                if let Err(e) = res {
                    break Err(e);
                }
            }
            Op::WmmaStore {
                ety,
                row,
                vals,
                sp,
                addr,
                off,
                stride,
            } => {
                let base = r!(*addr).wrapping_add(*off as u64);
                let stride = r!(*stride) & 0xffff_ffff;
                let lane = lin % 32;
                let es = ety.bytes();
                let per_reg = if es == 2 { 2 } else { 1 };
                let mut res = Ok(());
                for slot in 0..8usize {
                    let Some(src) = vals.get(slot / per_reg) else {
                        break;
                    };
                    let v =
                        (rd(&th.regs, rbase, lbase, *src) >> (16 * (slot % per_reg))) & ety.mask();
                    let e = lane as u64 * 8 + slot as u64;
                    let (r_, c_) = (e / 16, e % 16);
                    let idx = if *row {
                        r_ * stride + c_
                    } else {
                        c_ * stride + r_
                    };
                    let a = base.wrapping_add(idx.wrapping_mul(es as u64));
                    if let Err(e) = b.store(g, &mut th.local, *sp, a, es, v, inst.line) {
                        res = Err(e);
                        break;
                    }
                }
                if let Err(e) = res {
                    break Err(e);
                }
            }
            Op::WmmaMma { .. }
            | Op::Mma { .. }
            | Op::Ldmatrix { .. }
            | Op::Activemask { .. }
            | Op::WarpSync { .. }
            | Op::Shfl { .. }
            | Op::Vote { .. }
            | Op::Match { .. }
            | Op::Redux { .. } => {
                th.pc = pc;
                th.status = Status::AtWarp;
                th.clock = th.clock.wrapping_add(count);
                b.instructions += count;
                return Ok(Stop::Collective);
            }
            Op::Nop => {}
        }
        pc += 1;
    };
    th.pc = pc;
    th.clock = th.clock.wrapping_add(count);
    b.instructions += count;
    result
}

/// State of the block's threads plus the per-worker scratch.
struct Worker {
    threads: Vec<Thread>,
    block: Block,
}

impl Worker {
    fn run_block(&mut self, g: &Geo<'_>, block_id: u64) -> Result<(), Fault> {
        let [gx, gy, _] = g.nctaid;
        let ctaid = [
            (block_id % gx as u64) as u32,
            ((block_id / gx as u64) % gy as u64) as u32,
            (block_id / (gx as u64 * gy as u64)) as u32,
        ];
        let n = g.ntid.iter().product::<u32>() as usize;
        let kf = &g.prog.funcs[g.kernel as usize];
        let b = &mut self.block;
        b.ctaid = ctaid;
        b.arrivals = [0; 16];
        b.warp_live.clear();
        for w in 0..n.div_ceil(32) {
            let lanes = (n - w * 32).min(32);
            b.warp_live.push(if lanes == 32 {
                u32::MAX
            } else {
                (1u32 << lanes) - 1
            });
        }
        let words = (g.shared_bytes as usize).div_ceil(8);
        b.shared.clear();
        b.shared.resize(words, 0);
        if self.threads.len() > n {
            self.threads.truncate(n);
        }
        while self.threads.len() < n {
            self.threads.push(Thread {
                pc: 0,
                func: 0,
                rbase: 0,
                lbase: 0,
                frames: Vec::new(),
                status: Status::Ready,
                clock: 0,
                regs: Vec::new(),
                local: Vec::new(),
            });
        }
        for th in self.threads.iter_mut() {
            th.pc = 0;
            th.func = g.kernel;
            th.rbase = 0;
            th.lbase = 0;
            th.frames.clear();
            th.status = Status::Ready;
            th.regs.clear();
            th.regs.resize(kf.nregs as usize, 0);
            th.local.clear();
            th.local.resize((kf.frame_bytes as usize).div_ceil(8), 0);
        }
        loop {
            // run warp by warp, resolving that warp's collectives as soon as
            // all of its lanes are blocked
            for w in 0..n.div_ceil(32) {
                let lanes = w * 32..(w * 32 + 32).min(n);
                loop {
                    if g.lockstep {
                        // warp-synchronous code: lanes advance one instruction at a time
                        loop {
                            let mut ran = false;
                            for lin in lanes.clone() {
                                let th = &mut self.threads[lin];
                                if th.status == Status::Ready {
                                    ran = true;
                                    run_thread::<true>(g, &mut self.block, th, lin as u32)?;
                                }
                            }
                            if !ran {
                                break;
                            }
                        }
                    } else {
                        for lin in lanes.clone() {
                            let th = &mut self.threads[lin];
                            if th.status == Status::Ready {
                                run_thread::<false>(g, &mut self.block, th, lin as u32)?;
                            }
                        }
                    }
                    if !self.resolve_warp(g, w, false)? {
                        break;
                    }
                }
            }
            if self.threads.iter().all(|t| t.status == Status::Exited) {
                return Ok(());
            }
            let progressed = self.resolve_barriers(g) || self.resolve_warps(g, true)?;
            if !progressed {
                let waiting: Vec<usize> = self
                    .threads
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.status != Status::Exited)
                    .map(|(i, _)| i)
                    .take(8)
                    .collect();
                let line = waiting
                    .first()
                    .and_then(|&i| {
                        let t = &self.threads[i];
                        g.prog
                            .funcs
                            .get(t.func as usize)?
                            .code
                            .get(t.pc as usize)
                            .map(|x| x.line)
                    })
                    .unwrap_or(0);
                return Err(Fault::Failed(format!(
                    "deadlock in block {ctaid:?}: threads {waiting:?} wait at a barrier or warp op (line {line}) that can never complete"
                )));
            }
        }
    }

    fn resolve_barriers(&mut self, g: &Geo<'_>) -> bool {
        let alive = self
            .threads
            .iter()
            .filter(|t| t.status != Status::Exited)
            .count() as u64;
        let mut progressed = false;
        for id in 0..16u64 {
            let mut waiters = Vec::new();
            let mut expected = alive;
            let mut red = BarRed::None;
            for (i, t) in self.threads.iter().enumerate() {
                if t.status != Status::AtBar {
                    continue;
                }
                let f = &g.prog.funcs[t.func as usize];
                if let Some(Inst {
                    op:
                        Op::Bar {
                            id: bid,
                            count,
                            red: r,
                            ..
                        },
                    ..
                }) = f.code.get(t.pc as usize)
                {
                    if rd(&t.regs, t.rbase, t.lbase, *bid) & 15 == id {
                        let c = rd(&t.regs, t.rbase, t.lbase, *count);
                        if c != u64::MAX {
                            expected = c.min(alive.max(1));
                        }
                        red = *r;
                        waiters.push(i);
                    }
                }
            }
            if waiters.is_empty() {
                continue;
            }
            let arrived = waiters.len() as u64 + self.block.arrivals[id as usize] as u64;
            if arrived < expected {
                continue;
            }
            self.block.arrivals[id as usize] = 0;
            // reduction
            let mut popc = 0u64;
            let mut all = true;
            let mut any = false;
            if red != BarRed::None {
                for &i in &waiters {
                    let t = &self.threads[i];
                    let f = &g.prog.funcs[t.func as usize];
                    if let Some(Inst {
                        op: Op::Bar { p, pneg, .. },
                        ..
                    }) = f.code.get(t.pc as usize)
                    {
                        let v = (rd(&t.regs, t.rbase, t.lbase, *p) & 1 != 0) != *pneg;
                        popc += v as u64;
                        all &= v;
                        any |= v;
                    }
                }
            }
            for &i in &waiters {
                let t = &mut self.threads[i];
                let f = &g.prog.funcs[t.func as usize];
                if let Some(Inst {
                    op: Op::Bar { d, .. },
                    ..
                }) = f.code.get(t.pc as usize)
                {
                    if *d != NONE {
                        let v = match red {
                            BarRed::Popc => popc,
                            BarRed::And => all as u64,
                            BarRed::Or => any as u64,
                            BarRed::None => 0,
                        };
                        wr(&mut t.regs, t.rbase, *d, v);
                    }
                }
                t.pc += 1;
                t.status = Status::Ready;
            }
            progressed = true;
        }
        progressed
    }

    /// Resolves warp collectives whose participants have all arrived. With
    /// `relaxed`, lanes waiting at different instructions of the same kind
    /// (divergent call sites) are grouped too.
    fn resolve_warps(&mut self, g: &Geo<'_>, relaxed: bool) -> Result<bool, Fault> {
        let mut progressed = false;
        for w in 0..self.threads.len().div_ceil(32) {
            progressed |= self.resolve_warp(g, w, relaxed)?;
        }
        Ok(progressed)
    }

    /// Resolves the collectives of warp `w` whose participants all arrived.
    fn resolve_warp(&mut self, g: &Geo<'_>, w: usize, relaxed: bool) -> Result<bool, Fault> {
        let n = self.threads.len();
        let mut progressed = false;
        {
            let lo = w * 32;
            let hi = (lo + 32).min(n);
            let alive: u32 = (lo..hi)
                .filter(|&i| self.threads[i].status != Status::Exited)
                .fold(0, |m, i| m | 1 << (i - lo));
            for l in lo..hi {
                let t = &self.threads[l];
                if t.status != Status::AtWarp {
                    continue;
                }
                let (func, pc) = (t.func, t.pc);
                let Some(inst) = g.prog.funcs[func as usize].code.get(pc as usize) else {
                    continue;
                };
                let mask_src = match &inst.op {
                    Op::WarpSync { mask }
                    | Op::Shfl { mask, .. }
                    | Op::Vote { mask, .. }
                    | Op::Match { mask, .. }
                    | Op::Redux { mask, .. } => *mask,
                    _ => Src::Imm(0xffff_ffff),
                };
                let mask = if let Op::Activemask { d } = inst.op {
                    // converged lanes: once every live lane is blocked, those at this pc
                    let all_blocked = (lo..hi).all(|i| self.threads[i].status != Status::Ready);
                    if !all_blocked {
                        continue;
                    }
                    let m = (lo..hi)
                        .filter(|&i| {
                            let o = &self.threads[i];
                            o.status == Status::AtWarp && o.func == func && o.pc == pc
                        })
                        .fold(0u32, |m, i| m | 1 << (i - lo));
                    for i in lo..hi {
                        if m & (1 << (i - lo)) != 0 {
                            let o = &mut self.threads[i];
                            wr(&mut o.regs, o.rbase, d, m as u64);
                            o.pc += 1;
                            o.status = Status::Ready;
                        }
                    }
                    progressed = true;
                    continue;
                } else {
                    (rd(&t.regs, t.rbase, t.lbase, mask_src) as u32 | 1 << (l - lo)) & alive
                };
                // every lane in mask must be waiting at this same instruction
                let kind = std::mem::discriminant(&inst.op);
                let ready = (0..32).filter(|k| mask & (1 << k) != 0).all(|k| {
                    let o = &self.threads[lo + k];
                    o.status == Status::AtWarp
                        && ((o.func == func && o.pc == pc)
                            || (relaxed
                                && g.prog.funcs[o.func as usize]
                                    .code
                                    .get(o.pc as usize)
                                    .is_some_and(|i| std::mem::discriminant(&i.op) == kind)))
                });
                if !ready {
                    continue;
                }
                self.collective(g, lo, mask)?;
                for k in 0..32 {
                    if mask & (1 << k) != 0 {
                        let o = &mut self.threads[lo + k];
                        o.pc += 1;
                        o.status = Status::Ready;
                    }
                }
                progressed = true;
            }
        }
        Ok(progressed)
    }

    /// Resolves one warp collective for the lanes in `mask`; every lane uses
    /// the operands of the instruction it is waiting at.
    fn collective(&mut self, g: &Geo<'_>, lo: usize, mask: u32) -> Result<(), Fault> {
        let prog = g.prog;
        let op_at = |th: &Thread| -> Option<&Op> {
            prog.funcs
                .get(th.func as usize)?
                .code
                .get(th.pc as usize)
                .map(|i| &i.op)
        };
        let mut lane_buf = [0usize; 32];
        let mut count = 0;
        for k in 0..32 {
            if mask & (1 << k) != 0 {
                lane_buf[count] = k;
                count += 1;
            }
        }
        let lanes = &lane_buf[..count];
        let val = |th: &Thread, s: Src| rd(&th.regs, th.rbase, th.lbase, s);
        let n = self.threads.len();
        let Some(first) = lanes.first().and_then(|&l| op_at(&self.threads[lo + l])) else {
            return Ok(());
        };
        match first {
            Op::Shfl { .. } => {
                let mut results = [(0usize, 0u32, 0u32, 0u64, false); 32];
                let mut nres = 0;
                for &lane in lanes {
                    let th = &self.threads[lo + lane];
                    let Some(Op::Shfl {
                        mode, d, dp, b, c, ..
                    }) = op_at(th)
                    else {
                        continue;
                    };
                    let bval = (val(th, *b) & 0x1f) as i64;
                    let cval = val(th, *c);
                    let segmask = ((cval >> 8) & 0x1f) as i64;
                    let clamp = (cval & 0x1f) as i64;
                    let lane_i = lane as i64;
                    let max_lane = (lane_i & segmask) | (clamp & !segmask);
                    let min_lane = lane_i & segmask;
                    let (j, p) = match mode {
                        ShflMode::Up => {
                            let j = lane_i - bval;
                            (j, j >= max_lane)
                        }
                        ShflMode::Down => {
                            let j = lane_i + bval;
                            (j, j <= max_lane)
                        }
                        ShflMode::Bfly => {
                            let j = lane_i ^ bval;
                            (j, j <= max_lane)
                        }
                        ShflMode::Idx => {
                            let j = min_lane | (bval & !segmask);
                            (j, j <= max_lane)
                        }
                    };
                    let src_lane = if p && (0..32).contains(&j) && lo + (j as usize) < n {
                        j as usize
                    } else {
                        lane
                    };
                    let src = &self.threads[lo + src_lane];
                    // the source lane's value operand (of its own instruction)
                    let a = match op_at(src) {
                        Some(Op::Shfl { a, .. }) => *a,
                        _ => match op_at(th) {
                            Some(Op::Shfl { a, .. }) => *a,
                            _ => Src::Imm(0),
                        },
                    };
                    let v = val(src, a) & 0xffff_ffff;
                    results[nres] = (lane, *d, *dp, v, p);
                    nres += 1;
                }
                for &(lane, d, dp, v, p) in &results[..nres] {
                    let th = &mut self.threads[lo + lane];
                    wr(&mut th.regs, th.rbase, d, v);
                    if dp != NONE {
                        wr(&mut th.regs, th.rbase, dp, p as u64);
                    }
                }
            }
            Op::Vote { .. } => {
                let mut ballot = 0u64;
                for &lane in lanes {
                    let th = &self.threads[lo + lane];
                    if let Some(Op::Vote { a, neg, .. }) = op_at(th) {
                        if (val(th, *a) & 1 != 0) != *neg {
                            ballot |= 1 << lane;
                        }
                    }
                }
                for &lane in lanes {
                    let th = &mut self.threads[lo + lane];
                    if let Some(Op::Vote { mode, d, .. }) = op_at(th) {
                        let v = match mode {
                            VoteMode::Ballot => ballot,
                            VoteMode::All => (ballot == mask as u64) as u64,
                            VoteMode::Any => (ballot != 0) as u64,
                            VoteMode::Uni => (ballot == 0 || ballot == mask as u64) as u64,
                        };
                        wr(&mut th.regs, th.rbase, *d, v);
                    }
                }
            }
            Op::Match { .. } => {
                let vals: Vec<u64> = lanes
                    .iter()
                    .map(|&l| {
                        let th = &self.threads[lo + l];
                        match op_at(th) {
                            Some(Op::Match { a, wide, .. }) => {
                                let v = val(th, *a);
                                if *wide {
                                    v
                                } else {
                                    v & 0xffff_ffff
                                }
                            }
                            _ => 0,
                        }
                    })
                    .collect();
                let all_eq = vals.iter().all(|v| *v == vals[0]);
                for (i, &lane) in lanes.iter().enumerate() {
                    let th = &mut self.threads[lo + lane];
                    let Some(Op::Match { all, d, dp, .. }) = op_at(th) else {
                        continue;
                    };
                    let m = if *all {
                        if all_eq {
                            mask as u64
                        } else {
                            0
                        }
                    } else {
                        lanes
                            .iter()
                            .zip(&vals)
                            .filter(|(_, v)| **v == vals[i])
                            .fold(0u64, |m, (l, _)| m | 1 << l)
                    };
                    wr(&mut th.regs, th.rbase, *d, m);
                    if *dp != NONE {
                        wr(&mut th.regs, th.rbase, *dp, all_eq as u64);
                    }
                }
            }
            Op::Ldmatrix { num, trans, sp, .. } => {
                let (num, trans, sp) = (*num as usize, *trans, *sp);
                // row addresses: lane j*8+r names row r of matrix j
                let mut rows = [0u64; 32];
                for &lane in lanes {
                    let th = &self.threads[lo + lane];
                    if let Some(Op::Ldmatrix { addr, off, .. }) = op_at(th) {
                        rows[lane] = val(th, *addr).wrapping_add(*off as u64);
                    }
                }
                let mut scratch = Vec::new();
                for &lane in lanes {
                    let mut regs = [0u64; 4];
                    for (j, reg) in regs.iter_mut().enumerate().take(num) {
                        let mut v = 0u64;
                        for h in 0..2u64 {
                            let (row, col) = if trans {
                                ((lane % 4) * 2 + h as usize, lane / 4)
                            } else {
                                (lane / 4, (lane % 4) * 2 + h as usize)
                            };
                            let a = rows[j * 8 + row].wrapping_add(2 * col as u64);
                            let x = self.block.load(g, &mut scratch, sp, a, 2, 0)?;
                            v |= x << (16 * h);
                        }
                        *reg = v;
                    }
                    let th = &mut self.threads[lo + lane];
                    if let Some(Op::Ldmatrix { ds, .. }) = op_at(th) {
                        for (d, v) in ds.iter().zip(regs) {
                            wr(&mut th.regs, th.rbase, *d, v);
                        }
                    }
                }
            }
            Op::Mma { .. } => {
                let elem = |th: &Thread, srcs: &[Src], t: Ty, i: usize| -> f32 {
                    let per_reg = if t.bytes() == 2 { 2 } else { 1 };
                    let Some(s) = srcs.get(i / per_reg) else {
                        return 0.0;
                    };
                    let v = (val(th, *s) >> (16 * (i % per_reg))) & t.mask();
                    fval(v, t) as f32
                };
                let mut ma = [0f32; 256];
                let mut mb = [0f32; 128];
                let mut mc = [0f32; 128];
                let mut kdim = 16;
                for &lane in lanes {
                    let th = &self.threads[lo + lane];
                    let Some(Op::Mma {
                        k,
                        ab,
                        cty,
                        a,
                        b,
                        c,
                        ..
                    }) = op_at(th)
                    else {
                        continue;
                    };
                    kdim = *k as usize;
                    let (gi, ti) = (lane >> 2, lane & 3);
                    let na = if kdim == 16 { 8 } else { 4 };
                    for i in 0..na {
                        let row = gi + 8 * ((i / 2) & 1);
                        let col = ti * 2 + (i % 2) + 8 * (i / 4);
                        ma[row * 16 + col] = elem(th, a, *ab, i);
                    }
                    for i in 0..na / 2 {
                        let kk = ti * 2 + (i % 2) + 8 * (i / 2);
                        mb[kk * 8 + gi] = elem(th, b, *ab, i);
                    }
                    for i in 0..4 {
                        mc[(gi + 8 * (i / 2)) * 8 + ti * 2 + (i % 2)] = elem(th, c, *cty, i);
                    }
                }
                let mut md = [0f32; 128];
                for i in 0..16 {
                    for j in 0..8 {
                        let mut acc = mc[i * 8 + j];
                        for k in 0..kdim {
                            acc = ma[i * 16 + k].mul_add(mb[k * 8 + j], acc);
                        }
                        md[i * 8 + j] = acc;
                    }
                }
                for &lane in lanes {
                    let th = &mut self.threads[lo + lane];
                    let Some(Op::Mma { dty, d, .. }) = op_at(th) else {
                        continue;
                    };
                    let (gi, ti) = (lane >> 2, lane & 3);
                    let per_reg = if dty.bytes() == 2 { 2 } else { 1 };
                    let mut regs = [0u64; 4];
                    for i in 0..4 {
                        let v =
                            to_fbits(md[(gi + 8 * (i / 2)) * 8 + ti * 2 + (i % 2)] as f64, *dty);
                        regs[i / per_reg] |= v << (16 * (i % per_reg));
                    }
                    for (r, v) in d.iter().zip(regs) {
                        wr(&mut th.regs, th.rbase, *r, v);
                    }
                }
            }
            Op::WmmaMma { .. } => {
                // gather the three 16x16 tiles from the lanes' fragments
                let slot_val = |th: &Thread, srcs: &[Src], t: Ty, slot: usize| -> f32 {
                    let per_reg = if t.bytes() == 2 { 2 } else { 1 };
                    let Some(s) = srcs.get(slot / per_reg) else {
                        return 0.0;
                    };
                    let v = (val(th, *s) >> (16 * (slot % per_reg))) & t.mask();
                    fval(v, t) as f32
                };
                let mut ma = [0f32; 256];
                let mut mb = [0f32; 256];
                let mut mc = [0f32; 256];
                for &lane in lanes {
                    let th = &self.threads[lo + lane];
                    if let Some(Op::WmmaMma {
                        ab, cty, a, b, c, ..
                    }) = op_at(th)
                    {
                        for slot in 0..8 {
                            let e = lane * 8 + slot;
                            ma[e] = slot_val(th, a, *ab, slot);
                            mb[e] = slot_val(th, b, *ab, slot);
                            mc[e] = slot_val(th, c, *cty, slot);
                        }
                    }
                }
                let mut md = [0f32; 256];
                for i in 0..16 {
                    for j in 0..16 {
                        let mut acc = mc[i * 16 + j];
                        for k in 0..16 {
                            acc = ma[i * 16 + k].mul_add(mb[k * 16 + j], acc);
                        }
                        md[i * 16 + j] = acc;
                    }
                }
                for &lane in lanes {
                    let th = &mut self.threads[lo + lane];
                    let Some(Op::WmmaMma { dty, d, .. }) = op_at(th) else {
                        continue;
                    };
                    let per_reg = if dty.bytes() == 2 { 2 } else { 1 };
                    for (j, reg) in d.iter().enumerate() {
                        let mut v = 0u64;
                        for h in 0..per_reg {
                            let slot = (j * per_reg + h) % 8;
                            v |= to_fbits(md[lane * 8 + slot] as f64, *dty) << (16 * h);
                        }
                        wr(&mut th.regs, th.rbase, *reg, v);
                    }
                }
            }
            Op::Redux { op, signed, .. } => {
                let (op, signed) = (*op, *signed);
                let vals: Vec<u64> = lanes
                    .iter()
                    .map(|&l| {
                        let th = &self.threads[lo + l];
                        match op_at(th) {
                            Some(Op::Redux { a, .. }) => val(th, *a) & 0xffff_ffff,
                            _ => 0,
                        }
                    })
                    .collect();
                let t = if signed { Ty::S32 } else { Ty::U32 };
                let mut acc = vals.first().copied().unwrap_or(0);
                for &v in vals.iter().skip(1) {
                    acc = match op {
                        ReduxOp::Add => acc.wrapping_add(v) & 0xffff_ffff,
                        ReduxOp::Min => int_bin(IntOp::Min, t, acc, v),
                        ReduxOp::Max => int_bin(IntOp::Max, t, acc, v),
                        ReduxOp::And => acc & v,
                        ReduxOp::Or => acc | v,
                        ReduxOp::Xor => acc ^ v,
                    };
                }
                for &lane in lanes {
                    let th = &mut self.threads[lo + lane];
                    if let Some(Op::Redux { d, .. }) = op_at(th) {
                        wr(&mut th.regs, th.rbase, *d, acc);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Runs kernel `k` of `prog` (a configuration already checked against the
/// kernel's limits) over all blocks.
pub(crate) fn run_launch(
    prog: &Module,
    mem: &DeviceMemory,
    k: usize,
    cfg: &LaunchConfig,
    params: &[u8],
    budget: u64,
) -> LaunchReport {
    let kernel = prog.kernels[k];
    let threads: u64 = cfg.block.iter().map(|&v| v as u64).product();
    let f = &prog.funcs[kernel as usize];
    let per_thread = f.nregs as u64 * 8 + f.frame_bytes as u64;
    if per_thread.saturating_mul(threads) > BLOCK_MEMORY_LIMIT as u64 {
        return LaunchReport::failed(Fault::OutOfResources(format!(
            "{threads} threads with {per_thread} bytes of registers and local memory each"
        )));
    }
    let shared_bytes = prog.dyn_shared_base as u64 + cfg.dynamic_shared_bytes as u64;
    let view = mem.view();
    let mut pwords = vec![0u64; params.len().div_ceil(8)];
    bytes_of(&mut pwords)[..params.len()].copy_from_slice(params);
    let start_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let g = Geo {
        prog,
        mem: &view,
        params: &pwords,
        params_len: params.len() as u64,
        ntid: cfg.block,
        nctaid: cfg.grid,
        dyn_bytes: cfg.dynamic_shared_bytes,
        shared_bytes,
        start_ns,
        kernel,
        budget,
        lockstep: prog.funcs.iter().enumerate().any(|(i, f)| {
            f.uses_volatile && (i as u32 == kernel || !prog.kernels.contains(&(i as u32)))
        }),
        stack_limit: (BLOCK_MEMORY_LIMIT / cfg.block.iter().product::<u32>().max(1) as usize)
            .max(1 << 20),
    };
    let total: u64 = cfg.grid.iter().map(|&v| v as u64).product();
    let next = AtomicU64::new(0);
    let abort = AtomicBool::new(false);
    let instructions = AtomicU64::new(0);
    let fault: Mutex<Option<(u64, Fault)>> = Mutex::new(None);
    let outputs: Mutex<Vec<(u64, Vec<u8>)>> = Mutex::new(Vec::new());
    let workers = std::env::var("CUMUX_PTX_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .or_else(|| std::thread::available_parallelism().map(|n| n.get()).ok())
        .unwrap_or(1)
        .min(total.max(1) as usize)
        .max(1);
    let work = |smid: u32| {
        let mut w = Worker {
            threads: Vec::new(),
            block: Block {
                ctaid: [0; 3],
                smid,
                shared: Vec::new(),
                out: Vec::new(),
                cache: (0, 0, 0),
                arrivals: [0; 16],
                instructions: 0,
                warp_live: Vec::new(),
            },
        };
        let mut outs = Vec::new();
        loop {
            if abort.load(Ordering::Relaxed) {
                break;
            }
            let id = next.fetch_add(1, Ordering::Relaxed);
            if id >= total {
                break;
            }
            w.block.out.clear();
            let before = w.block.instructions;
            w.block.instructions = 0;
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run_block(&g, id)));
            let r = match r {
                Ok(r) => r,
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panic".into());
                    // the worker state may be inconsistent: start afresh
                    w.threads.clear();
                    Err(Fault::Failed(format!(
                        "internal error in interpreter: {msg}"
                    )))
                }
            };
            w.block.instructions += before;
            if !w.block.out.is_empty() {
                outs.push((id, std::mem::take(&mut w.block.out)));
            }
            if let Err(e) = r {
                let mut f = fault.lock().unwrap_or_else(|e| e.into_inner());
                if f.as_ref().is_none_or(|(b, _)| id < *b) {
                    *f = Some((id, e));
                }
                abort.store(true, Ordering::Relaxed);
                break;
            }
        }
        instructions.fetch_add(w.block.instructions, Ordering::Relaxed);
        outputs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(outs);
    };
    if workers == 1 {
        work(0);
    } else {
        std::thread::scope(|s| {
            for k in 0..workers {
                let work = &work;
                s.spawn(move || work(k as u32));
            }
        });
    }
    let mut outs = outputs.into_inner().unwrap_or_else(|e| e.into_inner());
    outs.sort_by_key(|(id, _)| *id);
    let mut stdout: Vec<u8> = Vec::new();
    for (_, o) in outs {
        if stdout.len() + o.len() > 8 * PRINTF_LIMIT {
            break;
        }
        stdout.extend_from_slice(&o);
    }
    let result = match fault.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some((_, f)) => Err(f),
        None => Ok(()),
    };
    LaunchReport {
        stdout,
        instructions: instructions.load(Ordering::Relaxed),
        result,
    }
}
