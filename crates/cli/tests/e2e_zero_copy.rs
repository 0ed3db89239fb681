//! Pinned host memory the device reaches at the client's own address, on a
//! GPU behind a worker (the fake libcuda): a memset, a kernel and a copy name
//! the client's pointer, as a program on unified addressing does (XLA's
//! redzone checker writes its result into pinned memory so), and the client
//! sees what they wrote. Outside the region, or once it is gone, the same
//! calls are refused.

mod common;

use std::os::fd::AsFd;

use cumux_protocol::pinned::{create_memfd, HostMapping};
use cumux_protocol::{Call, ReplyBody, DEFAULT_STREAM};
use cumux_testkit::fake_gpu::{f32_bytes, f32s, scale_params};
const BYTES: u64 = 4096;

#[test]
fn device_work_reaches_pinned_memory_at_the_clients_address() {
    let Some(server) = common::fake_gpu_server("zero-copy") else {
        return;
    };
    let mut session = common::driver_session(&server, "zero-copy");

    // The client's pinned memory: a memfd mapped here, registered at its address.
    let fd = create_memfd(BYTES).unwrap();
    let mine = HostMapping::map(fd.as_fd(), BYTES).unwrap();
    let base = mine.as_ptr() as u64;
    session.give_fd(Ok(fd.try_clone().unwrap()));
    let registered = session.handle(Call::HostRegister {
        base,
        bytes: BYTES,
        reached: false,
    });
    let Some(Ok(ReplyBody::Handle(region))) = registered else {
        panic!("not registered: {registered:?}")
    };
    let bytes = |offset: u64, len: u64| {
        // SAFETY: the test's own mapping, read while no device work runs.
        unsafe { mine.bytes_mut(offset, len) }.unwrap().to_vec()
    };

    // A memset by the client's pointer lands in the client's pages.
    assert_eq!(
        session.handle(common::memset_call(base + 64, 0x5a, 16)),
        Some(Ok(ReplyBody::Unit))
    );
    assert_eq!(bytes(64, 16), [0x5a; 16]);

    // A kernel given the pointer writes there.
    // SAFETY: as above.
    unsafe { mine.bytes_mut(0, 16) }
        .unwrap()
        .copy_from_slice(&f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
    let scale = common::fixture_scale(&mut session);
    let launch = Call::Launch {
        function: scale,
        grid: [1, 1, 1],
        block: [4, 1, 1],
        shared_bytes: 0,
        stream: DEFAULT_STREAM,
        params: scale_params(base, 2.0, 4),
        attributes: Vec::new(),
    };
    assert!(session.handle(launch).is_none());
    assert_eq!(
        session.handle(Call::ContextSynchronize),
        Some(Ok(ReplyBody::Unit))
    );
    // The fixture's `scale` adds its global (1) to the factor.
    assert_eq!(f32s(&bytes(0, 16)), [3.0, 6.0, 9.0, 12.0]);

    // A copy from the pointer reads the client's bytes.
    let read = session.handle(Call::MemcpyDtoH {
        src: base + 64,
        bytes: 16,
        stream: None,
    });
    assert_eq!(read, Some(Ok(ReplyBody::Data(vec![0x5a; 16]))));

    // Past the region's end, or once it is gone: refused, the pages untouched.
    assert!(common::refused(session.handle(common::memset_call(
        base + BYTES - 8,
        1,
        16
    ))));
    assert_eq!(
        session.handle(Call::HostUnregister { region }),
        Some(Ok(ReplyBody::Unit))
    );
    assert!(common::refused(session.handle(common::memset_call(
        base + 64,
        0,
        16
    ))));
    assert_eq!(bytes(64, 16), [0x5a; 16]);

    // Managed memory on a GPU is a region the device must reach by the
    // client's address: where it does, such a region is taken too.
    let fd = create_memfd(BYTES).unwrap();
    let managed = HostMapping::map(fd.as_fd(), BYTES).unwrap();
    let base = managed.as_ptr() as u64;
    session.give_fd(Ok(fd.try_clone().unwrap()));
    let registered = session.handle(Call::HostRegister {
        base,
        bytes: BYTES,
        reached: true,
    });
    assert!(
        matches!(registered, Some(Ok(ReplyBody::Handle(_)))),
        "{registered:?}"
    );
    assert_eq!(
        session.handle(common::memset_call(base + 8, 0x3c, 8)),
        Some(Ok(ReplyBody::Unit))
    );
    // SAFETY: the test's own mapping, read while no device work runs.
    let written = unsafe { managed.bytes_mut(8, 8) }.unwrap().to_vec();
    assert_eq!(written, [0x3c; 8]);
}
