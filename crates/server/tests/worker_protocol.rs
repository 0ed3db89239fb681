//! The worker protocol in one process: a thread serves the CPU device over a
//! socket pair as `cumux worker` would, and a `WorkerContext` drives it —
//! every call, printf through the stdout stream, sticky faults, a worker that
//! goes away, undecodable frames, and stream-ordered work posted unanswered.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::JoinHandle;

use cumux_protocol::{codes, decode, encode, read_frame, write_frame, CuError};
use cumux_server::device::cpu::CpuDevice;
use cumux_server::device::pieces::MemPiece;
use cumux_server::device::{
    DeviceContext, HostRegion, KernelLaunch, LaunchGeometry, LoadedModule, MemFill, StreamWork,
    SyncTarget,
};
use cumux_server::worker::context::WorkerContext;
use cumux_server::worker::process::{serve_worker, WorkerStdout};
use cumux_server::worker::wire::{
    new_nonce, WireWork, WorkerReply, WorkerRequest, WorkerValue, NONCE_BYTES,
};

/// Serves a CPU device of `memory` bytes over `conn` as `cumux worker` would,
/// its printf going to `out` after markers of `nonce`.
fn serve_cpu_worker(
    memory: u64,
    conn: UnixStream,
    mut out: UnixStream,
    nonce: [u8; NONCE_BYTES],
) -> std::io::Result<()> {
    let device = CpuDevice::new(memory);
    let flush = || {};
    let mut stdout = WorkerStdout {
        out: &mut out,
        flush_c_stdio: &flush,
        image_may_print: &|_| false,
        nonce,
    };
    serve_worker(&device, conn, &mut stdout)
}

/// A CPU-device worker on a thread; returns the context driving it, a handle
/// on the worker's end of the socket (to cut it), and the thread.
fn in_process_worker(memory: u64) -> (WorkerContext, UnixStream, JoinHandle<()>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (stdout_read, stdout_write) = UnixStream::pair().unwrap();
    let cut = theirs.try_clone().unwrap();
    let nonce = new_nonce();
    let thread = std::thread::spawn(move || {
        let _ = serve_cpu_worker(memory, theirs, stdout_write, nonce);
    });
    let ctx = WorkerContext::attach(
        ours,
        stdout_read,
        nonce,
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(1)),
    )
    .expect("the worker becomes ready");
    (ctx, cut, thread)
}

/// The kernel of the corpus program `name`, loaded into `ctx`: its module, its
/// index there, and a zeroed parameter buffer of its size.
fn load_corpus_kernel(ctx: &WorkerContext, name: &str) -> (LoadedModule, usize, Vec<u8>) {
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source(name));
    let module = ctx.module_load(ptx.as_bytes()).unwrap();
    let kernel = module
        .kernels
        .iter()
        .position(|k| k.name.contains(name))
        .expect("the kernel");
    let params = vec![0u8; module.kernels[kernel].params_bytes() as usize];
    (module, kernel, params)
}

/// Kernel `kernel` of `module` on one block of `threads`.
fn one_block(module: u64, kernel: usize, threads: u32, params: &[u8]) -> KernelLaunch {
    KernelLaunch {
        module,
        kernel,
        geometry: LaunchGeometry {
            grid: [1, 1, 1],
            block: [threads, 1, 1],
            dynamic_shared_bytes: 0,
            attributes: Vec::new(),
        },
        params: params.to_vec(),
    }
}

#[test]
fn a_span_is_read_in_pieces_with_fills_found_by_the_worker_and_the_link_kept_in_step() {
    let (ctx, _cut, _thread) = in_process_worker(64 << 20);
    let piece = 1usize << 20;
    let len = 5 * piece + 123;
    let a = ctx.mem_alloc(len as u64).unwrap();
    // Pieces by turns: noise, one value, noise, zeros, noise, and a tail.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..len)
        .map(|i| match (i / piece) % 4 {
            1 => 0x5a,
            3 => 0,
            _ => {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            }
        })
        .collect();
    ctx.mem_write(a, &data).unwrap();
    let mut got = Vec::new();
    ctx.mem_read_pieces(a, len as u64, piece, &mut |n| vec![0; n], &mut |at, p| {
        got.push((at, p));
        Ok(())
    })
    .unwrap();
    assert_eq!(got.len(), 6);
    for (i, (at, p)) in got.into_iter().enumerate() {
        assert_eq!(at, a + (i * piece) as u64);
        let want = &data[i * piece..((i + 1) * piece).min(len)];
        match (i % 4, p) {
            (1, MemPiece::Fill { value, len }) => {
                assert_eq!((value, len), (0x5a, want.len() as u64))
            }
            (3, MemPiece::Fill { value, len }) => assert_eq!((value, len), (0, want.len() as u64)),
            (0 | 2, MemPiece::Bytes(bytes)) => assert!(bytes == want, "piece {i} differs"),
            (_, p) => panic!("piece {i}: {p:?}"),
        }
    }
    // A taker that fails stops taking; the span's other answers are read,
    // so the next call gets its own answer.
    let mut calls = 0;
    let stop = ctx.mem_read_pieces(a, len as u64, piece, &mut |n| vec![0; n], &mut |_, _| {
        calls += 1;
        Err(CuError::new(codes::INVALID_VALUE, "disk full"))
    });
    assert_eq!(stop.unwrap_err().detail, "disk full");
    assert_eq!(calls, 1);
    let mut back = vec![0u8; len];
    ctx.mem_read(a, &mut back).unwrap();
    assert!(back == data);
    // A span that runs off the allocation: the worker's error, after the
    // pieces before it; the link still in step.
    let mut taken = 0;
    let off = ctx.mem_read_pieces(a, 100 << 20, piece, &mut |n| vec![0; n], &mut |_, _| {
        taken += 1;
        Ok(())
    });
    assert!(off.is_err());
    assert!(taken <= 6, "{taken}");
    ctx.mem_read(a, &mut back).unwrap();
    assert!(back == data);
    // Pieces of nothing or past a frame are refused.
    for bad in [0, 65 << 20] {
        let refused = ctx.mem_read_pieces(a, 16, bad, &mut |n| vec![0; n], &mut |_, _| Ok(()));
        assert_eq!(refused.unwrap_err().code, codes::INVALID_VALUE);
    }
}

#[test]
fn every_call_round_trips_and_printf_comes_through_the_stdout_stream() {
    let (ctx, _cut, _thread) = in_process_worker(64 << 20);
    // Offered and taken at connect: calls go through shared memory.
    assert_eq!(ctx.transport(), "shm");
    // Memory.
    let a = ctx.mem_alloc(4096).unwrap();
    let b = ctx.mem_alloc(4096).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    ctx.mem_write(a, &data).unwrap();
    let mut back = vec![0u8; 4096];
    ctx.mem_read(a, &mut back).unwrap();
    assert_eq!(back, data);
    ctx.mem_copy(b, a, 4096).unwrap();
    ctx.mem_fill(b, &[0xab, 0xcd], 8).unwrap();
    ctx.mem_read(b, &mut back).unwrap();
    assert_eq!(&back[..16], &[0xab, 0xcd].repeat(8)[..]);
    assert_eq!(&back[16..], &data[16..]);
    assert_eq!(
        ctx.mem_fill(b, &[1, 2, 3], 1).unwrap_err().code,
        codes::INVALID_VALUE
    );
    ctx.mem_free(b, 4096).unwrap();

    // A module that prints: its lines come back with the launch.
    let (module, kernel, mut params) = load_corpus_kernel(&ctx, "printf_kernel");
    params[..4].copy_from_slice(&7i32.to_le_bytes());
    params[4..8].copy_from_slice(&1.25f32.to_le_bytes());
    let outcome = ctx.launch(&one_block(module.id, kernel, 64, &params));
    assert_eq!(outcome.result, Ok(()));
    let text = String::from_utf8_lossy(&outcome.stdout);
    assert_eq!(
        text, "block 0: int=7 float=1.250 str=first char=A big=1099511627776\n",
        "{text:?}"
    );
    // Nothing is left over for the next launch.
    let again = ctx.launch(&one_block(module.id, kernel, 64, &params));
    assert_eq!(again.stdout, outcome.stdout);

    // Bad handles are errors, not faults.
    let bad = ctx.launch(&one_block(module.id + 99, 0, 1, &[]));
    assert_eq!(bad.result.unwrap_err().code, codes::INVALID_HANDLE);
    let bad = ctx.launch(&one_block(module.id, 99, 1, &[]));
    assert_eq!(bad.result.unwrap_err().code, codes::INVALID_HANDLE);
    ctx.module_unload(module.id);
    let gone = ctx.launch(&one_block(module.id, kernel, 1, &params));
    assert_eq!(gone.result.unwrap_err().code, codes::INVALID_HANDLE);
    ctx.mem_free(a, 4096).unwrap();
}

#[test]
fn large_transfers_are_split_into_frames() {
    let (ctx, _cut, _thread) = in_process_worker(256 << 20);
    let bytes = (cumux_protocol::framing::MAX_CHUNK_BYTES / 2) * 3;
    let ptr = ctx.mem_alloc(bytes as u64).unwrap();
    let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
    ctx.mem_write(ptr, &data).unwrap();
    let mut back = vec![0u8; bytes];
    ctx.mem_read(ptr, &mut back).unwrap();
    assert!(back == data, "a split transfer came back changed");
}

#[test]
fn a_fault_is_sticky_for_the_context() {
    let (ctx, _cut, _thread) = in_process_worker(64 << 20);
    let (module, kernel, mut params) = load_corpus_kernel(&ctx, "out_of_bounds");
    let data = ctx.mem_alloc(256).unwrap();
    params[..8].copy_from_slice(&data.to_le_bytes());
    params[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let outcome = ctx.launch(&one_block(module.id, kernel, 1, &params));
    let fault = outcome
        .result
        .expect_err("an access far out of bounds faults");
    assert!(
        fault.code == codes::ILLEGAL_ADDRESS || fault.code == codes::LAUNCH_FAILED,
        "{fault}"
    );
    assert_eq!(ctx.mem_alloc(16).unwrap_err(), fault);
    let mut buf = [0u8; 4];
    assert_eq!(ctx.mem_read(data, &mut buf).unwrap_err(), fault);
}

#[test]
fn a_worker_that_goes_away_fails_every_later_call() {
    let (ctx, cut, thread) = in_process_worker(64 << 20);
    let ptr = ctx.mem_alloc(64).unwrap();
    cut.shutdown(std::net::Shutdown::Both).unwrap();
    thread.join().unwrap();
    let e = ctx.mem_write(ptr, &[0; 64]).unwrap_err();
    assert_eq!(e.code, codes::LAUNCH_FAILED, "{e}");
    assert_eq!(ctx.mem_alloc(8).unwrap_err(), e);
    let outcome = ctx.launch(&one_block(1, 0, 1, &[]));
    // The module is unknown here, so the handle check answers first.
    assert!(outcome.result.is_err());
    drop(ctx);
}

/// A context dropped by the server ends its worker's loop (over shared
/// memory, the closed flag wakes the worker at once).
#[test]
fn a_dropped_context_ends_its_worker() {
    let (ctx, _cut, thread) = in_process_worker(64 << 20);
    assert_eq!(ctx.transport(), "shm");
    ctx.mem_alloc(64).unwrap();
    drop(ctx);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        thread.join().unwrap();
        done_tx.send(()).unwrap();
    });
    done_rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("the worker kept serving a dropped context");
}

#[test]
fn undecodable_frames_are_answered_and_the_worker_goes_on() {
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let (_stdout_read, stdout_write) = UnixStream::pair().unwrap();
    let thread =
        std::thread::spawn(move || serve_cpu_worker(1 << 20, theirs, stdout_write, [7; 16]));
    let mut buf = Vec::new();
    let mut receive = |s: &mut UnixStream| -> WorkerReply {
        read_frame(s, &mut buf).unwrap();
        decode(&buf).unwrap()
    };
    assert_eq!(receive(&mut ours).result, Ok(WorkerValue::Ready));
    for garbage in [&[][..], &[0xff; 9][..], &[200, 1, 2][..]] {
        write_frame(&mut ours, garbage).unwrap();
        let reply = receive(&mut ours);
        assert_eq!(reply.result.unwrap_err().code, codes::INVALID_VALUE);
    }
    // A read far over the frame limit is refused, not attempted.
    let huge = WorkerRequest::MemRead {
        src: 0,
        len: 1 << 40,
    };
    write_frame(&mut ours, &encode(&huge).unwrap()).unwrap();
    assert_eq!(
        receive(&mut ours).result.unwrap_err().code,
        codes::INVALID_VALUE
    );
    // So are pieces of nothing, and spans over the limit, each with one answer.
    for (len, piece) in [(16, 0), (1 << 40, 4096)] {
        let pieces = WorkerRequest::MemReadPieces { src: 0, len, piece };
        write_frame(&mut ours, &encode(&pieces).unwrap()).unwrap();
        assert_eq!(
            receive(&mut ours).result.unwrap_err().code,
            codes::INVALID_VALUE
        );
    }
    let alloc = WorkerRequest::MemAlloc { bytes: 64 };
    write_frame(&mut ours, &encode(&alloc).unwrap()).unwrap();
    assert!(matches!(receive(&mut ours).result, Ok(WorkerValue::Ptr(_))));
    // A frame cut short ends the worker cleanly.
    ours.write_all(&100u32.to_le_bytes()).unwrap();
    ours.write_all(&[1, 2, 3]).unwrap();
    drop(ours);
    assert!(thread.join().unwrap().is_err());
}

// ----- stream order kept by the worker -----

const STREAM: u64 = 0x200;

#[test]
fn stream_work_is_queued_in_order_and_waited_for() {
    let (ctx, _cut, _thread) = in_process_worker(64 << 20);
    let so = ctx.stream_ordered().expect("a worker keeps stream order");
    let a = ctx.mem_alloc(4096).unwrap();
    so.stream_create(STREAM, 1, -1).unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 3) as u8).collect();
    so.enqueue(
        STREAM,
        StreamWork::Write {
            dst: a,
            data: data.clone(),
        },
    );
    // Two rows of 16 bytes, 32 apart, after the write in stream order.
    so.enqueue(
        STREAM,
        StreamWork::Fill(MemFill {
            dst: a,
            pattern: vec![0xab],
            count: 16,
            pitch: 32,
            height: 2,
        }),
    );
    so.event_create(0x300, 0).unwrap();
    so.event_create(0x301, 0).unwrap();
    so.enqueue(STREAM, StreamWork::Record { event: 0x300 });

    // A printing kernel: its text comes back with the next wait.
    let (module, kernel, mut params) = load_corpus_kernel(&ctx, "printf_kernel");
    params[..4].copy_from_slice(&7i32.to_le_bytes());
    params[4..8].copy_from_slice(&1.25f32.to_le_bytes());
    let launch = StreamWork::Launch(one_block(module.id, kernel, 32, &params));
    so.enqueue(STREAM, launch.clone());
    so.enqueue(STREAM, StreamWork::Record { event: 0x301 });
    so.enqueue(STREAM, StreamWork::Wait { event: 0x300 });

    let mut back = vec![0u8; 4096];
    let read = so.read(STREAM, a, &mut back);
    assert_eq!(read.result, Ok(()));
    let mut want = data.clone();
    want[..16].fill(0xab);
    want[32..48].fill(0xab);
    assert!(back == want, "stream work ran out of order");
    let text = String::from_utf8_lossy(&read.stdout);
    assert!(text.starts_with("block 0: int=7"), "{text:?}");

    let synced = so.synchronize(SyncTarget::Stream(STREAM));
    assert_eq!(synced.result, Ok(()));
    assert_eq!(so.query(SyncTarget::Stream(STREAM)), Ok(true));
    assert_eq!(so.query(SyncTarget::Event(0x301)), Ok(true));
    let ms = so.elapsed_ms(0x300, 0x301).unwrap();
    assert!(ms >= 0.0, "{ms}");
    assert_eq!(
        so.synchronize(SyncTarget::Event(0x301)).result,
        Ok(()),
        "an event wait"
    );
    // The default stream is always there; the context wait covers everything.
    so.enqueue(cumux_protocol::DEFAULT_STREAM, launch);
    let all = so.synchronize(SyncTarget::Context);
    assert_eq!(all.result, Ok(()));
    assert!(String::from_utf8_lossy(&all.stdout).contains("int=7"));
    so.event_destroy(0x300).unwrap();
    so.stream_destroy(STREAM).unwrap();
    assert_eq!(
        so.stream_destroy(STREAM).unwrap_err().code,
        codes::INVALID_HANDLE
    );
}

#[test]
fn a_failure_of_queued_work_comes_back_from_the_next_wait_once() {
    let (ctx, _cut, _thread) = in_process_worker(64 << 20);
    let so = ctx.stream_ordered().unwrap();
    // An unknown module, found before posting; an unknown stream and event,
    // found by the worker.
    so.enqueue(
        cumux_protocol::DEFAULT_STREAM,
        StreamWork::Launch(one_block(999, 0, 1, &[])),
    );
    let e = so.synchronize(SyncTarget::Context).result.unwrap_err();
    assert_eq!(e.code, codes::INVALID_HANDLE, "{e}");
    assert_eq!(so.synchronize(SyncTarget::Context).result, Ok(()));
    so.enqueue(0x999, StreamWork::Record { event: 1 });
    let e = so.synchronize(SyncTarget::Context).result.unwrap_err();
    assert_eq!(e.code, codes::INVALID_HANDLE, "{e}");
    so.enqueue(
        cumux_protocol::DEFAULT_STREAM,
        StreamWork::Wait { event: 5 },
    );
    assert_eq!(
        so.query(SyncTarget::Stream(cumux_protocol::DEFAULT_STREAM))
            .unwrap_err()
            .code,
        codes::INVALID_HANDLE
    );

    // A fault in queued work is sticky for the context.
    let (module, kernel, mut params) = load_corpus_kernel(&ctx, "out_of_bounds");
    let data = ctx.mem_alloc(256).unwrap();
    params[..8].copy_from_slice(&data.to_le_bytes());
    params[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    so.enqueue(
        cumux_protocol::DEFAULT_STREAM,
        StreamWork::Launch(one_block(module.id, kernel, 1, &params)),
    );
    let fault = so.synchronize(SyncTarget::Context).result.unwrap_err();
    assert!(
        fault.code == codes::ILLEGAL_ADDRESS || fault.code == codes::LAUNCH_FAILED,
        "{fault}"
    );
    assert_eq!(ctx.mem_alloc(16).unwrap_err(), fault);
}

/// A worker that says ready and then reads requests without ever answering.
fn silent_worker() -> (WorkerContext, std::sync::mpsc::Receiver<WorkerRequest>) {
    let (ours, mut theirs) = UnixStream::pair().unwrap();
    let (_stdout_read, stdout_write) = UnixStream::pair().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _keep = stdout_write;
        let ready = WorkerReply {
            result: Ok(WorkerValue::Ready),
            marker: None,
        };
        write_frame(&mut theirs, &encode(&ready).unwrap()).unwrap();
        let mut buf = Vec::new();
        while read_frame(&mut theirs, &mut buf).is_ok() {
            if let Ok(request) = decode::<WorkerRequest>(&buf) {
                // An offer of shared memory is refused: the link stays on the socket.
                if let WorkerRequest::ShmAttach { .. } = request {
                    let no = WorkerReply {
                        result: Err(CuError::new(codes::NOT_SUPPORTED, "no shm")),
                        marker: None,
                    };
                    write_frame(&mut theirs, &encode(&no).unwrap()).unwrap();
                    continue;
                }
                let _ = tx.send(request);
            }
        }
    });
    let ctx = WorkerContext::attach(
        ours,
        _stdout_read,
        [1; 16],
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(1)),
    )
    .unwrap();
    // The offer was refused: calls stay on the socket.
    assert_eq!(ctx.transport(), "socket");
    (ctx, rx)
}

#[test]
fn queued_work_is_posted_without_waiting_for_an_answer() {
    let (ctx, requests) = silent_worker();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let so = ctx.stream_ordered().unwrap();
        for i in 0..100u64 {
            so.enqueue(
                cumux_protocol::DEFAULT_STREAM,
                StreamWork::Copy {
                    dst: 0x1000 + i,
                    src: 0x2000,
                    bytes: 1,
                },
            );
        }
        done_tx.send(()).unwrap();
        // Keep the context (and its socket) until the test has looked.
        std::thread::sleep(std::time::Duration::from_secs(5));
    });
    // The worker answers nothing: a round trip per call would never end.
    done_rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("queueing work waited for an answer");
    for i in 0..100u64 {
        let request = requests
            .recv_timeout(std::time::Duration::from_secs(5))
            .unwrap();
        assert!(
            matches!(&request, WorkerRequest::Enqueue { work: WireWork::Copy { dst, .. }, .. } if *dst == 0x1000 + i),
            "{request:?} out of order"
        );
    }
}

/// `shared` mode's further connections: one without the worker's token is
/// closed; one with it reaches the same context (memory allocated there is
/// the context's, freed through either).
#[test]
fn session_connections_need_the_token_and_share_the_context() {
    let (ctx, _cut, _thread) = in_process_worker(64 << 20);
    let second = ctx.open_connection().expect("a second connection");
    assert_eq!(second.transport(), "shm");
    let p = second.mem_alloc(256).unwrap();
    second.mem_write(p, &[9; 256]).unwrap();
    let mut back = [0u8; 256];
    ctx.mem_read(p, &mut back).unwrap();
    assert_eq!(back, [9; 256], "both connections see one context");
    // Asking again gives the same listener; an impostor gets nothing.
    let (path, _token) = match ctx_sessions(&ctx) {
        Some(found) => found,
        None => panic!("the listener is known"),
    };
    let mut impostor = UnixStream::connect(&path).unwrap();
    write_frame(&mut impostor, &[0u8; 16]).unwrap();
    // The worker may have closed it already, which is what this checks.
    let _ = write_frame(
        &mut impostor,
        &encode(&WorkerRequest::MemAlloc { bytes: 8 }).unwrap(),
    );
    impostor
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut buf = Vec::new();
    assert!(
        read_frame(&mut impostor, &mut buf).is_err(),
        "a connection without the token was served"
    );
    second.mem_free(p, 256).unwrap();
}

/// Where `ctx`'s worker takes further connections, asked anew.
fn ctx_sessions(ctx: &WorkerContext) -> Option<(std::path::PathBuf, [u8; 16])> {
    let third = ctx.open_connection().ok()?;
    drop(third);
    ctx.sessions_address()
}

/// A pinned host region travels to the worker with its memfd; copies name it
/// and run there, in stream order; it goes when unregistered, and with the
/// connection that registered it.
#[test]
fn pinned_regions_travel_to_the_worker_and_go_with_its_connection() {
    use cumux_protocol::pinned::{create_memfd, live_mappings, HostMapping};
    use cumux_server::device::host_span::HostSpan;
    use std::os::fd::AsFd;

    let (ctx, _cut, thread) = in_process_worker(64 << 20);
    let len = 64u64 << 10;
    let fd = create_memfd(len).unwrap();
    let map = Arc::new(HostMapping::map(fd.as_fd(), len).unwrap());
    let before = live_mappings();
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
    // SAFETY: nothing else uses the mapping meanwhile.
    unsafe { map.bytes_mut(0, 4096) }
        .unwrap()
        .copy_from_slice(&pattern);
    let region = |id| HostRegion {
        id,
        mapping: &map,
        fd: fd.as_fd(),
        client_base: map.as_ptr() as u64,
    };
    ctx.host_register(region(7)).unwrap();
    assert_eq!(live_mappings(), before + 1, "the worker maps it");
    let span = |offset, bytes| HostSpan {
        region: 7,
        offset,
        bytes,
        mapping: None,
    };
    let ordered = ctx.stream_ordered().unwrap();
    let a = ctx.mem_alloc(8192).unwrap();
    ordered.enqueue(
        0,
        StreamWork::HostToDevice {
            dst: a,
            host: span(0, 4096),
        },
    );
    ordered.enqueue(
        0,
        StreamWork::DeviceToHost {
            src: a,
            host: span(8192, 4096),
        },
    );
    assert_eq!(ordered.synchronize(SyncTarget::Context).result, Ok(()));
    assert!(map.bytes(8192, 4096).unwrap() == pattern);
    // Outside the region, or a region the worker never got: the next wait fails.
    ordered.enqueue(
        0,
        StreamWork::HostToDevice {
            dst: a,
            host: span(len - 1, 2),
        },
    );
    let failed = ordered.synchronize(SyncTarget::Context).result;
    assert_eq!(failed.unwrap_err().code, codes::INVALID_VALUE);
    ordered.enqueue(
        0,
        StreamWork::DeviceToHost {
            src: a,
            host: HostSpan {
                region: 8,
                ..span(0, 16)
            },
        },
    );
    let failed = ordered.synchronize(SyncTarget::Context).result;
    assert_eq!(failed.unwrap_err().code, codes::INVALID_VALUE);
    // Unregistered: unmapped in the worker.
    ctx.host_unregister(7);
    assert_eq!(live_mappings(), before);
    // A region the connection still holds goes when the connection does.
    ctx.host_register(region(9)).unwrap();
    assert_eq!(live_mappings(), before + 1);
    drop(ctx);
    thread.join().unwrap();
    assert_eq!(live_mappings(), before);
}
