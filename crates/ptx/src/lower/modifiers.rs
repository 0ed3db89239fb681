//! PTX dot-modifiers to IR enums: comparison, rounding mode, state space.

use crate::ir::{Cmp, Rnd, Sp};

pub(super) fn cmp_of(s: &str) -> Option<Cmp> {
    Some(match s {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" => Cmp::Lt,
        "le" => Cmp::Le,
        "gt" => Cmp::Gt,
        "ge" => Cmp::Ge,
        "lo" => Cmp::Lo,
        "ls" => Cmp::Ls,
        "hi" => Cmp::Hi,
        "hs" => Cmp::Hs,
        "equ" => Cmp::Equ,
        "neu" => Cmp::Neu,
        "ltu" => Cmp::Ltu,
        "leu" => Cmp::Leu,
        "gtu" => Cmp::Gtu,
        "geu" => Cmp::Geu,
        "num" => Cmp::Num,
        "nan" => Cmp::Nan,
        _ => return None,
    })
}

pub(super) fn rnd_of(mods: &[String]) -> Rnd {
    for m in mods {
        let r = match m.as_str() {
            "rn" => Rnd::Rn,
            "rz" => Rnd::Rz,
            "rm" => Rnd::Rm,
            "rp" => Rnd::Rp,
            "rni" => Rnd::Rni,
            "rzi" => Rnd::Rzi,
            "rmi" => Rnd::Rmi,
            "rpi" => Rnd::Rpi,
            _ => continue,
        };
        return r;
    }
    Rnd::Default
}

pub(super) fn sp_of(mods: &[String]) -> Option<Sp> {
    for m in mods {
        let s = match m.as_str() {
            "global" => Sp::Global,
            "shared" => Sp::Shared,
            "local" => Sp::Local,
            "param" => Sp::Param,
            "const" => Sp::Global,
            _ => continue,
        };
        return Some(s);
    }
    None
}
