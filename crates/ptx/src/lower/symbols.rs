//! What a name stands for while lowering: a module symbol (variable,
//! function, kernel parameter) or a register of the function being lowered.

use crate::ir::Ty;

/// Function index that stands for the external `vprintf`.
pub(super) const VPRINTF: u32 = u32::MAX - 1;

/// A resolved symbol.
#[derive(Debug, Clone, Copy)]
pub(super) enum Sym {
    /// Global/const variable at a device address.
    Global(u64),
    /// Shared variable at a shared-window offset.
    Shared(u64),
    /// Local or in-body param variable at a frame offset, with its size.
    Frame(u32, u32),
    /// Kernel parameter at an offset of the parameter buffer.
    KParam(u32),
    Func(u32),
}

/// What a name is bound to in a function's scope.
#[derive(Debug, Clone, Copy)]
pub(super) enum Binding {
    Reg(u32, Ty),
    Sym(Sym),
}
