//! Support shared by the ptx crate's tests, examples and benchmark: a program
//! loaded on its own device memory, host values to device bytes and back,
//! kernel arguments packed by the kernel's parameter layout.

#![allow(dead_code)]

use cumux_ptx::{DeviceMemory, KernelInfo, LaunchConfig, LaunchLimits, LaunchReport, Program};

/// Plain numbers that move between host vectors and device bytes.
pub trait Scalar: Copy {
    const SIZE: usize;
    fn put(self, out: &mut Vec<u8>);
    fn take(bytes: &[u8]) -> Self;
}

macro_rules! scalar {
    ($($ty:ty),*) => {$(
        impl Scalar for $ty {
            const SIZE: usize = std::mem::size_of::<$ty>();
            fn put(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn take(bytes: &[u8]) -> Self {
                <$ty>::from_le_bytes(bytes.try_into().expect("exact width"))
            }
        }
    )*};
}
scalar!(u8, u16, i32, u32, i64, u64, f32, f64);

/// The little-endian bytes of `values`.
pub fn to_bytes<T: Scalar>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::SIZE);
    for &value in values {
        value.put(&mut out);
    }
    out
}

/// The little-endian values in `bytes`.
pub fn from_bytes<T: Scalar>(bytes: &[u8]) -> Vec<T> {
    bytes.chunks_exact(T::SIZE).map(T::take).collect()
}

/// One kernel argument: a number as its little-endian bytes, a by-value
/// struct (`Vec<u8>`) as it is laid out.
pub trait KernelArg {
    fn arg_bytes(&self) -> Vec<u8>;
}

impl<T: Scalar> KernelArg for T {
    fn arg_bytes(&self) -> Vec<u8> {
        to_bytes(&[*self])
    }
}

impl KernelArg for Vec<u8> {
    fn arg_bytes(&self) -> Vec<u8> {
        self.clone()
    }
}

/// The text of `crates/ptx/tests/fixtures/NAME`.
pub fn fixture(name: &str) -> String {
    let path = cumux_testkit::workspace_root()
        .join("crates/ptx/tests/fixtures")
        .join(name);
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The kernel whose name is `name` or, for C++ kernels, starts `_Z<len><name>`.
pub fn find_kernel<'p>(program: &'p Program, name: &str) -> &'p KernelInfo {
    let mangled = format!("_Z{}{name}", name.len());
    program
        .kernels()
        .iter()
        .find(|kernel| kernel.name == name || kernel.name.starts_with(&mangled))
        .unwrap_or_else(|| {
            let names: Vec<&str> = program.kernels().iter().map(|k| k.name.as_str()).collect();
            panic!("no kernel {name}; the module has {names:?}")
        })
}

/// Lays the arguments out as the kernel's `.param` space expects: one
/// argument per parameter, each exactly the parameter's size.
pub fn pack_params(kernel: &KernelInfo, args: &[&dyn KernelArg]) -> Vec<u8> {
    assert_eq!(
        kernel.params.len(),
        args.len(),
        "{} takes {} parameters",
        kernel.name,
        kernel.params.len()
    );
    let mut buffer = vec![0u8; kernel.params_bytes() as usize];
    for (index, (param, arg)) in kernel.params.iter().zip(args).enumerate() {
        let bytes = arg.arg_bytes();
        let offset = param.offset as usize;
        assert_eq!(
            bytes.len(),
            param.size as usize,
            "{} parameter {index}: size mismatch",
            kernel.name
        );
        assert_eq!(offset % (param.align as usize).max(1), 0);
        buffer[offset..offset + bytes.len()].copy_from_slice(&bytes);
    }
    buffer
}

/// A launch of `grid` blocks of `block` threads with `shared` bytes of
/// dynamic shared memory.
pub fn config(grid: [u32; 3], block: [u32; 3], shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid,
        block,
        dynamic_shared_bytes: shared as u32,
    }
}

/// A one-dimensional launch of `blocks` blocks of `threads` threads.
pub fn linear(blocks: usize, threads: usize) -> LaunchConfig {
    config([blocks as u32, 1, 1], [threads as u32, 1, 1], 0)
}

/// A PTX program loaded on its own device memory.
pub struct Device {
    /// What the program is called in failure messages.
    pub name: String,
    pub mem: DeviceMemory,
    pub program: Program,
}

impl Device {
    /// Loads `ptx` on a device memory of `memory_bytes`.
    pub fn load(name: &str, ptx: &str, memory_bytes: u64) -> Device {
        let mem = DeviceMemory::new(memory_bytes);
        let program =
            Program::load(ptx, &mem).unwrap_or_else(|err| panic!("loading {name}: {err:?}"));
        Device {
            name: name.to_string(),
            mem,
            program,
        }
    }

    /// The kernel named `name` (see [`find_kernel`]).
    pub fn kernel(&self, name: &str) -> &KernelInfo {
        find_kernel(&self.program, name)
    }

    /// The address of the module global `name`.
    pub fn global(&self, name: &str) -> u64 {
        self.program
            .globals()
            .iter()
            .find(|global| global.name == name)
            .unwrap_or_else(|| panic!("{} has no global {name}", self.name))
            .ptr
    }

    /// A zero-filled allocation of `bytes` bytes.
    pub fn alloc(&self, bytes: usize) -> u64 {
        self.mem
            .alloc(bytes.max(1) as u64)
            .expect("device allocation")
    }

    /// Copies `values` into a new device allocation.
    pub fn upload<T: Scalar>(&self, values: &[T]) -> u64 {
        let bytes = to_bytes(values);
        let ptr = self.alloc(bytes.len());
        self.mem.write(ptr, &bytes).expect("write to device");
        ptr
    }

    /// Reads `count` values at `ptr`.
    pub fn download<T: Scalar>(&self, ptr: u64, count: usize) -> Vec<T> {
        let mut bytes = vec![0u8; count * T::SIZE];
        self.mem.read(ptr, &mut bytes).expect("read from device");
        from_bytes(&bytes)
    }

    /// Launches kernel `kernel` (see [`find_kernel`]) with `args` packed.
    pub fn try_launch(
        &self,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> LaunchReport {
        self.launch_limited(kernel, cfg, args, &LaunchLimits::NONE)
    }

    /// [`Device::try_launch`] under `limits`.
    pub fn launch_limited(
        &self,
        kernel: &str,
        cfg: LaunchConfig,
        args: &[&dyn KernelArg],
        limits: &LaunchLimits<'_>,
    ) -> LaunchReport {
        let info = self.kernel(kernel);
        let params = pack_params(info, args);
        self.program
            .launch_with(&self.mem, &info.name, &cfg, &params, limits)
    }

    /// Launches and requires the kernel to finish without a fault.
    pub fn launch(&self, kernel: &str, cfg: LaunchConfig, args: &[&dyn KernelArg]) -> LaunchReport {
        let report = self.try_launch(kernel, cfg, args);
        if let Err(fault) = &report.result {
            panic!("{}: {kernel} faulted: {fault:?}", self.name);
        }
        report
    }
}

/// The inputs `ops_gpu_check.cu` gives the `float_ops` kernel of `ops.cu`.
pub const FLOAT_OPS_X: [f32; 17] = [
    0.1,
    -2.5,
    1e-3,
    3.0,
    1e10,
    -0.0,
    1.5,
    2.5,
    -7.25,
    0.333_333_34,
    16_777_217.0,
    1e-30,
    -1e-3,
    0.75,
    123.456,
    -0.5,
    0.0,
];
/// The second operands of `float_ops`, paired with [`FLOAT_OPS_X`].
pub const FLOAT_OPS_Y: [f32; 17] = [
    0.2, 3.0, -7.0, 1e-7, 3.0, 2.0, -1.5, 0.3, 1.0, 3.0, 1.0, 1e-30, 4.0, -0.25, 7.0, 0.0, 0.0,
];

/// The inputs `ops_gpu_check.cu` gives the `int_ops` kernel of `ops.cu`: `n`
/// xorshift words each for `a` and `b`, with zeros, a sign bit, all ones and
/// a shift of 40 at the front.
pub fn int_ops_inputs(n: usize) -> (Vec<u32>, Vec<u32>) {
    let mut seed = 0x1234_5678u32;
    let mut rnd = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    let mut a: Vec<u32> = (0..n).map(|_| rnd()).collect();
    let mut b: Vec<u32> = (0..n).map(|_| rnd()).collect();
    a[0] = 0;
    b[1] = 0;
    a[2] = 0x8000_0000;
    b[2] = u32::MAX;
    b[3] = 40;
    (a, b)
}
