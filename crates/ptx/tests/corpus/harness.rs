//! The corpus tests' harness: a corpus source compiled to PTX and loaded on
//! its own device memory, typed kernel arguments, host and device vectors,
//! deterministic inputs and tolerance checks.

use crate::common::{find_kernel, pack_params};
use cumux_ptx::{DeviceMemory, KernelInfo, LaunchConfig, LaunchReport, Program};

pub const MEMORY_BYTES: u64 = 256 << 20;

/// One kernel argument, packed into the parameter buffer at its PTX offset.
pub enum Arg {
    Ptr(u64),
    I32(i32),
    U32(u32),
    U64(u64),
    F32(f32),
    /// A by-value struct, already laid out.
    Bytes(Vec<u8>),
}

impl Arg {
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Arg::Ptr(value) | Arg::U64(value) => value.to_le_bytes().to_vec(),
            Arg::I32(value) => value.to_le_bytes().to_vec(),
            Arg::U32(value) => value.to_le_bytes().to_vec(),
            Arg::F32(value) => value.to_le_bytes().to_vec(),
            Arg::Bytes(bytes) => bytes.clone(),
        }
    }
}

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

pub fn to_bytes<T: Scalar>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::SIZE);
    for &value in values {
        value.put(&mut out);
    }
    out
}

pub fn from_bytes<T: Scalar>(bytes: &[u8]) -> Vec<T> {
    bytes.chunks_exact(T::SIZE).map(T::take).collect()
}

/// A corpus source loaded as one module on its own device memory.
pub struct Module {
    pub source: &'static str,
    pub mem: DeviceMemory,
    pub program: Program,
}

impl Module {
    pub fn load(source: &'static str) -> Self {
        let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source(source));
        let mem = DeviceMemory::new(MEMORY_BYTES);
        let program = Program::load(&ptx, &mem)
            .unwrap_or_else(|err| panic!("loading the PTX of {source}.cu: {err:?}"));
        Module {
            source,
            mem,
            program,
        }
    }

    /// The kernel whose (mangled) name is `name` or starts `_Z<len><name>`.
    pub fn kernel(&self, name: &str) -> &KernelInfo {
        find_kernel(&self.program, name)
    }

    pub fn global(&self, name: &str) -> u64 {
        self.program
            .globals()
            .iter()
            .find(|global| global.name == name)
            .unwrap_or_else(|| panic!("{}.cu has no global {name}", self.source))
            .ptr
    }

    pub fn upload<T: Scalar>(&self, values: &[T]) -> u64 {
        let bytes = to_bytes(values);
        let ptr = self.alloc(bytes.len());
        self.mem.write(ptr, &bytes).expect("write to device");
        ptr
    }

    /// A zero-filled allocation of `bytes` bytes.
    pub fn alloc(&self, bytes: usize) -> u64 {
        let ptr = self
            .mem
            .alloc(bytes.max(1) as u64)
            .expect("device allocation");
        self.mem
            .write(ptr, &vec![0u8; bytes])
            .expect("zero device memory");
        ptr
    }

    pub fn download<T: Scalar>(&self, ptr: u64, count: usize) -> Vec<T> {
        let mut bytes = vec![0u8; count * T::SIZE];
        self.mem.read(ptr, &mut bytes).expect("read from device");
        from_bytes(&bytes)
    }

    pub fn try_launch(
        &self,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        shared: usize,
        args: &[Arg],
    ) -> LaunchReport {
        let info = self.kernel(kernel);
        let bytes: Vec<Vec<u8>> = args.iter().map(Arg::bytes).collect();
        let bytes: Vec<&[u8]> = bytes.iter().map(|b| b.as_slice()).collect();
        let params = pack_params(info, &bytes);
        let config = LaunchConfig {
            grid,
            block,
            dynamic_shared_bytes: shared as _,
        };
        self.program.launch(&self.mem, &info.name, &config, &params)
    }

    /// Launches and requires the kernel to finish without a fault.
    pub fn launch(
        &self,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        shared: usize,
        args: &[Arg],
    ) -> LaunchReport {
        let report = self.try_launch(kernel, grid, block, shared, args);
        if let Err(fault) = &report.result {
            panic!("{}.cu: {kernel} faulted: {fault:?}", self.source);
        }
        report
    }
}

pub fn grid1(blocks: usize) -> [u32; 3] {
    [blocks as u32, 1, 1]
}

pub fn block1(threads: usize) -> [u32; 3] {
    [threads as u32, 1, 1]
}

/// Deterministic inputs: a 64-bit linear congruential generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (f64::from(self.next_u32()) / 4_294_967_296.0)
    }

    pub fn range_i32(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next_u32() % (hi - lo + 1) as u32) as i32
    }
}

pub fn assert_close(what: &str, index: usize, got: f64, want: f64, relative: f64) {
    let bound = relative * want.abs().max(1.0);
    assert!(
        (got - want).abs() <= bound,
        "{what}[{index}]: got {got} expected {want} (bound {bound})"
    );
}
