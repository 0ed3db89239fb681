//! PTX value semantics on raw register bits, free of any interpreter state:
//! what each arithmetic, comparison, conversion and atomic op computes. The
//! interpreter calls these per instruction; a compiled backend can call them
//! as runtime helpers for the ops it does not open-code.

mod atomic;
mod compare;
mod convert;
mod float;
mod int;
mod ternary;
mod unary;

pub(crate) use atomic::atom_apply;
pub(crate) use compare::{compare, testp};
pub(crate) use convert::cvt;
pub(crate) use float::{canon_nan, directed_unary, float_bin, fval, to_fbits};
pub(crate) use int::{bfi, carry, int_bin, lop3, prmt, sext};
pub(crate) use ternary::tern;
pub(crate) use unary::{relu, un_op};
