//! Compute kernels of the corpus against host references: vector add,
//! saxpy, tiled matrix multiply, shuffle reductions, histogram, scan,
//! transpose, n-body, bitonic sort.

use crate::harness::*;

#[test]
fn vector_add() {
    let module = corpus("vector_add");
    let n = 10_007;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 1.0 / (i + 1) as f32).collect();
    let (da, db, dc) = (module.upload(&a), module.upload(&b), module.alloc(n * 4));
    let report = module.launch(
        "vector_add",
        linear(n.div_ceil(256), 256),
        &[&da, &db, &dc, &(n as i32)],
    );
    assert!(report.instructions > n as u64);
    let c: Vec<f32> = module.download(dc, n);
    for i in 0..n {
        assert_eq!(c[i].to_bits(), (a[i] + b[i]).to_bits(), "c[{i}]");
    }
}

#[test]
fn saxpy() {
    let module = corpus("saxpy");
    let n = 1 << 16;
    let alpha = 2.5f32;
    let mut rng = Rng(1);
    let x = rng.uniform_f32s(n, -0.5, 0.5);
    let y: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.001).collect();
    let (dx, dy) = (module.upload(&x), module.upload(&y));
    module.launch("saxpy", linear(32, 256), &[&(n as i32), &alpha, &dx, &dy]);
    let out: Vec<f32> = module.download(dy, n);
    for i in 0..n {
        let want = alpha.mul_add(x[i], y[i]);
        assert_close("y", i, f64::from(out[i]), f64::from(want), 1e-6);
    }
}

#[test]
fn matmul_tiled() {
    let module = corpus("matmul_tiled");
    let (m, n, k) = (70usize, 50usize, 40usize);
    let mut rng = Rng(2);
    let a = rng.uniform_f32s(m * k, -1.0, 1.0);
    let b = rng.uniform_f32s(k * n, -1.0, 1.0);
    let (da, db, dc) = (
        module.upload(&a),
        module.upload(&b),
        module.alloc(m * n * 4),
    );
    module.launch(
        "matmul_tiled",
        config(
            [n.div_ceil(16) as u32, m.div_ceil(16) as u32, 1],
            [16, 16, 1],
            0,
        ),
        &[&da, &db, &dc, &(m as i32), &(n as i32), &(k as i32)],
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
    let module = corpus("reduce_shfl");
    let n: usize = 50_001;
    let mut rng = Rng(3);
    let data: Vec<i32> = (0..n).map(|_| rng.range_i32(-1000, 1000)).collect();
    let (din, dtotal) = (module.upload(&data), module.alloc(8));
    module.launch("reduce_shfl", linear(8, 256), &[&din, &dtotal, &(n as i32)]);
    let total = module.download::<u64>(dtotal, 1)[0] as i64;
    assert_eq!(total, data.iter().map(|&v| i64::from(v)).sum::<i64>());
}

#[test]
fn histogram() {
    let module = corpus("histogram");
    let n: usize = 40_000;
    let mut rng = Rng(4);
    let data: Vec<u8> = (0..n)
        .map(|_| {
            let v = rng.next_u32() >> 24;
            ((v * v) >> 8) as u8
        })
        .collect();
    let (ddata, dbins) = (module.upload(&data), module.alloc(256 * 4));
    module.launch("histogram", linear(10, 192), &[&ddata, &(n as i32), &dbins]);
    let mut want = vec![0u32; 256];
    for &byte in &data {
        want[byte as usize] += 1;
    }
    assert_eq!(module.download::<u32>(dbins, 256), want);
}

#[test]
fn prefix_scan() {
    let module = corpus("prefix_scan");
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
        linear(blocks, block),
        &[&din, &dout, &dsums, &(n as i32)],
    );
    module.launch(
        "scan_blocks",
        linear(1, block),
        &[&dsums, &dscanned, &0u64, &(blocks as i32)],
    );
    module.launch(
        "add_block_offsets",
        linear(blocks, block),
        &[&dout, &dscanned, &(n as i32)],
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
    let module = corpus("transpose");
    let (rows, cols) = (70usize, 100usize);
    let input: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
    let (din, dout) = (module.upload(&input), module.alloc(rows * cols * 4));
    module.launch(
        "transpose",
        config(
            [cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1],
            [32, 8, 1],
            0,
        ),
        &[&din, &dout, &(rows as i32), &(cols as i32)],
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
    let module = corpus("nbody");
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
    let args: [&dyn KernelArg; 4] = [&dpos, &dvel, &(n as i32), &dt];
    module.launch("body_forces", linear(n / 128, 128), &args);
    module.launch("integrate", linear(n / 128, 128), &args);
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
    let module = corpus("bitonic_sort");
    const CHUNK: u32 = 1024; // fixed in bitonic_sort.cu
    let n = 4 * CHUNK; // two merge sizes above a chunk: global and shared stages
    let mut rng = Rng(6);
    let keys: Vec<u32> = (0..n).map(|_| rng.next_u32() % 100_000).collect();
    let dkeys = module.upload(&keys);
    let chunks = (n / CHUNK) as usize;
    let shared = |first: u32, last: u32| {
        module.launch(
            "bitonic_shared",
            linear(chunks, CHUNK as usize / 2),
            &[&dkeys, &first, &last],
        );
    };
    shared(2, CHUNK);
    let mut size = 2 * CHUNK;
    while size <= n {
        let mut stride = size / 2;
        while stride >= CHUNK {
            module.launch(
                "bitonic_global",
                linear((n / 256) as usize, 256),
                &[&dkeys, &size, &stride],
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
