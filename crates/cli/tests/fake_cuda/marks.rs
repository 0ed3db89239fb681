//! Clients' marks (`Call::Mark`) on the fake GPU in worker processes, for
//! `e2e_worker_fake_cuda`, where every module prints (the fake driver prints
//! at each launch; `CUMUX_WORKER_PRINTF=always`): the worker, or a shared
//! context's view, leaves each mark out, so the client's wait asks the
//! server, which hands over the printf text with it. In a session's own
//! context and in a shared one; an event's mark and a synchronize's alike.

use std::os::fd::AsFd;
use std::sync::Arc;

use cumux_protocol::pinned::{create_memfd, HostMapping};
use cumux_protocol::{Call, ReplyBody, DEFAULT_STREAM};
use cumux_server::{Device, Server};
use cumux_testkit::fake_gpu::f32_bytes;

use crate::common::{driver_session, fixture_scale, scale_launch};

const PAGE: u64 = 4096;

pub fn marks_land_in_isolated_and_shared_contexts(
    isolated: &Arc<dyn Device>,
    shared: &Arc<dyn Device>,
) {
    for (name, device) in [("isolated", isolated), ("shared", shared)] {
        let server = Server::new(vec![Arc::clone(device)]);
        let mut session = driver_session(&server, "marks");
        let fd = create_memfd(PAGE).expect("a memfd");
        let page = HostMapping::map(fd.as_fd(), PAGE).expect("a mapping");
        session.give_fd(Ok(fd));
        let registered = session.handle(Call::HostRegister {
            base: page.as_ptr() as u64,
            bytes: PAGE,
            reached: false,
        });
        let Some(Ok(ReplyBody::Handle(region))) = registered else {
            panic!("{name}: the page did not register: {registered:?}");
        };
        let Some(Ok(ReplyBody::Handle(event))) = session.handle(Call::EventCreate { flags: 0 })
        else {
            panic!("{name}: no event");
        };
        let Some(Ok(ReplyBody::Ptr(buf))) = session.handle(Call::MemAlloc {
            device: 0,
            bytes: 16,
        }) else {
            panic!("{name}: the allocation failed");
        };
        let write = Call::MemcpyHtoD {
            dst: buf,
            data: f32_bytes(&[1.0; 4]),
            stream: None,
        };
        assert!(matches!(session.handle(write), Some(Ok(_))), "{name}");
        let scale = fixture_scale(&mut session);
        for value in 1..=3u64 {
            session.handle(scale_launch(scale, DEFAULT_STREAM, buf, 2.0, 4));
            let stream = DEFAULT_STREAM;
            session.handle(Call::EventRecord { event, stream });
            session.handle(Call::Mark {
                event: Some(event),
                stream,
                region,
                offset: 8,
                value,
            });
            let waited = session.handle(Call::EventSynchronize { event });
            assert!(matches!(waited, Some(Ok(_))), "{name}: {waited:?}");
            let printed = String::from_utf8_lossy(&session.take_stdout()).into_owned();
            assert!(printed.contains("scale printed"), "{name}: {printed:?}");
            let mark_at =
                |offset| u64::from_ne_bytes(page.bytes(offset, 8).unwrap().try_into().unwrap());
            assert_eq!(mark_at(8), 0, "{name}: record {value}'s mark behind printf");
            // A synchronize's mark (no event) too.
            session.handle(scale_launch(scale, DEFAULT_STREAM, buf, 2.0, 4));
            session.handle(Call::Mark {
                event: None,
                stream,
                region,
                offset: 16,
                value,
            });
            let waited = session.handle(Call::StreamSynchronize { stream });
            assert!(matches!(waited, Some(Ok(_))), "{name}: {waited:?}");
            let printed = String::from_utf8_lossy(&session.take_stdout()).into_owned();
            assert!(printed.contains("scale printed"), "{name}: {printed:?}");
            assert_eq!(
                mark_at(16),
                0,
                "{name}: synchronize {value}'s mark behind printf"
            );
        }
    }
}
