//! Runs the kernels of the CUDA corpus (`tests/cuda/corpus/*.cu`) directly on the
//! PTX interpreter: each source is compiled to PTX with nvcc (via cumux-testkit),
//! launched with inputs made here, and checked against a reference computed in Rust.

use cumux_ptx::{DeviceMemory, Fault, KernelInfo, LaunchConfig, LaunchReport, Program};
use std::collections::BTreeSet;

const MEMORY_BYTES: u64 = 256 << 20;

/// One kernel argument, packed into the parameter buffer at its PTX offset.
enum Arg {
    Ptr(u64),
    I32(i32),
    U32(u32),
    U64(u64),
    F32(f32),
    /// A by-value struct, already laid out.
    Bytes(Vec<u8>),
}

impl Arg {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Arg::Ptr(value) | Arg::U64(value) => value.to_le_bytes().to_vec(),
            Arg::I32(value) => value.to_le_bytes().to_vec(),
            Arg::U32(value) => value.to_le_bytes().to_vec(),
            Arg::F32(value) => value.to_le_bytes().to_vec(),
            Arg::Bytes(bytes) => bytes.clone(),
        }
    }
}

/// Lays the arguments out as the kernel's `.param` space expects.
fn pack_params(kernel: &KernelInfo, args: &[Arg]) -> Vec<u8> {
    assert_eq!(
        kernel.params.len(),
        args.len(),
        "{} takes {} parameters",
        kernel.name,
        kernel.params.len()
    );
    let end = kernel
        .params
        .iter()
        .map(|param| param.offset as usize + param.size as usize)
        .max()
        .unwrap_or(0);
    let mut buffer = vec![0u8; end];
    for (index, (param, arg)) in kernel.params.iter().zip(args).enumerate() {
        let bytes = arg.bytes();
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

/// Plain numbers that move between host vectors and device bytes.
trait Scalar: Copy {
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

fn to_bytes<T: Scalar>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::SIZE);
    for &value in values {
        value.put(&mut out);
    }
    out
}

fn from_bytes<T: Scalar>(bytes: &[u8]) -> Vec<T> {
    bytes.chunks_exact(T::SIZE).map(T::take).collect()
}

/// A corpus source loaded as one module on its own device memory.
struct Module {
    source: &'static str,
    mem: DeviceMemory,
    program: Program,
}

impl Module {
    fn load(source: &'static str) -> Self {
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
    fn kernel(&self, name: &str) -> &KernelInfo {
        let mangled = format!("_Z{}{name}", name.len());
        self.program
            .kernels()
            .iter()
            .find(|kernel| kernel.name == name || kernel.name.starts_with(&mangled))
            .unwrap_or_else(|| {
                let names: Vec<&str> = self
                    .program
                    .kernels()
                    .iter()
                    .map(|kernel| kernel.name.as_str())
                    .collect();
                panic!("{}.cu has no kernel {name}; it has {names:?}", self.source)
            })
    }

    fn global(&self, name: &str) -> u64 {
        self.program
            .globals()
            .iter()
            .find(|global| global.name == name)
            .unwrap_or_else(|| panic!("{}.cu has no global {name}", self.source))
            .ptr
    }

    fn upload<T: Scalar>(&self, values: &[T]) -> u64 {
        let bytes = to_bytes(values);
        let ptr = self.alloc(bytes.len());
        self.mem.write(ptr, &bytes).expect("write to device");
        ptr
    }

    /// A zero-filled allocation of `bytes` bytes.
    fn alloc(&self, bytes: usize) -> u64 {
        let ptr = self
            .mem
            .alloc(bytes.max(1) as u64)
            .expect("device allocation");
        self.mem
            .write(ptr, &vec![0u8; bytes])
            .expect("zero device memory");
        ptr
    }

    fn download<T: Scalar>(&self, ptr: u64, count: usize) -> Vec<T> {
        let mut bytes = vec![0u8; count * T::SIZE];
        self.mem.read(ptr, &mut bytes).expect("read from device");
        from_bytes(&bytes)
    }

    fn try_launch(
        &self,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        shared: usize,
        args: &[Arg],
    ) -> LaunchReport {
        let info = self.kernel(kernel);
        let params = pack_params(info, args);
        let config = LaunchConfig {
            grid,
            block,
            dynamic_shared_bytes: shared as _,
        };
        self.program.launch(&self.mem, &info.name, &config, &params)
    }

    /// Launches and requires the kernel to finish without a fault.
    fn launch(
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

fn grid1(blocks: usize) -> [u32; 3] {
    [blocks as u32, 1, 1]
}

fn block1(threads: usize) -> [u32; 3] {
    [threads as u32, 1, 1]
}

/// Deterministic inputs: a 64-bit linear congruential generator.
struct Rng(u64);

impl Rng {
    fn next_u32(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (f64::from(self.next_u32()) / 4_294_967_296.0)
    }

    fn range_i32(&mut self, lo: i32, hi: i32) -> i32 {
        lo + (self.next_u32() % (hi - lo + 1) as u32) as i32
    }
}

fn assert_close(what: &str, index: usize, got: f64, want: f64, relative: f64) {
    let bound = relative * want.abs().max(1.0);
    assert!(
        (got - want).abs() <= bound,
        "{what}[{index}]: got {got} expected {want} (bound {bound})"
    );
}

#[test]
fn vector_add() {
    let module = Module::load("vector_add");
    let n = 10_007;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 / (i + 1) as f32).collect();
    let (da, db, dc) = (module.upload(&a), module.upload(&b), module.alloc(n * 4));
    let report = module.launch(
        "vector_add",
        grid1(n.div_ceil(256)),
        block1(256),
        0,
        &[Arg::Ptr(da), Arg::Ptr(db), Arg::Ptr(dc), Arg::I32(n as i32)],
    );
    assert!(report.instructions > n as u64);
    let c: Vec<f32> = module.download(dc, n);
    for i in 0..n {
        assert_eq!(c[i].to_bits(), (a[i] + b[i]).to_bits(), "c[{i}]");
    }
}

#[test]
fn saxpy() {
    let module = Module::load("saxpy");
    let n = 1 << 16;
    let alpha = 2.5f32;
    let mut rng = Rng(1);
    let x: Vec<f32> = (0..n).map(|_| rng.uniform(-0.5, 0.5) as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.001).collect();
    let (dx, dy) = (module.upload(&x), module.upload(&y));
    module.launch(
        "saxpy",
        grid1(32),
        block1(256),
        0,
        &[
            Arg::I32(n as i32),
            Arg::F32(alpha),
            Arg::Ptr(dx),
            Arg::Ptr(dy),
        ],
    );
    let out: Vec<f32> = module.download(dy, n);
    for i in 0..n {
        let want = alpha.mul_add(x[i], y[i]);
        assert_close("y", i, f64::from(out[i]), f64::from(want), 1e-6);
    }
}

#[test]
fn matmul_tiled() {
    let module = Module::load("matmul_tiled");
    let (m, n, k) = (70usize, 50usize, 40usize);
    let mut rng = Rng(2);
    let a: Vec<f32> = (0..m * k).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
    let b: Vec<f32> = (0..k * n).map(|_| rng.uniform(-1.0, 1.0) as f32).collect();
    let (da, db, dc) = (
        module.upload(&a),
        module.upload(&b),
        module.alloc(m * n * 4),
    );
    module.launch(
        "matmul_tiled",
        [n.div_ceil(16) as u32, m.div_ceil(16) as u32, 1],
        [16, 16, 1],
        0,
        &[
            Arg::Ptr(da),
            Arg::Ptr(db),
            Arg::Ptr(dc),
            Arg::I32(m as i32),
            Arg::I32(n as i32),
            Arg::I32(k as i32),
        ],
    );
    let c: Vec<f32> = module.download(dc, m * n);
    for row in 0..m {
        for col in 0..n {
            let want: f64 = (0..k)
                .map(|i| f64::from(a[row * k + i]) * f64::from(b[i * n + col]))
                .sum();
            assert_close("C", row * n + col, f64::from(c[row * n + col]), want, 1e-4);
        }
    }
}

#[test]
fn reduce_shfl() {
    let module = Module::load("reduce_shfl");
    let n: usize = 50_001;
    let mut rng = Rng(3);
    let data: Vec<i32> = (0..n).map(|_| rng.range_i32(-1000, 1000)).collect();
    let (din, dtotal) = (module.upload(&data), module.alloc(8));
    module.launch(
        "reduce_shfl",
        grid1(8),
        block1(256),
        0,
        &[Arg::Ptr(din), Arg::Ptr(dtotal), Arg::I32(n as i32)],
    );
    let total = module.download::<u64>(dtotal, 1)[0] as i64;
    assert_eq!(total, data.iter().map(|&v| i64::from(v)).sum::<i64>());
}

#[test]
fn histogram() {
    let module = Module::load("histogram");
    let n: usize = 40_000;
    let mut rng = Rng(4);
    let data: Vec<u8> = (0..n)
        .map(|_| {
            let v = rng.next_u32() >> 24;
            ((v * v) >> 8) as u8
        })
        .collect();
    let (ddata, dbins) = (module.upload(&data), module.alloc(256 * 4));
    module.launch(
        "histogram",
        grid1(10),
        block1(192),
        0,
        &[Arg::Ptr(ddata), Arg::I32(n as i32), Arg::Ptr(dbins)],
    );
    let mut want = vec![0u32; 256];
    for &byte in &data {
        want[byte as usize] += 1;
    }
    assert_eq!(module.download::<u32>(dbins, 256), want);
}

#[test]
fn prefix_scan() {
    let module = Module::load("prefix_scan");
    let n: usize = 5000;
    let block = 256;
    let blocks = n.div_ceil(block);
    let input: Vec<i32> = (0..n as i32).map(|i| (i * 37 + 11) % 19 - 9).collect();
    let din = module.upload(&input);
    let dout = module.alloc(n * 4);
    let dsums = module.alloc(blocks * 4);
    let dscanned = module.alloc(blocks * 4);
    module.launch(
        "scan_blocks",
        grid1(blocks),
        block1(block),
        0,
        &[
            Arg::Ptr(din),
            Arg::Ptr(dout),
            Arg::Ptr(dsums),
            Arg::I32(n as i32),
        ],
    );
    module.launch(
        "scan_blocks",
        grid1(1),
        block1(block),
        0,
        &[
            Arg::Ptr(dsums),
            Arg::Ptr(dscanned),
            Arg::Ptr(0),
            Arg::I32(blocks as i32),
        ],
    );
    module.launch(
        "add_block_offsets",
        grid1(blocks),
        block1(block),
        0,
        &[Arg::Ptr(dout), Arg::Ptr(dscanned), Arg::I32(n as i32)],
    );
    let out: Vec<i32> = module.download(dout, n);
    let want: Vec<i32> = input
        .iter()
        .scan(0, |sum, &v| {
            *sum += v;
            Some(*sum)
        })
        .collect();
    assert_eq!(out, want);
}

#[test]
fn transpose() {
    let module = Module::load("transpose");
    let (rows, cols) = (70usize, 100usize);
    let input: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
    let (din, dout) = (module.upload(&input), module.alloc(rows * cols * 4));
    module.launch(
        "transpose",
        [cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1],
        [32, 8, 1],
        0,
        &[
            Arg::Ptr(din),
            Arg::Ptr(dout),
            Arg::I32(rows as i32),
            Arg::I32(cols as i32),
        ],
    );
    let out: Vec<f32> = module.download(dout, rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            assert_eq!(out[c * rows + r], input[r * cols + c], "out[{c}][{r}]");
        }
    }
}

#[test]
fn nbody() {
    let module = Module::load("nbody");
    let n = 256;
    let dt = 0.001f32;
    let mut rng = Rng(5);
    let mut pos = Vec::with_capacity(4 * n);
    let mut vel = Vec::with_capacity(4 * n);
    for _ in 0..n {
        for _ in 0..3 {
            pos.push(rng.uniform(-1.0, 1.0) as f32);
        }
        pos.push(rng.uniform(0.5, 0.6) as f32);
        for _ in 0..3 {
            vel.push(rng.uniform(-0.5, 0.5) as f32);
        }
        vel.push(0.0f32);
    }
    let (dpos, dvel) = (module.upload(&pos), module.upload(&vel));
    let args = [
        Arg::Ptr(dpos),
        Arg::Ptr(dvel),
        Arg::I32(n as i32),
        Arg::F32(dt),
    ];
    module.launch("body_forces", grid1(n / 128), block1(128), 0, &args);
    module.launch("integrate", grid1(n / 128), block1(128), 0, &args);
    let got_pos: Vec<f32> = module.download(dpos, 4 * n);
    let got_vel: Vec<f32> = module.download(dvel, 4 * n);

    let eps2 = 0.01f64 * 0.01;
    let dt = f64::from(dt);
    for i in 0..n {
        let mut acc = [0f64; 3];
        for j in 0..n {
            let d: Vec<f64> = (0..3)
                .map(|c| f64::from(pos[4 * j + c]) - f64::from(pos[4 * i + c]))
                .collect();
            let inv = 1.0 / (d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + eps2).sqrt();
            let s = f64::from(pos[4 * j + 3]) * inv * inv * inv;
            for c in 0..3 {
                acc[c] += d[c] * s;
            }
        }
        for c in 0..3 {
            let v = f64::from(vel[4 * i + c]) + acc[c] * dt;
            let p = f64::from(pos[4 * i + c]) + v * dt;
            assert_close("vel", 4 * i + c, f64::from(got_vel[4 * i + c]), v, 2e-3);
            assert_close("pos", 4 * i + c, f64::from(got_pos[4 * i + c]), p, 2e-3);
        }
    }
}

#[test]
fn bitonic_sort() {
    let module = Module::load("bitonic_sort");
    const CHUNK: u32 = 1024; // fixed in bitonic_sort.cu
    let n = 4 * CHUNK; // two merge sizes above a chunk: global and shared stages
    let mut rng = Rng(6);
    let keys: Vec<u32> = (0..n).map(|_| rng.next_u32() % 100_000).collect();
    let dkeys = module.upload(&keys);
    let chunks = (n / CHUNK) as usize;
    let shared = |first: u32, last: u32| {
        module.launch(
            "bitonic_shared",
            grid1(chunks),
            block1(CHUNK as usize / 2),
            0,
            &[Arg::Ptr(dkeys), Arg::U32(first), Arg::U32(last)],
        );
    };
    shared(2, CHUNK);
    let mut size = 2 * CHUNK;
    while size <= n {
        let mut stride = size / 2;
        while stride >= CHUNK {
            module.launch(
                "bitonic_global",
                grid1((n / 256) as usize),
                block1(256),
                0,
                &[Arg::Ptr(dkeys), Arg::U32(size), Arg::U32(stride)],
            );
            stride /= 2;
        }
        shared(size, size);
        size *= 2;
    }
    let mut want = keys.clone();
    want.sort_unstable();
    assert_eq!(module.download::<u32>(dkeys, n as usize), want);
}

fn normal_cdf(d: f64) -> f64 {
    let (a1, a2, a3, a4, a5) = (
        0.319_381_53,
        -0.356_563_782,
        1.781_477_937,
        -1.821_255_978,
        1.330_274_429,
    );
    let k = 1.0 / (1.0 + 0.231_641_9 * d.abs());
    let value = 0.398_942_280_401_432_7
        * (-0.5 * d * d).exp()
        * (k * (a1 + k * (a2 + k * (a3 + k * (a4 + k * a5)))));
    if d > 0.0 {
        1.0 - value
    } else {
        value
    }
}

#[test]
fn black_scholes() {
    let module = Module::load("black_scholes");
    let n = 500;
    let (rate, volatility) = (0.02f32, 0.30f32);
    let mut rng = Rng(7);
    let spot: Vec<f32> = (0..n).map(|_| rng.uniform(5.0, 30.0) as f32).collect();
    let strike: Vec<f32> = (0..n).map(|_| rng.uniform(1.0, 100.0) as f32).collect();
    let years: Vec<f32> = (0..n).map(|_| rng.uniform(0.25, 10.0) as f32).collect();
    let (dcall, dput) = (module.alloc(n * 4), module.alloc(n * 4));
    let (dspot, dstrike, dyears) = (
        module.upload(&spot),
        module.upload(&strike),
        module.upload(&years),
    );
    module.launch(
        "black_scholes",
        grid1(n.div_ceil(128)),
        block1(128),
        0,
        &[
            Arg::Ptr(dcall),
            Arg::Ptr(dput),
            Arg::Ptr(dspot),
            Arg::Ptr(dstrike),
            Arg::Ptr(dyears),
            Arg::F32(rate),
            Arg::F32(volatility),
            Arg::I32(n as i32),
        ],
    );
    let call: Vec<f32> = module.download(dcall, n);
    let put: Vec<f32> = module.download(dput, n);
    let (r, v) = (f64::from(rate), f64::from(volatility));
    for i in 0..n {
        let (s, x, t) = (
            f64::from(spot[i]),
            f64::from(strike[i]),
            f64::from(years[i]),
        );
        let d1 = ((s / x).ln() + (r + 0.5 * v * v) * t) / (v * t.sqrt());
        let d2 = d1 - v * t.sqrt();
        let discount = (-r * t).exp();
        let want_call = s * normal_cdf(d1) - x * discount * normal_cdf(d2);
        let want_put = x * discount * (1.0 - normal_cdf(d2)) - s * (1.0 - normal_cdf(d1));
        let bound = 1e-3 * s.max(1.0);
        assert!(
            (f64::from(call[i]) - want_call).abs() <= bound,
            "call[{i}] = {} expected {want_call}",
            call[i]
        );
        assert!(
            (f64::from(put[i]) - want_put).abs() <= bound,
            "put[{i}] = {} expected {want_put}",
            put[i]
        );
    }
}

#[test]
fn device_function() {
    let module = Module::load("device_function");
    let (n, block) = (100usize, 64usize);
    let input: Vec<i32> = (0..n as i32).map(|i| i * i - 50).collect();
    let din = module.upload(&input);
    let (dmixed, dfacts, dfibs) = (
        module.alloc(n * 4),
        module.alloc(n * 8),
        module.alloc(n * 4),
    );
    module.launch(
        "device_function",
        grid1(n.div_ceil(block)),
        block1(block),
        0,
        &[
            Arg::Ptr(din),
            Arg::Ptr(dmixed),
            Arg::Ptr(dfacts),
            Arg::Ptr(dfibs),
            Arg::I32(n as i32),
        ],
    );
    let mixed: Vec<i32> = module.download(dmixed, n);
    let facts: Vec<u64> = module.download(dfacts, n);
    let fibs: Vec<i32> = module.download(dfibs, n);
    for i in 0..n {
        let salt = (i / block + 1) as i32;
        let mut want_mix = input[i].wrapping_mul(31).wrapping_add(i as i32);
        want_mix ^= salt << 3;
        want_mix -= salt % 7;
        let want_fact: u64 = (1..=(i % 21) as u64).product();
        let (mut a, mut b) = (0i32, 1i32);
        for _ in 0..i % 16 {
            (a, b) = (b, a + b);
        }
        assert_eq!(mixed[i], want_mix, "mix[{i}]");
        assert_eq!(facts[i], want_fact, "factorial[{i}]");
        assert_eq!(fibs[i], a, "fib[{i}]");
    }
}

#[test]
fn dynamic_shared() {
    let module = Module::load("dynamic_shared");
    let block = 64;
    let n = block * 5;
    let input: Vec<i32> = (0..n as i32).map(|i| i * 3 - 1000).collect();
    let din = module.upload(&input);
    let (drev, dscaled) = (module.alloc(n * 4), module.alloc(n * 4));
    module.launch(
        "dynamic_shared",
        grid1(n / block),
        block1(block),
        block * 8,
        &[
            Arg::Ptr(din),
            Arg::Ptr(drev),
            Arg::Ptr(dscaled),
            Arg::I32(n as i32),
        ],
    );
    let reversed: Vec<i32> = module.download(drev, n);
    let scaled: Vec<f32> = module.download(dscaled, n);
    for i in 0..n {
        let src = (i / block) * block + (block - 1 - i % block);
        assert_eq!(reversed[i], input[src], "reversed[{i}]");
        assert_eq!(scaled[i], input[src] as f32 * 0.5, "scaled[{i}]");
    }
}

#[test]
fn printf_kernel() {
    let module = Module::load("printf_kernel");
    let report = module.launch(
        "printf_kernel",
        grid1(2),
        block1(64),
        0,
        &[Arg::I32(7), Arg::F32(1.25)],
    );
    let text = String::from_utf8(report.stdout).expect("printf output is UTF-8");
    let lines: BTreeSet<&str> = text.lines().collect();
    let want: BTreeSet<&str> = [
        "block 0: int=7 float=1.250 str=first char=A big=1099511627776",
        "block 1: int=17 float=2.500 str=second char=B big=2199023255552",
    ]
    .into_iter()
    .collect();
    assert_eq!(lines, want, "device printf output:\n{text}");
    assert_eq!(text.lines().count(), 2, "one line per printing thread");
}

#[test]
fn out_of_bounds_faults_then_memory_stays_usable() {
    let module = Module::load("out_of_bounds");
    let data = module.alloc(256 * 4);
    let report = module.try_launch(
        "out_of_bounds",
        grid1(1),
        block1(32),
        0,
        &[Arg::Ptr(data), Arg::U64(1 << 40)],
    );
    match &report.result {
        Err(fault @ Fault::IllegalAddress { .. }) => assert_eq!(fault.cu_code(), 700),
        other => panic!("expected an illegal-address fault, got {other:?}"),
    }
    // The same memory and module run the next launch normally.
    module.launch(
        "out_of_bounds",
        grid1(1),
        block1(32),
        0,
        &[Arg::Ptr(data), Arg::U64(0)],
    );
    let values: Vec<i32> = module.download(data, 32);
    assert_eq!(values, (0..32).collect::<Vec<i32>>());
    let other = module.upload(&[5i32, 6, 7]);
    assert_eq!(module.download::<i32>(other, 3), vec![5, 6, 7]);
}

#[test]
fn constant_and_device_globals() {
    let module = Module::load("constant_and_device_globals");
    let coefficients = [3i32, -1, 2, 0, -1, 0, 0, 1];
    let offsets = [100i32, -200, 300, -400];
    assert_eq!(
        module.download::<i32>(module.global("offsets"), 4),
        offsets,
        "initialised __device__ array"
    );
    module
        .mem
        .write(module.global("coefficients"), &to_bytes(&coefficients))
        .expect("write __constant__ table");
    module
        .mem
        .write(module.global("negative_count"), &[0u8; 4])
        .expect("zero __device__ counter");
    let n = 300;
    let x: Vec<i32> = (0..n as i32).map(|i| i % 9 - 4).collect();
    let (dx, dout) = (module.upload(&x), module.alloc(n * 4));
    module.launch(
        "polynomial",
        grid1(n.div_ceil(128)),
        block1(128),
        0,
        &[Arg::Ptr(dx), Arg::Ptr(dout), Arg::I32(n as i32)],
    );
    let out: Vec<i32> = module.download(dout, n);
    let mut negatives = 0u32;
    for i in 0..n {
        let mut value = 0i32;
        for &c in coefficients.iter().rev() {
            value = value.wrapping_mul(x[i]).wrapping_add(c);
        }
        value += offsets[i % 4];
        negatives += u32::from(value < 0);
        assert_eq!(out[i], value, "out[{i}]");
    }
    assert_eq!(
        module.download::<u32>(module.global("negative_count"), 1)[0],
        negatives
    );
}

#[test]
fn warp_vote() {
    let module = Module::load("warp_vote");
    const WORDS: usize = 9;
    let warps = 8;
    let n = warps * 32;
    let values: Vec<i32> = (0..n)
        .map(|i| match i / 32 {
            0 => (i % 32) as i32,
            1 => -((i % 5) as i32),
            2 => 5,
            3 => 1000 + (i % 3) as i32,
            _ => ((i as u32).wrapping_mul(2_654_435_761) % 23) as i32 - 11,
        })
        .collect();
    let (dvalues, dout) = (module.upload(&values), module.alloc(WORDS * n * 4));
    module.launch(
        "warp_vote",
        grid1(2),
        block1(128),
        0,
        &[Arg::Ptr(dvalues), Arg::Ptr(dout)],
    );
    let out: Vec<u32> = module.download(dout, WORDS * n);
    for w in 0..warps {
        let v = &values[w * 32..(w + 1) * 32];
        let mask = |pred: &dyn Fn(usize) -> bool| {
            (0..32)
                .filter(|&l| pred(l))
                .fold(0u32, |acc, l| acc | 1 << l)
        };
        let ballot = mask(&|l| v[l] > 0);
        let odd_ballot = mask(&|l| l % 2 == 1 && v[l] > 3);
        let parity = mask(&|l| v[l] & 1 != 0);
        let any7 = v.contains(&7);
        let all_nonneg = v.iter().all(|&x| x >= 0);
        let all_same = v.iter().all(|&x| x / 1000 == v[0] / 1000);
        for l in 0..32 {
            let matching = mask(&|m| v[m] % 4 == v[l] % 4);
            let want: [u32; WORDS] = [
                ballot,
                u32::from(any7),
                u32::from(all_nonneg),
                matching,
                if all_same { u32::MAX } else { 0 },
                u32::from(all_same),
                if l % 2 == 1 { odd_ballot } else { 0 },
                parity.count_ones(),
                u32::MAX,
            ];
            for (k, &expected) in want.iter().enumerate() {
                let mut got = out[WORDS * (w * 32 + l) + k];
                if matches!(k, 1 | 2 | 5) {
                    got = u32::from(got != 0);
                }
                assert_eq!(got, expected, "warp {w} lane {l} result {k}");
            }
        }
    }
}

#[test]
fn atomics_all() {
    let module = Module::load("atomics_all");
    let n = 1024usize;
    let mut rng = Rng(8);
    let values: Vec<i32> = (0..n).map(|_| rng.range_i32(-2048, 2047)).collect();

    // struct Results: 7 ints, 5 unsigned, 6 u64 (from offset 48), 2 floats, 1 double.
    let mut ints = [0i32, 0, 1 << 30, -(1 << 30), -1, 0, 0];
    let mut uints = [0u32, 10, u32::MAX, 0, 0];
    let mut u64s = [0u64, u64::MAX, 0, 1, 0, 0];
    let mut floats = [0f32, -1e30];
    let mut dadd = 0f64;
    let mut init = to_bytes(&ints);
    init.extend(to_bytes(&uints));
    init.extend(to_bytes(&u64s));
    init.extend(to_bytes(&floats));
    init.extend(to_bytes(&[dadd]));
    assert_eq!(init.len(), 112);
    let results = module.upload(&init);
    let dvalues = module.upload(&values);
    let dexch = module.alloc(n * 4);
    module.launch(
        "atomics_all",
        grid1(n / 256),
        block1(256),
        0,
        &[
            Arg::Ptr(results),
            Arg::Ptr(dvalues),
            Arg::Ptr(dexch),
            Arg::I32(n as i32),
        ],
    );
    let got: Vec<u8> = module.download(results, 112);
    let exch_old: Vec<i32> = module.download(dexch, n);

    for (i, &v) in values.iter().enumerate() {
        ints[0] = ints[0].wrapping_add(v);
        ints[1] = ints[1].wrapping_sub(v);
        ints[2] = ints[2].min(v);
        ints[3] = ints[3].max(v);
        uints[0] = if uints[0] >= 99 { 0 } else { uints[0] + 1 };
        uints[1] = if uints[1] == 0 || uints[1] > 50 {
            50
        } else {
            uints[1] - 1
        };
        uints[2] &= !(1u32 << (i % 31)) | if i & 1 == 1 { 0 } else { 0x8000_0000 };
        uints[3] |= 1u32 << (v & 15);
        uints[4] ^= (v as u32).wrapping_mul(2_654_435_761);
        let big = ((v + 1000) as u64) << 33;
        u64s[0] = u64s[0].wrapping_add(big);
        u64s[1] = u64s[1].min(big + i as u64);
        u64s[2] = u64s[2].max(big + i as u64);
        u64s[3] = u64s[3].wrapping_mul(2 * i as u64 + 1);
        u64s[4] |= 1u64 << (i % 64);
        u64s[5] ^= big ^ i as u64;
        floats[0] += v as f32;
        floats[1] = floats[1].max(v as f32 * 0.25);
        dadd += f64::from(v) * 0.5;
    }
    let got_ints: Vec<i32> = from_bytes(&got[0..28]);
    let got_uints: Vec<u32> = from_bytes(&got[28..48]);
    let got_u64s: Vec<u64> = from_bytes(&got[48..96]);
    let got_floats: Vec<f32> = from_bytes(&got[96..104]);
    let got_dadd: Vec<f64> = from_bytes(&got[104..112]);
    assert_eq!(got_ints[..4], ints[..4], "add, sub, min, max");
    assert_eq!(got_uints, uints, "inc, dec, and, or, xor");
    assert_eq!(got_u64s, u64s, "64-bit add, min, max, cas product, or, xor");
    assert_eq!(got_floats, floats, "float add, cas max");
    assert_eq!(got_dadd[0], dadd, "double add");
    // CAS: exactly one thread swapped 0 for its i + 1.
    assert_eq!(got_ints[6], 1, "one atomicCAS winner");
    assert!((1..=n as i32).contains(&got_ints[5]));
    // Exch: the old values and the final value are -1, 0, ..., n-1 once each.
    let mut seen: Vec<i32> = exch_old.clone();
    seen.push(got_ints[4]);
    seen.sort_unstable();
    assert_eq!(seen, (-1..n as i32).collect::<Vec<i32>>());
}

/// Rounds `x` to a half with a directed rounding mode: 'z' toward zero,
/// 'd' toward -inf, 'u' toward +inf.
fn f16_directed(x: f32, mode: char) -> u16 {
    let nearest = half::f16::from_f32(x);
    let value = nearest.to_f32();
    let bits = nearest.to_bits();
    // Neighbours of `bits` one step larger or smaller in magnitude.
    let away = bits + 1;
    let toward = bits - 1;
    let too_big = value > x;
    let too_small = value < x;
    match mode {
        'z' if value.abs() > x.abs() => toward,
        'd' if too_big => {
            if x >= 0.0 {
                toward
            } else {
                away
            }
        }
        'u' if too_small => {
            if x >= 0.0 {
                away
            } else {
                toward
            }
        }
        _ => bits,
    }
}

fn ulp_distance16(x: u16, y: u16) -> u32 {
    if (x ^ y) & 0x8000 != 0 {
        u32::from(x & 0x7fff) + u32::from(y & 0x7fff)
    } else {
        u32::from((x & 0x7fff).abs_diff(y & 0x7fff))
    }
}

#[test]
fn half_precision() {
    use half::{bf16, f16};
    let module = Module::load("half_precision");
    const RESULTS: usize = 18;
    let n = 2048;
    let mut rng = Rng(9);
    let mut a: Vec<f32> = (0..n).map(|_| rng.uniform(-8.0, 8.0) as f32).collect();
    let b: Vec<f32> = (0..n).map(|_| rng.uniform(-4.0, 4.0) as f32).collect();
    let c: Vec<f32> = (0..n).map(|_| rng.uniform(-16.0, 16.0) as f32).collect();
    a[0] = 65504.0;
    a[1] = 1e-6;
    a[2] = 70000.0;
    a[3] = -1e-9;
    let (da, db, dc) = (module.upload(&a), module.upload(&b), module.upload(&c));
    let (dout, dints) = (module.alloc(RESULTS * n * 2), module.alloc(2 * n * 4));
    module.launch(
        "half_precision",
        grid1(n / 128),
        block1(128),
        0,
        &[
            Arg::Ptr(da),
            Arg::Ptr(db),
            Arg::Ptr(dc),
            Arg::Ptr(dout),
            Arg::Ptr(dints),
            Arg::I32(n as i32),
        ],
    );
    let out: Vec<u16> = module.download(dout, RESULTS * n);
    let ints: Vec<i32> = module.download(dints, 2 * n);
    let h = |v: f64| f16::from_f64(v).to_bits();
    let bfb = |v: f32| bf16::from_f32(v).to_bits();
    for i in 0..n {
        let (ha, hb, hc) = (
            f16::from_f32(a[i]),
            f16::from_f32(b[i]),
            f16::from_f32(c[i]),
        );
        let (xa, xb, xc) = (ha.to_f64(), hb.to_f64(), hc.to_f64());
        let (ba, bb, bc) = (
            bf16::from_f32(a[i]),
            bf16::from_f32(b[i]),
            bf16::from_f32(c[i]),
        );
        let (fa, fb, fc) = (ba.to_f32(), bb.to_f32(), bc.to_f32());
        let want: [u16; RESULTS] = [
            ha.to_bits(),
            f16_directed(a[i], 'z'),
            f16_directed(a[i], 'd'),
            f16_directed(a[i], 'u'),
            h(xa + xb),
            h(xa - xb),
            h(xa * xb),
            h(xa.mul_add(xb, xc)),
            h(xa * xc),
            h(xb * xa),
            h(i as f64 - 1000.0),
            ba.to_bits(),
            (a[i].to_bits() >> 16) as u16,
            bfb(fa + fb),
            bfb(fa - fb),
            bfb(fa * fb),
            bfb(bf16::from_f32(fa * fb).to_f32() + fc),
            bfb(fa * 3.0),
        ];
        for (k, &expected) in want.iter().enumerate() {
            let got = out[RESULTS * i + k];
            let allowed = if k == 7 { 1 } else { 0 };
            assert!(
                ulp_distance16(got, expected) <= allowed,
                "element {i} (a={}) result {k}: got {got:#06x} expected {expected:#06x}",
                a[i]
            );
        }
        let scaled_half = f16::from_f64(xa * 100.0).to_f64();
        let want_h = if scaled_half.is_infinite() {
            if scaled_half > 0.0 {
                i32::MAX
            } else {
                i32::MIN
            }
        } else {
            scaled_half.trunc() as i32
        };
        let want_b = bf16::from_f32(fa * 100.0).to_f32().trunc() as i32;
        assert_eq!(ints[2 * i], want_h, "element {i}: half to int");
        assert_eq!(ints[2 * i + 1], want_b, "element {i}: bfloat16 to int");
    }
}

/// erf by its Maclaurin series, accurate to ~1e-10 for |x| <= 4 (enough to
/// judge a float result in ulps).
fn erf(x: f64) -> f64 {
    if x.abs() > 6.0 {
        return x.signum();
    }
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0f64;
    while term.abs() > 1e-17 * sum.abs().max(1e-300) {
        n += 1.0;
        term *= -x * x / n;
        sum += term / (2.0 * n + 1.0);
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

fn ulp_of(v: f64) -> f64 {
    let a = v.abs();
    if a < f64::from(f32::MIN_POSITIVE) {
        return 2f64.powi(-149);
    }
    2f64.powi(a.log2().floor() as i32 - 23)
}

#[test]
fn math_funcs() {
    let module = Module::load("math_funcs");
    const FUNCS: usize = 20;
    let n = 2048;
    let mut rng = Rng(10);
    let pi = std::f64::consts::PI;
    let mut x: Vec<f32> = (0..n).map(|_| rng.uniform(-100.0, 100.0) as f32).collect();
    let mut p: Vec<f32> = (0..n)
        .map(|_| 10f64.powf(rng.uniform(-30.0, 30.0)) as f32)
        .collect();
    let t: Vec<f32> = (0..n).map(|_| rng.uniform(-pi, pi) as f32).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.uniform(-80.0, 80.0) as f32).collect();
    let q: Vec<f32> = (0..n).map(|_| rng.uniform(0.1, 10.0) as f32).collect();
    x[..6].copy_from_slice(&[1e5, -3.0e7, 1e20, 1e38, 0.0, -0.0]);
    p[..4].copy_from_slice(&[1.0, 2.0, 0.5, 1e-38]);
    let inputs = [&x, &p, &t, &y, &q].map(|values| module.upload(values));
    let dout = module.alloc(FUNCS * n * 4);
    module.launch(
        "math_funcs",
        grid1(n / 128),
        block1(128),
        0,
        &[
            Arg::Bytes(to_bytes(&inputs)),
            Arg::Ptr(dout),
            Arg::I32(n as i32),
        ],
    );
    let out: Vec<f32> = module.download(dout, FUNCS * n);
    let names = [
        "sinf",
        "cosf",
        "tanf",
        "expf",
        "exp2f",
        "logf",
        "log2f",
        "log10f",
        "powf",
        "sqrtf",
        "rsqrtf",
        "tanhf",
        "atan2f",
        "erff",
        "cbrtf",
        "__sinf",
        "__cosf",
        "__expf",
        "__logf",
        "__fdividef",
    ];
    // Documented maximum errors in ulps; 0 means correctly rounded.
    let max_ulps = [
        2.0, 2.0, 4.0, 2.0, 2.0, 1.0, 1.0, 2.0, 4.0, 0.0, 2.0, 2.0, 3.0, 2.0, 1.0, 0.0, 0.0, 0.0,
        3.0, 2.0,
    ];
    for i in 0..n {
        let (dx, dp, dt, dy, dq) = (
            f64::from(x[i]),
            f64::from(p[i]),
            f64::from(t[i]),
            f64::from(y[i]),
            f64::from(q[i]),
        );
        let y16 = f64::from(y[i] / 16.0);
        let y10 = f64::from(y[i] / 10.0);
        let y20 = f64::from(y[i] / 20.0);
        let y8 = f64::from(y[i] / 8.0);
        let t45 = f64::from(t[i] * 0.45);
        let reference = [
            dx.sin(),
            dx.cos(),
            t45.tan(),
            dy.exp(),
            dy.exp2(),
            dp.ln(),
            dp.log2(),
            dp.log10(),
            dq.powf(y16),
            dp.sqrt(),
            1.0 / dp.sqrt(),
            y10.tanh(),
            dt.atan2(dy),
            erf(y20),
            dx.cbrt(),
            dt.sin(),
            dt.cos(),
            y8.exp(),
            dp.ln(),
            dt / dq,
        ];
        for k in 0..FUNCS {
            let got = f64::from(out[FUNCS * i + k]);
            let want = reference[k];
            let err = (got - want).abs();
            let ok = match k {
                15 => err <= 2f64.powf(-21.41),
                16 => err <= 2f64.powf(-21.19),
                // 2 + floor(|1.173 x|) documented; an H100 measured 2.1 near -0.72.
                17 => err / ulp_of(want) <= 3.0 + (1.173 * y8).abs().floor(),
                18 if (0.5..=2.0).contains(&dp) => err <= 2f64.powf(-21.41),
                _ if max_ulps[k] == 0.0 => err / ulp_of(want) <= 0.5,
                _ => err / ulp_of(want) <= max_ulps[k],
            };
            assert!(
                ok,
                "{} at element {i}: got {got:e} expected {want:e} ({:.2} ulp)",
                names[k],
                err / ulp_of(want)
            );
        }
    }
}

#[test]
fn grid_3d() {
    let module = Module::load("grid_3d");
    const WORDS: usize = 7;
    let (grid, block) = ([3u32, 4, 5], [8u32, 4, 2]);
    let (width, height, depth) = (grid[0] * block[0], grid[1] * block[1], grid[2] * block[2]);
    let cells = (width * height * depth) as usize;
    let dcells = module.alloc(cells * WORDS * 4);
    module.launch("grid_3d", grid, block, 0, &[Arg::Ptr(dcells)]);
    let out: Vec<u32> = module.download(dcells, cells * WORDS);
    let pack = |v: [u32; 3]| v[0] | v[1] << 8 | v[2] << 16;
    for z in 0..depth {
        for y in 0..height {
            for x in 0..width {
                let index = ((z * height + y) * width + x) as usize;
                let cell = &out[index * WORDS..(index + 1) * WORDS];
                let b = [x / block[0], y / block[1], z / block[2]];
                let t = [x % block[0], y % block[1], z % block[2]];
                let rank = t[0] + block[0] * (t[1] + block[1] * t[2]);
                let want = [
                    pack(b),
                    pack(t),
                    pack(grid),
                    pack(block),
                    rank,
                    rank % 32,
                    1,
                ];
                assert_eq!(cell, want, "cell ({x},{y},{z})");
            }
        }
    }
}

#[test]
fn every_corpus_program_runs_here() {
    let this_file = include_str!("corpus.rs");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(cumux_testkit::corpus_dir()).expect("corpus folder") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_some_and(|ext| ext == "cu") {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            if !this_file.contains(&format!("Module::load(\"{stem}\")")) {
                missing.push(stem);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "corpus programs without an interpreter test: {missing:?}"
    );
}
