//! `CUDA_VISIBLE_DEVICES` over the real protocol: a program's hello carries
//! its list, the welcome shows the listed devices in that order, renumbered
//! from 0, and its session runs on the first; a list that names no device is
//! refused as NVIDIA's driver would find no device; `cumux run`'s preflight
//! is answered without a session.

mod common;

use std::io::BufReader;
use std::os::unix::net::UnixStream;

use common::*;
use cumux_protocol::*;
use cumux_server::tenants::{TenantPolicy, TenantSettings};

/// Says `hello` on a fresh connection: the answer and the open connection.
fn greet(h: &Harness, hello: &Hello) -> (HelloReply, BufReader<UnixStream>, UnixStream) {
    let (mut reader, mut writer) = raw_connect(&h.socket);
    write_frame(&mut writer, &encode(hello).unwrap()).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut reader, &mut buf).unwrap();
    (decode(&buf).unwrap(), reader, writer)
}

fn seeing(visible: &str) -> Hello {
    Hello {
        visible_devices: Some(visible.into()),
        join: None,
        ..hello(PROTOCOL_VERSION, MAGIC)
    }
}

#[test]
fn the_listed_devices_in_their_order_and_the_session_on_the_first() {
    let h = Harness::start_with("visible-order", TenantPolicy::default(), 3);
    let (reply, mut reader, mut writer) = greet(&h, &seeing("2, 0"));
    let HelloReply::Welcome { devices, .. } = reply else {
        panic!("refused: {reply:?}")
    };
    let ordinals: Vec<u32> = devices.iter().map(|d| d.ordinal).collect();
    assert_eq!(ordinals, [0, 1], "renumbered from 0");
    // The session's memory lands on server device 2, the program's device 0.
    let alloc = Request {
        seq: 1,
        call: Call::MemAlloc {
            device: 0,
            bytes: 4096,
        },
    };
    write_frame(&mut writer, &encode(&alloc).unwrap()).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut reader, &mut buf).unwrap();
    let reply: Reply = decode(&buf).unwrap();
    assert!(reply.result.is_ok(), "{reply:?}");
    let used: Vec<u64> = h.server.devices().iter().map(|d| d.mem_used()).collect();
    assert_eq!(used, [0, 0, 4096]);
    drop((reader, writer));
    h.all_released();
}

#[test]
fn the_list_ends_at_the_first_entry_that_names_no_device() {
    let h = Harness::start_with("visible-stop", TenantPolicy::default(), 2);
    let (reply, _r, _w) = greet(&h, &seeing("1,5,0"));
    let HelloReply::Welcome { devices, .. } = reply else {
        panic!("refused: {reply:?}")
    };
    assert_eq!(devices.len(), 1, "{devices:?}");
    // Nothing left: no device, and the refusal says why.
    for visible in ["7", "-1,0", "GPU-ffff"] {
        let (reply, _r, _w) = greet(&h, &seeing(visible));
        let HelloReply::Rejected { reason, .. } = reply else {
            panic!("{visible}: welcomed")
        };
        assert!(
            reason.contains("CUDA_VISIBLE_DEVICES") && reason.contains("entry 1"),
            "{visible}: {reason}"
        );
    }
    // The tenant's own device list comes first: carol may use device 1 only,
    // which she sees as device 0.
    let mut tenants = TenantPolicy::default();
    tenants.tenants.insert(
        "carol".into(),
        TenantSettings {
            devices: Some(vec![1]),
            ..TenantSettings::default()
        },
    );
    let h = Harness::start_with("visible-tenant", tenants, 2);
    let carol = |visible: &str| Hello {
        tenant: Some("carol".into()),
        ..seeing(visible)
    };
    assert!(matches!(
        greet(&h, &carol("0")).0,
        HelloReply::Welcome { ref devices, .. } if devices.len() == 1
    ));
    assert!(matches!(
        greet(&h, &carol("1")).0,
        HelloReply::Rejected { .. }
    ));
}

#[test]
fn a_preflight_is_answered_without_a_session() {
    let mut tenants = TenantPolicy {
        allow_unknown: false,
        ..TenantPolicy::default()
    };
    tenants
        .tenants
        .insert("alice".into(), TenantSettings::default());
    let h = Harness::start_with("preflight", tenants, 2);
    let ask = |tenant: &str| Hello {
        role: ClientRole::Preflight,
        tenant: Some(tenant.into()),
        ..hello(PROTOCOL_VERSION, MAGIC)
    };
    let (reply, _r, _w) = greet(&h, &ask("alice"));
    match reply {
        HelloReply::Welcome {
            session, devices, ..
        } => {
            assert_eq!(session, 0);
            assert_eq!(devices.len(), 2);
        }
        other => panic!("{other:?}"),
    }
    let (reply, _r, _w) = greet(&h, &ask("mallory"));
    match reply {
        HelloReply::Rejected { reason, .. } => {
            assert!(reason.contains("unknown tenant \"mallory\""), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(h.server.registry().is_empty());
    h.eventually("the preflights' seats to be given back", || {
        h.server.seats().taken() == 0
    });
}

/// A device's peers are numbered as the program sees its devices, and a peer
/// it does not see is left out.
#[test]
fn peers_are_numbered_as_the_program_sees_its_devices() {
    use cumux_server::device::model::ModelDevice;
    use std::sync::Arc;
    let link = [0, 1, 1, 0];
    let devices: Vec<Arc<dyn cumux_server::device::Device>> = vec![
        Arc::new(ModelDevice::new(1 << 20).with_peers(vec![(1, link), (2, link)])),
        Arc::new(ModelDevice::new(1 << 20).with_peers(vec![(0, link)])),
        Arc::new(ModelDevice::new(1 << 20).with_peers(vec![(0, link)])),
    ];
    let server = cumux_server::Server::new(devices);
    let (seen, _) = server.devices_seen(&TenantSettings::default(), Some("2,0"));
    let peers: Vec<Vec<u32>> = seen
        .iter()
        .map(|(_, info)| info.peers.iter().map(|(p, _)| *p).collect())
        .collect();
    // The program's 0 is server 2 (reaches server 0, its 1); its 1 is server
    // 0 (reaches servers 1 and 2: only 2, its 0, is seen).
    assert_eq!(peers, [vec![1], vec![0]]);
    let (all, _) = server.devices_seen(&TenantSettings::default(), None);
    assert_eq!(
        all[0].1.peers.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        [1, 2]
    );
}
