//! A loaded module: parse and lower on load, launch kernels on the
//! interpreter, free the module's globals on unload.

use crate::launch::{check_config, Fault, LaunchConfig, LaunchLimits, LaunchReport};
use crate::memory::DeviceMemory;
use crate::module_info::{GlobalVar, KernelInfo, LoadError};
use crate::{ast, exec, lower, parser};

/// A loaded PTX module.
#[derive(Debug)]
pub struct Program {
    /// The lowered module, as the interpreter takes it; its kernel `k` is
    /// `kernels[k]`.
    code: exec::Executable,
    kernels: Vec<KernelInfo>,
    globals: Vec<GlobalVar>,
    allocations: Vec<u64>,
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
                code: exec::Executable::new(l.ir),
                kernels: l.kernels,
                globals: l.globals,
                allocations: allocated,
            }),
            Err(e) => {
                for a in allocated {
                    let _ = mem.free(a);
                }
                Err(e)
            }
        }
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
        self.code.launch(mem, k, cfg, params, limits, cooperative)
    }

    /// Frees the module's globals.
    pub fn unload(self, mem: &DeviceMemory) {
        for a in self.allocations {
            let _ = mem.free(a);
        }
    }
}
