//! PTX dot-modifiers to IR enums: comparison, rounding mode, state space.

use crate::ast;
use crate::ir::{Cmp, FloatMode, MemOrder, Rnd, Sp};

/// The comparison a modifier names.
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

/// The rounding mode among the modifiers (the first named), else the
/// instruction's default.
pub(super) fn rnd_of(mods: &[String]) -> Rnd {
    mods.iter()
        .find_map(|m| {
            Some(match m.as_str() {
                "rn" => Rnd::Rn,
                "rz" => Rnd::Rz,
                "rm" => Rnd::Rm,
                "rp" => Rnd::Rp,
                "rni" => Rnd::Rni,
                "rzi" => Rnd::Rzi,
                "rmi" => Rnd::Rmi,
                "rpi" => Rnd::Rpi,
                _ => return None,
            })
        })
        .unwrap_or(Rnd::Default)
}

/// The float modifiers of `i`: the rounding it names (the default where it
/// names one of `approximate`, such as `.approx`), `.ftz`, and `.sat` or
/// `.satfinite`.
pub(super) fn float_mode(i: &ast::Instruction, approximate: &[&str]) -> FloatMode {
    let rnd = if approximate.iter().any(|a| i.has(a)) {
        Rnd::Default
    } else {
        rnd_of(&i.modifiers)
    };
    FloatMode {
        rnd,
        ftz: i.has("ftz"),
        sat: i.has("sat") || i.has("satfinite"),
    }
}

/// The state space among the modifiers (the first named); `.const` is
/// global memory here.
pub(super) fn sp_of(mods: &[String]) -> Option<Sp> {
    mods.iter().find_map(|m| {
        Some(match m.as_str() {
            "global" | "const" => Sp::Global,
            "shared" | "shared::cta" => Sp::Shared,
            "local" => Sp::Local,
            "param" => Sp::Param,
            _ => return None,
        })
    })
}

/// How a load or store is ordered (`.volatile`, `.relaxed`, `.acquire`,
/// `.release`; `.mmio` accesses are `.relaxed.sys`), else plain.
pub(super) fn order_of(mods: &[String]) -> MemOrder {
    first_present(
        mods,
        &[
            ("volatile", MemOrder::Volatile),
            ("relaxed", MemOrder::Relaxed),
            ("acquire", MemOrder::Acquire),
            ("release", MemOrder::Release),
        ],
    )
    .unwrap_or(MemOrder::Plain)
}

/// The value paired with the first of `choices` whose modifier is present
/// (in the order of `choices`).
pub(super) fn first_present<T: Copy>(mods: &[String], choices: &[(&str, T)]) -> Option<T> {
    choices
        .iter()
        .find(|(name, _)| mods.iter().any(|m| m == name))
        .map(|&(_, v)| v)
}
