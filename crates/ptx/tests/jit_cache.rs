//! The compiled-code cache (issue 22): the same module loaded again, into
//! the same memory or another, compiles none of its kernels again, and its
//! launches give what the first module's give. (A file of its own: the
//! process's count of compilations is the thing checked.)

mod common;

use cumux_ptx::{compilations, DeviceMemory, Engine, LaunchConfig, Program};

/// Loads the fixture into `mem`, runs `tree` (a block sum of 256 words)
/// on the compiler; the first block's sum.
fn tree_sum(mem: &DeviceMemory) -> u32 {
    let mut program =
        Program::load(&common::fixture("compiler_cases.ptx"), mem).expect("fixture loads");
    program.set_engine(Engine::Compiler);
    program.compiled("tree").expect("the compiler takes tree");
    let words: Vec<u8> = (0..256u32)
        .flat_map(|i| (i * 3 + 1).to_le_bytes())
        .collect();
    let out = mem.alloc(1024).expect("out");
    let inp = mem.alloc(1024).expect("in");
    mem.write(inp, &words).expect("upload");
    let mut params = out.to_le_bytes().to_vec();
    params.extend_from_slice(&inp.to_le_bytes());
    let cfg = LaunchConfig {
        grid: [1, 1, 1],
        block: [256, 1, 1],
        dynamic_shared_bytes: 0,
    };
    program
        .launch(mem, "tree", &cfg, &params)
        .result
        .expect("tree runs");
    let mut sum = [0u8; 4];
    mem.read(out, &mut sum).expect("download");
    u32::from_le_bytes(sum)
}

#[test]
fn a_module_loaded_again_compiles_nothing_again() {
    let want: u32 = (0..256u32).map(|i| i * 3 + 1).sum();
    let first = DeviceMemory::new(16 << 20);
    assert_eq!(tree_sum(&first), want);
    let compiled = compilations();
    assert!(compiled >= 1, "the first load compiled tree");
    assert_eq!(tree_sum(&first), want, "again, in the same memory");
    let other = DeviceMemory::new(16 << 20);
    assert_eq!(tree_sum(&other), want, "again, in another memory");
    assert_eq!(
        compilations(),
        compiled,
        "the later loads found tree compiled"
    );
}
