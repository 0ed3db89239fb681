//! Tokens to [`Module`]: a recursive-descent parser over module items,
//! declarations, function bodies and instructions. It never panics; nesting
//! is bounded by `MAX_DEPTH`.

use super::lex::lex;
use super::token::{ParseError, Tok, Token};
use crate::ast::*;

const MAX_DEPTH: u32 = 64;

struct Parser {
    toks: Vec<Token>,
    pos: usize,
    depth: u32,
}

type PResult<T> = Result<T, ParseError>;

/// Parses PTX text into a module.
pub fn parse(src: &str) -> Result<Module, ParseError> {
    let toks = lex(src)?;
    let mut p = Parser {
        toks,
        pos: 0,
        depth: 0,
    };
    p.module()
}

impl Parser {
    fn peek(&self) -> &Token {
        let last = self.toks.len().saturating_sub(1);
        &self.toks[self.pos.min(last)]
    }
    fn peek_at(&self, n: usize) -> &Tok {
        let last = self.toks.len().saturating_sub(1);
        &self.toks[(self.pos + n).min(last)].tok
    }
    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        t
    }
    fn err_at<T>(&self, t: &Token, msg: &str) -> PResult<T> {
        Err(ParseError {
            line: t.line,
            column: t.col,
            token: t.tok.to_string(),
            message: msg.to_string(),
        })
    }
    fn err<T>(&self, msg: &str) -> PResult<T> {
        let t = self.peek().clone();
        self.err_at(&t, msg)
    }
    fn is_punct(&self, c: char) -> bool {
        self.peek().tok == Tok::Punct(c)
    }
    fn eat_punct(&mut self, c: char) -> bool {
        if self.is_punct(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn expect_punct(&mut self, c: char) -> PResult<()> {
        if self.eat_punct(c) {
            Ok(())
        } else {
            self.err(&format!("expected `{c}`"))
        }
    }
    /// A comma-separated, possibly empty, list of `item`s up to and
    /// including `close`.
    fn list_until<T>(
        &mut self,
        close: char,
        mut item: impl FnMut(&mut Self) -> PResult<T>,
    ) -> PResult<Vec<T>> {
        let mut items = Vec::new();
        if !self.is_punct(close) {
            loop {
                items.push(item(self)?);
                if !self.eat_punct(',') {
                    break;
                }
            }
        }
        self.expect_punct(close)?;
        Ok(items)
    }
    fn is_dir(&self, d: &str) -> bool {
        matches!(&self.peek().tok, Tok::Directive(s) if s == d)
    }
    fn ident(&mut self, what: &str) -> PResult<String> {
        match &self.peek().tok {
            Tok::Ident(s) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => self.err(&format!("expected {what}")),
        }
    }
    fn int(&mut self, what: &str) -> PResult<i128> {
        let neg = self.eat_punct('-');
        match self.peek().tok {
            Tok::Int(v) => {
                self.pos += 1;
                Ok(if neg { -v } else { v })
            }
            _ => self.err(&format!("expected {what}")),
        }
    }
    fn u32_val(&mut self, what: &str) -> PResult<u32> {
        let t = self.peek().clone();
        let v = self.int(what)?;
        u32::try_from(v).or_else(|_| self.err_at(&t, &format!("{what} out of range")))
    }
    fn skip_to_semicolon(&mut self) {
        while !matches!(self.peek().tok, Tok::Punct(';') | Tok::Eof) {
            self.pos += 1;
        }
        self.eat_punct(';');
    }
    /// Skips the rest of the current source line (for `.loc` and friends).
    fn skip_line(&mut self) {
        let line = self.toks.get(self.pos.saturating_sub(1)).map(|t| t.line);
        while self.peek().tok != Tok::Eof && Some(self.peek().line) == line {
            self.pos += 1;
        }
    }

    fn module(&mut self) -> PResult<Module> {
        let mut m = Module {
            address_size: 64,
            ..Default::default()
        };
        loop {
            let t = self.peek().clone();
            match &t.tok {
                Tok::Eof => break,
                Tok::Directive(d) => match d.as_str() {
                    "version" => {
                        self.pos += 1;
                        match self.next().tok {
                            Tok::Float(f) if (0.0..1000.0).contains(&f) => {
                                m.version = (f * 10.0).round() as u32;
                            }
                            Tok::Int(v) if (0..100).contains(&v) => m.version = v as u32 * 10,
                            _ => return self.err_at(&t, "expected version number after .version"),
                        }
                    }
                    "target" => {
                        self.pos += 1;
                        m.targets.push(self.ident("target name")?);
                        while self.eat_punct(',') {
                            m.targets.push(self.ident("target name")?);
                        }
                    }
                    "address_size" => {
                        self.pos += 1;
                        m.address_size = self.u32_val("address size")?;
                        if m.address_size != 64 && m.address_size != 32 {
                            return self.err_at(&t, "address size must be 32 or 64");
                        }
                    }
                    "file" | "loc" => {
                        self.pos += 1;
                        self.skip_line();
                    }
                    "section" => {
                        self.pos += 1;
                        self.skip_section()?;
                    }
                    "pragma" => {
                        self.pos += 1;
                        self.skip_to_semicolon();
                    }
                    _ => {
                        let item = self.item()?;
                        if let Some(item) = item {
                            m.items.push(item);
                        }
                    }
                },
                _ => return self.err_at(&t, "expected a directive"),
            }
        }
        Ok(m)
    }

    fn skip_section(&mut self) -> PResult<()> {
        // .section name { ... }
        while !self.is_punct('{') {
            if self.peek().tok == Tok::Eof {
                return self.err("expected `{` after .section");
            }
            self.pos += 1;
        }
        let mut depth = 0i32;
        loop {
            match self.next().tok {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                Tok::Eof => return self.err("unterminated .section"),
                _ => {}
            }
        }
    }

    fn linkage(&mut self) -> Linkage {
        let mut l = Linkage::default();
        loop {
            if self.is_dir("visible") {
                l.visible = true;
            } else if self.is_dir("extern") {
                l.external = true;
            } else if self.is_dir("weak") || self.is_dir("common") {
                l.weak = true;
            } else {
                return l;
            }
            self.pos += 1;
        }
    }

    fn item(&mut self) -> PResult<Option<Item>> {
        let linkage = self.linkage();
        let t = self.peek().clone();
        match &t.tok {
            Tok::Directive(d) if d == "entry" || d == "func" => {
                self.pos += 1;
                Ok(Some(Item::Func(self.function(
                    d == "entry",
                    linkage,
                    t.line,
                )?)))
            }
            Tok::Directive(d) if matches!(d.as_str(), "global" | "const" | "shared" | "local") => {
                let v = self.var_decl(linkage)?;
                self.expect_punct(';')?;
                Ok(Some(Item::Var(v)))
            }
            _ => self.err_at(&t, "expected .entry, .func or a variable declaration"),
        }
    }

    fn space_of(d: &str) -> Option<StateSpace> {
        Some(match d {
            "reg" => StateSpace::Reg,
            "global" => StateSpace::Global,
            "const" => StateSpace::Const,
            "shared" => StateSpace::Shared,
            "local" => StateSpace::Local,
            "param" => StateSpace::Param,
            _ => return None,
        })
    }

    /// `.space [.align N] [.vN] .type name[dims] [= init];` (also `.reg` lists).
    fn var_decl(&mut self, linkage: Linkage) -> PResult<VarDecl> {
        let t = self.next();
        let space = match &t.tok {
            Tok::Directive(d) => Self::space_of(d),
            _ => None,
        };
        let Some(space) = space else {
            return self.err_at(&t, "expected a state space");
        };
        let mut align = None;
        let mut vector = 1;
        let mut ty = None;
        loop {
            let tk = self.peek().clone();
            match &tk.tok {
                Tok::Directive(d) if d == "align" => {
                    self.pos += 1;
                    align = Some(self.u32_val("alignment")?);
                }
                Tok::Directive(d) if d == "v2" || d == "v4" || d == "v8" => {
                    vector = d[1..].parse().unwrap_or(1);
                    self.pos += 1;
                }
                Tok::Directive(d) if d == "ptr" || Self::space_of(d).is_some() => {
                    self.pos += 1;
                }
                Tok::Directive(d) => {
                    ty = Some(d.clone());
                    self.pos += 1;
                }
                _ => break,
            }
        }
        let Some(ty) = ty else {
            return self.err("expected a type");
        };
        let name = self.ident("variable name")?;
        let mut v = VarDecl {
            space,
            linkage,
            align,
            vector,
            ty,
            name,
            dims: Vec::new(),
            range: None,
            init: None,
            line: t.line,
        };
        if self.eat_punct('<') {
            v.range = Some(self.u32_val("register count")?);
            self.expect_punct('>')?;
        }
        while self.eat_punct('[') {
            if self.eat_punct(']') {
                v.dims.push(None);
            } else {
                let tk = self.peek().clone();
                let n = self.int("array size")?;
                let n = u64::try_from(n).or_else(|_| self.err_at(&tk, "bad array size"))?;
                v.dims.push(Some(n));
                self.expect_punct(']')?;
            }
            if v.dims.len() > 8 {
                return self.err("too many array dimensions");
            }
        }
        if self.eat_punct('=') {
            v.init = Some(self.initializer()?);
        }
        Ok(v)
    }

    fn initializer(&mut self) -> PResult<Initializer> {
        if self.eat_punct('{') {
            self.depth += 1;
            if self.depth > MAX_DEPTH {
                return self.err("initializer nested too deeply");
            }
            let items = self.list_until('}', Self::initializer)?;
            self.depth -= 1;
            return Ok(Initializer::List(items));
        }
        let neg = self.eat_punct('-');
        let t = self.next();
        Ok(match t.tok {
            Tok::Int(v) => Initializer::Int(if neg { -v } else { v }),
            Tok::Float(f) => Initializer::Float(if neg { -f } else { f }),
            Tok::FloatBits(b, w) if !neg => Initializer::FloatBits(b, w),
            Tok::Ident(name) if !neg => {
                if (name == "generic" || name == "generic.global") && self.eat_punct('(') {
                    let inner = self.ident("symbol")?;
                    let off = self.opt_offset()?;
                    self.expect_punct(')')?;
                    let off2 = self.opt_offset()?;
                    Initializer::Symbol {
                        name: inner,
                        offset: off.wrapping_add(off2),
                        generic: true,
                    }
                } else {
                    let offset = self.opt_offset()?;
                    Initializer::Symbol {
                        name,
                        offset,
                        generic: false,
                    }
                }
            }
            _ => return self.err_at(&t, "expected an initializer value"),
        })
    }

    fn opt_offset(&mut self) -> PResult<i64> {
        if self.eat_punct('+') {
            let t = self.peek().clone();
            let v = self.int("offset")?;
            return i64::try_from(v).or_else(|_| self.err_at(&t, "offset out of range"));
        }
        if self.is_punct('-') {
            let t = self.peek().clone();
            let v = self.int("offset")?;
            return i64::try_from(v).or_else(|_| self.err_at(&t, "offset out of range"));
        }
        Ok(0)
    }

    fn param_list(&mut self) -> PResult<Vec<Param>> {
        let mut out = Vec::new();
        self.expect_punct('(')?;
        if self.eat_punct(')') {
            return Ok(out);
        }
        loop {
            let v = self.var_decl(Linkage::default())?;
            if v.space != StateSpace::Param && v.space != StateSpace::Reg {
                return self.err("expected .param");
            }
            let array = if v.dims.is_empty() {
                None
            } else {
                Some(
                    v.dims
                        .iter()
                        .map(|d| d.unwrap_or(0))
                        .fold(1u64, |a, b| a.saturating_mul(b)),
                )
            };
            out.push(Param {
                name: v.name,
                ty: v.ty,
                align: v.align,
                array,
                is_reg: v.space == StateSpace::Reg,
            });
            if !self.eat_punct(',') {
                break;
            }
            if out.len() > 4096 {
                return self.err("too many parameters");
            }
        }
        self.expect_punct(')')?;
        Ok(out)
    }

    fn dims3(&mut self) -> PResult<[u32; 3]> {
        let mut d = [1u32; 3];
        d[0] = self.u32_val("dimension")?;
        for slot in d.iter_mut().skip(1) {
            if !self.eat_punct(',') {
                break;
            }
            *slot = self.u32_val("dimension")?;
        }
        Ok(d)
    }

    fn function(&mut self, is_entry: bool, linkage: Linkage, line: u32) -> PResult<Function> {
        let mut returns = Vec::new();
        if !is_entry && self.is_punct('(') {
            returns = self.param_list()?;
        }
        let mut f = Function {
            name: self.ident("function name")?,
            is_entry,
            linkage,
            returns,
            params: Vec::new(),
            tuning: Tuning::default(),
            body: None,
            line,
        };
        if self.is_punct('(') {
            f.params = self.param_list()?;
        }
        loop {
            let t = self.peek().clone();
            match &t.tok {
                Tok::Directive(d) => {
                    self.pos += 1;
                    match d.as_str() {
                        "maxntid" => f.tuning.maxntid = Some(self.dims3()?),
                        "reqntid" => f.tuning.reqntid = Some(self.dims3()?),
                        "minnctapersm" => f.tuning.minnctapersm = Some(self.u32_val("count")?),
                        "maxnreg" => f.tuning.maxnreg = Some(self.u32_val("count")?),
                        "maxclusterrank" => {
                            self.u32_val("count")?;
                        }
                        "reqnctapercluster" => {
                            self.dims3()?;
                        }
                        "noreturn" | "explicitcluster" | "blocksareclusters" => {}
                        "pragma" => {
                            self.skip_to_semicolon();
                        }
                        _ => return self.err_at(&t, "unknown function directive"),
                    }
                }
                Tok::Punct(';') => {
                    self.pos += 1;
                    return Ok(f);
                }
                Tok::Punct('{') => {
                    self.pos += 1;
                    f.body = Some(self.block_body()?);
                    return Ok(f);
                }
                _ => return self.err_at(&t, "expected function body or `;`"),
            }
        }
    }

    /// Statements up to and including the closing `}`.
    fn block_body(&mut self) -> PResult<Vec<Statement>> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err("blocks nested too deeply");
        }
        let mut out = Vec::new();
        loop {
            let t = self.peek().clone();
            match &t.tok {
                Tok::Punct('}') => {
                    self.pos += 1;
                    self.depth -= 1;
                    return Ok(out);
                }
                Tok::Punct('{') => {
                    self.pos += 1;
                    out.push(Statement::Block(self.block_body()?));
                }
                Tok::Eof => return self.err("expected `}` before end of input"),
                Tok::Directive(d) => match d.as_str() {
                    "loc" | "file" => {
                        self.pos += 1;
                        self.skip_line();
                    }
                    "pragma" | "section" | "callprototype" | "alias" => {
                        self.pos += 1;
                        self.skip_to_semicolon();
                    }
                    "reg" | "local" | "shared" | "param" | "const" | "global" => {
                        let first = self.var_decl(Linkage::default())?;
                        let mut more = Vec::new();
                        while self.eat_punct(',') {
                            let tk = self.peek().clone();
                            let name = self.ident("variable name")?;
                            let mut v = first.clone();
                            v.name = name;
                            v.range = None;
                            v.line = tk.line;
                            if self.eat_punct('<') {
                                v.range = Some(self.u32_val("register count")?);
                                self.expect_punct('>')?;
                            }
                            more.push(v);
                        }
                        self.expect_punct(';')?;
                        out.push(Statement::Var(first));
                        out.extend(more.into_iter().map(Statement::Var));
                    }
                    "extern" | "visible" | "weak" => {
                        let l = self.linkage();
                        let v = self.var_decl(l)?;
                        self.expect_punct(';')?;
                        out.push(Statement::Var(v));
                    }
                    _ => return self.err_at(&t, "unexpected directive in function body"),
                },
                Tok::Ident(name) if self.peek_at(1) == &Tok::Punct(':') => {
                    out.push(Statement::Label(name.clone(), t.line));
                    self.pos += 2;
                }
                Tok::Ident(_) | Tok::Punct('@') => out.push(Statement::Instr(self.instruction()?)),
                _ => return self.err_at(&t, "expected instruction"),
            }
        }
    }

    fn instruction(&mut self) -> PResult<Instruction> {
        let mut guard = None;
        if self.eat_punct('@') {
            let negated = self.eat_punct('!');
            let reg = self.ident("predicate register")?;
            guard = Some(Guard { negated, reg });
        }
        let t = self.peek().clone();
        let full = self.ident("instruction")?;
        let mut parts = full.split('.');
        let opcode = parts.next().unwrap_or("").to_string();
        if opcode.is_empty() || opcode.starts_with('%') {
            return self.err_at(&t, "expected instruction");
        }
        let modifiers: Vec<String> = parts.map(str::to_string).collect();
        if modifiers.iter().any(|m| m.is_empty()) {
            return self.err_at(&t, "empty instruction modifier");
        }
        let mut operands = Vec::new();
        if !self.is_punct(';') {
            loop {
                operands.push(self.operand()?);
                if !self.eat_punct(',') {
                    break;
                }
                if operands.len() > 64 {
                    return self.err("too many operands");
                }
            }
        }
        if !self.is_punct(';') {
            return self.err("expected `,` or `;` after operand");
        }
        self.pos += 1;
        Ok(Instruction {
            guard,
            opcode,
            modifiers,
            operands,
            line: t.line,
            column: t.col,
        })
    }

    fn operand(&mut self) -> PResult<Operand> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return self.err("operand nested too deeply");
        }
        let r = self.operand_inner();
        self.depth -= 1;
        let first = r?;
        if self.eat_punct('|') {
            let second = self.operand_inner()?;
            return Ok(Operand::Pair(Box::new(first), Box::new(second)));
        }
        Ok(first)
    }

    fn operand_inner(&mut self) -> PResult<Operand> {
        let t = self.peek().clone();
        match &t.tok {
            Tok::Punct('[') => {
                self.pos += 1;
                let (base, offset) = match self.peek().tok.clone() {
                    Tok::Ident(s) => {
                        self.pos += 1;
                        let off = self.opt_offset_signed()?;
                        (Some(s), off)
                    }
                    Tok::Int(_) | Tok::Punct('-') => {
                        let tk = self.peek().clone();
                        let v = self.int("address")?;
                        let v = i64::try_from(v)
                            .or_else(|_| u64::try_from(v).map(|u| u as i64))
                            .or_else(|_| self.err_at(&tk, "address out of range"))?;
                        (None, v)
                    }
                    _ => return self.err("expected address"),
                };
                if self.is_punct(',') {
                    // texture/surface operand `[tex, {..}]`: keep as a list
                    let mut items = vec![base
                        .map(Operand::Name)
                        .unwrap_or(Operand::Int(offset as i128))];
                    while self.eat_punct(',') {
                        items.push(self.operand()?);
                    }
                    self.expect_punct(']')?;
                    return Ok(Operand::List(items));
                }
                self.expect_punct(']')?;
                Ok(Operand::Address { base, offset })
            }
            Tok::Punct('{') => {
                self.pos += 1;
                Ok(Operand::Vector(self.list_until('}', Self::operand)?))
            }
            Tok::Punct('(') => {
                self.pos += 1;
                Ok(Operand::List(self.list_until(')', Self::operand)?))
            }
            Tok::Punct('!') => {
                self.pos += 1;
                Ok(Operand::Not(self.ident("predicate")?))
            }
            Tok::Punct('-') => {
                self.pos += 1;
                match self.next().tok {
                    Tok::Int(v) => Ok(Operand::Int(-v)),
                    Tok::Float(f) => Ok(Operand::Float(-f)),
                    _ => self.err_at(&t, "expected a number after `-`"),
                }
            }
            Tok::Int(v) => {
                self.pos += 1;
                Ok(Operand::Int(*v))
            }
            Tok::Float(v) => {
                self.pos += 1;
                Ok(Operand::Float(*v))
            }
            Tok::FloatBits(b, w) => {
                self.pos += 1;
                Ok(Operand::FloatBits(*b, *w))
            }
            Tok::Ident(s) => {
                self.pos += 1;
                if s == "_" {
                    return Ok(Operand::Sink);
                }
                if self.is_punct('+') || (self.is_punct('-') && !self.peek().spaced) {
                    let off = self.opt_offset_signed()?;
                    return Ok(Operand::NameOffset(s.clone(), off));
                }
                Ok(Operand::Name(s.clone()))
            }
            _ => self.err_at(&t, "expected operand"),
        }
    }

    /// `+N`, `+-N`, `-N` or nothing.
    fn opt_offset_signed(&mut self) -> PResult<i64> {
        let neg;
        if self.eat_punct('+') {
            neg = self.eat_punct('-');
        } else if self.eat_punct('-') {
            neg = true;
        } else {
            return Ok(0);
        }
        let t = self.peek().clone();
        let v = match t.tok {
            Tok::Int(v) => v,
            _ => return self.err_at(&t, "expected offset"),
        };
        self.pos += 1;
        let v = if neg { -v } else { v };
        i64::try_from(v)
            .or_else(|_| u64::try_from(v).map(|u| u as i64))
            .or_else(|_| self.err_at(&t, "offset out of range"))
    }
}
