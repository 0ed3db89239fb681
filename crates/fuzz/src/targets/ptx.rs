//! PTX, as a client's module image brings it: the parser must answer any text
//! with a module or an error (`ptx_parse`); loading (lowering, validation)
//! and launching every kernel under an instruction budget must fail cleanly,
//! never panic or run on (`ptx_run`). Seeds are the PTX fixtures of the ptx
//! crate's tests.

use std::path::Path;

use cumux_ptx::{DeviceMemory, LaunchConfig, LoadError, Program};

use crate::engine::{corpus_files, Target};
use crate::features::Features;

pub static PARSE: Target = Target {
    name: "ptx_parse",
    check: check_parse,
    seeds,
    dictionary: DICTIONARY,
    max_len: 64 << 10,
};

pub static RUN: Target = Target {
    name: "ptx_run",
    check: check_run,
    seeds,
    dictionary: DICTIONARY,
    max_len: 64 << 10,
};

/// Tokens of PTX the mutations insert.
const DICTIONARY: &[&[u8]] = &[
    b".version 8.5\n",
    b".target sm_90\n",
    b".address_size 64\n",
    b".visible .entry k(.param .u64 p)\n{\n",
    b".func ",
    b".reg .b32 %r<8>;\n",
    b".reg .pred %p<2>;\n",
    b".shared .align 4 .b8 s[64];\n",
    b".global .u32 g[4];\n",
    b".param ",
    b".u64 ",
    b".f32 ",
    b".v4",
    b"ld.param.u64 %rd1, [p];\n",
    b"ld.global.u32 %r1, [%rd1+4];\n",
    b"st.shared.u32 [s], %r1;\n",
    b"add.s32 %r1, %r2, 1;\n",
    b"mad.lo.s32 ",
    b"setp.lt.u32 %p1, %r1, %r2;\n",
    b"@%p1 bra L;\n",
    b"L:\n",
    b"bar.sync 0;\n",
    b"shfl.sync.bfly.b32 %r1, %r2, 1, 31, -1;\n",
    b"atom.global.add.u32 %r1, [%rd1], 1;\n",
    b"call (%r1), f, (%r2);\n",
    b"ret;\n",
    b"}\n",
    b"%tid.x",
    b"0fFFFFFFFF",
    b"0d7FF0000000000000",
    b"2147483648",
    b"-1",
    b"[",
    b"]",
    b"{",
    b";",
];

fn check_parse(data: &[u8], features: &mut Features) {
    // Mutations break UTF-8 often; the text is what matters.
    let text = String::from_utf8_lossy(data);
    match cumux_ptx::parse(&text) {
        Ok(module) => features.add(("parsed", module.items.len().min(8))),
        Err(e) => {
            features.add_message("parse error", &e.message);
            // How far into the text it got, by powers of two of lines.
            features.add(("depth", e.line.checked_ilog2()));
        }
    }
}

fn check_run(data: &[u8], features: &mut Features) {
    let text = String::from_utf8_lossy(data);
    let mem = DeviceMemory::new(1 << 24);
    let buf = mem.alloc(4096).expect("4 KiB of a fresh 16 MiB device");
    let program = match Program::load(&text, &mem) {
        Ok(program) => program,
        Err(e) => {
            match e {
                LoadError::Parse(e) => features.add_message("parse", &e.message),
                LoadError::Unsupported { what, .. } => features.add_message("unsupported", &what),
                LoadError::Invalid(why) => features.add_message("invalid", &why),
                LoadError::OutOfMemory => features.add("out of memory"),
            }
            return;
        }
    };
    let cfg = LaunchConfig {
        grid: [2, 1, 1],
        block: [33, 1, 1],
        dynamic_shared_bytes: 64,
    };
    for kernel in program.kernels().to_vec() {
        // Every parameter points at the buffer (its first bytes, for small ones).
        let mut params = vec![0u8; kernel.params_bytes() as usize];
        for p in &kernel.params {
            let at = p.offset as usize;
            let n = (p.size as usize)
                .min(8)
                .min(params.len().saturating_sub(at));
            params[at..at + n].copy_from_slice(&buf.to_le_bytes()[..n]);
        }
        let report = program.launch_limited(&mem, &kernel.name, &cfg, &params, 100_000);
        match report.result {
            Ok(()) => features.add(("ran", report.instructions.min(64))),
            Err(fault) => features.add(("fault", fault.cu_code())),
        }
    }
    program.unload(&mem);
}

/// The ptx crate's fixtures.
fn seeds() -> Vec<Vec<u8>> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ptx/tests/fixtures");
    corpus_files(&fixtures)
        .into_iter()
        .filter(|(path, _)| path.extension().is_some_and(|e| e == "ptx"))
        .map(|(_, bytes)| bytes)
        .collect()
}
