//! A parsed module to an `ir::Module`: names to register slots, symbols to
//! addresses, labels to instruction indices, variables, frames and parameters
//! laid out; instructions lowered by family; the result checked on hand-off.

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
