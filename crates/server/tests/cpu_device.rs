//! The CPU device behind a live session: PTX and fat binaries from nvcc load,
//! kernels run with the parameter layout the module reports, and a cubin-only
//! fat binary is refused with CUDA_ERROR_NO_BINARY_FOR_GPU.

mod common;

use std::sync::Arc;

use common::*;
use cumux_protocol::*;

fn vector_add_params(a: u64, b: u64, c: u64, n: i32, layout: &[ParamInfo]) -> Vec<u8> {
    let size = layout.last().map_or(0, |p| p.offset + p.size) as usize;
    let mut params = vec![0u8; size];
    for (p, bytes) in layout.iter().zip([
        a.to_le_bytes().to_vec(),
        b.to_le_bytes().to_vec(),
        c.to_le_bytes().to_vec(),
        n.to_le_bytes().to_vec(),
    ]) {
        params[p.offset as usize..][..p.size as usize].copy_from_slice(&bytes[..p.size as usize]);
    }
    params
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

#[test]
fn ptx_and_fat_binaries_load_and_run() {
    let (server, socket, _dir) = cpu_server("cpu-run", 256 << 20);
    let source = cumux_testkit::corpus_source("vector_add");
    let ptx = cumux_testkit::compile_ptx(&source);
    let fatbin = std::fs::read(cumux_testkit::compile_program(&source, &["-fatbin"])).unwrap();
    for image in [ptx.into_bytes(), fatbin] {
        let mut c = Client::connect(&socket, "cpu-test", None);
        assert_eq!(c.devices[0].backend, "cpu");
        let m = match c.call(Call::ModuleLoad { image }).unwrap() {
            ReplyBody::Module(m) => m,
            other => panic!("{other:?}"),
        };
        let f = m
            .functions
            .iter()
            .find(|f| f.name.contains("vector_add"))
            .expect("the kernel");
        assert_eq!(f.params.len(), 4);
        assert_eq!(f.attrs.max_threads_per_block, 1024);
        let n = 1000;
        let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
        let (pa, pb, pc) = (
            c.alloc(4 * n as u64),
            c.alloc(4 * n as u64),
            c.alloc(4 * n as u64),
        );
        c.write(pa, &floats(&a));
        c.write(pb, &floats(&b));
        let params = vector_add_params(pa, pb, pc, n, &f.params);
        let grid = [(n as u32).div_ceil(256), 1, 1];
        c.post(launch_call(f.handle, grid, [256, 1, 1], params));
        let out = c.read(pc, 4 * n as u64).unwrap();
        let expected: Vec<f32> = (0..n).map(|i| 3.0 * i as f32).collect();
        assert_eq!(out, floats(&expected));
        // A pointer past the end faults: the context dies, the server does not.
        let params = vector_add_params(pa, pb, pc + (1 << 40), 32, &f.params);
        c.post(launch_call(f.handle, [1, 1, 1], [32, 1, 1], params));
        assert_eq!(c.code(Call::ContextSynchronize), codes::ILLEGAL_ADDRESS);
    }
    let mut c = Client::connect(&socket, "cpu-test", None);
    c.alloc(16);
    drop(c);
    let device = Arc::clone(&server.devices()[0]);
    eventually("memory to be released", || device.mem_used() == 0);
}

#[test]
fn a_kernel_cannot_reach_another_sessions_memory() {
    let (_server, socket, _dir) = cpu_server("cpu-isolation", 256 << 20);
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source("vector_add"));
    let mut a = Client::connect(&socket, "tenant-a", None);
    let bufs: Vec<u64> = (0..3).map(|_| a.alloc(4096)).collect();
    a.write(bufs[2], &[7; 4096]);
    let mut b = Client::connect(&socket, "tenant-b", None);
    let m = b.load_bytes(ptx.into_bytes());
    let f = m.functions[0].clone();
    let mine = b.alloc(4096);
    let params = vector_add_params(bufs[2], bufs[2], mine, 32, &f.params);
    b.post(launch_call(f.handle, [1, 1, 1], [32, 1, 1], params));
    // A's pointer names nothing in B's address space.
    assert_eq!(b.code(Call::ContextSynchronize), codes::ILLEGAL_ADDRESS);
    assert_eq!(a.read(bufs[2], 4096).unwrap(), vec![7; 4096]);
}

#[test]
fn cubin_only_images_are_refused() {
    let (_server, socket, _dir) = cpu_server("cpu-cubin", 256 << 20);
    let source = cumux_testkit::corpus_source("vector_add");
    let cubin_only = cumux_testkit::compile_program(
        &source,
        &["-fatbin", "-gencode", "arch=compute_75,code=sm_75"],
    );
    let mut c = Client::connect(&socket, "cpu-test", None);
    let err = c
        .call(Call::ModuleLoad {
            image: std::fs::read(cubin_only).unwrap(),
        })
        .unwrap_err();
    assert_eq!(err.code, codes::NO_BINARY_FOR_GPU, "{err}");
    let cubin = cumux_testkit::compile_program(&source, &["-cubin", "-arch=sm_75"]);
    let err = c
        .call(Call::ModuleLoad {
            image: std::fs::read(cubin).unwrap(),
        })
        .unwrap_err();
    assert_eq!(err.code, codes::NO_BINARY_FOR_GPU, "{err}");
    let err = c
        .call(Call::ModuleLoad {
            image: b".version 9.0\n.target sm_75\nbogus;\n".to_vec(),
        })
        .unwrap_err();
    assert_eq!(err.code, codes::INVALID_PTX, "{err}");
    c.alloc(8);
}

#[test]
fn contexts_share_one_memory_budget() {
    let (server, socket, _dir) = cpu_server("cpu-budget", 256 << 20);
    let device = Arc::clone(&server.devices()[0]);
    let mut a = Client::connect(&socket, "tenant-a", None);
    let mut b = Client::connect(&socket, "tenant-b", None);
    a.alloc(200 << 20);
    assert_eq!(
        b.code(Call::MemAlloc {
            device: 0,
            bytes: 100 << 20
        }),
        codes::OUT_OF_MEMORY
    );
    match b.call(Call::MemGetInfo { device: 0 }).unwrap() {
        ReplyBody::MemInfo { free, total } => {
            assert_eq!(total, 256 << 20);
            assert!(free <= 56 << 20, "{free}");
        }
        other => panic!("{other:?}"),
    }
    drop(a);
    eventually("a's memory to be released", || device.mem_used() == 0);
    b.alloc(100 << 20);
    assert_eq!(device.mem_used(), 100 << 20);
}
