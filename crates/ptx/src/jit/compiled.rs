//! A module's compiled kernels: each kernel the plan takes is compiled at its
//! first launch or found in the process's cache (keyed by the lowered kernel);
//! the host's code generator is made once per process.

use super::hoist::{hoistable, Expr, Hoist};
use super::inline::{flatten, CHECKS, UNCOUNTED};
use super::lanes::LANES;
use super::lockstep::with_steps;
use super::plan::{plan, polls, Plan};
use super::resident::lane_slots;
use super::runtime::KernelFn;
use super::translate::{kernel_signature, Translator};
use crate::ir::{Func, Module, Op, Src};
use crate::launch::waits_in_block;
use crate::validate::check_module;
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module as _};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The global accesses a lane kernel's copy runs unchecked: each one's
/// first lane's address (`jit::hoist`), in the order of `Ctx::hoisted`.
pub(super) type HoistedSites = Box<[Expr]>;

/// One compiled kernel and the memory its code lives in.
pub(crate) struct CompiledKernel {
    pub(super) entry: KernelFn,
    /// The lane kernel ([`super::lanes`]): the same signature, for
    /// groups of [`LANES`] threads from `first`, each at one resume point,
    /// and the 16-byte slots of each group's lane file.
    pub(super) lanes: Option<KernelFn>,
    /// A copy of the lane kernel whose global accesses at the sites listed
    /// run unchecked, for blocks where each site's span lies inside one
    /// allocation (`jit::hoist`; the launch puts it in the site's cache).
    pub(super) hoisted: Option<(KernelFn, HoistedSites)>,
    pub(super) lane_slots: u32,
    /// Whether the lane kernel runs only blocks whose `%ntid.x` is a
    /// multiple of [`LANES`] (its strided registers need a group's lanes
    /// consecutive in `%tid.x`).
    pub(super) lanes_need_aligned: bool,
    /// Whether a lane block goes on from a group that fails ([`super::restart`]).
    pub(super) restart: bool,
    /// The kernel's ops (the code passes pointers into them to its helpers;
    /// warp collectives are resolved from them) and their source lines.
    pub(super) ops: Box<[Op]>,
    pub(super) lines: Box<[u32]>,
    /// The pc each resume id goes on from.
    pub(super) resumes: Box<[u32]>,
    pub(super) nregs: u32,
    pub(super) frame_bytes: u32,
    /// Whether it has warp collectives or lockstep steps (else no thread
    /// ever waits at one).
    pub(super) collectives: bool,
    /// Whether it makes ordered loads (volatile, relaxed, acquire): it may
    /// spin on what another block writes, so a thread that yields lets the
    /// host's other threads run ([`super::launch`]).
    pub(super) polls: bool,
    /// Whether a thread may poll for another of its block
    /// ([`crate::launch::waits_in_block`]): its threads yield often.
    pub(super) waits_in_block: bool,
    /// Whether every barrier waits for the whole block at one id, with no
    /// `bar.arrive` or `bar.red` (a barrier then completes when all wait).
    pub(super) plain_barriers: bool,
    /// Whether a thread's start reads no register from its file (which
    /// then needs no clearing between blocks).
    pub(super) fresh_start: bool,
    /// Global and generic access sites (each caches its allocation).
    pub(super) global_sites: u32,
    /// Parameter bytes the code reads before its thread loop (the launch
    /// pads its parameters to at least this).
    pub(super) param_extent: u64,
    code: Option<JITModule>,
}

// SAFETY: after `finalize_definitions` the JIT module is never touched again
// until it is dropped; the finished code is immutable and may run on any
// thread, and the kernel's ops are plain data.
unsafe impl Send for CompiledKernel {}
// SAFETY: as for `Send`: shared access only reads the entry point and sizes.
unsafe impl Sync for CompiledKernel {}

impl Drop for CompiledKernel {
    fn drop(&mut self) {
        if let Some(code) = self.code.take() {
            // SAFETY: no launch runs this code: launches borrow the module
            // that owns the kernel, which is being dropped.
            unsafe { code.free_memory() };
        }
    }
}

/// The native code of a module's kernels, compiled on demand: kernel `k`
/// is `kernels[k]`, `Err` with why when it stays on the interpreter.
pub(crate) struct CompiledModule {
    checked: OnceLock<Result<(), String>>,
    kernels: Vec<OnceLock<Result<Arc<CompiledKernel>, String>>>,
}

impl std::fmt::Debug for CompiledModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let done = self.kernels.iter().filter_map(|k| k.get()).count();
        let taken = self
            .kernels
            .iter()
            .filter_map(|k| k.get()?.as_ref().ok())
            .count();
        write!(
            f,
            "CompiledModule({taken} of {done} looked-at kernels compiled, {} in all)",
            self.kernels.len()
        )
    }
}

impl CompiledModule {
    /// Nothing compiled yet for the `kernels` kernels of a module.
    pub(crate) fn new(kernels: usize) -> CompiledModule {
        CompiledModule {
            checked: OnceLock::new(),
            kernels: (0..kernels).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Kernel `k` of `m` (the module this was made for), compiled at the
    /// first call; `Err` says why it stays on the interpreter.
    pub(crate) fn kernel(&self, m: &Module, k: usize) -> Result<&CompiledKernel, &str> {
        let Some(slot) = self.kernels.get(k) else {
            return Err("no such kernel");
        };
        let checked = self
            .checked
            .get_or_init(|| check_module(m).map_err(|e| format!("malformed module: {e}")));
        if let Err(why) = checked {
            return Err(why);
        }
        slot.get_or_init(|| {
            let f = with_steps(flatten(m, m.kernels[k])?);
            let p = plan(&f)?;
            cached(key_of(&f), || compile(&f, &p))
        })
        .as_ref()
        .map(|k| &**k)
        .map_err(|s| s.as_str())
    }
}

/// The host's code generator, made once.
fn host_isa() -> Result<&'static OwnedTargetIsa, String> {
    static ISA: OnceLock<Result<OwnedTargetIsa, String>> = OnceLock::new();
    ISA.get_or_init(|| {
        let mut flags = settings::builder();
        // PTX from nvcc is optimised already: code kept in its order keeps
        // each value next to its use (the e-graph pass would sink the
        // arithmetic of a long straight run below its loads, past every
        // register)
        flags.set("opt_level", "none").map_err(|e| e.to_string())?;
        let isa = cranelift_native::builder().map_err(|e| e.to_string())?;
        isa.finish(settings::Flags::new(flags))
            .map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| format!("no native code generator: {e}"))
}

/// Defines kernel `f`'s code in `jit`, the thread loop (`width` 1) or the
/// lane kernel; its id, global-cache sites and hoisted parameter extent.
fn define(
    jit: &mut JITModule,
    f: &Func,
    ops: &[Op],
    p: &Plan,
    width: u32,
    hoist: Option<&Hoist>,
) -> Result<Defined, String> {
    let sig = kernel_signature(jit.isa().default_call_conv());
    let mut ctx = jit.make_context();
    ctx.func.signature = sig.clone();
    let mut fbctx = FunctionBuilderContext::new();
    let fb = FunctionBuilder::new(&mut ctx.func, &mut fbctx);
    let (sites, extent, aligned, hoisted) =
        Translator::translate(fb, jit.target_config(), f, ops, p, width, hoist);
    let name = match (width, hoist) {
        (1, _) => "kernel",
        (_, None) => "lanes",
        _ => "lanes_hoisted",
    };
    let id = jit
        .declare_function(name, Linkage::Local, &sig)
        .map_err(|e| e.to_string())?;
    if std::env::var_os("CUMUX_JIT_CLIF").is_some() {
        eprintln!("{name} (CLIF):\n{}", ctx.func.display());
    }
    let dump = std::env::var_os("CUMUX_JIT_DISASM").is_some();
    ctx.set_disasm(dump);
    jit.define_function(id, &mut ctx)
        .map_err(|e| format!("code generation: {e:?}"))?;
    if dump {
        if let Some(c) = ctx.compiled_code() {
            eprintln!("{name}:\n{}", c.vcode.as_deref().unwrap_or(""));
        }
    }
    let size = ctx.compiled_code().map_or(0, |c| c.code_buffer().len());
    Ok(Defined {
        id,
        sites,
        extent,
        size,
        aligned,
        hoisted,
    })
}

/// A function `define` made: its id, global-cache sites, hoisted parameter
/// extent, code size, whether its lanes must be aligned, and the `(pc,
/// site)` of each global access it runs unchecked.
struct Defined {
    id: FuncId,
    sites: u32,
    extent: u64,
    size: usize,
    aligned: bool,
    hoisted: Vec<(u32, u32)>,
}

/// Compiles kernel `f` (a module's, whose plan is `p`), or says why not.
fn compile(f: &Func, p: &Plan) -> Result<CompiledKernel, String> {
    let isa = host_isa()?;
    let mut jit = JITModule::new(JITBuilder::with_isa(isa.clone(), default_libcall_names()));
    let ops: Box<[Op]> = f.code.iter().map(|i| i.op.clone()).collect();
    let widths: &[u32] = if p.lanes { &[1, LANES] } else { &[1] };
    let mut ids = Vec::new();
    let mut sizes = Vec::new();
    let mut lanes_need_aligned = false;
    let (mut global_sites, mut param_extent) = (0, 0);
    // (the lane kernel's copy with hoisted checks, where it has such sites)
    let hoist = hoistable(f, p);
    let copy = p.lanes && !hoist.sites.is_empty();
    let mut hoisted = Vec::new();
    for (k, &width) in widths.iter().chain(copy.then_some(&LANES)).enumerate() {
        let h = (k == widths.len()).then_some(&hoist);
        let defined = define(&mut jit, f, &ops, p, width, h);
        let Defined {
            id,
            sites,
            extent,
            size,
            aligned,
            hoisted: unchecked,
        } = match defined {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: none of the module's code was handed out.
                unsafe { jit.free_memory() };
                return Err(e);
            }
        };
        ids.push(id);
        sizes.push(size);
        if h.is_some() {
            hoisted = unchecked;
        }
        lanes_need_aligned |= aligned && width > 1;
        // the kernels share the worker's cache of sites (a hint each
        // access checks: a site another kernel filled only misses)
        global_sites = global_sites.max(sites);
        param_extent = param_extent.max(extent);
    }
    if let Err(e) = jit.finalize_definitions() {
        // SAFETY: none of the module's code was handed out.
        unsafe { jit.free_memory() };
        return Err(e.to_string());
    }
    let mut entries = ids.into_iter().zip(sizes).map(|(id, size)| {
        let code = jit.get_finalized_function(id);
        dump_code(code, size);
        // SAFETY: `code` is the finished code of a function built with
        // `kernel_signature`, which is `KernelFn`'s ABI.
        unsafe { std::mem::transmute::<*const u8, KernelFn>(code) }
    });
    let entry = entries.next().ok_or("no kernel defined")?;
    let lanes = entries.next();
    // (every site the block's check covers must be one the copy runs
    // unchecked, with its cache slot: else the copy is not used)
    let hoisted = entries
        .next()
        .filter(|_| {
            hoist
                .sites
                .iter()
                .all(|(pc, _)| hoisted.iter().any(|(at, _)| at == pc))
        })
        .map(|code| (code, hoist.sites.iter().map(|(_, e)| e.clone()).collect()));
    let collectives = ops.iter().any(|op| {
        matches!(
            op,
            Op::Shfl { .. }
                | Op::Vote { .. }
                | Op::Match { .. }
                | Op::Redux { .. }
                | Op::WarpSync { .. }
                | Op::Activemask { .. }
                | Op::WarpStep
        )
    });
    let polls = polls(&ops);
    let waits_in_block = waits_in_block(&ops);
    let bar_red = ops.iter().any(|op| {
        matches!(
            op,
            Op::Bar { red, .. } if *red != crate::ir::BarRed::None
        )
    });
    let mut ids = ops.iter().filter_map(|op| match op {
        Op::Bar { id, .. } => Some(*id),
        _ => None,
    });
    let first_id = ids.next();
    let plain_barriers = !bar_red
        && ids.all(|id| Some(id) == first_id)
        && ops.iter().all(|op| match op {
            Op::Bar {
                wait, count, id, ..
            } => *wait && *count == Src::Imm(u64::MAX) && matches!(id, Src::Imm(_)),
            _ => true,
        });
    Ok(CompiledKernel {
        polls,
        waits_in_block,
        plain_barriers,
        lanes,
        hoisted,
        lane_slots: lane_slots(f, p).1,
        lanes_need_aligned,
        restart: p.restart,
        collectives,
        fresh_start: p.fresh_start,
        entry,
        ops,
        lines: f
            .code
            .iter()
            .map(|i| i.line & !(UNCOUNTED | CHECKS))
            .collect(),
        resumes: p.resumes.clone().into_boxed_slice(),
        nregs: f.nregs,
        frame_bytes: f.frame_bytes,
        global_sites,
        param_extent,
        code: Some(jit),
    })
}

/// With `CUMUX_JIT_DUMP=DIR`, writes the `size` bytes of finished code at
/// `code` to `DIR/code-<address>.bin` (for profiles: a disassembler at that
/// address lines up with callgrind's instruction counts).
fn dump_code(code: *const u8, size: usize) {
    let Some(dir) = std::env::var_os("CUMUX_JIT_DUMP") else {
        return;
    };
    // SAFETY: `code` is the start of a finished function of `size` bytes,
    // readable while its module lives (it does: the caller holds it).
    let bytes = unsafe { std::slice::from_raw_parts(code, size) };
    let path = std::path::Path::new(&dir).join(format!("code-{:x}.bin", code as usize));
    if let Err(e) = std::fs::write(&path, bytes) {
        eprintln!("CUMUX_JIT_DUMP: {}: {e}", path.display());
    }
}

/// Kernels the cache keeps at most; past it the oldest goes (modules using
/// it keep their own reference).
const CACHE_KERNELS: usize = 512;
/// Bytes of keys (each a kernel's lowered code as text) the cache keeps at
/// most, past which the oldest go too; a larger kernel is not kept.
const CACHE_KEY_BYTES: usize = 64 << 20;

/// Kernels compiled to native code in this process.
static COMPILED: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct Cache {
    kernels: HashMap<String, Arc<CompiledKernel>>,
    order: VecDeque<String>,
    key_bytes: usize,
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// What a kernel's native code is made from: the whole lowered function
/// (the compiler reads nothing else of the module once the plan takes it).
pub(super) fn key_of(f: &Func) -> String {
    format!("{f:?}")
}

/// The cached kernel compiled from `key`, else `compile`'s, kept for the
/// next module with the same kernel.
pub(super) fn cached(
    key: String,
    compile: impl FnOnce() -> Result<CompiledKernel, String>,
) -> Result<Arc<CompiledKernel>, String> {
    let lock = || cache().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = lock().kernels.get(&key) {
        return Ok(k.clone());
    }
    // compiled outside the lock: two modules may compile one kernel at
    // once, and the second keeps the first's
    let kernel = Arc::new(compile()?);
    COMPILED.fetch_add(1, Ordering::Relaxed);
    let mut c = lock();
    if let Some(k) = c.kernels.get(&key) {
        return Ok(k.clone());
    }
    if key.len() > CACHE_KEY_BYTES {
        return Ok(kernel);
    }
    while c.order.len() >= CACHE_KERNELS || c.key_bytes + key.len() > CACHE_KEY_BYTES {
        let Some(old) = c.order.pop_front() else {
            break;
        };
        c.key_bytes -= old.len();
        c.kernels.remove(&old);
    }
    c.key_bytes += key.len();
    c.order.push_back(key.clone());
    c.kernels.insert(key, kernel.clone());
    Ok(kernel)
}

/// Kernels compiled to native code in this process so far (a kernel found
/// in the cache is not counted again).
pub fn compilations() -> u64 {
    COMPILED.load(Ordering::Relaxed)
}
