//! Every program of tests/cuda/corpus, built by nvcc and run unmodified through
//! `cumux run` against a `cumux serve --device cpu`: each must exit 0 and print
//! its PASS line (printf_kernel: its device printf lines too).

mod common;

use std::time::Duration;

use common::*;

/// How long one program may take on the CPU device before the test fails.
const LIMIT: Duration = Duration::from_secs(300);

fn run_corpus(name: &str) -> RunOutput {
    let program = corpus_program(name);
    let server = ServerProc::start(name);
    let out = server.run(&program, &[], LIMIT);
    server.assert_pass(&out, name);
    out
}

macro_rules! corpus_tests {
    ($($name:ident),* $(,)?) => {
        const COVERED: &[&str] = &[$(stringify!($name)),*];
        $(
            #[test]
            fn $name() {
                run_corpus(stringify!($name));
            }
        )*
    };
}

corpus_tests!(
    atomics_all,
    bitonic_sort,
    black_scholes,
    constant_and_device_globals,
    device_function,
    dynamic_shared,
    grid_3d,
    half_precision,
    histogram,
    math_funcs,
    matmul_tiled,
    nbody,
    out_of_bounds,
    prefix_scan,
    reduce_shfl,
    saxpy,
    transpose,
    vector_add,
    warp_vote,
);

#[test]
fn printf_kernel() {
    let out = run_corpus("printf_kernel");
    for line in [
        "block 0: int=7 float=1.250 str=first char=A big=1099511627776",
        "block 1: int=17 float=2.500 str=second char=B big=2199023255552",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == line),
            "missing {line:?}: {}",
            out.describe()
        );
    }
}

#[test]
fn every_corpus_program_is_covered() {
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(cumux_testkit::corpus_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "cu") {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            if stem != "printf_kernel" && !COVERED.contains(&stem.as_str()) {
                missing.push(stem);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "corpus programs without an end-to-end test: {missing:?}"
    );
}
