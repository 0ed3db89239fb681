//! Language and driver features of the corpus: device functions, dynamic
//! shared memory, printf, faults that leave memory usable, module globals,
//! votes, atomics, 3-D grids; and a check that every corpus program has a test.

use crate::harness::*;
use cumux_ptx::Fault;
use std::collections::BTreeSet;

#[test]
fn device_function() {
    let module = corpus("device_function");
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
        linear(n.div_ceil(block), block),
        &[&din, &dmixed, &dfacts, &dfibs, &(n as i32)],
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
    let module = corpus("dynamic_shared");
    let block = 64;
    let n = block * 5;
    let input: Vec<i32> = (0..n as i32).map(|i| i * 3 - 1000).collect();
    let din = module.upload(&input);
    let (drev, dscaled) = (module.alloc(n * 4), module.alloc(n * 4));
    module.launch(
        "dynamic_shared",
        config([(n / block) as u32, 1, 1], [block as u32, 1, 1], block * 8),
        &[&din, &drev, &dscaled, &(n as i32)],
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
    let module = corpus("printf_kernel");
    let report = module.launch("printf_kernel", linear(2, 64), &[&7i32, &1.25f32]);
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
    let module = corpus("out_of_bounds");
    let data = module.alloc(256 * 4);
    let report = module.try_launch("out_of_bounds", linear(1, 32), &[&data, &(1u64 << 40)]);
    match &report.result {
        Err(fault @ Fault::IllegalAddress { .. }) => assert_eq!(fault.cu_code(), 700),
        other => panic!("expected an illegal-address fault, got {other:?}"),
    }
    // The same memory and module run the next launch normally.
    module.launch("out_of_bounds", linear(1, 32), &[&data, &0u64]);
    let values: Vec<i32> = module.download(data, 32);
    assert_eq!(values, (0..32).collect::<Vec<i32>>());
    let other = module.upload(&[5i32, 6, 7]);
    assert_eq!(module.download::<i32>(other, 3), vec![5, 6, 7]);
}

#[test]
fn constant_and_device_globals() {
    let module = corpus("constant_and_device_globals");
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
        linear(n.div_ceil(128), 128),
        &[&dx, &dout, &(n as i32)],
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
    let module = corpus("warp_vote");
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
    module.launch("warp_vote", linear(2, 128), &[&dvalues, &dout]);
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
    let module = corpus("atomics_all");
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
        linear(n / 256, 256),
        &[&results, &dvalues, &dexch, &(n as i32)],
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

#[test]
fn grid_3d() {
    let module = corpus("grid_3d");
    const WORDS: usize = 7;
    let (grid, block) = ([3u32, 4, 5], [8u32, 4, 2]);
    let (width, height, depth) = (grid[0] * block[0], grid[1] * block[1], grid[2] * block[2]);
    let cells = (width * height * depth) as usize;
    let dcells = module.alloc(cells * WORDS * 4);
    module.launch("grid_3d", config(grid, block, 0), &[&dcells]);
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
    let this_file = [
        include_str!("kernels.rs"),
        include_str!("numeric.rs"),
        include_str!("features.rs"),
    ]
    .concat();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(cumux_testkit::corpus_dir()).expect("corpus folder") {
        let path = entry.expect("directory entry").path();
        if path.extension().is_some_and(|ext| ext == "cu") {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            if !this_file.contains(&format!("corpus(\"{stem}\")")) {
                missing.push(stem);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "corpus programs without an interpreter test: {missing:?}"
    );
}
