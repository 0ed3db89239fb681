//! Lowering of a parsed module into executable functions: resolves register
//! names to slots, symbols to addresses, labels to instruction indices, and
//! lays out module variables, shared memory, frames and kernel parameters.

use crate::ast::{self, Initializer, Operand, StateSpace, Statement};
use crate::ir::*;
use crate::memory::DeviceMemory;
use crate::module_info::{GlobalVar, KernelInfo, LoadError, ParamLayout, Space};
use std::collections::HashMap;

/// Largest register count a single function may declare.
const MAX_REGS: u64 = 1 << 16;
/// Largest size of any single variable (bytes).
const MAX_VAR: u64 = 1 << 30;
pub(crate) const VPRINTF: u32 = u32::MAX - 1;

#[derive(Debug, Clone, Copy)]
enum Sym {
    /// Global/const variable at a device address.
    Global(u64),
    /// Shared variable at a shared-window offset.
    Shared(u64),
    /// Local or in-body param variable at a frame offset.
    Frame(u32, u32),
    /// Kernel parameter at an offset of the parameter buffer.
    KParam(u32),
    Func(u32),
}

pub(crate) struct Lowered {
    pub ir: Module,
    /// What the module says about each kernel, in the order of `ir.kernels`.
    pub kernels: Vec<KernelInfo>,
    pub globals: Vec<GlobalVar>,
}

fn lerr(line: u32, what: impl Into<String>) -> LoadError {
    LoadError::Unsupported {
        what: what.into(),
        line,
    }
}

fn invalid(line: u32, what: impl AsRef<str>) -> LoadError {
    LoadError::Invalid(format!("line {line}: {}", what.as_ref()))
}

fn align_up(v: u64, a: u64) -> u64 {
    let a = a.max(1);
    v.div_ceil(a).saturating_mul(a)
}

fn var_elem_bytes(v: &ast::VarDecl) -> Result<u64, LoadError> {
    let t = Ty::parse(&v.ty).ok_or_else(|| lerr(v.line, format!("type .{}", v.ty)))?;
    Ok(t.bytes() as u64 * v.vector.max(1) as u64)
}

fn var_size(v: &ast::VarDecl) -> Result<u64, LoadError> {
    let mut n = var_elem_bytes(v)?;
    for d in &v.dims {
        n = n.saturating_mul(d.unwrap_or(0));
    }
    if n > MAX_VAR {
        return Err(invalid(v.line, format!("variable {} too large", v.name)));
    }
    Ok(n)
}

fn var_align(v: &ast::VarDecl) -> Result<u64, LoadError> {
    let a = v.align.map(u64::from).unwrap_or(var_elem_bytes(v)?).max(1);
    if !a.is_power_of_two() || a > 4096 {
        return Err(invalid(v.line, "bad alignment"));
    }
    Ok(a)
}

fn param_bytes(p: &ast::Param) -> Result<(u32, u32), LoadError> {
    let t = Ty::parse(&p.ty).ok_or_else(|| lerr(0, format!("param type .{}", p.ty)))?;
    let size = (t.bytes() as u64).saturating_mul(p.array.unwrap_or(1));
    if size > 1 << 16 {
        return Err(invalid(0, format!("parameter {} too large", p.name)));
    }
    let align = p.align.unwrap_or(t.bytes()).max(1);
    if !align.is_power_of_two() || align > 256 {
        return Err(invalid(0, "bad parameter alignment"));
    }
    Ok((size as u32, align))
}

/// Writes an initializer into `out` (element type `t`), resolving symbols.
fn write_init(
    init: &Initializer,
    t: Ty,
    out: &mut Vec<u8>,
    syms: &HashMap<String, Sym>,
    line: u32,
) -> Result<(), LoadError> {
    let n = t.bytes() as usize;
    let put = |v: u64, out: &mut Vec<u8>| out.extend_from_slice(&v.to_le_bytes()[..n.min(8)]);
    match init {
        Initializer::List(items) => {
            for i in items {
                write_init(i, t, out, syms, line)?;
            }
        }
        Initializer::Int(v) => put(*v as u64, out),
        Initializer::Float(f) => put(float_bits(*f, t), out),
        Initializer::FloatBits(b, w) => {
            let f = if *w == 4 {
                f32::from_bits(*b as u32) as f64
            } else {
                f64::from_bits(*b)
            };
            if t.is_float() {
                put(float_bits(f, t), out)
            } else {
                put(*b, out)
            }
        }
        Initializer::Symbol { name, offset, .. } => match syms.get(name) {
            Some(Sym::Global(a)) => put(a.wrapping_add(*offset as u64), out),
            Some(Sym::Func(i)) => put(FUNC_WIN + *i as u64, out),
            _ => {
                return Err(invalid(
                    line,
                    format!("unknown symbol {name} in initializer"),
                ))
            }
        },
    }
    Ok(())
}

pub(crate) fn float_bits(f: f64, t: Ty) -> u64 {
    match t {
        Ty::F32 => (f as f32).to_bits() as u64,
        Ty::F16 => half::f16::from_f64(f).to_bits() as u64,
        Ty::BF16 => half::bf16::from_f64(f).to_bits() as u64,
        _ => f.to_bits(),
    }
}

pub(crate) fn lower_module(
    m: &ast::Module,
    mem: &DeviceMemory,
    allocated: &mut Vec<u64>,
) -> Result<Lowered, LoadError> {
    let mut syms: HashMap<String, Sym> = HashMap::new();
    // functions first so initializers can name them
    let mut fidx = 0u32;
    let mut func_items = Vec::new();
    for it in &m.items {
        if let ast::Item::Func(f) = it {
            if f.name == "vprintf" && f.body.is_none() {
                syms.insert(f.name.clone(), Sym::Func(VPRINTF));
                continue;
            }
            if let Some(Sym::Func(_)) = syms.get(&f.name) {
                // a prototype followed by the definition: keep one index
                if f.body.is_some() {
                    if let Some(Sym::Func(i)) = syms.get(&f.name).copied() {
                        if let Some(slot) = func_items.get_mut(i as usize) {
                            *slot = f;
                        }
                    }
                }
                continue;
            }
            syms.insert(f.name.clone(), Sym::Func(fidx));
            func_items.push(f);
            fidx += 1;
        }
    }
    let mut globals = Vec::new();
    let mut shared_off: u64 = 0;
    let mut has_dyn = false;
    for it in &m.items {
        if let ast::Item::Var(v) = it {
            match v.space {
                StateSpace::Global | StateSpace::Const => {
                    let size = var_size(v)?;
                    if v.linkage.external && v.init.is_none() && size == 0 {
                        continue;
                    }
                    let addr = mem.alloc(size.max(1)).map_err(|_| LoadError::OutOfMemory)?;
                    allocated.push(addr);
                    syms.insert(v.name.clone(), Sym::Global(addr));
                    globals.push((v, addr, size));
                }
                StateSpace::Shared => {
                    if v.dims.iter().any(|d| d.is_none())
                        || (v.linkage.external && var_size(v)? == 0)
                    {
                        has_dyn = true;
                        syms.insert(v.name.clone(), Sym::Shared(u64::MAX));
                    } else {
                        shared_off = align_up(shared_off, var_align(v)?);
                        syms.insert(v.name.clone(), Sym::Shared(shared_off));
                        shared_off += var_size(v)?;
                    }
                }
                _ => return Err(lerr(v.line, "module-level variable in this state space")),
            }
        }
    }
    let _ = has_dyn;
    // initialize globals
    let mut gvars = Vec::new();
    for (v, addr, size) in &globals {
        if let Some(init) = &v.init {
            let t = Ty::parse(&v.ty).ok_or_else(|| lerr(v.line, "type"))?;
            let mut bytes = Vec::new();
            write_init(init, t, &mut bytes, &syms, v.line)?;
            bytes.truncate(*size as usize);
            mem.write(*addr, &bytes)
                .map_err(|_| LoadError::OutOfMemory)?;
        }
        gvars.push(GlobalVar {
            name: v.name.clone(),
            ptr: *addr,
            size: *size,
            space: if v.space == StateSpace::Const {
                Space::Const
            } else {
                Space::Global
            },
        });
    }
    // shared layout: module vars, then each function's own shared vars
    let module_shared = shared_off;
    let mut func_shared: Vec<u64> = Vec::new();
    let mut max_shared = module_shared;
    let mut shared_syms: Vec<HashMap<String, u64>> = Vec::new();
    for f in &func_items {
        let mut off = module_shared;
        let mut map = HashMap::new();
        if let Some(body) = &f.body {
            collect_shared(body, &mut off, &mut map)?;
        }
        func_shared.push(off - module_shared);
        max_shared = max_shared.max(off);
        shared_syms.push(map);
    }
    if max_shared > 1 << 20 {
        return Err(invalid(0, "shared memory too large"));
    }
    let dyn_base = align_up(max_shared, 16);
    for s in syms.values_mut() {
        if let Sym::Shared(o) = s {
            if *o == u64::MAX {
                *o = dyn_base;
            }
        }
    }
    let mut funcs = Vec::new();
    let mut kernels = Vec::new();
    for (i, f) in func_items.iter().enumerate() {
        let mut fl = FuncLower::new(&syms, &func_items, m.version);
        for (k, v) in &shared_syms[i] {
            let off = if *v == u64::MAX { dyn_base } else { *v };
            fl.scopes[0].insert(k.clone(), Binding::Sym(Sym::Shared(off)));
        }
        let func = fl.lower(f)?;
        if f.is_entry {
            let mut params = Vec::new();
            let mut off = 0u32;
            for p in &f.params {
                let (size, align) = param_bytes(p)?;
                off = align_up(off as u64, align as u64) as u32;
                params.push(ParamLayout {
                    offset: off,
                    size,
                    align,
                });
                off = off.saturating_add(size);
            }
            let max_threads = f
                .maxntid
                .or(f.reqntid)
                .map(|d| {
                    d.iter()
                        .fold(1u64, |a, b| a.saturating_mul(*b as u64))
                        .min(1024) as u32
                })
                .unwrap_or(1024);
            let target_sm = m
                .targets
                .iter()
                .find_map(|t| t.strip_prefix("sm_"))
                .and_then(|s| {
                    s.trim_end_matches(|c: char| !c.is_ascii_digit())
                        .parse()
                        .ok()
                })
                .unwrap_or(75);
            kernels.push((
                KernelInfo {
                    name: f.name.clone(),
                    params,
                    static_shared_bytes: (module_shared + func_shared[i]) as u32,
                    local_bytes: func.frame_bytes,
                    max_threads_per_block: max_threads,
                    reqntid: f.reqntid,
                    ptx_version: m.version,
                    target_sm,
                    num_regs: func.nregs.min(255),
                },
                i as u32,
            ));
        }
        funcs.push(func);
    }
    let (kernels, kernel_funcs) = kernels.into_iter().unzip();
    Ok(Lowered {
        ir: Module {
            funcs,
            kernels: kernel_funcs,
            dyn_shared_base: dyn_base as u32,
        },
        kernels,
        globals: gvars,
    })
}

fn collect_shared(
    body: &[Statement],
    off: &mut u64,
    map: &mut HashMap<String, u64>,
) -> Result<(), LoadError> {
    for s in body {
        match s {
            Statement::Var(v)
                if v.space == StateSpace::Shared
                    && (v.dims.iter().any(|d| d.is_none()) || v.linkage.external) =>
            {
                // dynamic shared memory: placed after all static shared memory
                map.insert(v.name.clone(), u64::MAX);
            }
            Statement::Var(v) if v.space == StateSpace::Shared => {
                *off = align_up(*off, var_align(v)?);
                map.insert(v.name.clone(), *off);
                *off = off.saturating_add(var_size(v)?);
                if *off > 1 << 20 {
                    return Err(invalid(v.line, "shared memory too large"));
                }
            }
            Statement::Block(b) => collect_shared(b, off, map)?,
            _ => {}
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum Binding {
    Reg(u32, Ty),
    Sym(Sym),
}

struct FuncLower<'a> {
    syms: &'a HashMap<String, Sym>,
    funcs: &'a [&'a ast::Function],
    scopes: Vec<HashMap<String, Binding>>,
    /// Register ranges `%r<N>`: prefix -> (first slot, count, type) per scope.
    ranges: Vec<HashMap<String, (u32, u32, Ty)>>,
    nregs: u32,
    frame: u32,
    code: Vec<Inst>,
    labels: HashMap<String, u32>,
    fixups: Vec<(usize, String, u32)>,
    is_entry: bool,
    /// Hidden register holding the carry flag, allocated on first use.
    cc: Option<u32>,
    uses_volatile: bool,
    #[allow(dead_code)]
    version: u32,
    line: u32,
}

fn cmp_of(s: &str) -> Option<Cmp> {
    Some(match s {
        "eq" => Cmp::Eq,
        "ne" => Cmp::Ne,
        "lt" => Cmp::Lt,
        "le" => Cmp::Le,
        "gt" => Cmp::Gt,
        "ge" => Cmp::Ge,
        "lo" => Cmp::Lo,
        "ls" => Cmp::Ls,
        "hi" => Cmp::Hi,
        "hs" => Cmp::Hs,
        "equ" => Cmp::Equ,
        "neu" => Cmp::Neu,
        "ltu" => Cmp::Ltu,
        "leu" => Cmp::Leu,
        "gtu" => Cmp::Gtu,
        "geu" => Cmp::Geu,
        "num" => Cmp::Num,
        "nan" => Cmp::Nan,
        _ => return None,
    })
}

fn rnd_of(mods: &[String]) -> Rnd {
    for m in mods {
        let r = match m.as_str() {
            "rn" => Rnd::Rn,
            "rz" => Rnd::Rz,
            "rm" => Rnd::Rm,
            "rp" => Rnd::Rp,
            "rni" => Rnd::Rni,
            "rzi" => Rnd::Rzi,
            "rmi" => Rnd::Rmi,
            "rpi" => Rnd::Rpi,
            _ => continue,
        };
        return r;
    }
    Rnd::Default
}

fn sp_of(mods: &[String]) -> Option<Sp> {
    for m in mods {
        let s = match m.as_str() {
            "global" => Sp::Global,
            "shared" => Sp::Shared,
            "local" => Sp::Local,
            "param" => Sp::Param,
            "const" => Sp::Global,
            _ => continue,
        };
        return Some(s);
    }
    None
}

impl<'a> FuncLower<'a> {
    fn new(syms: &'a HashMap<String, Sym>, funcs: &'a [&'a ast::Function], version: u32) -> Self {
        FuncLower {
            syms,
            funcs,
            scopes: vec![HashMap::new()],
            ranges: vec![HashMap::new()],
            nregs: 0,
            frame: 0,
            code: Vec::new(),
            labels: HashMap::new(),
            fixups: Vec::new(),
            is_entry: false,
            cc: None,
            uses_volatile: false,
            version,
            line: 0,
        }
    }

    fn unsupported<T>(&self, what: impl Into<String>) -> Result<T, LoadError> {
        Err(lerr(self.line, what))
    }

    fn alloc_frame(&mut self, size: u32, align: u32) -> Result<u32, LoadError> {
        let off = align_up(self.frame as u64, align.max(1) as u64);
        let end = off + size as u64;
        if end > 512 * 1024 {
            return Err(invalid(self.line, "local frame too large"));
        }
        self.frame = end as u32;
        Ok(off as u32)
    }

    fn new_reg(&mut self) -> Result<u32, LoadError> {
        if self.nregs as u64 >= MAX_REGS {
            return Err(invalid(self.line, "too many registers"));
        }
        self.nregs += 1;
        Ok(self.nregs - 1)
    }

    fn lower(mut self, f: &ast::Function) -> Result<Func, LoadError> {
        self.is_entry = f.is_entry;
        self.line = f.line;
        let mut params = Vec::new();
        let mut rets = Vec::new();
        if f.is_entry {
            let mut off = 0u32;
            for p in &f.params {
                let (size, align) = param_bytes(p)?;
                off = align_up(off as u64, align as u64) as u32;
                self.scopes[0].insert(p.name.clone(), Binding::Sym(Sym::KParam(off)));
                off = off.saturating_add(size);
            }
        } else {
            for (list, out) in [(&f.returns, &mut rets), (&f.params, &mut params)] {
                for p in list.iter() {
                    let (size, align) = param_bytes(p)?;
                    let off = self.alloc_frame(size, align)?;
                    if p.is_reg {
                        return Err(lerr(f.line, ".reg function parameters"));
                    } else {
                        self.scopes[0].insert(p.name.clone(), Binding::Sym(Sym::Frame(off, size)));
                        out.push((off, size));
                    }
                }
            }
        }
        if let Some(body) = &f.body {
            self.block(body)?;
        }
        // implicit return at the end
        self.emit(if f.is_entry { Op::Exit } else { Op::Ret });
        for (at, label, line) in std::mem::take(&mut self.fixups) {
            let Some(&target) = self.labels.get(&label) else {
                return Err(invalid(line, format!("unknown label {label}")));
            };
            if let Op::Bra { target: t } = &mut self.code[at].op {
                *t = target;
            }
        }
        Ok(Func {
            name: f.name.clone(),
            code: self.code,
            nregs: self.nregs.max(1),
            frame_bytes: align_up(self.frame as u64, 16) as u32,
            params,
            rets,
            uses_volatile: self.uses_volatile,
        })
    }

    fn emit(&mut self, op: Op) {
        self.code.push(Inst {
            guard: NONE,
            guard_neg: false,
            op,
            line: self.line,
        });
    }

    fn block(&mut self, body: &[Statement]) -> Result<(), LoadError> {
        for s in body {
            match s {
                Statement::Label(l, line) => {
                    self.line = *line;
                    if self
                        .labels
                        .insert(l.clone(), self.code.len() as u32)
                        .is_some()
                    {
                        return Err(invalid(*line, format!("duplicate label {l}")));
                    }
                }
                Statement::Var(v) => self.var(v)?,
                Statement::Block(b) => {
                    self.scopes.push(HashMap::new());
                    self.ranges.push(HashMap::new());
                    let r = self.block(b);
                    self.scopes.pop();
                    self.ranges.pop();
                    r?;
                }
                Statement::Instr(i) => {
                    self.line = i.line;
                    self.instr(i)?;
                }
            }
        }
        Ok(())
    }

    fn var(&mut self, v: &ast::VarDecl) -> Result<(), LoadError> {
        self.line = v.line;
        let scope = self.scopes.len() - 1;
        match v.space {
            StateSpace::Reg => {
                let t = Ty::parse(&v.ty)
                    .ok_or_else(|| lerr(v.line, format!("register type .{}", v.ty)))?;
                let t = if v.vector > 1 { Ty::B128 } else { t };
                if let Some(n) = v.range {
                    if self.nregs as u64 + n as u64 >= MAX_REGS {
                        return Err(invalid(v.line, "too many registers"));
                    }
                    let first = self.nregs;
                    self.nregs += n;
                    self.ranges[scope].insert(v.name.clone(), (first, n, t));
                } else {
                    let r = self.new_reg()?;
                    self.scopes[scope].insert(v.name.clone(), Binding::Reg(r, t));
                }
            }
            StateSpace::Local | StateSpace::Param => {
                let size = var_size(v)? as u32;
                let off = self.alloc_frame(size, var_align(v)? as u32)?;
                self.scopes[scope].insert(v.name.clone(), Binding::Sym(Sym::Frame(off, size)));
            }
            StateSpace::Shared => {} // laid out by collect_shared
            _ => return self.unsupported("global/const variable inside a function"),
        }
        Ok(())
    }

    fn lookup(&self, name: &str) -> Option<Binding> {
        for i in (0..self.scopes.len()).rev() {
            if let Some(b) = self.scopes[i].get(name) {
                return Some(*b);
            }
            // range registers: prefix + decimal index
            let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 && digits < name.len() {
                let (prefix, idx) = name.split_at(name.len() - digits);
                if let Some(&(first, n, t)) = self.ranges[i].get(prefix) {
                    if let Ok(k) = idx.parse::<u32>() {
                        if k < n && !(idx.len() > 1 && idx.starts_with('0')) {
                            return Some(Binding::Reg(first + k, t));
                        }
                    }
                }
            }
        }
        self.syms.get(name).map(|s| Binding::Sym(*s))
    }

    fn sreg(name: &str) -> Option<SReg> {
        let dim = |s: &str| -> Option<u8> {
            match s {
                "x" => Some(0),
                "y" => Some(1),
                "z" => Some(2),
                _ => None,
            }
        };
        if let Some((base, d)) = name.split_once('.') {
            let d = dim(d)?;
            return Some(match base {
                "%tid" => SReg::Tid(d),
                "%ntid" => SReg::Ntid(d),
                "%ctaid" => SReg::Ctaid(d),
                "%nctaid" => SReg::Nctaid(d),
                "%clusterid" | "%cluster_ctaid" => SReg::Zero,
                "%nclusterid" | "%cluster_nctaid" => SReg::Ntid(9),
                _ => return None,
            });
        }
        Some(match name {
            "%laneid" => SReg::Laneid,
            "%warpid" => SReg::Warpid,
            "%nwarpid" => SReg::Nwarpid,
            "%smid" => SReg::Smid,
            "%nsmid" => SReg::Nsmid,
            "%gridid" => SReg::Gridid,
            "%clock" => SReg::Clock,
            "%clock64" => SReg::Clock64,
            "%globaltimer" => SReg::Globaltimer,
            "%globaltimer_lo" => SReg::Globaltimer,
            "%lanemask_eq" => SReg::LanemaskEq,
            "%lanemask_lt" => SReg::LanemaskLt,
            "%lanemask_le" => SReg::LanemaskLe,
            "%lanemask_gt" => SReg::LanemaskGt,
            "%lanemask_ge" => SReg::LanemaskGe,
            "%dynamic_smem_size" => SReg::DynSmem,
            "%total_smem_size" => SReg::TotalSmem,
            "%cluster_ctarank" | "%is_explicit_cluster" => SReg::Zero,
            "%cluster_nctarank" => SReg::Ntid(9),
            _ if name.starts_with("%envreg") || name.starts_with("%pm") => SReg::Zero,
            _ => return None,
        })
    }

    /// Destination register slot.
    fn dst(&mut self, o: &Operand) -> Result<u32, LoadError> {
        match o {
            Operand::Name(n) => match self.lookup(n) {
                Some(Binding::Reg(r, _)) => Ok(r),
                _ => Err(invalid(self.line, format!("`{n}` is not a register"))),
            },
            Operand::Sink => self.new_reg(),
            _ => Err(invalid(self.line, "destination must be a register")),
        }
    }

    /// Source operand read as type `t`.
    fn src(&mut self, o: &Operand, t: Ty) -> Result<Src, LoadError> {
        Ok(match o {
            Operand::Name(n) => {
                if let Some(b) = self.lookup(n) {
                    match b {
                        Binding::Reg(r, _) => Src::Reg(r),
                        Binding::Sym(s) => self.sym_value(s, 0)?,
                    }
                } else if let Some(sr) = Self::sreg(n) {
                    let d = self.new_reg()?;
                    self.emit(Op::Special { d, r: sr });
                    Src::Reg(d)
                } else if n == "WARP_SZ" {
                    Src::Imm(32)
                } else {
                    return Err(invalid(self.line, format!("unknown name `{n}`")));
                }
            }
            Operand::NameOffset(n, off) => match self.lookup(n) {
                Some(Binding::Sym(s)) => self.sym_value(s, *off)?,
                _ => return Err(invalid(self.line, format!("unknown symbol `{n}`"))),
            },
            Operand::Int(v) => Src::Imm(*v as u64),
            Operand::Float(f) => Src::Imm(float_bits(*f, t)),
            Operand::FloatBits(b, w) => {
                let f = if *w == 4 {
                    f32::from_bits(*b as u32) as f64
                } else {
                    f64::from_bits(*b)
                };
                if t.is_float() && t.bytes() != *w {
                    Src::Imm(float_bits(f, t))
                } else {
                    Src::Imm(*b)
                }
            }
            Operand::Not(_) => return Err(invalid(self.line, "unexpected `!`")),
            Operand::Sink => Src::Imm(0),
            Operand::Vector(items) => {
                // packed source: build into a temp
                let bits = if items.is_empty() {
                    0
                } else {
                    t.bits() / items.len() as u32
                };
                let parts = items
                    .iter()
                    .map(|i| self.src(i, Ty::B64))
                    .collect::<Result<Vec<_>, _>>()?;
                let d = self.new_reg()?;
                self.emit(Op::Pack { d, parts, bits });
                Src::Reg(d)
            }
            _ => return Err(invalid(self.line, "unsupported operand form")),
        })
    }

    fn sym_value(&mut self, s: Sym, off: i64) -> Result<Src, LoadError> {
        Ok(match s {
            Sym::Global(a) => Src::Imm(a.wrapping_add(off as u64)),
            Sym::Shared(o) => Src::Imm(o.wrapping_add(off as u64)),
            Sym::Frame(o, _) => Src::Frame((o as i64).wrapping_add(off) as u32),
            Sym::KParam(o) => Src::Imm((o as i64).wrapping_add(off) as u64),
            Sym::Func(i) => Src::Imm(FUNC_WIN + i as u64),
        })
    }

    /// `[addr]` operand -> (space, base, offset).
    fn address(&mut self, o: &Operand, sp: Sp) -> Result<(Sp, Src, i64), LoadError> {
        let Operand::Address { base, offset } = o else {
            return Err(invalid(self.line, "expected an address operand"));
        };
        let Some(base) = base else {
            return Ok((sp, Src::Imm(*offset as u64), 0));
        };
        match self.lookup(base) {
            Some(Binding::Reg(r, _)) => Ok((sp, Src::Reg(r), *offset)),
            Some(Binding::Sym(s)) => {
                let sp = match (s, sp) {
                    (Sym::Frame(..), Sp::Param) => Sp::Local,
                    (_, sp) => sp,
                };
                Ok((sp, self.sym_value(s, 0)?, *offset))
            }
            None => Err(invalid(self.line, format!("unknown address base `{base}`"))),
        }
    }

    fn ty_of(&self, mods: &[String]) -> Option<Ty> {
        mods.iter().rev().find_map(|m| Ty::parse(m))
    }

    fn need_ty(&self, mods: &[String]) -> Result<Ty, LoadError> {
        self.ty_of(mods)
            .ok_or_else(|| invalid(self.line, "instruction needs a type"))
    }

    fn ops<'o>(&self, i: &'o ast::Instruction, n: usize) -> Result<&'o [Operand], LoadError> {
        if i.operands.len() < n {
            return Err(invalid(
                self.line,
                format!("`{}` needs {} operands", i.opcode, n),
            ));
        }
        Ok(&i.operands)
    }

    fn instr(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        if i.modifiers.iter().any(|m| m == "relu") {
            // `.relu`: the result clamped at zero (NaN stays NaN), as a second op
            let mut plain = i.clone();
            plain.modifiers.retain(|m| m != "relu");
            let dt = match i.opcode.as_str() {
                "cvt" => i.modifiers.iter().find_map(|m| Ty::parse(m)),
                _ => i.modifiers.iter().rev().find_map(|m| Ty::parse(m)),
            };
            let Some(t) = dt.filter(|t| t.is_float()) else {
                return self.unsupported(".relu on this instruction");
            };
            self.instr(&plain)?;
            let Some(Operand::Name(dn)) = i.operands.first() else {
                return Err(invalid(self.line, ".relu needs a register destination"));
            };
            let Some(Binding::Reg(d, _)) = self.lookup(dn) else {
                return Err(invalid(self.line, ".relu needs a register destination"));
            };
            self.emit(Op::Relu { d, t });
            if let Some(g) = &i.guard {
                if let Some(Binding::Reg(r, _)) = self.lookup(&g.reg) {
                    if let Some(last) = self.code.last_mut() {
                        last.guard = r;
                        last.guard_neg = g.negated;
                    }
                }
            }
            return Ok(());
        }
        let guard = match &i.guard {
            None => (NONE, false),
            Some(g) => match self.lookup(&g.reg) {
                Some(Binding::Reg(r, _)) => (r, g.negated),
                _ => return Err(invalid(self.line, format!("unknown predicate `{}`", g.reg))),
            },
        };
        let start = self.code.len();
        self.instr_body(i)?;
        // guard applies to the instruction's main op (the last one emitted);
        // helper ops (special register reads, packs) before it are harmless.
        if guard.0 != NONE && self.code.len() > start {
            if let Some(last) = self.code.last_mut() {
                last.guard = guard.0;
                last.guard_neg = guard.1;
            }
        }
        Ok(())
    }

    fn instr_body(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let has = |s: &str| m.iter().any(|x| x == s);
        let ftz = has("ftz");
        let sat = has("sat") || has("satfinite");
        if has("volatile") {
            self.uses_volatile = true;
        }
        match i.opcode.as_str() {
            "mov" => {
                let o = self.ops(i, 2)?;
                let t = self.need_ty(m)?;
                match (&o[0], &o[1]) {
                    (Operand::Vector(ds), src) => {
                        let a = self.src(src, t)?;
                        let ds = ds
                            .iter()
                            .map(|d| self.dst(d))
                            .collect::<Result<Vec<_>, _>>()?;
                        let bits = if ds.is_empty() {
                            0
                        } else {
                            t.bits() / ds.len() as u32
                        };
                        self.emit(Op::Unpack { ds, a, bits });
                    }
                    (d, src) => {
                        let d = self.dst(d)?;
                        let a = self.src(src, t)?;
                        self.emit(Op::Mov {
                            d,
                            a,
                            mask: t.mask(),
                        });
                    }
                }
            }
            "ld" | "ldu" => {
                let o = self.ops(i, 2)?;
                let t = self.need_ty(m)?;
                let sp = sp_of(m).unwrap_or(Sp::Generic);
                let (sp, addr, off) = self.address(&o[1], sp)?;
                if t == Ty::B128 {
                    return self.unsupported("128-bit load");
                }
                let (ds, n) = self.dsts(&o[0])?;
                let size = t.bytes();
                self.emit(Op::Ld {
                    sp,
                    size,
                    n,
                    ds,
                    addr,
                    off,
                    sext: t.signed(),
                });
            }
            "st" => {
                let o = self.ops(i, 2)?;
                let t = self.need_ty(m)?;
                let sp = sp_of(m).unwrap_or(Sp::Generic);
                let (sp, addr, off) = self.address(&o[0], sp)?;
                let mut vals = [Src::Imm(0); 4];
                let n = match &o[1] {
                    Operand::Vector(items) => {
                        if items.len() > 4 || items.is_empty() {
                            return self.unsupported("vector store wider than 4");
                        }
                        for (k, it) in items.iter().enumerate() {
                            vals[k] = self.src(it, t)?;
                        }
                        items.len() as u8
                    }
                    other => {
                        vals[0] = self.src(other, t)?;
                        1
                    }
                };
                if t == Ty::B128 {
                    return self.unsupported("128-bit store");
                }
                self.emit(Op::St {
                    sp,
                    size: t.bytes(),
                    n,
                    vals,
                    addr,
                    off,
                });
            }
            "cvta" => {
                let o = self.ops(i, 2)?;
                let to = has("to");
                let sp = sp_of(m).unwrap_or(Sp::Global);
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], Ty::U64)?;
                self.emit(Op::Cvta {
                    d,
                    a,
                    sp,
                    to_generic: !to,
                });
            }
            "isspacep" => {
                let o = self.ops(i, 2)?;
                let sp = sp_of(m).unwrap_or(Sp::Global);
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], Ty::U64)?;
                self.emit(Op::Isspacep { d, a, sp });
            }
            "add" | "sub" | "mad" | "addc" | "subc" | "madc"
                if has("cc") || i.opcode.ends_with('c') =>
            {
                let is_mad = i.opcode.starts_with("mad");
                let o = self.ops(i, if is_mad { 4 } else { 3 })?;
                let t = self.need_ty(m)?;
                let kind = match i.opcode.as_str() {
                    "add" | "addc" => CarryKind::Add,
                    "sub" | "subc" => CarryKind::Sub,
                    _ if has("hi") => CarryKind::MadHi,
                    _ => CarryKind::MadLo,
                };
                let cc = match self.cc {
                    Some(r) => r,
                    None => {
                        let r = self.new_reg()?;
                        self.cc = Some(r);
                        r
                    }
                };
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], t)?;
                let b = self.src(&o[2], t)?;
                let c = if is_mad {
                    self.src(&o[3], t)?
                } else {
                    Src::Imm(0)
                };
                self.emit(Op::Carry {
                    kind,
                    t,
                    d,
                    a,
                    b,
                    c,
                    cin: i.opcode.ends_with('c'),
                    cout: has("cc"),
                    cc,
                });
            }
            "cp" if has("async") => {
                if has("commit_group") || has("wait_group") || has("wait_all") {
                    self.emit(Op::Nop);
                    return Ok(());
                }
                if has("bulk") || has("mbarrier") {
                    return self.unsupported("cp.async.bulk / mbarrier forms");
                }
                let o = self.ops(i, 3)?;
                let (_, dst, doff) = self.address(&o[0], Sp::Shared)?;
                let (_, src, soff) = self.address(&o[1], Sp::Global)?;
                let size = match &o[2] {
                    Operand::Int(v) if matches!(*v, 4 | 8 | 16) => *v as u32,
                    _ => return Err(invalid(self.line, "cp.async size must be 4, 8 or 16")),
                };
                let src_size = match o.get(3) {
                    Some(x) => self.src(x, Ty::U32)?,
                    None => Src::Imm(size as u64),
                };
                self.emit(Op::CpAsync {
                    dst,
                    doff,
                    src,
                    soff,
                    size,
                    src_size,
                });
            }
            "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor"
            | "shl" | "shr" | "copysign" | "mul24" | "bmsk" => {
                let o = self.ops(i, 3)?;
                let t = self.need_ty(m)?;
                let d = self.dst(&o[0])?;
                let bt = if matches!(i.opcode.as_str(), "shl" | "shr") {
                    Ty::U32
                } else {
                    t
                };
                let a = self.src(&o[1], t)?;
                let b = self.src(&o[2], bt)?;
                if t.is_float() {
                    let op = match i.opcode.as_str() {
                        "add" => FOp::Add,
                        "sub" => FOp::Sub,
                        "mul" => FOp::Mul,
                        "div" => FOp::Div,
                        "min" => FOp::Min,
                        "max" => FOp::Max,
                        "copysign" => FOp::Copysign,
                        other => return self.unsupported(format!("{other} on floats")),
                    };
                    let rnd = if has("approx") || has("full") {
                        Rnd::Default
                    } else {
                        rnd_of(m)
                    };
                    self.emit(Op::Float {
                        op,
                        t,
                        d,
                        a,
                        b,
                        rnd,
                        ftz,
                        sat,
                    });
                } else {
                    let op = match (i.opcode.as_str(), sat) {
                        ("add", false) => IntOp::Add,
                        ("add", true) => IntOp::AddSat,
                        ("sub", false) => IntOp::Sub,
                        ("sub", true) => IntOp::SubSat,
                        ("mul", _) if has("hi") => IntOp::MulHi,
                        ("mul", _) if has("wide") => IntOp::MulWide,
                        ("mul", _) => IntOp::MulLo,
                        ("mul24", _) if has("hi") => return self.unsupported("mul24.hi"),
                        ("mul24", _) => IntOp::Mul24Lo,
                        ("div", _) => IntOp::Div,
                        ("rem", _) => IntOp::Rem,
                        ("min", _) => IntOp::Min,
                        ("max", _) => IntOp::Max,
                        ("and", _) => IntOp::And,
                        ("or", _) => IntOp::Or,
                        ("xor", _) => IntOp::Xor,
                        ("shl", _) => IntOp::Shl,
                        ("shr", _) => IntOp::Shr,
                        ("bmsk", _) => IntOp::Bmsk,
                        (other, _) => return self.unsupported(format!("{other} on integers")),
                    };
                    self.emit(Op::Int { op, t, d, a, b });
                }
            }
            "not" | "neg" | "abs" | "popc" | "clz" | "brev" | "bfind" | "cnot" | "sqrt"
            | "rsqrt" | "rcp" | "sin" | "cos" | "ex2" | "lg2" | "tanh" => {
                let o = self.ops(i, 2)?;
                let t = self.need_ty(m)?;
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], t)?;
                let op = match (i.opcode.as_str(), t.is_float()) {
                    ("not", _) => UnOp::Not,
                    ("cnot", _) => UnOp::Cnot,
                    ("neg", false) => UnOp::Neg,
                    ("neg", true) => UnOp::FNeg,
                    ("abs", false) => UnOp::Abs,
                    ("abs", true) => UnOp::FAbs,
                    ("popc", _) => UnOp::Popc,
                    ("clz", _) => UnOp::Clz,
                    ("brev", _) => UnOp::Brev,
                    ("bfind", _) if has("shiftamt") => UnOp::BfindShift,
                    ("bfind", _) => UnOp::Bfind,
                    ("sqrt", _) => UnOp::Sqrt,
                    ("rsqrt", _) => UnOp::Rsqrt,
                    ("rcp", _) => UnOp::Rcp,
                    ("sin", _) => UnOp::Sin,
                    ("cos", _) => UnOp::Cos,
                    ("ex2", _) => UnOp::Ex2,
                    ("lg2", _) => UnOp::Lg2,
                    ("tanh", _) => UnOp::Tanh,
                    (other, _) => return self.unsupported(other.to_string()),
                };
                let rnd = if has("approx") {
                    Rnd::Default
                } else {
                    rnd_of(m)
                };
                self.emit(Op::Un {
                    op,
                    t,
                    d,
                    a,
                    rnd,
                    ftz,
                    sat,
                });
            }
            "mad" | "fma" | "selp" | "bfe" | "sad" | "slct" | "shf" | "dp4a" | "dp2a" | "mad24" => {
                let o = self.ops(i, 4)?;
                let t = self.need_ty(m)?;
                let opname = i.opcode.as_str();
                let (op, at, ct) = match opname {
                    "mad" if t.is_float() => (TernOp::Fma, t, t),
                    "mad" if has("hi") => (TernOp::MadHi, t, t),
                    "mad" if has("wide") => {
                        let wide = match t {
                            Ty::S32 => Ty::S64,
                            Ty::U32 => Ty::U64,
                            Ty::S16 => Ty::S32,
                            _ => Ty::U32,
                        };
                        (TernOp::MadWide, t, wide)
                    }
                    "mad" => (TernOp::MadLo, t, t),
                    "mad24" => (TernOp::Mad24Lo, t, t),
                    "fma" => (TernOp::Fma, t, t),
                    "selp" => (TernOp::Selp, t, Ty::Pred),
                    "bfe" => (TernOp::Bfe, t, Ty::U32),
                    "sad" => (TernOp::Sad, t, t),
                    "slct" => {
                        let ct = m.iter().rev().find_map(|x| Ty::parse(x)).unwrap_or(Ty::S32);
                        let at = m.iter().find_map(|x| Ty::parse(x)).unwrap_or(Ty::B32);
                        (TernOp::Slct, at, ct)
                    }
                    "shf" if has("l") => (TernOp::Shfl, Ty::B32, Ty::U32),
                    "shf" => (TernOp::Shfr, Ty::B32, Ty::U32),
                    "dp4a" => (TernOp::Dp4a, t, t),
                    "dp2a" if has("hi") => (TernOp::Dp2aHi, t, t),
                    "dp2a" => (TernOp::Dp2aLo, t, t),
                    _ => return self.unsupported(opname.to_string()),
                };
                // shf: mode .wrap/.clamp
                let t2 = if opname == "shf" {
                    if has("clamp") {
                        Ty::U8
                    } else {
                        Ty::U16
                    }
                } else if opname == "dp4a" || opname == "dp2a" {
                    // encode signedness of a and b in the type: first two type modifiers
                    let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
                    match (
                        tys.first().map(|t| t.signed()),
                        tys.get(1).map(|t| t.signed()),
                    ) {
                        (Some(true), Some(true)) => Ty::S64,
                        (Some(true), _) => Ty::S32,
                        (_, Some(true)) => Ty::S16,
                        _ => Ty::U32,
                    }
                } else if opname == "slct" {
                    ct
                } else {
                    at
                };
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], at)?;
                let b = self.src(&o[2], at)?;
                let c = self.src(&o[3], ct)?;
                let rnd = rnd_of(m);
                self.emit(Op::Tern {
                    op,
                    t: t2,
                    d,
                    a,
                    b,
                    c,
                    rnd,
                    ftz,
                    sat,
                });
            }
            "bfi" => {
                let o = self.ops(i, 5)?;
                let t = self.need_ty(m)?;
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], t)?;
                let b = self.src(&o[2], t)?;
                let c = self.src(&o[3], Ty::U32)?;
                let e = self.src(&o[4], Ty::U32)?;
                self.emit(Op::Bfi { t, d, a, b, c, e });
            }
            "prmt" => {
                let o = self.ops(i, 4)?;
                let mode = ["f4e", "b4e", "rc8", "ecl", "ecr", "rc16"]
                    .iter()
                    .position(|x| has(x))
                    .map_or(0, |p| p as u8 + 1);
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], Ty::B32)?;
                let b = self.src(&o[2], Ty::B32)?;
                let c = self.src(&o[3], Ty::B32)?;
                self.emit(Op::Prmt { d, a, b, c, mode });
            }
            "lop3" => {
                let o = self.ops(i, 5)?;
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], Ty::B32)?;
                let b = self.src(&o[2], Ty::B32)?;
                let c = self.src(&o[3], Ty::B32)?;
                let lut = match &o[4] {
                    Operand::Int(v) => *v as u8,
                    _ => return self.unsupported("lop3 with non-immediate table"),
                };
                self.emit(Op::Lop3 { d, a, b, c, lut });
            }
            "setp" => {
                let o = self.ops(i, 3)?;
                let t = self.need_ty(m)?;
                let cmp = m
                    .iter()
                    .find_map(|x| cmp_of(x))
                    .ok_or_else(|| invalid(self.line, "setp needs a comparison"))?;
                let bop = if has("and") {
                    BoolOp::And
                } else if has("or") {
                    BoolOp::Or
                } else if has("xor") {
                    BoolOp::Xor
                } else {
                    BoolOp::None
                };
                let (d, d2) = match &o[0] {
                    Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
                    x => (self.dst(x)?, NONE),
                };
                let a = self.src(&o[1], t)?;
                let b = self.src(&o[2], t)?;
                let (c, cneg) = if bop != BoolOp::None {
                    match o.get(3) {
                        Some(Operand::Not(n)) => {
                            (self.src(&Operand::Name(n.clone()), Ty::Pred)?, true)
                        }
                        Some(x) => (self.src(x, Ty::Pred)?, false),
                        None => {
                            return Err(invalid(self.line, "setp with bool op needs a predicate"))
                        }
                    }
                } else {
                    (Src::Imm(1), false)
                };
                self.emit(Op::Setp {
                    cmp,
                    t,
                    d,
                    d2,
                    a,
                    b,
                    bop,
                    c,
                    cneg,
                    ftz,
                });
            }
            "set" => {
                let o = self.ops(i, 3)?;
                let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
                if tys.len() < 2 || m.iter().any(|x| matches!(x.as_str(), "and" | "or" | "xor")) {
                    return self.unsupported("set form");
                }
                let cmp = m
                    .iter()
                    .find_map(|x| cmp_of(x))
                    .ok_or_else(|| invalid(self.line, "set needs a comparison"))?;
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], tys[1])?;
                let b = self.src(&o[2], tys[1])?;
                self.emit(Op::Set {
                    cmp,
                    t: tys[1],
                    dt: tys[0],
                    d,
                    a,
                    b,
                });
            }
            "testp" => {
                let o = self.ops(i, 2)?;
                let t = self.need_ty(m)?;
                let kind = if has("finite") {
                    0
                } else if has("infinite") {
                    1
                } else if has("number") {
                    2
                } else if has("notanumber") {
                    3
                } else if has("normal") {
                    4
                } else {
                    5
                };
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], t)?;
                self.emit(Op::Testp { d, a, t, kind });
            }
            "cvt" => {
                let o = self.ops(i, 2)?;
                let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
                if tys.len() != 2 {
                    if has("f16x2") || has("bf16x2") {
                        // cvt.rn.f16x2.f32 d, a, b
                        let o = self.ops(i, 3)?;
                        let dt = if has("f16x2") { Ty::F16 } else { Ty::BF16 };
                        let d = self.dst(&o[0])?;
                        let hi = self.src(&o[1], Ty::F32)?;
                        let lo = self.src(&o[2], Ty::F32)?;
                        let t1 = self.new_reg()?;
                        let t2 = self.new_reg()?;
                        self.emit(Op::Cvt {
                            d: t1,
                            a: hi,
                            dt,
                            st: Ty::F32,
                            rnd: rnd_of(m),
                            sat,
                            ftz,
                        });
                        self.emit(Op::Cvt {
                            d: t2,
                            a: lo,
                            dt,
                            st: Ty::F32,
                            rnd: rnd_of(m),
                            sat,
                            ftz,
                        });
                        self.emit(Op::Pack {
                            d,
                            parts: vec![Src::Reg(t2), Src::Reg(t1)],
                            bits: 16,
                        });
                        return Ok(());
                    }
                    return self.unsupported("cvt form");
                }
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], tys[1])?;
                self.emit(Op::Cvt {
                    d,
                    a,
                    dt: tys[0],
                    st: tys[1],
                    rnd: rnd_of(m),
                    sat,
                    ftz,
                });
            }
            "bra" | "brx" => {
                if i.opcode == "brx" {
                    let o = self.ops(i, 2)?;
                    let idx = self.src(&o[0], Ty::U32)?;
                    let _ = idx;
                    return self.unsupported("brx.idx");
                }
                let o = self.ops(i, 1)?;
                let label = match &o[0] {
                    Operand::Name(n) => n.clone(),
                    _ => return Err(invalid(self.line, "bra needs a label")),
                };
                let at = self.code.len();
                self.emit(Op::Bra { target: u32::MAX });
                self.fixups.push((at, label, self.line));
            }
            "ret" => self.emit(if self.is_entry { Op::Exit } else { Op::Ret }),
            "exit" => self.emit(Op::Exit),
            "trap" => self.emit(Op::Trap("trap instruction".into())),
            "brkpt" => self.emit(Op::Trap("breakpoint instruction".into())),
            "call" => self.call(i)?,
            "bar" | "barrier" => {
                let red = if has("red") {
                    if has("popc") {
                        BarRed::Popc
                    } else if has("and") {
                        BarRed::And
                    } else {
                        BarRed::Or
                    }
                } else {
                    BarRed::None
                };
                if has("warp") {
                    let o = self.ops(i, 1)?;
                    let mask = self.src(&o[0], Ty::B32)?;
                    self.emit(Op::WarpSync { mask });
                    return Ok(());
                }
                let wait = !has("arrive");
                let o = &i.operands;
                let (d, rest) = if red != BarRed::None {
                    let o = self.ops(i, 3)?;
                    (self.dst(&o[0])?, &o[1..])
                } else {
                    (NONE, &o[..])
                };
                let id = match rest.first() {
                    Some(x) => self.src(x, Ty::U32)?,
                    None => Src::Imm(0),
                };
                let (count, pi) = if red != BarRed::None {
                    if rest.len() == 3 {
                        (self.src(&rest[1], Ty::U32)?, 2)
                    } else {
                        (Src::Imm(u64::MAX), 1)
                    }
                } else {
                    match rest.get(1) {
                        Some(x) => (self.src(x, Ty::U32)?, 9),
                        None => (Src::Imm(u64::MAX), 9),
                    }
                };
                let (p, pneg) = match rest.get(pi) {
                    Some(Operand::Not(n)) => (self.src(&Operand::Name(n.clone()), Ty::Pred)?, true),
                    Some(x) => (self.src(x, Ty::Pred)?, false),
                    None => (Src::Imm(0), false),
                };
                self.emit(Op::Bar {
                    id,
                    count,
                    wait,
                    red,
                    d,
                    p,
                    pneg,
                });
            }
            "shfl" => {
                let o = self.ops(i, 4)?;
                let mode = if has("up") {
                    ShflMode::Up
                } else if has("down") {
                    ShflMode::Down
                } else if has("bfly") {
                    ShflMode::Bfly
                } else {
                    ShflMode::Idx
                };
                let (d, dp) = match &o[0] {
                    Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
                    x => (self.dst(x)?, NONE),
                };
                let a = self.src(&o[1], Ty::B32)?;
                let b = self.src(&o[2], Ty::U32)?;
                let c = self.src(&o[3], Ty::U32)?;
                let mask = match o.get(4) {
                    Some(x) => self.src(x, Ty::U32)?,
                    None => Src::Imm(0xffff_ffff),
                };
                self.emit(Op::Shfl {
                    mode,
                    d,
                    dp,
                    a,
                    b,
                    c,
                    mask,
                });
            }
            "vote" => {
                let o = self.ops(i, 2)?;
                let mode = if has("all") {
                    VoteMode::All
                } else if has("any") {
                    VoteMode::Any
                } else if has("uni") {
                    VoteMode::Uni
                } else {
                    VoteMode::Ballot
                };
                let d = self.dst(&o[0])?;
                let (a, neg) = match &o[1] {
                    Operand::Not(n) => (self.src(&Operand::Name(n.clone()), Ty::Pred)?, true),
                    x => (self.src(x, Ty::Pred)?, false),
                };
                let mask = match o.get(2) {
                    Some(x) => self.src(x, Ty::U32)?,
                    None => Src::Imm(0xffff_ffff),
                };
                self.emit(Op::Vote {
                    mode,
                    d,
                    a,
                    neg,
                    mask,
                });
            }
            "match" => {
                let o = self.ops(i, 3)?;
                let t = self.need_ty(m)?;
                let (d, dp) = match &o[0] {
                    Operand::Pair(a, b) => (self.dst(a)?, self.dst(b)?),
                    x => (self.dst(x)?, NONE),
                };
                let a = self.src(&o[1], t)?;
                let mask = self.src(&o[2], Ty::U32)?;
                self.emit(Op::Match {
                    all: has("all"),
                    d,
                    dp,
                    a,
                    wide: t.bytes() == 8,
                    mask,
                });
            }
            "redux" => {
                let o = self.ops(i, 3)?;
                let t = self.need_ty(m)?;
                if t.is_float() {
                    return self.unsupported("redux on floats");
                }
                let op = if has("add") {
                    ReduxOp::Add
                } else if has("min") {
                    ReduxOp::Min
                } else if has("max") {
                    ReduxOp::Max
                } else if has("and") {
                    ReduxOp::And
                } else if has("or") {
                    ReduxOp::Or
                } else {
                    ReduxOp::Xor
                };
                let d = self.dst(&o[0])?;
                let a = self.src(&o[1], t)?;
                let mask = self.src(&o[2], Ty::U32)?;
                self.emit(Op::Redux {
                    op,
                    signed: t.signed(),
                    d,
                    a,
                    mask,
                });
            }
            "activemask" => {
                let o = self.ops(i, 1)?;
                let d = self.dst(&o[0])?;
                self.emit(Op::Activemask { d });
            }
            "wmma" => self.wmma(i)?,
            "mma" => {
                let k = if has("m16n8k16") {
                    16
                } else if has("m16n8k8") {
                    8
                } else {
                    return self.unsupported("mma shape other than m16n8k16 / m16n8k8");
                };
                if !(has("row") && has("col")) {
                    return self.unsupported("mma layout other than .row.col");
                }
                let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
                let (dty, ab, cty) = match tys.as_slice() {
                    [d, a, b, c] if a == b && matches!(a, Ty::F16 | Ty::BF16) => (*d, *a, *c),
                    _ => return self.unsupported("mma types"),
                };
                if !matches!(dty, Ty::F32 | Ty::F16)
                    || !matches!(cty, Ty::F32 | Ty::F16)
                    || (ab == Ty::BF16 && k == 8 && dty != Ty::F32)
                {
                    return self.unsupported("mma accumulator type");
                }
                let o = self.ops(i, 4)?;
                let mut vecs = Vec::new();
                for op in &o[1..4] {
                    let Operand::Vector(items) = op else {
                        return Err(invalid(self.line, "mma needs register vectors"));
                    };
                    vecs.push(
                        items
                            .iter()
                            .map(|v| self.src(v, Ty::B32))
                            .collect::<Result<Vec<_>, _>>()?,
                    );
                }
                let Operand::Vector(ditems) = &o[0] else {
                    return Err(invalid(self.line, "mma needs a destination vector"));
                };
                let d = ditems
                    .iter()
                    .map(|x| self.dst(x))
                    .collect::<Result<Vec<_>, _>>()?;
                let c = vecs.pop().unwrap_or_default();
                let b = vecs.pop().unwrap_or_default();
                let a = vecs.pop().unwrap_or_default();
                self.emit(Op::Mma {
                    k,
                    ab,
                    cty,
                    dty,
                    d,
                    a,
                    b,
                    c,
                });
            }
            "ldmatrix" => {
                if !has("m8n8") || !has("b16") {
                    return self.unsupported("ldmatrix shape other than m8n8.b16");
                }
                let num = if has("x4") {
                    4
                } else if has("x2") {
                    2
                } else {
                    1
                };
                let o = self.ops(i, 2)?;
                let Operand::Vector(items) = &o[0] else {
                    return Err(invalid(self.line, "ldmatrix needs a register vector"));
                };
                if items.len() != num {
                    return Err(invalid(self.line, "ldmatrix vector size does not match .x"));
                }
                let ds = items
                    .iter()
                    .map(|x| self.dst(x))
                    .collect::<Result<Vec<_>, _>>()?;
                let sp = sp_of(m).unwrap_or(Sp::Generic);
                let (sp, addr, off) = self.address(&o[1], sp)?;
                self.emit(Op::Ldmatrix {
                    num: num as u8,
                    trans: has("trans"),
                    ds,
                    sp,
                    addr,
                    off,
                });
            }
            "atom" | "red" => {
                let is_red = i.opcode == "red";
                let o = self.ops(i, if is_red { 2 } else { 3 })?;
                let t = self.need_ty(m)?;
                let sp = sp_of(m).unwrap_or(Sp::Generic);
                let op = m
                    .iter()
                    .find_map(|x| {
                        Some(match x.as_str() {
                            "add" => AtomOp::Add,
                            "min" => AtomOp::Min,
                            "max" => AtomOp::Max,
                            "inc" => AtomOp::Inc,
                            "dec" => AtomOp::Dec,
                            "exch" => AtomOp::Exch,
                            "cas" => AtomOp::Cas,
                            "and" => AtomOp::And,
                            "or" => AtomOp::Or,
                            "xor" => AtomOp::Xor,
                            _ => return None,
                        })
                    })
                    .ok_or_else(|| invalid(self.line, "atom needs an operation"))?;
                if has("v2") || has("v4") || has("v8") {
                    return self.unsupported("vector atomics");
                }
                if t.is_float()
                    && !matches!(
                        op,
                        AtomOp::Add | AtomOp::Exch | AtomOp::Min | AtomOp::Max | AtomOp::Cas
                    )
                {
                    return self.unsupported("float atomic op");
                }
                if t.bytes() < 2 || t == Ty::B128 {
                    return self.unsupported("atomic width");
                }
                let (d, rest) = if is_red {
                    (NONE, o)
                } else {
                    (self.dst(&o[0])?, &o[1..])
                };
                let (sp, addr, off) = self.address(&rest[0], sp)?;
                let b = self.src(&rest[1], t)?;
                let c = match rest.get(2) {
                    Some(x) => self.src(x, t)?,
                    None => Src::Imm(0),
                };
                self.emit(Op::Atom {
                    sp,
                    op,
                    t,
                    d,
                    addr,
                    off,
                    b,
                    c,
                });
            }
            "membar" | "fence" | "prefetch" | "prefetchu" | "nanosleep" | "pmevent"
            | "griddepcontrol" | "discard" | "applypriority" | "createpolicy" | "mbarrier_nop" => {
                if i.opcode == "createpolicy" {
                    let o = self.ops(i, 1)?;
                    let d = self.dst(&o[0])?;
                    self.emit(Op::Mov {
                        d,
                        a: Src::Imm(0),
                        mask: u64::MAX,
                    });
                } else {
                    self.emit(Op::Nop)
                }
            }
            other => return self.unsupported(format!("instruction `{other}`")),
        }
        Ok(())
    }

    fn wmma(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let m = &i.modifiers;
        let has = |s: &str| m.iter().any(|x| x == s);
        if !has("m16n16k16") {
            return self.unsupported("wmma shape other than m16n16k16");
        }
        let tys: Vec<Ty> = m.iter().filter_map(|x| Ty::parse(x)).collect();
        let ok = |t: &Ty| matches!(t, Ty::F16 | Ty::BF16 | Ty::F32);
        if tys.is_empty() || !tys.iter().all(ok) {
            return self.unsupported("wmma element type");
        }
        fn regs(ops: &Operand) -> Option<&Vec<Operand>> {
            match ops {
                Operand::Vector(v) if !v.is_empty() && v.len() <= 8 => Some(v),
                _ => None,
            }
        }
        let sp = sp_of(m).unwrap_or(Sp::Generic);
        let row = has("row");
        if has("load") || has("store") {
            let o = self.ops(i, 2)?;
            let (vec_op, addr_op) = if has("load") {
                (&o[0], &o[1])
            } else {
                (&o[1], &o[0])
            };
            let Some(items) = regs(vec_op) else {
                return Err(invalid(self.line, "wmma needs a register vector"));
            };
            let (sp, addr, off) = self.address(addr_op, sp)?;
            let stride = match o.get(2) {
                Some(x) => self.src(x, Ty::U32)?,
                None => Src::Imm(16),
            };
            let ety = tys[tys.len() - 1];
            if has("load") {
                let ds = items
                    .iter()
                    .map(|d| self.dst(d))
                    .collect::<Result<Vec<_>, _>>()?;
                self.emit(Op::WmmaLoad {
                    ety,
                    row,
                    ds,
                    sp,
                    addr,
                    off,
                    stride,
                });
            } else {
                let vals = items
                    .iter()
                    .map(|v| self.src(v, Ty::B32))
                    .collect::<Result<Vec<_>, _>>()?;
                self.emit(Op::WmmaStore {
                    ety,
                    row,
                    vals,
                    sp,
                    addr,
                    off,
                    stride,
                });
            }
            return Ok(());
        }
        if !has("mma") {
            return self.unsupported("wmma form");
        }
        let o = self.ops(i, 4)?;
        let (dty, ab, cty) = match tys.as_slice() {
            [d, c] => (*d, Ty::F16, *c),
            [d, a, _, c] => (*d, *a, *c),
            _ => return self.unsupported("wmma.mma types"),
        };
        let mut vecs = Vec::new();
        for op in &o[1..4] {
            let Some(items) = regs(op) else {
                return Err(invalid(self.line, "wmma.mma needs register vectors"));
            };
            vecs.push(
                items
                    .iter()
                    .map(|v| self.src(v, Ty::B32))
                    .collect::<Result<Vec<_>, _>>()?,
            );
        }
        let Some(ditems) = regs(&o[0]) else {
            return Err(invalid(self.line, "wmma.mma needs a destination vector"));
        };
        let d = ditems
            .iter()
            .map(|x| self.dst(x))
            .collect::<Result<Vec<_>, _>>()?;
        let c = vecs.pop().unwrap_or_default();
        let b = vecs.pop().unwrap_or_default();
        let a = vecs.pop().unwrap_or_default();
        self.emit(Op::WmmaMma {
            ab,
            cty,
            dty,
            d,
            a,
            b,
            c,
        });
        Ok(())
    }

    fn dsts(&mut self, o: &Operand) -> Result<([u32; 4], u8), LoadError> {
        let mut ds = [NONE; 4];
        match o {
            Operand::Vector(items) => {
                if items.len() > 4 || items.is_empty() {
                    return self.unsupported("vector wider than 4");
                }
                for (k, it) in items.iter().enumerate() {
                    ds[k] = self.dst(it)?;
                }
                Ok((ds, items.len() as u8))
            }
            x => {
                ds[0] = self.dst(x)?;
                Ok((ds, 1))
            }
        }
    }

    fn arg_loc(&mut self, o: &Operand, size_hint: u32) -> Result<ArgLoc, LoadError> {
        if let Operand::Name(n) = o {
            if let Some(Binding::Sym(Sym::Frame(off, size))) = self.lookup(n) {
                return Ok(ArgLoc::Frame { off, size });
            }
            if let Some(Binding::Reg(r, t)) = self.lookup(n) {
                return Ok(ArgLoc::Val {
                    src: Src::Reg(r),
                    size: t.bytes().min(8),
                });
            }
        }
        let src = self.src(o, Ty::B64)?;
        Ok(ArgLoc::Val {
            src,
            size: size_hint,
        })
    }

    fn call(&mut self, i: &ast::Instruction) -> Result<(), LoadError> {
        let o = &i.operands;
        let (rets, rest): (&[Operand], &[Operand]) = match o.first() {
            Some(Operand::List(r)) => (r, &o[1..]),
            _ => (&[], &o[..]),
        };
        let Some(Operand::Name(target)) = rest.first() else {
            return self.unsupported("call target form");
        };
        let args: &[Operand] = match rest.get(1) {
            Some(Operand::List(a)) => a,
            _ => &[],
        };
        let func = match self.lookup(target) {
            Some(Binding::Sym(Sym::Func(f))) => f,
            Some(Binding::Reg(r, _)) => {
                let mut a = Vec::new();
                for arg in args {
                    a.push(self.arg_loc(arg, 8)?);
                }
                let mut rl = Vec::new();
                for ret in rets {
                    rl.push(self.arg_loc(ret, 8)?);
                }
                self.emit(Op::Call(Box::new(CallInfo {
                    func: u32::MAX,
                    target: Some(Src::Reg(r)),
                    args: a,
                    rets: rl,
                })));
                return Ok(());
            }
            _ => return Err(invalid(self.line, format!("unknown function `{target}`"))),
        };
        if func == VPRINTF {
            if args.len() != 2 {
                return Err(invalid(self.line, "vprintf takes two arguments"));
            }
            let fmt = self.arg_loc(&args[0], 8)?;
            let a = self.arg_loc(&args[1], 8)?;
            let ret = match rets.first() {
                Some(r) => Some(self.arg_loc(r, 4)?),
                None => None,
            };
            self.emit(Op::Printf { fmt, args: a, ret });
            return Ok(());
        }
        let callee = self
            .funcs
            .get(func as usize)
            .ok_or_else(|| invalid(self.line, "bad function index"))?;
        if callee.body.is_none() {
            if callee.name == "__assertfail" || callee.name == "__assert_fail" {
                self.emit(Op::Trap("device-side assertion failed".into()));
                return Ok(());
            }
            return self.unsupported(format!("call to external function `{}`", callee.name));
        }
        if args.len() != callee.params.len() || rets.len() != callee.returns.len() {
            return Err(invalid(
                self.line,
                format!("call to `{}`: argument count mismatch", callee.name),
            ));
        }
        let mut a = Vec::new();
        for (arg, p) in args.iter().zip(&callee.params) {
            let (size, _) = param_bytes(p)?;
            a.push(self.arg_loc(arg, size)?);
        }
        let mut r = Vec::new();
        for (ret, p) in rets.iter().zip(&callee.returns) {
            let (size, _) = param_bytes(p)?;
            r.push(self.arg_loc(ret, size)?);
        }
        self.emit(Op::Call(Box::new(CallInfo {
            func,
            target: None,
            args: a,
            rets: r,
        })));
        Ok(())
    }
}
