//! `%clock`, `%clock64` and `%globaltimer` in compiled code (issue 22): a
//! counter of the instructions the block's worker ran, monotonic, so a
//! kernel that spins until its clock passed a mark (NVIDIA's `clock_block`)
//! ends.

mod common;

use common::{linear, Device};
use cumux_ptx::{Engine, LaunchLimits};

/// Each thread spins until `%clock64` passed its start by `wait`, then
/// writes the clock's advance, `%globaltimer`'s, and `%clock` beside the
/// low half of `%clock64` read just before it.
const CLOCK_SPIN: &str = r#"
.version 7.5
.target sm_75
.address_size 64

.visible .entry clock_spin(.param .u64 out, .param .u64 wait)
{
    .reg .pred %p<2>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<16>;

    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [wait];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 32;
    add.s64 %rd4, %rd1, %rd3;
    mov.u64 %rd5, %clock64;
    mov.u64 %rd6, %globaltimer;
SPIN:
    mov.u64 %rd7, %clock64;
    sub.s64 %rd8, %rd7, %rd5;
    setp.lt.u64 %p1, %rd8, %rd2;
    @%p1 bra SPIN;
    mov.u64 %rd9, %globaltimer;
    sub.s64 %rd10, %rd9, %rd6;
    mov.u64 %rd11, %clock64;
    mov.u32 %r2, %clock;
    st.global.u64 [%rd4], %rd8;
    st.global.u64 [%rd4+8], %rd10;
    st.global.u64 [%rd4+16], %rd11;
    st.global.u32 [%rd4+24], %r2;
    ret;
}
"#;

#[test]
fn a_spin_until_the_clock_passed_a_mark_ends_compiled() {
    let dev = Device::load("clock_spin", CLOCK_SPIN, 1 << 24);
    if dev.program.engine() == Engine::Interpreter {
        return; // CUMUX_PTX_ENGINE chose the interpreter for everything
    }
    dev.program
        .compiled("clock_spin")
        .expect("the compiler takes the clocks");
    let (blocks, threads, wait) = (3usize, 64usize, 20_000u64);
    let out = dev.alloc(blocks * threads * 32);
    // a clock that stood still would spin into this budget
    let limits = LaunchLimits {
        per_block: 100_000_000,
        ..LaunchLimits::NONE
    };
    let report = dev.launch_limited(
        "clock_spin",
        linear(blocks, threads),
        &[&out, &wait],
        &limits,
    );
    report.result.expect("every spin ends");
    let got: Vec<u64> = dev.download(out, threads * 4);
    for t in 0..threads {
        let [clock, timer, clock64, clock32] = [0, 1, 2, 3].map(|k| got[t * 4 + k]);
        assert!(clock >= wait, "thread {t}: %clock64 advanced {clock}");
        assert!(timer >= clock, "thread {t}: %globaltimer advanced {timer}");
        // `%clock` is the low half of the count (far below 2^32 here), an
        // instruction or two later (of the up to 4 threads run in step)
        let later = clock32.wrapping_sub(clock64);
        assert!(
            (1..=8).contains(&later),
            "thread {t}: {clock64} then {clock32}"
        );
    }
}
