//! Volatile accesses in compiled code (issue 22): blocks that wait for
//! another block's flag (CUB's decoupled look-back), spins on a flag a later
//! warp sets, and warp-synchronous code through volatile shared memory.

mod common;

use common::{linear, Device};
use cumux_ptx::{Engine, LaunchLimits};

/// Block `b` sums its tile, waits until block `b - 1` published the
/// inclusive prefix of the tiles before it (`status[b - 1]`, bit 31 the
/// flag), publishes its own, and each thread writes the sum of the tiles
/// before its block plus its element. The wait is a volatile load in a
/// loop, as CUB's tile status polls are.
const CHAINED_SCAN: &str = r#"
.version 7.5
.target sm_75
.address_size 64

.visible .entry chained_scan(.param .u64 in, .param .u64 status, .param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<16>;
    .reg .b64 %rd<12>;
    .shared .align 4 .u32 tile_sum;
    .shared .align 4 .u32 before;

    ld.param.u64 %rd1, [in];
    ld.param.u64 %rd2, [status];
    ld.param.u64 %rd3, [out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    cvta.to.global.u64 %rd3, %rd3;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r2, %r3, %r1;
    mul.wide.u32 %rd4, %r4, 4;
    add.s64 %rd5, %rd1, %rd4;
    ld.global.u32 %r5, [%rd5];
    setp.eq.u32 %p1, %r1, 0;
    @%p1 st.shared.u32 [tile_sum], 0;
    bar.sync 0;
    atom.shared.add.u32 %r6, [tile_sum], %r5;
    bar.sync 0;
    @!%p1 bra AFTER;
    ld.shared.u32 %r7, [tile_sum];
    mov.u32 %r8, 0;
    mul.wide.u32 %rd6, %r2, 4;
    add.s64 %rd7, %rd2, %rd6;
    setp.eq.u32 %p2, %r2, 0;
    @%p2 bra PUBLISH;
SPIN:
    ld.volatile.global.u32 %r9, [%rd7+-4];
    setp.lt.s32 %p3, %r9, 0;
    @!%p3 bra SPIN;
    and.b32 %r8, %r9, 2147483647;
PUBLISH:
    st.shared.u32 [before], %r8;
    add.u32 %r10, %r8, %r7;
    or.b32 %r11, %r10, -2147483648;
    st.volatile.global.u32 [%rd7], %r11;
AFTER:
    bar.sync 0;
    ld.shared.u32 %r12, [before];
    add.u32 %r13, %r12, %r5;
    add.s64 %rd9, %rd3, %rd4;
    st.global.u32 [%rd9], %r13;
    ret;
}
"#;

/// Whether `CUMUX_PTX_ENGINE` chose the interpreter for everything (the
/// tests below are about the compiler).
fn interpreter_only(dev: &Device) -> bool {
    dev.program.engine() == Engine::Interpreter
}

#[test]
fn blocks_waiting_for_the_block_before_them_run_compiled_on_many_workers() {
    let dev = Device::load("chained_scan", CHAINED_SCAN, 1 << 26);
    if interpreter_only(&dev) {
        return;
    }
    // the engine: compiled, not left to the interpreter for its volatile
    // accesses (as it was)
    dev.program
        .compiled("chained_scan")
        .expect("the compiler takes volatile global accesses");
    let (blocks, threads) = (1500usize, 64usize);
    let input: Vec<u32> = (0..blocks * threads).map(|i| (i % 7) as u32).collect();
    let tile: Vec<u32> = input.chunks(threads).map(|c| c.iter().sum()).collect();
    let din = dev.upload(&input);
    // more workers than this machine's cores too: a spinning block yields
    // to the one it waits for
    for workers in [1, 2, 3, 8] {
        let status = dev.alloc(blocks * 4);
        let out = dev.alloc(blocks * threads * 4);
        let limits = LaunchLimits {
            workers,
            per_block: 1 << 34,
            ..LaunchLimits::NONE
        };
        let report = dev.launch_limited(
            "chained_scan",
            linear(blocks, threads),
            &[&din, &status, &out],
            &limits,
        );
        report.result.expect("the scan finishes");
        let got: Vec<u32> = dev.download(out, blocks * threads);
        let mut before = 0u32;
        for (b, sum) in tile.iter().enumerate() {
            for t in 0..threads {
                let i = b * threads + t;
                assert_eq!(
                    got[i],
                    before + input[i],
                    "{workers} workers: block {b} thread {t}"
                );
            }
            before += sum;
        }
        let flags: Vec<u32> = dev.download(status, blocks);
        assert!(
            flags.iter().all(|f| f >> 31 == 1),
            "{workers} workers: every block published"
        );
    }
}

/// Warp 0's first lane spins on a flag (a volatile load in a loop) that
/// warp 1's first lane sets, with no barrier between: read once, the
/// spin would never end. `spin_global` polls global memory (a flag per
/// block), `spin_shared` the block's shared memory.
const SPINS: &str = r#"
.version 7.5
.target sm_75
.address_size 64

.visible .entry spin_global(.param .u64 flags, .param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [flags];
    ld.param.u64 %rd2, [out];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd4, %rd1, %rd3;
    add.s64 %rd5, %rd2, %rd3;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra SPIN;
    setp.eq.u32 %p2, %r1, 32;
    @!%p2 bra DONE;
    add.u32 %r3, %r2, 1000;
    st.volatile.global.u32 [%rd4], %r3;
    bra DONE;
SPIN:
    ld.volatile.global.u32 %r4, [%rd4];
    setp.eq.u32 %p3, %r4, 0;
    @%p3 bra SPIN;
    st.global.u32 [%rd5], %r4;
DONE:
    ret;
}

.visible .entry spin_shared(.param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    .shared .align 4 .u32 flag;

    ld.param.u64 %rd2, [out];
    cvta.to.global.u64 %rd2, %rd2;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mul.wide.u32 %rd3, %r2, 4;
    add.s64 %rd5, %rd2, %rd3;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra SPIN;
    setp.eq.u32 %p2, %r1, 32;
    @!%p2 bra DONE;
    add.u32 %r3, %r2, 1000;
    st.volatile.shared.u32 [flag], %r3;
    bra DONE;
SPIN:
    ld.volatile.shared.u32 %r4, [flag];
    setp.eq.u32 %p3, %r4, 0;
    @%p3 bra SPIN;
    st.global.u32 [%rd5], %r4;
DONE:
    ret;
}
"#;

#[test]
fn a_spin_on_a_flag_a_later_warp_sets_ends() {
    let dev = Device::load("spins", SPINS, 1 << 24);
    if interpreter_only(&dev) {
        return;
    }
    let blocks = 6usize;
    for kernel in ["spin_global", "spin_shared"] {
        dev.program
            .compiled(kernel)
            .unwrap_or_else(|why| panic!("{kernel} stays interpreted: {why}"));
        let flags = dev.alloc(blocks * 4);
        let out = dev.alloc(blocks * 4);
        // a spin that never saw the flag would run into this budget
        let limits = LaunchLimits {
            per_block: 50_000_000,
            workers: 2,
            ..LaunchLimits::NONE
        };
        let args: Vec<&dyn common::KernelArg> = match kernel {
            "spin_global" => vec![&flags, &out],
            _ => vec![&out],
        };
        let report = dev.launch_limited(kernel, linear(blocks, 64), &args, &limits);
        report
            .result
            .unwrap_or_else(|e| panic!("{kernel}: the spin did not end: {e}"));
        let got: Vec<u32> = dev.download(out, blocks);
        assert_eq!(
            got,
            (1000..1000 + blocks as u32).collect::<Vec<_>>(),
            "{kernel}"
        );
    }
}

/// A thread spinning until a later thread of its block sets a flag lets
/// that thread run after a short while: the block's instructions stay near
/// its threads' own work, not a whole check interval (65,536) of spinning.
#[test]
fn a_spin_on_a_later_threads_flag_yields_soon() {
    let Some((report, got)) = one_block(SPINS, "spin_shared", 1024) else {
        return;
    };
    assert_eq!(got, 1000);
    assert!(
        report.instructions < 20_000,
        "{} instructions for 1,024 threads' few each and one wait",
        report.instructions
    );
}

/// Thread 0 sleeps in a loop until the block's last thread sets a flag:
/// `nanosleep` lets the others run at once, not after its sleeps (on a GPU
/// they run meanwhile), so the loop goes round once.
const SLEEPS: &str = r#"
.version 7.5
.target sm_75
.address_size 64

.visible .entry spin_sleep(.param .u64 out)
{
    .reg .pred %p<4>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<4>;
    .shared .align 4 .u32 flag;

    ld.param.u64 %rd1, [out];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ntid.x;
    add.u32 %r2, %r2, -1;
    setp.eq.u32 %p1, %r1, %r2;
    @!%p1 bra WAITER;
    st.volatile.shared.u32 [flag], 1;
    bra DONE;
WAITER:
    setp.ne.u32 %p2, %r1, 0;
    @%p2 bra DONE;
    mov.u32 %r3, 0;
    mov.u32 %r5, 100000;
SPIN:
    ld.volatile.shared.u32 %r4, [flag];
    setp.ne.u32 %p3, %r4, 0;
    @%p3 bra SEEN;
    nanosleep.u32 %r5;
    add.u32 %r3, %r3, 1;
    bra SPIN;
SEEN:
    st.global.u32 [%rd1], %r3;
DONE:
    ret;
}
"#;

#[test]
fn a_sleeping_spin_lets_its_blocks_other_threads_run_first() {
    let Some((_, rounds)) = one_block(SLEEPS, "spin_sleep", 256) else {
        return;
    };
    assert_eq!(rounds, 1, "sleeps before the flag was seen");
}

/// One block of `threads` of `kernel` (of module `ptx`, its one parameter
/// the word it writes) on one worker, compiled: its report and that word;
/// `None` where `CUMUX_PTX_ENGINE` chose the interpreter.
fn one_block(ptx: &str, kernel: &str, threads: usize) -> Option<(cumux_ptx::LaunchReport, u32)> {
    let dev = Device::load(kernel, ptx, 1 << 24);
    if interpreter_only(&dev) {
        return None;
    }
    let out = dev.alloc(4);
    let limits = LaunchLimits {
        workers: 1,
        ..LaunchLimits::NONE
    };
    let report = dev.launch_limited(kernel, linear(1, threads), &[&out], &limits);
    report.result.clone().expect("the spin ends");
    Some((report, dev.download::<u32>(out, 1)[0]))
}
