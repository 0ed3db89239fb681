//! What a GPU runs, the interpreter runs (issue 22): the kernels of
//! `tests/cuda/parity/*.cu`, compiled to PTX by nvcc and launched directly.

mod common;

use common::{linear, Device};
use cumux_ptx::{LaunchLimits, Program};

/// The parity program `name.cu` compiled to PTX with `flags`, loaded.
fn parity(name: &str, flags: &[&str]) -> Device {
    let source = cumux_testkit::workspace_root()
        .join("tests/cuda/parity")
        .join(format!("{name}.cu"));
    let ptx = cumux_testkit::compile_ptx_with(source, flags);
    Device::load(&format!("{name}.cu"), &ptx, 256 << 20)
}

#[test]
fn a_failed_assert_is_cuda_error_assert_with_the_drivers_line() {
    let dev = parity("device_assert", &[]);
    let data = dev.alloc(64 * 4);
    let report = dev.try_launch("_Z7checkedPi", linear(2, 32), &[&data]);
    let fault = report.result.unwrap_err();
    assert_eq!(fault.cu_code(), 710, "{fault}");
    let out = String::from_utf8_lossy(&report.stdout);
    assert!(
        out.contains("device_assert.cu:14: void checked(int *): block: [1,0,0], thread: [5,0,0] Assertion `!(blockIdx.x == 1 && threadIdx.x == 5)` failed."),
        "{out:?}"
    );
}

#[test]
fn cp_async_copies_reach_shared_memory() {
    let dev = parity("cp_async", &["-arch=sm_80"]);
    let n = 256usize;
    let input: Vec<i32> = (0..n as i32).map(|i| i * 7 + 1).collect();
    let din = dev.upload(&input);
    let dout = dev.alloc(5 * n * 4);
    dev.launch("_Z6copiesPKiPii", linear(1, n), &[&din, &dout, &8i32]);
    let out: Vec<i32> = dev.download(dout, 5 * n);
    for i in 0..n {
        let zeroed = i == 14 || i == 15;
        let want = [
            if zeroed { 0 } else { input[i] },
            input[i],
            input[i],
            input[n - 1 - i],
            input[i],
        ];
        for (k, w) in want.iter().enumerate() {
            assert_eq!(out[k * n + i], *w, "copy {k} element {i}");
        }
    }
}

#[test]
fn shared_addresses_wrap_at_32_bits() {
    let dev = parity("shared_window", &[]);
    let dout = dev.alloc(192 * 4);
    dev.launch("_Z4wrapPi", linear(1, 64), &[&dout]);
    let out: Vec<i32> = dev.download(dout, 192);
    for i in 0..64 {
        assert_eq!(out[i], i as i32 * 3 + 1, "wrapped read {i}");
        assert_eq!(out[64 + i], i as i32 * 3 + 1, "64-bit read {i}");
        assert_eq!(out[128 + i], 0, "cvta.to.shared {i}");
    }
}

/// Tile sums of `multi_arch.cu` built with `flags`.
fn tile_sums(flags: &[&str]) {
    let dev = parity("multi_arch", flags);
    let (blocks, threads) = (3usize, 256usize);
    let input: Vec<i32> = (0..(blocks * threads) as i32)
        .map(|i| (i * 37) % 101 - 50)
        .collect();
    let din = dev.upload(&input);
    let dout = dev.alloc(blocks * 4 * 4);
    dev.launch("_Z9tile_sumsPKiPi", linear(blocks, threads), &[&din, &dout]);
    let out: Vec<i32> = dev.download(dout, blocks * 4);
    for (t, got) in out.iter().enumerate() {
        let want: i32 = input[t * 64..(t + 1) * 64].iter().sum();
        assert_eq!(*got, want, "tile {t}");
    }
}

#[test]
fn sm80_ptx_gets_reserved_shared_memory() {
    tile_sums(&["-arch=sm_80"]);
    tile_sums(&["-arch=sm_90"]);
}

#[test]
fn sm75_ptx_keeps_tile_scratch_in_user_shared_memory() {
    tile_sums(&[]);
}

#[test]
fn grid_sync_in_a_cooperative_launch() {
    let dev = parity("grid_sync", &[]);
    let (blocks, threads) = (8usize, 64usize);
    let n = blocks * threads;
    let data = dev.alloc(n * 4);
    let sums = dev.alloc(3 * n * 4);
    let kernel = "_Z6roundsPiS_i";
    let params = common::pack_params(dev.kernel(kernel), &[&data, &sums, &(n as i32)]);
    let cfg = linear(blocks, threads);
    let coop =
        |p: &Program| p.launch_cooperative(&dev.mem, kernel, &cfg, &params, &LaunchLimits::NONE);
    coop(&dev.program).result.unwrap();
    let got: Vec<i32> = dev.download(sums, 3 * n);
    for r in 0..3 {
        for i in 0..n {
            let j = (i + threads * 5 + 7) % n;
            assert_eq!(
                got[r * n + i],
                (j + r * 1000) as i32,
                "round {r} thread {i}"
            );
        }
    }
    // launched plainly, the grid has no workspace: the sync traps, as on a GPU
    let plain = dev.try_launch(kernel, cfg, &[&data, &sums, &(n as i32)]);
    assert_eq!(plain.result.unwrap_err().cu_code(), 719);
    // more blocks, or threads, than run at once
    for big in [linear(2048, 32), linear(128, 1024)] {
        let r =
            dev.program
                .launch_cooperative(&dev.mem, kernel, &big, &params, &LaunchLimits::NONE);
        assert_eq!(r.result.unwrap_err().cu_code(), 720, "{big:?}");
    }
}

/// `cp.async` forms nvcc's headers do not emit but hand-written PTX does: an
/// `ignore-src` predicate (zeros when it holds) and a cache policy operand
/// after `.L2::cache_hint` (not a source size).
const CP_ASYNC_FORMS: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.visible .entry forms(.param .u64 in, .param .u64 out)
{
  .reg .b64 %rd<8>;
  .reg .b32 %r<12>;
  .reg .pred %p<3>;
  .shared .align 16 .b8 s[64];
  ld.param.u64 %rd1, [in];
  ld.param.u64 %rd2, [out];
  mov.u32 %r1, s;
  setp.ne.u32 %p1, %r1, %r1;
  setp.eq.u32 %p2, %r1, %r1;
  createpolicy.fractional.L2::evict_last.b64 %rd3, 1.0;
  cp.async.ca.shared::cta.global [%r1], [%rd1], 16, %p1;
  cp.async.ca.shared.global [%r1+16], [%rd1+16], 16, %p2;
  cp.async.cg.shared.global.L2::cache_hint [%r1+32], [%rd1+32], 16, %rd3;
  cp.async.cg.shared.global.L2::cache_hint [%r1+48], [%rd1+48], 16, 8, %rd3;
  cp.async.commit_group;
  cp.async.wait_all;
  ld.shared.v4.u32 {%r2, %r3, %r4, %r5}, [%r1];
  st.global.v4.u32 [%rd2], {%r2, %r3, %r4, %r5};
  ld.shared.v4.u32 {%r2, %r3, %r4, %r5}, [%r1+16];
  st.global.v4.u32 [%rd2+16], {%r2, %r3, %r4, %r5};
  ld.shared.v4.u32 {%r2, %r3, %r4, %r5}, [%r1+32];
  st.global.v4.u32 [%rd2+32], {%r2, %r3, %r4, %r5};
  ld.shared.v4.u32 {%r2, %r3, %r4, %r5}, [%r1+48];
  st.global.v4.u32 [%rd2+48], {%r2, %r3, %r4, %r5};
  ret;
}
"#;

#[test]
fn cp_async_ignore_source_and_cache_policy_operands() {
    let dev = Device::load("cp_async_forms", CP_ASYNC_FORMS, 1 << 20);
    let input: Vec<u32> = (1..=16).collect();
    let din = dev.upload(&input);
    let dout = dev.alloc(64);
    dev.launch("forms", linear(1, 1), &[&din, &dout]);
    let out: Vec<u32> = dev.download(dout, 16);
    let want = [1, 2, 3, 4, 0, 0, 0, 0, 9, 10, 11, 12, 13, 14, 0, 0];
    assert_eq!(out, want);
}

#[test]
fn device_malloc_free_new_and_delete() {
    let dev = parity("device_malloc", &[]);
    let (blocks, threads) = (4usize, 64usize);
    let n = blocks * threads;
    let sums = dev.alloc(n * 4);
    let was_null = dev.alloc(4);
    let big_fits = dev.alloc(4);
    dev.mem.set_heap_limit(16 << 20).unwrap();
    for _ in 0..3 {
        dev.launch(
            "_Z5listsPiS_S_",
            linear(blocks, threads),
            &[&sums, &was_null, &big_fits],
        );
    }
    let got: Vec<i32> = dev.download(sums, n);
    for (i, g) in got.iter().enumerate() {
        let want = 15 + (0..=(i % 8) as i32).map(|k| i as i32 * 10 + k).sum::<i32>();
        assert_eq!(*g, want, "thread {i}");
    }
    assert_eq!(
        dev.download::<i32>(was_null, 1),
        vec![1],
        "malloc past the heap"
    );
    let fits: Vec<i32> = dev.download(big_fits, 1);
    assert_eq!(fits, vec![1], "12 MiB of a 16 MiB heap");
    // the heap's size is fixed once a kernel used it
    assert!(dev.mem.set_heap_limit(1 << 20).is_err());
}

#[test]
fn a_free_of_a_pointer_the_heap_never_gave_faults() {
    const BAD_FREE: &str = r#"
.version 8.0
.target sm_75
.address_size 64
.extern .func free (.param .b64 free_param_0);
.visible .entry bad(.param .u64 p)
{
  .reg .b64 %rd<2>;
  ld.param.u64 %rd1, [p];
  { .param .b64 param0;
    st.param.b64 [param0+0], %rd1;
    call.uni free, (param0); }
  ret;
}
"#;
    let dev = Device::load("bad_free", BAD_FREE, 1 << 24);
    let buf = dev.alloc(64);
    let r = dev.try_launch("bad", linear(1, 1), &[&buf]);
    assert_eq!(r.result.unwrap_err().cu_code(), 700);
    dev.launch("bad", linear(1, 1), &[&0u64]);
}

#[test]
fn indirect_calls_virtual_functions_and_deep_recursion() {
    let dev = parity("indirect_calls", &[]);
    let out = dev.alloc(96 * 4);
    let pad = dev.alloc(8 * 4);
    let depth = 400i32;
    dev.launch("_Z5callsPiiPVi", linear(1, 32), &[&out, &depth, &pad]);
    let got: Vec<i32> = dev.download(out, 96);
    for i in 0..32i32 {
        let want_f = match i % 3 {
            0 => i + 3,
            1 => i * 3,
            _ => i - 3,
        };
        let want_area = if i & 1 == 1 { i * 2 } else { i * i };
        let n = depth + i % 4;
        let want_depth: i32 = (0..=n).sum();
        let k = i as usize;
        assert_eq!(
            [got[k], got[32 + k], got[64 + k]],
            [want_f, want_area, want_depth],
            "thread {i}"
        );
    }
}

#[test]
fn bulk_copies_are_refused_not_left_undone() {
    for form in [
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1], 16, [%r1];",
        // the transaction counts bulk copies complete on
        "mbarrier.arrive.expect_tx.shared.b64 %rd2, [%r1], 16;",
    ] {
        let ptx = format!(
            ".version 8.0\n.target sm_90\n.address_size 64\n\
             .visible .entry k(.param .u64 p)\n{{\n.reg .b64 %rd<4>;\n.reg .b32 %r<4>;\n\
             .shared .align 16 .b8 s[64];\nld.param.u64 %rd1, [p];\nmov.u32 %r1, s;\n\
             {form}\nret;\n}}\n"
        );
        let mem = cumux_ptx::DeviceMemory::new(1 << 20);
        let err = Program::load(&ptx, &mem).unwrap_err();
        assert_eq!(err.cu_code(), 218, "{form}: {err}");
    }
}
