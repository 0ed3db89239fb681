//! Pinned host regions over the real protocol: copies both ways through a
//! registered memfd, clean-up at the session's end, and hostile clients (bad
//! descriptors, unsealed or short memfds, ranges outside a region, another
//! session's region): each gets a clear error and the server serves on.

mod common;

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use cumux_protocol::pinned::{self, create_memfd, live_mappings, HostMapping, FD_TAG};
use cumux_protocol::*;

/// The tests count this process's mappings: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const LEN: u64 = 64 << 10;

/// A sealed memfd of `LEN` bytes and this process's mapping of it.
fn region_memory() -> (OwnedFd, HostMapping) {
    let fd = create_memfd(LEN).unwrap();
    let map = HostMapping::map(fd.as_fd(), LEN).unwrap();
    (fd, map)
}

fn shm_client(h: &Harness) -> Client {
    let c = Client::connect_with(&h.socket, "pinned", Some("team-a"), true);
    assert!(c.uses_shm());
    c
}

/// One test at a time ([`serial`]), on a server of its own.
fn start(tag: &str) -> (std::sync::MutexGuard<'static, ()>, Harness) {
    (serial(), Harness::start(tag))
}

/// A shared-memory client of `h` that registered the region of `fd` and `map`.
fn registered_client(h: &Harness, fd: &OwnedFd, map: &HostMapping) -> (Client, Handle) {
    let mut c = shm_client(h);
    let region = register(&mut c, fd, map);
    (c, region)
}

fn register(c: &mut Client, fd: &OwnedFd, map: &HostMapping) -> Handle {
    c.register_host(map.as_ptr() as u64, LEN, Some(fd.as_fd()), FD_TAG)
        .expect("a sealed memfd registers")
}

fn htod(dst: DevicePtr, region: Handle, offset: u64, bytes: u64, stream: Option<Handle>) -> Call {
    Call::MemcpyHtoDHost {
        dst,
        region,
        offset,
        bytes,
        stream,
    }
}

fn dtoh(src: DevicePtr, region: Handle, offset: u64, bytes: u64, stream: Option<Handle>) -> Call {
    Call::MemcpyDtoHHost {
        src,
        region,
        offset,
        bytes,
        stream,
    }
}

#[test]
fn copies_go_through_the_region_and_it_goes_with_the_session() {
    let (_one, h) = start("pinned-copies");
    let before = live_mappings();
    let (fd, map) = region_memory();
    let (mut c, region) = registered_client(&h, &fd, &map);
    assert_eq!(
        live_mappings(),
        before + 2,
        "the server maps the region too"
    );
    let pattern: Vec<u8> = (0..LEN as u32).map(|i| (i * 7 + 1) as u8).collect();
    // SAFETY: nothing else in this process uses the mapping.
    unsafe { map.bytes_mut(0, LEN) }
        .unwrap()
        .copy_from_slice(&pattern);
    let dev = c.alloc(LEN);
    // Synchronous in, read back over the wire.
    assert_eq!(c.code(htod(dev, region, 0, LEN, None)), 0);
    assert!(c.read(dev, LEN).unwrap() == pattern);
    // Stream-ordered out, into the region at an offset: there once synchronized.
    let s = c.stream(0);
    c.write(dev, &[9u8; 100]);
    c.post(dtoh(dev, region, 1000, 100, Some(s)));
    assert_eq!(c.code(Call::StreamSynchronize { stream: s }), 0);
    assert_eq!(map.bytes(1000, 100).unwrap(), &[9u8; 100]);
    assert_eq!(map.bytes(999, 1).unwrap(), &pattern[999..1000]);
    // Stream-ordered in, synchronous out.
    let first = map.bytes(0, 4096).unwrap().to_vec();
    c.post(htod(dev + 4096, region, 0, 4096, Some(s)));
    assert_eq!(c.code(Call::StreamSynchronize { stream: s }), 0);
    assert_eq!(c.code(dtoh(dev + 4096, region, 8192, 4096, None)), 0);
    assert!(map.bytes(8192, 4096).unwrap() == first);
    // Unregistered: it is gone from the server, and its id means nothing.
    assert_eq!(c.code(Call::HostUnregister { region }), 0);
    assert_eq!(live_mappings(), before + 1);
    assert_eq!(c.code(htod(dev, region, 0, 16, None)), codes::INVALID_VALUE);
    assert_eq!(
        c.code(Call::HostUnregister { region }),
        codes::INVALID_VALUE
    );
    // A region still registered when the client goes is unmapped with its session.
    let again = register(&mut c, &fd, &map);
    assert_eq!(c.code(htod(dev, again, 0, LEN, None)), 0);
    assert_eq!(live_mappings(), before + 2);
    drop(c);
    h.eventually("the session's region to be unmapped", || {
        live_mappings() == before + 1
    });
    h.eventually("the session to end", || h.server.registry().is_empty());
}

#[test]
fn bad_descriptors_are_refused_and_the_connection_serves_on() {
    let (_one, h) = start("pinned-bad-fds");
    let before = live_mappings();
    let mut c = shm_client(&h);
    let refused = |c: &mut Client, fd: Option<std::os::fd::BorrowedFd<'_>>, tag, len| {
        let e = c.register_host(0x1000, len, fd, tag).unwrap_err();
        assert_eq!(e.code, codes::INVALID_VALUE, "{e:?}");
        e.detail
    };
    // A socket where a memfd belongs.
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    refused(&mut c, Some(a.as_fd()), FD_TAG, LEN);
    // An unsealed memfd: the client could shrink it under the server.
    // SAFETY: a NUL-terminated name and valid flags; the result is checked.
    let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: just created, owned here.
    let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
    std::fs::File::from(unsealed.try_clone().unwrap())
        .set_len(LEN)
        .unwrap();
    let why = refused(&mut c, Some(unsealed.as_fd()), FD_TAG, LEN);
    assert!(why.contains("seal"), "{why}");
    // Smaller than it claims, empty, or absurdly large.
    let (fd, _map) = region_memory();
    let why = refused(&mut c, Some(fd.as_fd()), FD_TAG, LEN + 4096);
    assert!(why.contains("holds"), "{why}");
    refused(&mut c, Some(fd.as_fd()), FD_TAG, 0);
    refused(
        &mut c,
        Some(fd.as_fd()),
        FD_TAG,
        pinned::MAX_REGION_BYTES + 1,
    );
    // The wrong byte with it, or the byte without a descriptor.
    refused(&mut c, Some(fd.as_fd()), b'X', LEN);
    refused(&mut c, None, FD_TAG, LEN);
    // Nothing at all: the server gives up after its wait.
    let started = std::time::Instant::now();
    let why = refused(&mut c, None, 0, LEN);
    assert!(why.contains("no memfd"), "{why}");
    assert!(started.elapsed() < Duration::from_secs(15));
    // The connection still works, and nothing stayed mapped.
    let dev = c.alloc(4096);
    c.write(dev, &[5u8; 4096]);
    assert_eq!(c.read(dev, 4096).unwrap(), vec![5u8; 4096]);
    assert_eq!(live_mappings(), before + 1);
    // Over the socket transport there is no region at all.
    let mut plain = Client::connect_with(&h.socket, "plain", Some("team-a"), false);
    let e = plain.register_host(0x1000, LEN, None, 0).unwrap_err();
    assert_eq!(e.code, codes::INVALID_VALUE, "{e:?}");
    assert_eq!(plain.code(Call::ContextSynchronize), 0);
    drop((c, plain));
    settle(&h);
}

/// A region the device must reach by the client's address (managed memory
/// on a GPU) is refused where it cannot, here the test's model device, and
/// nothing of it stays: the same memory then registers for copies.
#[test]
fn a_region_the_device_cannot_reach_by_its_address_is_refused_when_asked() {
    let (_one, h) = start("pinned-reached");
    let before = live_mappings();
    let (fd, map) = region_memory();
    let mut c = shm_client(&h);
    let base = map.as_ptr() as u64;
    let refused = c.register_host_as(base, LEN, Some(fd.as_fd()), FD_TAG, true);
    let err = refused.expect_err("the model device does not reach host memory by its address");
    assert_eq!(err.code, codes::NOT_SUPPORTED, "{err:?}");
    assert!(err.detail.contains("managed memory"), "{err:?}");
    // Only the test's own mapping is left.
    assert_eq!(live_mappings(), before + 1);
    let region = register(&mut c, &fd, &map);
    let dev = c.alloc(LEN);
    assert_eq!(c.code(htod(dev, region, 0, LEN, None)), 0);
    // The next test counts mappings: this session's region goes first.
    drop(c);
    h.eventually("the session's region to be unmapped", || {
        live_mappings() == before + 1
    });
}

#[test]
fn ranges_outside_a_region_or_an_allocation_are_refused() {
    let (_one, h) = start("pinned-ranges");
    let (fd, map) = region_memory();
    let (mut c, region) = registered_client(&h, &fd, &map);
    let dev = c.alloc(LEN);
    for (offset, bytes) in [
        (0, LEN + 1),
        (LEN, 1),
        (LEN - 8, 16),
        (u64::MAX, 2),
        (1, u64::MAX),
    ] {
        assert_eq!(
            c.code(htod(dev, region, offset, bytes, None)),
            codes::INVALID_VALUE,
            "[{offset}, +{bytes})"
        );
        assert_eq!(
            c.code(dtoh(dev, region, offset, bytes, None)),
            codes::INVALID_VALUE,
            "[{offset}, +{bytes})"
        );
    }
    // Inside the region but past the allocation, or into no allocation.
    assert_eq!(
        c.code(htod(dev + 16, region, 0, LEN, None)),
        codes::INVALID_VALUE
    );
    assert_eq!(
        c.code(dtoh(0xdead_0000, region, 0, 16, None)),
        codes::INVALID_VALUE
    );
    // Stream-ordered: the error comes back at the next synchronization.
    let s = c.stream(0);
    c.post(dtoh(dev, region, LEN - 1, 2, Some(s)));
    assert_eq!(
        c.code(Call::StreamSynchronize { stream: s }),
        codes::INVALID_VALUE
    );
    assert_eq!(c.code(Call::StreamSynchronize { stream: s }), 0);
    // A region id nobody registered.
    assert_eq!(
        c.code(htod(dev, region + 1000, 0, 16, None)),
        codes::INVALID_VALUE
    );
    // The region itself still works.
    assert_eq!(c.code(htod(dev, region, LEN - 16, 16, None)), 0);
    drop(c);
    settle(&h);
}

/// Waits for every session of `h` to end (and so to unmap its regions).
fn settle(h: &Harness) {
    h.eventually("every session to end", || h.server.registry().is_empty());
}

#[test]
fn a_session_cannot_name_another_sessions_region() {
    let (_one, h) = start("pinned-foreign");
    let (fd, map) = region_memory();
    let (mut owner, region) = registered_client(&h, &fd, &map);
    let mut thief = shm_client(&h);
    let dev = thief.alloc(LEN);
    assert_eq!(
        thief.code(dtoh(dev, region, 0, 16, None)),
        codes::INVALID_VALUE
    );
    assert_eq!(
        thief.code(htod(dev, region, 0, 16, None)),
        codes::INVALID_VALUE
    );
    assert_eq!(
        thief.code(Call::HostUnregister { region }),
        codes::INVALID_VALUE
    );
    // The owner's region is untouched and still its own.
    let mine = owner.alloc(LEN);
    owner.write(mine, &[3u8; 64]);
    assert_eq!(owner.code(dtoh(mine, region, 0, 64, None)), 0);
    assert_eq!(map.bytes(0, 64).unwrap(), &[3u8; 64]);
    drop((owner, thief));
    settle(&h);
}

/// The mark of `event`'s record on `stream`, sent right after it.
fn record_and_mark(
    c: &mut Client,
    (event, stream): (Handle, Handle),
    region: Handle,
    offset: u64,
    value: u64,
) {
    c.post(Call::EventRecord { event, stream });
    c.post(mark(event, stream, region, offset, value));
}

fn mark(event: Handle, stream: Handle, region: Handle, offset: u64, value: u64) -> Call {
    Call::Mark {
        event: Some(event),
        stream,
        region,
        offset,
        value,
    }
}

/// The u64 at `offset` of the region, as a client reads its marks.
fn mark_at(map: &HostMapping, offset: u64) -> u64 {
    u64::from_ne_bytes(map.bytes(offset, 8).unwrap().try_into().unwrap())
}

/// A mark lands in the region once its stream's work before it is done; one
/// that is misaligned, outside the region or in another session's region is
/// refused with a clear error at the next synchronize; and while the session
/// holds a failure that a synchronize must return, a mark is left out (so a
/// client that watches it asks the server, and gets the failure).
#[test]
fn marks_land_behind_their_stream_and_bad_ones_are_refused() {
    let (_one, h) = start("pinned-marks");
    let (fd, map) = region_memory();
    let (mut c, region) = registered_client(&h, &fd, &map);
    let dev = c.alloc(LEN);
    let s = c.stream(0);
    let ReplyBody::Handle(event) = c.call(Call::EventCreate { flags: 0 }).unwrap() else {
        panic!("no event");
    };
    let on = (event, s);
    c.post(htod(dev, region, 0, LEN, Some(s)));
    record_and_mark(&mut c, on, region, 8, 5);
    assert_eq!(c.code(Call::StreamSynchronize { stream: s }), 0);
    assert_eq!(mark_at(&map, 8), 5);
    for (offset, why) in [(12, "not 8-byte aligned"), (LEN, "outside host region")] {
        record_and_mark(&mut c, on, region, offset, 9);
        let e = c.call(Call::StreamSynchronize { stream: s }).unwrap_err();
        assert_eq!(e.code, codes::INVALID_VALUE, "{e:?}");
        assert!(e.detail.contains(why), "{offset}: {}", e.detail);
    }
    // A failure waits for the next synchronize: the mark after it is left out.
    record_and_mark(&mut c, on, region, 4, 9);
    record_and_mark(&mut c, on, region, 16, 7);
    assert_eq!(
        c.code(Call::StreamSynchronize { stream: s }),
        codes::INVALID_VALUE
    );
    assert_eq!(mark_at(&map, 16), 0, "a mark behind a failure");
    record_and_mark(&mut c, on, region, 16, 8);
    assert_eq!(c.code(Call::StreamSynchronize { stream: s }), 0);
    assert_eq!(mark_at(&map, 16), 8);
    // Another session's region, a stream or an event this session does not have.
    let (other_fd, other_map) = region_memory();
    let (mut other, theirs) = registered_client(&h, &other_fd, &other_map);
    record_and_mark(&mut c, on, theirs, 0, 3);
    assert_eq!(
        c.code(Call::StreamSynchronize { stream: s }),
        codes::INVALID_VALUE
    );
    assert_eq!(mark_at(&other_map, 0), 0);
    for (event, stream) in [(event, 0xdead_beef), (0xdead_beef, s)] {
        c.post(mark(event, stream, region, 0, 3));
        assert_ne!(c.code(Call::StreamSynchronize { stream: s }), 0);
        assert_eq!(mark_at(&map, 0), 0);
    }
    assert_eq!(other.code(Call::ContextSynchronize), 0);
}

/// A synchronize's mark (no event) lands once the stream's work before it is
/// done; behind a failure that the synchronize must return it is left out;
/// one on a stream the session does not have is refused at the next
/// synchronize.
#[test]
fn stream_marks_land_behind_the_streams_work_and_not_behind_a_failure() {
    let (_one, h) = start("pinned-stream-marks");
    let (fd, map) = region_memory();
    let (mut c, region) = registered_client(&h, &fd, &map);
    let dev = c.alloc(LEN);
    let s = c.stream(0);
    let stream_mark = |stream, offset, value| Call::Mark {
        event: None,
        stream,
        region,
        offset,
        value,
    };
    // SAFETY: nothing else in this process uses the mapping, and the
    // server reads it only after this.
    unsafe { map.bytes_mut(64, 64) }.unwrap().fill(7);
    c.post(htod(dev, region, 64, 64, Some(s)));
    c.post(dtoh(dev, region, 256, 64, Some(s)));
    c.post(stream_mark(s, 8, 4));
    h.eventually("the stream's mark", || mark_at(&map, 8) == 4);
    // The copies before it are done by the time it lands.
    assert_eq!(map.bytes(256, 64).unwrap(), &[7u8; 64]);
    assert_eq!(c.code(Call::StreamSynchronize { stream: s }), 0);
    // The legacy default stream takes marks too.
    c.post(htod(dev, region, 64, 64, Some(DEFAULT_STREAM)));
    c.post(stream_mark(DEFAULT_STREAM, 24, 2));
    h.eventually("the default stream's mark", || mark_at(&map, 24) == 2);
    // A copy that fails: the mark behind it is left out.
    c.post(dtoh(dev, region, LEN - 1, 2, Some(s)));
    c.post(stream_mark(s, 8, 5));
    assert_eq!(
        c.code(Call::StreamSynchronize { stream: s }),
        codes::INVALID_VALUE
    );
    assert_eq!(mark_at(&map, 8), 4, "a mark behind a failure");
    c.post(stream_mark(s, 8, 6));
    assert_eq!(c.code(Call::StreamSynchronize { stream: s }), 0);
    assert_eq!(mark_at(&map, 8), 6);
    // A stream this session does not have.
    c.post(stream_mark(0xdead_beef, 8, 9));
    let e = c.call(Call::StreamSynchronize { stream: s }).unwrap_err();
    assert_eq!(e.code, codes::INVALID_HANDLE, "{e:?}");
    assert_eq!(mark_at(&map, 8), 6);
}
