//! Carry arithmetic, indirect calls, cp.async, generic pointers into local and
//! shared memory, named barriers with counts, 64-bit and f16x2 atomics.

mod common;

use common::{download, launch, words};
use cumux_ptx::*;

#[test]
fn misc_features() {
    let mem = DeviceMemory::new(1 << 28);
    let prog = Program::load(include_str!("fixtures/misc.ptx"), &mem).unwrap();
    let n = 128usize;
    let a: Vec<u64> = (0..2 * n as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i << 60))
        .collect();
    let da = mem.alloc((a.len() * 8) as u64).unwrap();
    mem.write(
        da,
        &a.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
    )
    .unwrap();
    let dout = mem.alloc(1024 * 8).unwrap();
    let diout = mem.alloc(4096 * 4).unwrap();
    for sel in [0i32, 1] {
        mem.fill(dout, &[0], 1024 * 8).unwrap();
        mem.fill(diout, &[0], 4096 * 4).unwrap();
        let args: [&[u8]; 4] = [
            &da.to_le_bytes(),
            &dout.to_le_bytes(),
            &diout.to_le_bytes(),
            &sel.to_le_bytes(),
        ];
        let r = launch(&prog, &mem, "misc", [1, 1, 1], [n as u32, 1, 1], 0, &args);
        r.result.unwrap();
        let out: Vec<u64> = words(&download(&mem, dout, 1024 * 8), u64::from_le_bytes);
        let iout: Vec<i32> = words(&download(&mem, diout, 4096 * 4), i32::from_le_bytes);
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

#[test]
fn shuffles_at_divergent_call_sites() {
    let mem = DeviceMemory::new(1 << 24);
    let prog = Program::load(include_str!("fixtures/misc.ptx"), &mem).unwrap();
    let out = mem.alloc(64 * 4).unwrap();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [64, 1, 1],
        dynamic_shared_bytes: 0,
    };
    prog.launch(&mem, "divergent_shfl", &cfg, &out.to_le_bytes())
        .result
        .unwrap();
    let v: Vec<i32> = words(&download(&mem, out, 256), i32::from_le_bytes);
    for (t, x) in v.iter().enumerate() {
        assert_eq!(*x, if t < 32 { 1 } else { 321 }, "thread {t}");
    }
}

#[test]
fn shared_memory_atomics() {
    let mem = DeviceMemory::new(1 << 24);
    let prog = Program::load(include_str!("fixtures/misc.ptx"), &mem).unwrap();
    let out = mem.alloc(16 * 8).unwrap();
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [128, 1, 1],
        dynamic_shared_bytes: 0,
    };
    prog.launch(&mem, "shared_atomics", &cfg, &out.to_le_bytes())
        .result
        .unwrap();
    let v: Vec<u64> = words(&download(&mem, out, 13 * 8), u64::from_le_bytes);
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
