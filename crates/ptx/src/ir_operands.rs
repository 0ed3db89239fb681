//! The operands of each IR op: the values it reads and the registers it
//! writes, for the checks of `validate` (and any pass that needs liveness).

use crate::ir::{ArgLoc, Op, Src, NONE};

/// The pattern of the ops `Variant`s, binding each one's field `field`:
/// `with_field!(a in Mov, Un)` is `Op::Mov { a, .. } | Op::Un { a, .. }`.
macro_rules! with_field {
    ($field:ident in $($variant:ident),+ $(,)?) => {
        $(Op::$variant { $field, .. })|+
    };
}

impl Op {
    /// The registers this op reads, in order, not counting the guard.
    pub(crate) fn src_regs(&self) -> Vec<u32> {
        let mut regs = Vec::new();
        self.for_each_src(|s| {
            if let Src::Reg(r) = s {
                regs.push(r)
            }
        });
        regs
    }

    /// Calls `f` with every value this op reads (registers, immediates and
    /// frame addresses), not counting the guard.
    pub(crate) fn for_each_src(&self, mut f: impl FnMut(Src)) {
        macro_rules! read {
            ($($s:expr),*) => {{ $( f(*$s); )* }};
        }
        let arg = |l: &ArgLoc, f: &mut dyn FnMut(Src)| {
            if let ArgLoc::Val { src, .. } = *l {
                f(src)
            }
        };
        match self {
            with_field!(a in Mov, Un, Testp, Cvt, Unpack, Cvta, Isspacep) => read!(a),
            Op::Int { a, b, .. } | Op::Float { a, b, .. } | Op::Set { a, b, .. } => read!(a, b),
            Op::Tern { a, b, c, .. }
            | Op::Prmt { a, b, c, .. }
            | Op::Lop3 { a, b, c, .. }
            | Op::Setp { a, b, c, .. } => read!(a, b, c),
            Op::Bfi { a, b, c, e, .. } => read!(a, b, c, e),
            Op::Relu { d, .. } => f(Src::Reg(*d)),
            Op::Pack { parts, .. } => parts.iter().copied().for_each(f),
            Op::Ld { addr, .. } | Op::Ldmatrix { addr, .. } => read!(&addr.base),
            Op::St { n, vals, addr, .. } => {
                vals.iter().take(*n as usize).copied().for_each(&mut f);
                read!(&addr.base)
            }
            Op::Atom { addr, b, c, .. } => read!(&addr.base, b, c),
            Op::Call(info) => {
                if let Some(t) = info.target {
                    f(t)
                }
                for a in &info.args {
                    arg(a, &mut f)
                }
            }
            Op::Printf { fmt, args, .. } => {
                arg(fmt, &mut f);
                arg(args, &mut f)
            }
            Op::AssertFail(args) => args.iter().for_each(|a| arg(a, &mut f)),
            Op::Malloc { size: a, .. } | Op::Free { ptr: a } => arg(a, &mut f),
            Op::Cdp(c) => c.args.iter().for_each(|a| arg(a, &mut f)),
            Op::Bar { id, count, p, .. } => read!(id, count, p),
            Op::WarpSync { mask } => read!(mask),
            Op::Shfl { a, b, c, mask, .. } => read!(a, b, c, mask),
            Op::Vote { a, mask, .. } | Op::Match { a, mask, .. } | Op::Redux { a, mask, .. } => {
                read!(a, mask)
            }
            Op::Carry {
                a, b, c, cin, cc, ..
            } => {
                read!(a, b, c);
                if *cin {
                    f(Src::Reg(*cc))
                }
            }
            Op::CpAsync {
                dst, src, src_size, ..
            } => read!(dst, src, src_size),
            Op::Mbarrier { addr, a, .. } => read!(&addr.base, a),
            Op::WmmaLoad { tile, .. } => read!(&tile.addr.base, &tile.stride),
            Op::WmmaStore { tile, vals } => {
                vals.iter().copied().for_each(&mut f);
                read!(&tile.addr.base, &tile.stride)
            }
            Op::Mma { mma, .. } | Op::WmmaMma { mma } => {
                mma.src.iter().flatten().copied().for_each(f)
            }
            Op::Sleep { ns } => f(*ns),
            Op::Special { .. }
            | Op::Bra { .. }
            | Op::Ret
            | Op::Exit
            | Op::Trap(_)
            | Op::Activemask { .. }
            | Op::WarpStep
            | Op::Nop => {}
        }
    }

    /// Calls `f` with every register this op writes; optional destinations
    /// left as `NONE` are skipped.
    pub(crate) fn for_each_dst(&self, mut f: impl FnMut(u32)) {
        let opt = |d: u32, f: &mut dyn FnMut(u32)| {
            if d != NONE {
                f(d)
            }
        };
        let ret = |l: &ArgLoc, f: &mut dyn FnMut(u32)| {
            if let ArgLoc::Val {
                src: Src::Reg(r), ..
            } = *l
            {
                f(r)
            }
        };
        match self {
            with_field!(
                d in Mov, Int, Float, Un, Tern, Bfi, Relu, Prmt, Lop3, Set, Testp, Cvt, Pack, Cvta,
                Isspacep, Special, Vote, Redux, Activemask,
            ) => f(*d),
            Op::Setp { d, d2: e, .. } | Op::Shfl { d, dp: e, .. } | Op::Match { d, dp: e, .. } => {
                f(*d);
                opt(*e, &mut f)
            }
            Op::Atom { d, .. } | Op::Bar { d, .. } | Op::Mbarrier { d, .. } => opt(*d, &mut f),
            Op::Unpack { ds, .. } | Op::WmmaLoad { ds, .. } | Op::Ldmatrix { ds, .. } => {
                ds.iter().copied().for_each(f)
            }
            Op::Mma { mma, .. } | Op::WmmaMma { mma } => mma.d.iter().copied().for_each(f),
            Op::Ld { n, ds, .. } => ds.iter().take(*n as usize).copied().for_each(f),
            Op::Call(info) => {
                for r in &info.rets {
                    ret(r, &mut f)
                }
            }
            Op::Printf { ret: Some(r), .. } | Op::Malloc { ret: Some(r), .. } => ret(r, &mut f),
            Op::Cdp(c) => c.ret.iter().for_each(|r| ret(r, &mut f)),
            Op::Carry { d, cout, cc, .. } => {
                f(*d);
                if *cout {
                    f(*cc)
                }
            }
            Op::St { .. }
            | Op::Printf { ret: None, .. }
            | Op::Malloc { ret: None, .. }
            | Op::Free { .. }
            | Op::Bra { .. }
            | Op::Ret
            | Op::Exit
            | Op::Trap(_)
            | Op::AssertFail(_)
            | Op::WarpSync { .. }
            | Op::CpAsync { .. }
            | Op::WmmaStore { .. }
            | Op::Sleep { .. }
            | Op::WarpStep
            | Op::Nop => {}
        }
    }
}
