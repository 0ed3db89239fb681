//! The launch window on a GPU behind a worker (the fake libcuda, its kernels
//! made slow with `FAKE_KERNEL_US`): a session that launches without
//! synchronizing is held once `MAX_PENDING_LAUNCHES` of its stream are
//! unfinished, instead of queueing as deep as the rings let it.

mod common;

use std::time::{Duration, Instant};

use cumux_protocol::{Call, ReplyBody, DEFAULT_STREAM};
use cumux_server::session::window::{MAX_PENDING_LAUNCHES, WINDOW_SIGNAL_EVERY};
/// How long each fake kernel takes.
const KERNEL: Duration = Duration::from_millis(2);
/// Launches past the window: each waits for one kernel at least.
const PAST_WINDOW: u64 = 300;

#[test]
fn launches_without_a_synchronize_wait_for_the_device() {
    // FAKE_KERNEL_US before the first worker starts: it inherits it.
    std::env::set_var("FAKE_KERNEL_US", KERNEL.as_micros().to_string());
    let Some(server) = common::fake_gpu_server("window") else {
        return;
    };
    let mut session = common::driver_session(&server, "never-synchronizes");
    let scale = common::fixture_scale(&mut session);
    let Some(Ok(ReplyBody::Ptr(buf))) = session.handle(Call::MemAlloc {
        device: 0,
        bytes: 64,
    }) else {
        panic!("no allocation")
    };
    let launches = MAX_PENDING_LAUNCHES + WINDOW_SIGNAL_EVERY + PAST_WINDOW;
    let started = Instant::now();
    for _ in 0..launches {
        let launch = common::scale_launch(scale, DEFAULT_STREAM, buf, 1.0, 0);
        assert!(session.handle(launch).is_none(), "a launch is unanswered");
    }
    let launching = started.elapsed();
    // Unheld, the launches only fill the worker's ring (milliseconds); held,
    // each past the window waited for a kernel to finish.
    let least = KERNEL * PAST_WINDOW as u32;
    assert!(
        launching >= least,
        "{launches} launches of {KERNEL:?} kernels returned in {launching:?}: nothing held them"
    );
    assert_eq!(
        session.handle(Call::ContextSynchronize),
        Some(Ok(ReplyBody::Unit))
    );
}
