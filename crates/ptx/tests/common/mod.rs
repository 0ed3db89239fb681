//! Support shared by the ptx crate's tests, examples and benchmark: kernel
//! lookup and parameter packing, device buffers from host values and back,
//! launches of a kernel by name.

#![allow(dead_code)]

use cumux_ptx::{DeviceMemory, KernelInfo, LaunchConfig, LaunchReport, Program};

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
pub fn pack_params(kernel: &KernelInfo, args: &[&[u8]]) -> Vec<u8> {
    assert_eq!(
        kernel.params.len(),
        args.len(),
        "{} takes {} parameters",
        kernel.name,
        kernel.params.len()
    );
    let mut buffer = vec![0u8; kernel.params_bytes() as usize];
    for (index, (param, bytes)) in kernel.params.iter().zip(args).enumerate() {
        let offset = param.offset as usize;
        assert_eq!(
            bytes.len(),
            param.size as usize,
            "{} parameter {index}: size mismatch",
            kernel.name
        );
        assert_eq!(offset % (param.align as usize).max(1), 0);
        buffer[offset..offset + bytes.len()].copy_from_slice(bytes);
    }
    buffer
}

/// Launches kernel `name` (see [`find_kernel`]) with `args` packed.
pub fn launch(
    program: &Program,
    mem: &DeviceMemory,
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    dynamic_shared_bytes: u32,
    args: &[&[u8]],
) -> LaunchReport {
    let kernel = find_kernel(program, name);
    let params = pack_params(kernel, args);
    let config = LaunchConfig {
        grid,
        block,
        dynamic_shared_bytes,
    };
    program.launch(mem, &kernel.name, &config, &params)
}

/// Copies `bytes` into a new device allocation.
pub fn upload(mem: &DeviceMemory, bytes: &[u8]) -> u64 {
    let ptr = mem
        .alloc(bytes.len().max(1) as u64)
        .expect("device allocation");
    mem.write(ptr, bytes).expect("write to device");
    ptr
}

/// Reads `len` bytes at `ptr`.
pub fn download(mem: &DeviceMemory, ptr: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    mem.read(ptr, &mut bytes).expect("read from device");
    bytes
}

/// The little-endian bytes of `values`.
pub fn le_bytes<T: Copy, const N: usize>(values: &[T], to_le: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to_le(v)).collect()
}

/// The little-endian `N`-byte values in `bytes`.
pub fn words<T, const N: usize>(bytes: &[u8], from_le: impl Fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| from_le(c.try_into().expect("N bytes")))
        .collect()
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
