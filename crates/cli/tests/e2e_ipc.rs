//! Device memory shared between programs through workers on the fake GPU.
//! `cuIpc*MemHandle`: a handle one program's session gives out opens in
//! another program's session of the same tenant, whose calls may then name
//! that memory until it closes it; a forged handle, another tenant's session,
//! and a handle whose exporter has gone open nothing. Shareable physical
//! memory (`cuMemExportToShareableHandle`): the descriptor the worker exports
//! comes back with the reply, and another session imports it and reads what
//! the exporter wrote (the fake's physical memory is a memfd).

mod common;

use cumux_protocol::vmm::{ACCESS_READWRITE, HANDLE_TYPE_POSIX_FD};
use cumux_protocol::{Call, ClientRole, Hello, ReplyBody, VmmCall, MAGIC, PROTOCOL_VERSION};
use cumux_server::session::Session;
use cumux_server::tenants::TenantSettings;

/// A session of `tenant`.
fn session_of(server: &std::sync::Arc<cumux_server::Server>, tenant: &str) -> Session {
    let hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        pid: std::process::id(),
        role: ClientRole::Driver,
        program: "ipc".into(),
        tenant: Some(tenant.into()),
        token: None,
        shm: false,
        visible_devices: None,
        join: None,
        resume: None,
        lane: None,
    };
    let settings = Some((tenant.to_string(), TenantSettings::default()));
    Session::open(std::sync::Arc::clone(server), &hello, settings).expect("a session")
}

#[test]
fn a_memory_handle_opens_in_another_program_of_its_tenant_only() {
    let Some(server) = common::fake_gpu_server("ipc") else {
        return;
    };
    let mut exporter = common::driver_session(&server, "exporter");
    let mut opener = common::driver_session(&server, "opener");
    let mut stranger = session_of(&server, "u");

    let Some(Ok(ReplyBody::Ptr(ptr))) = exporter.handle(Call::MemAlloc {
        device: 0,
        bytes: 4096,
    }) else {
        panic!("no allocation")
    };
    // Not this session's memory: no handle.
    assert!(common::refused(
        exporter.handle(Call::IpcGetMemHandle { ptr: ptr + 8192 })
    ));
    let got = exporter.handle(Call::IpcGetMemHandle { ptr: ptr + 128 });
    let Some(Ok(ReplyBody::Data(handle))) = got else {
        panic!("no handle: {got:?}")
    };
    assert_eq!(handle.len(), 64);

    // Another tenant, a forged handle, a short one: nothing opens.
    let open = |handle: Vec<u8>| Call::IpcOpenMemHandle { handle, flags: 1 };
    assert!(common::refused(stranger.handle(open(handle.clone()))));
    let mut forged = handle.clone();
    forged[20] ^= 0x40;
    assert!(common::refused(opener.handle(open(forged))));
    assert!(common::refused(opener.handle(open(handle[..32].to_vec()))));

    // The same tenant's other program opens it, and may name it until it closes it.
    let opened = opener.handle(open(handle.clone()));
    let Some(Ok(ReplyBody::Range { base, size })) = opened else {
        panic!("not opened: {opened:?}")
    };
    assert_eq!(size, 4096);
    assert_eq!(
        opener.handle(common::memset_call(base, 7, 4096)),
        Some(Ok(ReplyBody::Unit))
    );
    assert!(
        common::refused(opener.handle(common::memset_call(base, 7, 4097))),
        "past its end"
    );
    assert_eq!(
        opener.handle(Call::IpcCloseMemHandle { ptr: base }),
        Some(Ok(ReplyBody::Unit))
    );
    assert!(
        common::refused(opener.handle(common::memset_call(base, 7, 16))),
        "closed"
    );
    assert!(common::refused(
        opener.handle(Call::IpcCloseMemHandle { ptr: base })
    ));
    // Not a free of the opener's own.
    let again = opener.handle(open(handle.clone()));
    let Some(Ok(ReplyBody::Range { base, .. })) = again else {
        panic!("not opened again: {again:?}")
    };
    assert!(common::refused(opener.handle(Call::MemFree { ptr: base })));
    // The opener ends with it open: its worker closes it.
    opener.close();

    // Once the exporting session is gone, its handles open nothing.
    exporter.close();
    let mut late = common::driver_session(&server, "late");
    assert!(common::refused(late.handle(open(handle))));
    late.close();
    stranger.close();
    shareable_physical_memory_moves_between_sessions(&server);
    events_are_shared_between_programs_of_one_tenant(&server);
}

fn events_are_shared_between_programs_of_one_tenant(server: &std::sync::Arc<cumux_server::Server>) {
    let mut exporter = common::driver_session(server, "event-exporter");
    let mut opener = common::driver_session(server, "event-opener");
    let mut stranger = session_of(server, "u");
    let create = |flags| Call::EventCreate { flags };
    let Some(Ok(ReplyBody::Handle(timed))) = exporter.handle(create(0)) else {
        panic!("no event")
    };
    // Only an event made interprocess and without timing has a handle.
    let get = |event| Call::IpcGetEventHandle { event };
    assert!(common::refused(exporter.handle(get(timed))));
    let Some(Ok(ReplyBody::Handle(shared))) = exporter.handle(create(0x2 | 0x4)) else {
        panic!("no interprocess event")
    };
    let record = Call::EventRecord {
        event: shared,
        stream: cumux_protocol::DEFAULT_STREAM,
    };
    assert!(exporter.handle(record).is_none());
    let got = exporter.handle(get(shared));
    let Some(Ok(ReplyBody::Data(handle))) = got else {
        panic!("no handle: {got:?}")
    };
    let open = |handle: Vec<u8>| Call::IpcOpenEventHandle { handle };
    assert!(
        common::refused(stranger.handle(open(handle.clone()))),
        "another tenant"
    );
    let mut forged = handle.clone();
    forged[9] ^= 1;
    assert!(common::refused(opener.handle(open(forged))));
    // A memory handle's bytes do not open as an event.
    let Some(Ok(ReplyBody::Ptr(ptr))) = exporter.handle(Call::MemAlloc {
        device: 0,
        bytes: 256,
    }) else {
        panic!("no allocation")
    };
    let Some(Ok(ReplyBody::Data(memory))) = exporter.handle(Call::IpcGetMemHandle { ptr }) else {
        panic!("no memory handle")
    };
    assert!(common::refused(opener.handle(open(memory))));
    let opened = opener.handle(open(handle.clone()));
    let Some(Ok(ReplyBody::Handle(event))) = opened else {
        panic!("not opened: {opened:?}")
    };
    let wait = Call::StreamWaitEvent {
        stream: cumux_protocol::DEFAULT_STREAM,
        event,
    };
    assert!(opener.handle(wait).is_none());
    assert_eq!(
        opener.handle(Call::EventSynchronize { event }),
        Some(Ok(ReplyBody::Unit))
    );
    assert_eq!(
        opener.handle(Call::EventDestroy { event }),
        Some(Ok(ReplyBody::Unit))
    );
    exporter.close();
    assert!(
        common::refused(opener.handle(open(handle))),
        "its exporter is gone"
    );
    opener.close();
    stranger.close();
}

/// Maps all of `handle` (`size` bytes) at a fresh reservation of `session`.
fn map_whole(session: &mut Session, handle: u64, size: u64) -> u64 {
    let reserved = session.handle(Call::Vmm(VmmCall::Reserve {
        size,
        alignment: 0,
        hint: 0,
    }));
    let Some(Ok(ReplyBody::Ptr(base))) = reserved else {
        panic!("no reservation: {reserved:?}")
    };
    let map = VmmCall::Map {
        ptr: base,
        size,
        offset: 0,
        handle,
    };
    assert_eq!(session.handle(Call::Vmm(map)), Some(Ok(ReplyBody::Unit)));
    let access = VmmCall::SetAccess {
        ptr: base,
        size,
        device: 0,
        flags: ACCESS_READWRITE,
    };
    assert_eq!(session.handle(Call::Vmm(access)), Some(Ok(ReplyBody::Unit)));
    base
}

fn shareable_physical_memory_moves_between_sessions(server: &std::sync::Arc<cumux_server::Server>) {
    let mut exporter = common::driver_session(server, "vmm-exporter");
    let mut importer = common::driver_session(server, "vmm-importer");
    let granule = match exporter.handle(Call::Vmm(VmmCall::Granularity {
        device: 0,
        recommended: false,
    })) {
        Some(Ok(ReplyBody::Value(g))) => g,
        other => panic!("no granularity: {other:?}"),
    };
    let create = |handle_types| {
        Call::Vmm(VmmCall::Create {
            device: 0,
            size: granule,
            handle_types,
            compressed: false,
        })
    };
    let Some(Ok(ReplyBody::Handle(private))) = exporter.handle(create(0)) else {
        panic!("no private allocation")
    };
    let export = |handle| Call::Vmm(VmmCall::Export { handle });
    assert!(
        common::refused(exporter.handle(export(private))),
        "not made shareable"
    );
    assert!(exporter.take_outgoing_fd().is_none());
    let Some(Ok(ReplyBody::Handle(shared))) = exporter.handle(create(HANDLE_TYPE_POSIX_FD)) else {
        panic!("no shareable allocation")
    };
    let at = map_whole(&mut exporter, shared, granule);
    assert_eq!(
        exporter.handle(common::memset_call(at, 7, 64)),
        Some(Ok(ReplyBody::Unit))
    );
    assert_eq!(exporter.handle(export(shared)), Some(Ok(ReplyBody::Unit)));
    let fd = exporter
        .take_outgoing_fd()
        .expect("the descriptor comes with the reply");

    // No descriptor, or one that is not exported memory: nothing imported.
    assert!(common::refused(importer.handle(Call::Vmm(VmmCall::Import))));
    let null = std::fs::File::open("/dev/null").unwrap();
    importer.give_fd(Ok(null.into()));
    assert!(matches!(
        importer.handle(Call::Vmm(VmmCall::Import)),
        Some(Err(_))
    ));

    importer.give_fd(Ok(fd));
    let imported = importer.handle(Call::Vmm(VmmCall::Import));
    let Some(Ok(ReplyBody::Handle(handle))) = imported else {
        panic!("not imported: {imported:?}")
    };
    let there = map_whole(&mut importer, handle, granule);
    let read = importer.handle(Call::MemcpyDtoH {
        src: there,
        bytes: 64,
        stream: None,
    });
    assert_eq!(
        read,
        Some(Ok(ReplyBody::Data(vec![7; 64]))),
        "the exporter's bytes"
    );
    importer.close();
    exporter.close();
}
