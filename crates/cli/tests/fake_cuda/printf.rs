//! Device printf in a shared context, on the fake GPU in a worker process
//! (issue 15), for `e2e_worker_fake_cuda`: what a session's kernel printed
//! comes back with the wait after its launch, never after that wait.

use std::path::PathBuf;

use cumux_protocol::{Call, ReplyBody, DEFAULT_STREAM};
use cumux_server::worker::device::{cuda_worker_devices, Sharing};
use cumux_server::Server;

use crate::common::{driver_session, fixture_scale, scale_launch};

/// Needs `CUMUX_WORKER_PRINTF=always`: every module prints, as far as the
/// shared context knows.
pub fn shared_printf_comes_with_its_wait(cumux: &str) {
    let shared = cuda_worker_devices(PathBuf::from(cumux), Sharing::Shared, None).unwrap();
    let server = Server::new(shared);
    let mut session = driver_session(&server, "printer");
    let Some(Ok(ReplyBody::Ptr(buf))) = session.handle(Call::MemAlloc {
        device: 0,
        bytes: 64,
    }) else {
        panic!("the allocation failed");
    };
    let scale = fixture_scale(&mut session);
    for n in 1..=3 {
        let launch = scale_launch(scale, DEFAULT_STREAM, buf, 2.0, n);
        assert!(session.handle(launch).is_none(), "a launch is unanswered");
        let synced = session.handle(Call::ContextSynchronize);
        assert!(matches!(synced, Some(Ok(_))), "{synced:?}");
        assert_eq!(
            String::from_utf8_lossy(&session.take_stdout()),
            format!("scale printed n={n}\n"),
            "launch {n}'s printf, with the wait after it"
        );
    }
    session.close();
}
