//! The statements of a PTX text as byte ranges: comments and strings skipped,
//! braces counted, so the fence pass can edit instructions in place.

/// One piece of PTX the scanner hands out, with its byte range in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// Text up to a `;` (the `;` excluded) at brace depth `depth`; braces
    /// inside it (vector operands) are part of it.
    Statement {
        start: usize,
        end: usize,
        depth: u32,
    },
    /// A `{` at `at`; `header` is the text since the last statement boundary.
    Open {
        at: usize,
        header: (usize, usize),
        depth: u32,
    },
    /// A `}` at `at`, closing a block opened at depth `depth`.
    Close { at: usize, depth: u32 },
}

/// Splits `src` into pieces; `None` when braces do not balance.
pub fn pieces(src: &str) -> Option<Vec<Piece>> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut depth: u32 = 0;
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
                continue;
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += 1;
                }
            }
            b';' => {
                out.push(Piece::Statement {
                    start,
                    end: i,
                    depth,
                });
                start = i + 1;
            }
            b'{' if depth > 0 && !only_labels(&code(&src[start..i])) => {
                // A vector operand `{%r1, %r2}` or an initializer, not a block.
                let close = src[i..].find('}')?;
                i += close;
            }
            b'{' => {
                out.push(Piece::Open {
                    at: i,
                    header: (start, i),
                    depth,
                });
                depth += 1;
                start = i + 1;
            }
            b'}' => {
                depth = depth.checked_sub(1)?;
                out.push(Piece::Close { at: i, depth });
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    (depth == 0).then_some(out)
}

/// Where the code of `text` starts: past whitespace and comments.
pub fn skip_blank(text: &str, mut i: usize) -> usize {
    let bytes = text.as_bytes();
    loop {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if text[i..].starts_with("//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if text[i..].starts_with("/*") {
            i = text[i..].find("*/").map_or(bytes.len(), |e| i + e + 2);
        } else {
            return i;
        }
    }
}

/// Whether `b` may appear in a PTX identifier.
pub fn ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'%')
}

/// `text` without its comments.
pub fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let next = skip_blank(text, i);
        if next > i {
            out.push(' ');
            i = next;
            continue;
        }
        let c = text[i..].chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Whether `code` is nothing but labels (`$L__BB0_31:`), as before a block.
fn only_labels(code: &str) -> bool {
    let mut rest = code.trim();
    while !rest.is_empty() {
        let name = rest.bytes().take_while(|b| ident_byte(*b)).count();
        match rest[name..].trim_start().strip_prefix(':') {
            Some(after) if name > 0 => rest = after.trim_start(),
            _ => return false,
        }
    }
    true
}
