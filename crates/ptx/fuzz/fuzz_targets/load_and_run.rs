//! Fuzz target: parse, load and launch every kernel of arbitrary PTX under an
//! instruction budget; nothing may panic or hang.
#![no_main]

use cumux_ptx::{DeviceMemory, LaunchConfig, Program};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mem = DeviceMemory::new(1 << 24);
    let Ok(buf) = mem.alloc(4096) else { return };
    let Ok(program) = Program::load(text, &mem) else {
        return;
    };
    let cfg = LaunchConfig {
        grid: [2, 1, 1],
        block: [33, 1, 1],
        dynamic_shared_bytes: 64,
    };
    for k in program.kernels().to_vec() {
        let mut params = vec![0u8; k.params_bytes() as usize];
        for p in &k.params {
            let n = (p.size as usize).min(8);
            params[p.offset as usize..p.offset as usize + n]
                .copy_from_slice(&buf.to_le_bytes()[..n]);
        }
        let _ = program.launch_limited(&mem, &k.name, &cfg, &params, 100_000);
    }
    program.unload(&mem);
});
