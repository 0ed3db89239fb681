//! Moving a live session between the two CPU devices of one server (issue
//! 17) over the real protocol: its pointers, module globals, function,
//! stream and event handles stay valid and its memory keeps its bytes; a
//! session holding virtual memory is refused with the reason and runs on.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use cumux_protocol::*;
use cumux_server::device::cpu::CpuDevice;
use cumux_server::{Device, Server};

fn two_cpu_devices(tag: &str) -> (Arc<Server>, std::path::PathBuf, TempDir) {
    let dir = TempDir::new(tag);
    let devices = (0..2)
        .map(|n| Arc::new(CpuDevice::new(256 << 20).numbered(n).unwrap()) as Arc<dyn Device>)
        .collect();
    let server = Server::new(devices);
    let socket = serve_in(&dir, &server);
    (server, socket, dir)
}

fn session_of(server: &Server, program: &str) -> (u64, u32) {
    let entries = server.registry().entries();
    let entry = entries
        .iter()
        .find(|e| e.program == program)
        .expect("the session");
    (entry.session, entry.device)
}

/// An admin's order for `session`, answered while `program` keeps calling
/// (an order is carried out at the session's next call).
fn order(
    socket: &std::path::PathBuf,
    program: &mut Client,
    call: Call,
) -> Result<ReplyBody, CuError> {
    let mut admin = Client::connect(socket, "admin", None);
    let asking = std::thread::spawn(move || admin.call(call));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !asking.is_finished() {
        assert!(Instant::now() < deadline, "the order was never answered");
        assert_eq!(program.code(Call::Fence), codes::SUCCESS);
        std::thread::sleep(Duration::from_millis(5));
    }
    asking.join().unwrap()
}

fn floats(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|f| f.to_le_bytes()).collect()
}

fn params(layout: &[ParamInfo], values: &[Vec<u8>]) -> Vec<u8> {
    let size = layout.last().map_or(0, |p| p.offset + p.size) as usize;
    let mut out = vec![0u8; size];
    for (p, bytes) in layout.iter().zip(values) {
        out[p.offset as usize..][..p.size as usize].copy_from_slice(&bytes[..p.size as usize]);
    }
    out
}

fn load(c: &mut Client, corpus: &str) -> ModuleInfo {
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source(corpus));
    match c
        .call(Call::ModuleLoad {
            image: ptx.into_bytes(),
        })
        .unwrap()
    {
        ReplyBody::Module(m) => m,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_session_moves_between_two_cpu_devices_with_its_handles_and_bytes() {
    let (server, socket, _dir) = two_cpu_devices("migrate-cpu");
    let mut c = Client::connect(&socket, "moved-program", None);
    let add = load(&mut c, "vector_add");
    let globals = load(&mut c, "constant_and_device_globals");
    let f = add
        .functions
        .iter()
        .find(|f| f.name.contains("vector_add"))
        .unwrap()
        .clone();
    let counter = globals
        .globals
        .iter()
        .find(|g| g.name.contains("negative_count"))
        .unwrap()
        .clone();
    let stream = match c
        .call(Call::StreamCreate {
            flags: 1,
            priority: 0,
        })
        .unwrap()
    {
        ReplyBody::Handle(h) => h,
        other => panic!("{other:?}"),
    };
    let event = match c.call(Call::EventCreate { flags: 0 }).unwrap() {
        ReplyBody::Handle(h) => h,
        other => panic!("{other:?}"),
    };
    let n = 4096usize;
    let bytes = 4 * n as u64;
    let (pa, pb, pc) = (c.alloc(bytes), c.alloc(bytes), c.alloc(bytes));
    c.write(pa, &floats(&(0..n).map(|i| i as f32).collect::<Vec<_>>()));
    c.write(pb, &floats(&vec![1.0; n]));
    c.write(pc, &floats(&vec![0.0; n]));
    c.write(counter.ptr, &41u32.to_le_bytes());
    let (session, device) = session_of(&server, "moved-program");
    assert_eq!(device, 0);
    let launch = params(
        &f.params,
        &[
            pc.to_le_bytes().to_vec(),
            pb.to_le_bytes().to_vec(),
            pc.to_le_bytes().to_vec(),
            (n as i32).to_le_bytes().to_vec(),
        ],
    );
    // c += a once, then c += b twice (a launch, a graph) on each device it
    // visits, back and forth.
    let first = params(
        &f.params,
        &[
            pa.to_le_bytes().to_vec(),
            pc.to_le_bytes().to_vec(),
            pc.to_le_bytes().to_vec(),
            (n as i32).to_le_bytes().to_vec(),
        ],
    );
    c.post(launch_call_on(
        f.handle,
        [16, 1, 1],
        [256, 1, 1],
        stream,
        first,
        Vec::new(),
    ));
    let graph = GraphLaunch {
        function: f.handle,
        grid: [16, 1, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
        params: launch.clone(),
        attributes: Vec::new(),
    };
    let graph = match c
        .call(Call::GraphCreate {
            launches: vec![graph],
        })
        .unwrap()
    {
        ReplyBody::Handle(h) => h,
        other => panic!("{other:?}"),
    };
    for round in 1..=4u32 {
        let to = round % 2;
        let said = order(
            &socket,
            &mut c,
            Call::SessionMove {
                session,
                device: to,
                wait_ms: 5_000,
            },
        )
        .unwrap();
        let ReplyBody::Data(line) = said else {
            panic!("{said:?}")
        };
        assert!(String::from_utf8_lossy(&line).contains("moved"), "{line:?}");
        assert_eq!(session_of(&server, "moved-program").1, to);
        let (here, there) = (
            &server.devices()[to as usize],
            &server.devices()[1 - to as usize],
        );
        assert!(here.mem_used() >= 3 * bytes, "the memory is on device {to}");
        // The old context goes once its stream threads have ended, which a
        // loaded machine may take a moment after the answer.
        eventually("the old device's memory to be given back", || {
            there.mem_used() == 0
        });
        c.post(launch_call_on(
            f.handle,
            [16, 1, 1],
            [256, 1, 1],
            stream,
            launch.clone(),
            Vec::new(),
        ));
        c.post(Call::GraphLaunch { graph, stream });
        c.post(Call::EventRecord { event, stream });
        assert_eq!(c.code(Call::EventSynchronize { event }), codes::SUCCESS);
        let expected: Vec<f32> = (0..n).map(|i| i as f32 + 2.0 * round as f32).collect();
        assert_eq!(
            c.read(pc, bytes).unwrap(),
            floats(&expected),
            "round {round}"
        );
        assert_eq!(c.read(counter.ptr, 4).unwrap(), 41u32.to_le_bytes());
    }
    // Asking for the device it is on, or one the server lacks, is refused.
    let same = order(
        &socket,
        &mut c,
        Call::SessionMove {
            session,
            device: 0,
            wait_ms: 5_000,
        },
    );
    assert!(same.unwrap_err().detail.contains("already"));
    let none = order(
        &socket,
        &mut c,
        Call::SessionMove {
            session,
            device: 7,
            wait_ms: 5_000,
        },
    );
    assert_eq!(none.unwrap_err().code, codes::INVALID_DEVICE);
    drop(c);
    for d in server.devices() {
        let d = Arc::clone(d);
        eventually("memory to be released", move || d.mem_used() == 0);
    }
}

#[test]
fn a_session_holding_virtual_memory_is_refused_with_the_reason_and_runs_on() {
    let (server, socket, _dir) = two_cpu_devices("migrate-refused");
    let mut c = Client::connect(&socket, "vmm-program", None);
    let p = c.alloc(64);
    c.write(p, b"still here");
    let reserve = VmmCall::Reserve {
        size: 2 << 20,
        alignment: 0,
        hint: 0,
    };
    c.call(Call::Vmm(reserve)).unwrap();
    let (session, _) = session_of(&server, "vmm-program");
    let e = order(
        &socket,
        &mut c,
        Call::SessionMove {
            session,
            device: 1,
            wait_ms: 5_000,
        },
    )
    .unwrap_err();
    assert_eq!(e.code, codes::NOT_SUPPORTED);
    assert!(e.detail.contains("virtual memory"), "{e:?}");
    assert_eq!(session_of(&server, "vmm-program").1, 0);
    assert_eq!(&c.read(p, 10).unwrap(), b"still here");
    // A session that makes no call is left alone once the wait is over.
    let mut admin = Client::connect(&socket, "admin", None);
    let e = admin
        .call(Call::SessionMove {
            session,
            device: 1,
            wait_ms: 50,
        })
        .unwrap_err();
    assert!(e.detail.contains("made no call"), "{e:?}");
    assert_eq!(&c.read(p, 10).unwrap(), b"still here");
    // No such session.
    let e = admin
        .call(Call::SessionMove {
            session: 999,
            device: 1,
            wait_ms: 50,
        })
        .unwrap_err();
    assert!(e.detail.contains("no driver session"), "{e:?}");
}

fn handle(reply: Result<ReplyBody, CuError>) -> Handle {
    match reply.unwrap() {
        ReplyBody::Handle(h) => h,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_checkpoint_brings_a_sessions_state_back_and_a_foreign_image_is_refused() {
    let (server, socket, _dir) = two_cpu_devices("checkpoint");
    let mut c = Client::connect(&socket, "checkpointed", None);
    let add = load(&mut c, "vector_add");
    let p = c.alloc(64);
    c.write(p, b"first");
    let kept = handle(c.call(Call::StreamCreate {
        flags: 1,
        priority: 0,
    }));
    let (session, _) = session_of(&server, "checkpointed");
    let image = match order(
        &socket,
        &mut c,
        Call::SessionCheckpoint {
            session,
            wait_ms: 5_000,
            hold: false,
        },
    ) {
        Ok(ReplyBody::Data(image)) => image,
        other => panic!("{other:?}"),
    };
    let used = server.devices()[0].mem_used();
    // Later changes: new bytes, an allocation, a stream.
    c.write(p, b"later");
    let q = c.alloc(1 << 20);
    let later = handle(c.call(Call::StreamCreate {
        flags: 1,
        priority: 0,
    }));
    // A foreign image is refused and changes nothing.
    let restore = |image: Vec<u8>| Call::SessionRestore {
        session,
        image,
        wait_ms: 5_000,
    };
    let e = order(&socket, &mut c, restore(b"garbage".to_vec())).unwrap_err();
    assert!(e.detail.contains("not a session image"), "{e:?}");
    assert_eq!(&c.read(p, 5).unwrap(), b"later");
    let e = order(&socket, &mut c, restore(image[..image.len() - 9].to_vec())).unwrap_err();
    assert_eq!(e.code, codes::INVALID_VALUE, "{e:?}");
    // The checkpoint's state comes back: its bytes and handles, not the later ones.
    let said = order(&socket, &mut c, restore(image.clone())).unwrap();
    assert!(matches!(said, ReplyBody::Data(_)), "{said:?}");
    assert_eq!(&c.read(p, 5).unwrap(), b"first");
    assert_eq!(c.code(Call::MemFree { ptr: q }), codes::INVALID_VALUE);
    assert_eq!(
        c.code(Call::StreamSynchronize { stream: later }),
        codes::INVALID_HANDLE
    );
    assert_eq!(
        c.code(Call::StreamSynchronize { stream: kept }),
        codes::SUCCESS
    );
    assert_eq!(server.devices()[0].mem_used(), used);
    // Its functions still launch.
    let f = add
        .functions
        .iter()
        .find(|f| f.name.contains("vector_add"))
        .unwrap();
    let n = 16i32;
    let values = [
        p.to_le_bytes().to_vec(),
        p.to_le_bytes().to_vec(),
        p.to_le_bytes().to_vec(),
        n.to_le_bytes().to_vec(),
    ];
    c.write(p, &floats(&[1.5; 16]));
    c.post(launch_call_on(
        f.handle,
        [1, 1, 1],
        [32, 1, 1],
        kept,
        params(&f.params, &values),
        Vec::new(),
    ));
    assert_eq!(
        c.code(Call::StreamSynchronize { stream: kept }),
        codes::SUCCESS
    );
    assert_eq!(c.read(p, 64).unwrap(), floats(&[3.0; 16]));
    // A session's image fits only its program's device of the same number.
    let mut other = Client::connect(&socket, "other", None);
    other.alloc(16);
    let (other_session, _) = session_of(&server, "other");
    let image = cumux_server::session::image_stream::rewritten(&image, |decoded| {
        decoded.next_handle = decoded.streams[0].handle;
    })
    .unwrap();
    let call = Call::SessionRestore {
        session: other_session,
        image,
        wait_ms: 5_000,
    };
    let e = order(&socket, &mut other, call).unwrap_err();
    assert!(e.detail.contains("out of place"), "{e:?}");
}

#[test]
fn pinned_host_regions_stay_registered_across_a_move() {
    use cumux_protocol::pinned::{create_memfd, HostMapping, FD_TAG};
    use std::os::fd::AsFd;
    let (server, socket, _dir) = two_cpu_devices("migrate-pinned");
    let mut c = Client::connect_with(&socket, "pinned-program", None, true);
    assert!(c.uses_shm());
    const LEN: u64 = 64 << 10;
    let fd = create_memfd(LEN).unwrap();
    let map = HostMapping::map(fd.as_fd(), LEN).unwrap();
    let region = c
        .register_host(map.as_ptr() as u64, LEN, Some(fd.as_fd()), FD_TAG)
        .unwrap();
    let p = c.alloc(LEN);
    let (session, _) = session_of(&server, "pinned-program");
    for (round, to) in [(1u8, 1u32), (2, 0)] {
        order(
            &socket,
            &mut c,
            Call::SessionMove {
                session,
                device: to,
                wait_ms: 5_000,
            },
        )
        .unwrap();
        c.write(p, &vec![round; LEN as usize]);
        let copy = Call::MemcpyDtoHHost {
            src: p,
            region,
            offset: 0,
            bytes: LEN,
            stream: None,
        };
        assert_eq!(c.code(copy), codes::SUCCESS);
        assert_eq!(map.bytes(0, LEN).unwrap(), &vec![round; LEN as usize][..]);
    }
}

#[test]
fn an_order_for_a_session_that_ends_first_says_so() {
    let (server, socket, _dir) = two_cpu_devices("migrate-gone");
    let c = Client::connect(&socket, "leaving", None);
    let (session, _) = session_of(&server, "leaving");
    let mut admin = Client::connect(&socket, "admin", None);
    let asking = std::thread::spawn(move || {
        admin.call(Call::SessionMove {
            session,
            device: 1,
            wait_ms: 10_000,
        })
    });
    eventually("the order to wait", || server.orders().is_waiting(session));
    // A second order for the same session is refused while the first waits.
    let mut other = Client::connect(&socket, "admin-2", None);
    let e = other
        .call(Call::SessionCheckpoint {
            session,
            wait_ms: 10,
            hold: false,
        })
        .unwrap_err();
    assert!(e.detail.contains("has an order waiting already"), "{e:?}");
    drop(c);
    let e = asking.join().unwrap().unwrap_err();
    assert!(e.detail.contains("ended before"), "{e:?}");
}

#[test]
fn the_malloc_heap_limit_moves_and_a_used_heap_is_refused() {
    let (server, socket, _dir) = two_cpu_devices("migrate-heap");
    let mut c = Client::connect(&socket, "heap-program", None);
    let source = cumux_testkit::workspace_root().join("tests/cuda/parity/device_malloc.cu");
    let ptx = cumux_testkit::compile_ptx(source);
    let module = match c
        .call(Call::ModuleLoad {
            image: ptx.into_bytes(),
        })
        .unwrap()
    {
        ReplyBody::Module(m) => m,
        other => panic!("{other:?}"),
    };
    let f = module
        .functions
        .iter()
        .find(|f| f.name.contains("lists"))
        .unwrap()
        .clone();
    let set = Call::SetLimit {
        limit: 2,
        value: 16 << 20,
    };
    assert_eq!(c.code(set), codes::SUCCESS);
    let (session, _) = session_of(&server, "heap-program");
    // The heap is not made yet: the session moves, its limit with it.
    order(
        &socket,
        &mut c,
        Call::SessionMove {
            session,
            device: 1,
            wait_ms: 5_000,
        },
    )
    .unwrap();
    let (sums, null, big) = (c.alloc(64 * 4), c.alloc(4), c.alloc(4));
    let values = [sums, null, big].map(|p| p.to_le_bytes().to_vec());
    c.post(launch_call(
        f.handle,
        [1, 1, 1],
        [64, 1, 1],
        params(&f.params, &values),
    ));
    assert_eq!(c.code(Call::ContextSynchronize), codes::SUCCESS);
    assert_eq!(
        c.read(big, 4).unwrap(),
        1u32.to_le_bytes(),
        "12 MiB fit the 16 MiB heap"
    );
    // Its kernels used the heap: refused, with the reason.
    let e = order(
        &socket,
        &mut c,
        Call::SessionMove {
            session,
            device: 0,
            wait_ms: 5_000,
        },
    )
    .unwrap_err();
    assert!(e.detail.contains("malloc heap"), "{e:?}");
    assert_eq!(session_of(&server, "heap-program").1, 1);
}

#[test]
fn modules_loaded_and_unloaded_while_the_target_is_made_ready_are_as_the_program_left_them() {
    let (server, socket, _dir) = two_cpu_devices("migrate-prepare");
    let mut c = Client::connect(&socket, "prepared-program", None);
    let add = load(&mut c, "vector_add");
    let gone = load(&mut c, "constant_and_device_globals");
    let (session, _) = session_of(&server, "prepared-program");
    let mut admin = Client::connect(&socket, "admin", None);
    let asking = std::thread::spawn(move || {
        admin.call(Call::SessionMove {
            session,
            device: 1,
            wait_ms: 5_000,
        })
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.orders().is_waiting(session) {
        assert!(Instant::now() < deadline, "the order never came");
        std::thread::sleep(Duration::from_millis(1));
    }
    // This call takes the order: device 1 is made ready while the program
    // goes on loading one module and unloading another.
    assert_eq!(c.code(Call::Fence), codes::SUCCESS);
    let saxpy = load(&mut c, "saxpy");
    assert_eq!(
        c.code(Call::ModuleUnload {
            module: gone.module
        }),
        codes::SUCCESS
    );
    while !asking.is_finished() {
        assert!(Instant::now() < deadline, "the move never ended");
        assert_eq!(c.code(Call::Fence), codes::SUCCESS);
        std::thread::sleep(Duration::from_millis(2));
    }
    let said = asking.join().unwrap().unwrap();
    let ReplyBody::Data(line) = said else {
        panic!("{said:?}")
    };
    assert!(String::from_utf8_lossy(&line).contains("moved"), "{line:?}");
    assert_eq!(session_of(&server, "prepared-program").1, 1);
    // Both loaded modules run on device 1; the unloaded one stays gone.
    let n = 1024usize;
    let bytes = 4 * n as u64;
    let (x, y) = (c.alloc(bytes), c.alloc(bytes));
    c.write(x, &floats(&vec![2.0; n]));
    c.write(y, &floats(&vec![1.0; n]));
    let f = &saxpy.functions[0];
    let p = params(
        &f.params,
        &[
            (n as i32).to_le_bytes().to_vec(),
            3.0f32.to_le_bytes().to_vec(),
            x.to_le_bytes().to_vec(),
            y.to_le_bytes().to_vec(),
        ],
    );
    c.post(launch_call_on(
        f.handle,
        [4, 1, 1],
        [256, 1, 1],
        DEFAULT_STREAM,
        p,
        Vec::new(),
    ));
    let f = &add.functions[0];
    let p = params(
        &f.params,
        &[
            y.to_le_bytes().to_vec(),
            x.to_le_bytes().to_vec(),
            y.to_le_bytes().to_vec(),
            (n as i32).to_le_bytes().to_vec(),
        ],
    );
    c.post(launch_call_on(
        f.handle,
        [4, 1, 1],
        [256, 1, 1],
        DEFAULT_STREAM,
        p,
        Vec::new(),
    ));
    assert_eq!(c.code(Call::ContextSynchronize), codes::SUCCESS);
    assert_eq!(c.read(y, bytes).unwrap(), floats(&vec![9.0; n]));
    assert_eq!(
        c.code(Call::ModuleUnload {
            module: gone.module
        }),
        codes::INVALID_HANDLE
    );
}

#[test]
fn a_hold_needs_a_client_that_can_resume_and_parking_needs_a_held_image() {
    let (server, socket, _dir) = two_cpu_devices("hold-refused");
    let mut c = Client::connect(&socket, "held", None);
    let p = c.alloc(64);
    c.write(p, b"state");
    let (session, _) = session_of(&server, "held");
    // Its client offered no resume (CUMUX_RESUME): nothing could resume it.
    let hold = Call::SessionCheckpoint {
        session,
        wait_ms: 5_000,
        hold: true,
    };
    let e = order(&socket, &mut c, hold).unwrap_err();
    assert!(e.detail.contains("CUMUX_RESUME=1"), "{e:?}");
    assert_eq!(&c.read(p, 5).unwrap(), b"state");
    let mut admin = Client::connect(&socket, "admin", None);
    let release = Call::SessionRelease {
        session,
        moved_to: Some("unix:/nowhere".into()),
    };
    let e = admin.call(release).unwrap_err();
    assert!(e.detail.contains("is not held"), "{e:?}");
    // A checkpoint without the hold, or garbage, is not parked.
    let plain = Call::SessionCheckpoint {
        session,
        wait_ms: 5_000,
        hold: false,
    };
    let image = match order(&socket, &mut c, plain) {
        Ok(ReplyBody::Data(image)) => image,
        other => panic!("{other:?}"),
    };
    let e = admin.call(Call::SessionPark { image }).unwrap_err();
    assert!(e.detail.contains("without --hold"), "{e:?}");
    let e = admin
        .call(Call::SessionPark {
            image: b"garbage".to_vec(),
        })
        .unwrap_err();
    assert!(e.detail.contains("not a session image"), "{e:?}");
    // The session runs on.
    c.write(p, b"later");
    assert_eq!(&c.read(p, 5).unwrap(), b"later");
}

/// `call` from `admin` while `program` keeps calling (orders are carried out
/// at the program's next call); the admin comes back with the answer.
fn order_from(
    mut admin: Client,
    program: &mut Client,
    call: Call,
) -> (Client, Result<ReplyBody, CuError>) {
    let asking = std::thread::spawn(move || {
        let answer = admin.call(call);
        (admin, answer)
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while !asking.is_finished() {
        assert!(Instant::now() < deadline, "the order was never answered");
        assert_eq!(program.code(Call::Fence), codes::SUCCESS);
        std::thread::sleep(Duration::from_millis(5));
    }
    asking.join().unwrap()
}

#[test]
fn a_checkpoint_larger_than_a_frame_travels_in_pieces() {
    let (server, socket, _dir) = two_cpu_devices("big-checkpoint");
    let mut c = Client::connect(&socket, "big", None);
    let size: u64 = 96 << 20;
    assert!(size > MAX_FRAME_BYTES as u64);
    let p = c.alloc(size);
    // Noise: a checkpoint stream of it stays as large as the memory.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..32 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    for third in 0..3 {
        c.write(p + third * (32 << 20), &noise);
    }
    c.write(p, b"head");
    c.write(p + size - 4, b"tail");
    let (session, _) = session_of(&server, "big");
    let admin = Client::connect(&socket, "admin", None);
    let checkpoint = Call::SessionCheckpoint {
        session,
        wait_ms: 5_000,
        hold: false,
    };
    let (mut admin, answer) = order_from(admin, &mut c, checkpoint);
    let bytes = match answer {
        Ok(ReplyBody::ImageStaged { bytes }) => bytes,
        other => panic!("{other:?}"),
    };
    assert!(bytes > size, "{bytes}");
    let mut image = Vec::new();
    while (image.len() as u64) < bytes {
        let offset = image.len() as u64;
        let piece = (bytes - offset).min(IMAGE_PIECE_BYTES as u64);
        match admin.call(Call::ImageRead {
            offset,
            bytes: piece,
        }) {
            Ok(ReplyBody::Data(d)) => image.extend_from_slice(&d),
            other => panic!("{other:?}"),
        }
    }
    // Read to its end, the staged image is gone.
    let e = admin
        .call(Call::ImageRead {
            offset: 0,
            bytes: 1,
        })
        .unwrap_err();
    assert!(e.detail.contains("staged image of 0"), "{e:?}");
    c.write(p, b"HEAD");
    // Pieces go in order.
    let e = admin
        .call(Call::ImageWrite {
            offset: 5,
            data: vec![1; 8],
        })
        .unwrap_err();
    assert!(e.detail.contains("in order"), "{e:?}");
    for (i, piece) in image.chunks(IMAGE_PIECE_BYTES).enumerate() {
        let write = Call::ImageWrite {
            offset: (i * IMAGE_PIECE_BYTES) as u64,
            data: piece.to_vec(),
        };
        assert_eq!(admin.call(write), Ok(ReplyBody::Unit));
    }
    let restore = Call::SessionRestore {
        session,
        image: Vec::new(),
        wait_ms: 5_000,
    };
    let (mut admin, answer) = order_from(admin, &mut c, restore);
    assert!(matches!(answer, Ok(ReplyBody::Data(_))), "{answer:?}");
    assert_eq!(&c.read(p, 4).unwrap(), b"head");
    assert_eq!(&c.read(p + size - 4, 4).unwrap(), b"tail");
    // Nothing staged any more: an empty image is refused.
    let restore = Call::SessionRestore {
        session,
        image: Vec::new(),
        wait_ms: 5_000,
    };
    let e = admin.call(restore).unwrap_err();
    assert!(e.detail.contains("none staged"), "{e:?}");
}
