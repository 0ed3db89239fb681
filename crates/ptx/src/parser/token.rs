//! The lexer's tokens and the parser's error type (line, column, token).

use std::fmt;

/// A syntax error with its position and the offending token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: u32,
    pub column: u32,
    pub token: String,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {}: unexpected token `{}`: {}",
            self.line, self.column, self.token, self.message
        )
    }
}

impl std::error::Error for ParseError {}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    Directive(String),
    Int(i128),
    Float(f64),
    FloatBits(u64, u32),
    Str(String),
    Punct(char),
    Eof,
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "{s}"),
            Tok::Directive(s) => write!(f, ".{s}"),
            Tok::Int(v) => write!(f, "{v}"),
            Tok::Float(v) => write!(f, "{v}"),
            Tok::FloatBits(b, 4) => write!(f, "0f{b:08X}"),
            Tok::FloatBits(b, _) => write!(f, "0d{b:016X}"),
            Tok::Str(s) => write!(f, "\"{s}\""),
            Tok::Punct(c) => write!(f, "{c}"),
            Tok::Eof => write!(f, "end of input"),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Token {
    pub tok: Tok,
    pub line: u32,
    pub col: u32,
    /// Whether whitespace (or a comment) precedes this token.
    pub spaced: bool,
}
