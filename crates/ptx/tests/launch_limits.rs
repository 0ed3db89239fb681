//! What stops a launch before its end ([`LaunchLimits`]): a cancel flag set
//! from another thread stops a kernel that never ends, and the instruction
//! budget counts over the whole launch as well as per block.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::linear;
use cumux_ptx::*;

/// `spin()`: loops forever; `count(n)`: each thread loops `n` times.
const PTX: &str = r#"
.version 8.0
.target sm_75
.address_size 64

.visible .entry spin()
{
$L_spin:
    bra.uni $L_spin;
}

.visible .entry count(.param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<3>;
    ld.param.u32 %r1, [n];
    mov.u32 %r2, 0;
$L_loop:
    add.u32 %r2, %r2, 1;
    setp.lt.u32 %p1, %r2, %r1;
    @%p1 bra.uni $L_loop;
    ret;
}
"#;

fn program(mem: &DeviceMemory) -> Program {
    Program::load(PTX, mem).expect("the test PTX loads")
}

#[test]
fn a_kernel_that_never_ends_stops_once_cancelled_from_another_thread() {
    let mem = Arc::new(DeviceMemory::new(1 << 20));
    let cancel = Arc::new(AtomicBool::new(false));
    let (done, report) = mpsc::channel();
    let (launch_mem, launch_cancel) = (Arc::clone(&mem), Arc::clone(&cancel));
    std::thread::spawn(move || {
        let p = program(&launch_mem);
        let limits = LaunchLimits {
            cancel: Some(&launch_cancel),
            ..LaunchLimits::NONE
        };
        let _ = done.send(p.launch_with(&launch_mem, "spin", &linear(4, 64), &[], &limits));
    });
    // It runs, with no budget to stop it, until the flag is set.
    assert!(
        report.recv_timeout(Duration::from_millis(200)).is_err(),
        "an endless kernel ended by itself"
    );
    cancel.store(true, Ordering::Relaxed);
    let r = report
        .recv_timeout(Duration::from_secs(10))
        .expect("the cancelled launch never returned");
    let e = r.result.unwrap_err();
    assert!(matches!(e, Fault::Cancelled(_)), "{e}");
    assert_eq!(e.cu_code(), 719, "{e}");
    assert!(r.instructions > 0);
}

#[test]
fn a_cancelled_flag_stops_a_launch_before_its_first_block_and_an_unset_one_nothing() {
    let mem = DeviceMemory::new(1 << 20);
    let p = program(&mem);
    let set = AtomicBool::new(true);
    let cancelled = LaunchLimits {
        cancel: Some(&set),
        ..LaunchLimits::NONE
    };
    let r = p.launch_with(
        &mem,
        "count",
        &linear(2, 32),
        &10u32.to_le_bytes(),
        &cancelled,
    );
    assert!(
        matches!(r.result, Err(Fault::Cancelled(_))),
        "{:?}",
        r.result
    );
    assert_eq!(r.instructions, 0);
    let unset = AtomicBool::new(false);
    let running = LaunchLimits {
        cancel: Some(&unset),
        ..LaunchLimits::NONE
    };
    // longer than a check interval, so the flag is read inside the blocks too
    let n = (LAUNCH_CHECK_INTERVAL as u32) * 2;
    let r = p.launch_with(&mem, "count", &linear(2, 32), &n.to_le_bytes(), &running);
    assert_eq!(r.result, Ok(()));
}

#[test]
fn many_blocks_each_within_the_block_budget_fail_over_the_launch_budget() {
    let mem = DeviceMemory::new(1 << 20);
    let p = program(&mem);
    let params = 1000u32.to_le_bytes();
    let grid = linear(64, 32);
    let whole = p.launch(&mem, "count", &grid, &params);
    assert_eq!(whole.result, Ok(()));
    let total = whole.instructions;
    let per_block = total / 64;
    assert!(per_block > LAUNCH_CHECK_INTERVAL, "blocks check inside");
    let limited = |per_launch: u64| LaunchLimits {
        per_block: per_block * 2,
        per_launch,
        ..LaunchLimits::NONE
    };
    // The per-block budget alone lets every block run.
    let r = p.launch_with(&mem, "count", &grid, &params, &limited(u64::MAX));
    assert_eq!(r.result, Ok(()));
    // A launch fails exactly when its blocks together ran past the budget.
    let r = p.launch_with(&mem, "count", &grid, &params, &limited(total));
    assert_eq!(r.result, Ok(()));
    assert_eq!(r.instructions, total);
    for per_launch in [total - 1, total / 4, per_block * 2] {
        let r = p.launch_with(&mem, "count", &grid, &params, &limited(per_launch));
        let e = r.result.unwrap_err();
        assert_eq!(e.cu_code(), 702, "{e}");
        assert!(e.to_string().contains("per launch"), "{e}");
        assert!(r.instructions > per_launch);
    }
}

#[test]
fn the_block_budget_still_stops_a_block_at_its_own_limit() {
    let mem = DeviceMemory::new(1 << 20);
    let p = program(&mem);
    let r = p.launch_with(
        &mem,
        "spin",
        &linear(2, 32),
        &[],
        &LaunchLimits {
            per_block: 100_000,
            per_launch: 10_000_000,
            ..LaunchLimits::NONE
        },
    );
    let e = r.result.unwrap_err();
    assert_eq!(e.cu_code(), 702, "{e}");
    assert!(e.to_string().contains("per block"), "{e}");
}

/// `smid(out)`: each block writes the `%smid` it ran on to `out[block]`.
const SMID_PTX: &str = r#"
.version 8.0
.target sm_75
.address_size 64

.visible .entry smid(.param .u64 out)
{
    .reg .b32 %r<3>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %smid;
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r2;
    ret;
}
"#;

#[test]
fn a_launchs_blocks_run_on_the_workers_it_is_given() {
    let mem = DeviceMemory::new(1 << 20);
    let p = Program::load(SMID_PTX, &mem).expect("the test PTX loads");
    let blocks = 64usize;
    let out = mem.alloc(4 * blocks as u64).unwrap();
    for workers in [1usize, 3] {
        let limits = LaunchLimits {
            workers,
            ..LaunchLimits::NONE
        };
        let r = p.launch_with(
            &mem,
            "smid",
            &linear(blocks, 1),
            &out.to_le_bytes(),
            &limits,
        );
        assert_eq!(r.result, Ok(()), "{workers} workers");
        let mut bytes = vec![0u8; 4 * blocks];
        mem.read(out, &mut bytes).unwrap();
        let seen: Vec<u32> = bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(
            seen.iter().all(|&sm| (sm as usize) < workers),
            "{workers} workers: blocks ran on {seen:?}"
        );
    }
}

#[test]
fn a_lane_kernel_checks_its_budgets_in_place_and_stops_where_interpreted() {
    // blocks of whole groups of lanes, each thread's loop longer than a
    // check interval: the lane kernel checks at its backward branch and
    // goes on, or fails where the block's or the launch's budget ends
    let mem = DeviceMemory::new(1 << 20);
    let mut p = program(&mem);
    let params = 3000u32.to_le_bytes();
    let grid = linear(4, 64);
    let per_block_run = p.launch(&mem, "count", &grid, &params);
    assert_eq!(per_block_run.result, Ok(()));
    let total = per_block_run.instructions;
    assert!(total / 4 > 2 * LAUNCH_CHECK_INTERVAL, "blocks check inside");
    for limits in [
        LaunchLimits {
            per_block: total / 4 - 1,
            ..LaunchLimits::NONE
        },
        LaunchLimits {
            per_launch: total / 2,
            ..LaunchLimits::NONE
        },
        LaunchLimits {
            per_block: total / 4,
            per_launch: total,
            ..LaunchLimits::NONE
        },
    ] {
        let limits = LaunchLimits {
            workers: 1,
            ..limits
        };
        p.set_engine(Engine::Compiler);
        let jit = p.launch_with(&mem, "count", &grid, &params, &limits);
        p.set_engine(Engine::Interpreter);
        let interp = p.launch_with(&mem, "count", &grid, &params, &limits);
        assert_eq!(
            jit, interp,
            "budgets {} / {}",
            limits.per_block, limits.per_launch
        );
    }
}
