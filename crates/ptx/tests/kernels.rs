//! End-to-end tests of the interpreter on nvcc-generated PTX fixtures.

mod common;

use common::{config, linear, Device};
use cumux_ptx::*;

const BASIC: &str = include_str!("fixtures/basic.ptx");

/// `fixtures/basic.ptx` on its own device memory.
fn basic() -> Device {
    Device::load("basic.ptx", BASIC, 1 << 30)
}

#[test]
fn vector_add_and_saxpy() {
    let dev = basic();
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    let (da, db, dc) = (dev.upload(&a), dev.upload(&b), dev.alloc(4000));
    dev.launch("vec_add", linear(4, 256), &[&da, &db, &dc, &(n as i32)]);
    let c: Vec<f32> = dev.download(dc, n);
    for (i, v) in c.iter().enumerate() {
        assert_eq!(*v, 3.0 * i as f32);
    }
    dev.launch("saxpy", linear(8, 128), &[&(n as i32), &2.5f32, &da, &dc]);
    let c: Vec<f32> = dev.download(dc, n);
    for (i, v) in c.iter().enumerate() {
        assert_eq!(*v, 2.5 * i as f32 + 3.0 * i as f32);
    }
}

#[test]
fn shared_memory_matmul() {
    let dev = basic();
    let n = 40usize;
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 - 2.0).collect();
    let (da, db, dc) = (dev.upload(&a), dev.upload(&b), dev.alloc(n * n * 4));
    let g = n.div_ceil(16) as u32;
    let cfg = config([g, g, 1], [16, 16, 1], 0);
    dev.launch("matmul", cfg, &[&da, &db, &dc, &(n as i32)]);
    let c: Vec<f32> = dev.download(dc, n * n);
    for i in 0..n {
        for j in 0..n {
            let want: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
            assert_eq!(c[i * n + j], want, "at {i},{j}");
        }
    }
}

#[test]
fn shuffle_reduction_with_atomics_across_parallel_blocks() {
    let dev = basic();
    let n = 100_000usize;
    let v: Vec<f32> = (0..n).map(|i| (i % 3) as f32).collect();
    let din = dev.upload(&v);
    let dout = dev.alloc(4);
    let cfg = config([64, 1, 1], [256, 1, 1], 32);
    dev.launch("reduce_sum", cfg, &[&din, &dout, &(n as i32)]);
    let got = dev.download::<f32>(dout, 1)[0];
    let want: f32 = v.iter().sum();
    assert_eq!(got, want);
}

#[test]
fn histogram_shared_and_global_atomics() {
    let dev = basic();
    let n = 50_000usize;
    let v: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2654435761) >> 7)
        .collect();
    let din = dev.upload(&v);
    let dbins = dev.alloc(64 * 4);
    dev.launch(
        "histogram",
        linear(16, 128),
        &[&din, &dbins, &(n as i32), &37i32],
    );
    let bins: Vec<u32> = dev.download(dbins, 37);
    let mut want = [0u32; 37];
    for x in &v {
        want[(*x % 37) as usize] += 1;
    }
    assert_eq!(bins, want.to_vec());
}

#[test]
fn printf_output() {
    let dev = basic();
    let r = dev.launch("hello", linear(2, 2), &[&7i32, &1.25f64]);
    let s = String::from_utf8(r.stdout).unwrap();
    assert_eq!(
        s,
        "block 0 thread 0 x=7 d=1.250 s=ok\nblock 0 thread 1 x=7 d=1.250 s=ok\n\
         block 1 thread 0 x=7 d=1.250 s=ok\nblock 1 thread 1 x=7 d=1.250 s=ok\n"
    );
}

#[test]
fn recursion() {
    let dev = basic();
    let out = dev.alloc(64);
    dev.launch("fib_kernel", linear(1, 12), &[&out]);
    let got: Vec<u32> = dev.download(out, 12);
    assert_eq!(got, vec![0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89]);
}

#[test]
fn faults_and_recovery() {
    let dev = basic();
    let buf = dev.alloc(64);
    let run = |ptr: u64, mode: i32, threads: usize| {
        dev.try_launch("faulty", linear(1, threads), &[&ptr, &mode])
            .result
    };
    run(buf, 0, 16).unwrap();
    // out of range
    let e = run(buf, 0, 32 + 2048).unwrap_err();
    assert_eq!(e.cu_code(), 1, "{e}"); // too many threads per block: config error
    let e = run(buf + 32, 0, 64).unwrap_err();
    assert_eq!(e.cu_code(), 700, "{e}");
    let e = run(buf, 1, 1).unwrap_err();
    assert_eq!(e.cu_code(), 716, "{e}");
    let e = run(buf, 2, 1).unwrap_err();
    assert_eq!(e.cu_code(), 719, "{e}");
    let e = run(buf, 3, 1).unwrap_err();
    assert_eq!(e.cu_code(), 700, "{e}");
    run(buf, 0, 16).unwrap();
    // unknown kernel and short params
    let (p, mem) = (&dev.program, &dev.mem);
    let r = p.launch(mem, "nope", &linear(1, 1), &[]);
    assert_eq!(r.result.unwrap_err().cu_code(), 500);
    let r = p.launch(mem, "faulty", &linear(1, 1), &[0; 4]);
    assert_eq!(r.result.unwrap_err().cu_code(), 1);
}

#[test]
fn warp_synchronous_legacy_reduction_runs_in_lockstep() {
    let dev = Device::load("legacy.ptx", include_str!("fixtures/legacy.ptx"), 1 << 28);
    if dev.program.engine() == Engine::Compiler {
        // compiled, its warps stepped at each volatile shared access
        dev.program
            .compiled("legacy_reduce")
            .expect("the compiler takes volatile shared accesses");
    }
    let blocks = 8usize;
    let v: Vec<i32> = (0..256 * blocks as i32)
        .map(|i| (i * 7919) % 1000)
        .collect();
    let din = dev.upload(&v);
    let dout = dev.alloc(blocks * 4);
    dev.launch("legacy_reduce", linear(blocks, 256), &[&din, &dout]);
    let got: Vec<u32> = dev.download(dout, blocks);
    for b in 0..blocks {
        let want: i32 = v[b * 256..(b + 1) * 256].iter().sum();
        assert_eq!(got[b] as i32, want, "block {b}");
    }
}

/// A `.func` with volatile accesses is inlined and compiled with the
/// kernels that reach it, as are the module's other kernels (CUB's modules
/// hold such a helper beside all their kernels).
const VOLATILE_HELPER: &str = r#"
.version 7.5
.target sm_75
.address_size 64

.func (.param .b32 ret0) vload(.param .b64 p0)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [p0];
    ld.volatile.global.u32 %r1, [%rd1];
    st.param.b32 [ret0], %r1;
    ret;
}

.func (.param .b32 ret0) twice(.param .b64 p0)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<3>;
    ld.param.u64 %rd1, [p0];
    {
    .param .b64 param0;
    st.param.b64 [param0], %rd1;
    .param .b32 retval0;
    call.uni (retval0), vload, (param0);
    ld.param.b32 %r1, [retval0];
    }
    add.u32 %r2, %r1, %r1;
    st.param.b32 [ret0], %r2;
    ret;
}

.visible .entry through_two(.param .u64 out)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<3>;
    ld.param.u64 %rd1, [out];
    {
    .param .b64 param0;
    st.param.b64 [param0], %rd1;
    .param .b32 retval0;
    call.uni (retval0), twice, (param0);
    ld.param.b32 %r1, [retval0];
    }
    st.global.u32 [%rd1], %r1;
    ret;
}

.visible .entry plain(.param .u64 out)
{
    .reg .b64 %rd<3>;
    .reg .b32 %r<3>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd2, %rd1, %rd2;
    add.u32 %r2, %r1, 7;
    st.global.u32 [%rd2], %r2;
    ret;
}
"#;

#[test]
fn kernels_reaching_a_volatile_helper_are_compiled() {
    let dev = Device::load("volatile_helper", VOLATILE_HELPER, 1 << 24);
    if dev.program.engine() == Engine::Interpreter {
        return; // CUMUX_PTX_ENGINE chose the interpreter for everything
    }
    dev.program
        .compiled("plain")
        .expect("plain reaches no volatile access");
    dev.program
        .compiled("through_two")
        .expect("a volatile global load through two calls compiles");
    // Both give their results, whichever engine runs them.
    let out = dev.alloc(64 * 4);
    dev.launch("plain", linear(1, 64), &[&out]);
    let got: Vec<u32> = dev.download(out, 64);
    assert_eq!(got, (7..71).collect::<Vec<u32>>());
    let one = dev.upload(&[21u32]);
    dev.launch("through_two", linear(1, 1), &[&one]);
    let got: Vec<u32> = dev.download(one, 1);
    assert_eq!(got, [42]);
}

/// Hand-written PTX for forms nvcc rarely emits.
const HANDWRITTEN: &str = include_str!("fixtures/handwritten.ptx");

#[test]
fn handwritten_forms() {
    let dev = Device::load("handwritten", HANDWRITTEN, 1 << 24);
    assert_eq!(dev.program.kernels()[0].static_shared_bytes, 16);
    let out = dev.alloc(128);
    dev.launch("hand", config([1, 1, 1], [40, 1, 1], 100), &[&out]);
    let w: Vec<u32> = dev.download(out, 18);
    let forms = [
        (100, "dynamic_smem_size"),
        (16, "dynamic shared follows static"),
        (1, "isspacep"),
        (0xffff_fff0, "bfe.s32"),
        (0x1234_5f78, "bfi"),
        (23, "bfind"),
        (1, "cnot"),
        (9, "slct"),
        (0xffff_ffff, "set"),
        (1, "testp"),
        (3, "mul24 keeps 24 bits"),
        (107, "sad"),
    ];
    for (k, (want, form)) in forms.into_iter().enumerate() {
        assert_eq!(w[k], want, "{form}");
    }
    assert_eq!((w[12], w[13]), (0, 0x8000_0000), "brev.b64");
    assert_eq!(w[14], 55, "clz.b64");
    assert_eq!((w[16], w[17]), (0x1122_3344, 0x5566_7788), "mov unpack");
}

#[test]
fn instruction_budget_stops_endless_loops() {
    let src = ".version 9.0\n.target sm_75\n.address_size 64\n.visible .entry spin()\n{\n .reg .b32 %r<3>;\n$L_top:\n mov.u32 %r1, %tid.x;\n mov.u32 %r2, %clock;\n bra.uni $L_top;\n}\n";
    let mem = DeviceMemory::new(1 << 20);
    let p = Program::load(src, &mem).unwrap();
    let r = p.launch_limited(&mem, "spin", &linear(3, 64), &[], 100_000);
    let e = r.result.unwrap_err();
    assert_eq!(e.cu_code(), 702, "{e}");
    assert!(e.to_string().contains("instruction limit"), "{e}");
    assert!(r.instructions >= 100_000);
}

#[test]
fn prmt_modes_and_relu() {
    let src = include_str!("fixtures/prmt_relu.ptx");
    let dev = Device::load("prmt", src, 1 << 20);
    let out = dev.alloc(32);
    dev.launch("k", linear(1, 1), &[&out]);
    let w: Vec<u32> = dev.download(out, 7);
    assert_eq!(
        w[..6],
        [
            0x4433_2211,
            0x5566_7700,
            0x2222_2222,
            0x3322_1111,
            0x2222_1100,
            0x3322_3322
        ]
    );
    assert_eq!(w[6], 0x4000_0000, "relu(-2) = 0, relu(2) = 2 (f16 0x4000)");
}
