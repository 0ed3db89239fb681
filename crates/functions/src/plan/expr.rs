//! Plan expressions: integer and float arithmetic over named values (input
//! sizes and shapes, scalar parameters), parsed once at registration,
//! evaluated per call.
//!
//! The language is deliberately tiny: numbers, names, an input's dimension
//! (`x.shape[0]`, `x.shape[-1]` the last), `+ - * / %`, unary minus,
//! parentheses and `min`, `max`, `cdiv` (ceiling division). Integers
//! are i64 with checked arithmetic (an overflow is an error, never a wrap);
//! an operation with a float operand is a float one.

use std::fmt;

/// Longest expression accepted (bytes).
pub const MAX_EXPR_BYTES: usize = 256;
/// Deepest nesting of parentheses and calls.
const MAX_DEPTH: usize = 32;

/// A value an expression computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{v}"),
        }
    }
}

impl Value {
    fn float(self) -> f64 {
        match self {
            Value::Int(v) => v as f64,
            Value::Float(v) => v,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    Min,
    Max,
    Cdiv,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Num(Value),
    Var(String),
    /// Dimension `.1` of input `.0`'s shape (negative: from the end).
    Dim(String, i64),
    Neg(Box<Node>),
    Bin(Op, Box<Node>, Box<Node>),
    Call(Func, Box<Node>, Box<Node>),
}

/// A parsed expression and its source text.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    node: Node,
    source: String,
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Num(Value),
    Name(String),
    /// `name.shape[index]`.
    Dim(String, i64),
    Op(char),
}

/// The largest dimension index an expression may name.
const MAX_DIM_INDEX: i64 = 64;

/// After a name, `.shape[INDEX]` (`INDEX` an integer, maybe negative): the
/// index and the bytes it took; `None` if `rest` does not start with `.`.
fn dim_suffix(rest: &str) -> Option<Result<(i64, usize), String>> {
    let after = rest.strip_prefix('.')?;
    let Some(inner) = after.strip_prefix("shape[") else {
        return Some(Err(
            "after a name, \".\" only starts \".shape[INDEX]\" (a dimension of an input)"
                .to_string(),
        ));
    };
    let Some(close) = inner.find(']') else {
        return Some(Err("\".shape[\" without its \"]\"".to_string()));
    };
    let text = inner[..close].trim();
    let index = text
        .parse::<i64>()
        .ok()
        .filter(|i| i.abs() <= MAX_DIM_INDEX)
        .ok_or_else(|| format!("{text:?} is not a dimension index (an integer, -1 the last)"));
    Some(index.map(|i| (i, 1 + "shape[".len() + close + 1)))
}

fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i] as char;
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            let mut float = false;
            while i < bytes.len() {
                let d = bytes[i] as char;
                let exponent_sign = (d == '-' || d == '+')
                    && i > start
                    && matches!(bytes[i - 1] as char, 'e' | 'E');
                if d.is_ascii_digit() || exponent_sign {
                    i += 1;
                } else if d == '.' || d == 'e' || d == 'E' {
                    float = true;
                    i += 1;
                } else {
                    break;
                }
            }
            let word = &text[start..i];
            let value = match float {
                false => word.parse::<i64>().map(Value::Int).ok(),
                true => word
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .map(Value::Float),
            };
            out.push(Token::Num(
                value.ok_or_else(|| format!("{word:?} is not a number"))?,
            ));
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let name = text[start..i].to_string();
            match dim_suffix(&text[i..]) {
                None => out.push(Token::Name(name)),
                Some(Ok((index, taken))) => {
                    out.push(Token::Dim(name, index));
                    i += taken;
                }
                Some(Err(why)) => return Err(format!("{name}: {why}")),
            }
        } else if "+-*/%(),".contains(c) {
            out.push(Token::Op(c));
            i += 1;
        } else {
            let shown = text[i..].chars().next().unwrap_or(c);
            return Err(format!("unexpected {shown:?} at byte {i}"));
        }
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.at).cloned();
        self.at += 1;
        t
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        match self.next() {
            Some(Token::Op(o)) if o == c => Ok(()),
            Some(other) => Err(format!("expected {c:?}, found {}", shown(&other))),
            None => Err(format!("expected {c:?} at the end")),
        }
    }

    fn sum(&mut self) -> Result<Node, String> {
        let mut left = self.product()?;
        while let Some(Token::Op(c @ ('+' | '-'))) = self.peek() {
            let op = if *c == '+' { Op::Add } else { Op::Sub };
            self.at += 1;
            let right = self.product()?;
            left = Node::Bin(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn product(&mut self) -> Result<Node, String> {
        let mut left = self.unary()?;
        while let Some(Token::Op(c @ ('*' | '/' | '%'))) = self.peek() {
            let op = match c {
                '*' => Op::Mul,
                '/' => Op::Div,
                _ => Op::Rem,
            };
            self.at += 1;
            let right = self.unary()?;
            left = Node::Bin(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Node, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("nested more than {MAX_DEPTH} deep"));
        }
        let node = match self.next() {
            Some(Token::Op('-')) => Node::Neg(Box::new(self.unary()?)),
            Some(Token::Op('(')) => {
                let inner = self.sum()?;
                self.expect(')')?;
                inner
            }
            Some(Token::Num(v)) => Node::Num(v),
            Some(Token::Dim(name, index)) => Node::Dim(name, index),
            Some(Token::Name(name)) => match self.peek() {
                Some(Token::Op('(')) => {
                    let func = match name.as_str() {
                        "min" => Func::Min,
                        "max" => Func::Max,
                        "cdiv" => Func::Cdiv,
                        _ => return Err(format!("unknown function {name:?} (min, max, cdiv)")),
                    };
                    self.at += 1;
                    let a = self.sum()?;
                    self.expect(',')?;
                    let b = self.sum()?;
                    self.expect(')')?;
                    Node::Call(func, Box::new(a), Box::new(b))
                }
                _ => Node::Var(name),
            },
            Some(other) => return Err(format!("unexpected {}", shown(&other))),
            None => return Err("unexpected end".into()),
        };
        self.depth -= 1;
        Ok(node)
    }
}

fn shown(t: &Token) -> String {
    match t {
        Token::Num(v) => format!("number {v}"),
        Token::Name(n) => format!("name {n:?}"),
        Token::Dim(n, i) => format!("{n}.shape[{i}]"),
        Token::Op(c) => format!("{c:?}"),
    }
}

fn arith(op: Op, a: Value, b: Value) -> Result<Value, String> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => {
            let r = match op {
                Op::Add => x.checked_add(y),
                Op::Sub => x.checked_sub(y),
                Op::Mul => x.checked_mul(y),
                Op::Div | Op::Rem if y == 0 => return Err(format!("{x} divided by zero")),
                Op::Div => x.checked_div(y),
                Op::Rem => x.checked_rem(y),
            };
            r.map(Value::Int)
                .ok_or_else(|| format!("{x} {op:?} {y} overflows 64 bits"))
        }
        _ => {
            let (x, y) = (a.float(), b.float());
            let r = match op {
                Op::Add => x + y,
                Op::Sub => x - y,
                Op::Mul => x * y,
                Op::Div => x / y,
                Op::Rem => x % y,
            };
            match r.is_finite() {
                true => Ok(Value::Float(r)),
                false => Err(format!("{x} {op:?} {y} is not a finite number")),
            }
        }
    }
}

/// What an expression reads its names from.
pub trait Scope {
    /// The value of `name`.
    fn value(&self, name: &str) -> Option<Value>;
    /// Dimension `index` of input `name`'s shape (negative: from the end).
    fn dim(&self, name: &str, index: i64) -> Result<Value, String>;
}

/// Names from a function, and no shapes.
struct Names<'a>(&'a dyn Fn(&str) -> Option<Value>);

impl Scope for Names<'_> {
    fn value(&self, name: &str) -> Option<Value> {
        (self.0)(name)
    }

    fn dim(&self, name: &str, index: i64) -> Result<Value, String> {
        Err(format!("{name}.shape[{index}]: no shape is known here"))
    }
}

fn eval_node(node: &Node, lookup: &dyn Scope) -> Result<Value, String> {
    Ok(match node {
        Node::Num(v) => *v,
        Node::Var(name) => lookup
            .value(name)
            .ok_or_else(|| format!("unknown name {name:?}"))?,
        Node::Dim(name, index) => lookup.dim(name, *index)?,
        Node::Neg(inner) => match eval_node(inner, lookup)? {
            Value::Int(v) => {
                Value::Int(v.checked_neg().ok_or_else(|| format!("-({v}) overflows"))?)
            }
            Value::Float(v) => Value::Float(-v),
        },
        Node::Bin(op, a, b) => arith(*op, eval_node(a, lookup)?, eval_node(b, lookup)?)?,
        Node::Call(func, a, b) => {
            let (a, b) = (eval_node(a, lookup)?, eval_node(b, lookup)?);
            match (func, a, b) {
                (Func::Min, Value::Int(x), Value::Int(y)) => Value::Int(x.min(y)),
                (Func::Max, Value::Int(x), Value::Int(y)) => Value::Int(x.max(y)),
                (Func::Min, _, _) => Value::Float(a.float().min(b.float())),
                (Func::Max, _, _) => Value::Float(a.float().max(b.float())),
                (Func::Cdiv, Value::Int(x), Value::Int(y)) => {
                    if y <= 0 || x < 0 {
                        return Err(format!("cdiv({x}, {y}) needs x >= 0 and y > 0"));
                    }
                    Value::Int(x / y + i64::from(x % y != 0))
                }
                (Func::Cdiv, _, _) => return Err("cdiv takes integers".into()),
            }
        }
    })
}

fn dims<'a>(node: &'a Node, out: &mut Vec<(&'a str, i64)>) {
    match node {
        Node::Num(_) | Node::Var(_) => {}
        Node::Dim(name, index) => out.push((name, *index)),
        Node::Neg(inner) => dims(inner, out),
        Node::Bin(_, a, b) | Node::Call(_, a, b) => {
            dims(a, out);
            dims(b, out);
        }
    }
}

fn names<'a>(node: &'a Node, out: &mut Vec<&'a str>) {
    match node {
        Node::Num(_) => {}
        Node::Var(name) | Node::Dim(name, _) => out.push(name),
        Node::Neg(inner) => names(inner, out),
        Node::Bin(_, a, b) | Node::Call(_, a, b) => {
            names(a, out);
            names(b, out);
        }
    }
}

impl Expr {
    /// Parses `text`; the error says what is wrong, for the caller to place.
    pub fn parse(text: &str) -> Result<Expr, String> {
        if text.len() > MAX_EXPR_BYTES {
            return Err(format!("an expression has at most {MAX_EXPR_BYTES} bytes"));
        }
        let mut parser = Parser {
            tokens: tokens(text)?,
            at: 0,
            depth: 0,
        };
        if parser.tokens.is_empty() {
            return Err("empty expression".into());
        }
        let node = parser.sum()?;
        if let Some(extra) = parser.peek() {
            return Err(format!("unexpected {} after the expression", shown(extra)));
        }
        Ok(Expr {
            node,
            source: text.trim().to_string(),
        })
    }

    /// An expression of one integer.
    pub fn int(v: i64) -> Expr {
        Expr {
            node: Node::Num(Value::Int(v)),
            source: v.to_string(),
        }
    }

    /// The names the expression reads (those of the inputs whose
    /// dimensions it reads among them).
    pub fn names(&self) -> Vec<&str> {
        let mut out = Vec::new();
        names(&self.node, &mut out);
        out
    }

    /// The input dimensions the expression reads: (input, index).
    pub fn dims(&self) -> Vec<(&str, i64)> {
        let mut out = Vec::new();
        dims(&self.node, &mut out);
        out
    }

    /// The value, with names looked up in `lookup` (and no shapes).
    pub fn eval(&self, lookup: &dyn Fn(&str) -> Option<Value>) -> Result<Value, String> {
        eval_node(&self.node, &Names(lookup))
    }

    /// The value, with names and dimensions read from `scope`.
    pub fn eval_in(&self, scope: &dyn Scope) -> Result<Value, String> {
        eval_node(&self.node, scope)
    }

    /// The value of an expression that reads no name, if it reads none.
    pub fn constant(&self) -> Option<Result<Value, String>> {
        self.names().is_empty().then(|| self.eval(&|_| None))
    }
}

/// `value` as a count of at least `min` and at most `max`.
pub fn count(value: Value, min: i64, max: i64) -> Result<u64, String> {
    match value {
        Value::Int(v) if (min..=max).contains(&v) => Ok(v as u64),
        Value::Int(v) => Err(format!("{v} is not within {min}..={max}")),
        Value::Float(v) => Err(format!("{v} is not an integer")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(text: &str) -> Result<Value, String> {
        Expr::parse(text)?.eval(&|name| match name {
            "n" => Some(Value::Int(1000)),
            "alpha" => Some(Value::Float(0.5)),
            _ => None,
        })
    }

    #[test]
    fn integers_keep_integer_arithmetic_and_precedence() {
        assert_eq!(eval("cdiv(n, 256)"), Ok(Value::Int(4)));
        assert_eq!(eval("n / 3 * 3 + n % 3"), Ok(Value::Int(1000)));
        assert_eq!(eval("-(2 + 3) * 4"), Ok(Value::Int(-20)));
        assert_eq!(eval("max(n, 2048) - min(1, 2)"), Ok(Value::Int(2047)));
        assert_eq!(eval("n * alpha"), Ok(Value::Float(500.0)));
        assert_eq!(eval("1.5e2"), Ok(Value::Float(150.0)));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        assert_eq!(eval("n / 0"), Err("1000 divided by zero".into()));
        assert!(eval("9223372036854775807 + 1")
            .unwrap_err()
            .contains("overflows"));
        assert_eq!(eval("m + 1"), Err("unknown name \"m\"".into()));
        assert!(Expr::parse("1 +").unwrap_err().contains("unexpected end"));
        assert!(Expr::parse("(1").unwrap_err().contains("expected ')'"));
        assert!(Expr::parse("sqrt(4, 2)")
            .unwrap_err()
            .contains("unknown function"));
        assert!(Expr::parse("1 $ 2").unwrap_err().contains("'$'"));
        assert!(Expr::parse("").unwrap_err().contains("empty"));
        assert!(Expr::parse(&"(".repeat(100))
            .unwrap_err()
            .contains("nested"));
        assert!(Expr::parse(&"1+".repeat(200))
            .unwrap_err()
            .contains("at most"));
    }

    #[test]
    fn dimensions_of_inputs_read_their_shapes() {
        struct Shapes;
        impl Scope for Shapes {
            fn value(&self, name: &str) -> Option<Value> {
                (name == "k").then_some(Value::Int(3))
            }
            fn dim(&self, name: &str, index: i64) -> Result<Value, String> {
                let shape = [4i64, 5];
                let at = if index < 0 { 2 + index } else { index };
                match (name, usize::try_from(at).ok().and_then(|i| shape.get(i))) {
                    ("x", Some(d)) => Ok(Value::Int(*d)),
                    _ => Err(format!("{name}.shape[{index}]: out of range")),
                }
            }
        }
        let e = Expr::parse("x.shape[0] * x.shape[-1] + k").unwrap();
        assert_eq!(e.eval_in(&Shapes), Ok(Value::Int(23)));
        assert_eq!(e.names(), ["x", "x", "k"]);
        assert_eq!(e.dims(), [("x", 0), ("x", -1)]);
        assert_eq!(e.constant(), None);
        assert_eq!(
            Expr::parse("x.shape[ 2 ]").unwrap().eval_in(&Shapes),
            Err("x.shape[2]: out of range".into())
        );
        assert!(Expr::parse("x.size")
            .unwrap_err()
            .starts_with("x: after a name"));
        assert!(Expr::parse("x.shape[1")
            .unwrap_err()
            .contains("without its"));
        assert!(Expr::parse("x.shape[a]")
            .unwrap_err()
            .contains("not a dimension index"));
        assert!(Expr::parse("x.shape[0]")
            .unwrap()
            .eval(&|_| None)
            .unwrap_err()
            .contains("no shape is known here"));
    }

    #[test]
    fn names_and_constants() {
        let e = Expr::parse("cdiv(n, block) + 1").unwrap();
        assert_eq!(e.names(), ["n", "block"]);
        assert_eq!(e.constant(), None);
        assert_eq!(
            Expr::parse("2*3").unwrap().constant(),
            Some(Ok(Value::Int(6)))
        );
        assert_eq!(count(Value::Int(5), 1, 10), Ok(5));
        assert!(count(Value::Int(0), 1, 10).is_err());
        assert!(count(Value::Float(1.0), 1, 10).is_err());
    }
}
