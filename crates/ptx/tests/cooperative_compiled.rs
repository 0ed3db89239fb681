//! Cooperative launches on the compiler: `this_grid().sync()` across blocks
//! that each run as native code on a host thread of their own (alone in its
//! binary, so the process's count of compiled blocks is this test's).

mod common;

use common::{linear, Device};
use cumux_ptx::{compiled_blocks, Engine, LaunchLimits};

/// What `tests/cuda/parity/grid_sync.cu`'s `rounds` leaves in `sums`: each
/// thread reads, after a grid sync, what another block's thread wrote.
fn expected(n: usize, threads: usize) -> Vec<i32> {
    (0..3)
        .flat_map(|r| (0..n).map(move |i| ((i + threads * 5 + 7) % n + r * 1000) as i32))
        .collect()
}

#[test]
fn grid_sync_runs_compiled_with_the_interpreters_results() {
    let ptx = cumux_testkit::compile_ptx_with(
        cumux_testkit::workspace_root().join("tests/cuda/parity/grid_sync.cu"),
        &[],
    );
    let kernel = "_Z6roundsPiS_i";
    // more blocks than this machine has cores: blocks spinning at a sync
    // must give their cores to the ones still on their way
    for (blocks, threads) in [(8usize, 64usize), (48, 128)] {
        let n = blocks * threads;
        for engine in [Engine::Interpreter, Engine::Compiler] {
            let mut dev = Device::load("grid_sync.cu", &ptx, 64 << 20);
            dev.program.set_engine(engine);
            let data = dev.alloc(n * 4);
            let sums = dev.alloc(3 * n * 4);
            let params = common::pack_params(dev.kernel(kernel), &[&data, &sums, &(n as i32)]);
            let before = compiled_blocks();
            let report = dev.program.launch_cooperative(
                &dev.mem,
                kernel,
                &linear(blocks, threads),
                &params,
                &LaunchLimits::NONE,
            );
            report.result.unwrap_or_else(|f| panic!("{engine:?}: {f}"));
            let ran = compiled_blocks() - before;
            match engine {
                Engine::Interpreter => assert_eq!(ran, 0),
                Engine::Compiler => assert_eq!(ran, blocks as u64, "blocks run as native code"),
            }
            let got: Vec<i32> = dev.download(sums, 3 * n);
            assert_eq!(got, expected(n, threads), "{engine:?}, {blocks} blocks");
        }
    }
}
