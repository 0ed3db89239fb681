//! Global accesses whose address is affine in the thread: one check a block of
//! the whole range its threads can touch, after which a lane kernel runs them unchecked.

use super::plan::Plan;
use super::runtime::MAX_HOISTED;
use super::trips::{counter, simple_loop, Loop};
use crate::ir::{Func, IntOp, Op, SReg, Sp, Src, TernOp, Ty, NONE};
use crate::memory::MemView;

/// How a register's value is made from the block's constants and `%tid`
/// (each node's value is exact; the register holds it modulo 2^32 or
/// 2^64, its width).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expr {
    Imm(u64),
    /// A parameter's `size`-byte word at byte `at`.
    Param {
        at: u64,
        size: u32,
    },
    Special(SReg),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
    Shl(Box<Expr>, u32),
    /// A 32-bit value extended to 64 bits (`mul.wide`, `cvt`): exact only
    /// where it lies in the extension's range, which the check demands.
    Ext {
        a: Box<Expr>,
        signed: bool,
    },
    /// A constant added modulo 2^64 (`cvta`'s window).
    Offset(Box<Expr>, u64),
    /// The kernel's loop's trips so far (0 to its trips less 1) times a
    /// value the same every trip.
    Trip(Box<Trips>, Box<Expr>),
}

/// A loop's trips: its counter starts at `start` and steps by `step`
/// while below `bound` (32-bit, `signed` or not), tested after each trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Trips {
    start: Expr,
    step: u32,
    bound: Expr,
    signed: bool,
}

/// The global accesses of a lane kernel that one check a block may cover:
/// `(pc, the lanes' first address)`, each a 16-byte access of 4 words; and
/// the pcs of the extensions those addresses go through (the check
/// proves each lane's value in range: no per-group test of it).
#[derive(Debug, Default)]
pub(crate) struct Hoist {
    pub sites: Vec<(u32, Expr)>,
    pub widened: Vec<u32>,
}

/// The global 32-bit word accesses of `f`'s lane kernel whose address is a
/// chain of single, unguarded writes from parameters, block-wide specials
/// and `%tid`, each write in the kernel's first basic block (every thread
/// runs it whole before anything else) or earlier in the access's own.
pub(super) fn hoistable(f: &Func, p: &Plan) -> Hoist {
    let n = f.nregs as usize;
    let mut writes = vec![Vec::new(); n];
    let mut guarded = vec![false; n];
    for (pc, inst) in f.code.iter().enumerate() {
        inst.op.for_each_dst(|d| {
            if let Some(w) = writes.get_mut(d as usize) {
                w.push(pc as u32);
                guarded[d as usize] |= inst.guard != NONE;
            }
        });
    }
    let first_end = p.starts.get(1).copied().unwrap_or(f.code.len() as u32);
    let (backs, lp) = simple_loop(f, p);
    let mut b = Builder {
        f,
        p,
        writes,
        guarded,
        first_end,
        backs,
        lp,
        trips: None,
    };
    // (the loop's trips: its counter's value on entry, step and bound)
    b.trips = lp
        .and_then(|l| Some((l, counter(f, &l, &b.writes)?)))
        .and_then(|(l, c)| {
            let mut w = Vec::new();
            let start = b.entry(c.reg, &l, 32, &mut w, 0)?;
            let bound = b.src(c.bound, c.cmp, 32, &mut w, 0)?;
            // (no extension in either, nor `%tid` or `%ctaid`: the same in
            // every thread of a launch, else a loop counting from its
            // thread's index, a grid-stride loop, is not taken, which
            // `prepare` would take for none of the kernel's sites)
            let uniform = start.uniform() && bound.uniform();
            (w.is_empty() && uniform).then_some(Trips {
                start,
                step: c.step,
                bound,
                signed: c.signed,
            })
        });
    let mut h = Hoist::default();
    for (pc, inst) in f.code.iter().enumerate() {
        let (addr, size) = match inst.op {
            Op::Ld {
                addr,
                size,
                n: 1,
                sext: false,
                order: crate::ir::MemOrder::Plain,
                ..
            } => (addr, size),
            Op::St {
                addr,
                size,
                n: 1,
                order: crate::ir::MemOrder::Plain,
                ..
            } => (addr, size),
            _ => continue,
        };
        if size != 4 || inst.guard != NONE || !matches!(addr.sp, Sp::Global | Sp::Generic) {
            continue;
        }
        let Src::Reg(r) = addr.base else { continue };
        let mut widened = Vec::new();
        if h.sites.len() == MAX_HOISTED {
            break;
        }
        if let Some(e) = b.reg(r, pc as u32, 64, &mut widened, 0) {
            h.sites
                .push((pc as u32, Expr::Offset(Box::new(e), addr.off as u64)));
            h.widened.extend(widened);
        }
    }
    h.widened.sort_unstable();
    h.widened.dedup();
    h
}

struct Builder<'a> {
    f: &'a Func,
    p: &'a Plan,
    /// Each register's writes (pcs), and whether any is guarded.
    writes: Vec<Vec<u32>>,
    guarded: Vec<bool>,
    first_end: u32,
    /// The kernel's backward branches, and its loop where that is one.
    backs: usize,
    lp: Option<Loop>,
    trips: Option<Trips>,
}

impl Builder<'_> {
    /// Register `r`'s value as read at `at`, a `bits`-wide register; the
    /// extensions it goes through into `widened`.
    fn reg(&self, r: u32, at: u32, bits: u32, widened: &mut Vec<u32>, depth: u32) -> Option<Expr> {
        if depth > 12 {
            return None;
        }
        let ws = self.writes.get(r as usize)?;
        // (a write earlier in `at`'s block is the one it reads, in a loop
        // or not)
        let same = block_of(self.p, at);
        let local = ws.iter().any(|&w| w < at && block_of(self.p, w) == same);
        if let Some(l) = self.lp.filter(|l| l.inside(at) && !local) {
            if ws.iter().any(|&w| l.inside(w)) {
                return self.induction(r, at, &l, bits, widened, depth);
            }
        }
        let pc = self.reaching(r, at, false)?;
        self.value(pc, bits, widened, depth + 1)
    }

    /// `s` as read at `at`, a `bits`-wide operand.
    fn src(&self, s: Src, at: u32, bits: u32, w: &mut Vec<u32>, depth: u32) -> Option<Expr> {
        match s {
            Src::Reg(q) => self.reg(q, at, bits, w, depth),
            Src::Imm(k) if bits == 32 => Some(Expr::Imm(k as u32 as u64)),
            Src::Imm(k) => Some(Expr::Imm(k)),
            Src::Frame(_) => None,
        }
    }

    /// Register `r`'s value where the block before loop `l` falls into it.
    fn entry(&self, r: u32, l: &Loop, bits: u32, w: &mut Vec<u32>, depth: u32) -> Option<Expr> {
        let pc = self.reaching(r, l.head, true)?;
        self.value(pc, bits, w, depth + 1)
    }

    /// `r`, written in loop `l` once, by `add r, r, s` in its latch after
    /// `at` (inside it): its value on entry plus the trips before `at`'s
    /// times `s` (`s` the same every trip).
    fn induction(
        &self,
        r: u32,
        at: u32,
        l: &Loop,
        bits: u32,
        widened: &mut Vec<u32>,
        depth: u32,
    ) -> Option<Expr> {
        let trips = self.trips.as_ref()?;
        let inner: Vec<u32> = self.writes[r as usize]
            .iter()
            .copied()
            .filter(|&w| l.inside(w))
            .collect();
        let [u] = inner[..] else { return None };
        let inst = &self.f.code[u as usize];
        let Op::Int {
            op: IntOp::Add,
            t,
            d,
            a: Src::Reg(a),
            b,
        } = inst.op
        else {
            return None;
        };
        let int = !t.is_float() && !matches!(t, Ty::Pred | Ty::B128) && t.bits() == bits;
        let invariant = match b {
            Src::Reg(q) => !self.writes.get(q as usize)?.iter().any(|&w| l.inside(w)),
            _ => true,
        };
        if !(int && invariant && d == r && a == r && inst.guard == NONE) {
            return None;
        }
        // (the write in the latch, after `at`: each trip runs it once, after
        // `at`'s read, and every trip but the last goes through it)
        if !(l.latch..l.back).contains(&u) || at >= u {
            return None;
        }
        // (a step that differs between threads is not taken: `prepare`
        // would then take none of the kernel's sites)
        let step = self.src(b, u, bits, widened, depth + 1)?;
        if !step.uniform() {
            return None;
        }
        let start = self.entry(r, l, bits, widened, depth + 1)?;
        Some(Expr::Add(
            Box::new(start),
            Box::new(Expr::Trip(Box::new(trips.clone()), Box::new(step))),
        ))
    }

    /// The write whose value register `r` holds when read at `at` (or,
    /// with `entry`, where the block before the loop falls into it, whose
    /// first pc is then `at`): the last one before it in its basic block;
    /// else the last one in the block before the loop, read inside it;
    /// else the last one in the kernel's first basic block (which every
    /// thread runs whole before anything else). Never a guarded write,
    /// never where another write may reach `at`.
    fn reaching(&self, r: u32, at: u32, entry: bool) -> Option<u32> {
        let ws = self.writes.get(r as usize)?;
        let unguarded = |w: u32| (self.f.code[w as usize].guard == NONE).then_some(w);
        if !entry {
            let same = block_of(self.p, at);
            if let Some(&w) = ws
                .iter()
                .rev()
                .find(|&&w| w < at && block_of(self.p, w) == same)
            {
                return unguarded(w);
            }
        }
        let start = self.p.fresh_start && at >= self.first_end;
        let first = || {
            start
                .then(|| ws.iter().rev().find(|&&w| w < self.first_end))
                .flatten()
                .copied()
        };
        match self.lp {
            // (a read in the loop of a register it does not write, or on
            // entry: what reaches it is what reaches the end of the block
            // before, which every entry runs whole; the loop's writes reach
            // only its own reads, back through the loop)
            Some(l) if entry || l.inside(at) => {
                let pre = ws
                    .iter()
                    .rev()
                    .find(|&&w| w >= l.pre && w < l.head)
                    .copied();
                let w = pre.or_else(first)?;
                let killed = ws.iter().all(|&x| x <= w || x >= l.head);
                let inner = entry || ws.iter().all(|&x| !l.inside(x));
                (killed && inner).then(|| unguarded(w)).flatten()
            }
            // (a read outside the only loop, or no backward branch: no
            // write after it reaches it; the first block's last write
            // does, unless another comes between)
            _ if self.lp.is_some() || self.backs == 0 => {
                let w = first()?;
                let between = ws.iter().any(|&x| x > w && x < at);
                (!between).then(|| unguarded(w)).flatten()
            }
            // (else only a register written once, in the first block)
            _ => {
                let [w] = ws[..] else { return None };
                let once = start && !self.guarded[r as usize] && w < self.first_end;
                once.then_some(w)
            }
        }
    }

    /// The value written at `pc`, a `bits`-wide register.
    fn value(&self, pc: u32, bits: u32, widened: &mut Vec<u32>, d: u32) -> Option<Expr> {
        let src = |s: Src, bits: u32, w: &mut Vec<u32>| self.src(s, pc, bits, w, d);
        let int = |t: Ty| !t.is_float() && !matches!(t, Ty::Pred | Ty::B128) && t.bits() == bits;
        let op = &self.f.code[pc as usize].op;
        let e = match *op {
            Op::Special { r, .. } if bits == 32 => match r {
                SReg::Tid(_) | SReg::Ntid(_) | SReg::Ctaid(_) | SReg::Nctaid(_) => Expr::Special(r),
                _ => return None,
            },
            Op::Ld {
                addr, size, n: 1, ..
            } if addr.sp == Sp::Param && size * 8 == bits && matches!(addr.base, Src::Imm(_)) => {
                let Src::Imm(b) = addr.base else { return None };
                Expr::Param {
                    at: b.wrapping_add(addr.off as u64),
                    size,
                }
            }
            Op::Mov { a, mask, .. }
                if mask == u64::MAX || bits == 32 && mask == u32::MAX as u64 =>
            {
                src(a, bits, widened)?
            }
            Op::Int { op, t, a, b, .. } if int(t) => {
                let x = src(a, bits, widened)?;
                match op {
                    IntOp::Add => Expr::Add(Box::new(x), Box::new(src(b, bits, widened)?)),
                    IntOp::Sub => Expr::Sub(Box::new(x), Box::new(src(b, bits, widened)?)),
                    IntOp::MulLo => Expr::Mul(Box::new(x), Box::new(src(b, bits, widened)?)),
                    IntOp::Shl => match b {
                        Src::Imm(k) if k < bits as u64 => Expr::Shl(Box::new(x), k as u32),
                        _ => return None,
                    },
                    _ => return None,
                }
            }
            Op::Int {
                op: IntOp::MulWide,
                t,
                a,
                b,
                ..
            } if bits == 64 && !t.is_float() && t.bits() == 32 => {
                let signed = t.signed();
                let ext = |e: Expr| Expr::Ext {
                    a: Box::new(e),
                    signed,
                };
                let x = ext(src(a, 32, widened)?);
                let y = ext(src(b, 32, widened)?);
                widened.push(pc);
                Expr::Mul(Box::new(x), Box::new(y))
            }
            Op::Tern {
                op: TernOp::MadLo,
                t,
                a,
                b,
                c,
                ..
            } if int(t) => Expr::Add(
                Box::new(Expr::Mul(
                    Box::new(src(a, bits, widened)?),
                    Box::new(src(b, bits, widened)?),
                )),
                Box::new(src(c, bits, widened)?),
            ),
            Op::Cvt { a, dt, st, .. }
                if bits == 64
                    && dt.bits() == 64
                    && st.bits() == 32
                    && !dt.is_float()
                    && !st.is_float()
                    && !matches!(dt, Ty::Pred | Ty::B128)
                    && !matches!(st, Ty::Pred | Ty::B128) =>
            {
                widened.push(pc);
                Expr::Ext {
                    a: Box::new(src(a, 32, widened)?),
                    signed: st.signed(),
                }
            }
            Op::Cvta {
                a, sp: Sp::Global, ..
            } if bits == 64 => src(a, 64, widened)?,
            _ => return None,
        };
        Some(e)
    }
}

/// The basic block holding `pc`.
fn block_of(p: &Plan, pc: u32) -> usize {
    p.starts.partition_point(|&s| s <= pc)
}

impl Hoist {
    /// Whether every store of `ops` is a hoisted access that `final_stores`
    /// holds (logged by no group: the copy logs nothing, see `restart`).
    pub(super) fn unlogged(&self, ops: &[Op], final_stores: &[u32]) -> bool {
        ops.iter().enumerate().all(|(pc, op)| {
            let pc = pc as u32;
            !matches!(op, Op::St { .. })
                || final_stores.contains(&pc) && self.sites.iter().any(|(at, _)| *at == pc)
        })
    }
}

/// A launch's values: `%ntid`, `%nctaid`, and its parameters
/// (`params_len` bytes in words).
pub(super) struct LaunchValues<'p> {
    pub ntid: [u32; 3],
    pub nctaid: [u32; 3],
    pub params: &'p [u64],
    pub params_len: u64,
}

/// A value of a launch as a function of its block and thread: `c` plus
/// `a` times `%ctaid` plus `b` times `%tid` plus `t` times the loop's
/// trips so far, 0 to `n` less 1 (`n` 0: no trips in it) (exact, no
/// wrapping).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Lin {
    c: i128,
    a: [i128; 3],
    b: [i128; 3],
    t: i128,
    n: i128,
}

impl Lin {
    fn constant(c: i128) -> Lin {
        Lin {
            c,
            ..Lin::default()
        }
    }

    fn is_constant(&self) -> bool {
        self.a == [0; 3] && self.b == [0; 3] && self.t == 0
    }

    fn zip(self, o: Lin, f: impl Fn(i128, i128) -> Option<i128>) -> Option<Lin> {
        let mut r = Lin::constant(f(self.c, o.c)?);
        r.t = f(self.t, o.t)?;
        // (one loop: both its trips, where either has any)
        r.n = match (self.n, o.n) {
            (0, n) | (n, 0) => n,
            (n, m) if n == m => n,
            _ => return None,
        };
        for k in 0..3 {
            r.a[k] = f(self.a[k], o.a[k])?;
            r.b[k] = f(self.b[k], o.b[k])?;
        }
        Some(r)
    }

    fn scale(self, m: i128) -> Option<Lin> {
        let n = self.n;
        let mut r = self.zip(Lin::default(), |x, _| x.checked_mul(m))?;
        r.n = n;
        Some(r)
    }
}

/// A value's range in a launch, block by block: `c + a · %ctaid` plus
/// from `lo` to `hi` over the block's threads.
#[derive(Debug, Clone, Copy)]
struct Ranged {
    c: i128,
    a: [i64; 3],
    lo: i128,
    hi: i128,
}

impl Ranged {
    fn of(l: Lin, ntid: [u32; 3]) -> Option<Ranged> {
        let (mut lo, mut hi) = (0i128, 0i128);
        for (b, n) in l.b.iter().zip(ntid) {
            let far = b.checked_mul(n.max(1) as i128 - 1)?;
            lo = lo.checked_add(far.min(0))?;
            hi = hi.checked_add(far.max(0))?;
        }
        let far = l.t.checked_mul((l.n - 1).max(0))?;
        lo = lo.checked_add(far.min(0))?;
        hi = hi.checked_add(far.max(0))?;
        // (`at` cannot overflow: the steps below 2^62, the rest below
        // 2^96, any block's value below 2^100; else none is taken)
        let below = |x: i128, bits: u32| x.unsigned_abs() < 1u128 << bits;
        let small =
            l.a.iter().all(|&a| below(a, 62)) && [l.c, lo, hi].iter().all(|&x| below(x, 96));
        small.then(|| Ranged {
            c: l.c,
            a: l.a.map(|a| a as i64),
            lo,
            hi,
        })
    }

    /// The least and greatest value in block `ctaid`.
    fn at(&self, ctaid: [u32; 3]) -> (i128, i128) {
        let step = |k: usize| i128::from(self.a[k] * i64::from(ctaid[k]));
        let v = self.c + step(0) + step(1) + step(2);
        (v + self.lo, v + self.hi)
    }
}

/// A kernel's hoisted sites made ready for one launch (a worker's): each
/// site's first address, and the values its extensions need in range.
pub(super) struct Prepared {
    sites: Vec<Ranged>,
    /// How many of them span a loop's trips.
    looped: u64,
    bounds: Vec<(Ranged, i128, i128)>,
    /// The allocation each site found last: base, length, host pointer
    /// less base (none at first).
    last: Vec<(u64, u64, u64)>,
}

/// `sites` (each one's first address) for a launch whose values are
/// `v`; `None` where an address is not `c + a · %ctaid + b · %tid` with
/// every address of a block's threads a multiple of 4.
pub(super) fn prepare(sites: &[Expr], v: &LaunchValues<'_>) -> Option<Prepared> {
    let mut bounds = Vec::new();
    let mut out = Vec::new();
    let mut looped = 0;
    for e in sites {
        let l = lin(e, v, &mut bounds)?;
        looped += u64::from(l.n > 0);
        // (every block's addresses share the residue of its first: the
        // steps between threads and blocks are multiples of 4)
        let steps = (0..3).all(|k| l.a[k] % 4 == 0 && l.b[k] % 4 == 0) && l.t % 4 == 0;
        if !steps || l.c % 4 != 0 {
            return None;
        }
        out.push(Ranged::of(l, v.ntid)?);
    }
    let bounds = bounds
        .into_iter()
        .map(|(l, min, max)| Some((Ranged::of(l, v.ntid)?, min, max)))
        .collect::<Option<_>>()?;
    Some(Prepared {
        last: vec![(0, 0, 0); out.len()],
        sites: out,
        looped,
        bounds,
    })
}

/// `e` as a [`Lin`] in a launch whose values are `v`, each extension's
/// operand with the range it must keep into `bounds`.
fn lin(e: &Expr, v: &LaunchValues<'_>, bounds: &mut Vec<(Lin, i128, i128)>) -> Option<Lin> {
    Some(match e {
        Expr::Imm(k) => Lin::constant(*k as i128),
        Expr::Param { at, size } => {
            if at.checked_add(*size as u64)? > v.params_len {
                return None;
            }
            let mut w = 0u64;
            for k in 0..*size as u64 {
                let i = at + k;
                let byte = v.params.get(usize::try_from(i / 8).ok()?)? >> (8 * (i % 8)) & 0xff;
                w |= byte << (8 * k);
            }
            Lin::constant(w as i128)
        }
        Expr::Special(s) => match *s {
            SReg::Tid(k) => {
                let mut l = Lin::default();
                *l.b.get_mut(k as usize)? = 1;
                l
            }
            SReg::Ctaid(k) => {
                let mut l = Lin::default();
                *l.a.get_mut(k as usize)? = 1;
                l
            }
            SReg::Ntid(k) => Lin::constant(*v.ntid.get(k as usize)? as i128),
            SReg::Nctaid(k) => Lin::constant(*v.nctaid.get(k as usize)? as i128),
            _ => return None,
        },
        Expr::Add(a, b) => lin(a, v, bounds)?.zip(lin(b, v, bounds)?, |x, y| x.checked_add(y))?,
        Expr::Sub(a, b) => lin(a, v, bounds)?.zip(lin(b, v, bounds)?, |x, y| x.checked_sub(y))?,
        Expr::Mul(a, b) => {
            let (x, y) = (lin(a, v, bounds)?, lin(b, v, bounds)?);
            match (x.is_constant(), y.is_constant()) {
                (true, _) => y.scale(x.c)?,
                (_, true) => x.scale(y.c)?,
                _ => return None,
            }
        }
        Expr::Shl(a, k) => lin(a, v, bounds)?.scale(1i128 << k)?,
        Expr::Ext { a, signed } => {
            // the register holds the value modulo 2^32: its extension is
            // the value itself only inside the extension's range
            let x = lin(a, v, bounds)?;
            let (min, max) = if *signed {
                (i32::MIN as i128, i32::MAX as i128)
            } else {
                (0, u32::MAX as i128)
            };
            // (the sites' chains mostly share their extensions)
            if !bounds.contains(&(x, min, max)) {
                bounds.push((x, min, max));
            }
            x
        }
        Expr::Trip(trips, step) => {
            let s = lin(step, v, bounds)?;
            let n = trips.count(v, bounds)?;
            if !s.is_constant() {
                return None;
            }
            Lin {
                t: s.c,
                n,
                ..Lin::default()
            }
        }
        Expr::Offset(a, k) => {
            let x = lin(a, v, bounds)?;
            Lin {
                c: x.c.checked_add(*k as i64 as i128)?,
                ..x
            }
        }
    })
}

impl Expr {
    /// Whether the value is the same in every thread of a launch.
    fn uniform(&self) -> bool {
        match self {
            Expr::Imm(_) | Expr::Param { .. } => true,
            Expr::Special(s) => matches!(s, SReg::Ntid(_) | SReg::Nctaid(_)),
            Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) => a.uniform() && b.uniform(),
            Expr::Shl(a, _) | Expr::Ext { a, .. } | Expr::Offset(a, _) => a.uniform(),
            Expr::Trip(..) => false,
        }
    }
}

impl Trips {
    /// How many trips the loop makes in a launch whose values are `v`
    /// (at least 1: it tests after each), where its counter's start and
    /// bound are the launch's constants and it never wraps.
    fn count(&self, v: &LaunchValues<'_>, bounds: &mut Vec<(Lin, i128, i128)>) -> Option<i128> {
        let (start, bound) = (lin(&self.start, v, bounds)?, lin(&self.bound, v, bounds)?);
        if !start.is_constant() || !bound.is_constant() {
            return None;
        }
        // (the registers hold the values modulo 2^32, compared as `signed`)
        let word = |x: i128| {
            let w = x.rem_euclid(1 << 32);
            if self.signed && w >= 1 << 31 {
                w - (1 << 32)
            } else {
                w
            }
        };
        let (s, b, k) = (word(start.c), word(bound.c), i128::from(self.step));
        // trip j goes on while s + (j + 1)·k < b
        let n = ((b - s + k - 1).div_euclid(k)).max(1);
        let max = if self.signed {
            i128::from(i32::MAX)
        } else {
            i128::from(u32::MAX)
        };
        // (the counter's last value, s + n·k, must not wrap)
        (s + n * k <= max).then_some(n)
    }
}

impl Prepared {
    /// How many sites span a loop's trips.
    pub(super) fn looped(&self) -> u64 {
        self.looped
    }

    /// Whether in block `ctaid` every extension keeps its range and every
    /// site spans only bytes of one allocation; where all do, `deltas`
    /// holds each site's host pointer less its device address, which the
    /// lane kernel's unchecked copy adds to its addresses.
    pub(super) fn block_check(
        &mut self,
        ctaid: [u32; 3],
        mem: &MemView<'_>,
        deltas: &mut [u64; MAX_HOISTED],
    ) -> bool {
        for (r, min, max) in &self.bounds {
            let (lo, hi) = r.at(ctaid);
            if lo < *min || hi > *max {
                return false;
            }
        }
        for ((r, last), delta) in self.sites.iter().zip(&mut self.last).zip(deltas) {
            // (every lane of the block's groups is a thread of the block,
            // at its own address, which lies in `lo..=hi`: a group's 16
            // bytes from its first lane's end 4 bytes past its last lane's)
            let (lo, hi) = r.at(ctaid);
            let end = hi + 4;
            if lo < 0 || end > u64::MAX as i128 {
                return false;
            }
            let (lo, end) = (lo as u64, end as u64);
            // (mostly the allocation the block before found)
            let (base, len, _) = *last;
            if !(base <= lo && end - base <= len) {
                match mem.resolve(lo, end - lo) {
                    Some((base, len, ptr)) => {
                        *last = (base, len, (ptr as u64).wrapping_sub(base));
                    }
                    None => return false,
                }
            }
            *delta = last.2;
        }
        true
    }
}
