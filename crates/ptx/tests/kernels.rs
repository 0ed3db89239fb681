//! End-to-end tests of the interpreter on nvcc-generated PTX fixtures.

mod common;

use common::{download, find_kernel as kernel, le_bytes, pack_params as pack, words};
use cumux_ptx::*;

const BASIC: &str = include_str!("fixtures/basic.ptx");

fn f32s(v: &[f32]) -> Vec<u8> {
    le_bytes(v, f32::to_le_bytes)
}

fn read_f32(mem: &DeviceMemory, p: u64, n: usize) -> Vec<f32> {
    words(&download(mem, p, n * 4), f32::from_le_bytes)
}

fn read_u32(mem: &DeviceMemory, p: u64, n: usize) -> Vec<u32> {
    words(&download(mem, p, n * 4), u32::from_le_bytes)
}

fn cfg(grid: [u32; 3], block: [u32; 3], dyn_shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid,
        block,
        dynamic_shared_bytes: dyn_shared,
    }
}

#[test]
fn vector_add_and_saxpy() {
    let mem = DeviceMemory::new(1 << 30);
    let p = Program::load(BASIC, &mem).unwrap();
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    let (da, db, dc) = (
        mem.alloc(4000).unwrap(),
        mem.alloc(4000).unwrap(),
        mem.alloc(4000).unwrap(),
    );
    mem.write(da, &f32s(&a)).unwrap();
    mem.write(db, &f32s(&b)).unwrap();
    let k = kernel(&p, "vec_add");
    let params = pack(
        k,
        &[
            &da.to_le_bytes(),
            &db.to_le_bytes(),
            &dc.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    let r = p.launch(&mem, "vec_add", &cfg([4, 1, 1], [256, 1, 1], 0), &params);
    r.result.unwrap();
    let c = read_f32(&mem, dc, n);
    for (i, v) in c.iter().enumerate() {
        assert_eq!(*v, 3.0 * i as f32);
    }
    let k = kernel(&p, "saxpy");
    let params = pack(
        k,
        &[
            &(n as i32).to_le_bytes(),
            &2.5f32.to_le_bytes(),
            &da.to_le_bytes(),
            &dc.to_le_bytes(),
        ],
    );
    p.launch(&mem, "saxpy", &cfg([8, 1, 1], [128, 1, 1], 0), &params)
        .result
        .unwrap();
    let c = read_f32(&mem, dc, n);
    for (i, v) in c.iter().enumerate() {
        assert_eq!(*v, 2.5 * i as f32 + 3.0 * i as f32);
    }
}

#[test]
fn shared_memory_matmul() {
    let mem = DeviceMemory::new(1 << 30);
    let p = Program::load(BASIC, &mem).unwrap();
    let n = 40usize;
    let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32).collect();
    let b: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32 - 2.0).collect();
    let bytes = (n * n * 4) as u64;
    let (da, db, dc) = (
        mem.alloc(bytes).unwrap(),
        mem.alloc(bytes).unwrap(),
        mem.alloc(bytes).unwrap(),
    );
    mem.write(da, &f32s(&a)).unwrap();
    mem.write(db, &f32s(&b)).unwrap();
    let k = kernel(&p, "matmul");
    let params = pack(
        k,
        &[
            &da.to_le_bytes(),
            &db.to_le_bytes(),
            &dc.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    let g = n.div_ceil(16) as u32;
    p.launch(&mem, "matmul", &cfg([g, g, 1], [16, 16, 1], 0), &params)
        .result
        .unwrap();
    let c = read_f32(&mem, dc, n * n);
    for i in 0..n {
        for j in 0..n {
            let want: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
            assert_eq!(c[i * n + j], want, "at {i},{j}");
        }
    }
}

#[test]
fn shuffle_reduction_with_atomics_across_parallel_blocks() {
    let mem = DeviceMemory::new(1 << 30);
    let p = Program::load(BASIC, &mem).unwrap();
    let n = 100_000usize;
    let v: Vec<f32> = (0..n).map(|i| (i % 3) as f32).collect();
    let din = mem.alloc((n * 4) as u64).unwrap();
    let dout = mem.alloc(4).unwrap();
    mem.write(din, &f32s(&v)).unwrap();
    let k = kernel(&p, "reduce_sum");
    let params = pack(
        k,
        &[
            &din.to_le_bytes(),
            &dout.to_le_bytes(),
            &(n as i32).to_le_bytes(),
        ],
    );
    let r = p.launch(
        &mem,
        "reduce_sum",
        &cfg([64, 1, 1], [256, 1, 1], 32),
        &params,
    );
    r.result.unwrap();
    let got = read_f32(&mem, dout, 1)[0];
    let want: f32 = v.iter().sum();
    assert_eq!(got, want);
}

#[test]
fn histogram_shared_and_global_atomics() {
    let mem = DeviceMemory::new(1 << 30);
    let p = Program::load(BASIC, &mem).unwrap();
    let n = 50_000usize;
    let v: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2654435761) >> 7)
        .collect();
    let din = mem.alloc((n * 4) as u64).unwrap();
    let dbins = mem.alloc(64 * 4).unwrap();
    mem.write(
        din,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    )
    .unwrap();
    let k = kernel(&p, "histogram");
    let params = pack(
        k,
        &[
            &din.to_le_bytes(),
            &dbins.to_le_bytes(),
            &(n as i32).to_le_bytes(),
            &37i32.to_le_bytes(),
        ],
    );
    p.launch(&mem, "histogram", &cfg([16, 1, 1], [128, 1, 1], 0), &params)
        .result
        .unwrap();
    let bins = read_u32(&mem, dbins, 37);
    let mut want = [0u32; 37];
    for x in &v {
        want[(*x % 37) as usize] += 1;
    }
    assert_eq!(bins, want.to_vec());
}

#[test]
fn printf_output() {
    let mem = DeviceMemory::new(1 << 30);
    let p = Program::load(BASIC, &mem).unwrap();
    let k = kernel(&p, "hello");
    let params = pack(k, &[&7i32.to_le_bytes(), &1.25f64.to_le_bytes()]);
    let r = p.launch(&mem, "hello", &cfg([2, 1, 1], [2, 1, 1], 0), &params);
    r.result.unwrap();
    let s = String::from_utf8(r.stdout).unwrap();
    assert_eq!(
        s,
        "block 0 thread 0 x=7 d=1.250 s=ok\nblock 0 thread 1 x=7 d=1.250 s=ok\n\
         block 1 thread 0 x=7 d=1.250 s=ok\nblock 1 thread 1 x=7 d=1.250 s=ok\n"
    );
}

#[test]
fn recursion() {
    let mem = DeviceMemory::new(1 << 30);
    let p = Program::load(BASIC, &mem).unwrap();
    let out = mem.alloc(64).unwrap();
    let k = kernel(&p, "fib_kernel");
    let params = pack(k, &[&out.to_le_bytes()]);
    p.launch(&mem, "fib_kernel", &cfg([1, 1, 1], [12, 1, 1], 0), &params)
        .result
        .unwrap();
    let got = read_u32(&mem, out, 12);
    assert_eq!(got, vec![0, 1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89]);
}

#[test]
fn faults_and_recovery() {
    let mem = DeviceMemory::new(1 << 30);
    let p = Program::load(BASIC, &mem).unwrap();
    let buf = mem.alloc(64).unwrap();
    let k = kernel(&p, "faulty");
    let run = |ptr: u64, mode: i32, threads: u32| {
        let params = pack(k, &[&ptr.to_le_bytes(), &mode.to_le_bytes()]);
        p.launch(&mem, "faulty", &cfg([1, 1, 1], [threads, 1, 1], 0), &params)
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
    let r = p.launch(&mem, "nope", &cfg([1, 1, 1], [1, 1, 1], 0), &[]);
    assert_eq!(r.result.unwrap_err().cu_code(), 500);
    let r = p.launch(&mem, "faulty", &cfg([1, 1, 1], [1, 1, 1], 0), &[0; 4]);
    assert_eq!(r.result.unwrap_err().cu_code(), 1);
}

#[test]
fn warp_synchronous_legacy_reduction_runs_in_lockstep() {
    let mem = DeviceMemory::new(1 << 28);
    let p = Program::load(include_str!("fixtures/legacy.ptx"), &mem).unwrap();
    let blocks = 8usize;
    let v: Vec<i32> = (0..256 * blocks as i32)
        .map(|i| (i * 7919) % 1000)
        .collect();
    let din = mem.alloc((v.len() * 4) as u64).unwrap();
    mem.write(
        din,
        &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
    )
    .unwrap();
    let dout = mem.alloc((blocks * 4) as u64).unwrap();
    let k = kernel(&p, "legacy_reduce");
    let params = pack(k, &[&din.to_le_bytes(), &dout.to_le_bytes()]);
    p.launch(
        &mem,
        "legacy_reduce",
        &cfg([blocks as u32, 1, 1], [256, 1, 1], 0),
        &params,
    )
    .result
    .unwrap();
    let got = read_u32(&mem, dout, blocks);
    for b in 0..blocks {
        let want: i32 = v[b * 256..(b + 1) * 256].iter().sum();
        assert_eq!(got[b] as i32, want, "block {b}");
    }
}

/// Hand-written PTX for forms nvcc rarely emits.
const HANDWRITTEN: &str = r#"
.version 8.5
.target sm_75
.address_size 64

.visible .entry hand(.param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<4>;
    .extern .shared .align 16 .b8 dyn[];
    .shared .align 4 .b32 stat[4];

    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 exit;
    mov.u32 %r2, %dynamic_smem_size;
    st.global.u32 [%rd1], %r2;
    mov.u32 %r3, dyn;
    mov.u32 %r4, stat;
    sub.u32 %r5, %r3, %r4;
    st.global.u32 [%rd1+4], %r5;
    mov.u64 %rd2, dyn;
    cvta.shared.u64 %rd3, %rd2;
    isspacep.shared %p2, %rd3;
    selp.u32 %r6, 1, 0, %p2;
    isspacep.global %p3, %rd3;
    selp.u32 %r7, 2, 0, %p3;
    or.b32 %r6, %r6, %r7;
    st.global.u32 [%rd1+8], %r6;
    bfe.s32 %r8, -256, 4, 8;
    st.global.u32 [%rd1+12], %r8;
    bfi.b32 %r9, 0xff, 0x12345678, 8, 4;
    st.global.u32 [%rd1+16], %r9;
    bfind.u32 %r10, 0x00f00000;
    st.global.u32 [%rd1+20], %r10;
    cnot.b32 %r11, 0;
    st.global.u32 [%rd1+24], %r11;
    mov.f32 %f1, 0fBF800000;
    slct.s32.f32 %r12, 7, 9, %f1;
    st.global.u32 [%rd1+28], %r12;
    set.lt.u32.s32 %r13, -1, 1;
    st.global.u32 [%rd1+32], %r13;
    testp.infinite.f32 %p2, 0f7F800000;
    selp.u32 %r14, 1, 0, %p2;
    st.global.u32 [%rd1+36], %r14;
    mul24.lo.s32 %r15, 0x1000001, 3;
    st.global.u32 [%rd1+40], %r15;
    sad.u32 %r16, 3, 10, 100;
    st.global.u32 [%rd1+44], %r16;
    brev.b64 %rd4, 1;
    st.global.u64 [%rd1+48], %rd4;
    clz.b64 %r17, 0x100;
    st.global.u32 [%rd1+56], %r17;
    mov.b64 {%r18, %r19}, 0x1122334455667788;
    st.global.v2.u32 [%rd1+64], {%r19, %r18};
    exit;
}
"#;

#[test]
fn handwritten_forms() {
    let mem = DeviceMemory::new(1 << 24);
    let p = Program::load(HANDWRITTEN, &mem).unwrap();
    assert_eq!(p.kernels()[0].static_shared_bytes, 16);
    let out = mem.alloc(128).unwrap();
    let r = p.launch(
        &mem,
        "hand",
        &cfg([1, 1, 1], [40, 1, 1], 100),
        &out.to_le_bytes(),
    );
    r.result.unwrap();
    let w = read_u32(&mem, out, 18);
    assert_eq!(w[0], 100, "dynamic_smem_size");
    assert_eq!(w[1], 16, "dynamic shared follows static");
    assert_eq!(w[2], 1, "isspacep");
    assert_eq!(w[3], 0xffff_fff0, "bfe.s32");
    assert_eq!(w[4], 0x1234_5f78, "bfi");
    assert_eq!(w[5], 23, "bfind");
    assert_eq!(w[6], 1, "cnot");
    assert_eq!(w[7], 9, "slct");
    assert_eq!(w[8], 0xffff_ffff, "set");
    assert_eq!(w[9], 1, "testp");
    assert_eq!(w[10], 3, "mul24 keeps 24 bits");
    assert_eq!(w[11], 107, "sad");
    assert_eq!((w[12], w[13]), (0, 0x8000_0000), "brev.b64");
    assert_eq!(w[14], 55, "clz.b64");
    assert_eq!((w[16], w[17]), (0x1122_3344, 0x5566_7788), "mov unpack");
}

#[test]
fn instruction_budget_stops_endless_loops() {
    let src = ".version 9.0\n.target sm_75\n.address_size 64\n.visible .entry spin()\n{\n .reg .b32 %r<3>;\n$L_top:\n mov.u32 %r1, %tid.x;\n mov.u32 %r2, %clock;\n bra.uni $L_top;\n}\n";
    let mem = DeviceMemory::new(1 << 20);
    let p = Program::load(src, &mem).unwrap();
    let r = p.launch_limited(&mem, "spin", &cfg([3, 1, 1], [64, 1, 1], 0), &[], 100_000);
    let e = r.result.unwrap_err();
    assert_eq!(e.cu_code(), 702, "{e}");
    assert!(e.to_string().contains("instruction limit"), "{e}");
    assert!(r.instructions >= 100_000);
}

#[test]
fn prmt_modes_and_relu() {
    let src = r#"
.version 9.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 out)
{
    .reg .b32 %r<12>;
    .reg .b16 %rs<4>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, 0x33221100;
    mov.u32 %r2, 0x77665544;
    prmt.b32.f4e %r3, %r1, %r2, 1;
    prmt.b32.b4e %r4, %r1, %r2, 0;
    prmt.b32.rc8 %r5, %r1, %r2, 2;
    prmt.b32.ecl %r6, %r1, %r2, 1;
    prmt.b32.ecr %r7, %r1, %r2, 2;
    prmt.b32.rc16 %r8, %r1, %r2, 1;
    st.global.v4.u32 [%rd1], {%r3, %r4, %r5, %r6};
    st.global.v2.u32 [%rd1+16], {%r7, %r8};
    mov.f32 %f1, 0fC0000000;
    cvt.rn.relu.f16.f32 %rs1, %f1;
    mov.f32 %f1, 0f40000000;
    cvt.rn.relu.f16.f32 %rs2, %f1;
    mov.b32 %r9, {%rs1, %rs2};
    st.global.u32 [%rd1+24], %r9;
    ret;
}
"#;
    let mem = DeviceMemory::new(1 << 20);
    let p = Program::load(src, &mem).unwrap();
    let out = mem.alloc(32).unwrap();
    p.launch(&mem, "k", &cfg([1, 1, 1], [1, 1, 1], 0), &out.to_le_bytes())
        .result
        .unwrap();
    let w = read_u32(&mem, out, 7);
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
