//! A loaded module: parse and lower on load, launch kernels on the
//! compiler's native code where it takes the kernel, else on the
//! interpreter; free the module's globals on unload.

use crate::jit::{self, CompiledModule};
use crate::launch::{check_config, Fault, LaunchConfig, LaunchLimits, LaunchReport};
use crate::memory::DeviceMemory;
use crate::module_info::{GlobalVar, KernelInfo, LoadError};
use crate::{ast, exec, lower, parser};

/// What runs a module's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The interpreter, one thread at a time (the reference).
    Interpreter,
    /// Native code for each kernel the compiler takes (the interpreter for
    /// the others).
    Compiler,
}

impl Engine {
    /// The engine `CUMUX_PTX_ENGINE` names (`interp` or `jit`); the
    /// compiler when unset.
    pub fn from_env() -> Engine {
        match std::env::var("CUMUX_PTX_ENGINE").as_deref() {
            Ok("interp") | Ok("interpreter") => Engine::Interpreter,
            _ => Engine::Compiler,
        }
    }
}

/// A loaded PTX module.
#[derive(Debug)]
pub struct Program {
    /// The lowered module, as the interpreter takes it; its kernel `k` is
    /// `kernels[k]`.
    code: exec::Executable,
    kernels: Vec<KernelInfo>,
    globals: Vec<GlobalVar>,
    allocations: Vec<u64>,
    engine: Engine,
    /// The module's native code, each kernel's compiled at its first launch.
    compiled: CompiledModule,
}

impl Program {
    /// Parses, checks and lowers the PTX; allocates and initialises its
    /// `.global`/`.const` variables in `mem`.
    pub fn load(ptx_src: &str, mem: &DeviceMemory) -> Result<Program, LoadError> {
        let module = parser::parse(ptx_src)?;
        Self::from_module(&module, mem)
    }

    /// Lowers an already parsed module.
    pub fn from_module(module: &ast::Module, mem: &DeviceMemory) -> Result<Program, LoadError> {
        let mut allocated = Vec::new();
        match lower::lower_module(module, mem, &mut allocated) {
            Ok(l) => Ok(Program {
                compiled: CompiledModule::new(l.ir.kernels.len()),
                code: exec::Executable::new(l.ir).with_kernels(l.kernels.clone()),
                kernels: l.kernels,
                globals: l.globals,
                allocations: allocated,
                engine: Engine::from_env(),
            }),
            Err(e) => {
                for a in allocated {
                    let _ = mem.free(a);
                }
                Err(e)
            }
        }
    }

    /// Runs later launches on `engine`.
    pub fn set_engine(&mut self, engine: Engine) {
        self.engine = engine;
    }

    /// The engine launches run on.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Whether the compiler takes `kernel` (compiling it if not done yet);
    /// `Err` says why it runs on the interpreter.
    pub fn compiled(&self, kernel: &str) -> Result<(), String> {
        let Some(k) = self.kernels.iter().position(|k| k.name == kernel) else {
            return Err(format!("no kernel {kernel}"));
        };
        self.compiled
            .kernel(self.code.ir(), k)
            .map(|_| ())
            .map_err(str::to_string)
    }

    /// The module's kernels.
    pub fn kernels(&self) -> &[KernelInfo] {
        &self.kernels
    }

    /// The device memory loading the module allocated, in the order it did
    /// (`DeviceMemory::place_next` puts it there again).
    pub fn allocations(&self) -> &[u64] {
        &self.allocations
    }

    /// The module's `.global` and `.const` variables.
    pub fn globals(&self) -> &[GlobalVar] {
        &self.globals
    }

    /// Runs `kernel` over the grid; `params` is the packed parameter buffer.
    pub fn launch(
        &self,
        mem: &DeviceMemory,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
    ) -> LaunchReport {
        self.launch_with(mem, kernel, cfg, params, &LaunchLimits::NONE)
    }

    /// Like [`Program::launch`], but a block that executes more than
    /// `max_instructions_per_block` fails the launch (`Timeout`, code 702) instead of
    /// running forever.
    pub fn launch_limited(
        &self,
        mem: &DeviceMemory,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
        max_instructions_per_block: u64,
    ) -> LaunchReport {
        let limits = LaunchLimits {
            per_block: max_instructions_per_block,
            ..LaunchLimits::NONE
        };
        self.launch_with(mem, kernel, cfg, params, &limits)
    }

    /// Like [`Program::launch`], stopped early by `limits`: a block or the
    /// whole launch over its instruction budget (`Timeout`, code 702), or the
    /// cancel flag set from another thread (`Cancelled`).
    pub fn launch_with(
        &self,
        mem: &DeviceMemory,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
        limits: &LaunchLimits<'_>,
    ) -> LaunchReport {
        self.run(mem, kernel, cfg, params, limits, false)
    }

    /// Like [`Program::launch_with`], as a cooperative launch
    /// (`cuLaunchCooperativeKernel`): every block runs at once and
    /// `cooperative_groups::this_grid().sync()` waits for the whole grid.
    /// More than 1,024 blocks or 65,536 threads fail with code 720.
    pub fn launch_cooperative(
        &self,
        mem: &DeviceMemory,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
        limits: &LaunchLimits<'_>,
    ) -> LaunchReport {
        self.run(mem, kernel, cfg, params, limits, true)
    }

    fn run(
        &self,
        mem: &DeviceMemory,
        kernel: &str,
        cfg: &LaunchConfig,
        params: &[u8],
        limits: &LaunchLimits<'_>,
        cooperative: bool,
    ) -> LaunchReport {
        let Some(k) = self.kernels.iter().position(|k| k.name == kernel) else {
            return LaunchReport::failed(Fault::UnknownKernel(kernel.to_string()));
        };
        if let Err(f) = check_config(&self.kernels[k], cfg, params.len()) {
            return LaunchReport::failed(f);
        }
        if self.engine == Engine::Compiler {
            if let Ok(native) = self.compiled.kernel(self.code.ir(), k) {
                let ir = self.code.ir();
                if !cooperative {
                    return jit::launch(native, ir, mem, cfg, params, limits, 0);
                }
                return exec::with_grid_workspace(mem, cfg, |workspace| {
                    jit::launch(native, ir, mem, cfg, params, limits, workspace)
                });
            }
        }
        self.code.launch(mem, k, cfg, params, limits, cooperative)
    }

    /// Frees the module's globals.
    pub fn unload(self, mem: &DeviceMemory) {
        for a in self.allocations {
            let _ = mem.free(a);
        }
    }
}
