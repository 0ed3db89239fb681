//! Calls to `.func`s on the compiler (issue 22): `fixtures/calls.ptx` (nvcc's
//! PTX of `calls.cu`, whose device functions are `__noinline__`) is compiled
//! with its calls inlined and gives the interpreter's results, counts and faults.

mod common;

use common::config;
use cumux_ptx::{DeviceMemory, Engine, LaunchConfig, LaunchLimits, LaunchReport, Program};

/// The outputs of one launch of `calls` over `n` inputs on `engine`.
struct Run {
    report: LaunchReport,
    out: Vec<f32>,
    iout: Vec<i32>,
}

fn run(engine: Engine, cfg: LaunchConfig, n: i32, workers: usize) -> Run {
    let mem = DeviceMemory::new(16 << 20);
    let mut program = Program::load(&common::fixture("calls.ptx"), &mem).expect("calls.ptx loads");
    program.set_engine(engine);
    if engine == Engine::Compiler {
        program
            .compiled("calls")
            .expect("the compiler takes the kernel and its calls");
    }
    let threads = (cfg.grid[0] * cfg.block[0]) as usize;
    let input: Vec<u8> = (0..threads + 16)
        .flat_map(|i| ((i as f32 * 0.37).sin() * 4.0).to_le_bytes())
        .collect();
    let din = mem.alloc(input.len() as u64).expect("input");
    mem.write(din, &input).expect("upload");
    let dout = mem.alloc(threads as u64 * 12).expect("out");
    let diout = mem.alloc(threads as u64 * 8).expect("iout");
    let mut params = Vec::new();
    for p in [din, dout, diout] {
        params.extend_from_slice(&p.to_le_bytes());
    }
    params.extend_from_slice(&n.to_le_bytes());
    let limits = LaunchLimits {
        workers,
        ..LaunchLimits::NONE
    };
    let report = program.launch_with(&mem, "calls", &cfg, &params, &limits);
    let mut out = vec![0u8; threads * 12];
    let mut iout = vec![0u8; threads * 8];
    mem.read(dout, &mut out).expect("download");
    mem.read(diout, &mut iout).expect("download");
    let words = |b: &[u8]| -> Vec<[u8; 4]> {
        b.chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect()
    };
    Run {
        report,
        out: words(&out).into_iter().map(f32::from_le_bytes).collect(),
        iout: words(&iout).into_iter().map(i32::from_le_bytes).collect(),
    }
}

fn twist(a: i32, b: i32) -> i32 {
    a.wrapping_mul(31) ^ (b >> 2)
}

#[test]
fn inlined_calls_give_the_interpreters_results() {
    for (grid, block, n) in [(2, 64, 100), (3, 256, 7), (1, 32, 1)] {
        let cfg = config([grid, 1, 1], [block, 1, 1], 0);
        let interp = run(Engine::Interpreter, cfg, n, 1);
        for workers in [1, 2] {
            let jit = run(Engine::Compiler, cfg, n, workers);
            assert_eq!(interp.report, jit.report, "{cfg:?}: reports");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&interp.out), bits(&jit.out), "{cfg:?}: floats");
            assert_eq!(interp.iout, jit.iout, "{cfg:?}: ints");
        }
        interp.report.result.expect("the kernel runs");
        for g in 0..(grid * block) as i32 {
            let t = g % block as i32;
            let mut k: i32 = (0..3)
                .map(|i| twist(g + i, t - i))
                .fold(0, i32::wrapping_add);
            if t & 1 == 1 {
                k = k.wrapping_add(twist(k, g));
            }
            assert_eq!(interp.iout[2 * g as usize], k, "thread {g}'s nested calls");
        }
    }
}

#[test]
fn recursion_and_indirect_calls_stay_on_the_interpreter() {
    let mem = DeviceMemory::new(1 << 20);
    let basic = include_str!("fixtures/basic.ptx");
    let program = Program::load(basic, &mem).expect("basic.ptx loads");
    let why = program.compiled("fib_kernel").expect_err("fib recurses");
    assert!(why.contains("recursive call"), "{why}");
    let misc = include_str!("fixtures/misc.ptx");
    let program = Program::load(misc, &mem).expect("misc.ptx loads");
    let why = program
        .compiled("misc")
        .expect_err("misc calls through a table");
    assert!(why.contains("indirect call"), "{why}");
}

/// A kernel that calls a `.func` in an endless loop.
const SPIN: &str = r#"
.version 8.5
.target sm_75
.address_size 64
.func (.param .b32 r) step(.param .b32 a)
{
    .reg .b32 %r<3>;
    ld.param.u32 %r1, [a];
    add.s32 %r2, %r1, 1;
    st.param.b32 [r], %r2;
    ret;
}
.visible .entry spin(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, 0;
$L:
    {
    .param .b32 a0;
    .param .b32 r0;
    st.param.b32 [a0], %r1;
    call.uni (r0), step, (a0);
    ld.param.b32 %r1, [r0];
    }
    st.global.u32 [%rd1], %r1;
    bra $L;
}
"#;

#[test]
fn a_loop_of_calls_past_the_block_budget_times_out_at_the_interpreters_count() {
    let run = |engine: Engine, per_block: u64| {
        let mem = DeviceMemory::new(1 << 20);
        let mut program = Program::load(SPIN, &mem).expect("spin loads");
        program.set_engine(engine);
        if engine == Engine::Compiler {
            program.compiled("spin").expect("the compiler takes it");
        }
        let out = mem.alloc(64).expect("out");
        let limits = LaunchLimits {
            per_block,
            workers: 1,
            ..LaunchLimits::NONE
        };
        let report = program.launch_with(
            &mem,
            "spin",
            &config([1, 1, 1], [8, 1, 1], 0),
            &out.to_le_bytes(),
            &limits,
        );
        let mut word = [0u8; 4];
        mem.read(out, &mut word).expect("download");
        (report, word)
    };
    for per_block in [1_000, 1_003, 250_000] {
        let interp = run(Engine::Interpreter, per_block);
        let jit = run(Engine::Compiler, per_block);
        assert_eq!(interp, jit, "a budget of {per_block}");
        assert!(interp.0.result.is_err(), "the loop never ends");
    }
}
