//! Hostile admission, over a real unix socket on the model device: session
//! floods held at the limits with a reason that names them, made-up tenant
//! names that cannot inflate a quota, and hellos whose fields are too large.

mod common;

use std::collections::BTreeMap;
use std::io::Write;

use common::*;
use cumux_protocol::*;
use cumux_server::admission::SessionLimits;
use cumux_server::tenants::{TenantPolicy, TenantSettings, ANONYMOUS_TENANT};

fn rejected(reply: HelloReply) -> String {
    match reply {
        HelloReply::Rejected { reason, .. } => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn limited(limits: SessionLimits) -> TenantPolicy {
    TenantPolicy {
        limits,
        ..TenantPolicy::default()
    }
}

#[test]
fn a_session_flood_stops_at_the_limit_and_the_others_carry_on() {
    let h = Harness::start_with(
        "flood",
        limited(SessionLimits {
            total: 6,
            per_peer: 4,
            ..SessionLimits::default()
        }),
        1,
    );
    // This test process is one peer: its fifth session is refused by name.
    let mut held: Vec<Client> = (0..4).map(|_| h.client()).collect();
    let reason = rejected(hello_as(&h.socket, Some("team-a")));
    assert!(
        reason.contains("holds 4 sessions, the most one peer may"),
        "{reason}"
    );
    // Connections that never say hello are refused at once, each told why
    // (one thread answers them all), and hold up nobody after them.
    let mut silent: Vec<_> = (0..50).map(|_| raw_connect(&h.socket)).collect();
    assert!(rejected(hello_as(&h.socket, None)).contains("the most one peer may"));
    for (reader, _) in &mut silent {
        let mut buf = Vec::new();
        read_frame(reader, &mut buf).unwrap();
        assert!(rejected(decode(&buf).unwrap()).contains("the most one peer may"));
    }
    // Every session held still works.
    for c in &mut held {
        let p = c.alloc(64);
        c.write(p, &[7; 64]);
        assert_eq!(c.read(p, 64).unwrap(), vec![7; 64]);
    }
    drop(silent);
    // A seat given back is a seat taken again.
    drop(held.pop());
    h.eventually("the seat to come back", || h.server.seats().taken() == 3);
    held.push(h.client());
    let status = h.server.seats().limits();
    assert_eq!((status.total, status.per_peer), (6, 4));
    drop(held);
    h.all_released();
    h.eventually("every seat to come back", || h.server.seats().taken() == 0);
}

#[test]
fn the_total_limit_names_itself() {
    let h = Harness::start_with(
        "capacity",
        limited(SessionLimits {
            total: 2,
            ..SessionLimits::default()
        }),
        1,
    );
    let _a = h.client();
    let _b = h.client();
    assert_eq!(
        rejected(hello_as(&h.socket, None)),
        "server at capacity: 2 sessions (the limit `sessions`)"
    );
}

#[test]
fn a_tenant_holds_at_most_its_share_of_sessions() {
    let h = Harness::start_with(
        "per-tenant",
        limited(SessionLimits {
            per_tenant: 2,
            ..SessionLimits::default()
        }),
        1,
    );
    let _a = Client::connect(&h.socket, "a", Some("busy"));
    let _b = Client::connect(&h.socket, "b", Some("busy"));
    let reason = rejected(hello_as(&h.socket, Some("busy")));
    assert!(
        reason.contains("tenant \"busy\" holds 2 sessions"),
        "{reason}"
    );
    let _other = Client::connect(&h.socket, "c", Some("calm"));
}

#[test]
fn made_up_tenant_names_share_one_anonymous_quota() {
    let small = TenantSettings {
        memory_quota: Some(64 << 20),
        ..TenantSettings::default()
    };
    let policy = TenantPolicy {
        defaults: TenantSettings {
            memory_quota: Some(256 << 20),
            ..TenantSettings::default()
        },
        tenants: BTreeMap::from([("small".to_string(), small)]),
        ..TenantPolicy::default()
    };
    // The model device has 1 GiB: four made-up names at 256 MiB each would
    // fill it if each had a quota of its own.
    let h = Harness::start_with("anonymous", policy, 1);
    let mut made_up: Vec<Client> = ["mallory", "eve", "trudy", "oscar"]
        .into_iter()
        .map(|name| Client::connect(&h.socket, name, Some(name)))
        .collect();
    let alloc = |c: &mut Client| {
        c.code(Call::MemAlloc {
            device: 0,
            bytes: 200 << 20,
        })
    };
    assert_eq!(
        alloc(&mut made_up[0]),
        codes::SUCCESS,
        "the anonymous quota is there to use"
    );
    for c in &mut made_up[1..] {
        assert_eq!(
            alloc(c),
            codes::OUT_OF_MEMORY,
            "one anonymous quota for every made-up name"
        );
    }
    let status = h.server.accounts().all();
    let names: Vec<&str> = status.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, vec![ANONYMOUS_TENANT]);
    // The configured tenant gets its whole quota.
    let mut small = Client::connect(&h.socket, "small", Some("small"));
    let whole = Call::MemAlloc {
        device: 0,
        bytes: 64 << 20,
    };
    assert_eq!(small.code(whole), codes::SUCCESS);
}

#[test]
fn hello_fields_are_bounded() {
    let h = Harness::start("hello-bounds");
    let mut long = hello(PROTOCOL_VERSION, MAGIC);
    long.program = "p".repeat(MAX_PROGRAM_BYTES + 1);
    let reason = rejected(handshake(&h.socket, &long));
    assert_eq!(
        reason,
        format!(
            "a program name of {} bytes: at most {MAX_PROGRAM_BYTES}",
            MAX_PROGRAM_BYTES + 1
        )
    );
    // A 10 MiB hello is refused from its header; its bytes are never read.
    let (mut reader, mut writer) = raw_connect(&h.socket);
    let huge = 10u32 << 20;
    writer.write_all(&huge.to_le_bytes()).unwrap();
    let _ = writer.write_all(&[0u8; 4096]);
    let mut buf = Vec::new();
    read_frame(&mut reader, &mut buf).unwrap();
    let reason = rejected(decode(&buf).unwrap());
    assert!(
        reason.contains(&format!(
            "frame of {huge} bytes exceeds the limit of {MAX_HELLO_BYTES}"
        )),
        "{reason}"
    );
    // Status stays small and works for everyone. (The refused connections'
    // teardown may still be under way on a loaded host.)
    let mut c = h.client();
    assert!(c.alloc(16) != 0);
    let one_session = |c: &mut Client| matches!(c.call(Call::ServerStatus), Ok(ReplyBody::Status(s)) if s.sessions.len() == 1);
    h.eventually("the refused connections gone", || one_session(&mut c));
    match c.call(Call::ServerStatus).unwrap() {
        ReplyBody::Status(s) => {
            assert_eq!(s.sessions.len(), 1);
            assert_eq!(s.limits.taken, 1);
            assert_eq!(s.limits.sessions, SessionLimits::default().total);
        }
        other => panic!("{other:?}"),
    }
}

/// A TCP connection to `address` that said `hello` (with `token`): its
/// stream, or the server's reason for turning it away.
fn tcp_hello(
    address: &str,
    role: ClientRole,
    tenant: Option<&str>,
    token: Option<&str>,
) -> Result<std::net::TcpStream, String> {
    let mut s = std::net::TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let mut h = hello(PROTOCOL_VERSION, MAGIC);
    h.role = role;
    h.tenant = tenant.map(str::to_string);
    h.token = token.map(str::to_string);
    write_frame(&mut s, &encode(&h).unwrap()).unwrap();
    let mut buf = Vec::new();
    read_frame(&mut s, &mut buf).unwrap();
    match decode::<HelloReply>(&buf).unwrap() {
        HelloReply::Welcome { .. } => Ok(s),
        HelloReply::Rejected { reason, .. } => Err(reason),
    }
}

fn tcp_session(address: &str, role: ClientRole, tenant: Option<&str>) -> std::net::TcpStream {
    tcp_hello(address, role, tenant, None).unwrap()
}

/// Serves `h`'s server on a loopback TCP port too; the address.
fn serve_tcp(h: &Harness) -> String {
    let bound =
        cumux_server::listener::bind(&cumux_server::Address::Tcp("127.0.0.1:0".into())).unwrap();
    let address = match bound.address() {
        cumux_server::Address::Tcp(a) => a,
        other => panic!("{other}"),
    };
    let serving = std::sync::Arc::clone(&h.server);
    std::thread::spawn(move || bound.serve(serving));
    address
}

fn tcp_status(s: &mut std::net::TcpStream) -> ServerStatus {
    match tcp_call(s, Call::ServerStatus) {
        Ok(ReplyBody::Status(status)) => status,
        other => panic!("{other:?}"),
    }
}

/// One call over a TCP connection that said hello; its answer.
fn tcp_call(s: &mut std::net::TcpStream, call: Call) -> Result<ReplyBody, cumux_protocol::CuError> {
    let request = Request { seq: 1, call };
    write_frame(s, &encode(&request).unwrap()).unwrap();
    let mut buf = Vec::new();
    read_frame(s, &mut buf).unwrap();
    decode::<Reply>(&buf).unwrap().result
}

#[test]
fn status_shows_other_tenants_sessions_only_to_the_servers_uid() {
    let h = Harness::start("status-scope");
    let address = serve_tcp(&h);
    // Two tenants' sessions, over TCP (no uid: nobody is the server's uid).
    let mut alice = tcp_session(&address, ClientRole::Driver, Some("alice"));
    let _bob = tcp_session(&address, ClientRole::Driver, Some("bob"));
    let own = tcp_status(&mut alice);
    assert_eq!(own.shown, "tenant alice");
    let tenants: Vec<&str> = own.sessions.iter().map(|s| s.tenant.as_str()).collect();
    assert_eq!(tenants, vec!["alice"]);
    assert!(own.tenants.iter().all(|t| t.name == "alice"));
    // A status client that names no tenant is `default`, which has none here.
    let mut nobody = tcp_session(&address, ClientRole::Status, None);
    let devices_only = tcp_status(&mut nobody);
    assert_eq!(devices_only.shown, "tenant default");
    assert!(devices_only.sessions.is_empty() && devices_only.tenants.is_empty());
    assert_eq!(devices_only.devices.len(), 1);
    // The server's own uid, on the unix socket, sees everyone.
    let mut admin = h.client();
    match admin.call(Call::ServerStatus).unwrap() {
        ReplyBody::Status(all) => {
            assert_eq!(all.shown, "all");
            assert_eq!(all.sessions.len(), 3, "{:?}", all.sessions);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn over_tcp_only_a_token_names_a_configured_tenant() {
    const BOB: &str = "bob-secret-token-123";
    const ADMIN: &str = "admin-secret-token-9";
    let policy = TenantPolicy {
        tenants: BTreeMap::from([
            (
                "bob".to_string(),
                TenantSettings {
                    token: Some(BOB.into()),
                    memory_quota: Some(64 << 20),
                    ..TenantSettings::default()
                },
            ),
            ("carol".to_string(), TenantSettings::default()),
        ]),
        admin_token: Some(ADMIN.into()),
        ..TenantPolicy::default()
    };
    let h = Harness::start_with("tokens", policy, 1);
    let address = serve_tcp(&h);
    let mut bob = tcp_hello(&address, ClientRole::Driver, None, Some(BOB)).unwrap();
    assert_eq!(tcp_status(&mut bob).shown, "tenant bob");
    let bare = tcp_hello(&address, ClientRole::Driver, Some("bob"), None).unwrap_err();
    assert!(bare.contains("needs its token"), "{bare}");
    let wrong = tcp_hello(
        &address,
        ClientRole::Driver,
        None,
        Some("bob-secret-token-124"),
    )
    .unwrap_err();
    assert_eq!(wrong, "the token given is not one this server knows");
    // A listed name without a token is the anonymous tenant over TCP.
    let mut carol = tcp_session(&address, ClientRole::Driver, Some("carol"));
    assert_eq!(tcp_status(&mut carol).shown, "tenant anonymous");
    // The admin token sees everyone, over TCP too.
    let mut admin = tcp_hello(&address, ClientRole::Status, None, Some(ADMIN)).unwrap();
    let all = tcp_status(&mut admin);
    assert_eq!(all.shown, "all");
    assert_eq!(all.sessions.len(), 2, "{:?}", all.sessions);

    // Only an admin changes the table while the server runs.
    const DAVE: &str = "dave-secret-token-42";
    let dave = |token: &str| TenantSpec {
        memory_quota: Some(32 << 20),
        weight: 2,
        token: Some(token.into()),
        ..TenantSpec::default()
    };
    let put = |name: &str, spec| Call::TenantPut {
        name: name.into(),
        spec,
    };
    let refused = tcp_call(&mut bob, put("dave", dave(DAVE))).unwrap_err();
    assert_eq!(refused.code, codes::NOT_PERMITTED, "{refused:?}");
    let gone = tcp_hello(&address, ClientRole::Driver, None, Some(DAVE)).unwrap_err();
    assert_eq!(gone, "the token given is not one this server knows");
    // A table the change would make invalid stays as it was.
    let weak = tcp_call(&mut admin, put("dave", dave("short"))).unwrap_err();
    assert!(weak.detail.contains("token must have"), "{weak:?}");
    let reused = tcp_call(&mut admin, put("dave", dave(BOB))).unwrap_err();
    assert!(reused.detail.contains("another's"), "{reused:?}");
    assert_eq!(
        tcp_call(&mut admin, put("dave", dave(DAVE))),
        Ok(ReplyBody::Unit)
    );
    let mut dave_session = tcp_hello(&address, ClientRole::Driver, None, Some(DAVE)).unwrap();
    assert_eq!(tcp_status(&mut dave_session).shown, "tenant dave");
    let info = tcp_call(&mut dave_session, Call::MemGetInfo { device: 0 });
    assert!(
        matches!(info, Ok(ReplyBody::MemInfo { total, .. }) if total == 32 << 20),
        "{info:?}"
    );
    // A changed quota holds for the session already open.
    let smaller = TenantSpec {
        memory_quota: Some(16 << 20),
        ..dave(DAVE)
    };
    assert_eq!(
        tcp_call(&mut admin, put("dave", smaller)),
        Ok(ReplyBody::Unit)
    );
    let info = tcp_call(&mut dave_session, Call::MemGetInfo { device: 0 });
    assert!(
        matches!(info, Ok(ReplyBody::MemInfo { total, .. }) if total == 16 << 20),
        "{info:?}"
    );
    let remove = |name: &str| Call::TenantRemove { name: name.into() };
    assert_eq!(tcp_call(&mut admin, remove("dave")), Ok(ReplyBody::Unit));
    let gone = tcp_hello(&address, ClientRole::Driver, None, Some(DAVE)).unwrap_err();
    assert_eq!(gone, "the token given is not one this server knows");
    let again = tcp_call(&mut admin, remove("dave")).unwrap_err();
    assert!(again.detail.contains("no tenant"), "{again:?}");
    // The session that began as dave runs on.
    assert!(tcp_call(&mut dave_session, Call::MemGetInfo { device: 0 }).is_ok());
}

#[test]
fn a_peer_whose_tokens_keep_failing_is_held_off() {
    const DAVE: &str = "dave-secret-token-42";
    let policy = TenantPolicy {
        tenants: BTreeMap::from([(
            "dave".to_string(),
            TenantSettings {
                token: Some(DAVE.into()),
                ..TenantSettings::default()
            },
        )]),
        ..TenantPolicy::default()
    };
    let h = Harness::start_with("auth-failures", policy, 1);
    let address = serve_tcp(&h);
    for attempt in 0..cumux_server::admission::MAX_FAILURES {
        let guess = format!("dave-secret-token-{attempt:02}x");
        let refused = tcp_hello(&address, ClientRole::Driver, None, Some(&guess)).unwrap_err();
        assert_eq!(refused, "the token given is not one this server knows");
    }
    // The right token too is refused now, unchecked, with when to try again.
    let held = tcp_hello(&address, ClientRole::Driver, None, Some(DAVE)).unwrap_err();
    assert!(
        held.contains("too many failed authentications from tcp 127.0.0.1")
            && held.contains("try again in"),
        "{held}"
    );
    // Others (here the server's own uid on the unix socket) are not held off.
    let mut own = h.client();
    assert!(own.call(Call::ServerStatus).is_ok());
}
