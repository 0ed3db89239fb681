//! End to end through the client driver: CUDA programs from tests/cuda/driver,
//! compiled with nvcc (and one C program on the CUDA 12 runtime, with gcc),
//! run unmodified through `cumux run` against a `cumux serve --device cpu`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    driver_program, driver_source, e2e_device, wait_bounded, RunOutput, ServerProc, TempDir, CUMUX,
};

const LIMIT: Duration = Duration::from_secs(180);

fn run_passes(server: &ServerProc, program: &Path) -> RunOutput {
    let out = server.run(program, &[], LIMIT);
    out.assert_passed();
    out
}

/// Tests that each run one program of tests/cuda/driver on a server of their
/// own and want it to pass: `test_name: "program" on "server tag";`.
macro_rules! programs_pass {
    ($($(#[$doc:meta])* $test:ident: $program:literal on $tag:literal;)*) => {$(
        $(#[$doc])*
        #[test]
        fn $test() {
            let server = ServerProc::start($tag);
            run_passes(&server, &driver_program($program));
        }
    )*};
}

/// Pools shared between processes: used across a fork where the device's
/// attribute offers file descriptors (the in-process CPU device), refused
/// where it says none (a CPU device in worker processes).
#[test]
fn memory_pools_shared_between_processes() {
    let server = ServerProc::start("poolipc");
    let out = run_passes(&server, &driver_program("pool_ipc"));
    let in_workers = common::e2e_device() == "worker-cpu";
    let shared = out.stdout.contains("child PASS");
    assert_eq!(shared, !in_workers, "{}", out.describe());
}

programs_pass! {
    streams_and_events: "streams_events" on "streams";
    memcpy_to_symbol: "memcpy_to_symbol" on "symbol";
    pinned_memory: "pinned_memory" on "pinned";
    graph_by_stream_capture: "graph_capture" on "graph";
    managed_memory: "managed_memory" on "managed";
    /// Host and device add to one counter at once, and a host write during
    /// a kernel survives it: the host's access waits for the device.
    managed_memory_used_by_host_during_a_kernel: "managed_concurrent" on "managedhost";
    /// Pool attributes stick and read back, statistics follow allocations,
    /// a size limit holds, what cannot be given is refused.
    stream_ordered_memory_pools: "mem_pools" on "pools";
    host_callbacks_run_in_stream_order: "host_callback" on "hostfn";
    threads_with_their_own_streams: "threads" on "threads";
    launch_limits_are_checked_at_the_call: "launch_limits" on "limits";
    /// A program that launches without synchronizing is held near the device:
    /// without a bound its queue ran thousands of launches deep.
    launches_are_held_near_the_device: "launch_window" on "window";
    /// Memset, kernel, empty and memcpy nodes with their edges, as XLA builds graphs.
    graphs_built_node_by_node: "graph_nodes" on "graphnodes";
    /// Node parameters set in graphs and their instantiations, and
    /// `cudaGraphExecUpdate`, as XLA's command buffers use them.
    graphs_updated_after_instantiation: "graph_update" on "graphupdate";
    /// Allocation, free and host nodes, explicit, generic and captured.
    graphs_with_memory_and_host_nodes: "graph_memory" on "graphmemory";
    /// Clones, parameters read back, event and host nodes changed, nodes
    /// disabled, edges removed, DOT.
    the_rest_of_the_graph_api: "graph_api" on "graphapi";
    /// If/else, while and switch nodes over body graphs, their handles set
    /// by kernels (`cudaGraphSetConditional`).
    conditional_graph_nodes: "graph_conditional" on "graphcond";
}

/// The fault handler that holds host accesses to managed memory passes other
/// faults on: a stray pointer still ends the program by SIGSEGV, at once.
#[test]
fn a_stray_pointer_still_faults_beside_managed_memory() {
    use std::os::unix::process::ExitStatusExt;
    let server = ServerProc::start("managedcrash");
    let out = server.run(&driver_program("managed_concurrent"), &["crash"], LIMIT);
    let by_segv =
        out.status.signal() == Some(libc::SIGSEGV) || out.code() == Some(128 + libc::SIGSEGV);
    assert!(by_segv, "not ended by SIGSEGV: {}", out.describe());
    assert!(!out.stdout.contains("FAIL"), "{}", out.describe());
}

/// A driver-API program of tests/cuda/driver linked against the client driver
/// itself (`-lcuda`).
fn linked_to_client_driver(name: &str) -> PathBuf {
    let link = format!("-L{}", common::driver_link_folder("cumux-link").display());
    cumux_testkit::compile_program(driver_source(name), &[&link, "-lcuda"])
}

/// `key: value` lines a test program printed.
fn value<'a>(stdout: &'a str, key: &str) -> Option<&'a str> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(": "))
        .map(str::trim)
}

#[test]
fn device_query_matches_status() {
    let server = ServerProc::start("devq");
    let out = run_passes(&server, &driver_program("device_query"));
    let status = server.status_json();
    let device = &status["devices"][0];
    assert_eq!(
        value(&out.stdout, "name"),
        device["name"].as_str(),
        "{}",
        out.stdout
    );
    assert_eq!(
        value(&out.stdout, "total_mem").and_then(|v| v.parse::<u64>().ok()),
        device["total_mem"].as_u64(),
        "{}",
        out.stdout
    );
    assert_eq!(
        value(&out.stdout, "device_count").and_then(|v| v.parse::<usize>().ok()),
        status["devices"].as_array().map(Vec::len)
    );
    assert_eq!(value(&out.stdout, "driver_version"), Some("13000"));
}

/// `cumux serve --threads N` runs a CPU device's blocks on N host threads
/// and says it has N multiprocessors; 0 threads, or a device with none to
/// set, is refused at start.
#[test]
fn a_cpu_device_has_the_threads_it_is_given() {
    let device = e2e_device();
    let args = ["--device", &device, "--memory", "256M", "--threads", "3"].map(String::from);
    let server = ServerProc::spawn(TempDir::new("threads"), &args, &[]);
    let out = run_passes(&server, &driver_program("device_query"));
    assert_eq!(
        value(&out.stdout, "multiprocessors"),
        Some("3"),
        "{}",
        out.stdout
    );
    let dir = TempDir::new("threads-refused");
    let socket = format!("unix:{}", dir.0.join("s.sock").display());
    for (bad, why) in [
        (&["--threads", "0"][..], "at least one thread"),
        (
            &["--device", "model", "--threads", "2"][..],
            "has none to set",
        ),
    ] {
        let out = Command::new(CUMUX)
            .args(["serve", "--listen", &socket])
            .args(bad)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?} started");
        assert!(err.contains(why), "{bad:?}: {err}");
    }
}

/// Pinned buffers are shared with the server, and synchronous copies of
/// pageable memory, large or small, go through a pinned buffer of the
/// driver's own: their
/// copies carry no bytes over the wire, which the server counts and logs at
/// the session's end.
#[test]
fn pinned_copies_take_the_zero_copy_route() {
    let server = ServerProc::start("pinned-copies");
    run_passes(&server, &driver_program("pinned_copies"));
    // The session's end is logged just after the program exits.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (bytes, log) = loop {
        let log = without_colours(&server.log());
        let most = log
            .split("zero_copy_bytes=")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        if most > 0 || std::time::Instant::now() > deadline {
            break (most, log);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // 7 MiB of whole-buffer copies and two 16 KiB parts, and staged
    // pageable round trips of 10 MiB + 12345 bytes and 64 KiB + 3.
    let staged = 2 * ((10 << 20) + 12345) + 2 * ((64 << 10) + 3);
    assert_eq!(bytes, (7 << 20) + (32 << 10) + staged, "{log}");
}

/// `text` without ANSI colour sequences (`ESC [ … m`).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn a_wait_does_not_hold_up_other_threads() {
    if e2e_device() == "worker-cpu" {
        // A CPU worker runs each stream's work as it arrives, one piece at a
        // time: a kernel waiting for another stream's copy cannot see it.
        eprintln!("skipped on worker-cpu: its streams do not run concurrently");
        return;
    }
    let server = ServerProc::start("xthread");
    run_passes(&server, &driver_program("cross_thread_wait"));
}

#[test]
fn unimplemented_call_is_named_and_not_supported() {
    let server = ServerProc::start("unimpl");
    let out = run_passes(&server, &driver_program("unimplemented_call"));
    let line = "cumux: cuGraphicsGLRegisterBuffer is not implemented (CUDA_ERROR_NOT_SUPPORTED)";
    assert_eq!(
        out.stderr.matches(line).count(),
        1,
        "said once: {}",
        out.describe()
    );
}

/// A program using CUDA arrays on a device that has none (the CPU device,
/// in process or in a worker): its first array call fails with
/// CUDA_ERROR_NOT_SUPPORTED, which the runtime reports; no crash.
#[test]
fn arrays_on_a_device_without_them_are_refused_clearly() {
    let server = ServerProc::start("arrays");
    let out = server.run(&driver_program("textures"), &[], LIMIT);
    assert_eq!(out.code(), Some(1), "{}", out.describe());
    let refused = out.stdout.lines().any(|l| {
        l.starts_with("FAIL") && l.contains("cudaMallocArray") && l.contains("not supported")
    });
    assert!(refused, "{}", out.describe());
    let said = "cumux: CUDA arrays, textures and surfaces: this device has no CUDA arrays";
    assert!(out.stderr.contains(said), "{}", out.describe());
}

#[test]
fn per_thread_default_stream_program() {
    let program = cumux_testkit::compile_program(
        driver_source("streams_events"),
        &["--default-stream", "per-thread"],
    );
    let server = ServerProc::start("ptds");
    run_passes(&server, &program);
}

#[test]
fn driver_api_program() {
    let program = linked_to_client_driver("driver_api");
    let fatbin = cumux_testkit::workspace_root().join("crates/fatbin/tests/fixtures/zstd.fatbin");
    let server = ServerProc::start("driverapi");
    let out = server.run(&program, &[fatbin.to_str().unwrap()], LIMIT);
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    let lines: Vec<&str> = out.stdout.lines().collect();
    let at = |l: &str| lines.iter().position(|x| *x == l);
    let (before, hello, after) = (
        at("before the kernel"),
        at("hello from the device: 42"),
        at("after the kernel"),
    );
    assert!(
        before < hello && hello < after && before.is_some(),
        "device printf out of order: {}",
        out.describe()
    );
    assert!(lines.contains(&"PASS"), "{}", out.describe());
}

/// The private tables cuFFT and cuSOLVER call: a module's functions found by
/// visiting them (and launched), the context object and value cuSOLVER asks for.
#[test]
fn private_tables_of_the_math_libraries() {
    let program = linked_to_client_driver("private_tables");
    let server = ServerProc::start("privtables");
    let out = run_passes(&server, &program);
    for line in [
        "tools module slot 7 on one kernel: answered 1, visited 1",
        "tools module slot 7 on two kernels: answered 2, visited 2",
        "tools context slot 51: an object; slot 39: 7",
    ] {
        assert!(out.stdout.contains(line), "{line}: {}", out.describe());
    }
}

/// Misused calls answer with the codes NVIDIA's driver gives (the program
/// holds the codes measured on an H100).
/// Virtual memory management, the expandable-segments way: handles mapped
/// side by side in a reservation, kernels, copies and memsets across them.
#[test]
fn virtual_memory_mapped_side_by_side() {
    let program = linked_to_client_driver("vmm");
    let server = ServerProc::start("vmm");
    let out = run_passes(&server, &program);
    assert!(out.stderr.is_empty(), "{}", out.describe());
}

/// Pinned host memory where device memory goes (unified addressing): the
/// copies XLA makes to read its results.
#[test]
fn pinned_host_memory_as_a_device_pointer() {
    let program = linked_to_client_driver("uva_pinned");
    let server = ServerProc::start("uva");
    run_passes(&server, &program);
}

#[test]
fn error_codes_match_nvidia() {
    let program = linked_to_client_driver("error_codes");
    let server = ServerProc::start("errcodes");
    run_passes(&server, &program);
}

#[test]
fn cluster_launches_and_their_function_attributes() {
    let server = ServerProc::start("clusters");
    let out = run_passes(&server, &driver_program("cluster_launch"));
    assert!(
        out.stdout
            .contains("clusters: refused, the device has none"),
        "{}",
        out.stdout
    );
}

#[test]
fn jit_link_of_relocatable_ptx() {
    let dir = TempDir::new("jitlink");
    let user = dir.0.join("user.ptx");
    let helper = dir.0.join("helper.ptx");
    std::fs::write(
        &user,
        cumux_testkit::compile_ptx_with(driver_source("rdc_user"), &["-rdc=true"]),
    )
    .unwrap();
    std::fs::write(
        &helper,
        cumux_testkit::compile_ptx_with(driver_source("rdc_helper"), &["-rdc=true"]),
    )
    .unwrap();
    let program = linked_to_client_driver("jit_link");
    let server = ServerProc::start("jitlink");
    let out = server.run(
        &program,
        &[user.to_str().unwrap(), helper.to_str().unwrap()],
        LIMIT,
    );
    out.assert_passed();
}

#[test]
fn relocatable_device_code_program() {
    let helper = driver_source("rdc_helper");
    let program = cumux_testkit::compile_program(
        driver_source("rdc_program"),
        &["-rdc=true", helper.to_str().unwrap()],
    );
    let server = ServerProc::start("rdc");
    run_passes(&server, &program);
}

/// The CUDA 13 runtime as a shared library (`-cudart shared`) rather than
/// linked in statically: it finds the driver the same way.
#[test]
fn shared_cuda13_runtime_program() {
    let lib = cumux_testkit::cuda_home().join("lib");
    if !lib.join("libcudart.so.13").is_file() {
        eprintln!("skipped: libcudart.so.13 not installed");
        return;
    }
    // PyPI ships only libcudart.so.13; `-lcudart` wants the unversioned name.
    let dir = common::linked_folder(
        "cumux-cudart13",
        "libcudart.so",
        &lib.join("libcudart.so.13"),
    );
    let source = driver_source("streams_events");
    let search = format!("-L{}", dir.display());
    let program = cumux_testkit::compile_program(
        source,
        &[
            "-cudart",
            "shared",
            &search,
            "-Xlinker",
            "-rpath",
            "-Xlinker",
            lib.to_str().unwrap(),
        ],
    );
    let server = ServerProc::start("cudart13");
    run_passes(&server, &program);
}

/// The client driver talks to a server over TCP just as over a unix socket.
#[test]
fn program_over_tcp() {
    common::ensure_driver();
    let program = driver_program("memcpy_to_symbol");
    let listen = [
        "--device",
        "cpu",
        "--memory",
        "256M",
        "--listen",
        "tcp:127.0.0.1:0",
    ];
    let mut server = common::serve_command(&listen)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = common::lines_of(server.stdout.take().unwrap());
    let address = common::tcp_address(&lines);
    let mut run = common::run_command_at(&address, &[], &program, &[]);
    let out = wait_bounded(run.spawn().unwrap(), LIMIT);
    let _ = server.kill();
    let _ = server.wait();
    out.assert_passed();
}

#[test]
fn lost_connection_fails_later_calls() {
    let mut server = ServerProc::start("lost");
    let program = driver_program("lost_connection");
    let (child, lines) = server.start_until(server.command(&program, &[]), "started", LIMIT);
    server.kill();
    let out = wait_bounded(child, Duration::from_secs(60));
    let rest: Vec<String> = lines.try_iter().collect();
    assert_eq!(
        out.code(),
        Some(0),
        "{}
{rest:?}",
        out.describe()
    );
    assert!(
        rest.iter().any(|l| l == "PASS"),
        "{rest:?}
{}",
        out.describe()
    );
    assert!(
        rest.iter()
            .any(|l| l == "error: cudaErrorDevicesUnavailable"),
        "{rest:?}"
    );
}

/// A folder with `libcuda.so.1` pointing at the client driver, for running a
/// program without `cumux run`.
fn driver_dir(dir: &TempDir) -> PathBuf {
    common::ensure_driver();
    let driver = Path::new(common::CUMUX).with_file_name("libcumux_client.so");
    let lib = dir.0.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::os::unix::fs::symlink(&driver, lib.join("libcuda.so.1")).unwrap();
    lib
}

#[test]
fn no_server_means_no_device() {
    let dir = TempDir::new("noserver");
    let lib = driver_dir(&dir);
    let program = driver_program("device_query");
    let child = Command::new(&program)
        .env("LD_LIBRARY_PATH", &lib)
        .env(
            "CUMUX_SERVER",
            format!("unix:{}", dir.0.join("absent.sock").display()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, LIMIT);
    assert_ne!(out.code(), Some(0), "{}", out.describe());
    assert!(
        out.stdout
            .contains("cudaGetDeviceCount(&count) -> no CUDA-capable device is detected"),
        "{}",
        out.describe()
    );
    assert!(
        out.stderr.contains("cannot reach the cumux server"),
        "{}",
        out.describe()
    );
}

/// The CUDA 12 runtime from PyPI (`nvidia-cuda-runtime-cu12`), beside the cu13 tree.
fn cuda12_runtime_dir() -> Option<PathBuf> {
    let home = cumux_testkit::cuda_home();
    let dir = home.parent()?.join("cuda_runtime/lib");
    dir.join("libcudart.so.12").is_file().then_some(dir)
}

#[test]
fn cuda12_runtime_program() {
    let Some(rt) = cuda12_runtime_dir() else {
        eprintln!("skipped: libcudart.so.12 not installed");
        return;
    };
    let dir = TempDir::new("cuda12");
    let source = cumux_testkit::workspace_root().join("tests/cuda/driver/cuda12_runtime.c");
    let exe = dir.0.join("cuda12_runtime");
    let include = cumux_testkit::cuda_home().join("include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(cc)
        .arg("-I")
        .arg(&include)
        .arg(&source)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", rt.display()))
        .arg("-l:libcudart.so.12")
        .arg(format!("-Wl,-rpath,{}", rt.display()))
        .output()
        .expect("a C compiler runs");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let server = ServerProc::start("cuda12");
    let out = run_passes(&server, &exe);
    assert!(out.stdout.contains("runtime: 12"), "{}", out.describe());
}

/// A server of two CPU devices (`--cpu-devices 2`), each with memory of its own.
fn two_device_server(tag: &str, extra: &[&str]) -> ServerProc {
    let dir = TempDir::new(tag);
    let mut args: Vec<String> = [
        "--device",
        &e2e_device(),
        "--cpu-devices",
        "2",
        "--memory",
        "1G",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    ServerProc::spawn(dir, &args, &[])
}

/// One program on two devices: each device is a session of the program's
/// own, its pointers in a range of its own; copies between the devices, one
/// after an event of the other device, land; `CUDA_VISIBLE_DEVICES` reorders
/// them. Through workers, the program's contexts share one worker process.
#[test]
fn one_program_uses_two_devices() {
    let program = driver_program("two_devices");
    let mut modes: Vec<&[&str]> = vec![&[]];
    if e2e_device() == "worker-cpu" {
        modes.push(&["--sharing", "shared"]);
    }
    for extra in modes {
        let server = two_device_server("two-devices", extra);
        let out = run_passes(&server, &program);
        assert_eq!(
            value(&out.stdout, "can_access_peer"),
            Some("0"),
            "{}",
            out.stdout
        );
        let status = server.status_json();
        assert_eq!(status["devices"].as_array().map(Vec::len), Some(2));
        if e2e_device() == "worker-cpu" {
            assert!(
                server.log().contains("joins its program's worker process"),
                "{extra:?}: {}",
                server.log()
            );
        }
        // The devices in the other order: the program's device 0 is the server's 1.
        let mut run = server.command(&program, &[]);
        run.env("CUDA_VISIBLE_DEVICES", "1,0");
        let out = wait_bounded(run.spawn().unwrap(), LIMIT);
        out.assert_passed();
    }
}

/// A program's further connection must name its program's group, and be
/// of its tenant: a made-up key, or one of another program, opens nothing.
#[test]
fn a_device_session_joins_only_its_own_programs_group() {
    use cumux_protocol::{
        decode, encode, read_frame, write_frame, ClientRole, Hello, HelloReply, Join, MAGIC,
        PROTOCOL_VERSION,
    };
    let server = two_device_server("two-devices-join", &[]);
    let path = server.address.trim_start_matches("unix:").to_string();
    let hello = |join: Option<Join>| {
        let mut s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let hello = Hello {
            magic: MAGIC,
            version: PROTOCOL_VERSION,
            pid: std::process::id(),
            role: ClientRole::Driver,
            program: "join-test".into(),
            tenant: None,
            token: None,
            shm: false,
            visible_devices: None,
            join,
            resume: None,
            lane: None,
        };
        write_frame(&mut s, &encode(&hello).unwrap()).unwrap();
        let mut buf = Vec::new();
        read_frame(&mut s, &mut buf).unwrap();
        (decode::<HelloReply>(&buf).unwrap(), s)
    };
    let (first, _keep) = hello(None);
    let HelloReply::Welcome { group, .. } = first else {
        panic!("{first:?}")
    };
    assert_ne!(group, 0);
    let (second, _keep2) = hello(Some(Join {
        group,
        device: 1,
        ordinal: 1,
    }));
    assert!(matches!(second, HelloReply::Welcome { .. }), "{second:?}");
    for bad in [
        Join {
            group: group ^ 0x55,
            device: 1,
            ordinal: 1,
        },
        Join {
            group,
            device: 2,
            ordinal: 2,
        },
    ] {
        let (reply, _) = hello(Some(bad));
        assert!(
            matches!(reply, HelloReply::Rejected { .. }),
            "{bad:?}: {reply:?}"
        );
    }
}
