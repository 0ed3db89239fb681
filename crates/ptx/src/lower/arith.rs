//! Arithmetic and logic instructions to IR: `mov`, integer and float
//! one-, two- and three-operand ops, carries, bit fields, `prmt`, `lop3`, `cvt`.

use super::context::FuncLower;
use super::modifiers::float_mode;
use crate::ast::{self, Operand};
use crate::ir::{CarryKind, FOp, IntOp, Op, Src, TernOp, Ty, UnOp};
use crate::module_info::LoadError;

impl FuncLower<'_> {
    /// `mov`, and `mov` of a vector destination (unpacking one value).
    pub(super) fn lower_mov(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let (o, t) = self.typed_ops(i, 2)?;
        match (&o[0], &o[1]) {
            (Operand::Vector(ds), src) => {
                let a = self.src(src, t)?;
                let ds = self.dst_list(ds)?;
                let bits = if ds.is_empty() {
                    0
                } else {
                    t.bits() / ds.len() as u32
                };
                self.emit(Op::Unpack { ds, a, bits });
            }
            (d, src) => {
                let d = self.dst(d)?;
                let a = self.src(src, t)?;
                self.emit(Op::Mov {
                    d,
                    a,
                    mask: t.mask(),
                });
            }
        }
        Ok(())
    }

    /// `add.cc`, `addc`, `sub.cc`, `subc`, `mad.cc`, `madc`: integer ops
    /// through the hidden carry register.
    pub(super) fn lower_carry(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let is_mad = i.opcode.starts_with("mad");
        let (o, t) = self.typed_ops(i, if is_mad { 4 } else { 3 })?;
        let kind = match i.opcode.as_str() {
            "add" | "addc" => CarryKind::Add,
            "sub" | "subc" => CarryKind::Sub,
            _ if i.has("hi") => CarryKind::MadHi,
            _ => CarryKind::MadLo,
        };
        let cc = match self.cc {
            Some(r) => r,
            None => {
                let r = self.new_reg()?;
                self.cc = Some(r);
                r
            }
        };
        let (d, [a, b]) = self.dst_srcs(o, [t, t])?;
        let c = if is_mad {
            self.src(&o[3], t)?
        } else {
            Src::Imm(0)
        };
        self.emit(Op::Carry {
            kind,
            t,
            d,
            a,
            b,
            c,
            cin: i.opcode.ends_with('c'),
            cout: i.has("cc"),
            cc,
        });
        Ok(())
    }

    /// Two-operand arithmetic and logic (`add` … `bmsk`), integer or float.
    pub(super) fn lower_binary(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let mode = float_mode(i, &["approx", "full"]);
        let (o, t) = self.typed_ops(i, 3)?;
        let bt = if matches!(i.opcode.as_str(), "shl" | "shr") {
            Ty::U32
        } else {
            t
        };
        let (d, [a, b]) = self.dst_srcs(o, [t, bt])?;
        if t.is_float() {
            let op = match i.opcode.as_str() {
                "add" => FOp::Add,
                "sub" => FOp::Sub,
                "mul" => FOp::Mul,
                "div" => FOp::Div,
                "min" => FOp::Min,
                "max" => FOp::Max,
                "copysign" => FOp::Copysign,
                other => return self.unsupported(format!("{other} on floats")),
            };
            self.emit(Op::Float {
                op,
                t,
                d,
                a,
                b,
                mode,
            });
        } else {
            let op = match (i.opcode.as_str(), mode.sat) {
                ("add", false) => IntOp::Add,
                ("add", true) => IntOp::AddSat,
                ("sub", false) => IntOp::Sub,
                ("sub", true) => IntOp::SubSat,
                ("mul", _) if i.has("hi") => IntOp::MulHi,
                ("mul", _) if i.has("wide") => IntOp::MulWide,
                ("mul", _) => IntOp::MulLo,
                ("mul24", _) if i.has("hi") => return self.unsupported("mul24.hi"),
                ("mul24", _) => IntOp::Mul24Lo,
                ("div", _) => IntOp::Div,
                ("rem", _) => IntOp::Rem,
                ("min", _) => IntOp::Min,
                ("max", _) => IntOp::Max,
                ("and", _) => IntOp::And,
                ("or", _) => IntOp::Or,
                ("xor", _) => IntOp::Xor,
                ("shl", _) => IntOp::Shl,
                ("shr", _) => IntOp::Shr,
                ("bmsk", _) => IntOp::Bmsk,
                (other, _) => return self.unsupported(format!("{other} on integers")),
            };
            self.emit(Op::Int { op, t, d, a, b });
        }
        Ok(())
    }

    /// One-operand ops (`not` … `tanh`), integer or float.
    pub(super) fn lower_unary(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let mode = float_mode(i, &["approx"]);
        let (o, t) = self.typed_ops(i, 2)?;
        let (d, [a]) = self.dst_srcs(o, [t])?;
        let op = match (i.opcode.as_str(), t.is_float()) {
            ("not", _) => UnOp::Not,
            ("cnot", _) => UnOp::Cnot,
            ("neg", false) => UnOp::Neg,
            ("neg", true) => UnOp::FNeg,
            ("abs", false) => UnOp::Abs,
            ("abs", true) => UnOp::FAbs,
            ("popc", _) => UnOp::Popc,
            ("clz", _) => UnOp::Clz,
            ("brev", _) => UnOp::Brev,
            ("bfind", _) if i.has("shiftamt") => UnOp::BfindShift,
            ("bfind", _) => UnOp::Bfind,
            ("sqrt", _) => UnOp::Sqrt,
            ("rsqrt", _) => UnOp::Rsqrt,
            ("rcp", _) => UnOp::Rcp,
            ("sin", _) => UnOp::Sin,
            ("cos", _) => UnOp::Cos,
            ("ex2", _) => UnOp::Ex2,
            ("lg2", _) => UnOp::Lg2,
            ("tanh", _) => UnOp::Tanh,
            (other, _) => return self.unsupported(other.to_string()),
        };
        self.emit(Op::Un { op, t, d, a, mode });
        Ok(())
    }

    /// Three-operand ops: `mad`/`fma`, `selp`, `bfe`, `sad`, `slct`, `shf`,
    /// `dp4a`/`dp2a`, `mad24`.
    pub(super) fn lower_ternary(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let mode = float_mode(i, &[]);
        let (o, t) = self.typed_ops(i, 4)?;
        let opname = i.opcode.as_str();
        let (op, at, ct) = match opname {
            "mad" if t.is_float() => (TernOp::Fma, t, t),
            "mad" if i.has("hi") => (TernOp::MadHi, t, t),
            "mad" if i.has("wide") => {
                let wide = match t {
                    Ty::S32 => Ty::S64,
                    Ty::U32 => Ty::U64,
                    Ty::S16 => Ty::S32,
                    _ => Ty::U32,
                };
                (TernOp::MadWide, t, wide)
            }
            "mad" => (TernOp::MadLo, t, t),
            "mad24" => (TernOp::Mad24Lo, t, t),
            "fma" => (TernOp::Fma, t, t),
            "selp" => (TernOp::Selp, t, Ty::Pred),
            "bfe" => (TernOp::Bfe, t, Ty::U32),
            "sad" => (TernOp::Sad, t, t),
            "slct" => {
                let ct = m.iter().rev().find_map(|x| Ty::parse(x)).unwrap_or(Ty::S32);
                let at = m.iter().find_map(|x| Ty::parse(x)).unwrap_or(Ty::B32);
                (TernOp::Slct, at, ct)
            }
            "shf" if i.has("l") => (TernOp::Shfl, Ty::B32, Ty::U32),
            "shf" => (TernOp::Shfr, Ty::B32, Ty::U32),
            "dp4a" => (TernOp::Dp4a, t, t),
            "dp2a" if i.has("hi") => (TernOp::Dp2aHi, t, t),
            "dp2a" => (TernOp::Dp2aLo, t, t),
            _ => return self.unsupported(opname.to_string()),
        };
        // shf: mode .wrap/.clamp
        let t2 = if opname == "shf" {
            if i.has("clamp") {
                Ty::U8
            } else {
                Ty::U16
            }
        } else if opname == "dp4a" || opname == "dp2a" {
            // encode signedness of a and b in the type: first two type modifiers
            let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
            match (
                tys.first().map(|t| t.signed()),
                tys.get(1).map(|t| t.signed()),
            ) {
                (Some(true), Some(true)) => Ty::S64,
                (Some(true), _) => Ty::S32,
                (_, Some(true)) => Ty::S16,
                _ => Ty::U32,
            }
        } else if opname == "slct" {
            ct
        } else {
            at
        };
        let (d, [a, b, c]) = self.dst_srcs(o, [at, at, ct])?;
        self.emit(Op::Tern {
            op,
            t: t2,
            d,
            a,
            b,
            c,
            mode,
        });
        Ok(())
    }

    /// `bfi`: bit-field insert.
    pub(super) fn lower_bfi(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let (o, t) = self.typed_ops(i, 5)?;
        let (d, [a, b, c, e]) = self.dst_srcs(o, [t, t, Ty::U32, Ty::U32])?;
        self.emit(Op::Bfi { t, d, a, b, c, e });
        Ok(())
    }

    /// `prmt`: byte permute (default selector or a named mode).
    pub(super) fn lower_prmt(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let o = self.ops(i, 4)?;
        let mode = ["f4e", "b4e", "rc8", "ecl", "ecr", "rc16"]
            .iter()
            .position(|x| i.has(x))
            .map_or(0, |p| p as u8 + 1);
        let (d, [a, b, c]) = self.dst_srcs(o, [Ty::B32; 3])?;
        self.emit(Op::Prmt { d, a, b, c, mode });
        Ok(())
    }

    /// `lop3`: any three-input logic function by its lookup table.
    pub(super) fn lower_lop3(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let o = self.ops(i, 5)?;
        let (d, [a, b, c]) = self.dst_srcs(o, [Ty::B32; 3])?;
        let lut = match &o[4] {
            Operand::Int(v) => *v as u8,
            _ => return self.unsupported("lop3 with non-immediate table"),
        };
        self.emit(Op::Lop3 { d, a, b, c, lut });
        Ok(())
    }

    /// `cvt`, including the packing `cvt.rn.f16x2.f32 d, a, b`.
    pub(super) fn lower_cvt(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let mode = float_mode(i, &[]);
        let o = self.ops(i, 2)?;
        let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
        if tys.len() != 2 {
            if i.has("f16x2") || i.has("bf16x2") {
                // cvt.rn.f16x2.f32 d, a, b
                let o = self.ops(i, 3)?;
                let dt = if i.has("f16x2") { Ty::F16 } else { Ty::BF16 };
                let d = self.dst(&o[0])?;
                let hi = self.src(&o[1], Ty::F32)?;
                let lo = self.src(&o[2], Ty::F32)?;
                let t1 = self.new_reg()?;
                let t2 = self.new_reg()?;
                for (d, a) in [(t1, hi), (t2, lo)] {
                    self.emit(Op::Cvt {
                        d,
                        a,
                        dt,
                        st: Ty::F32,
                        mode,
                    });
                }
                self.emit(Op::Pack {
                    d,
                    parts: vec![Src::Reg(t2), Src::Reg(t1)],
                    bits: 16,
                });
                return Ok(());
            }
            return self.unsupported("cvt form");
        }
        let (d, [a]) = self.dst_srcs(o, [tys[1]])?;
        self.emit(Op::Cvt {
            d,
            a,
            dt: tys[0],
            st: tys[1],
            mode,
        });
        Ok(())
    }
}
