//! A `shared` context outlives its sessions, so each session's end must give
//! back every driver object it made there; counted by the fake libcuda.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cumux_protocol::{Call, Handle, ReplyBody, DEFAULT_STREAM};
use cumux_server::session::Session;
use cumux_server::worker::device::{cuda_worker_devices, Sharing};
use cumux_testkit::fake_gpu::{fake_libcuda, remove_live_reports};

const CUMUX: &str = env!("CARGO_BIN_EXE_cumux");

/// The fake's live objects, as its report file last said.
fn live(report: &Path) -> String {
    std::fs::read_to_string(report)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// A call's answer; `Unit` for a queued call the session answers later.
fn answer(session: &mut Session, call: Call) -> ReplyBody {
    match session.handle(call) {
        Some(Ok(reply)) => reply,
        None => ReplyBody::Unit,
        Some(Err(e)) => panic!("{e}"),
    }
}

/// One program's worth of work: memory, a module, streams and events of its
/// own, kernels on them and on its default stream, a wait across streams.
fn a_program(server: &Arc<cumux_server::Server>, n: u64) {
    let mut session = common::tenant_session(server, &format!("program-{n}"), &format!("t{n}"));
    let ReplyBody::Ptr(buf) = answer(
        &mut session,
        Call::MemAlloc {
            device: 0,
            bytes: 256,
        },
    ) else {
        panic!("no pointer")
    };
    let scale = common::fixture_scale(&mut session);
    let stream = match answer(
        &mut session,
        Call::StreamCreate {
            flags: 1,
            priority: 0,
        },
    ) {
        ReplyBody::Handle(h) => h,
        other => panic!("{other:?}"),
    };
    let event = match answer(&mut session, Call::EventCreate { flags: 2 }) {
        ReplyBody::Handle(h) => h,
        other => panic!("{other:?}"),
    };
    let launch = |stream: Handle| common::scale_launch(scale, stream, buf, 2.0, 8);
    answer(&mut session, launch(stream));
    answer(&mut session, Call::EventRecord { event, stream });
    answer(
        &mut session,
        Call::StreamWaitEvent {
            stream: DEFAULT_STREAM,
            event,
        },
    );
    answer(&mut session, launch(DEFAULT_STREAM));
    answer(&mut session, Call::ContextSynchronize);
    // Left for the teardown: the allocation, the module, the stream, the event.
    session.close();
}

#[test]
fn a_shared_context_keeps_nothing_of_ended_sessions() {
    let Some(fake) = fake_libcuda("teardown", true) else {
        eprintln!("no C compiler: skipping");
        return;
    };
    let report: PathBuf =
        std::env::temp_dir().join(format!("cumux-teardown-live-{}.txt", std::process::id()));
    // The only test of this binary: the environment is ours to set.
    std::env::set_var("CUMUX_REAL_LIBCUDA", &fake);
    std::env::set_var("FAKE_LIVE_REPORT", &report);
    std::env::set_var("CUMUX_WORKER_SPARES", "0");
    let shared = cuda_worker_devices(PathBuf::from(CUMUX), Sharing::Shared, None).unwrap();
    let server = cumux_server::Server::new(shared.clone());

    // The first program starts the worker and its context; what is left
    // after it is what the context keeps for itself.
    a_program(&server, 0);
    let settle = || {
        // The worker frees asynchronously to the session's close.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = live(&report);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            let now = live(&report);
            if now == last {
                return now;
            }
            last = now;
        }
        last
    };
    let kept = settle();
    assert!(
        kept.contains("allocations 0 ") && kept.contains("modules 0"),
        "an ended session left memory or modules in the shared context: {kept}"
    );
    for n in 1..=4 {
        a_program(&server, n);
    }
    let after = settle();
    assert_eq!(
        after, kept,
        "four more sessions left driver objects behind in the shared context"
    );
    drop(server);
    drop(shared);
    let _ = std::fs::remove_file(fake);
    remove_live_reports(&report);
}
