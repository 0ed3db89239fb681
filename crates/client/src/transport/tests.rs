//! The transport's tests against fake servers: the handshake and its
//! refusals, a lost connection, shared memory, and fences.

use super::*;
use std::io::Read;
use std::os::unix::net::UnixListener;

/// Listens at `path`; in a thread, takes one connection and its hello
/// and hands them to `serve`.
fn fake(
    path: &std::path::Path,
    serve: impl FnOnce(std::os::unix::net::UnixStream, Hello) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let listener = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = Vec::new();
        proto::read_frame(&mut s, &mut buf).unwrap();
        let hello: Hello = proto::decode(&buf).unwrap();
        assert_eq!(hello.magic, proto::MAGIC);
        serve(s, hello);
    })
}

/// A one-connection fake server: answers the hello with `reply`, then
/// answers `calls` requests with `Unit` and hangs up.
fn fake_server(
    path: &std::path::Path,
    reply: HelloReply,
    calls: usize,
) -> std::thread::JoinHandle<()> {
    fake(path, move |mut s, _| {
        let mut buf = Vec::new();
        proto::write_frame(&mut s, &proto::encode(&reply).unwrap()).unwrap();
        for _ in 0..calls {
            proto::read_frame(&mut s, &mut buf).unwrap();
            let req: Request = proto::decode(&buf).unwrap();
            let reply = Reply {
                seq: req.seq,
                result: Ok(ReplyBody::Unit),
                stdout: Vec::new(),
            };
            proto::write_frame(&mut s, &proto::encode(&reply).unwrap()).unwrap();
        }
    })
}

/// A one-connection fake server that takes the client's shared area,
/// answers `calls` requests through it (echoing `MemcpyHtoD` data back as
/// `Data`), then dies without a word: no closed flag, only its socket goes.
fn fake_shm_server(path: &std::path::Path, calls: usize) -> std::thread::JoinHandle<()> {
    fake(path, move |mut s, hello| {
        let mut buf = Vec::new();
        assert!(hello.shm, "a unix-socket client offers shared memory");
        let welcome = HelloReply::Welcome {
            version: proto::PROTOCOL_VERSION,
            server: "fake-shm".into(),
            session: 1,
            devices: Vec::new(),
            shm: true,
            group: 0,
            resume: 0,
            resume_from: 0,
            lanes: None,
        };
        proto::write_frame(&mut s, &proto::encode(&welcome).unwrap()).unwrap();
        let mut header = [0u8; 4];
        let (got, fd) = shm::recv_with_fd(&s, &mut header).unwrap();
        s.read_exact(&mut header[got..]).unwrap();
        buf.resize(u32::from_le_bytes(header) as usize, 0);
        s.read_exact(&mut buf).unwrap();
        let attach: ShmAttach = proto::decode(&buf).unwrap();
        let area = ShmArea::attach(fd.unwrap(), attach.layout).unwrap();
        let answer = ShmAttached { result: Ok(()) };
        proto::write_frame(&mut s, &proto::encode(&answer).unwrap()).unwrap();
        let mut ep = Endpoint::new(area, Side::Server, None, shm::DEFAULT_SPIN);
        let mut bulk = Vec::new();
        for _ in 0..calls {
            ep.recv(&mut buf, &mut bulk).unwrap();
            let mut req: Request = proto::decode(&buf).unwrap();
            shm::put_call_bulk(&mut req.call, std::mem::take(&mut bulk)).unwrap();
            let body = match req.call {
                Call::MemcpyHtoD { data, .. } => ReplyBody::Data(data),
                Call::MemcpyDtoH { bytes, .. } => {
                    ReplyBody::Data((0..bytes as u32).map(|i| (i * 7) as u8).collect())
                }
                _ => ReplyBody::Unit,
            };
            let mut reply = Reply {
                seq: req.seq,
                result: Ok(body),
                stdout: Vec::new(),
            };
            let out = shm::take_reply_bulk(&mut reply);
            ep.send(&proto::encode(&reply).unwrap(), &out).unwrap();
        }
        std::mem::forget(ep);
    })
}

fn welcome(version: u32) -> HelloReply {
    HelloReply::Welcome {
        version,
        server: "fake".into(),
        session: 1,
        devices: Vec::new(),
        shm: false,
        group: 0,
        resume: 0,
        resume_from: 0,
        lanes: None,
    }
}

/// One test drives the three cases in turn, on one socket path.
#[test]
fn handshake_versions_and_a_lost_connection() {
    let dir = std::env::temp_dir().join(format!("cumux-client-transport-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let address = ServerAddress::Unix(sock.clone());

    // Nobody listening.
    let err = Connection::connect(&address, None, None).err().unwrap();
    assert!(err.contains("cannot reach the cumux server"), "{err}");

    // A rejection names both versions.
    let server = fake_server(
        &sock,
        HelloReply::Rejected {
            server_version: 99,
            reason: "too old".into(),
        },
        0,
    );
    let err = Connection::connect(&address, None, None).err().unwrap();
    assert!(
        err.contains("99") && err.contains(&proto::PROTOCOL_VERSION.to_string()),
        "{err}"
    );
    server.join().unwrap();
    std::fs::remove_file(&sock).unwrap();

    // A server of another version, even one that says welcome.
    let server = fake_server(&sock, welcome(proto::PROTOCOL_VERSION + 1), 0);
    let err = Connection::connect(&address, None, None).err().unwrap();
    assert!(err.contains("mismatch"), "{err}");
    server.join().unwrap();
    std::fs::remove_file(&sock).unwrap();

    // One answered call, then the server goes away: every later call
    // fails at once.
    let server = fake_server(&sock, welcome(proto::PROTOCOL_VERSION), 1);
    let (mut conn, session) = Connection::connect(&address, None, None).unwrap();
    assert_eq!(session.server, "fake");
    assert_eq!(conn.call(Call::ContextSynchronize), Ok(ReplyBody::Unit));
    server.join().unwrap();
    assert_eq!(
        conn.call(Call::ContextSynchronize),
        Err(CUDA_ERROR_DEVICE_UNAVAILABLE)
    );
    assert_eq!(
        conn.call(Call::MemGetInfo { device: 0 }),
        Err(CUDA_ERROR_DEVICE_UNAVAILABLE)
    );
    std::fs::remove_file(&sock).unwrap();

    // Through shared memory: a large buffer goes out and comes back, then
    // the server dies without a word and calls fail instead of hanging.
    let server = fake_shm_server(&sock, 2);
    let (mut conn, session) = Connection::connect(&address, None, None).unwrap();
    assert_eq!(session.server, "fake-shm");
    assert!(conn.uses_shm());
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let mut back = vec![0u8; data.len()];
    let echo = Call::MemcpyHtoD {
        dst: 0,
        data: Vec::new(),
        stream: None,
    };
    assert_eq!(
        conn.call_with_bytes(echo, &data),
        Ok(ReplyBody::Data(data.clone()))
    );
    let read = Call::MemcpyDtoH {
        src: 0,
        bytes: data.len() as u64,
        stream: None,
    };
    assert_eq!(conn.call_into(read, &mut back), Ok(()));
    assert!(back == data);
    server.join().unwrap();
    let started = std::time::Instant::now();
    assert_eq!(
        conn.call(Call::ContextSynchronize),
        Err(CUDA_ERROR_DEVICE_UNAVAILABLE)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(
        conn.call(Call::MemGetInfo { device: 0 }),
        Err(CUDA_ERROR_DEVICE_UNAVAILABLE)
    );
    std::fs::remove_file(&sock).unwrap();

    // CUMUX_TRANSPORT=socket keeps calls on the socket.
    std::env::set_var("CUMUX_TRANSPORT", "socket");
    let server = fake_server(&sock, welcome(proto::PROTOCOL_VERSION), 1);
    let (mut conn, _) = Connection::connect(&address, None, None).unwrap();
    assert!(!conn.uses_shm());
    assert_eq!(conn.call(Call::ContextSynchronize), Ok(ReplyBody::Unit));
    server.join().unwrap();
    std::fs::remove_file(&sock).unwrap();

    // Unanswered calls are fenced every SOCKET_FENCE_EVERY on a socket: the
    // client waits for the server to have taken them before it sends more.
    let every = super::SOCKET_FENCE_EVERY as usize;
    let server = fence_server(&sock, 2 * every + 10);
    let (mut conn, _) = Connection::connect(&address, None, None).unwrap();
    for _ in 0..2 * every + 10 {
        assert_eq!(conn.call(empty_launch()), Ok(ReplyBody::Unit));
    }
    assert_eq!(server.join().unwrap(), [every, 2 * every + 1]);
    std::fs::remove_file(&sock).unwrap();

    // On a socket the client does not wait for a fence's answer: only the
    // next fence waits for it. A server that answers each fence only after
    // the next 10 calls would stall a client that waited at once.
    let server = late_fence_server(&sock, 3 * every + 5, 10);
    let (mut conn, _) = Connection::connect(&address, None, None).unwrap();
    for _ in 0..3 * every + 5 {
        assert_eq!(conn.call(empty_launch()), Ok(ReplyBody::Unit));
    }
    // A call's own wait passes over the last fence's answer.
    assert_eq!(conn.call(Call::ContextSynchronize), Ok(ReplyBody::Unit));
    assert_eq!(
        server.join().unwrap(),
        [every, 2 * every + 1, 3 * every + 2]
    );
    std::env::remove_var("CUMUX_TRANSPORT");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A launch of nothing on the default stream: an unanswered call.
fn empty_launch() -> Call {
    Call::Launch {
        function: 1,
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
        stream: 0,
        params: Vec::new(),
        attributes: Vec::new(),
    }
}

/// A one-connection fake server on the socket that takes `launches`
/// unanswered calls and answers the fences among them: where each fence
/// came, by the index of the call.
fn fence_server(path: &std::path::Path, launches: usize) -> std::thread::JoinHandle<Vec<usize>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let fake = fake(path, move |mut s, _| {
        let welcome = welcome(proto::PROTOCOL_VERSION);
        proto::write_frame(&mut s, &proto::encode(&welcome).unwrap()).unwrap();
        let (mut buf, mut fences, mut taken) = (Vec::new(), Vec::new(), 0);
        let mut index = 0;
        while taken < launches {
            proto::read_frame(&mut s, &mut buf).unwrap();
            let req: Request = proto::decode(&buf).unwrap();
            if req.call.is_fire_and_forget() {
                taken += 1;
            } else {
                assert!(matches!(req.call, Call::Fence), "{:?}", req.call);
                fences.push(index);
                let reply = Reply {
                    seq: req.seq,
                    result: Ok(ReplyBody::Unit),
                    stdout: Vec::new(),
                };
                proto::write_frame(&mut s, &proto::encode(&reply).unwrap()).unwrap();
            }
            index += 1;
        }
        tx.send(fences).unwrap();
    });
    std::thread::spawn(move || {
        fake.join().unwrap();
        rx.recv().unwrap()
    })
}

/// A one-connection fake server on the socket that answers each fence only
/// once `late` more calls have come (or a waiting call comes), then answers
/// one waiting call and ends: where each fence came, by the index of the
/// call, and `usize::MAX` for each time the client stalled waiting for one.
fn late_fence_server(
    path: &std::path::Path,
    launches: usize,
    late: usize,
) -> std::thread::JoinHandle<Vec<usize>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let fake = fake(path, move |mut s, _| {
        let welcome = welcome(proto::PROTOCOL_VERSION);
        proto::write_frame(&mut s, &proto::encode(&welcome).unwrap()).unwrap();
        let answer = |s: &mut std::os::unix::net::UnixStream, seq: u64| {
            let reply = Reply {
                seq,
                result: Ok(ReplyBody::Unit),
                stdout: Vec::new(),
            };
            proto::write_frame(s, &proto::encode(&reply).unwrap()).unwrap();
        };
        let (mut buf, mut fences, mut held) = (Vec::new(), Vec::new(), Vec::new());
        let mut index = 0;
        // A client stuck on a held fence shows as a read that times out: the
        // fences are answered then, and the stall is reported.
        s.set_read_timeout(Some(std::time::Duration::from_secs(3)))
            .unwrap();
        loop {
            if let Err(e) = proto::read_frame(&mut s, &mut buf) {
                fences.push(usize::MAX);
                assert!(
                    !held.is_empty(),
                    "the client stalled with no fence held: {e:?}"
                );
                for (seq, _) in held.drain(..) {
                    answer(&mut s, seq);
                }
                continue;
            }
            let req: Request = proto::decode(&buf).unwrap();
            match req.call {
                Call::Fence => {
                    fences.push(index);
                    held.push((req.seq, index + late));
                }
                Call::ContextSynchronize => {
                    for (seq, _) in held.drain(..) {
                        answer(&mut s, seq);
                    }
                    answer(&mut s, req.seq);
                    break;
                }
                _ => assert!(req.call.is_fire_and_forget(), "{:?}", req.call),
            }
            while held.first().is_some_and(|&(_, due)| due <= index) {
                let (seq, _) = held.remove(0);
                answer(&mut s, seq);
            }
            index += 1;
        }
        let stalls = fences.iter().filter(|&&f| f == usize::MAX).count();
        assert_eq!(index, launches + fences.len() - stalls);
        tx.send(fences).unwrap();
    });
    std::thread::spawn(move || {
        fake.join().unwrap();
        rx.recv().unwrap()
    })
}

/// A welcome giving resume key `key`, resuming from `from`.
fn resumable_welcome(key: u64, from: u64) -> HelloReply {
    HelloReply::Welcome {
        version: proto::PROTOCOL_VERSION,
        server: "fake".into(),
        session: 1,
        devices: Vec::new(),
        shm: false,
        group: 0,
        resume: key,
        resume_from: from,
        lanes: None,
    }
}

/// The next request on `s`, its bulk frame put back into it.
fn next_request(s: &mut std::os::unix::net::UnixStream) -> Request {
    let mut buf = Vec::new();
    let bulk = proto::read_message(s, &mut buf).unwrap();
    let mut req: Request = proto::decode(&buf).unwrap();
    if let Some(len) = bulk {
        shm::put_call_bulk(&mut req.call, proto::read_bulk(s, len).unwrap()).unwrap();
    }
    req
}

#[test]
fn a_resumable_connection_sends_its_calls_again_where_its_session_resumes() {
    let dir = std::env::temp_dir().join(format!("cumux-client-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let address = ServerAddress::Unix(sock.clone());
    let launch = || Call::Launch {
        function: 1,
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
        stream: 0,
        params: vec![7; 600],
        attributes: Vec::new(),
    };
    // The first server takes three launches, then dies: its state was
    // checkpointed at the second (seq 2).
    let first = fake(&sock, |mut s, hello| {
        assert_eq!(hello.resume, Some(0), "CUMUX_RESUME=1 offers to resume");
        proto::write_frame(&mut s, &proto::encode(&resumable_welcome(42, 0)).unwrap()).unwrap();
        for seq in 1..=3 {
            assert_eq!(next_request(&mut s).seq, seq);
        }
    });
    std::env::set_var(resume::ENV, "1");
    let (mut conn, session) = Connection::connect(&address, None, None).unwrap();
    std::env::remove_var(resume::ENV);
    assert_eq!(session.resume, 42);
    for _ in 0..3 {
        assert_eq!(conn.call(launch()), Ok(ReplyBody::Unit));
    }
    first.join().unwrap();
    std::fs::remove_file(&sock).unwrap();
    // The second names the key and wants calls 2 on: launches 2 and 3
    // (their bytes too) and the synchronize, which it answers.
    let second = fake(&sock, |mut s, hello| {
        assert_eq!(hello.resume, Some(42));
        proto::write_frame(&mut s, &proto::encode(&resumable_welcome(42, 2)).unwrap()).unwrap();
        for seq in 2..=3 {
            let req = next_request(&mut s);
            assert_eq!(req.seq, seq);
            assert!(matches!(req.call, Call::Launch { ref params, .. } if params == &[7; 600]));
        }
        let sync = next_request(&mut s);
        assert_eq!((sync.seq, &sync.call), (4, &Call::ContextSynchronize));
        let reply = Reply {
            seq: 4,
            result: Ok(ReplyBody::Unit),
            stdout: Vec::new(),
        };
        proto::write_frame(&mut s, &proto::encode(&reply).unwrap()).unwrap();
    });
    assert_eq!(conn.call(Call::ContextSynchronize), Ok(ReplyBody::Unit));
    second.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Unanswered calls on a socket go out together: behind a link, 100
/// launches and the synchronize after them reach the server in order in
/// one write; a launch that nothing follows goes out from the flusher.
#[test]
fn unanswered_calls_on_a_socket_go_out_together() {
    let dir = std::env::temp_dir().join(format!("cumux-client-batch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("s.sock");
    let address = ServerAddress::Unix(sock.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let server = fake(&sock, move |mut s, _| {
        // The welcome takes no shared memory: calls stay on the socket.
        let welcome = welcome(proto::PROTOCOL_VERSION);
        proto::write_frame(&mut s, &proto::encode(&welcome).unwrap()).unwrap();
        let mut buf = Vec::new();
        let mut seqs = Vec::new();
        while seqs.len() < 102 {
            proto::read_frame(&mut s, &mut buf).unwrap();
            let req: Request = proto::decode(&buf).unwrap();
            seqs.push(req.seq);
            if !req.call.is_fire_and_forget() {
                let reply = Reply {
                    seq: req.seq,
                    result: Ok(ReplyBody::Unit),
                    stdout: Vec::new(),
                };
                proto::write_frame(&mut s, &proto::encode(&reply).unwrap()).unwrap();
            }
        }
        tx.send(seqs).unwrap();
    });
    let (mut conn, _) = Connection::connect(&address, None, None).unwrap();
    assert!(!conn.uses_shm());
    // Old enough only after the test: the size, a waiting call or the
    // flusher sends the batch.
    conn.batch = batch::Batch::new(std::time::Duration::from_secs(60));
    let link = Link::new(conn);
    for _ in 0..100 {
        assert_eq!(link.call(empty_launch()), Ok(ReplyBody::Unit));
    }
    assert_eq!(link.call(Call::ContextSynchronize), Ok(ReplyBody::Unit));
    assert_eq!(link.lock().batch.writes(), 1, "one write for 101 calls");
    // The flusher writes a batch once it is as old as its own age.
    link.lock()
        .batch
        .set_age(std::time::Duration::from_millis(1));
    assert_eq!(link.call(empty_launch()), Ok(ReplyBody::Unit));
    let seqs = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the last launch arrives with nothing after it");
    assert_eq!(seqs, (1..=102).collect::<Vec<u64>>());
    assert_eq!(link.lock().batch.writes(), 2);
    server.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The flusher never waits on a connection another thread holds: while one
/// link is held (as by a call waiting for its answer), another link's
/// unanswered launch still goes out; the held one's goes once it is free.
#[test]
fn a_held_connection_holds_up_no_other_batch() {
    let dir = std::env::temp_dir().join(format!("cumux-client-held-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut links = Vec::new();
    let mut arrived = Vec::new();
    let mut servers = Vec::new();
    for name in ["a", "b"] {
        let sock = dir.join(format!("{name}.sock"));
        let (tx, rx) = std::sync::mpsc::channel();
        servers.push(fake(&sock, move |mut s, _| {
            let welcome = welcome(proto::PROTOCOL_VERSION);
            proto::write_frame(&mut s, &proto::encode(&welcome).unwrap()).unwrap();
            tx.send(next_request(&mut s).seq).unwrap();
        }));
        let (mut conn, _) = Connection::connect(&ServerAddress::Unix(sock), None, None).unwrap();
        conn.batch = batch::Batch::new(std::time::Duration::from_millis(1));
        links.push(Link::new(conn));
        arrived.push(rx);
    }
    let patience = std::time::Duration::from_secs(10);
    assert_eq!(links[0].call(empty_launch()), Ok(ReplyBody::Unit));
    let held = links[0].lock();
    assert_eq!(links[1].call(empty_launch()), Ok(ReplyBody::Unit));
    assert_eq!(
        arrived[1].recv_timeout(patience),
        Ok(1),
        "b's launch goes out while a is held"
    );
    assert!(
        arrived[0].try_recv().is_err(),
        "a's batch waits for its lock"
    );
    drop(held);
    assert_eq!(
        arrived[0].recv_timeout(patience),
        Ok(1),
        "a's launch goes once a is free"
    );
    for s in servers {
        s.join().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
