//! Hostile tenants on the CPU device, over the real protocol: tenant B tries to
//! read, write, free, query and launch on tenant A's pointers, handles, module
//! globals and freed addresses. Every try fails, and A's data stays intact.

mod common;

use common::*;
use cumux_protocol::*;

/// `peek(src, dst)`: `*dst = *src` (one u32), and `stash(dst)`: `*dst = secret`
/// (a module global).
const PEEK_PTX: &str = r#"
.version 8.0
.target sm_75
.address_size 64

.visible .global .align 4 .u32 secret = 1234;

.visible .entry peek(.param .u64 src, .param .u64 dst)
{
    .reg .b64 %rd<5>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [src];
    ld.param.u64 %rd2, [dst];
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    ld.global.u32 %r1, [%rd3];
    st.global.u32 [%rd4], %r1;
    ret;
}
"#;

fn peek(c: &mut Client, m: &ModuleInfo, src: DevicePtr, dst: DevicePtr) -> u32 {
    let mut params = src.to_le_bytes().to_vec();
    params.extend_from_slice(&dst.to_le_bytes());
    c.post(launch_call(
        m.functions[0].handle,
        [1, 1, 1],
        [1, 1, 1],
        params,
    ));
    c.code(Call::ContextSynchronize)
}

#[test]
fn another_tenants_pointers_are_unreachable() {
    let (_server, socket, _dir) = cpu_server("iso-ptr", 64 << 20);
    let mut a = Client::connect(&socket, "a", Some("tenant-a"));
    let pad = a.alloc(4096);
    // Far from anything B will have: B's kernel must not land on memory of its own.
    a.alloc(1 << 20);
    let secret = a.alloc(4096);
    a.write(secret, &[0xa5; 4096]);
    let mut b = Client::connect(&socket, "b", Some("tenant-b"));
    let out = b.alloc(4096);
    assert_eq!(
        out, pad,
        "each session has its own address space from the same base"
    );
    assert_foreign_refused(&mut b, secret, out);
    // A kernel of B handed A's pointer faults in B's own address space: it
    // does not read A's bytes.
    let m = b.load(PEEK_PTX);
    assert_eq!(peek(&mut b, &m, secret, out), codes::ILLEGAL_ADDRESS);
    // B's context is dead (as after any 700); A's is untouched.
    assert_eq!(b.read(out, 4).unwrap_err().code, codes::ILLEGAL_ADDRESS);
    assert_eq!(a.read(secret, 4096).unwrap(), vec![0xa5; 4096]);
    let am = a.load(PEEK_PTX);
    assert_eq!(peek(&mut a, &am, secret, pad), codes::SUCCESS);
    assert_eq!(a.read(pad, 4).unwrap(), vec![0xa5; 4]);
}

#[test]
fn another_tenants_module_globals_are_unreachable() {
    let (_server, socket, _dir) = cpu_server("iso-global", 64 << 20);
    let mut a = Client::connect(&socket, "a", Some("tenant-a"));
    let am = a.load(PEEK_PTX);
    let global = am.globals.iter().find(|g| g.name == "secret").unwrap().ptr;
    a.write(global, &0xfeed_u32.to_le_bytes());
    let mut b = Client::connect(&socket, "b", Some("tenant-b"));
    assert_eq!(b.read(global, 4).unwrap_err().code, codes::INVALID_VALUE);
    assert_eq!(
        b.code(Call::MemAddressRange { ptr: global }),
        codes::NOT_FOUND
    );
    // B may load the same module: its global is its own copy.
    let bm = b.load(PEEK_PTX);
    let out = b.alloc(16);
    let mine = bm.globals.iter().find(|g| g.name == "secret").unwrap().ptr;
    assert_eq!(peek(&mut b, &bm, mine, out), codes::SUCCESS);
    assert_eq!(b.read(out, 4).unwrap(), 1234u32.to_le_bytes());
    assert_eq!(a.read(global, 4).unwrap(), 0xfeed_u32.to_le_bytes());
}

#[test]
fn forged_handles_name_nothing() {
    let (_server, socket, _dir) = cpu_server("iso-handles", 64 << 20);
    let mut a = Client::connect(&socket, "a", Some("tenant-a"));
    let stream = a.stream(0);
    let event = a.event(0);
    let m = a.load(PEEK_PTX);
    let mut b = Client::connect(&socket, "b", Some("tenant-b"));
    let bad = codes::INVALID_HANDLE;
    assert_eq!(b.code(Call::StreamSynchronize { stream }), bad);
    assert_eq!(b.code(Call::StreamQuery { stream }), bad);
    assert_eq!(b.code(Call::StreamDestroy { stream }), bad);
    assert_eq!(b.code(Call::EventQuery { event }), bad);
    assert_eq!(b.code(Call::EventSynchronize { event }), bad);
    assert_eq!(
        b.code(Call::EventElapsed {
            start: event,
            end: event
        }),
        bad
    );
    assert_eq!(b.code(Call::EventDestroy { event }), bad);
    assert_eq!(b.code(Call::ModuleUnload { module: m.module }), bad);
    // Stream-ordered calls on forged handles fail at the next synchronization.
    b.post(Call::EventRecord {
        event,
        stream: DEFAULT_STREAM,
    });
    assert_eq!(b.code(Call::ContextSynchronize), bad);
    b.post(Call::StreamWaitEvent {
        stream: DEFAULT_STREAM,
        event,
    });
    assert_eq!(b.code(Call::ContextSynchronize), bad);
    let p = b.alloc(16);
    assert_eq!(peek(&mut b, &m, p, p), bad, "A's function handle");
    // Arbitrary numbers name nothing either.
    for forged in [1, 2, 0xff, 0x1_0000, u64::MAX] {
        assert_eq!(b.code(Call::StreamSynchronize { stream: forged }), bad);
        assert_eq!(b.code(Call::EventQuery { event: forged }), bad);
        assert_eq!(b.code(Call::ModuleUnload { module: forged }), bad);
    }
    // A's objects all still work.
    assert_eq!(a.code(Call::StreamSynchronize { stream }), codes::SUCCESS);
    a.post(Call::EventRecord { event, stream });
    assert_eq!(a.code(Call::EventSynchronize { event }), codes::SUCCESS);
    let q = a.alloc(16);
    a.write(q, &[9; 4]);
    assert_eq!(peek(&mut a, &m, q, q + 4), codes::SUCCESS);
    assert_eq!(a.read(q + 4, 4).unwrap(), vec![9; 4]);
}

#[test]
fn freed_addresses_show_nothing_to_anyone() {
    let (_server, socket, _dir) = cpu_server("iso-reuse", 64 << 20);
    let mut a = Client::connect(&socket, "a", Some("tenant-a"));
    let x = a.alloc(4096);
    a.write(x, &[0x5c; 4096]);
    a.call(Call::MemFree { ptr: x }).unwrap();
    // A can no longer name its freed memory, by copy or by kernel.
    assert_eq!(a.read(x, 4).unwrap_err().code, codes::INVALID_VALUE);
    // B gets the same address value: its memory is fresh (zeroed), not A's.
    let mut b = Client::connect(&socket, "b", Some("tenant-b"));
    let y = b.alloc(4096);
    assert_eq!(y, x);
    assert_eq!(b.read(y, 4096).unwrap(), vec![0; 4096]);
    b.write(y, &[0x77; 16]);
    // A, holding the old address, reaches neither its old bytes nor B's new ones.
    assert_eq!(a.read(x, 16).unwrap_err().code, codes::INVALID_VALUE);
    let m = a.load(PEEK_PTX);
    let out = a.alloc(16);
    assert_ne!(out, x, "A's addresses are never reused");
    assert_eq!(peek(&mut a, &m, x, out), codes::ILLEGAL_ADDRESS);
    assert_eq!(b.read(y, 16).unwrap(), vec![0x77; 16]);
}
