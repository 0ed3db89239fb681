//! The worker protocol in one process: a thread serves the CPU device over a
//! socket pair as `cumux worker` would, and a `WorkerContext` drives it —
//! every call, printf through the stdout stream, sticky faults, a worker that
//! goes away, and undecodable frames.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::JoinHandle;

use cumux_protocol::{codes, decode, encode, read_frame, write_frame};
use cumux_server::device::cpu::CpuDevice;
use cumux_server::device::worker::{
    new_nonce, serve_worker, WorkerContext, WorkerReply, WorkerRequest, WorkerStdout, WorkerValue,
};
use cumux_server::device::{DeviceContext, LaunchGeometry};

/// A CPU-device worker on a thread; returns the context driving it, a handle
/// on the worker's end of the socket (to cut it), and the thread.
fn in_process_worker(memory: u64) -> (WorkerContext, UnixStream, JoinHandle<()>) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let (stdout_read, stdout_write) = UnixStream::pair().unwrap();
    let cut = theirs.try_clone().unwrap();
    let nonce = new_nonce();
    let thread = std::thread::spawn(move || {
        let device = CpuDevice::new(memory);
        let mut out = stdout_write;
        let flush = || {};
        let mut stdout = WorkerStdout {
            out: &mut out,
            flush_c_stdio: &flush,
            image_may_print: &|_| false,
            nonce,
        };
        let _ = serve_worker(&device, theirs, &mut stdout);
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

fn one_block(threads: u32) -> LaunchGeometry {
    LaunchGeometry {
        grid: [1, 1, 1],
        block: [threads, 1, 1],
        dynamic_shared_bytes: 0,
    }
}

#[test]
fn every_call_round_trips_and_printf_comes_through_the_stdout_stream() {
    let (ctx, _cut, _thread) = in_process_worker(64 << 20);
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
    ctx.mem_free(b).unwrap();

    // A module that prints: its lines come back with the launch.
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source("printf_kernel"));
    let module = ctx.module_load(ptx.as_bytes()).unwrap();
    let kernel = module
        .kernels
        .iter()
        .position(|k| k.name.contains("printf_kernel"))
        .expect("the kernel");
    let mut params = vec![0u8; module.kernels[kernel].params_bytes() as usize];
    params[..4].copy_from_slice(&7i32.to_le_bytes());
    params[4..8].copy_from_slice(&1.25f32.to_le_bytes());
    let outcome = ctx.launch(module.id, kernel, &one_block(64), &params);
    assert_eq!(outcome.result, Ok(()));
    let text = String::from_utf8_lossy(&outcome.stdout);
    assert_eq!(
        text, "block 0: int=7 float=1.250 str=first char=A big=1099511627776\n",
        "{text:?}"
    );
    // Nothing is left over for the next launch.
    let again = ctx.launch(module.id, kernel, &one_block(64), &params);
    assert_eq!(again.stdout, outcome.stdout);

    // Bad handles are errors, not faults.
    let bad = ctx.launch(module.id + 99, 0, &one_block(1), &[]);
    assert_eq!(bad.result.unwrap_err().code, codes::INVALID_HANDLE);
    let bad = ctx.launch(module.id, 99, &one_block(1), &[]);
    assert_eq!(bad.result.unwrap_err().code, codes::INVALID_HANDLE);
    ctx.module_unload(module.id);
    let gone = ctx.launch(module.id, kernel, &one_block(1), &params);
    assert_eq!(gone.result.unwrap_err().code, codes::INVALID_HANDLE);
    ctx.mem_free(a).unwrap();
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
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source("out_of_bounds"));
    let module = ctx.module_load(ptx.as_bytes()).unwrap();
    let kernel = module
        .kernels
        .iter()
        .position(|k| k.name.contains("out_of_bounds"))
        .expect("the kernel");
    let data = ctx.mem_alloc(256).unwrap();
    let mut params = vec![0u8; module.kernels[kernel].params_bytes() as usize];
    params[..8].copy_from_slice(&data.to_le_bytes());
    params[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let outcome = ctx.launch(module.id, kernel, &one_block(1), &params);
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
    let outcome = ctx.launch(1, 0, &one_block(1), &[]);
    // The module is unknown here, so the handle check answers first.
    assert!(outcome.result.is_err());
    drop(ctx);
}

#[test]
fn undecodable_frames_are_answered_and_the_worker_goes_on() {
    let (mut ours, theirs) = UnixStream::pair().unwrap();
    let (_stdout_read, stdout_write) = UnixStream::pair().unwrap();
    let thread = std::thread::spawn(move || {
        let device = CpuDevice::new(1 << 20);
        let mut out = stdout_write;
        let flush = || {};
        let mut stdout = WorkerStdout {
            out: &mut out,
            flush_c_stdio: &flush,
            image_may_print: &|_| false,
            nonce: [7; 16],
        };
        serve_worker(&device, theirs, &mut stdout)
    });
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
    let alloc = WorkerRequest::MemAlloc { bytes: 64 };
    write_frame(&mut ours, &encode(&alloc).unwrap()).unwrap();
    assert!(matches!(receive(&mut ours).result, Ok(WorkerValue::Ptr(_))));
    // A frame cut short ends the worker cleanly.
    ours.write_all(&100u32.to_le_bytes()).unwrap();
    ours.write_all(&[1, 2, 3]).unwrap();
    drop(ours);
    assert!(thread.join().unwrap().is_err());
}
