//! `fair` on an isolated GPU gives tenants the device in turns (issue 20), on the
//! fake GPU in worker processes, for `e2e_worker_fake_cuda`: two tenants queuing
//! launches and waiting at once both finish with right results, every launch
//! through the gate and ended by its completion signal.

use std::sync::Arc;

use cumux_protocol::{Call, ReplyBody, DEFAULT_STREAM};
use cumux_server::tenants::TenantPolicy;
use cumux_server::{Device, Server};
use cumux_testkit::fake_gpu::{f32_bytes, f32s};

use crate::common::{fixture_scale, scale_launch, tenant_session};

const LAUNCHES: u32 = 12;

/// `device` must be an isolated fake GPU (its sessions time-sliced).
pub fn two_tenants_take_turns_on_an_isolated_gpu(device: &Arc<dyn Device>) {
    assert!(device.time_slices_sessions());
    let server = Server::with_policy(
        vec![Arc::clone(device)],
        TenantPolicy::default(),
        cumux_server::gate::parse_policy("fair").expect("a policy"),
    );
    let gate = Arc::clone(server.gate_of(device).expect("fair builds a gate"));
    let before = gate.signalled();
    let tenants: Vec<_> = ["left", "right"]
        .into_iter()
        .map(|tenant| {
            let server = Arc::clone(&server);
            std::thread::spawn(move || {
                let mut session = tenant_session(&server, "turns", tenant);
                let Some(Ok(ReplyBody::Ptr(buf))) = session.handle(Call::MemAlloc {
                    device: 0,
                    bytes: 16,
                }) else {
                    panic!("{tenant}: the allocation failed");
                };
                let write = Call::MemcpyHtoD {
                    dst: buf,
                    data: f32_bytes(&[1.0, 1.0, 1.0, 1.0]),
                    stream: None,
                };
                assert!(matches!(session.handle(write), Some(Ok(_))));
                let scale = fixture_scale(&mut session);
                let read = |session: &mut cumux_server::session::Session| {
                    let sync = Call::StreamSynchronize {
                        stream: DEFAULT_STREAM,
                    };
                    assert!(matches!(session.handle(sync), Some(Ok(_))), "{tenant}");
                    let read = session.handle(Call::MemcpyDtoH {
                        src: buf,
                        bytes: 16,
                        stream: None,
                    });
                    let Some(Ok(ReplyBody::Data(bytes))) = read else {
                        panic!("{tenant}: the read failed: {read:?}");
                    };
                    f32s(&bytes)
                };
                // The fake's factor is 2 plus the module's global: learnt from one.
                assert!(session
                    .handle(scale_launch(scale, DEFAULT_STREAM, buf, 2.0, 1))
                    .is_none());
                let factor = read(&mut session)[0];
                for _ in 1..LAUNCHES {
                    let launch = scale_launch(scale, DEFAULT_STREAM, buf, 2.0, 1);
                    assert!(session.handle(launch).is_none(), "a launch is unanswered");
                }
                let values = read(&mut session);
                session.close();
                (factor, values)
            })
        })
        .collect();
    for tenant in tenants {
        let (factor, values) = tenant.join().expect("a tenant's thread");
        assert!(factor >= 2.0, "{factor}");
        let expected = factor.powi(LAUNCHES as i32);
        assert_eq!(values, [expected, 1.0, 1.0, 1.0], "every launch ran");
    }
    assert!(
        gate.signalled() - before >= u64::from(2 * LAUNCHES),
        "launches ended by their signals: {}",
        gate.signalled() - before
    );
    // Operators see the turns: in the status and the metrics.
    let status = cumux_server::server_status(&server, &cumux_server::status::StatusScope::Devices);
    let turns = status.devices[0].turns;
    assert!(turns >= 2, "both tenants had turns: {turns}");
    let text = cumux_server::metrics::render(&server).expect("metrics");
    assert!(
        text.contains(&format!("cumux_device_turns_total{{device=\"0\"}} {turns}")),
        "{text}"
    );
    assert!(text.contains("cumux_device_turn_idle_held_seconds_total{device=\"0\"}"));
}
