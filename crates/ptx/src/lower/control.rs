//! Control flow to IR: branches, calls (argument and return locations,
//! `vprintf`, device assertions) and block barriers.

use super::context::FuncLower;
use super::error::invalid;
use super::layout::param_bytes;
use super::modifiers::first_present;
use super::symbols::{Binding, Sym, VPRINTF};
use crate::ast::{self, Operand};
use crate::ir::{ArgLoc, BarRed, CallInfo, CdpCall, CdpFn, Op, Src, Ty, NONE};
use crate::module_info::LoadError;

impl FuncLower<'_> {
    /// `bra` (to a label fixed up at the end of the function); `brx.idx`
    /// is unsupported.
    pub(super) fn lower_branch(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        if i.opcode == "brx" {
            let o = self.ops(i, 2)?;
            let idx = self.src(&o[0], Ty::U32)?;
            let _ = idx;
            return self.unsupported("brx.idx");
        }
        let o = self.ops(i, 1)?;
        let label = match &o[0] {
            Operand::Name(n) => n.clone(),
            _ => return Err(invalid(self.line, "bra needs a label")),
        };
        let at = self.code.len();
        self.emit(Op::Bra { target: u32::MAX });
        self.fixups.push((at, label, self.line));
        Ok(())
    }

    /// `bar`/`barrier` (`sync`, `arrive`, `red`) other than `bar.warp.sync`.
    pub(super) fn lower_barrier(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let red = if i.has("red") {
            first_present(m, &[("popc", BarRed::Popc), ("and", BarRed::And)]).unwrap_or(BarRed::Or)
        } else {
            BarRed::None
        };
        let wait = !i.has("arrive");
        let o = &i.operands;
        let (d, rest) = if red != BarRed::None {
            let o = self.ops(i, 3)?;
            (self.dst(&o[0])?, &o[1..])
        } else {
            (NONE, &o[..])
        };
        let id = self.src_or(rest.first(), Ty::U32, 0)?;
        let (count, pi) = if red != BarRed::None {
            if rest.len() == 3 {
                (self.src(&rest[1], Ty::U32)?, 2)
            } else {
                (Src::Imm(u64::MAX), 1)
            }
        } else {
            match rest.get(1) {
                Some(x) => (self.src(x, Ty::U32)?, 9),
                None => (Src::Imm(u64::MAX), 9),
            }
        };
        let (p, pneg) = match rest.get(pi) {
            Some(x) => self.pred_src(x)?,
            None => (Src::Imm(0), false),
        };
        self.emit(Op::Bar {
            id,
            count,
            wait,
            red,
            d,
            p,
            pneg,
        });
        Ok(())
    }

    /// Where call argument or return value `o` lives.
    fn arg_loc(&mut self, o: &Operand, size_hint: u32) -> Result<ArgLoc, LoadError> {
        if let Operand::Name(n) = o {
            if let Some(Binding::Sym(Sym::Frame(off, size))) = self.lookup(n) {
                return Ok(ArgLoc::Frame { off, size });
            }
            if let Some(Binding::Reg(r, t)) = self.lookup(n) {
                return Ok(ArgLoc::Val {
                    src: Src::Reg(r),
                    size: t.bytes().min(8),
                });
            }
        }
        let src = self.src(o, Ty::B64)?;
        Ok(ArgLoc::Val {
            src,
            size: size_hint,
        })
    }

    /// `__assertfail(message, file, line, function, char_size)`: its four
    /// first arguments kept for the assertion line (a call with fewer is a trap).
    fn lower_assert_fail(&mut self, args: &[Operand]) -> Result<(), LoadError> {
        if args.len() < 4 {
            self.emit(Op::Trap("device-side assertion failed".into()));
            return Ok(());
        }
        let locs = [
            self.arg_loc(&args[0], 8)?,
            self.arg_loc(&args[1], 8)?,
            self.arg_loc(&args[2], 4)?,
            self.arg_loc(&args[3], 8)?,
        ];
        self.emit(Op::AssertFail(Box::new(locs)));
        Ok(())
    }

    /// A device runtime call of dynamic parallelism: every argument is kept
    /// whole (a `dim3` is a 12-byte `.param` of the caller).
    fn lower_cdp(&mut self, f: CdpFn, args: &[Operand], rets: &[Operand]) -> Result<(), LoadError> {
        let mut a = Vec::new();
        for arg in args {
            a.push(self.arg_loc(arg, 8)?);
        }
        let ret = match rets.first() {
            Some(r) => Some(self.arg_loc(r, 8)?),
            None => None,
        };
        self.emit(Op::Cdp(Box::new(CdpCall {
            func: f,
            args: a,
            ret,
        })));
        Ok(())
    }

    /// `call`: direct or indirect, `vprintf`, or `__assertfail`.
    pub(super) fn lower_call(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let o = &i.operands;
        let (rets, rest): (&[Operand], &[Operand]) = match o.first() {
            Some(Operand::List(r)) => (r, &o[1..]),
            _ => (&[], &o[..]),
        };
        let Some(Operand::Name(target)) = rest.first() else {
            return self.unsupported("call target form");
        };
        let args: &[Operand] = match rest.get(1) {
            Some(Operand::List(a)) => a,
            _ => &[],
        };
        let func = match self.lookup(target) {
            Some(Binding::Sym(Sym::Func(f))) => f,
            Some(Binding::Reg(r, _)) => {
                let mut a = Vec::new();
                for arg in args {
                    a.push(self.arg_loc(arg, 8)?);
                }
                let mut rl = Vec::new();
                for ret in rets {
                    rl.push(self.arg_loc(ret, 8)?);
                }
                self.emit(Op::Call(Box::new(CallInfo {
                    func: u32::MAX,
                    target: Some(Src::Reg(r)),
                    args: a,
                    rets: rl,
                })));
                return Ok(());
            }
            _ => return Err(invalid(self.line, format!("unknown function `{target}`"))),
        };
        if func == VPRINTF {
            if args.len() != 2 {
                return Err(invalid(self.line, "vprintf takes two arguments"));
            }
            let fmt = self.arg_loc(&args[0], 8)?;
            let a = self.arg_loc(&args[1], 8)?;
            let ret = match rets.first() {
                Some(r) => Some(self.arg_loc(r, 4)?),
                None => None,
            };
            self.emit(Op::Printf { fmt, args: a, ret });
            return Ok(());
        }
        let callee = self
            .funcs
            .get(func as usize)
            .ok_or_else(|| invalid(self.line, "bad function index"))?;
        // the device runtime's own definitions (libcudadevrt's PTX, linked
        // in by -rdc) are never entered: the call is the device's
        if let Some(f) = cdp_fn(&callee.name) {
            return self.lower_cdp(f, args, rets);
        }
        if callee.body.is_none() {
            if callee.name == "__assertfail" || callee.name == "__assert_fail" {
                return self.lower_assert_fail(args);
            }
            if let ("malloc" | "free", [a]) = (callee.name.as_str(), args) {
                let is_free = callee.name == "free";
                let a = self.arg_loc(a, 8)?;
                let op = if is_free {
                    Op::Free { ptr: a }
                } else {
                    let ret = match rets.first() {
                        Some(r) => Some(self.arg_loc(r, 8)?),
                        None => None,
                    };
                    Op::Malloc { size: a, ret }
                };
                self.emit(op);
                return Ok(());
            }
            let name = callee.name.clone();
            if name.starts_with("cnp") || name.starts_with("__cuda_syscall") {
                // libcudadevrt's internals, called only from its own
                // definitions, which the device's calls replace
                self.emit(Op::Trap(format!("call to the device runtime's `{name}`")));
                return Ok(());
            }
            if name.starts_with("__cudaCDP") || name.starts_with("cudaLaunchDevice") {
                return self.unsupported(format!(
                    "the device runtime function `{name}` (dynamic parallelism): the CPU device \
                     runs device-side launches, streams, errors and cudaMalloc/cudaFree only"
                ));
            }
            return self.unsupported(format!("call to external function `{name}`"));
        }
        if args.len() != callee.params.len() || rets.len() != callee.returns.len() {
            return Err(invalid(
                self.line,
                format!("call to `{}`: argument count mismatch", callee.name),
            ));
        }
        let mut a = Vec::new();
        for (arg, p) in args.iter().zip(&callee.params) {
            let (size, _) = param_bytes(p)?;
            a.push(self.arg_loc(arg, size)?);
        }
        let mut r = Vec::new();
        for (ret, p) in rets.iter().zip(&callee.returns) {
            let (size, _) = param_bytes(p)?;
            r.push(self.arg_loc(ret, size)?);
        }
        self.emit(Op::Call(Box::new(CallInfo {
            func,
            target: None,
            args: a,
            rets: r,
        })));
        Ok(())
    }
}

/// The dynamic-parallelism function an external named `name` is.
fn cdp_fn(name: &str) -> Option<CdpFn> {
    Some(match name {
        "__cudaCDP2GetParameterBufferV2" | "cudaGetParameterBufferV2" => CdpFn::GetParameterBuffer,
        "__cudaCDP2LaunchDeviceV2" | "cudaLaunchDeviceV2" => CdpFn::LaunchDevice,
        "__cudaCDP2GetLastError" => CdpFn::GetLastError,
        "__cudaCDP2PeekAtLastError" => CdpFn::PeekAtLastError,
        "__cudaCDP2StreamCreateWithFlags" => CdpFn::StreamCreate,
        "__cudaCDP2StreamDestroy" => CdpFn::StreamDestroy,
        "__cudaCDP2Malloc" => CdpFn::Malloc,
        "__cudaCDP2Free" => CdpFn::Free,
        "__cudaCDP2GetDevice" => CdpFn::GetDevice,
        _ => return None,
    })
}
