//! The `cuda` backend in `cumux worker` processes over the fake libcuda of
//! `cumux-cuda-driver`'s tests (`CUMUX_REAL_LIBCUDA`), so CI exercises the very
//! path `serve --device cuda` takes: devices described by the server, contexts
//! in workers, C-stdio printf routed back per context, a killed worker.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cumux_protocol::arrays::{
    ArrayCall, ArrayShape, CopyEnd, CopyExtent, Resource, TextureDesc, TextureMade,
    ARRAY_SURFACE_LDST,
};
use cumux_protocol::vmm::ACCESS_READWRITE;
use cumux_protocol::VmmCall;
use cumux_protocol::{
    codes, Call, ClientRole, ClusterQuery, Hello, LaunchAttribute, ReplyBody, DEFAULT_STREAM,
    MAGIC, PROTOCOL_VERSION,
};
use cumux_server::device::arrays::ArrayOp;
use cumux_server::device::pieces::MemPiece;
use cumux_server::device::{
    DeviceContext, KernelLaunch, LaunchGeometry, StreamWork, SyncTarget, VmmOp,
};
use cumux_server::session::Session;
use cumux_server::tenants::{TenantClass, TenantSettings};
use cumux_server::worker::device::{cuda_worker_devices, Sharing};
use cumux_testkit::fake_gpu::{
    f32_bytes, f32s, fake_libcuda, fixture_fatbin, live_reports, scale_params,
};

#[path = "fake_cuda/failure.rs"]
mod failure;
#[path = "fake_cuda/marks.rs"]
mod marks;
#[path = "fake_cuda/moves.rs"]
mod moves;
#[path = "fake_cuda/printf.rs"]
mod printf;
#[path = "fake_cuda/turns.rs"]
mod turns;
use moves::GRANULE;

const CUMUX: &str = env!("CARGO_BIN_EXE_cumux");

/// Our own worker children: (pid, state letter, command line).
fn children() -> Vec<(i32, char, String)> {
    common::children_of(std::process::id())
        .into_iter()
        .filter(|(_, _, cmd)| cmd.contains(" worker "))
        .map(|(pid, state, cmd)| (pid as i32, state, cmd))
        .collect()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `scale(buf, 2.0, n)`, kernel 1 of the fixture's `module`, on one block.
fn scale(module: u64, buf: u64, n: i32) -> KernelLaunch {
    let params = scale_params(buf, 2.0, n);
    let geometry = LaunchGeometry {
        grid: [1, 1, 1],
        block: [32, 1, 1],
        dynamic_shared_bytes: 0,
        attributes: Vec::new(),
    };
    KernelLaunch {
        module,
        kernel: 1,
        geometry,
        params,
    }
}

#[test]
fn cuda_contexts_live_in_workers() {
    // The fake driver, printing (no FAKE_QUIET).
    let Some(fake) = fake_libcuda("worker", false) else {
        eprintln!("no C compiler: skipping");
        return;
    };
    // The only test of this binary: the environment is ours to set.
    std::env::set_var("CUMUX_REAL_LIBCUDA", &fake);
    // The fake prints whatever the image: its k.cu has no printf, so ask the
    // workers for a stdout marker after every flushing call.
    std::env::set_var("CUMUX_WORKER_PRINTF", "always");
    // One worker per session and no spare, so the children are easy to count.
    std::env::set_var("CUMUX_WORKER_SPARES", "0");
    // The last worker to change its live driver objects says what it holds.
    let report = std::env::temp_dir().join(format!("cumux-fake-live-{}", std::process::id()));
    std::env::set_var("FAKE_LIVE_REPORT", &report);
    let devices =
        cuda_worker_devices(PathBuf::from(CUMUX), Sharing::Isolated, None).expect("the fake GPU");
    assert_eq!(devices.len(), 1);
    let device = Arc::clone(&devices[0]);
    assert_eq!(device.info().name, "Fake GPU 80GB");
    assert_eq!(device.info().backend, "cuda");
    assert!(children().is_empty(), "describing devices starts no worker");

    let ctx = device.create_context().unwrap();
    let a = ctx.mem_alloc(16).unwrap();
    assert_eq!(children().len(), 1);
    ctx.mem_write(a, &f32_bytes(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    let image = fixture_fatbin();
    let module = ctx.module_load(&image).unwrap();
    let names: Vec<&str> = module.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["add", "scale"]);
    assert_eq!(module.globals.len(), 1);
    assert_eq!(device.mem_used(), 32);

    let outcome = ctx.launch(&scale(module.id, a, 3));
    assert_eq!(outcome.result, Ok(()));
    // The driver's printf, written through the worker's C stdio.
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout),
        "scale printed n=3\n"
    );
    let mut back = vec![0u8; 16];
    ctx.mem_read(a, &mut back).unwrap();
    assert_eq!(f32s(&back), [3.0, 6.0, 9.0, 4.0]);
    cluster_occupancy_from_the_driver(ctx.as_ref(), module.id);
    // Read in pieces through the worker (a checkpoint's reads): bytes, and
    // a piece of one value as that value alone.
    let b = ctx.mem_alloc(16).unwrap();
    ctx.mem_fill(b, &[0x5a], 16).unwrap();
    let mut pieces = Vec::new();
    for at in [a, b] {
        ctx.mem_read_pieces(at, 16, 8, &mut |n| vec![0; n], &mut |_, p| {
            pieces.push(p);
            Ok(())
        })
        .unwrap();
    }
    let fill = MemPiece::Fill {
        value: 0x5a,
        len: 8,
    };
    assert_eq!(
        pieces[..2],
        [
            MemPiece::Bytes(back[..8].to_vec()),
            MemPiece::Bytes(back[8..].to_vec())
        ]
    );
    assert_eq!(pieces[2..], [fill.clone(), fill]);
    ctx.mem_free(b, 16).unwrap();

    // Limits reach the driver (CU_LIMIT_STACK_SIZE = 0): a stack it cannot
    // give is its refusal, one it can is set, and a smaller one too: the
    // context is the session's own.
    let e = ctx.set_limit(0, 1 << 30).unwrap_err();
    assert_eq!(e.code, codes::OUT_OF_MEMORY, "{e}");
    ctx.set_limit(0, 16 << 10).unwrap();
    ctx.set_limit(0, 512).unwrap();
    let own = format!("{}.{}", report.display(), children()[0].0);
    let own = std::fs::read_to_string(own).unwrap();
    assert!(own.contains(" limits stack 512 "), "{own}");

    // A second session has a worker of its own; killing it fails that
    // session only.
    let other = device.create_context().unwrap();
    other.mem_alloc(8).unwrap();
    // Its module has the device's next id, and its worker's own first one:
    // the query names the worker's.
    let theirs = other.module_load(&image).unwrap();
    cluster_occupancy_from_the_driver(other.as_ref(), theirs.id);
    let workers = children();
    assert_eq!(workers.len(), 2, "{workers:?}");
    let newest = workers.iter().map(|w| w.0).max().unwrap();
    // SAFETY: kill(2) on a worker process this test started.
    assert_eq!(unsafe { libc::kill(newest, libc::SIGKILL) }, 0);
    let e = other.mem_alloc(8).unwrap_err();
    assert_eq!(e.code, codes::LAUNCH_FAILED, "{e}");
    let outcome = other.launch(&scale(module.id, a, 3));
    assert!(outcome.result.is_err());
    // The killed worker was reaped at once.
    wait_until("the killed worker to be reaped", || children().len() == 1);
    ctx.mem_read(a, &mut back).unwrap();
    assert_eq!(f32s(&back), [3.0, 6.0, 9.0, 4.0]);

    drop(other);
    drop(ctx);
    assert_eq!(device.mem_used(), 0);
    wait_until("every worker to exit", || children().is_empty());

    // `shared` mode: both sessions in one context, whose allocator (the fake's
    // as a GPU's) hands a freed block to the next allocation as it is; what a
    // session frees is scrubbed first, so the other finds none of its bytes.
    let shared = cuda_worker_devices(PathBuf::from(CUMUX), Sharing::Shared, None).unwrap();
    let first = shared[0].create_context().unwrap();
    let second = shared[0].create_context().unwrap();
    let secret = vec![0x5au8; 4096];
    let p = first.mem_alloc(4096).unwrap();
    first.mem_write(p, &secret).unwrap();
    first.mem_free(p, 4096).unwrap();
    let q = second.mem_alloc(4096).unwrap();
    assert_eq!(q, p, "the fake gives the freed block out again");
    let mut seen = vec![1u8; 4096];
    second.mem_read(q, &mut seen).unwrap();
    assert!(
        seen.iter().all(|&b| b == 0),
        "another session's bytes were left in freed memory"
    );
    drop(second);
    // A session's end frees, and so scrubs, what it still held: the session
    // hands each allocation's size to the context, which keeps no table.
    let server = cumux_server::Server::new(shared.clone());
    let hello = common::driver_hello("leaves-memory");
    let tenant = Some(("t".to_string(), TenantSettings::default()));
    let mut session = Session::open(Arc::clone(&server), &hello, tenant).unwrap();
    let r = match session.handle(Call::MemAlloc {
        device: 0,
        bytes: 256,
    }) {
        Some(Ok(ReplyBody::Ptr(r))) => r,
        other => panic!("{other:?}"),
    };
    let written = session.handle(Call::MemcpyHtoD {
        dst: r,
        data: vec![0x77; 256],
        stream: None,
    });
    assert!(matches!(written, Some(Ok(_))), "{written:?}");
    session.close();
    let s = first.mem_alloc(256).unwrap();
    assert_eq!(s, r, "the fake gives the freed block out again");
    let mut left = vec![1u8; 256];
    first.mem_read(s, &mut left).unwrap();
    assert!(left.iter().all(|&b| b == 0), "{left:?}");
    // So are a module's globals when it is unloaded: the fake keeps them where
    // the next load finds them, as a GPU's allocator may give their memory out.
    let m = first.module_load(&image).unwrap();
    let global = m.globals[0].ptr;
    first.mem_write(global, &[0x33; 16]).unwrap();
    first.module_unload(m.id);
    let again = first.module_load(&image).unwrap();
    assert_eq!(again.globals[0].ptr, global);
    // A view of the shared context asks its driver too.
    cluster_occupancy_from_the_driver(first.as_ref(), again.id);
    let mut kept = vec![1u8; 16];
    first.mem_read(global, &mut kept).unwrap();
    assert_eq!(
        kept, [0u8; 16],
        "an unloaded module's global kept its bytes"
    );

    // Device printf in one context comes out wherever the next wait flushes
    // it; each session still gets what its own kernels printed.
    let third = shared[0].create_context().unwrap();
    let m3 = third.module_load(&image).unwrap();
    let (buf1, buf3) = (first.mem_alloc(64).unwrap(), third.mem_alloc(64).unwrap());
    let ordered = first.stream_ordered().unwrap();
    assert!(ordered.enqueue(DEFAULT_STREAM, StreamWork::Launch(scale(again.id, buf1, 3))));
    // The first session's kernel has printed before the other waits.
    std::thread::sleep(Duration::from_millis(100));
    let out3 = third.launch(&scale(m3.id, buf3, 5));
    assert_eq!(String::from_utf8_lossy(&out3.stdout), "scale printed n=5\n");
    let out1 = ordered.synchronize(SyncTarget::Context);
    assert_eq!(String::from_utf8_lossy(&out1.stdout), "scale printed n=3\n");
    drop(third);
    drop(first);
    virtual_memory_in_workers(&device, &shared[0], &server);
    arrays_in_workers(&device);
    moves::moved_memory_goes_device_to_device(&device);
    arrays_zeroed_when_shared(&shared[0]);
    sm_caps_in_workers(&device, &shared[0], &report);
    turns::two_tenants_take_turns_on_an_isolated_gpu(&device);
    marks::marks_land_in_isolated_and_shared_contexts(&device, &shared[0]);
    shared_limits_follow_live_sessions(&shared[0], &report);
    drop(server);
    drop(shared);
    wait_until("every worker to exit", || children().is_empty());
    printf::shared_printf_comes_with_its_wait(CUMUX);
    wait_until("every worker to exit", || children().is_empty());
    failure::an_ecc_error_marks_the_device_failed(CUMUX);
    wait_until("every worker to exit", || children().is_empty());
    let _ = std::fs::remove_file(fake);
    let _ = std::fs::remove_file(&report);
    let name = report.file_name().unwrap().to_string_lossy().to_string();
    for entry in std::fs::read_dir(report.parent().unwrap())
        .unwrap()
        .flatten()
    {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(&format!("{name}."))
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A tenant's SM cap (issue 20): its session's worker swaps its unused
/// context for a green context on its stretch of the SMs before anything
/// else, the session runs there, and the green context ends with it.
/// Stretches that meet get SMs that don't overlap. A cap comes before the
/// first call, and a shared context refuses one.
fn sm_caps_in_workers(
    device: &Arc<dyn cumux_server::Device>,
    shared: &Arc<dyn cumux_server::Device>,
    report: &Path,
) {
    let lives = || worker_reports(report);
    let any_says = |what: &str| lives().iter().any(|r| r.contains(what));
    let shared_report = || shared_worker_report(report);
    let part = |from, to| cumux_server::sm_parts::SmPart { from, to };
    let capped = device.create_context().unwrap();
    capped.set_sm_cap(part(0, 25)).unwrap();
    let a = capped.mem_alloc(16).unwrap();
    // 25 % of the fake's 132 SMs is 33, and parts come in eights.
    assert!(any_says("green_sms 32 green 0-32"), "{:?}", lives());
    // The next tenant's stretch starts where this one ends: the groups
    // after the first four, and the SMs no group took.
    let beside = device.create_context().unwrap();
    beside.set_sm_cap(part(25, 100)).unwrap();
    beside.mem_alloc(16).unwrap();
    // (Each worker process writes the report with its own objects.)
    assert!(any_says("green_sms 100 green 32-132"), "{:?}", lives());
    drop(beside);
    capped
        .mem_write(a, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    let module = capped.module_load(&fixture_fatbin()).unwrap();
    assert_eq!(capped.launch(&scale(module.id, a, 3)).result, Ok(()));
    let mut back = vec![0u8; 16];
    capped.mem_read(a, &mut back).unwrap();
    assert_eq!(f32s(&back), [3.0, 6.0, 9.0, 4.0]);
    let e = capped.set_sm_cap(part(0, 50)).unwrap_err();
    assert_eq!(e.code, codes::INVALID_CONTEXT, "{e}");
    drop(capped);
    wait_until("the green context to end with its session", || {
        !any_says("green_sms")
    });
    // A session of a capped tenant gets its tenant's place: the
    // latency-critical tenant first, so a batch tenant's 50 % starts at 25 %.
    let capped = |percent, class| TenantSettings {
        sm_percent: Some(percent),
        class,
        ..TenantSettings::default()
    };
    let mut policy = cumux_server::tenants::TenantPolicy::default();
    let batch = capped(50, TenantClass::Batch);
    policy.tenants.insert("batch".into(), batch.clone());
    let lc = capped(25, TenantClass::LatencyCritical);
    policy.tenants.insert("lc".into(), lc);
    let server = cumux_server::Server::with_tenants(vec![Arc::clone(device)], policy);
    let hello = common::driver_hello("placed");
    let mut session = Session::open(server, &hello, Some(("batch".into(), batch))).unwrap();
    let got = session.handle(Call::MemAlloc {
        device: 0,
        bytes: 256,
    });
    assert!(matches!(got, Some(Ok(ReplyBody::Ptr(_)))), "{got:?}");
    assert!(any_says("green_sms 64 green 32-96"), "{:?}", lives());
    session.close();
    wait_until("the placed session's green context to end", || {
        !any_says("green_sms")
    });
    // In a shared context a capped session's streams and events go to a
    // green context of its part; its memory and modules stay in the shared
    // context.
    let made = |report: &str| -> u64 {
        let after = report.split("made_in_green ").nth(1).unwrap_or("0");
        after
            .split_whitespace()
            .next()
            .unwrap_or("0")
            .parse()
            .unwrap()
    };
    let plain = shared.create_context().unwrap();
    let p = plain.mem_alloc(16).unwrap();
    plain.mem_write(p, &f32_bytes(&[1.0; 4])).unwrap();
    let module = plain.module_load(&fixture_fatbin()).unwrap();
    let ordered = plain.stream_ordered().unwrap();
    ordered.enqueue(DEFAULT_STREAM, StreamWork::Launch(scale(module.id, p, 2)));
    ordered.synchronize(SyncTarget::Context);
    let before = made(&shared_report());
    let view = shared.create_context().unwrap();
    view.set_sm_cap(part(50, 75)).unwrap();
    let v = view.mem_alloc(16).unwrap();
    view.mem_write(v, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    let module = view.module_load(&fixture_fatbin()).unwrap();
    let ordered = view.stream_ordered().unwrap();
    ordered.enqueue(DEFAULT_STREAM, StreamWork::Launch(scale(module.id, v, 3)));
    ordered.synchronize(SyncTarget::Context);
    let mut back = vec![0u8; 16];
    view.mem_read(v, &mut back).unwrap();
    // (the fake scales by 2 plus the module's global, 0 in a fresh load)
    assert_eq!(f32s(&back), [2.0, 4.0, 6.0, 4.0]);
    let report = shared_report();
    assert!(report.contains(" green 64-96"), "{report}");
    // The shared worker serves the GPU's primary context: green contexts
    // share its modules and memory, and no other context's.
    assert!(report.contains(" primary 1"), "{report}");
    assert!(
        made(&report) > before,
        "no stream made on the green part: {report}"
    );
    // Its events too: a stream records only its own context's events.
    let was = made(&report);
    ordered.event_create(0x77, 0).unwrap();
    let report = shared_report();
    assert_eq!(
        made(&report),
        was + 1,
        "the event is not in the green context: {report}"
    );
    ordered.event_destroy(0x77).unwrap();
    // An uncapped session beside it makes its streams in the shared context.
    let now = made(&report);
    ordered_plain_stream(&*plain);
    assert_eq!(made(&shared_report()), now, "{}", shared_report());
    drop(view);
    drop(plain);
}

/// Each worker process's own report (`REPORT.PID`): no other process
/// writes it, so what one says cannot be another's.
/// Cluster occupancy is the driver's answer (the fake's chip holds 30
/// clusters of 4, not 132 / 4), asked after the kernel is opted in to the
/// launch's shared memory and, for a potential size, with its non-portable
/// setting as the query says.
fn cluster_occupancy_from_the_driver(ctx: &dyn DeviceContext, module: u64) {
    let shaped = |cluster: [u32; 3], shared: u32| LaunchGeometry {
        grid: [cluster[0] * 8, 1, 1],
        block: [128, 1, 1],
        dynamic_shared_bytes: shared,
        attributes: vec![LaunchAttribute::ClusterDim(cluster)],
    };
    let active = ClusterQuery::MaxActiveClusters;
    let ask = |geometry: &LaunchGeometry, query| ctx.cluster_occupancy(module, 1, geometry, query);
    assert_eq!(ask(&shaped([4, 1, 1], 200 << 10), active), Ok(30));
    assert_eq!(ask(&shaped([8, 1, 1], 0), active), Ok(15));
    assert_eq!(ask(&shaped([2, 1, 1], 0), active), Ok(66));
    let unclustered = LaunchGeometry {
        attributes: Vec::new(),
        ..shaped([1, 1, 1], 0)
    };
    let e = ask(&unclustered, active).unwrap_err();
    assert_eq!(e.code, 912, "the driver's refusal, as it gave it: {e}");
    for (non_portable, most) in [(false, 8), (true, 16)] {
        let query = ClusterQuery::MaxPotentialClusterSize { non_portable };
        assert_eq!(ask(&unclustered, query), Ok(most));
    }
}

fn worker_reports(report: &Path) -> Vec<String> {
    live_reports(report)
        .into_iter()
        .map(|(_, text)| text)
        .collect()
}

/// The report of the shared worker: the one process holding the GPU's
/// primary context.
fn shared_worker_report(report: &Path) -> String {
    worker_reports(report)
        .into_iter()
        .find(|r| r.contains(" primary "))
        .unwrap_or_default()
}

/// A shared context's limits follow its live sessions (issues 15, 20): the
/// largest any live session asked for, never below the default, and back to
/// the defaults when the last ends; no limit one session asked for is kept
/// after it.
fn shared_limits_follow_live_sessions(shared: &Arc<dyn cumux_server::Device>, report: &Path) {
    const STACK: u32 = 0;
    const HEAP: u32 = 2;
    const MIB: u64 = 1 << 20;
    let limits = || {
        let report = shared_worker_report(report);
        let now = report.split(" limits ").nth(1).unwrap_or_default();
        now.trim().to_string()
    };
    let expect = |stack: u64, heap: u64, when: &str| {
        let want = format!("stack {stack} printf {MIB} heap {heap}");
        assert_eq!(limits(), want, "{when}");
    };
    let a = shared.create_context().unwrap();
    let b = shared.create_context().unwrap();
    a.set_limit(HEAP, 64 * MIB).unwrap();
    a.set_limit(STACK, 8 << 10).unwrap();
    expect(8 << 10, 64 * MIB, "A asked");
    b.set_limit(HEAP, 16 * MIB).unwrap();
    b.set_limit(STACK, 4 << 10).unwrap();
    expect(8 << 10, 64 * MIB, "B asked less while A lives");
    // The driver's refusal is the asking session's, and changes nothing.
    let e = b.set_limit(STACK, 1 << 30).unwrap_err();
    assert_eq!(e.code, codes::OUT_OF_MEMORY, "{e}");
    a.set_limit(HEAP, 32 * MIB).unwrap();
    expect(8 << 10, 32 * MIB, "A lowered its own");
    drop(a);
    expect(4 << 10, 16 * MIB, "A ended: B's");
    // Less than the defaults leaves the defaults (a session that asked
    // nothing needs them).
    b.set_limit(HEAP, 4 * MIB).unwrap();
    b.set_limit(STACK, 512).unwrap();
    expect(1024, 8 * MIB, "B asked less than the defaults");
    let c = shared.create_context().unwrap();
    b.set_limit(HEAP, 24 * MIB).unwrap();
    expect(1024, 24 * MIB, "B asked more");
    drop(b);
    expect(1024, 8 * MIB, "B ended: C asked nothing");
    c.set_limit(STACK, 16 << 10).unwrap();
    expect(16 << 10, 8 * MIB, "C asked");
    drop(c);
    expect(1024, 8 * MIB, "the last session ended: the defaults");
}

/// Makes a stream in `ctx` and launches nothing on it.
fn ordered_plain_stream(ctx: &dyn DeviceContext) {
    let ordered = ctx.stream_ordered().unwrap();
    ordered.stream_create(0x4242, 1, 0).unwrap();
    ordered.stream_destroy(0x4242).unwrap();
}

/// A reservation of `granules` in `ctx`, with physical allocation
/// `physical` mapped, writable, from its start: the reservation.
fn mapped(ctx: &dyn DeviceContext, granules: u64, physical: u64) -> u64 {
    let size = granules * GRANULE;
    let base = ctx.vmm(&VmmOp::Reserve { size, alignment: 0 }).unwrap();
    let map = VmmOp::Map {
        ptr: base,
        size: GRANULE,
        physical,
    };
    ctx.vmm(&map).unwrap();
    let access = VmmOp::SetAccess {
        ptr: base,
        size: GRANULE,
        flags: ACCESS_READWRITE,
    };
    ctx.vmm(&access).unwrap();
    base
}

/// Virtual memory in workers, on the driver's own addresses: physical
/// allocations mapped side by side read as one range and a kernel runs
/// across them; in `shared` mode, physical memory a session gives back (by
/// a release, or at its end) is scrubbed first, as the fake hands it out
/// again as it is.
fn virtual_memory_in_workers(
    isolated: &Arc<dyn cumux_server::Device>,
    shared: &Arc<dyn cumux_server::Device>,
    server: &Arc<cumux_server::Server>,
) {
    let ctx = isolated.create_context().unwrap();
    let granularity = ctx.vmm(&VmmOp::Granularity { recommended: false });
    assert_eq!(granularity, Ok(GRANULE));
    let a = ctx
        .vmm(&VmmOp::Create {
            size: GRANULE,
            shareable: false,
            compressed: false,
        })
        .unwrap();
    let b = ctx
        .vmm(&VmmOp::Create {
            size: GRANULE,
            shareable: false,
            compressed: false,
        })
        .unwrap();
    assert_eq!(isolated.mem_used(), 2 * GRANULE);
    let base = mapped(ctx.as_ref(), 4, a);
    let second = VmmOp::Map {
        ptr: base + GRANULE,
        size: GRANULE,
        physical: b,
    };
    ctx.vmm(&second).unwrap();
    let access = VmmOp::SetAccess {
        ptr: base + GRANULE,
        size: GRANULE,
        flags: ACCESS_READWRITE,
    };
    ctx.vmm(&access).unwrap();
    let edge = base + GRANULE - 8;
    ctx.mem_write(edge, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
        .unwrap();
    let module = ctx.module_load(&fixture_fatbin()).unwrap();
    assert_eq!(ctx.launch(&scale(module.id, edge, 4)).result, Ok(()));
    let mut back = vec![0u8; 16];
    ctx.mem_read(edge, &mut back).unwrap();
    assert_eq!(f32s(&back), [3.0, 6.0, 9.0, 12.0]);
    let unmap = VmmOp::Unmap {
        ptr: base,
        size: 2 * GRANULE,
    };
    for op in [
        unmap,
        VmmOp::Release {
            physical: a,
            size: GRANULE,
        },
        VmmOp::Release {
            physical: b,
            size: GRANULE,
        },
        VmmOp::FreeReservation {
            ptr: base,
            size: 4 * GRANULE,
        },
    ] {
        ctx.vmm(&op).unwrap();
    }
    ctx.module_unload(module.id);
    assert_eq!(isolated.mem_used(), 0);
    drop(ctx);

    // A release in one shared session, a create in another: no bytes pass.
    let (one, two) = (
        shared.create_context().unwrap(),
        shared.create_context().unwrap(),
    );
    let p = one
        .vmm(&VmmOp::Create {
            size: GRANULE,
            shareable: false,
            compressed: false,
        })
        .unwrap();
    let at = mapped(one.as_ref(), 2, p);
    one.mem_write(at, &[0x5a; 4096]).unwrap();
    let unmap = VmmOp::Unmap {
        ptr: at,
        size: GRANULE,
    };
    one.vmm(&unmap).unwrap();
    let release = VmmOp::Release {
        physical: p,
        size: GRANULE,
    };
    one.vmm(&release).unwrap();
    let q = two
        .vmm(&VmmOp::Create {
            size: GRANULE,
            shareable: false,
            compressed: false,
        })
        .unwrap();
    assert_eq!(q, p, "the fake gives the physical memory out again");
    let seen_at = mapped(two.as_ref(), 2, q);
    let mut seen = vec![1u8; 4096];
    two.mem_read(seen_at, &mut seen).unwrap();
    assert!(seen.iter().all(|&b| b == 0), "another session's bytes");
    two.mem_write(seen_at, &[0x6b; 4096]).unwrap();
    drop(two);

    // A session that ends with a live mapping gives everything back, scrubbed.
    let used = shared.mem_used();
    let hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        pid: std::process::id(),
        role: ClientRole::Driver,
        program: "leaves-mappings".into(),
        tenant: None,
        token: None,
        shm: false,
        visible_devices: None,
        join: None,
        resume: None,
        lane: None,
    };
    let tenant = Some(("t".to_string(), TenantSettings::default()));
    let mut session = Session::open(Arc::clone(server), &hello, tenant).unwrap();
    let mut call = |call: VmmCall| session.handle(Call::Vmm(call)).unwrap().unwrap();
    let ReplyBody::Ptr(base) = call(VmmCall::Reserve {
        size: 2 * GRANULE,
        alignment: 0,
        hint: 0,
    }) else {
        panic!("no reservation")
    };
    let ReplyBody::Handle(handle) = call(VmmCall::Create {
        device: 0,
        size: GRANULE,
        handle_types: 0,
        compressed: false,
    }) else {
        panic!("no physical memory")
    };
    call(VmmCall::Map {
        ptr: base,
        size: GRANULE,
        offset: 0,
        handle,
    });
    call(VmmCall::SetAccess {
        ptr: base,
        size: GRANULE,
        device: 0,
        flags: ACCESS_READWRITE,
    });
    let written = session.handle(Call::MemcpyHtoD {
        dst: base,
        data: vec![0x77; 256],
        stream: None,
    });
    assert!(matches!(written, Some(Ok(_))), "{written:?}");
    assert_eq!(shared.mem_used(), used + GRANULE);
    session.close();
    assert_eq!(shared.mem_used(), used);
    let r = one
        .vmm(&VmmOp::Create {
            size: GRANULE,
            shareable: false,
            compressed: false,
        })
        .unwrap();
    let left_at = mapped(one.as_ref(), 2, r);
    let mut left = vec![1u8; 256];
    one.mem_read(left_at, &mut left).unwrap();
    assert!(left.iter().all(|&b| b == 0), "{left:?}");
}

/// CUDA arrays through a session, in a worker over the fake's arrays (host
/// memory with their descriptor): made, filled from the host, read back in
/// part, copied to device memory; a forged handle, a box past the array and
/// an array past the tenant's quota refused; texture and surface objects the
/// session's own; the device's memory in use counted, and given back at the
/// session's end.
fn arrays_in_workers(device: &Arc<dyn cumux_server::Device>) {
    let server = cumux_server::Server::new(vec![Arc::clone(device)]);
    let hello = Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        pid: std::process::id(),
        role: ClientRole::Driver,
        program: "arrays".into(),
        tenant: None,
        token: None,
        shm: false,
        visible_devices: None,
        join: None,
        resume: None,
        lane: None,
    };
    let settings = TenantSettings {
        memory_quota: Some(1 << 20),
        ..TenantSettings::default()
    };
    let mut session =
        Session::open(Arc::clone(&server), &hello, Some(("a".into(), settings))).unwrap();
    let mut call = |call: ArrayCall| session.handle(Call::Array(call)).unwrap();
    let used = device.mem_used();
    let shape = ArrayShape {
        width: 16,
        height: 8,
        depth: 0,
        format: 0x20,
        channels: 1,
        flags: 0,
    };
    let Ok(ReplyBody::Handle(array)) = call(ArrayCall::Create { shape }) else {
        panic!("no array")
    };
    assert!(device.mem_used() > used, "an array counts as memory in use");
    assert_eq!(
        call(ArrayCall::Describe { array }),
        Ok(ReplyBody::Array(shape))
    );

    // In from the host, and part of it back.
    let values: Vec<f32> = (0..16 * 8).map(|i| i as f32).collect();
    let whole = CopyExtent {
        width_bytes: 64,
        height: 8,
        depth: 1,
    };
    let at = |x_bytes, y| CopyEnd::Array {
        array,
        x_bytes,
        y,
        z: 0,
    };
    let copy = |src, dst, extent, data| ArrayCall::Copy {
        src,
        dst,
        extent,
        stream: None,
        data,
    };
    assert_eq!(
        call(copy(CopyEnd::Host, at(0, 0), whole, f32_bytes(&values))),
        Ok(ReplyBody::Unit)
    );
    let part = CopyExtent {
        width_bytes: 16,
        height: 3,
        depth: 1,
    };
    let Ok(ReplyBody::Data(bytes)) = call(copy(at(8, 2), CopyEnd::Host, part, Vec::new())) else {
        panic!("no bytes back")
    };
    let want: Vec<f32> = (2..5)
        .flat_map(|y| (2..6).map(move |x| (y * 16 + x) as f32))
        .collect();
    assert_eq!(f32s(&bytes), want);

    // Out to device memory, rows 128 bytes apart.
    let Some(Ok(ReplyBody::Ptr(buf))) = session.handle(Call::MemAlloc {
        device: 0,
        bytes: 1024,
    }) else {
        panic!("no memory")
    };
    let mut call = |call: ArrayCall| session.handle(Call::Array(call)).unwrap();
    let device_end = CopyEnd::Device {
        ptr: buf,
        pitch: 128,
        height: 8,
    };
    assert_eq!(
        call(copy(at(0, 0), device_end, whole, Vec::new())),
        Ok(ReplyBody::Unit)
    );
    let past = CopyEnd::Device {
        ptr: buf + 128,
        pitch: 128,
        height: 8,
    };
    let e = call(copy(at(0, 0), past, whole, Vec::new())).unwrap_err();
    assert_eq!(
        e.code,
        codes::INVALID_VALUE,
        "device memory past the allocation: {e}"
    );

    // Refusals: a forged handle, a box past the array, the quota.
    let forged = CopyEnd::Array {
        array: array + 1000,
        x_bytes: 0,
        y: 0,
        z: 0,
    };
    let e = call(copy(CopyEnd::Host, forged, whole, f32_bytes(&values))).unwrap_err();
    assert_eq!(e.code, codes::INVALID_HANDLE, "{e}");
    let e = call(ArrayCall::Destroy {
        array: array + 1000,
    })
    .unwrap_err();
    assert_eq!(e.code, codes::INVALID_HANDLE, "{e}");
    let e = call(copy(at(56, 0), CopyEnd::Host, part, Vec::new())).unwrap_err();
    assert_eq!(e.code, codes::INVALID_VALUE, "{e}");
    let big = ArrayShape {
        width: 1024,
        height: 1024,
        ..shape
    };
    let e = call(ArrayCall::Create { shape: big }).unwrap_err();
    assert_eq!(e.code, codes::OUT_OF_MEMORY, "{e}");

    // Texture and surface objects: the driver's values, the session's own.
    let texture = TextureDesc {
        address_mode: [0; 3],
        filter_mode: 0,
        flags: 0,
        max_anisotropy: 0,
        mipmap_filter_mode: 0,
        mipmap_level_bias: 0.0,
        min_mipmap_level_clamp: 0.0,
        max_mipmap_level_clamp: 0.0,
        border_color: [0.0; 4],
    };
    let create = |resource| ArrayCall::TextureCreate {
        resource,
        texture,
        view: None,
    };
    let Ok(ReplyBody::Value(tex)) = call(create(Resource::Array(array))) else {
        panic!("no texture")
    };
    assert_eq!(
        call(ArrayCall::TextureDestroy { texture: tex }),
        Ok(ReplyBody::Unit)
    );
    let e = call(ArrayCall::TextureDestroy { texture: tex }).unwrap_err();
    assert_eq!(e.code, codes::INVALID_HANDLE, "{e}");
    let linear = Resource::Linear {
        ptr: buf,
        format: 0x20,
        channels: 1,
        bytes: 4096,
    };
    let e = call(create(linear)).unwrap_err();
    assert_eq!(
        e.code,
        codes::INVALID_VALUE,
        "memory past the allocation: {e}"
    );
    let e = call(ArrayCall::SurfaceCreate { array }).unwrap_err();
    assert_eq!(e.code, codes::INVALID_VALUE, "no SURFACE_LDST: {e}");
    let ldst = ArrayShape {
        flags: ARRAY_SURFACE_LDST,
        ..shape
    };
    let Ok(ReplyBody::Handle(surface_array)) = call(ArrayCall::Create { shape: ldst }) else {
        panic!("no array")
    };
    let Ok(ReplyBody::Value(surface)) = call(ArrayCall::SurfaceCreate {
        array: surface_array,
    }) else {
        panic!("no surface")
    };
    let Ok(ReplyBody::Value(over_it)) = call(create(Resource::Array(surface_array))) else {
        panic!("no texture")
    };
    // What each was made of reads back (`cuTexObjectGet*Desc`).
    let made = TextureMade {
        resource: Resource::Array(surface_array),
        texture,
        view: None,
    };
    let described = call(ArrayCall::TextureDescribe { texture: over_it });
    assert_eq!(described, Ok(ReplyBody::Texture(made)));
    let described = call(ArrayCall::SurfaceDescribe { surface });
    assert_eq!(described, Ok(ReplyBody::Handle(surface_array)));

    // A mipmapped array's level is an array, the same one each time; it
    // goes with its mipmapped array.
    let Ok(ReplyBody::Handle(mipmap)) = call(ArrayCall::CreateMipmapped { shape, levels: 3 })
    else {
        panic!("no mipmapped array")
    };
    let e = call(ArrayCall::Level { mipmap, level: 3 }).unwrap_err();
    assert_eq!(e.code, codes::INVALID_VALUE, "{e}");
    let Ok(ReplyBody::Handle(level)) = call(ArrayCall::Level { mipmap, level: 1 }) else {
        panic!("no level")
    };
    assert_eq!(
        call(ArrayCall::Level { mipmap, level: 1 }),
        Ok(ReplyBody::Handle(level))
    );
    let halved = ArrayShape {
        width: 8,
        height: 4,
        ..shape
    };
    assert_eq!(
        call(ArrayCall::Describe { array: level }),
        Ok(ReplyBody::Array(halved))
    );
    let level_box = CopyExtent {
        width_bytes: 32,
        height: 4,
        depth: 1,
    };
    let level_at = CopyEnd::Array {
        array: level,
        x_bytes: 0,
        y: 0,
        z: 0,
    };
    let in_level = copy(CopyEnd::Host, level_at, level_box, vec![7; 128]);
    assert_eq!(call(in_level), Ok(ReplyBody::Unit));
    assert_eq!(
        call(copy(level_at, CopyEnd::Host, level_box, Vec::new())),
        Ok(ReplyBody::Data(vec![7; 128]))
    );
    let e = call(ArrayCall::Destroy { array: level }).unwrap_err();
    assert_eq!(e.code, codes::INVALID_VALUE, "{e}");
    assert_eq!(
        call(ArrayCall::DestroyMipmapped { mipmap }),
        Ok(ReplyBody::Unit)
    );
    let e = call(ArrayCall::Describe { array: level }).unwrap_err();
    assert_eq!(e.code, codes::INVALID_HANDLE, "{e}");

    // Destroyed, it is gone; what the session still holds goes at its end.
    assert_eq!(call(ArrayCall::Destroy { array }), Ok(ReplyBody::Unit));
    let e = call(ArrayCall::Describe { array }).unwrap_err();
    assert_eq!(e.code, codes::INVALID_HANDLE, "{e}");
    session.close();
    assert_eq!(device.mem_used(), used);
}

/// In a `shared` context a new array is zeroed before its session sees it
/// (the fake, as a GPU, leaves whatever lay there).
fn arrays_zeroed_when_shared(shared: &Arc<dyn cumux_server::Device>) {
    let ctx = shared.create_context().unwrap();
    let shape = ArrayShape {
        width: 16,
        height: 8,
        depth: 2,
        format: 0x20,
        channels: 1,
        flags: 0,
    };
    let bytes = 64 << 10;
    let array = ctx.array(&ArrayOp::Create { shape, bytes }).unwrap();
    let at = CopyEnd::Array {
        array,
        x_bytes: 0,
        y: 0,
        z: 0,
    };
    let extent = CopyExtent {
        width_bytes: 64,
        height: 8,
        depth: 2,
    };
    let mut seen = vec![1u8; 1024];
    ctx.array_copy(&at, &CopyEnd::Host, &extent, &[], &mut seen)
        .unwrap();
    assert!(seen.iter().all(|&b| b == 0), "a new array kept old bytes");
    ctx.array(&ArrayOp::Destroy { array, bytes }).unwrap();
}
