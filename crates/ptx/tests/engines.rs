//! The compiler against the interpreter (issue 22): every kernel of the corpus,
//! the fixtures and mutants of the fixtures that the compiler takes, on both
//! engines with the same inputs: same memory, fault and instruction count.

mod common;

use common::config;
use cumux_ptx::{DeviceMemory, Engine, LaunchConfig, LaunchLimits, LaunchReport, Program};

const MEMORY_BYTES: u64 = 64 << 20;
/// Bytes of each buffer a pointer parameter gets.
const BUFFER_BYTES: usize = 256 << 10;

/// What one engine left behind: the report and every buffer's bytes.
#[derive(Debug, PartialEq)]
struct Outcome {
    report: LaunchReport,
    buffers: Vec<Vec<u8>>,
    globals: Vec<Vec<u8>>,
}

/// Runs `kernel` of `ptx` on `engine` with deterministic arguments: each
/// 8-byte word of a parameter of 8 bytes or more a buffer of random bytes
/// (pointers, and structs of pointers), each smaller one `scalar`.
fn run(ptx: &str, kernel: &str, engine: Engine, cfg: &LaunchConfig, scalar: u32) -> Outcome {
    let mem = DeviceMemory::new(MEMORY_BYTES);
    let mut program = Program::load(ptx, &mem).expect("fixture loads");
    program.set_engine(engine);
    let info = program
        .kernels()
        .iter()
        .find(|k| k.name == kernel)
        .expect("kernel exists")
        .clone();
    let mut rng = cumux_testkit::Rng(0x9e37_79b9_7f4a_7c15 ^ scalar as u64);
    let mut params = vec![0u8; info.params_bytes() as usize];
    let mut buffers = Vec::new();
    for p in &info.params {
        let at = p.offset as usize;
        if p.size >= 8 {
            for word in (at..at + p.size as usize).step_by(8) {
                let ptr = mem.alloc(BUFFER_BYTES as u64).expect("buffer");
                // by scalar: floats in [0.5, 2), any bits (NaNs, infinities,
                // negatives), or small non-negative ints
                let bytes: Vec<u8> = (0..BUFFER_BYTES)
                    .map(|i| match (i % 4, scalar) {
                        (3, 1) => 0x3f,
                        (3, 1000) => 0,
                        _ => rng.next_u64() as u8,
                    })
                    .collect();
                mem.write(ptr, &bytes).expect("upload");
                let end = (word + 8).min(at + p.size as usize);
                params[word..end].copy_from_slice(&ptr.to_le_bytes()[..end - word]);
                buffers.push(ptr);
            }
        } else {
            let v = (scalar as u64).to_le_bytes();
            let n = (p.size as usize).min(8);
            params[at..at + n].copy_from_slice(&v[..n]);
        }
    }
    let limits = LaunchLimits {
        per_block: 3_000_000,
        workers: 1,
        ..LaunchLimits::NONE
    };
    let report = program.launch_with(&mem, kernel, cfg, &params, &limits);
    let read = |ptr: u64, len: usize| {
        let mut out = vec![0u8; len];
        mem.read(ptr, &mut out).expect("download");
        out
    };
    let buffers = buffers.iter().map(|&b| read(b, BUFFER_BYTES)).collect();
    let globals = program
        .globals()
        .iter()
        .map(|g| read(g.ptr, g.size as usize))
        .collect();
    Outcome {
        report,
        buffers,
        globals,
    }
}

/// Runs every kernel of `ptx` the compiler takes on both engines under a
/// few launch shapes; returns (kernels compiled, kernels in all).
fn differential(name: &str, ptx: &str) -> (usize, usize) {
    let mem = DeviceMemory::new(MEMORY_BYTES);
    let program = Program::load(ptx, &mem).expect("loads");
    let names: Vec<String> = program.kernels().iter().map(|k| k.name.clone()).collect();
    let mut taken = 0;
    for kernel in &names {
        if let Err(why) = program.compiled(kernel) {
            eprintln!("{name}: {kernel} stays interpreted: {why}");
            continue;
        }
        let info = program
            .kernels()
            .iter()
            .find(|k| &k.name == kernel)
            .unwrap();
        let shapes: Vec<LaunchConfig> = match info.reqntid {
            Some(b) => vec![config([2, 2, 1], b, 0)],
            None => vec![
                config([3, 2, 1], [32, 4, 1], 0),
                config([2, 1, 1], [16, 16, 1], 1024),
                config([1, 1, 1], [37, 1, 1], 256),
            ],
        };
        for cfg in &shapes {
            for scalar in [1u32, 100, 1000] {
                let interp = run(ptx, kernel, Engine::Interpreter, cfg, scalar);
                let jit = run(ptx, kernel, Engine::Compiler, cfg, scalar);
                assert_eq!(
                    interp.report, jit.report,
                    "{name}: {kernel} under {cfg:?} with scalars {scalar}: reports differ"
                );
                assert!(
                    interp == jit,
                    "{name}: {kernel} under {cfg:?} with scalars {scalar}: memory differs"
                );
            }
        }
        taken += 1;
    }
    (taken, names.len())
}

#[test]
fn compiled_fixture_kernels_match_the_interpreter() {
    let dir = cumux_testkit::workspace_root().join("crates/ptx/tests/fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ptx"))
        .collect();
    files.sort();
    let (mut taken, mut total) = (0, 0);
    for f in files {
        let ptx = std::fs::read_to_string(&f).expect("fixture");
        let (t, n) = differential(&f.display().to_string(), &ptx);
        taken += t;
        total += n;
    }
    eprintln!("fixtures: {taken} of {total} kernels compiled and matched");
    assert!(taken > 0, "the compiler took no fixture kernel");
}

#[test]
fn compiled_corpus_kernels_match_the_interpreter() {
    let dir = cumux_testkit::corpus_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    let (mut taken, mut total) = (0, 0);
    for f in files {
        let ptx = cumux_testkit::compile_ptx(&f);
        let (t, n) = differential(&f.display().to_string(), &ptx);
        taken += t;
        total += n;
    }
    eprintln!("corpus: {taken} of {total} kernels compiled and matched");
    assert!(taken >= 10, "the compiler took only {taken} corpus kernels");
}

/// Groups of interchangeable PTX spellings: a mutant swaps one for another.
const SWAPS: &[&[&str]] = &[
    &[
        ".lt.", ".le.", ".gt.", ".ge.", ".eq.", ".ne.", ".lo.", ".hi.", ".ls.", ".hs.", ".ltu.",
        ".geu.", ".equ.", ".neu.", ".nan.", ".num.",
    ],
    &[
        "add.", "sub.", "mul.lo.", "min.", "max.", "and.", "or.", "xor.", "div.", "rem.",
    ],
    &["shl.", "shr."],
    &["mul.wide.", "mul.hi.", "mul.lo."],
    &["mad.lo.", "mad.hi.", "mad.wide."],
    &[".s32", ".u32", ".b32"],
    &[".s64", ".u64", ".b64"],
    &[".s16", ".u16", ".s8", ".u8"],
    &[".rn.", ".rz.", ".rm.", ".rp.", ".rn.ftz.", ".rn.sat."],
    &[".rni.", ".rzi.", ".rmi.", ".rpi."],
    &[".f32", ".f64"],
    &["neg.", "abs.", "not."],
];

/// Literals a mutant puts in place of another.
const LITERALS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "4",
    "7",
    "8",
    "15",
    "16",
    "31",
    "32",
    "33",
    "63",
    "64",
    "65",
    "255",
    "-1",
    "-2",
    "-33",
    "4096",
    "65535",
    "2147483647",
    "-2147483648",
    "0f7FC00000",
    "0f80000000",
    "0f7F800000",
    "0f3F800000",
    "0d7FF8000000000000",
];

/// `text` with one instruction line changed: a spelling of `SWAPS` or a
/// literal operand swapped for another.
fn mutate(text: &str, rng: &mut cumux_testkit::Rng) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let candidates: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| {
            let t = l.trim_start();
            t.ends_with(';')
                && !t.starts_with('.')
                && !t.starts_with("//")
                && !t.starts_with("ld.param")
        })
        .map(|(i, _)| i)
        .collect();
    if candidates.is_empty() {
        return text.to_string();
    }
    let at = rng.pick(&candidates);
    let line = lines[at].clone();
    let mut options: Vec<(usize, usize, &str)> = Vec::new();
    for group in SWAPS {
        for from in group.iter() {
            for (pos, _) in line.match_indices(from) {
                let to = rng.pick(group);
                options.push((pos, from.len(), to));
            }
        }
    }
    // literal operands: a token after ", " up to ',' or ';'
    let mut start = 0;
    while let Some(p) = line[start..].find(", ") {
        let from = start + p + 2;
        let end = line[from..]
            .find([',', ';', ']', '}'])
            .map_or(line.len(), |e| from + e);
        let token = &line[from..end];
        if token
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '-')
        {
            options.push((from, end - from, rng.pick(LITERALS)));
        }
        start = from;
    }
    if options.is_empty() {
        return text.to_string();
    }
    let (pos, len, to) = options[rng.below(options.len() as u64) as usize];
    lines[at] = format!("{}{}{}", &line[..pos], to, &line[pos + len..]);
    lines.join("\n")
}

/// Mutants of the fixtures (one to three instruction lines changed each):
/// every kernel of a mutant that loads and that the compiler takes runs on
/// both engines; `PTX_ENGINE_MUTANTS` sets how many mutants (default 120).
#[test]
fn mutated_fixture_kernels_match_the_interpreter() {
    let cases: u64 = std::env::var("PTX_ENGINE_MUTANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let dir = cumux_testkit::workspace_root().join("crates/ptx/tests/fixtures");
    let sources: Vec<String> = ["ops.ptx", "basic.ptx", "misc.ptx", "compiler_cases.ptx"]
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).expect("fixture"))
        .collect();
    let mut rng = cumux_testkit::Rng(0x5eed_1234_abcd_0001);
    let (mut loaded, mut compared) = (0, 0);
    for case in 0..cases {
        let mut text = sources[rng.below(sources.len() as u64) as usize].clone();
        for _ in 0..1 + rng.below(3) {
            text = mutate(&text, &mut rng);
        }
        let mem = DeviceMemory::new(MEMORY_BYTES);
        let Ok(program) = Program::load(&text, &mem) else {
            continue;
        };
        loaded += 1;
        let cfg = config([2, 1, 1], [40, 1, 1], 64);
        let scalar = [1u32, 100, 1000][case as usize % 3];
        for k in program.kernels() {
            if program.compiled(&k.name).is_err() || k.reqntid.is_some() {
                continue;
            }
            let interp = run(&text, &k.name, Engine::Interpreter, &cfg, scalar);
            let jit = run(&text, &k.name, Engine::Compiler, &cfg, scalar);
            if interp != jit {
                let path = std::env::temp_dir().join(format!("cumux-mutant-{case}.ptx"));
                let _ = std::fs::write(&path, &text);
                panic!(
                    "mutant {case} (saved to {}): {} differs between the engines:\n{:?}\n{:?}",
                    path.display(),
                    k.name,
                    interp.report,
                    jit.report
                );
            }
            compared += 1;
        }
    }
    eprintln!("{cases} mutants: {loaded} loaded, {compared} kernel runs compared");
    assert!(compared > 0, "no mutant ran");
}

#[test]
fn compiled_parity_kernels_match_the_interpreter() {
    let dir = cumux_testkit::workspace_root().join("tests/cuda/parity");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("parity programs")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    let (mut taken, mut total) = (0, 0);
    for f in files {
        let ptx = cumux_testkit::compile_ptx_with(&f, &["-arch=sm_80"]);
        let (t, n) = differential(&f.display().to_string(), &ptx);
        taken += t;
        total += n;
    }
    eprintln!("parity: {taken} of {total} kernels compiled and matched");
    assert!(taken > 0, "the compiler took no parity kernel");
}
