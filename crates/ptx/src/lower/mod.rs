//! Lowering of a parsed module into executable functions: resolves register
//! names to slots, symbols to addresses, labels to instruction indices, and
//! lays out module variables, shared memory, frames and kernel parameters.
//! Instructions are lowered by family (`arith`, `compare`, `memory`,
//! `control`, `warp`, `tensor`); the result is checked by `validate` before
//! it is handed out.

mod arith;
mod body;
mod compare;
mod context;
mod control;
mod error;
mod instr;
mod layout;
mod memory;
mod modifiers;
mod module;
mod special;
mod symbols;
mod tensor;
mod warp;

#[cfg(test)]
pub(crate) use module::hand_off;
pub(crate) use module::lower_module;
