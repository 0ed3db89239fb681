//! How a lane kernel's 32-bit registers differ between the lanes of a group,
//! known before it runs: the same in every lane, or lane 0's plus a stride each.

use crate::ir::{Func, IntOp, Op, SReg, Sp, Src, TernOp, NONE};

/// What is known of one register's lanes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Lanes {
    /// No write of it reaches a read yet (the analysis goes on).
    Unset,
    /// Lane `k` holds lane 0's value plus `k` times this (modulo 2^32; 0:
    /// the same value in every lane).
    Stride(u32),
    Unknown,
}

impl Lanes {
    fn meet(self, other: Lanes) -> Lanes {
        match (self, other) {
            (Lanes::Unset, x) | (x, Lanes::Unset) => x,
            (Lanes::Stride(a), Lanes::Stride(b)) if a == b => self,
            _ => Lanes::Unknown,
        }
    }

    /// `f` of two strides; unset or unknown where either is.
    fn with(self, other: Lanes, f: impl Fn(u32, u32) -> Option<u32>) -> Lanes {
        match (self, other) {
            (Lanes::Stride(a), Lanes::Stride(b)) => f(a, b).map_or(Lanes::Unknown, Lanes::Stride),
            (Lanes::Unknown, _) | (_, Lanes::Unknown) => Lanes::Unknown,
            _ => Lanes::Unset,
        }
    }
}

/// For each register of `f`, the stride between the lanes of a lane-kernel
/// group that it holds all along (`Some(0)`: one value in every lane), where
/// the group's threads are consecutive in `%tid.x` and share `%tid.y` and
/// `%tid.z` (a block whose `%ntid.x` is a multiple of 4): `%tid.x` has
/// stride 1; `%tid.y`, `%tid.z`, `%ntid`, `%ctaid`, `%nctaid`, parameters
/// and immediates 0; 32-bit `add`, `sub`, `mul.lo`/`mad.lo` by a constant
/// and `shl` by a constant carry strides; any other pure op of stride-0
/// operands gives stride 0. A write guarded by a predicate that may differ
/// between lanes, or by anything else, makes it unknown (`None`). The
/// registers live at the kernel's start (`live_at_start`, read as 0 by
/// every thread) start with stride 0; the others' first writes set theirs.
pub(super) fn lane_strides(f: &Func, live_at_start: &[u32]) -> Vec<Option<u32>> {
    let mut lanes = vec![Lanes::Unset; f.nregs as usize];
    for &r in live_at_start {
        if let Some(l) = lanes.get_mut(r as usize) {
            *l = Lanes::Stride(0);
        }
    }
    loop {
        let mut changed = false;
        for inst in &f.code {
            let mut made = written(&inst.op, &lanes);
            if inst.guard != NONE {
                made = match lanes.get(inst.guard as usize) {
                    Some(Lanes::Stride(0)) => made,
                    Some(Lanes::Unset) => Lanes::Unset,
                    _ => Lanes::Unknown,
                };
            }
            inst.op.for_each_dst(|d| {
                if let Some(l) = lanes.get_mut(d as usize) {
                    let met = l.meet(made);
                    if met != *l {
                        *l = met;
                        changed = true;
                    }
                }
            });
        }
        if !changed {
            break;
        }
    }
    lanes
        .into_iter()
        .map(|l| match l {
            Lanes::Stride(s) => Some(s),
            _ => None,
        })
        .collect()
}

/// What `op` writes to its destinations, given `lanes`.
fn written(op: &Op, lanes: &[Lanes]) -> Lanes {
    let of = |s: Src| match s {
        Src::Reg(r) => lanes.get(r as usize).copied().unwrap_or(Lanes::Unknown),
        Src::Imm(_) => Lanes::Stride(0),
        Src::Frame(_) => Lanes::Unknown,
    };
    let constant = |s: Src| match s {
        Src::Imm(k) => Some(k as u32),
        _ => None,
    };
    // lane k of a * b where one of them is a constant, or both the same
    let mul = |a: Src, b: Src| match (constant(a), constant(b)) {
        (Some(k), _) => of(b).with(Lanes::Stride(0), |s, _| Some(s.wrapping_mul(k))),
        (_, Some(k)) => of(a).with(Lanes::Stride(0), |s, _| Some(s.wrapping_mul(k))),
        _ => of(a).with(of(b), |x, y| (x == 0 && y == 0).then_some(0)),
    };
    let int32 = |t: crate::ir::Ty| t.bits() == 32 && !t.is_float();
    match *op {
        Op::Special { r, .. } => match r {
            SReg::Tid(0) => Lanes::Stride(1),
            SReg::Tid(1 | 2) | SReg::Ntid(_) | SReg::Ctaid(_) | SReg::Nctaid(_) => Lanes::Stride(0),
            _ => Lanes::Unknown,
        },
        Op::Mov { a, mask, .. } => match of(a) {
            Lanes::Stride(s) if s != 0 && mask as u32 != u32::MAX => Lanes::Unknown,
            l => l,
        },
        Op::Int {
            op: int_op,
            t,
            a,
            b,
            ..
        } if int32(t) => match int_op {
            IntOp::Add => of(a).with(of(b), |x, y| Some(x.wrapping_add(y))),
            IntOp::Sub => of(a).with(of(b), |x, y| Some(x.wrapping_sub(y))),
            IntOp::MulLo => mul(a, b),
            IntOp::Shl => match constant(b) {
                Some(k) if k < 32 => of(a).with(Lanes::Stride(0), |s, _| Some(s << k)),
                _ => uniform(op, lanes),
            },
            _ => uniform(op, lanes),
        },
        Op::Tern {
            op: TernOp::MadLo,
            t,
            a,
            b,
            c,
            ..
        } if int32(t) => mul(a, b).with(of(c), |x, y| Some(x.wrapping_add(y))),
        Op::Tern {
            op: TernOp::Shfl, ..
        } => Lanes::Unknown,
        Op::Ld { addr, .. } => {
            if addr.sp == Sp::Param && matches!(addr.base, Src::Imm(_)) {
                Lanes::Stride(0)
            } else {
                Lanes::Unknown
            }
        }
        Op::Int { .. }
        | Op::Float { .. }
        | Op::Un { .. }
        | Op::Tern { .. }
        | Op::Bfi { .. }
        | Op::Setp { .. }
        | Op::Set { .. }
        | Op::Cvt { .. }
        | Op::Prmt { .. } => uniform(op, lanes),
        _ => Lanes::Unknown,
    }
}

/// Stride 0 where every source of `op` has it (unset or unknown where any
/// is; a frame address is unknown).
fn uniform(op: &Op, lanes: &[Lanes]) -> Lanes {
    let mut acc = Lanes::Stride(0);
    op.for_each_src(|s| {
        let l = match s {
            Src::Reg(r) => lanes.get(r as usize).copied().unwrap_or(Lanes::Unknown),
            Src::Imm(_) => Lanes::Stride(0),
            Src::Frame(_) => Lanes::Unknown,
        };
        acc = acc.with(l, |x, y| (x == 0 && y == 0).then_some(0));
    });
    acc
}

/// What is known of one vector-wide register's lanes: lane `k` holds lane
/// 0's value plus `k` times a stride (modulo 2^64).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Wide {
    Unset,
    Stride(u64),
    Unknown,
}

impl Wide {
    fn meet(self, other: Wide) -> Wide {
        match (self, other) {
            (Wide::Unset, x) | (x, Wide::Unset) => x,
            (Wide::Stride(a), Wide::Stride(b)) if a == b => self,
            _ => Wide::Unknown,
        }
    }

    fn with(self, other: Wide, f: impl Fn(u64, u64) -> u64) -> Wide {
        match (self, other) {
            (Wide::Stride(a), Wide::Stride(b)) => Wide::Stride(f(a, b)),
            (Wide::Unknown, _) | (_, Wide::Unknown) => Wide::Unknown,
            _ => Wide::Unset,
        }
    }
}

/// How a 32-bit register's stride `s` (between lanes, modulo 2^32) carries
/// into its 64-bit extension: lane `k` of the extension is lane 0's plus
/// `k` times this, where the 32-bit lanes do not wrap across the extension's
/// range (the lane kernel checks that where it extends; `None` where even
/// the check could not pass, `3 s` being past 2^31).
pub(super) fn extended_stride(s: u32) -> Option<i64> {
    let s = s as i32 as i64;
    (s.abs() * (super::LANES as i64 - 1) < 1 << 31).then_some(s)
}

/// For each register of `f` that the lane kernel keeps vector-wide
/// (`wide`), the stride in bytes between a group's lanes it holds all along,
/// where the group's lanes lie as `lane_strides` assumes (`narrow`: the
/// narrow registers' strides, `None` for the others and for those with none): 8-byte parameter loads
/// at fixed addresses (`hoisted`), moves, 64-bit adds, subtractions and
/// shifts by a constant, `cvta`, and `mul.wide` by a constant or widening
/// `cvt` of a narrow register with a known stride (whose lanes must not
/// wrap: the lane kernel checks it where it extends). Every write must be
/// unguarded; the registers live at the start (0 in every thread) have
/// stride 0. A register with a stride is kept as its lane 0's value alone.
pub(super) fn wide_strides(
    f: &Func,
    narrow: &[Option<u32>],
    wide: &[bool],
    hoisted: &[(u64, u32)],
    live_at_start: &[u32],
) -> Vec<Option<u64>> {
    let mut lanes = vec![Wide::Unset; f.nregs as usize];
    for (r, l) in lanes.iter_mut().enumerate() {
        if !wide[r] {
            *l = Wide::Unknown;
        }
    }
    for &r in live_at_start {
        if wide.get(r as usize) == Some(&true) {
            lanes[r as usize] = Wide::Stride(0);
        }
    }
    loop {
        let mut changed = false;
        for inst in &f.code {
            let made = match inst.guard {
                NONE => match wide_written(&inst.op, narrow, &lanes, hoisted) {
                    // (strides of consecutive elements only: a stride the
                    // lanes' accesses cannot use is not worth the lanes
                    // aligned, which any but 0 needs)
                    Wide::Stride(s) if !matches!(s, 0 | 1 | 2 | 4 | 8) => Wide::Unknown,
                    w => w,
                },
                _ => Wide::Unknown,
            };
            inst.op.for_each_dst(|d| {
                if let Some(l) = lanes.get_mut(d as usize) {
                    let met = l.meet(made);
                    if met != *l {
                        *l = met;
                        changed = true;
                    }
                }
            });
        }
        if !changed {
            break;
        }
    }
    lanes
        .into_iter()
        .enumerate()
        .map(|(r, l)| match l {
            Wide::Stride(s) if wide[r] => Some(s),
            _ => None,
        })
        .collect()
}

/// What `op` writes to its vector-wide destination, given `lanes`.
fn wide_written(op: &Op, narrow: &[Option<u32>], lanes: &[Wide], hoisted: &[(u64, u32)]) -> Wide {
    // a 64-bit source: a wide register, a narrow one the same in every
    // lane (zero-extended), an immediate
    let of = |s: Src| match s {
        Src::Reg(r) => match narrow.get(r as usize) {
            Some(Some(0)) => Wide::Stride(0),
            Some(Some(_)) => Wide::Unknown,
            _ => lanes.get(r as usize).copied().unwrap_or(Wide::Unknown),
        },
        Src::Imm(_) => Wide::Stride(0),
        Src::Frame(_) => Wide::Unknown,
    };
    // a narrow source extended: its stride as the extension's
    let ext = |s: Src| match s {
        Src::Reg(r) => match narrow.get(r as usize) {
            Some(&Some(s)) => extended_stride(s).map_or(Wide::Unknown, |s| Wide::Stride(s as u64)),
            _ => Wide::Unknown,
        },
        Src::Imm(_) => Wide::Stride(0),
        Src::Frame(_) => Wide::Unknown,
    };
    let int =
        |t: crate::ir::Ty| !t.is_float() && !matches!(t, crate::ir::Ty::Pred | crate::ir::Ty::B128);
    match *op {
        Op::Ld {
            addr,
            size: 8,
            n: 1,
            ..
        } => match (addr.sp, addr.base) {
            (Sp::Param, Src::Imm(b)) if hoisted.contains(&(b.wrapping_add(addr.off as u64), 8)) => {
                Wide::Stride(0)
            }
            _ => Wide::Unknown,
        },
        Op::Mov { a, mask, .. } if mask == u64::MAX => of(a),
        Op::Int { op, t, a, b, .. } if int(t) && t.bits() == 64 => match op {
            IntOp::Add => of(a).with(of(b), u64::wrapping_add),
            IntOp::Sub => of(a).with(of(b), u64::wrapping_sub),
            IntOp::Shl => match b {
                Src::Imm(n) if n < 64 => of(a).with(Wide::Stride(0), |x, _| x << n),
                _ => Wide::Unknown,
            },
            _ => Wide::Unknown,
        },
        Op::Int {
            op: IntOp::MulWide,
            t,
            a,
            b,
            ..
        } if int(t) && t.bits() == 32 => {
            let k = |s: Src| match s {
                Src::Imm(k) => Some(ext32(k, t.signed())),
                _ => None,
            };
            match (k(a), k(b)) {
                (_, Some(k)) => ext(a).with(Wide::Stride(0), |s, _| s.wrapping_mul(k)),
                (Some(k), _) => ext(b).with(Wide::Stride(0), |s, _| s.wrapping_mul(k)),
                _ => match (ext(a), ext(b)) {
                    (Wide::Stride(0), Wide::Stride(0)) => Wide::Stride(0),
                    _ => Wide::Unknown,
                },
            }
        }
        Op::Cvt {
            a, dt, st, mode, ..
        } if !mode.sat && !mode.ftz && int(dt) && int(st) && dt.bits() == 64 => match st.bits() {
            32 => ext(a),
            64 => of(a),
            _ => Wide::Unknown,
        },
        Op::Cvta { a, .. } => match a {
            Src::Reg(r) if narrow.get(r as usize).is_some_and(|n| n.is_none()) => {
                lanes.get(r as usize).copied().unwrap_or(Wide::Unknown)
            }
            _ => Wide::Unknown,
        },
        _ => Wide::Unknown,
    }
}

/// The low 32 bits of `k`, sign- or zero-extended.
pub(super) fn ext32(k: u64, signed: bool) -> u64 {
    if signed {
        k as u32 as i32 as i64 as u64
    } else {
        k as u32 as u64
    }
}

/// Whether some shared access of `ops` may have a base whose lanes' way
/// `Translator::shared_lane_bases` fixes from its stride (narrow, lanes
/// 0 or 4 bytes apart): that holds only where each group's lanes are
/// aligned in `%tid.x`, so the launch runs the lane kernel only there.
pub(super) fn fixed_shared_bases(ops: &[Op], strides: &[Option<u32>], narrow: &[bool]) -> bool {
    ops.iter().any(|op| match *op {
        Op::Ld { addr, .. } | Op::St { addr, .. } if addr.sp == Sp::Shared => match addr.base {
            Src::Reg(r) => narrow[r as usize] && matches!(strides[r as usize], Some(0 | 4)),
            _ => false,
        },
        _ => false,
    })
}
