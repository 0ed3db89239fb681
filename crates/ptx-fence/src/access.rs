//! One instruction's memory operands: which state space each addresses, and
//! the PTX that forces a global (or generic-and-global) address into the fence.

use crate::error::FenceError;

/// What one bracketed operand addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The global space: always fenced.
    Global,
    /// A generic address: fenced only where `isspacep.global` holds.
    Generic,
    /// Shared, local, param or const memory, or no memory: left alone.
    Other,
}

const NON_GLOBAL: &[&str] = &[
    "shared",
    "shared::cta",
    "shared::cluster",
    "local",
    "param",
    "param::entry",
    "param::func",
    "const",
];

/// Opcodes whose bracketed operands are not addresses (texture and surface
/// handles) or only ever shared memory; left as they are.
const UNTOUCHED: &[&str] = &[
    "tex", "tld4", "suld", "sust", "sured", "suq", "txq", "istypep", "ldmatrix", "stmatrix",
];

/// Opcodes with one address, in the space their modifiers name (or generic).
const SINGLE: &[&str] = &[
    "ld",
    "ldu",
    "st",
    "atom",
    "red",
    "prefetch",
    "prefetchu",
    "mbarrier",
    "applypriority",
    "discard",
    "tensormap",
];

/// The target of each bracketed operand of the instruction `opcode`
/// (`ld.global.v4.f32`) with `brackets` of them; `line` names it in errors.
pub fn targets(opcode: &str, brackets: usize, line: usize) -> Result<Vec<Target>, FenceError> {
    let mut parts = opcode.split('.');
    let op = parts.next().unwrap_or("");
    let mods: Vec<&str> = parts.collect();
    if brackets == 0 || UNTOUCHED.contains(&op) {
        return Ok(vec![Target::Other; brackets]);
    }
    let refuse = || FenceError::Unfenceable {
        line,
        opcode: opcode.to_string(),
    };
    let space_of = |m: &&str| -> Option<Target> {
        if *m == "global" {
            Some(Target::Global)
        } else if NON_GLOBAL.contains(m) {
            Some(Target::Other)
        } else {
            None
        }
    };
    if SINGLE.contains(&op) {
        if brackets != 1 {
            return Err(refuse());
        }
        let target = mods.iter().find_map(space_of).unwrap_or(Target::Generic);
        return Ok(vec![target]);
    }
    if op == "wmma" {
        // A fragment spans rows `ldm` apart from its address: only shared
        // memory's (which cannot reach another tenant) can stay.
        let space = mods.iter().find_map(space_of);
        return match space {
            Some(Target::Other) => Ok(vec![Target::Other; brackets]),
            _ => Err(refuse()),
        };
    }
    if op == "cp" && !mods.iter().any(|m| m.contains("bulk")) {
        // `cp.async.ca.shared.global [dst], [src], 16`: the spaces name the
        // operands in order; a trailing `[mbar]` is shared memory. Bulk
        // copies run a register's count of bytes past their address, which
        // the fence cannot bound: refused.
        let spaces: Vec<Target> = mods.iter().filter_map(space_of).collect();
        let mut out: Vec<Target> = (0..brackets)
            .map(|i| spaces.get(i).copied().unwrap_or(Target::Other))
            .collect();
        if spaces.is_empty() {
            out = vec![Target::Generic; brackets];
        }
        return Ok(out);
    }
    Err(refuse())
}

/// The fresh names the pass declares; the pass refuses a text that already
/// mentions [`super::RESERVED_PREFIX`], so none can collide.
pub mod names {
    pub const ADDR: [&str; 2] = ["%__cumux_a0", "%__cumux_a1"];
    pub const TEMP: &str = "%__cumux_t";
    pub const BASE: &str = "%__cumux_base";
    pub const MASK: &str = "%__cumux_mask";
    pub const LO: &str = "%__cumux_lo";
    pub const HI: &str = "%__cumux_hi";
    pub const OUTSIDE: &str = "%__cumux_p";
    pub const GLOBAL: &str = "%__cumux_q";
}

/// The declarations and fence loads a function body with fenced accesses
/// starts with.
pub fn prologue(symbol: &str) -> String {
    use names::*;
    format!(
        "\n\t.reg .b64 {}, {}, {TEMP}, {BASE}, {MASK}, {LO}, {HI};\n\t.reg .pred {OUTSIDE}, {GLOBAL};\n\
         \tld.const.v2.u64 {{{BASE}, {MASK}}}, [{symbol}];\n\
         \tld.const.v2.u64 {{{LO}, {HI}}}, [{symbol}+16];\n",
        ADDR[0], ADDR[1]
    )
}

/// The instructions that leave the fenced form of address expression `expr`
/// (`%rd4+8`, `sym`, `64`) in register `reg`: unchanged inside the module's
/// globals window `[lo, hi)`, else `base | (addr & mask)`; for a generic
/// address only where it is global. `cvta`: the base is a variable of that
/// space, taken as its generic address.
pub fn fence_code(expr: &str, reg: &str, target: Target, cvta: Option<&str>) -> String {
    use names::*;
    let expr = expr.trim();
    let split = expr
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == '+' || c == '-')
        .map(|(i, _)| i);
    let mut code = String::from("\n\t");
    let (base, offset) = match split {
        Some(i) => {
            let rest = expr[i..].trim();
            (
                expr[..i].trim(),
                Some(rest.strip_prefix('+').unwrap_or(rest).trim()),
            )
        }
        None => (expr, None),
    };
    match (cvta, offset) {
        (Some(space), _) => code += &format!("cvta.{space}.u64 {reg}, {base};\n\t"),
        (None, Some(offset)) => code += &format!("add.s64 {reg}, {base}, {offset};\n\t"),
        (None, None) => code += &format!("mov.b64 {reg}, {base};\n\t"),
    }
    if let (Some(_), Some(offset)) = (cvta, offset) {
        code += &format!("add.s64 {reg}, {reg}, {offset};\n\t");
    }
    code += &format!(
        "setp.lt.u64 {OUTSIDE}, {reg}, {LO};\n\tsetp.ge.or.u64 {OUTSIDE}, {reg}, {HI}, {OUTSIDE};\n\t"
    );
    if target == Target::Generic {
        code += &format!(
            "isspacep.global {GLOBAL}, {reg};\n\tand.pred {OUTSIDE}, {OUTSIDE}, {GLOBAL};\n\t"
        );
    }
    code += &format!(
        "and.b64 {TEMP}, {reg}, {MASK};\n\tor.b64 {TEMP}, {TEMP}, {BASE};\n\tselp.b64 {reg}, {TEMP}, {reg}, {OUTSIDE};\n\t"
    );
    code
}
