//! A module's compiled kernels: each kernel the plan takes is translated
//! and finalised into native code once, at the module's first launch; the
//! code lives as long as the module.

use super::plan::plan;
use super::runtime::KernelFn;
use super::translate::{kernel_signature, Translator};
use crate::ir::{Module, Op};
use crate::validate::check_module;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module as _};

/// One compiled kernel.
pub(crate) struct CompiledKernel {
    pub(super) entry: KernelFn,
    /// The kernel's ops: the code passes pointers into them to its helpers.
    _ops: Box<[Op]>,
    pub(super) nregs: u32,
    pub(super) frame_bytes: u32,
    /// Global and generic access sites (each caches its allocation).
    pub(super) global_sites: u32,
}

/// The native code of a module: kernel `k` is `kernels[k]`, `Err` with
/// why when the kernel stays on the interpreter.
pub(crate) struct CompiledModule {
    pub(crate) kernels: Vec<Result<CompiledKernel, String>>,
    /// Owns the code's memory; freed when the module goes.
    code: Option<JITModule>,
}

// SAFETY: after `finalize_definitions` the JIT module is never touched again
// until it is dropped; the finalised code is immutable and may run on any
// thread, and the kernels' ops are plain data.
unsafe impl Send for CompiledModule {}
// SAFETY: as for `Send`: shared access only reads the finished code pointers.
unsafe impl Sync for CompiledModule {}

impl std::fmt::Debug for CompiledModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let taken = self.kernels.iter().filter(|k| k.is_ok()).count();
        write!(f, "CompiledModule({taken}/{} kernels)", self.kernels.len())
    }
}

impl Drop for CompiledModule {
    fn drop(&mut self) {
        if let Some(code) = self.code.take() {
            // SAFETY: no launch runs: the module's owner is being dropped,
            // and launches borrow it.
            unsafe { code.free_memory() };
        }
    }
}

impl CompiledModule {
    /// Compiles every kernel of `m` the compiler takes.
    pub(crate) fn compile(m: &Module) -> CompiledModule {
        let none = |why: String| CompiledModule {
            kernels: m.kernels.iter().map(|_| Err(why.clone())).collect(),
            code: None,
        };
        if let Err(e) = check_module(m) {
            return none(format!("malformed module: {e}"));
        }
        let mut flags = settings::builder();
        let isa = flags
            .set(
                "opt_level",
                &std::env::var("CUMUX_JIT_OPT").unwrap_or_else(|_| "none".into()),
            )
            .map_err(|e| e.to_string())
            .and_then(|_| cranelift_native::builder().map_err(|e| e.to_string()))
            .and_then(|b| {
                b.finish(settings::Flags::new(flags))
                    .map_err(|e| e.to_string())
            });
        let isa = match isa {
            Ok(isa) => isa,
            Err(e) => return none(format!("no native code generator: {e}")),
        };
        let call_conv = isa.default_call_conv();
        let mut jit = JITModule::new(JITBuilder::with_isa(isa, default_libcall_names()));
        let mut fbctx = FunctionBuilderContext::new();
        let mut pending = Vec::new();
        for k in 0..m.kernels.len() {
            let p = match plan(m, k) {
                Ok(p) => p,
                Err(why) => {
                    pending.push(Err(why));
                    continue;
                }
            };
            let f = &m.funcs[m.kernels[k] as usize];
            let ops: Box<[Op]> = f.code.iter().map(|i| i.op.clone()).collect();
            let sig = kernel_signature(call_conv);
            let mut ctx = jit.make_context();
            ctx.set_disasm(std::env::var_os("CUMUX_JIT_DUMP").is_some());
            ctx.func.signature = sig.clone();
            let fb = FunctionBuilder::new(&mut ctx.func, &mut fbctx);
            let sites = Translator::translate(fb, jit.target_config(), f, &ops, &p);
            let id = jit
                .declare_function(&format!("kernel{k}"), Linkage::Local, &sig)
                .map_err(|e| e.to_string());
            let defined = id.and_then(|id| {
                jit.define_function(id, &mut ctx)
                    .map(|_| id)
                    .map_err(|e| format!("{e:?}"))
            });
            if std::env::var_os("CUMUX_JIT_DUMP").is_some() {
                if let Some(code) = ctx.compiled_code().and_then(|c| c.vcode.clone()) {
                    eprintln!("{code}");
                }
            }
            jit.clear_context(&mut ctx);
            pending.push(defined.map(|id| (id, ops, f.nregs, f.frame_bytes, sites)));
        }
        if let Err(e) = jit.finalize_definitions() {
            return none(format!("finalising code: {e}"));
        }
        let kernels = pending
            .into_iter()
            .map(|r| {
                r.map(|(id, ops, nregs, frame_bytes, global_sites)| {
                    let p = jit.get_finalized_function(id);
                    // SAFETY: `p` is the finalised code of a function built with
                    // `kernel_signature`, which is `KernelFn`'s ABI.
                    let entry = unsafe { std::mem::transmute::<*const u8, KernelFn>(p) };
                    CompiledKernel {
                        entry,
                        _ops: ops,
                        nregs,
                        frame_bytes,
                        global_sites,
                    }
                })
            })
            .collect();
        CompiledModule {
            kernels,
            code: Some(jit),
        }
    }
}
