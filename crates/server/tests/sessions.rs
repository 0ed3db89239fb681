//! Sessions driven through the wire protocol over a real unix socket, on the
//! model device: handshake, handle and pointer checks, isolation between
//! sessions, clean-up on disconnect, sticky errors, stream order, events, status.

mod common;

use std::time::Duration;

use common::*;
use cumux_protocol::*;
use cumux_server::Device;

const IMAGE: &str = "model:scale_add,print,fault,panic;counter:16";

/// A server and a client of it with the image loaded.
fn loaded(tag: &str) -> (Harness, Client, ModuleInfo) {
    let h = Harness::start(tag);
    let mut c = h.client();
    let m = c.load(IMAGE);
    (h, c, m)
}

/// 4 bytes of `c`'s holding `value`.
fn counter(c: &mut Client, value: u32) -> DevicePtr {
    let p = c.alloc(4);
    c.write(p, &value.to_le_bytes());
    p
}

/// Launches `graph` on the default stream: the next wait fails, as `graph`
/// names no graph of the session.
fn assert_graph_launch_fails(c: &mut Client, graph: Handle) {
    c.post(Call::GraphLaunch {
        graph,
        stream: DEFAULT_STREAM,
    });
    assert_eq!(c.code(Call::ContextSynchronize), codes::INVALID_HANDLE);
}

#[test]
fn handshake_names_both_versions_on_mismatch() {
    let h = Harness::start("hs");
    match handshake(&h.socket, &hello(PROTOCOL_VERSION + 41, MAGIC)) {
        HelloReply::Rejected {
            server_version,
            reason,
        } => {
            assert_eq!(server_version, PROTOCOL_VERSION);
            assert!(
                reason.contains(&format!("version {}", PROTOCOL_VERSION + 41)),
                "{reason}"
            );
            assert!(
                reason.contains(&format!("version {PROTOCOL_VERSION}")),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    match handshake(&h.socket, &hello(PROTOCOL_VERSION, 0xdead_beef)) {
        HelloReply::Rejected { reason, .. } => assert!(reason.contains("magic"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let c = h.client();
    assert_eq!(c.devices.len(), 1);
    assert_eq!(c.devices[0].attributes.len(), 147);
}

#[test]
fn unknown_handles_are_refused() {
    let h = Harness::start("handles");
    let mut c = h.client();
    assert_eq!(
        c.code(Call::StreamSynchronize { stream: 999 }),
        codes::INVALID_HANDLE
    );
    assert_eq!(
        c.code(Call::StreamDestroy {
            stream: DEFAULT_STREAM
        }),
        codes::INVALID_HANDLE
    );
    assert_eq!(c.code(Call::EventQuery { event: 5 }), codes::INVALID_HANDLE);
    assert_eq!(
        c.code(Call::ModuleUnload { module: 5 }),
        codes::INVALID_HANDLE
    );
    assert_eq!(
        c.code(Call::MemAlloc {
            device: 3,
            bytes: 16
        }),
        codes::INVALID_DEVICE
    );
    assert_eq!(
        c.code(Call::MemAlloc {
            device: 0,
            bytes: 0
        }),
        codes::INVALID_VALUE
    );
    // A fire-and-forget call with a bad handle fails at the next synchronization,
    // once: it does not poison the context.
    c.post(launch_call(77, [1, 1, 1], [1, 1, 1], vec![]));
    assert_eq!(c.code(Call::ContextSynchronize), codes::INVALID_HANDLE);
    assert_eq!(c.code(Call::ContextSynchronize), codes::SUCCESS);
    // Another session's handles are unknown here.
    let mut other = h.client();
    let s = other.stream(0);
    let m = other.load(IMAGE);
    assert_eq!(
        c.code(Call::StreamSynchronize { stream: s }),
        codes::INVALID_HANDLE
    );
    assert_eq!(
        c.code(Call::ModuleUnload { module: m.module }),
        codes::INVALID_HANDLE
    );
    // Launch limits are checked before queueing.
    let mine = c.load(IMAGE);
    let ptr = c.alloc(4);
    let f = mine.functions[0].handle;
    for (grid, block) in [
        ([0, 1, 1], [1, 1, 1]),
        ([1, 1, 1], [2048, 1, 1]),
        ([1, 1, 1], [32, 32, 2]),
    ] {
        c.post(launch_call(f, grid, block, scale_add(ptr, 1, 1, 0)));
        assert_eq!(
            c.code(Call::ContextSynchronize),
            codes::INVALID_VALUE,
            "{grid:?} {block:?}"
        );
    }
    c.post(launch_call(f, [1, 1, 1], [1, 1, 1], vec![0; 3]));
    assert_eq!(c.code(Call::ContextSynchronize), codes::INVALID_VALUE);
}

#[test]
fn pointers_of_other_sessions_are_refused() {
    let h = Harness::start("isolation");
    let mut a = h.client();
    let mut b = h.client();
    let pa = a.alloc(256);
    a.write(pa, &[7; 256]);
    let pb = b.alloc(256);
    assert_foreign_refused(&mut b, pa, pb);
    // Ranges must lie wholly inside one's own allocation.
    assert_eq!(a.read(pa + 250, 16).unwrap_err().code, codes::INVALID_VALUE);
    assert_eq!(
        a.read(u64::MAX - 2, 16).unwrap_err().code,
        codes::INVALID_VALUE
    );
    assert_eq!(a.read(pa, 256).unwrap(), vec![7; 256]);
    match a.call(Call::MemAddressRange { ptr: pa + 100 }).unwrap() {
        ReplyBody::Range { base, size } => assert_eq!((base, size), (pa, 256)),
        other => panic!("{other:?}"),
    }
    // A's memory is untouched by B's attempts.
    assert_eq!(a.read(pa, 4).unwrap(), vec![7; 4]);
}

#[test]
fn memset_and_copies_within_a_session() {
    let h = Harness::start("memset");
    let mut c = h.client();
    let p = c.alloc(64);
    let q = c.alloc(64);
    c.call(memset_call(p, 0x0102_0304, 4, 16, None)).unwrap();
    assert_eq!(&c.read(p, 8).unwrap(), &[4, 3, 2, 1, 4, 3, 2, 1]);
    // 2D: 4 rows of 2 bytes, 16 bytes apart.
    c.call(Call::Memset {
        dst: q,
        value: 0xab,
        elem_bytes: 1,
        count: 2,
        pitch: 16,
        height: 4,
        stream: None,
    })
    .unwrap();
    let rows = c.read(q, 64).unwrap();
    assert_eq!(rows.iter().filter(|b| **b == 0xab).count(), 8);
    assert_eq!(&rows[16..19], &[0xab, 0xab, 0]);
    c.call(Call::MemcpyDtoD {
        dst: q,
        src: p,
        bytes: 64,
        stream: None,
    })
    .unwrap();
    assert_eq!(c.read(q, 64).unwrap(), c.read(p, 64).unwrap());
    // Module globals are the session's memory too.
    let m = c.load(IMAGE);
    let g = &m.globals[0];
    c.write(g.ptr, &[9; 16]);
    assert_eq!(c.read(g.ptr, 16).unwrap(), vec![9; 16]);
    assert_eq!(c.code(Call::MemFree { ptr: g.ptr }), codes::INVALID_VALUE);
}

#[test]
fn everything_is_released_when_the_client_goes() {
    let h = Harness::start("cleanup");
    let mut c = h.client();
    for _ in 0..3 {
        c.alloc(1 << 20);
    }
    let m = c.load(IMAGE);
    let s = c.stream(0);
    let p = c.alloc(4);
    // Leave slow work queued behind the disconnect.
    for _ in 0..20 {
        c.launch(&m, "scale_add", s, scale_add(p, 1, 1, 50));
    }
    assert!(h.device.mem_used() > 3 << 20);
    assert_eq!(h.server.registry().len(), 1);
    drop(c);
    h.all_released();
    // The server still serves.
    h.client().alloc(16);
}

#[test]
fn a_fault_kills_the_context_but_not_the_server() {
    let (h, mut c, m) = loaded("fault");
    let p = c.alloc(4);
    c.launch(&m, "fault", DEFAULT_STREAM, vec![]);
    c.launch(&m, "scale_add", DEFAULT_STREAM, scale_add(p, 1, 5, 0));
    assert_eq!(c.code(Call::ContextSynchronize), codes::ILLEGAL_ADDRESS);
    // Sticky: later calls keep failing, and queued work after the fault never ran.
    assert_eq!(c.code(Call::ContextSynchronize), codes::ILLEGAL_ADDRESS);
    assert_eq!(
        c.code(Call::MemAlloc {
            device: 0,
            bytes: 8
        }),
        codes::ILLEGAL_ADDRESS
    );
    assert_eq!(c.read(p, 4).unwrap_err().code, codes::ILLEGAL_ADDRESS);
    // Other sessions are fine.
    let mut d = h.client();
    let md = d.load(IMAGE);
    let q = d.alloc(4);
    d.launch(&md, "scale_add", DEFAULT_STREAM, scale_add(q, 1, 5, 0));
    assert_eq!(u32_at(&d.read(q, 4).unwrap()), 5);
    drop(c);
    // A panicking kernel is a launch failure, not a dead server.
    d.launch(&md, "panic", DEFAULT_STREAM, vec![]);
    assert_eq!(d.code(Call::ContextSynchronize), codes::LAUNCH_FAILED);
    h.client().alloc(8);
}

#[test]
fn work_on_a_stream_runs_in_order() {
    let (_h, mut c, m) = loaded("order");
    let s = c.stream(1);
    let p = counter(&mut c, 1);
    // ((((1*2)+3)*2)+3) = 13 only if each step runs after the one before.
    for (mul, add, sleep) in [(2, 0, 30), (1, 3, 0), (2, 0, 30), (1, 3, 0)] {
        c.launch(&m, "scale_add", s, scale_add(p, mul, add, sleep));
    }
    assert_eq!(u32_at(&c.read_on(p, 4, Some(s)).unwrap()), 13);
    // Async copies on a stream are ordered with its launches too.
    c.post(Call::MemcpyHtoD {
        dst: p,
        data: 10u32.to_le_bytes().to_vec(),
        stream: Some(s),
    });
    c.launch(&m, "scale_add", s, scale_add(p, 3, 0, 10));
    c.post(memset_call(p, 0xff, 1, 1, Some(s)));
    assert_eq!(c.code(Call::StreamSynchronize { stream: s }), 0);
    // 10, then *3 = 30 = 0x1e, then the low byte set to 0xff (in another order: 765 or 0xff*3).
    assert_eq!(u32_at(&c.read(p, 4).unwrap()), 0xff);
}

#[test]
fn legacy_default_stream_waits_for_blocking_streams() {
    let (_h, mut c, m) = loaded("legacy");
    let blocking = c.stream(0);
    let p = counter(&mut c, 1);
    c.launch(&m, "scale_add", blocking, scale_add(p, 2, 0, 80));
    // Synchronous copies go through the default stream, after the blocking stream's work.
    assert_eq!(u32_at(&c.read(p, 4).unwrap()), 2);
    // Synchronizing the default stream waits for blocking streams too.
    c.launch(&m, "scale_add", blocking, scale_add(p, 1, 1, 200));
    assert_eq!(
        c.code(Call::StreamQuery {
            stream: DEFAULT_STREAM
        }),
        codes::NOT_READY
    );
    assert_eq!(
        c.code(Call::StreamSynchronize {
            stream: DEFAULT_STREAM
        }),
        0
    );
    assert_eq!(c.code(Call::StreamQuery { stream: blocking }), 0);
}

#[test]
fn a_query_within_asks_again_on_the_server_until_the_work_ends() {
    let (_h, mut c, m) = loaded("within");
    let s = c.stream(1);
    let p = counter(&mut c, 1);
    let within = |query: Call, within_us| Call::QueryWithin {
        query: Box::new(query),
        within_us,
    };
    c.launch(&m, "scale_add", s, scale_add(p, 2, 0, 100));
    assert_eq!(c.code(Call::StreamQuery { stream: s }), codes::NOT_READY);
    // One call, answered once the kernel is done (a plain query would
    // have said "not ready" again).
    assert_eq!(c.code(within(Call::StreamQuery { stream: s }, 190_000)), 0);
    assert_eq!(u32_at(&c.read(p, 4).unwrap()), 2);
    // Work that outlasts the budget: "not ready", as the query says; the
    // budget is capped (MAX_QUERY_WITHIN_US), so the connection is held
    // for at most that long whatever the client asks.
    c.launch(&m, "scale_add", s, scale_add(p, 1, 1, 500));
    let e = c.event(0);
    c.post(Call::EventRecord {
        event: e,
        stream: s,
    });
    assert_eq!(
        c.code(within(Call::EventQuery { event: e }, 1_000)),
        codes::NOT_READY
    );
    let asked = std::time::Instant::now();
    assert_eq!(
        c.code(within(Call::EventQuery { event: e }, u32::MAX)),
        codes::NOT_READY
    );
    assert!(asked.elapsed() < Duration::from_millis(450));
    assert_eq!(c.code(Call::EventSynchronize { event: e }), 0);
    // Only a query may be carried, and only a known stream's.
    assert_eq!(
        c.code(within(Call::ContextSynchronize, 1_000)),
        codes::INVALID_VALUE
    );
    assert_ne!(
        c.code(within(Call::StreamQuery { stream: 0xdead }, 1_000)),
        0
    );
}

/// A client may name its own streams and events in its minted range, with
/// no answer to wait for; a handle outside that range, or one taken, fails
/// at the next synchronizing call and names nothing.
#[test]
fn streams_and_events_under_handles_the_client_chose() {
    let (_h, mut c, m) = loaded("minted");
    let s = minted_handle(0, 0).unwrap();
    let e = minted_handle(0, 1).unwrap();
    c.post(Call::NewStream {
        handle: s,
        flags: 1,
        priority: 0,
    });
    c.post(Call::NewEvent {
        handle: e,
        flags: 0,
    });
    let p = counter(&mut c, 1);
    c.launch(&m, "scale_add", s, scale_add(p, 2, 0, 10));
    c.post(Call::EventRecord {
        event: e,
        stream: s,
    });
    assert_eq!(c.code(Call::EventSynchronize { event: e }), 0);
    assert_eq!(u32_at(&c.read(p, 4).unwrap()), 2);
    // Taken, and outside the range (a handle the server would issue): each
    // fails at the next wait, and names nothing after.
    let server_range = cumux_protocol::first_handle(0) + 3;
    let other_device = minted_handle(1, 7).unwrap();
    for (handle, what) in [
        (s, "taken"),
        (server_range, "server's"),
        (other_device, "device 1's"),
    ] {
        c.post(Call::NewEvent { handle, flags: 0 });
        assert_eq!(
            c.code(Call::StreamSynchronize { stream: s }),
            codes::INVALID_VALUE,
            "{what}"
        );
        if handle != s {
            assert_eq!(
                c.code(Call::EventQuery { event: handle }),
                codes::INVALID_HANDLE,
                "{what}"
            );
        }
    }
    assert_eq!(c.code(Call::StreamSynchronize { stream: s }), 0);
}

#[test]
fn stream_wait_event_orders_across_streams() {
    let (_h, mut c, m) = loaded("wait");
    let (a, b) = (c.stream(1), c.stream(1));
    let e = c.event(0);
    let p = counter(&mut c, 1);
    c.launch(&m, "scale_add", a, scale_add(p, 2, 0, 400));
    c.post(Call::EventRecord {
        event: e,
        stream: a,
    });
    c.post(Call::StreamWaitEvent {
        stream: b,
        event: e,
    });
    c.launch(&m, "scale_add", b, scale_add(p, 1, 3, 0));
    assert_eq!(c.code(Call::StreamQuery { stream: b }), codes::NOT_READY);
    assert_eq!(c.code(Call::StreamSynchronize { stream: b }), 0);
    assert_eq!(c.code(Call::StreamQuery { stream: b }), 0);
    assert_eq!(u32_at(&c.read(p, 4).unwrap()), 5, "(1*2)+3: b waited for a");
}

#[test]
fn events_time_the_work_between_them() {
    let (_h, mut c, m) = loaded("events");
    let s = c.stream(1);
    let (start, end) = (c.event(0), c.event(0));
    let p = c.alloc(4);
    assert_eq!(
        c.code(Call::EventElapsed { start, end }),
        codes::INVALID_HANDLE
    );
    assert_eq!(
        c.code(Call::EventSynchronize { event: end }),
        0,
        "never recorded: complete"
    );
    c.post(Call::EventRecord {
        event: start,
        stream: s,
    });
    c.launch(&m, "scale_add", s, scale_add(p, 1, 1, 400));
    c.post(Call::EventRecord {
        event: end,
        stream: s,
    });
    assert_eq!(c.code(Call::EventQuery { event: end }), codes::NOT_READY);
    assert_eq!(c.code(Call::EventElapsed { start, end }), codes::NOT_READY);
    assert_eq!(c.code(Call::EventSynchronize { event: end }), 0);
    assert_eq!(c.code(Call::EventQuery { event: end }), 0);
    match c.call(Call::EventElapsed { start, end }).unwrap() {
        ReplyBody::ElapsedMs(ms) => assert!((395.0..60_000.0).contains(&ms), "{ms} ms"),
        other => panic!("{other:?}"),
    }
    let untimed = c.event(0x2);
    c.post(Call::EventRecord {
        event: untimed,
        stream: s,
    });
    assert_eq!(c.code(Call::EventSynchronize { event: untimed }), 0);
    assert_eq!(
        c.code(Call::EventElapsed {
            start,
            end: untimed
        }),
        codes::INVALID_HANDLE
    );
    assert_eq!(c.code(Call::EventDestroy { event: untimed }), 0);
    assert_eq!(
        c.code(Call::EventDestroy { event: untimed }),
        codes::INVALID_HANDLE
    );
}

#[test]
fn printf_output_comes_with_the_next_reply() {
    let (_h, mut c, m) = loaded("printf");
    for n in [1u32, 2, 3] {
        c.launch(&m, "print", DEFAULT_STREAM, n.to_le_bytes().to_vec());
    }
    assert_eq!(c.code(Call::ContextSynchronize), 0);
    assert_eq!(
        String::from_utf8_lossy(&c.stdout),
        "model 1\nmodel 2\nmodel 3\n"
    );
}

#[test]
fn status_lists_driver_sessions() {
    let (_h, mut c, m) = loaded("status");
    let p = c.alloc(1000);
    c.launch(&m, "scale_add", DEFAULT_STREAM, scale_add(p, 1, 1, 5));
    assert_eq!(c.code(Call::ContextSynchronize), 0);
    let status = match c.call(Call::ServerStatus).unwrap() {
        ReplyBody::Status(s) => s,
        other => panic!("{other:?}"),
    };
    assert_eq!(status.version, PROTOCOL_VERSION);
    assert_eq!(status.devices.len(), 1);
    assert!(status.devices[0].used_mem >= 1000);
    let [s] = &status.sessions[..] else {
        panic!("{status:?}")
    };
    assert_eq!(
        (s.pid, s.program.as_str(), s.tenant.as_str()),
        (std::process::id(), "test-program", "team-a")
    );
    assert_eq!((s.allocations, s.mem_used, s.launches), (1, 1000, 1));
    assert!(s.gpu_time_ms >= 4.0, "{}", s.gpu_time_ms);
    std::thread::sleep(Duration::from_millis(1));
}

#[test]
fn a_silent_connection_is_dropped_after_the_hello_timeout() {
    use std::io::Read;
    let h = Harness::start("silent");
    // A client that said hello keeps its connection however long it idles.
    let mut idle = h.client();
    let (mut reader, _writer) = raw_connect(&h.socket);
    let started = std::time::Instant::now();
    let mut byte = [0u8; 1];
    // The server closes the connection: EOF, not our own 20 s read timeout.
    assert_eq!(reader.read(&mut byte).unwrap(), 0);
    let waited = started.elapsed();
    assert!(
        waited >= cumux_server::listener::HELLO_TIMEOUT - Duration::from_secs(1),
        "{waited:?}"
    );
    idle.alloc(8);
}

#[test]
fn many_sessions_at_once_keep_their_data_apart() {
    let h = Harness::start("many");
    let socket = h.socket.clone();
    let workers: Vec<_> = (0..8u32)
        .map(|t| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket, &format!("worker-{t}"), None);
                let m = c.load(IMAGE);
                let streams = [c.stream(0), c.stream(1)];
                for round in 0..20u32 {
                    let p = c.alloc(64);
                    c.write(p, &(t * 1000 + round).to_le_bytes());
                    let s = streams[(round % 2) as usize];
                    c.launch(&m, "scale_add", s, scale_add(p, 2, 1, 0));
                    c.launch(&m, "scale_add", s, scale_add(p, 3, 0, 0));
                    let v = u32_at(&c.read_on(p, 4, Some(s)).unwrap());
                    assert_eq!(v, ((t * 1000 + round) * 2 + 1) * 3);
                    if round % 3 == 0 {
                        assert_eq!(c.code(Call::MemFree { ptr: p }), 0);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker failed");
    }
    h.all_released();
}

/// A graph of launches is checked when it is made and runs its launches in
/// order each time it is launched; bad graphs and handles are refused with
/// the driver's codes, and another session cannot launch or destroy it.
#[test]
fn graphs_of_launches_are_checked_and_run_in_order() {
    let (h, mut c, m) = loaded("graphs");
    let function = function(&m, "scale_add");
    let p = counter(&mut c, 0);
    let launch = |function: Handle| GraphLaunch {
        function,
        grid: [1, 1, 1],
        block: [32, 1, 1],
        shared_bytes: 0,
        params: scale_add(p, 2, 1, 0),
        attributes: Vec::new(),
    };
    let graph = c.handle(Call::GraphCreate {
        launches: vec![launch(function); 3],
    });
    for _ in 0..2 {
        c.post(Call::GraphLaunch {
            graph,
            stream: DEFAULT_STREAM,
        });
    }
    assert_eq!(
        u32_at(&c.read(p, 4).unwrap()),
        63,
        "x -> 2x + 1, six times from 0"
    );
    // Refused when made: no launches, a function that is not one, a bad grid.
    let refused = |c: &mut Client, launches| c.code(Call::GraphCreate { launches });
    assert_eq!(refused(&mut c, vec![]), codes::INVALID_VALUE);
    assert_eq!(refused(&mut c, vec![launch(0xdead)]), codes::INVALID_HANDLE);
    let mut empty_grid = launch(function);
    empty_grid.grid = [0, 1, 1];
    assert_eq!(refused(&mut c, vec![empty_grid]), codes::INVALID_VALUE);
    // Another session knows nothing of it.
    let mut d = h.client();
    assert_eq!(d.code(Call::GraphDestroy { graph }), codes::INVALID_HANDLE);
    assert_graph_launch_fails(&mut d, graph);
    // Destroyed once; launching it afterwards fails at the next wait.
    assert!(c.call(Call::GraphDestroy { graph }).is_ok());
    assert_eq!(c.code(Call::GraphDestroy { graph }), codes::INVALID_HANDLE);
    assert_graph_launch_fails(&mut c, graph);
    assert_eq!(u32_at(&c.read(p, 4).unwrap()), 63);
    // A graph goes with the module of its kernels.
    let graph = c.handle(Call::GraphCreate {
        launches: vec![launch(function)],
    });
    assert!(c.call(Call::ModuleUnload { module: m.module }).is_ok());
    assert_eq!(c.code(Call::GraphDestroy { graph }), codes::INVALID_HANDLE);
    assert_graph_launch_fails(&mut c, graph);
    assert_eq!(u32_at(&c.read(p, 4).unwrap()), 63);
}
