//! PTX text to [`crate::ast::Module`]: a hand-written lexer and recursive-descent
//! parser. It never panics; every error names line, column and the token.

mod grammar;
mod lex;
mod token;

pub use grammar::parse;
pub use token::ParseError;
