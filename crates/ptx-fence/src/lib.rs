//! Address fencing for tenants sharing one GPU context: a PTX-to-PTX pass
//! that forces every global access of a module into its tenant's partition.
//!
//! The pass adds `.const .align 16 .u64 __cumux_fence[4]` = `{base, mask,
//! lo, hi}`, loads it at the top of every function body that accesses
//! memory, and puts before each `ld`/`st`/`atom`/`red`/`prefetch`/`cp.async`
//! … whose operand is global (or generic and global by `isspacep.global`)
//! code that keeps an address inside the module's own globals `[lo, hi)` and
//! sends any other to `base | (addr & mask)`: the partition `[base, base +
//! mask + 1)`, a power of two aligned to its size. Everything else is kept
//! byte for byte. Why the fence itself cannot be overwritten: the variable is
//! `.const`, which no instruction stores to by space, and a generic or global
//! store only reaches the partition or `[lo, hi)`; whoever fills the fence
//! checks that the variable lies in neither ([`Fence::guards`]). An all-zero
//! (unfilled) fence sends every access to address 0: it fails closed.

mod access;
mod error;
mod scan;

pub use error::{FenceError, RESERVED_PREFIX};

use access::Target;
use scan::Piece;

/// The module variable the pass adds; the loader fills it.
pub const FENCE_SYMBOL: &str = "__cumux_fence";
/// The widest access a fenced instruction makes (`discard.global.L2`),
/// aligned to its size; the partition's alignment keeps it inside.
pub const MAX_ACCESS: u64 = 128;

/// The values of a module's fence variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// The partition's first address, aligned to its size.
    pub base: u64,
    /// The partition's size minus one (the size a power of two).
    pub mask: u64,
    /// The module's own `.global` variables: `[lo, hi)` passes unchanged.
    pub lo: u64,
    pub hi: u64,
}

impl Fence {
    /// The fence for partition `[base, base + size)` and globals `[lo, hi)`;
    /// `None` unless `size` is a power of two and `base` a multiple of it.
    pub fn new(base: u64, size: u64, lo: u64, hi: u64) -> Option<Fence> {
        (size.is_power_of_two() && base.is_multiple_of(size) && lo <= hi).then_some(Fence {
            base,
            mask: size - 1,
            lo,
            hi,
        })
    }

    /// The 32 bytes to copy into the fence variable.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (i, v) in [self.base, self.mask, self.lo, self.hi].iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Whether a fenced store can reach `[addr, addr + len)`: the loader
    /// refuses a fence variable this is true of.
    pub fn guards(&self, addr: u64, len: u64) -> bool {
        let end = addr.saturating_add(len);
        let meets = |lo: u64, hi: u64| addr < hi && lo < end;
        meets(
            self.base,
            self.base.saturating_add(self.mask).saturating_add(1),
        ) || meets(self.lo, self.window_end())
    }

    /// Where an access that starts in the globals window may end: accesses
    /// are aligned to their size, at most [`MAX_ACCESS`] bytes.
    pub fn window_end(&self) -> u64 {
        match self.hi.checked_next_multiple_of(MAX_ACCESS) {
            Some(end) if self.hi > self.lo => end,
            _ => self.hi,
        }
    }
}

/// A fenced module.
#[derive(Debug, Clone)]
pub struct Fenced {
    /// The rewritten PTX.
    pub ptx: String,
    /// How many address operands were fenced.
    pub fenced: usize,
    /// The module's `.global` variables: their addresses, once loaded, make
    /// the window [`Fence::lo`]..[`Fence::hi`].
    pub globals: Vec<String>,
}

/// Rewrites `src` so that every global access stays inside the fence.
pub fn fence_ptx(src: &str) -> Result<Fenced, FenceError> {
    if src.contains(RESERVED_PREFIX) {
        return Err(FenceError::ReservedName);
    }
    let pieces = scan::pieces(src).ok_or(FenceError::Malformed)?;
    let vars = Variables::of(src, &pieces);
    if calls_malloc(src, &pieces) {
        return Err(FenceError::DeviceHeap);
    }
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    edits.push(declaration_point(src)?);
    let mut prologues: Vec<(usize, usize, String)> = Vec::new();
    let mut function: Option<(usize, bool)> = None;
    let mut fenced = 0;
    for piece in &pieces {
        match *piece {
            Piece::Open {
                at,
                header,
                depth: 0,
            } => {
                let head = scan::code(&src[header.0..header.1]);
                let is_function = !head.contains('=')
                    && head
                        .split_whitespace()
                        .any(|t| t == ".entry" || t == ".func");
                function = is_function.then_some((at, false));
            }
            Piece::Close { depth: 0, .. } => {
                if let Some((at, true)) = function.take() {
                    prologues.push((at + 1, at + 1, access::prologue(FENCE_SYMBOL)));
                }
            }
            Piece::Statement { start, end, depth } if depth > 0 && function.is_some() => {
                let n = fence_statement(src, start, end, &vars, &mut edits)?;
                if n > 0 {
                    fenced += n;
                    if let Some((_, used)) = function.as_mut() {
                        *used = true;
                    }
                }
            }
            _ => {}
        }
    }
    // A body's prologue goes before any fence code at the same place.
    edits.splice(0..0, prologues);
    edits.sort_by_key(|e| (e.0, e.1));
    let mut ptx = String::with_capacity(src.len() + edits.len() * 200);
    let mut at = 0;
    for (start, end, text) in edits {
        ptx += &src[at..start];
        ptx += &text;
        at = end;
    }
    ptx += &src[at..];
    Ok(Fenced {
        ptx,
        fenced,
        globals: vars.global,
    })
}

/// After the `.address_size` line (else `.target`): the fence's declaration.
fn declaration_point(src: &str) -> Result<(usize, usize, String), FenceError> {
    let line_end = |key: &str| {
        let mut offset = 0;
        for line in src.split_inclusive('\n') {
            offset += line.len();
            if line.trim_start().starts_with(key) {
                return Some(offset);
            }
        }
        None
    };
    let at = line_end(".address_size")
        .or_else(|| line_end(".target"))
        .ok_or(FenceError::Malformed)?;
    let newline = if src[..at].ends_with('\n') { "" } else { "\n" };
    let text = format!("{newline}.const .align 16 .u64 {FENCE_SYMBOL}[4];\n");
    Ok((at, at, text))
}

/// Whether the module declares the device-side `malloc`.
fn calls_malloc(src: &str, pieces: &[Piece]) -> bool {
    pieces.iter().any(|piece| match *piece {
        Piece::Statement {
            start,
            end,
            depth: 0,
        } => {
            let code = scan::code(&src[start..end]);
            code.contains(".func")
                && code
                    .split(|c: char| !c.is_ascii() || !scan::ident_byte(c as u8))
                    .any(|t| t == "malloc")
        }
        _ => false,
    })
}

/// The names of the module's and functions' variables, by space.
struct Variables {
    global: Vec<String>,
    /// Shared, local, const and param variables, with their space.
    other: Vec<(String, &'static str)>,
}

impl Variables {
    fn of(src: &str, pieces: &[Piece]) -> Variables {
        let mut vars = Variables {
            global: Vec::new(),
            other: Vec::new(),
        };
        for piece in pieces {
            let (start, end) = match *piece {
                Piece::Statement { start, end, .. } => (start, end),
                Piece::Open { header, .. } => header,
                Piece::Close { .. } => continue,
            };
            let text = scan::code(&src[start..end]);
            let tokens: Vec<&str> = text.split_whitespace().collect();
            if tokens.first().is_none_or(|t| !t.starts_with('.')) || tokens.contains(&".reg") {
                continue;
            }
            let global = tokens.contains(&".global");
            let other = ["shared", "local", "const", "param"]
                .into_iter()
                .find(|s| tokens.contains(&format!(".{s}").as_str()));
            if !global && other.is_none() {
                continue;
            }
            let decl = text.split('=').next().unwrap_or("");
            for part in decl.split(',') {
                let name = part
                    .split(['[', '<'])
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .last()
                    .unwrap_or("");
                if name.is_empty() || name.starts_with('.') {
                    continue;
                }
                match other {
                    Some(space) if !global => vars.other.push((name.to_string(), space)),
                    _ => vars.global.push(name.to_string()),
                }
            }
        }
        vars
    }
}

/// Fences one statement `src[start..end]`: pushes its edits, returns how
/// many operands it fenced.
fn fence_statement(
    src: &str,
    start: usize,
    end: usize,
    vars: &Variables,
    edits: &mut Vec<(usize, usize, String)>,
) -> Result<usize, FenceError> {
    let bytes = src.as_bytes();
    // Labels (`$L__BB0_2:`) stay before the fence code.
    let mut ins = scan::skip_blank(src, start);
    loop {
        let mut j = ins;
        while j < end && scan::ident_byte(bytes[j]) {
            j += 1;
        }
        if j > ins && j < end && bytes[j] == b':' {
            ins = scan::skip_blank(src, j + 1);
        } else {
            break;
        }
    }
    if ins >= end {
        return Ok(0);
    }
    let text = &src[ins..end];
    let mut words = text.split_whitespace();
    let mut opcode = words.next().unwrap_or("");
    if opcode.starts_with('@') {
        opcode = words.next().unwrap_or("");
    }
    if opcode.starts_with('.') || opcode.is_empty() {
        return Ok(0);
    }
    let mut brackets = Vec::new();
    let mut i = ins;
    while i < end {
        if bytes[i] == b'[' {
            let close = src[i..end].find(']').map(|e| i + e);
            let Some(close) = close else {
                break;
            };
            brackets.push((i + 1, close));
            i = close;
        }
        i += 1;
    }
    let line = src[..ins].matches('\n').count() + 1;
    let targets = access::targets(opcode, brackets.len(), line)?;
    let mut code = String::new();
    let mut used = 0;
    for (&(open, close), target) in brackets.iter().zip(targets) {
        let expr = &src[open..close];
        if expr.contains('{') {
            return Err(FenceError::Unfenceable {
                line,
                opcode: opcode.to_string(),
            });
        }
        let head = expr.trim().split(['+', '-']).next().unwrap_or("").trim();
        let space = vars.other.iter().find(|(v, _)| v == head).map(|(_, s)| *s);
        // A generic access through another space's variable: its generic
        // address (`cvta`), fenced like any generic one, since an offset
        // could carry it anywhere.
        let (target, cvta) = match (target, space) {
            (Target::Generic, _) if vars.global.iter().any(|v| v == head) => (Target::Global, None),
            (Target::Generic, Some("param")) if expr.trim() != head => {
                return Err(FenceError::Unfenceable {
                    line,
                    opcode: opcode.to_string(),
                })
            }
            (Target::Generic, Some("param")) => (Target::Other, None),
            (Target::Generic, Some(space)) => (Target::Generic, Some(space)),
            (t, _) => (t, None),
        };
        if target == Target::Other {
            continue;
        }
        let reg = access::names::ADDR[used.min(1)];
        if used >= access::names::ADDR.len() {
            return Err(FenceError::Unfenceable {
                line,
                opcode: opcode.to_string(),
            });
        }
        code += &access::fence_code(expr, reg, target, cvta);
        edits.push((open, close, reg.to_string()));
        used += 1;
    }
    if used > 0 {
        edits.push((ins, ins, code));
    }
    Ok(used)
}

#[cfg(test)]
mod tests;
