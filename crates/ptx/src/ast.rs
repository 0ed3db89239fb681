//! The syntax tree of a PTX module as the parser produces it.
//! Instructions stay generic here (opcode, dot-modifiers, operands); their
//! meaning is decided when the module is lowered for the interpreter.

/// A whole PTX module.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Module {
    /// `.version` as major*10+minor (9.0 -> 90).
    pub version: u32,
    /// `.target` entries, e.g. `sm_75`.
    pub targets: Vec<String>,
    /// `.address_size` (64 unless stated).
    pub address_size: u32,
    /// Variables and functions in source order.
    pub items: Vec<Item>,
}

/// A module-level item.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Var(VarDecl),
    Func(Function),
}

/// State space of a variable or memory operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateSpace {
    Reg,
    Global,
    Const,
    Shared,
    Local,
    Param,
}

/// Linkage attributes of a declaration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Linkage {
    pub visible: bool,
    pub external: bool,
    pub weak: bool,
}

/// A variable declaration (module scope or inside a function body).
#[derive(Debug, Clone, PartialEq)]
pub struct VarDecl {
    pub space: StateSpace,
    pub linkage: Linkage,
    pub align: Option<u32>,
    /// Vector width from `.v2`/`.v4`, 1 otherwise.
    pub vector: u32,
    /// Element type name without the dot (`b8`, `u32`, `f32`, `pred` …).
    pub ty: String,
    pub name: String,
    /// Array dimensions; `Some(None)` entries are `[]` (unsized, extern shared).
    pub dims: Vec<Option<u64>>,
    /// `%r<76>` declares 76 registers `%r0`..`%r75`.
    pub range: Option<u32>,
    pub init: Option<Initializer>,
    pub line: u32,
}

/// A variable initializer.
#[derive(Debug, Clone, PartialEq)]
pub enum Initializer {
    Int(i128),
    Float(f64),
    /// Float given as raw bits (`0f3F800000` / `0d…`), with its byte width.
    FloatBits(u64, u32),
    /// Address of a symbol plus offset (`sym`, `sym+4`, `generic(sym)`).
    Symbol {
        name: String,
        offset: i64,
        generic: bool,
    },
    List(Vec<Initializer>),
}

/// A parameter of an `.entry` or `.func`.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub name: String,
    pub ty: String,
    pub align: Option<u32>,
    pub array: Option<u64>,
    /// `.reg` parameters of `.func` (rare) instead of `.param`.
    pub is_reg: bool,
}

/// A kernel (`.entry`) or device function (`.func`).
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    pub is_entry: bool,
    pub linkage: Linkage,
    pub returns: Vec<Param>,
    pub params: Vec<Param>,
    pub tuning: Tuning,
    /// `None` for a prototype without body.
    pub body: Option<Vec<Statement>>,
    pub line: u32,
}

/// The performance-tuning directives of a function.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tuning {
    /// `.maxntid`: the largest block shape.
    pub maxntid: Option<[u32; 3]>,
    /// `.reqntid`: the block shape every launch must have.
    pub reqntid: Option<[u32; 3]>,
    pub minnctapersm: Option<u32>,
    pub maxnreg: Option<u32>,
}

/// One statement of a function body.
#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    Label(String, u32),
    Var(VarDecl),
    Instr(Instruction),
    /// A `{ … }` scope.
    Block(Vec<Statement>),
}

/// A guard predicate `@%p` / `@!%p`.
#[derive(Debug, Clone, PartialEq)]
pub struct Guard {
    pub negated: bool,
    pub reg: String,
}

/// An instruction: `opcode.mod.mod operand, operand;`.
#[derive(Debug, Clone, PartialEq)]
pub struct Instruction {
    pub guard: Option<Guard>,
    pub opcode: String,
    pub modifiers: Vec<String>,
    pub operands: Vec<Operand>,
    pub line: u32,
    pub column: u32,
}

impl Instruction {
    /// Whether the instruction carries the dot-modifier `modifier`.
    pub fn has(&self, modifier: &str) -> bool {
        self.modifiers.iter().any(|m| m == modifier)
    }
}

/// An instruction operand.
#[derive(Debug, Clone, PartialEq)]
pub enum Operand {
    /// A register, special register or symbol name (`%r1`, `%tid.x`, `sym`).
    Name(String),
    /// `!%p`.
    Not(String),
    /// `sym+4` outside brackets.
    NameOffset(String, i64),
    Int(i128),
    Float(f64),
    FloatBits(u64, u32),
    /// `[base+offset]`; base `None` for an absolute address.
    Address {
        base: Option<String>,
        offset: i64,
    },
    /// `{a, b, …}`.
    Vector(Vec<Operand>),
    /// `a|b` (shfl/setp second destination).
    Pair(Box<Operand>, Box<Operand>),
    /// `( … )` in call syntax.
    List(Vec<Operand>),
    /// `_`.
    Sink,
}
