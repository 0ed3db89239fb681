//! A parsed module to a lowered one: function indices, module variables
//! (allocated and initialised in device memory), the shared-memory layout,
//! each function lowered, kernel parameter layouts and kernel facts.

use super::context::FuncLower;
use super::error::{invalid, unsupported_at};
use super::layout::{align_up, param_bytes, var_align, var_size, write_init};
use super::symbols::{Binding, Sym, VPRINTF};
use crate::ast::{self, StateSpace, Statement};
use crate::ir::{Module, Ty};
use crate::memory::DeviceMemory;
use crate::module_info::{GlobalVar, KernelInfo, LoadError, ParamLayout, Space};
use crate::validate::check_module;
use std::collections::HashMap;

/// A lowered module with what it says about its kernels and variables.
pub(crate) struct Lowered {
    pub ir: Module,
    /// What the module says about each kernel, in the order of `ir.kernels`.
    pub kernels: Vec<KernelInfo>,
    pub globals: Vec<GlobalVar>,
}

/// Lowers `m`, allocating its module variables in `mem` (their addresses are
/// pushed to `allocated` as they are made, so a caller can free them when
/// lowering fails).
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
                _ => {
                    return Err(unsupported_at(
                        v.line,
                        "module-level variable in this state space",
                    ))
                }
            }
        }
    }
    let _ = has_dyn;
    // initialize globals
    let mut gvars = Vec::new();
    for (v, addr, size) in &globals {
        if let Some(init) = &v.init {
            let t = Ty::parse(&v.ty).ok_or_else(|| unsupported_at(v.line, "type"))?;
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
        let mut fl = FuncLower::new(&syms, &func_items);
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
                .tuning
                .maxntid
                .or(f.tuning.reqntid)
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
                    reqntid: f.tuning.reqntid,
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
        ir: hand_off(Module {
            funcs,
            kernels: kernel_funcs,
            dyn_shared_base: dyn_base as u32,
        })?,
        kernels,
        globals: gvars,
    })
}

/// Lowering's side of the boundary: a module leaves lowering only if it is
/// well formed. A malformed one is a lowering bug, never the input's fault,
/// but it still fails the load (an error, not a panic: input PTX must never
/// bring the device down).
pub(crate) fn hand_off(ir: Module) -> Result<Module, LoadError> {
    match check_module(&ir) {
        Ok(()) => Ok(ir),
        Err(e) => Err(LoadError::Invalid(format!(
            "internal error: lowering produced a malformed module: {e}"
        ))),
    }
}

/// Lays out the function-scope shared variables of `body` from `off` on.
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
