//! Device-side launches (issue 22): `fixtures/device_launch.ptx` (nvcc's PTX
//! of `device_launch.cu`, built with `-rdc=true`) on both engines.

mod common;

use common::config;
use cumux_ptx::{DeviceMemory, Engine, Program};

fn load(engine: Engine, mem: &DeviceMemory) -> Program {
    let mut p = Program::load(&common::fixture("device_launch.ptx"), mem).expect("loads");
    p.set_engine(engine);
    p
}

fn ints(mem: &DeviceMemory, at: u64, n: usize) -> Vec<i32> {
    let mut b = vec![0u8; n * 4];
    mem.read(at, &mut b).expect("read back");
    b.chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn params(ps: &[u64]) -> Vec<u8> {
    ps.iter().flat_map(|p| p.to_le_bytes()).collect()
}

#[test]
fn children_run_after_their_parent_in_every_stream() {
    for engine in [Engine::Interpreter, Engine::Compiler] {
        let mem = DeviceMemory::new(64 << 20);
        let prog = load(engine, &mem);
        let out = mem.alloc(64).unwrap();
        let codes = mem.alloc(16).unwrap();
        mem.write(codes, &[0xff; 16]).unwrap();
        let r = prog.launch(
            &mem,
            "_Z6parentPiS_",
            &config([1, 1, 1], [16, 1, 1], 0),
            &params(&[out, codes]),
        );
        assert_eq!(r.result, Ok(()), "{engine:?}");
        // the tail launch ran after the parent wrote out[4] = 20
        assert_eq!(
            ints(&mem, out, 16),
            [11, 11, 11, 11, 22, 12, 12, 12, 13, 13, 13, 13, 14, 14, 14, 14],
            "{engine:?}"
        );
        // cudaErrorInvalidConfiguration, kept until read
        assert_eq!(ints(&mem, codes, 3), [9, 9, 0], "{engine:?}");
    }
}

#[test]
fn nesting_stops_at_24_levels_with_its_error() {
    let mem = DeviceMemory::new(64 << 20);
    let prog = load(Engine::Interpreter, &mem);
    let d = mem.alloc(8).unwrap();
    mem.write(d, &[0; 8]).unwrap();
    let mut p = params(&[d]);
    p.extend_from_slice(&0i32.to_le_bytes());
    let r = prog.launch(&mem, "_Z4divePii", &config([1, 1, 1], [1, 1, 1], 0), &p);
    assert_eq!(r.result, Ok(()));
    // Each level stays pending until its child's tree is done: the chain
    // ends at the pending limit with cudaErrorLaunchPendingCountExceeded, as
    // on an H200.
    assert_eq!(ints(&mem, d, 2), [2048, 69]);
}

#[test]
fn a_childs_bad_write_fails_the_launch_with_700() {
    let mem = DeviceMemory::new(64 << 20);
    let prog = load(Engine::Compiler, &mem);
    let out = mem.alloc(64).unwrap();
    let r = prog.launch(
        &mem,
        "_Z10oob_parentPi",
        &config([1, 1, 1], [1, 1, 1], 0),
        &params(&[out]),
    );
    assert_eq!(r.result.map_err(|f| f.cu_code()), Err(700));
}
