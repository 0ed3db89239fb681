//! What a well-formed lowered module is, as one check both sides of the
//! boundary run: lowering before it hands a module out, the interpreter
//! before it first runs one.

use crate::ir::{ArgLoc, Func, Inst, Module, Op, SReg, Src, UnOp, MAX_FRAME_BYTES, MAX_REGS, NONE};
use std::fmt;

/// Where and how a lowered module breaks the contract of [`check_module`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed {
    /// The function, and the instruction index and PTX line when the fault
    /// is in one instruction.
    pub func: String,
    pub at: Option<(u32, u32)>,
    pub what: String,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some((pc, line)) => write!(
                f,
                "function `{}`, instruction {pc} (line {line}): {}",
                self.func, self.what
            ),
            None => write!(f, "function `{}`: {}", self.func, self.what),
        }
    }
}

/// Checks `m` against the contract of a well-formed lowered module:
/// - every kernel index names a function, and kernels take no frame
///   parameters (theirs live in the parameter buffer);
/// - dynamic shared memory starts 16-byte aligned;
/// - every function has 1..=`MAX_REGS` registers, a frame of at most
///   `MAX_FRAME_BYTES` in 16-byte units holding its parameter and return
///   slots, and code that ends in an unguarded `exit` (kernels) or `ret`;
/// - every guard, register read and register written is below the
///   function's register count (optional destinations may be `NONE`);
/// - every branch targets an instruction of its own function;
/// - a direct call names a function and passes as many arguments and return
///   slots as it declares; an indirect call takes its target from a register;
///   frame-located arguments lie inside the caller's frame;
/// - widths are ones the interpreter handles: `ld`/`st` of 1, 2, 4 or 8 bytes
///   and 1..=4 elements, atomics of 2, 4 or 8 bytes, `cp.async` of 4, 8 or 16,
///   `ldmatrix` of 1, 2 or 4 matrices with one register each, `mma` with k 8
///   or 16, `wmma` fragments of 1..=8 registers;
/// - integer ops are not of a float type, float ops and `.relu` are;
/// - `prmt` modes, `testp` classes and special-register dimensions are in range.
///
/// The interpreter relies on this (and `debug_assert!`s it where it does);
/// a compiled backend may rely on it the same way.
pub(crate) fn check_module(m: &Module) -> Result<(), Malformed> {
    let module_fault = |what: String| Malformed {
        func: String::new(),
        at: None,
        what,
    };
    if !m.dyn_shared_base.is_multiple_of(16) {
        return Err(module_fault(format!(
            "dynamic shared memory at {} is not 16-byte aligned",
            m.dyn_shared_base
        )));
    }
    for &k in &m.kernels {
        let Some(f) = m.funcs.get(k as usize) else {
            return Err(module_fault(format!(
                "kernel index {k} of {} functions",
                m.funcs.len()
            )));
        };
        if !f.params.is_empty() || !f.rets.is_empty() {
            return Err(Malformed {
                func: f.name.clone(),
                at: None,
                what: "a kernel with frame parameters".into(),
            });
        }
    }
    for (i, f) in m.funcs.iter().enumerate() {
        let is_kernel = m.kernels.contains(&(i as u32));
        check_func(m, f, is_kernel)?;
    }
    Ok(())
}

fn check_func(m: &Module, f: &Func, is_kernel: bool) -> Result<(), Malformed> {
    let fault = |what: String| Malformed {
        func: f.name.clone(),
        at: None,
        what,
    };
    if f.nregs == 0 || f.nregs > MAX_REGS {
        return Err(fault(format!("{} registers", f.nregs)));
    }
    if f.frame_bytes > MAX_FRAME_BYTES || !f.frame_bytes.is_multiple_of(16) {
        return Err(fault(format!("a frame of {} bytes", f.frame_bytes)));
    }
    for &(off, size) in f.params.iter().chain(&f.rets) {
        if !in_frame(f, off, size) {
            return Err(fault(format!(
                "parameter slot {off}+{size} outside the frame of {} bytes",
                f.frame_bytes
            )));
        }
    }
    match f.code.last() {
        Some(Inst {
            guard: NONE,
            op: Op::Exit,
            ..
        }) if is_kernel => {}
        Some(Inst {
            guard: NONE,
            op: Op::Ret,
            ..
        }) if !is_kernel => {}
        _ => {
            return Err(fault(format!(
                "code does not end in an unguarded `{}`",
                if is_kernel { "exit" } else { "ret" }
            )))
        }
    }
    for (pc, inst) in f.code.iter().enumerate() {
        check_inst(m, f, inst).map_err(|what| Malformed {
            func: f.name.clone(),
            at: Some((pc as u32, inst.line)),
            what,
        })?;
    }
    Ok(())
}

fn in_frame(f: &Func, off: u32, size: u32) -> bool {
    off as u64 + size as u64 <= f.frame_bytes as u64
}

fn check_inst(m: &Module, f: &Func, inst: &Inst) -> Result<(), String> {
    let nregs = f.nregs;
    if inst.guard != NONE && inst.guard >= nregs {
        return Err(format!("guard register {} of {nregs}", inst.guard));
    }
    let mut bad = None;
    inst.op.for_each_src(|s| {
        if let Src::Reg(r) = s {
            if r >= nregs {
                bad.get_or_insert(format!("reads register {r} of {nregs}"));
            }
        }
    });
    inst.op.for_each_dst(|d| {
        if d >= nregs {
            bad.get_or_insert(format!("writes register {d} of {nregs}"));
        }
    });
    if let Some(what) = bad {
        return Err(what);
    }
    let frame_arg = |l: &ArgLoc| match *l {
        ArgLoc::Frame { off, size } if !in_frame(f, off, size) => Err(format!(
            "frame slot {off}+{size} outside the frame of {} bytes",
            f.frame_bytes
        )),
        _ => Ok(()),
    };
    let widths = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
    match &inst.op {
        Op::Bra { target } if *target as usize >= f.code.len() => {
            return Err(format!(
                "branch to {target} of {} instructions",
                f.code.len()
            ));
        }
        Op::Call(info) => {
            match (info.target, m.funcs.get(info.func as usize)) {
                (Some(Src::Reg(_)), _) => {}
                (Some(t), _) => return Err(format!("indirect call through {t:?}")),
                (None, None) => return Err(format!("call to function {}", info.func)),
                (None, Some(callee)) => {
                    if info.args.len() != callee.params.len()
                        || info.rets.len() != callee.rets.len()
                    {
                        return Err(format!(
                            "call to `{}` with {} arguments and {} returns for {} and {}",
                            callee.name,
                            info.args.len(),
                            info.rets.len(),
                            callee.params.len(),
                            callee.rets.len()
                        ));
                    }
                }
            }
            info.args.iter().chain(&info.rets).try_for_each(frame_arg)?;
        }
        Op::Printf { fmt, args, ret } => {
            [fmt, args].into_iter().chain(ret).try_for_each(frame_arg)?;
        }
        Op::AssertFail(args) => args.iter().try_for_each(frame_arg)?,
        Op::Malloc { size, ret } => [size].into_iter().chain(ret).try_for_each(frame_arg)?,
        Op::Free { ptr } => frame_arg(ptr)?,
        Op::Cdp(c) => c.args.iter().chain(&c.ret).try_for_each(frame_arg)?,
        Op::Ld { size, n, .. } | Op::St { size, n, .. } => widths(
            matches!(size, 1 | 2 | 4 | 8) && (1..=4).contains(n),
            "ld/st width",
        )?,
        Op::Atom { t, .. } => widths(matches!(t.bytes(), 2 | 4 | 8), "atomic width")?,
        Op::CpAsync { size, .. } => widths(matches!(size, 4 | 8 | 16), "cp.async size")?,
        Op::Ldmatrix { num, ds, .. } => widths(
            matches!(num, 1 | 2 | 4) && ds.len() == *num as usize,
            "ldmatrix count",
        )?,
        Op::Mma { k, .. } => widths(matches!(k, 8 | 16), "mma shape")?,
        Op::WmmaLoad { ds, .. } => widths((1..=8).contains(&ds.len()), "wmma fragment")?,
        Op::WmmaMma { mma } => widths((1..=8).contains(&mma.d.len()), "wmma fragment")?,
        Op::WmmaStore { vals, .. } => widths((1..=8).contains(&vals.len()), "wmma fragment")?,
        Op::Int { t, .. } => widths(!t.is_float(), "integer op on a float type")?,
        Op::Float { t, .. } | Op::Relu { t, .. } => {
            widths(t.is_float(), "float op on a non-float type")?
        }
        Op::Un { op, t, .. } => match op {
            UnOp::Neg | UnOp::Abs => widths(!t.is_float(), "integer op on a float type")?,
            UnOp::FNeg | UnOp::FAbs => widths(t.is_float(), "float op on a non-float type")?,
            _ => {}
        },
        Op::Prmt { mode, .. } => widths(*mode <= 6, "prmt mode")?,
        Op::Testp { kind, .. } => widths(*kind <= 5, "testp class")?,
        Op::Special { r, .. } => {
            if let SReg::Tid(d) | SReg::Ntid(d) | SReg::Ctaid(d) | SReg::Nctaid(d) = r {
                // `Ntid(9)` is the cluster size, always 1
                widths(*d < 3 || *r == SReg::Ntid(9), "special register dimension")?
            }
        }
        _ => {}
    }
    Ok(())
}
