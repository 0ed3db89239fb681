//! A kernel's direct calls to `.func`s inlined for the compiler: each callee's
//! body once per call site, its registers and frame after the caller's, the
//! argument and return copies as uncounted instructions (the interpreter
//! counts a call, its callee's instructions and their `ret`, no more).

use crate::ir::{Address, ArgLoc, Func, Inst, MemOrder, Module, Op, Sp, Src, NONE};
use std::borrow::Cow;

/// A bit of an instruction's line: the inliner added it, the interpreter
/// would not count it (its other bits are 0: frame copies in bounds,
/// moves and branches are never the place of a fault).
pub(super) const UNCOUNTED: u32 = 1 << 31;

/// A bit of an instruction's line: a call's branch into its callee, where
/// the interpreter checks the block's budget as at a backward branch.
pub(super) const CHECKS: u32 = 1 << 30;

/// Calls nested deeper than this stay on the interpreter.
const MAX_DEPTH: usize = 16;

/// Registers and local memory of the inlined frames together stay below
/// the interpreter's least stack (so that no call of them overflows it).
const MAX_FRAME_BYTES: u64 = 256 << 10;

/// Kernel `kernel` of `m` with its calls inlined (itself when it calls
/// nothing), or why the compiler leaves it to the interpreter.
pub(super) fn flatten(m: &Module, kernel: u32) -> Result<Cow<'_, Func>, String> {
    let f = &m.funcs[kernel as usize];
    if !f.code.iter().any(|i| matches!(i.op, Op::Call(_))) {
        return Ok(Cow::Borrowed(f));
    }
    let mut out = Inliner {
        m,
        code: Vec::new(),
        nregs: f.nregs,
        frame_bytes: f.frame_bytes,
    };
    out.body(kernel, 0, 0, None, &mut vec![kernel])?;
    if (out.nregs as u64 + out.frame_bytes as u64 / 8) * 8 > MAX_FRAME_BYTES {
        return Err("inlined calls need too large a frame".into());
    }
    Ok(Cow::Owned(Func {
        name: f.name.clone(),
        code: out.code,
        nregs: out.nregs,
        frame_bytes: out.frame_bytes,
        uses_volatile: f.uses_volatile,
        params: f.params.clone(),
        rets: f.rets.clone(),
    }))
}

/// Where a callee's `ret` goes: the caller's pc after the call, the call's
/// return locations, the caller's registers and frame.
struct Return {
    back: u32,
    rets: Vec<ArgLoc>,
    rbase: u32,
    lbase: u32,
}

struct Inliner<'m> {
    m: &'m Module,
    code: Vec<Inst>,
    nregs: u32,
    frame_bytes: u32,
}

impl Inliner<'_> {
    /// Appends function `fi`'s body (registers from `rbase`, frame from
    /// `lbase`), then each callee's; `ret` returns as `to` says (`None`:
    /// the kernel's own `ret`).
    fn body(
        &mut self,
        fi: u32,
        rbase: u32,
        lbase: u32,
        to: Option<&Return>,
        stack: &mut Vec<u32>,
    ) -> Result<(), String> {
        let f = &self.m.funcs[fi as usize];
        let start = self.code.len() as u32;
        // where each of the function's instructions goes
        let mut pos = Vec::with_capacity(f.code.len() + 1);
        let mut at = start;
        for inst in &f.code {
            pos.push(at);
            at += match &inst.op {
                Op::Call(info) => self.call_len(info)? + 1,
                _ => 1,
            };
        }
        let ret_block = at;
        pos.push(ret_block);
        let mut calls = Vec::new();
        for (i, inst) in f.code.iter().enumerate() {
            match &inst.op {
                Op::Call(info) => {
                    if inst.guard != NONE {
                        return Err(format!("line {}: a guarded call", inst.line));
                    }
                    if info.target.is_some() {
                        return Err(format!("line {}: an indirect call", inst.line));
                    }
                    if stack.contains(&info.func) || stack.len() >= MAX_DEPTH {
                        return Err(format!("line {}: a recursive call", inst.line));
                    }
                    let callee = &self.m.funcs[info.func as usize];
                    let c_rbase = self.nregs;
                    self.nregs += callee.nregs + 1;
                    let c_lbase = (lbase + f.frame_bytes).div_ceil(16) * 16;
                    self.frame_bytes = self.frame_bytes.max(c_lbase + callee.frame_bytes);
                    let scratch = c_rbase + callee.nregs;
                    for (arg, &(poff, psize)) in info.args.iter().zip(&callee.params) {
                        match *arg {
                            ArgLoc::Frame { off, size } => {
                                self.copy(lbase + off, c_lbase + poff, size.min(psize), scratch)
                            }
                            ArgLoc::Val { src, size } => {
                                let v = remap_src(src, rbase, lbase);
                                self.put(v, c_lbase + poff, size.min(psize))?;
                            }
                        }
                    }
                    // the callee's registers start at 0 at every call
                    for r in 0..callee.nregs {
                        self.push(Op::Mov {
                            d: c_rbase + r,
                            a: Src::Imm(0),
                            mask: u64::MAX,
                        });
                    }
                    // (padded to the length `call_len` reserved)
                    let end = pos[i] + self.call_len(info)?;
                    while (self.code.len() as u32) < end {
                        self.push(Op::Nop);
                    }
                    calls.push((self.code.len(), info.clone(), c_rbase, c_lbase));
                    // the call itself: its branch to the callee, counted
                    self.code.push(Inst {
                        guard: NONE,
                        guard_neg: false,
                        op: Op::Bra { target: 0 },
                        line: inst.line | CHECKS,
                    });
                }
                op => {
                    let op = match op {
                        Op::Ret if to.is_some() => Op::Bra { target: ret_block },
                        Op::Bra { target } => Op::Bra {
                            target: pos[*target as usize],
                        },
                        op => remap(op, rbase, lbase)?,
                    };
                    self.code.push(Inst {
                        guard: if inst.guard == NONE {
                            NONE
                        } else {
                            rbase + inst.guard
                        },
                        guard_neg: inst.guard_neg,
                        op,
                        line: inst.line,
                    });
                }
            }
        }
        if let Some(to) = to {
            // `ret`: the return values to the caller, back after the call
            let scratch = rbase + f.nregs;
            for (ret, &(roff, rsize)) in to.rets.iter().zip(&f.rets) {
                match *ret {
                    ArgLoc::Frame { off, size } => {
                        self.copy(lbase + roff, to.lbase + off, size.min(rsize), scratch)
                    }
                    ArgLoc::Val {
                        src: Src::Reg(r),
                        size,
                    } => {
                        let size = size.min(rsize);
                        if !matches!(size, 1 | 2 | 4 | 8) {
                            return Err(format!("a return value of {size} bytes"));
                        }
                        self.push(load(to.rbase + r, lbase + roff, size));
                    }
                    ArgLoc::Val { .. } => {}
                }
            }
            self.push(Op::Bra { target: to.back });
        }
        for (at, info, c_rbase, c_lbase) in calls {
            let entry = self.code.len() as u32;
            self.code[at].op = Op::Bra { target: entry };
            let ret = Return {
                back: at as u32 + 1,
                rets: info.rets.clone(),
                rbase,
                lbase,
            };
            stack.push(info.func);
            self.body(info.func, c_rbase, c_lbase, Some(&ret), stack)?;
            stack.pop();
        }
        Ok(())
    }

    /// Instructions a call's argument copies and register clearing take at
    /// most (a frame copy at worst byte by byte).
    fn call_len(&self, info: &crate::ir::CallInfo) -> Result<u32, String> {
        if info.target.is_some() {
            return Err("an indirect call".into());
        }
        let callee = self
            .m
            .funcs
            .get(info.func as usize)
            .ok_or("a call to an unknown function")?;
        let mut n = callee.nregs;
        for (arg, &(_, psize)) in info.args.iter().zip(&callee.params) {
            n += match *arg {
                ArgLoc::Frame { size, .. } => 2 * chunks(size.min(psize)),
                ArgLoc::Val { .. } => 1,
            };
        }
        Ok(n)
    }

    /// An uncounted instruction.
    fn push(&mut self, op: Op) {
        self.code.push(Inst {
            guard: NONE,
            guard_neg: false,
            op,
            line: UNCOUNTED,
        });
    }

    /// Copies `n` bytes of the frame from `from` to `to` through `scratch`.
    fn copy(&mut self, from: u32, to: u32, n: u32, scratch: u32) {
        let mut done = 0;
        while done < n {
            let size = piece(from + done, to + done, n - done);
            self.push(load(scratch, from + done, size));
            self.push(store(Src::Reg(scratch), to + done, size));
            done += size;
        }
    }

    /// Stores the low `n` bytes of `v` at frame offset `to` (one aligned
    /// access of 1, 2, 4 or 8 bytes).
    fn put(&mut self, v: Src, to: u32, n: u32) -> Result<(), String> {
        if !matches!(n, 1 | 2 | 4 | 8) || !to.is_multiple_of(n) {
            return Err(format!("an argument of {n} bytes at frame offset {to}"));
        }
        self.push(store(v, to, n));
        Ok(())
    }
}

/// The widest access (8, 4, 2 or 1 bytes) aligned at `a` and `b` that
/// fits `left`.
fn piece(a: u32, b: u32, left: u32) -> u32 {
    [8, 4, 2, 1]
        .into_iter()
        .find(|&s| a.is_multiple_of(s) && b.is_multiple_of(s) && s <= left)
        .unwrap_or(1)
}

/// Pieces a copy of `n` bytes takes at most (byte by byte).
fn chunks(n: u32) -> u32 {
    n
}

fn local(off: u32) -> Address {
    Address {
        sp: Sp::Local,
        base: Src::Frame(off),
        off: 0,
    }
}

fn load(d: u32, from: u32, size: u32) -> Op {
    Op::Ld {
        addr: local(from),
        size,
        n: 1,
        ds: [d, NONE, NONE, NONE],
        sext: false,
        order: MemOrder::Plain,
    }
}

fn store(v: Src, to: u32, size: u32) -> Op {
    Op::St {
        n: 1,
        size,
        vals: [v, Src::Imm(0), Src::Imm(0), Src::Imm(0)],
        addr: local(to),
        order: MemOrder::Plain,
    }
}

fn remap_src(s: Src, rbase: u32, lbase: u32) -> Src {
    match s {
        Src::Reg(r) => Src::Reg(rbase + r),
        Src::Frame(o) => Src::Frame(lbase + o),
        s => s,
    }
}

/// `op` of a function whose registers start at `rbase` and frame at
/// `lbase`; the ops the compiler takes (others stay interpreted).
fn remap(op: &Op, rbase: u32, lbase: u32) -> Result<Op, String> {
    if rbase == 0 && lbase == 0 {
        return Ok(op.clone());
    }
    let s = |x: Src| remap_src(x, rbase, lbase);
    let r = |d: u32| if d == NONE { NONE } else { rbase + d };
    let a = |x: Address| Address {
        base: s(x.base),
        ..x
    };
    let arg = |l: ArgLoc| match l {
        ArgLoc::Frame { off, size } => ArgLoc::Frame {
            off: lbase + off,
            size,
        },
        ArgLoc::Val { src, size } => ArgLoc::Val { src: s(src), size },
    };
    let mut op = op.clone();
    match &mut op {
        Op::Mov { d, a: x, .. } | Op::Un { d, a: x, .. } | Op::Cvt { d, a: x, .. } => {
            (*d, *x) = (r(*d), s(*x))
        }
        Op::Testp { d, a: x, .. } | Op::Cvta { d, a: x, .. } | Op::Isspacep { d, a: x, .. } => {
            (*d, *x) = (r(*d), s(*x))
        }
        Op::Int { d, a: x, b, .. } | Op::Float { d, a: x, b, .. } | Op::Set { d, a: x, b, .. } => {
            (*d, *x, *b) = (r(*d), s(*x), s(*b))
        }
        Op::Tern { d, a: x, b, c, .. }
        | Op::Prmt { d, a: x, b, c, .. }
        | Op::Lop3 { d, a: x, b, c, .. } => (*d, *x, *b, *c) = (r(*d), s(*x), s(*b), s(*c)),
        Op::Bfi {
            d, a: x, b, c, e, ..
        } => (*d, *x, *b, *c, *e) = (r(*d), s(*x), s(*b), s(*c), s(*e)),
        Op::Relu { d, .. } | Op::Special { d, .. } | Op::Activemask { d } => *d = r(*d),
        Op::Setp {
            d, d2, a: x, b, c, ..
        } => (*d, *d2, *x, *b, *c) = (r(*d), r(*d2), s(*x), s(*b), s(*c)),
        Op::Pack { d, parts, .. } => {
            *d = r(*d);
            parts.iter_mut().for_each(|p| *p = s(*p));
        }
        Op::Unpack { ds, a: x, .. } => {
            *x = s(*x);
            ds.iter_mut().for_each(|d| *d = r(*d));
        }
        Op::Carry {
            d, a: x, b, c, cc, ..
        } => (*d, *x, *b, *c, *cc) = (r(*d), s(*x), s(*b), s(*c), r(*cc)),
        Op::Ld { addr, ds, .. } => {
            *addr = a(*addr);
            ds.iter_mut().for_each(|d| *d = r(*d));
        }
        Op::St { vals, addr, .. } => {
            *addr = a(*addr);
            vals.iter_mut().for_each(|v| *v = s(*v));
        }
        Op::Atom { addr, d, b, c, .. } => (*addr, *d, *b, *c) = (a(*addr), r(*d), s(*b), s(*c)),
        Op::CpAsync {
            dst, src, src_size, ..
        } => (*dst, *src, *src_size) = (s(*dst), s(*src), s(*src_size)),
        Op::Printf { fmt, args, ret } => {
            (*fmt, *args) = (arg(*fmt), arg(*args));
            *ret = ret.map(arg);
        }
        Op::AssertFail(args) => args.iter_mut().for_each(|x| *x = arg(*x)),
        Op::Malloc { size, ret } => {
            *size = arg(*size);
            *ret = ret.map(arg);
        }
        Op::Free { ptr } => *ptr = arg(*ptr),
        Op::Bar {
            id, count, d, p, ..
        } => (*id, *count, *d, *p) = (s(*id), s(*count), r(*d), s(*p)),
        Op::WarpSync { mask } => *mask = s(*mask),
        Op::Shfl {
            d,
            dp,
            a: x,
            b,
            c,
            mask,
            ..
        } => (*d, *dp, *x, *b, *c, *mask) = (r(*d), r(*dp), s(*x), s(*b), s(*c), s(*mask)),
        Op::Vote { d, a: x, mask, .. } | Op::Redux { d, a: x, mask, .. } => {
            (*d, *x, *mask) = (r(*d), s(*x), s(*mask))
        }
        Op::Match {
            d, dp, a: x, mask, ..
        } => (*d, *dp, *x, *mask) = (r(*d), r(*dp), s(*x), s(*mask)),
        Op::Bra { .. } | Op::Ret | Op::Exit | Op::Trap(_) | Op::Nop => {}
        op => {
            return Err(format!("{op:?} in a called function")
                .chars()
                .take(60)
                .collect())
        }
    }
    Ok(op)
}
