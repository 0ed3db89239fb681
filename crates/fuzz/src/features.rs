//! What a target saw while checking one input, as hashed features (a decoded
//! variant, an error's kind, a call and its result code): the loop keeps an
//! input that shows a feature no earlier input showed, so it mutates further
//! from inputs that reached somewhere new.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

/// How many features the messages of one tag can give.
pub const MESSAGE_BUCKETS: u64 = 256;

/// The features one check saw, in the order it saw them.
#[derive(Debug, Default, Clone)]
pub struct Features {
    seen: Vec<u64>,
}

impl Features {
    /// Records `what`: any hashable description of where the input led.
    pub fn add(&mut self, what: impl Hash) {
        let mut hasher = DefaultHasher::new();
        what.hash(&mut hasher);
        self.seen.push(hasher.finish());
    }

    /// Records an error or a message by its shape only (see [`shape`]), so
    /// inputs that fail the same way count once whatever numbers they carry;
    /// shapes fall into [`MESSAGE_BUCKETS`] buckets per tag, as messages that
    /// name what the input wrote (an identifier) would otherwise count anew
    /// for every mutation.
    pub fn add_message(&mut self, tag: &str, message: &str) {
        let mut hasher = DefaultHasher::new();
        shape(message).hash(&mut hasher);
        self.add((tag, hasher.finish() % MESSAGE_BUCKETS));
    }

    pub fn clear(&mut self) {
        self.seen.clear();
    }

    pub fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.seen.iter().copied()
    }
}

/// A message without what varies between inputs: digits, and text in quotes
/// or backticks; at most 80 characters of it.
pub fn shape(message: &str) -> String {
    let mut out = String::new();
    let mut quoted: Option<char> = None;
    for c in message.chars() {
        match quoted {
            Some(q) if c == q => quoted = None,
            Some(_) => {}
            None if matches!(c, '"' | '`' | '\'') => {
                quoted = Some(c);
                out.push('_');
            }
            None if c.is_ascii_digit() => {}
            None => out.push(c),
        }
        if out.len() >= 80 {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_drop_numbers_and_quoted_text() {
        assert_eq!(
            shape("line 12, column 3: unexpected token `!`: expected instruction"),
            shape("line 9, column 41: unexpected token `%`: expected instruction")
        );
        assert_ne!(shape("expected operand"), shape("expected instruction"));
    }
}
