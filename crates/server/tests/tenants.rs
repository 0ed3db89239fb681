//! Tenants over the real protocol: admission (unknown names, names bound to
//! uids), the device list each tenant sees, exact memory quotas shared by a
//! tenant's sessions, the tenant's share in MemGetInfo, status rows, clean-up.

mod common;

use std::os::unix::fs::MetadataExt;

use common::*;
use cumux_protocol::*;
use cumux_server::tenants::{TenantClass, TenantPolicy, TenantSettings};
use cumux_server::Device;

const IMAGE_WITH_GLOBALS: &str = "model:scale_add;table:4096";

fn my_uid() -> u32 {
    std::fs::metadata("/proc/self").unwrap().uid()
}

fn tenant(quota: Option<u64>) -> TenantSettings {
    TenantSettings {
        memory_quota: quota,
        ..TenantSettings::default()
    }
}

/// alice (1 MiB, bound to this uid), bob (bound to another uid), carol (device
/// 1 only, 64 KiB), nobody else.
fn policy() -> TenantPolicy {
    let mut p = TenantPolicy {
        allow_unknown: false,
        ..TenantPolicy::default()
    };
    p.tenants.insert(
        "alice".into(),
        TenantSettings {
            uids: Some(vec![my_uid()]),
            weight: 2,
            class: TenantClass::LatencyCritical,
            ..tenant(Some(1 << 20))
        },
    );
    p.tenants.insert(
        "bob".into(),
        TenantSettings {
            uids: Some(vec![my_uid().wrapping_add(1)]),
            ..tenant(None)
        },
    );
    p.tenants.insert(
        "nodev".into(),
        TenantSettings {
            devices: Some(vec![]),
            ..tenant(None)
        },
    );
    p.tenants.insert(
        "carol".into(),
        TenantSettings {
            devices: Some(vec![1]),
            ..tenant(Some(64 << 10))
        },
    );
    p
}

fn rejected(reply: HelloReply) -> String {
    match reply {
        HelloReply::Rejected { reason, .. } => reason,
        other => panic!("admitted: {other:?}"),
    }
}

fn mem_info(c: &mut Client) -> (u64, u64) {
    match c.call(Call::MemGetInfo { device: 0 }).unwrap() {
        ReplyBody::MemInfo { free, total } => (free, total),
        other => panic!("{other:?}"),
    }
}

fn try_alloc(c: &mut Client, bytes: u64) -> Result<DevicePtr, u32> {
    match c.call(Call::MemAlloc { device: 0, bytes }) {
        Ok(ReplyBody::Ptr(p)) => Ok(p),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e.code),
    }
}

#[test]
fn unknown_tenants_and_foreign_names_are_turned_away() {
    let h = Harness::start_with("tenants-admit", policy(), 2);
    let why = rejected(hello_as(&h.socket, Some("mallory")));
    assert!(
        why.contains("unknown tenant \"mallory\"") && why.contains("allow_unknown = false"),
        "{why}"
    );
    // No name and no tenant listing this uid but alice: the uid picks alice.
    let mut by_uid = Client::connect(&h.socket, "p", None);
    // bob is bound to another uid: claiming the name is not enough.
    let why = rejected(hello_as(&h.socket, Some("bob")));
    assert!(why.contains("not open to uid"), "{why}");
    let why = rejected(hello_as(&h.socket, Some("nodev")));
    assert!(why.contains("may use no device"), "{why}");
    let why = rejected(hello_as(&h.socket, Some("")));
    assert!(why.contains("tenant name"), "{why}");
    let _alice = Client::connect(&h.socket, "p", Some("alice"));
    by_uid.alloc(16);
    let status = match by_uid.call(Call::ServerStatus).unwrap() {
        ReplyBody::Status(s) => s,
        other => panic!("{other:?}"),
    };
    assert!(status.sessions.iter().all(|s| s.tenant == "alice"));
    let alice = &status.tenants[0];
    assert_eq!(
        (
            alice.name.as_str(),
            alice.sessions,
            alice.mem_used,
            alice.weight
        ),
        ("alice", 2, 16, 2)
    );
    assert_eq!(alice.class, "latency-critical");
    assert_eq!(alice.memory_quota, Some(1 << 20));
}

#[test]
fn a_tenant_sees_only_its_devices_and_its_share() {
    let h = Harness::start_with("tenants-devices", policy(), 2);
    let alice = Client::connect(&h.socket, "p", Some("alice"));
    assert_eq!(alice.devices.len(), 2);
    assert_eq!(alice.devices[0].total_mem, 1 << 20, "the quota, not 1 GiB");
    let mut carol = Client::connect(&h.socket, "p", Some("carol"));
    assert_eq!(carol.devices.len(), 1, "{:?}", carol.devices);
    assert_eq!(carol.devices[0].ordinal, 0, "renumbered from 0");
    assert_eq!(carol.devices[0].total_mem, 64 << 10);
    // carol's memory lives on server device 1, not on device 0.
    let p = carol.alloc(1000);
    assert_eq!(h.device.mem_used(), 0);
    assert_eq!(h.server.devices()[1].mem_used(), 1000);
    carol.call(Call::MemFree { ptr: p }).unwrap();
    assert_eq!(
        carol.code(Call::MemGetInfo { device: 1 }),
        codes::INVALID_DEVICE
    );
}

#[test]
fn quotas_are_exact_across_sessions_and_count_globals() {
    let h = Harness::start_with("tenants-quota", policy(), 1);
    let mut a1 = Client::connect(&h.socket, "p", Some("alice"));
    let mut a2 = Client::connect(&h.socket, "p", Some("alice"));
    assert_eq!(mem_info(&mut a1), (1 << 20, 1 << 20));
    let half = try_alloc(&mut a1, 1 << 19).unwrap();
    assert_eq!(mem_info(&mut a2), (1 << 19, 1 << 20), "shared by sessions");
    // A module's globals count: 4096 bytes.
    let m = a2.load(IMAGE_WITH_GLOBALS);
    assert_eq!(m.globals[0].size, 4096);
    assert_eq!(mem_info(&mut a1).0, (1 << 19) - 4096);
    // One byte past the quota fails with CUDA_ERROR_OUT_OF_MEMORY; exactly up to it works.
    assert_eq!(
        try_alloc(&mut a2, (1 << 19) - 4096 + 1),
        Err(codes::OUT_OF_MEMORY)
    );
    let rest = try_alloc(&mut a2, (1 << 19) - 4096).unwrap();
    assert_eq!(mem_info(&mut a1), (0, 1 << 20));
    assert_eq!(try_alloc(&mut a1, 1), Err(codes::OUT_OF_MEMORY));
    // A module with globals no longer fits either, and leaves nothing behind.
    assert_eq!(
        a1.code(Call::ModuleLoad {
            image: IMAGE_WITH_GLOBALS.as_bytes().to_vec()
        }),
        codes::OUT_OF_MEMORY
    );
    // The failed calls did not poison the sessions, and freeing gives room back.
    a1.call(Call::MemFree { ptr: half }).unwrap();
    a2.call(Call::ModuleUnload { module: m.module }).unwrap();
    assert_eq!(mem_info(&mut a2).0, (1 << 19) + 4096);
    a2.call(Call::MemFree { ptr: rest }).unwrap();
    assert_eq!(mem_info(&mut a1), (1 << 20, 1 << 20));
    // A tenant without a quota sees the device's own figures.
    let open = Harness::start("tenants-noquota");
    let mut free = Client::connect(&open.socket, "p", Some("anyone"));
    assert_eq!(mem_info(&mut free), (1 << 30, 1 << 30));
}

#[test]
fn a_tenant_that_goes_away_gives_everything_back() {
    let h = Harness::start_with("tenants-cleanup", policy(), 1);
    let mut a = Client::connect(&h.socket, "p", Some("alice"));
    let mut b = Client::connect(&h.socket, "p", Some("alice"));
    for _ in 0..4 {
        a.alloc(128 << 10);
    }
    a.load(IMAGE_WITH_GLOBALS);
    b.alloc(4096);
    let used = |h: &Harness| {
        h.server
            .accounts()
            .all()
            .iter()
            .map(|t| t.mem_used())
            .sum::<u64>()
    };
    assert_eq!(used(&h), (512 << 10) + 4096 + 4096);
    drop(a);
    h.eventually("a's share of the quota to come back", || used(&h) == 4096);
    assert_eq!(mem_info(&mut b), ((1 << 20) - 4096, 1 << 20));
    drop(b);
    h.eventually("the tenant's account to go", || {
        h.server.accounts().all().is_empty()
    });
    assert_eq!(h.device.mem_used(), 0);
    assert!(h.server.registry().is_empty());
}

#[test]
fn a_status_connection_cannot_use_the_device() {
    let h = Harness::start_with("tenants-status", policy(), 1);
    let mut hello = hello(PROTOCOL_VERSION, MAGIC);
    hello.role = ClientRole::Status;
    hello.tenant = Some("mallory".into());
    let (mut r, mut w) = raw_connect(&h.socket);
    write_frame(&mut w, &encode(&hello).unwrap()).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut r, &mut buf).unwrap();
    assert!(matches!(
        decode::<HelloReply>(&buf).unwrap(),
        HelloReply::Welcome { .. }
    ));
    let mut ask = |call: Call| {
        write_frame(&mut w, &encode(&Request { seq: 1, call }).unwrap()).unwrap();
        read_frame(&mut r, &mut buf).unwrap();
        decode::<Reply>(&buf).unwrap().result
    };
    let refused = ask(Call::MemAlloc {
        device: 0,
        bytes: 64,
    })
    .unwrap_err();
    assert_eq!(refused.code, codes::INVALID_CONTEXT);
    assert!(matches!(ask(Call::ServerStatus), Ok(ReplyBody::Status(_))));
    assert_eq!(h.device.mem_used(), 0);
}
