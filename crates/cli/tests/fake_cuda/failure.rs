//! A GPU that breaks, on the fake GPU in worker processes (issue 17), for
//! `e2e_worker_fake_cuda`: a call answered with an uncorrectable ECC error
//! marks its device failed, which then takes no new program until an admin
//! marks it healthy again.

use std::path::PathBuf;
use std::sync::Arc;

use cumux_protocol::{codes, Call, ReplyBody};
use cumux_server::device_health::{Failover, OnFailure};
use cumux_server::session::Session;
use cumux_server::tenants::{TenantPolicy, TenantSettings};
use cumux_server::worker::device::{cuda_worker_devices, Sharing};
use cumux_server::{failover, Policy, Server};

use crate::common::driver_hello;

/// Runs last: it sets `FAKE_SYNC_ERROR` for every worker started after it.
pub fn an_ecc_error_marks_the_device_failed(cumux: &str) {
    let devices = cuda_worker_devices(PathBuf::from(cumux), Sharing::Isolated, None).unwrap();
    let failover = Failover {
        on_failure: OnFailure::Stay,
        reserve: None,
    };
    let server = Server::with_failover(
        devices,
        TenantPolicy::default(),
        vec![Policy::Fifo],
        failover,
    );
    let tenant = || Some(("t".to_string(), TenantSettings::default()));
    let open = |program: &str| Session::open(Arc::clone(&server), &driver_hello(program), tenant());
    // A healthy session first, whose worker does not fail.
    let mut healthy = open("healthy").unwrap();
    assert!(matches!(
        healthy.handle(Call::ContextSynchronize),
        Some(Ok(ReplyBody::Unit))
    ));
    std::env::set_var("FAKE_SYNC_ERROR", codes::ECC_UNCORRECTABLE.to_string());
    let mut broken = open("broken").unwrap();
    // Work queued on a stream, then the wait for it.
    let Some(Ok(ReplyBody::Ptr(buffer))) = broken.handle(Call::MemAlloc {
        device: 0,
        bytes: 256,
    }) else {
        panic!("the allocation failed");
    };
    let memset = Call::Memset {
        dst: buffer,
        value: 7,
        elem_bytes: 1,
        count: 256,
        pitch: 0,
        height: 1,
        stream: Some(cumux_protocol::DEFAULT_STREAM),
    };
    assert!(broken.handle(memset).is_none_or(|r| r.is_ok()));
    match broken.handle(Call::ContextSynchronize) {
        Some(Err(e)) => assert_eq!(e.code, codes::ECC_UNCORRECTABLE, "{e}"),
        other => panic!("the synchronize should fail with 214: {other:?}"),
    }
    let said = server.health().describe(0);
    assert!(
        said.starts_with("failed") && said.contains("by a call's error") && said.contains("214"),
        "{said}"
    );
    // No new program gets the device; one already there carries on.
    let e = open("after")
        .err()
        .expect("a failed device takes no new program");
    assert_eq!(e.code, codes::NO_DEVICE, "{e}");
    assert!(e.detail.contains("device 0 has failed: session"), "{e}");
    assert!(matches!(
        healthy.handle(Call::ContextSynchronize),
        Some(Ok(_))
    ));
    // Marked healthy by an admin, it takes programs again.
    std::env::remove_var("FAKE_SYNC_ERROR");
    let line = failover::recover_device(&server, 0).unwrap();
    assert!(line.contains("takes programs again"), "{line}");
    let mut again = open("again").unwrap();
    assert!(matches!(
        again.handle(Call::ContextSynchronize),
        Some(Ok(_))
    ));
    for session in [healthy, broken, again] {
        session.close();
    }
}
