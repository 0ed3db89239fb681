//! Carry arithmetic, indirect calls, cp.async, generic pointers into local and
//! shared memory, named barriers with counts, 64-bit and f16x2 atomics,
//! mbarrier phases, and the refusal of device-side launches.

mod common;

use common::{linear, Device, Scalar};

/// `fixtures/misc.ptx` on a device memory of `memory_bytes`.
fn misc(memory_bytes: u64) -> Device {
    Device::load("misc.ptx", include_str!("fixtures/misc.ptx"), memory_bytes)
}

#[test]
fn misc_features() {
    let dev = misc(1 << 28);
    let n = 128usize;
    let a: Vec<u64> = (0..2 * n as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i << 60))
        .collect();
    let da = dev.upload(&a);
    let dout = dev.alloc(1024 * 8);
    let diout = dev.alloc(4096 * 4);
    for sel in [0i32, 1] {
        dev.mem.fill(dout, &[0], 1024 * 8).unwrap();
        dev.mem.fill(diout, &[0], 4096 * 4).unwrap();
        dev.launch("misc", linear(1, n), &[&da, &dout, &diout, &sel]);
        let out: Vec<u64> = dev.download(dout, 1024);
        let iout: Vec<i32> = dev.download(diout, 4096);
        for t in 0..n {
            let (a0, a1) = (a[2 * t], a[2 * t + 1]);
            let x = ((a0 as u128) << 64) | a1 as u128;
            let y = ((a1 as u128) << 64) | a0 as u128;
            let z = x.wrapping_add(y);
            let w = a0 as u128 * a1 as u128;
            assert_eq!(out[4 * t], (z >> 64) as u64, "t{t} carry hi");
            assert_eq!(out[4 * t + 1], z as u64, "t{t} carry lo");
            assert_eq!(out[4 * t + 2], (w >> 64) as u64, "t{t} mul hi");
            assert_eq!(out[4 * t + 3], w as u64, "t{t} mul lo");
            let ti = t as i32;
            let want = if (ti + sel) & 1 == 0 { ti + 3 } else { ti * 3 };
            assert_eq!(iout[8 * t], want, "t{t} indirect call");
            assert_eq!(
                iout[8 * t + 1],
                4 * ti + 6 + 12,
                "t{t} generic local+shared"
            );
            assert_eq!(iout[8 * t + 2], iout[0], "t{t} cp.async");
            assert_eq!(iout[8 * t + 3], 3, "t{t} clocks");
            if t < 64 {
                assert_eq!(iout[8 * t + 4], 2 * ((ti + 32) % 64), "t{t} named barrier");
            }
            assert_eq!(iout[8 * t + 5], iout[8 * t], "t{t} ld.nc");
            assert_eq!(iout[8 * t + 6], 3, "t{t} syncthreads_or/and");
        }
        assert_eq!(out[600], (127 * 128 / 2) << 33);
        assert_eq!(out[601], 97);
        assert!((1000..1128).contains(&out[602]));
        assert_eq!(iout[2000] as u32, 0x5400_5800, "f16x2 atomic add");
    }
}

/// Runs kernel `name` of `misc.ptx` as one block of `threads` threads on a
/// fresh output buffer of `bytes` bytes; the buffer's first `count` values.
fn one_block<T: Scalar>(name: &str, threads: usize, bytes: usize, count: usize) -> Vec<T> {
    let dev = misc(1 << 24);
    let out = dev.alloc(bytes);
    dev.launch(name, linear(1, threads), &[&out]);
    dev.download(out, count)
}

#[test]
fn shuffles_at_divergent_call_sites() {
    let v: Vec<i32> = one_block("divergent_shfl", 64, 64 * 4, 64);
    for (t, x) in v.iter().enumerate() {
        assert_eq!(*x, if t < 32 { 1 } else { 321 }, "thread {t}");
    }
}

#[test]
fn shared_memory_atomics() {
    let v: Vec<u64> = one_block("shared_atomics", 128, 16 * 8, 13);
    assert_eq!(v[0], 8128, "add");
    assert_eq!(v[1] as i64, -50, "min");
    assert_eq!(v[2], 381, "max");
    assert!(v[3] < 128, "exch");
    assert!((1..=128).contains(&v[4]), "cas");
    assert_eq!(v[5], 128 % 11, "inc");
    assert_eq!(v[6], 4, "dec");
    assert_eq!(v[7], 0, "and");
    assert_eq!(v[8], 0xffff_ffff, "or");
    assert_eq!(v[9], 0, "xor");
    assert_eq!(v[10], 8128 << 32, "add.u64");
    assert_eq!(f32::from_bits(v[11] as u32), 4064.0, "add.f32");
    assert_eq!(f64::from_bits(v[12]), 4064.0, "add.f64");
}

/// `mbarrier` (issue 22, item 7): thread 0 initialises a barrier for the
/// block, every thread writes its slot of shared memory and arrives, then
/// waits for the phase by its state (the threads after it let it go round)
/// and reads a neighbour's slot; a second phase is waited for by parity.
const MBARRIER_PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry mbar(.param .u64 out)
{
    .reg .pred %p<3>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<8>;
    .shared .align 8 .b64 bar;
    .shared .align 4 .b32 slots[64];
    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, bar;
    setp.ne.u32 %p1, %r1, 0;
    @%p1 bra ARRIVE;
    mbarrier.init.shared.b64 [%r3], %r2;
ARRIVE:
    bar.sync 0;
    mov.u32 %r4, slots;
    shl.b32 %r5, %r1, 2;
    add.u32 %r6, %r4, %r5;
    mul.lo.u32 %r7, %r1, 3;
    st.shared.u32 [%r6], %r7;
    mbarrier.arrive.shared.b64 %rd2, [%r3];
    mbarrier.pending_count.b64 %r11, %rd2;
WAIT:
    mbarrier.test_wait.shared.b64 %p2, [%r3], %rd2;
    @!%p2 bra WAIT;
    add.u32 %r8, %r1, 1;
    rem.u32 %r8, %r8, %r2;
    shl.b32 %r8, %r8, 2;
    add.u32 %r8, %r4, %r8;
    ld.shared.u32 %r9, [%r8];
    cvt.u64.u32 %rd3, %r1;
    shl.b64 %rd3, %rd3, 3;
    add.u64 %rd4, %rd1, %rd3;
    st.global.u32 [%rd4], %r9;
    mbarrier.arrive.shared.b64 %rd5, [%r3];
PARITY:
    mbarrier.try_wait.parity.shared.b64 %p2, [%r3], 1;
    @!%p2 bra PARITY;
    st.global.u32 [%rd4+4], %r11;
    ret;
}
"#;

#[test]
fn mbarrier_phases_complete_with_the_last_arrival() {
    let dev = Device::load("mbarrier", MBARRIER_PTX, 1 << 20);
    let threads = 64usize;
    let out = dev.alloc(threads * 8);
    dev.launch("mbar", linear(1, threads), &[&out]);
    let got: Vec<u32> = dev.download(out, threads * 2);
    for t in 0..threads {
        assert_eq!(
            got[2 * t],
            ((t + 1) % threads) as u32 * 3,
            "thread {t}'s neighbour"
        );
        // the state of the k-th arrival holds the arrivals pending before it
        assert_eq!(
            got[2 * t + 1],
            (threads - t) as u32,
            "thread {t}'s pending count"
        );
    }
}

/// A device runtime function the CPU device does not run (device-side events)
/// is refused at load with a reason that names dynamic parallelism.
#[test]
fn unrun_device_runtime_calls_are_refused_by_name() {
    let ptx = r#"
.version 8.0
.target sm_75
.address_size 64
.extern .func (.param .b64 ret) __cudaCDP2EventRecordWithFlags(.param .b64 f, .param .b32 n)
;
.visible .entry parent()
{
    .reg .b64 %rd<2>;
    mov.u64 %rd1, 0;
    {
    .param .b64 param0;
    st.param.b64 [param0+0], %rd1;
    .param .b32 param1;
    st.param.b32 [param1+0], 0;
    .param .b64 retval0;
    call.uni (retval0), __cudaCDP2EventRecordWithFlags, (param0, param1);
    }
    ret;
}
"#;
    let mem = cumux_ptx::DeviceMemory::new(1 << 20);
    let err = cumux_ptx::Program::load(ptx, &mem).expect_err("refused");
    assert!(err.to_string().contains("dynamic parallelism"), "{err}");
}

/// `shfl.sync` whose source lane takes no part in it (outside the mask, or
/// gone past it): lanes 0-7 of a warp shuffle with mask 0xff while 8-31 have
/// left. A GPU reads 0 from such a lane, and NVIDIA's reduction sample
/// (`reduce7` without `__reduce_add_sync`, below compute 8.0) sums the final
/// warp on that; a lane's stale register made its sum wrong.
const INACTIVE_SHFL_PTX: &str = r#"
.version 7.5
.target sm_75
.address_size 64
.visible .entry inactive_shfl(.param .u64 out)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    add.u32 %r2, %r1, 100;
    setp.ge.u32 %p1, %r1, 8;
    @%p1 bra DONE;
    shfl.sync.down.b32 %r3, %r2, 16, 31, 0xff;
    shfl.sync.down.b32 %r4, %r2, 4, 31, 0xff;
    mul.wide.u32 %rd2, %r1, 8;
    add.u64 %rd3, %rd1, %rd2;
    st.global.v2.u32 [%rd3], {%r3, %r4};
DONE:
    ret;
}
"#;

#[test]
fn a_shuffle_reads_zero_from_a_lane_taking_no_part() {
    for engine in [cumux_ptx::Engine::Interpreter, cumux_ptx::Engine::Compiler] {
        let mut dev = Device::load("inactive_shfl", INACTIVE_SHFL_PTX, 1 << 20);
        dev.program.set_engine(engine);
        let out = dev.alloc(8 * 8);
        dev.launch("inactive_shfl", linear(1, 32), &[&out]);
        let v: Vec<u32> = dev.download(out, 16);
        for lane in 0..8 {
            assert_eq!(
                v[2 * lane],
                0,
                "{engine:?} lane {lane}: from lane {}",
                lane + 16
            );
            let from = if lane < 4 { lane as u32 + 104 } else { 0 };
            assert_eq!(
                v[2 * lane + 1],
                from,
                "{engine:?} lane {lane}: from lane {}",
                lane + 4
            );
        }
    }
}
