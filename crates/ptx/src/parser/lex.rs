//! PTX text to tokens: identifiers, directives, numbers (including the `0f`/`0d`
//! float-bit forms), strings and punctuation, with line and column.

use super::token::{ParseError, Tok, Token};

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b'$' || c == b'%'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c == b'.'
}

pub(super) fn lex(src: &str) -> Result<Vec<Token>, ParseError> {
    let b = src.as_bytes();
    let mut i = 0usize;
    let mut line = 1u32;
    let mut line_start = 0usize;
    let mut out = Vec::new();
    let mut spaced = true;
    let err = |line: u32, col: u32, token: String, message: &str| ParseError {
        line,
        column: col,
        token,
        message: message.to_string(),
    };
    while i < b.len() {
        let c = b[i];
        let col = (i - line_start + 1) as u32;
        if c == b'\n' {
            line = line.wrapping_add(1);
            i += 1;
            line_start = i;
            spaced = true;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            spaced = true;
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            spaced = true;
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let (l0, c0) = (line, col);
            i += 2;
            loop {
                if i + 1 >= b.len() {
                    return Err(err(l0, c0, "/*".into(), "unterminated comment"));
                }
                if b[i] == b'*' && b[i + 1] == b'/' {
                    i += 2;
                    break;
                }
                if b[i] == b'\n' {
                    line = line.wrapping_add(1);
                    line_start = i + 1;
                }
                i += 1;
            }
            spaced = true;
            continue;
        }
        let start = i;
        let tok = if c == b'"' {
            i += 1;
            let s0 = i;
            while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                if b[i] == b'\\' && i + 1 < b.len() && b[i + 1] != b'\n' {
                    i += 1;
                }
                i += 1;
            }
            if i >= b.len() || b[i] != b'"' {
                return Err(err(line, col, "\"".into(), "unterminated string"));
            }
            let s = src.get(s0..i).unwrap_or("").to_string();
            i += 1;
            Tok::Str(s)
        } else if c == b'.' && i + 1 < b.len() && is_ident_start(b[i + 1]) {
            i += 1;
            let s0 = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'$') {
                i += 1;
            }
            Tok::Directive(src[s0..i].to_string())
        } else if is_ident_start(c) {
            i += 1;
            loop {
                if i < b.len() && is_ident_char(b[i]) {
                    i += 1;
                } else if i + 2 < b.len()
                    && b[i] == b':'
                    && b[i + 1] == b':'
                    && b[i + 2].is_ascii_alphanumeric()
                {
                    // cache-policy modifiers such as `.L1::no_allocate`
                    i += 2;
                } else {
                    break;
                }
            }
            Tok::Ident(src[start..i].to_string())
        } else if c.is_ascii_digit() {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                // exponent sign: 1.5e-3
                i += 1;
                if i < b.len()
                    && (b[i] == b'-' || b[i] == b'+')
                    && (b[i - 1] == b'e' || b[i - 1] == b'E')
                    && !src[start..i].starts_with("0x")
                    && !src[start..i].starts_with("0X")
                    && !src[start..i].starts_with("0f")
                    && !src[start..i].starts_with("0d")
                {
                    i += 1;
                }
            }
            let text = &src[start..i];
            match parse_number(text) {
                Some(t) => t,
                None => return Err(err(line, col, text.to_string(), "malformed number")),
            }
        } else if b"{}[]()<>,;:+-!@|=*".contains(&c) {
            i += 1;
            Tok::Punct(c as char)
        } else {
            let ch = src[i..].chars().next().unwrap_or('?');
            return Err(err(line, col, ch.to_string(), "unexpected character"));
        };
        out.push(Token {
            tok,
            line,
            col,
            spaced,
        });
        spaced = false;
    }
    let col = (b.len() - line_start + 1) as u32;
    out.push(Token {
        tok: Tok::Eof,
        line,
        col,
        spaced: true,
    });
    Ok(out)
}

fn parse_number(text: &str) -> Option<Tok> {
    let t = text.strip_suffix(['U', 'u']).unwrap_or(text);
    let lower = t.to_ascii_lowercase();
    // `0f` and 8 hex digits: the bits of an f32; `0d` and 16: of an f64
    for (prefix, width) in [("0f", 4u32), ("0d", 8)] {
        if let Some(h) = lower.strip_prefix(prefix) {
            if h.len() != 2 * width as usize {
                return None;
            }
            return u64::from_str_radix(h, 16)
                .ok()
                .map(|v| Tok::FloatBits(v, width));
        }
    }
    if let Some(h) = lower.strip_prefix("0x") {
        return int_token(h, 16);
    }
    if let Some(h) = lower.strip_prefix("0b") {
        return int_token(h, 2);
    }
    if lower.contains('.') || lower.contains('e') {
        return lower.parse::<f64>().ok().map(Tok::Float);
    }
    if lower.len() > 1 && lower.starts_with('0') {
        return int_token(&lower[1..], 8);
    }
    int_token(&lower, 10)
}

/// An integer token of at most 64 bits written in `radix`.
fn int_token(digits: &str, radix: u32) -> Option<Tok> {
    u128::from_str_radix(digits, radix)
        .ok()
        .filter(|v| *v <= u64::MAX as u128)
        .map(|v| Tok::Int(v as i128))
}
