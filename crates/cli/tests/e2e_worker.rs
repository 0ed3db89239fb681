//! Worker-backed devices end to end, without a GPU: `cumux serve --device
//! worker-cpu` runs each session's context in a `cumux worker` process of the
//! CPU device, exactly as `--device cuda` does with GPUs. Programs pass, device
//! printf reaches only its own program, a killed worker fails its session
//! cleanly while the server goes on, and no worker is left behind.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(300);

/// A `cumux serve --device worker-cpu` child; killed at drop.
struct WorkerServer {
    server: ServerProc,
}

impl std::ops::Deref for WorkerServer {
    type Target = ServerProc;

    fn deref(&self) -> &ServerProc {
        &self.server
    }
}

impl std::ops::DerefMut for WorkerServer {
    fn deref_mut(&mut self) -> &mut ServerProc {
        &mut self.server
    }
}

impl WorkerServer {
    /// A server; `spares` false sets `CUMUX_WORKER_SPARES=0`.
    fn start(tag: &str, spares: bool) -> Self {
        Self::start_sharing(tag, spares, "isolated")
    }

    /// A server whose device gives sessions contexts as `sharing` says.
    fn start_sharing(tag: &str, spares: bool, sharing: &str) -> Self {
        Self::start_with(tag, spares, &["--sharing", sharing])
    }

    /// A server with `extra` arguments to `cumux serve`.
    fn start_with(tag: &str, spares: bool, extra: &[&str]) -> Self {
        Self::start_env(tag, spares, extra, &[])
    }

    /// A server with `extra` arguments and `envs` in its environment; it logs
    /// how each worker connection travels.
    fn start_env(tag: &str, spares: bool, extra: &[&str], envs: &[(&str, &str)]) -> Self {
        let mut args: Vec<String> = ["--device", "worker-cpu", "--memory", "1G"]
            .map(String::from)
            .to_vec();
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let mut all_envs = vec![
            ("CUMUX_WORKER_SPARES", if spares { "1" } else { "0" }),
            ("CUMUX_LOG", "info,cumux_server::worker=debug"),
        ];
        all_envs.extend_from_slice(envs);
        WorkerServer {
            server: ServerProc::spawn(TempDir::new(tag), &args, &all_envs),
        }
    }

    /// Starts `program` through the server and waits until it prints `line`
    /// (it is killed, and the test fails, if it does not).
    fn start_program(&self, program: &std::path::Path, args: &[&str], line: &str) -> Child {
        let run = self.command(program, args);
        self.start_until(run, line, LIMIT).0
    }

    fn run(&self, program: &std::path::Path) -> RunOutput {
        self.server.run(program, &[], LIMIT)
    }

    /// Waits until the device holds no memory (a session's teardown may end a
    /// moment after its program); the status then.
    fn wait_memory_back(&self) -> serde_json::Value {
        self.status_when("the memory back", |json| {
            json["devices"][0]["used_mem"] == 0
        })
    }

    /// Waits until the server has at most `live` children, none a zombie.
    fn wait_children(&self, live: usize) -> Vec<(u32, char, String)> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let children = self.children();
            if children.len() <= live && children.iter().all(|c| c.1 != 'Z') {
                return children;
            }
            assert!(
                Instant::now() < deadline,
                "workers left behind: {children:?}\n--- server log\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn programs_run_in_workers_and_printf_reaches_only_its_program() {
    let server = WorkerServer::start("worker-run", true);
    // The spare starts with the server, before any session; a status query
    // opens a session but starts no worker of its own.
    let warm = server.children();
    assert_eq!(warm.len(), 1, "one spare from the start: {warm:?}");
    let status = status_output(&server.address, &[]);
    assert!(status.status.success(), "{status:?}");
    let pids = |c: &[(u32, char, String)]| c.iter().map(|w| w.0).collect::<Vec<_>>();
    assert_eq!(pids(&server.children()), pids(&warm));

    let printer = corpus_program("printf_kernel");
    let quiet = corpus_program("vector_add");
    // out_of_bounds faults its own worker's context and expects the error.
    let faulty = corpus_program("out_of_bounds");
    let runs: Vec<_> = [&printer, &quiet, &printer, &faulty]
        .into_iter()
        .map(|p| server.command(p, &[]).spawn().expect("cumux run starts"))
        .collect();
    let outs: Vec<RunOutput> = runs.into_iter().map(|c| wait_bounded(c, LIMIT)).collect();
    let names = [
        "printf_kernel",
        "vector_add",
        "printf_kernel",
        "out_of_bounds",
    ];
    for (out, name) in outs.iter().zip(names) {
        server.assert_pass(out, name);
    }
    for out in [&outs[0], &outs[2]] {
        let device_lines = out
            .stdout
            .lines()
            .filter(|l| l.starts_with("block "))
            .count();
        assert_eq!(device_lines, 2, "{}", out.describe());
        assert!(out
            .stdout
            .lines()
            .any(|l| l == "block 1: int=17 float=2.500 str=second char=B big=2199023255552"));
    }
    assert!(
        !outs[1].stdout.contains("block "),
        "another program's printf leaked: {}",
        outs[1].describe()
    );
    // One spare worker stays warm for the next session, which takes it.
    let spare = server.wait_children(1);
    assert_eq!(spare.len(), 1, "{spare:?}");
    let again = server.run(&quiet);
    assert_eq!(again.code(), Some(0), "{}", again.describe());
    let next = server.wait_children(1);
    assert_eq!(next.len(), 1, "{next:?}");
    assert_ne!(next[0].0, spare[0].0, "the spare was not used");
    // A spare that died idle is replaced, unseen by the next session.
    // SAFETY: kill(2) on the spare worker, a child of the server we started.
    assert_eq!(unsafe { libc::kill(next[0].0 as i32, libc::SIGKILL) }, 0);
    std::thread::sleep(Duration::from_millis(100));
    server.assert_pass(&server.run(&quiet), "vector_add");
    let last = server.wait_children(1);
    assert_eq!(last.len(), 1, "{last:?}");
}

#[test]
fn a_killed_worker_fails_its_session_and_the_server_goes_on() {
    let mut server = WorkerServer::start("worker-kill", false);
    let looping = test_program("loop_launches");
    let (child, lines) = server.start_until(server.command(&looping, &["120"]), "started", LIMIT);
    let workers: Vec<_> = server
        .children()
        .into_iter()
        .filter(|(_, _, cmd)| cmd.contains(" worker "))
        .collect();
    assert_eq!(workers.len(), 1, "{workers:?}");
    let pid = workers[0].0;
    // SAFETY: kill(2) on the worker's pid, a child of the server we started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);

    // The program sees a failed call, not a hang.
    let out = wait_bounded(child, LIMIT);
    let mut rest = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        rest.push(line);
    }
    assert_eq!(
        out.code(),
        Some(3),
        "{}\n{rest:?}\n--- server log\n{}",
        out.describe(),
        server.log()
    );
    assert!(
        rest.iter().any(|l| l.contains("failed")),
        "{rest:?}\n{}",
        out.describe()
    );
    assert!(server.alive(), "the server died with its worker");
    assert!(
        server.log().contains(SHM_LINE),
        "the killed worker was not on shared memory\n{}",
        server.log()
    );

    // A new session gets a new worker.
    server.assert_pass(&server.run(&corpus_program("vector_add")), "vector_add");
    let left = server.wait_children(0);
    assert!(left.is_empty(), "{left:?}");
}

fn workers(server: &WorkerServer) -> Vec<(u32, char, String)> {
    server
        .children()
        .into_iter()
        .filter(|(_, _, cmd)| cmd.contains(" worker "))
        .collect()
}

fn passes(out: &RunOutput, server: &WorkerServer) {
    assert!(
        out.code() == Some(0) && out.stdout.lines().any(|l| l.contains("PASS")),
        "{}\n--- server log\n{}",
        out.describe(),
        server.log()
    );
}

/// `--sharing shared`: programs at once share one worker (one context), each
/// on streams of its own with handles that do not collide, and what a
/// program held is freed when it ends while the context lives on.
#[test]
fn shared_mode_runs_tenants_in_one_context() {
    let mut server = WorkerServer::start_sharing("shared", false, "shared");
    let programs = [
        corpus_program("saxpy"),
        corpus_program("histogram"),
        driver_program("streams_events"),
        driver_program("threads"),
        driver_program("host_callback"),
    ];
    let children: Vec<_> = programs
        .iter()
        .map(|p| server.command(p, &[]).spawn().expect("cumux run starts"))
        .collect();
    for child in children {
        passes(&wait_bounded(child, LIMIT), &server);
    }
    let pids = |s: &WorkerServer| workers(s).iter().map(|w| w.0).collect::<Vec<_>>();
    let live = pids(&server);
    assert_eq!(live.len(), 1, "one shared worker: {live:?}");
    // Everything the programs allocated goes back, the worker stays.
    server.wait_memory_back();
    assert_eq!(pids(&server), live, "the shared worker lives on");
    assert!(server.alive());
}

/// Virtual memory in workers, in both sharing modes: two programs at once
/// map physical memory side by side and run kernels across it; everything
/// goes back at their end.
#[test]
fn virtual_memory_in_workers_in_both_sharing_modes() {
    let link = format!("-L{}", driver_link_folder("cumux-link").display());
    let program = cumux_testkit::compile_program(driver_source("vmm"), &[&link, "-lcuda"]);
    for sharing in ["isolated", "shared"] {
        let server = WorkerServer::start_sharing(&format!("vmm-{sharing}"), false, sharing);
        let children: Vec<_> = (0..2)
            .map(|_| {
                server
                    .command(&program, &[])
                    .spawn()
                    .expect("cumux run starts")
            })
            .collect();
        for child in children {
            passes(&wait_bounded(child, LIMIT), &server);
        }
        server.wait_memory_back();
    }
}

/// A fault in `shared` mode fails the context it happened in; the server
/// stays up and the next session gets a fresh context.
#[test]
fn a_fault_in_shared_mode_costs_the_context_not_the_server() {
    // Trusted tenants' kernels are not fenced: out_of_bounds's far pointer
    // would otherwise fold into its own partition, onto its own buffer.
    let dir = TempDir::new("shared-fault-config");
    let config = config_file(&dir, "[defaults]\ntrusted = true\n");
    let config = config.display().to_string();
    let mut server = WorkerServer::start_with(
        "shared-fault",
        false,
        &["--sharing", "shared", "--config", &config],
    );
    passes(&server.run(&corpus_program("saxpy")), &server);
    let first = workers(&server);
    assert_eq!(first.len(), 1, "{first:?}");
    // out_of_bounds passes when its kernel faults with an illegal address.
    passes(&server.run(&corpus_program("out_of_bounds")), &server);
    passes(&server.run(&corpus_program("saxpy")), &server);
    let now = workers(&server);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now[0].0, first[0].0, "a fresh worker after the fault");
    assert!(server.alive());
}

/// Under `fair` and `priority` a session on a worker queues its launches on the
/// device, each followed by a completion signal the scheduling gate watches
/// (rather than running them one by one on server threads). Programs of a
/// latency-critical and a batch tenant at once, in both sharing modes, all pass,
/// and the gate let every launch through.
#[test]
fn scheduled_programs_queue_their_launches_and_pass() {
    let programs = [
        corpus_program("saxpy"),
        driver_program("streams_events"),
        driver_program("threads"),
    ];
    for (policy, sharing) in [("priority", "shared"), ("fair", "isolated")] {
        let tag = format!("sched-{policy}");
        let dir = TempDir::new(&format!("{tag}-config"));
        let config = dir.0.join("cumux.toml");
        std::fs::write(
            &config,
            "[tenants.lc]\nclass = \"latency-critical\"\n[tenants.batch]\nweight = 2\n",
        )
        .unwrap();
        let config = config.display().to_string();
        let server = WorkerServer::start_with(
            &tag,
            false,
            &[
                "--sharing",
                sharing,
                "--policy",
                policy,
                "--config",
                &config,
            ],
        );
        let children: Vec<_> = programs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut c = Command::new(CUMUX);
                let tenant = if i == 0 { "lc" } else { "batch" };
                c.args(["run", "--server", &server.address, "--tenant", tenant, "--"])
                    .arg(p)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                c.spawn().expect("cumux run starts")
            })
            .collect();
        for child in children {
            passes(&wait_bounded(child, LIMIT), &server);
        }
        let json = server.wait_memory_back();
        assert_eq!(json["devices"][0]["policy"], policy, "{json}");
        // Every program launched: the gate saw launches finish by their signals.
        let signalled = json["devices"][0]["signalled_launches"].as_u64().unwrap();
        assert!(signalled >= 3, "{json}");
        assert!(
            !server.log().contains("scheduling gate"),
            "the gate complained: {}",
            server.log()
        );
    }
}

/// What the server logs when a worker connection moves onto shared memory.
const SHM_LINE: &str = "worker connection on shared memory";
/// What it logs when `CUMUX_WORKER_TRANSPORT=socket` keeps one on its socket.
const SOCKET_LINE: &str = "worker connection on its socket";

/// Worker connections use shared memory by default, their socket with
/// `CUMUX_WORKER_TRANSPORT=socket`; a real program passes either way, in
/// isolated and shared mode.
#[test]
fn worker_connections_use_shared_memory_unless_told_socket() {
    for sharing in ["isolated", "shared"] {
        for (transport, line, other) in [
            (None, SHM_LINE, SOCKET_LINE),
            (Some("socket"), SOCKET_LINE, SHM_LINE),
        ] {
            let envs: Vec<(&str, &str)> = transport
                .map(|t| ("CUMUX_WORKER_TRANSPORT", t))
                .into_iter()
                .collect();
            let tag = format!("worker-transport-{sharing}-{}", transport.unwrap_or("shm"));
            let server = WorkerServer::start_env(&tag, true, &["--sharing", sharing], &envs);
            let out = server.run(&corpus_program("vector_add"));
            assert!(
                out.code() == Some(0) && out.stdout.contains("vector_add: PASS"),
                "{sharing} {transport:?}: {}\n--- server log\n{}",
                out.describe(),
                server.log()
            );
            let log = server.log();
            assert!(log.contains(line), "{sharing} {transport:?}: {log}");
            assert!(!log.contains(other), "{sharing} {transport:?}: {log}");
        }
    }
}

/// Records of one kind in the hop-trace files under `dir` (see
/// `cumux_protocol::hop_trace`): how many have hop `hop` and a name that
/// starts with `name`.
fn hop_records(dir: &std::path::Path, hop: u8, name: &str) -> usize {
    let mut count = 0;
    for entry in std::fs::read_dir(dir)
        .expect("the hop trace folder")
        .flatten()
    {
        let bytes = std::fs::read(entry.path()).unwrap_or_default();
        count += bytes
            .chunks_exact(32)
            .skip(1)
            .filter(|r| r[12] == hop && r[13..].starts_with(name.as_bytes()))
            .count();
    }
    count
}

/// A device synchronize with nothing queued since the last one is answered
/// by the server: the worker sees at most the program's first and last
/// synchronize (each after a launch), not the hundred idle ones between them. The hop
/// trace, on in the server and so in its worker, counts what reached the worker.
#[test]
fn idle_device_synchronizes_stay_in_the_server() {
    let dir = TempDir::new("idle-sync-trace");
    let trace = dir.0.join("hops");
    for sharing in ["shared", "isolated"] {
        let _ = std::fs::remove_dir_all(&trace);
        let server = WorkerServer::start_env(
            &format!("idle-sync-{sharing}"),
            false,
            &["--sharing", sharing],
            &[("CUMUX_HOP_TRACE", trace.to_str().unwrap())],
        );
        passes(&server.run(&test_program("idle_syncs")), &server);
        // WorkerReceive is hop 7. The ones after a launch may reach it too (the
        // server answers them from completion signals when it can); a shared
        // view synchronizes its streams one by one.
        let reached = hop_records(&trace, 7, "Synchronize");
        assert!(
            reached <= 8,
            "{sharing}: {reached} synchronizes reached the worker for 102 the program made"
        );
    }
}

/// A context synchronize of a program with other threads polls each stream
/// before it waits (leaving the connection to them), each poll a round trip:
/// only the streams that had work since the last one, and the default
/// stream. `ctx_sync_streams.cu` has 16 streams, works on one and
/// synchronizes 10 times: at most 2 polls each (16 and more before).
#[test]
fn a_context_synchronize_polls_only_the_streams_that_had_work() {
    let dir = TempDir::new("ctx-sync-trace");
    let trace = dir.0.join("hops");
    let server = WorkerServer::start_sharing("ctx-sync", false, "isolated");
    // Marks would answer the synchronizes this test counts: it checks the
    // polls of those that reach the server.
    let child = server
        .command(&test_program("ctx_sync_streams"), &[])
        .env("CUMUX_HOP_TRACE", &trace)
        .env("CUMUX_MARKS", "off")
        .spawn()
        .expect("cumux run starts");
    passes(&wait_bounded(child, LIMIT), &server);
    // ClientSend is hop 1; polls that find work unfinished repeat.
    let polls = hop_records(&trace, 1, "StreamQuery");
    let syncs = hop_records(&trace, 1, "ContextSynchronize");
    assert_eq!(syncs, 10, "{syncs} context synchronizes");
    assert!(
        (10..=2 * 10 + 10).contains(&polls),
        "{polls} stream polls for 10 synchronizes"
    );
}

/// A stream whose copy to the host in its order was answered has no work
/// left: `item_syncs.cu`'s waits after its 20 copies (stream and event
/// synchronizes and queries, a second stream's wait on the event, device
/// synchronizes) are answered by the client (`transport::quiet`), none
/// reaching the server; its waits behind new work do; its streams and events
/// are made without a round trip. Over shared memory and over the socket.
#[test]
fn waits_after_a_copy_to_the_host_are_answered_by_the_client() {
    let dir = TempDir::new("item-syncs-trace");
    let server = WorkerServer::start_sharing("item-syncs", false, "isolated");
    for transport in ["shm", "socket"] {
        let trace = dir.0.join(transport);
        // Marks would answer some of the waits this test counts (those
        // behind new work): it checks what the connection itself knows.
        let child = server
            .command(&test_program("item_syncs"), &[])
            .env("CUMUX_HOP_TRACE", &trace)
            .env("CUMUX_TRANSPORT", transport)
            .env("CUMUX_MARKS", "off")
            .spawn()
            .expect("cumux run starts");
        passes(&wait_bounded(child, LIMIT), &server);
        // ClientSend is hop 1.
        let waits: usize = [
            "StreamSynchronize",
            "StreamQuery",
            "EventSynchronize",
            "EventQuery",
            "QueryWithin",
        ]
        .iter()
        .map(|name| hop_records(&trace, 1, name))
        .sum();
        // Those of the last part: a wait behind new work, one for the
        // timed events, and at most two more for their stamps.
        assert!(
            (2..=4).contains(&waits),
            "{transport}: {waits} waits reached the server (2 to 4 of the last part should)"
        );
        let syncs = hop_records(&trace, 1, "ContextSynchronize");
        assert_eq!(
            syncs, 0,
            "{transport}: {syncs} device synchronizes reached the server"
        );
        // Streams and events are made under handles the client chose, with
        // no answer to wait for.
        let answered: usize = ["StreamCreate", "EventCreate", "NewStream", "NewEvent"]
            .iter()
            .map(|name| hop_records(&trace, 2, name))
            .sum();
        let made = hop_records(&trace, 1, "NewStream") + hop_records(&trace, 1, "NewEvent");
        assert_eq!(
            answered, 0,
            "{transport}: {answered} creations waited for an answer"
        );
        assert!(made >= 3, "{transport}: {made} streams and events made");
    }
}

/// The waits of `settled_copies.cu`, whose streams have only copies in to
/// wait for, are answered by the client: it sends `Settle`, unanswered,
/// which the server waits for before the next call (a kernel on another
/// stream then finds every copy done). Over the socket, 46 waits of 46, the
/// synchronous copies included; over shared memory the 25 after the
/// asynchronous copies (its synchronous ones of this size go through the
/// staging buffer and wait). A copy into freed memory still fails at its
/// wait. With `CUMUX_SETTLE=0` the waits reach the server again. Its
/// synchronous memsets and copies within the device are never waited for.
#[test]
fn waits_for_copies_in_alone_are_settled_by_the_client() {
    let dir = TempDir::new("settled-trace");
    let server = WorkerServer::start_sharing("settled", false, "isolated");
    for (transport, settle, settles) in [("socket", "1", 46), ("shm", "1", 25), ("socket", "0", 0)]
    {
        let trace = dir.0.join(format!("{transport}-{settle}"));
        let child = server
            .command(&test_program("settled_copies"), &[])
            .env("CUMUX_HOP_TRACE", &trace)
            .env("CUMUX_TRANSPORT", transport)
            .env("CUMUX_SETTLE", settle)
            .spawn()
            .expect("cumux run starts");
        passes(&wait_bounded(child, LIMIT), &server);
        // ClientSend is hop 1.
        let sent = hop_records(&trace, 1, "Settle");
        let waits: usize = [
            "StreamSynchronize",
            "StreamQuery",
            "QueryWithin",
            "ContextSynchronize",
        ]
        .iter()
        .map(|name| hop_records(&trace, 1, name))
        .sum();
        let case = format!("{transport}, CUMUX_SETTLE={settle}");
        assert_eq!(sent, settles, "{case}: {sent} settles sent");
        // Synchronous memsets and copies within the device go unanswered
        // (ClientAnswer is hop 2).
        let answered = hop_records(&trace, 2, "Memset") + hop_records(&trace, 2, "MemcpyDtoD");
        assert_eq!(answered, 0, "{case}: {answered} memsets and copies waited");
        match (transport, settle) {
            // The waits for the checking kernels of the device rounds, and
            // the one after the copy into freed memory.
            ("socket", "1") => assert!(waits <= 8, "{case}: {waits} waits reached the server"),
            // And the staged synchronous copies' own.
            ("shm", "1") => assert!(waits <= 30, "{case}: {waits} waits reached the server"),
            _ => assert!(waits >= 45, "{case}: {waits} waits reached the server"),
        }
    }
}

/// The CUDA runtime registers every fat binary of a program at start; each is
/// loaded on the server only when one of its kernels is first asked for. A
/// program of two fat binaries that runs the kernel of one sends one module
/// load; run so that it uses both, two; with `CUDA_MODULE_LOADING=EAGER`,
/// two at start.
#[test]
fn libraries_load_at_their_first_use() {
    let other = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cuda/lazy_other.cu");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cuda/lazy_main.cu");
    let program = cumux_testkit::compile_program(source, &[other.to_str().unwrap()]);
    let server = WorkerServer::start_sharing("lazy-libraries", false, "shared");
    let dir = TempDir::new("lazy-trace");
    for (args, loads) in [(&[][..], 1), (&["both"][..], 2)] {
        let trace = dir.0.join(format!("hops-{}", args.len()));
        let child = server
            .command(&program, args)
            .env("CUMUX_HOP_TRACE", &trace)
            .spawn()
            .expect("cumux run starts");
        passes(&wait_bounded(child, LIMIT), &server);
        // ClientSend is hop 1.
        assert_eq!(hop_records(&trace, 1, "ModuleLoad"), loads, "args {args:?}");
    }
    // CUDA_MODULE_LOADING=EAGER loads both at start, as NVIDIA's driver does.
    let trace = dir.0.join("hops-eager");
    let child = server
        .command(&program, &[])
        .env("CUMUX_HOP_TRACE", &trace)
        .env("CUDA_MODULE_LOADING", "EAGER")
        .spawn()
        .expect("cumux run starts");
    passes(&wait_bounded(child, LIMIT), &server);
    assert_eq!(hop_records(&trace, 1, "ModuleLoad"), 2, "eager");
}

/// A session's launches are covered by completion signals (under a policy as
/// they go, under `fifo` when it synchronizes), and a synchronize that they
/// cover is answered from them without the worker: a program that launches
/// and waits 50 times sends the worker few of them (47 before). A kernel that
/// faults still fails the synchronize after it (the worker counts the failure
/// where the server looks).
#[test]
fn signalled_synchronizes_skip_the_worker_and_keep_errors() {
    let dir = TempDir::new("signalled-sync");
    let config = dir.0.join("cumux.toml");
    // Trusted: out_of_bounds must fault, not fold into its own partition.
    std::fs::write(
        &config,
        "[tenants.lc]\nclass = \"latency-critical\"\ntrusted = true\n",
    )
    .unwrap();
    for policy in ["priority", "fifo"] {
        let trace = dir.0.join(format!("hops-{policy}"));
        let server = WorkerServer::start_env(
            &format!("signalled-sync-{policy}"),
            false,
            &[
                "--sharing",
                "shared",
                "--policy",
                policy,
                "--config",
                config.to_str().unwrap(),
            ],
            &[("CUMUX_HOP_TRACE", trace.to_str().unwrap())],
        );
        let run = |program: &std::path::Path| {
            let mut c = Command::new(CUMUX);
            c.args(["run", "--server", &server.address, "--tenant", "lc", "--"])
                .arg(program)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            wait_bounded(c.spawn().expect("cumux run starts"), LIMIT)
        };
        passes(&run(&test_program("signalled_syncs")), &server);
        // Some may: a kernel the CPU device takes long over, or a busy machine,
        // outlasts the wait for its signal (200 µs on small hosts).
        let reached = hop_records(&trace, 7, "Synchronize");
        assert!(
            reached <= 25,
            "{policy}: {reached} synchronizes reached the worker for the program's 50"
        );
        let faulty = run(&corpus_program("out_of_bounds"));
        assert!(
            faulty.code() == Some(0) && faulty.stdout.contains("out_of_bounds: PASS"),
            "{policy}: {}\n--- server log\n{}",
            faulty.describe(),
            server.log()
        );
    }
}

/// A captured graph of launches goes to the server whole and each launch of it
/// is one call (the worker runs it as one graph; on a GPU, a CUDA graph), with
/// the same results as replaying it launch by launch (`CUMUX_GRAPHS=replay`),
/// in shared and isolated mode.
#[test]
fn graphs_of_launches_run_whole_on_the_server() {
    let program = test_program("graph_replay");
    let dir = TempDir::new("graph-trace");
    for sharing in ["shared", "isolated"] {
        let server = WorkerServer::start_sharing(&format!("graphs-{sharing}"), false, sharing);
        for (mode, graph_launches, launches) in [("whole", 10, 0), ("replay", 0, 200)] {
            let trace = dir.0.join(format!("{sharing}-{mode}"));
            let child = server
                .command(&program, &[])
                .env("CUMUX_HOP_TRACE", &trace)
                .env("CUMUX_GRAPHS", mode)
                .spawn()
                .expect("cumux run starts");
            passes(&wait_bounded(child, LIMIT), &server);
            // ClientSend is hop 1 (names are cut at 19 bytes).
            let sent = |name: &str| hop_records(&trace, 1, name);
            assert_eq!(sent("GraphLaunch"), graph_launches, "{sharing} {mode}");
            assert_eq!(sent("Launch"), launches, "{sharing} {mode}");
        }
    }
}

/// `--kernel-timeout`: a kernel that never ends (the CPU device with no
/// instruction budget) fails its program's synchronize with
/// CUDA_ERROR_LAUNCH_TIMEOUT once the context made no progress for the timeout,
/// instead of hanging; the server goes on and the next program passes.
#[test]
fn the_watchdog_resets_a_context_whose_kernel_never_ends() {
    let mut server = WorkerServer::start_with(
        "watchdog-isolated",
        false,
        &["--kernel-timeout", "2s", "--launch-budget", "0"],
    );
    let started = Instant::now();
    let out = server.run(&test_program("endless_kernel"));
    let took = started.elapsed();
    assert!(
        out.code() == Some(0) && out.stdout.contains("endless_kernel: timed out"),
        "{}\n--- server log\n{}",
        out.describe(),
        server.log()
    );
    assert!(took >= Duration::from_secs(2), "reset after {took:?}");
    assert!(server.log().contains("kernel watchdog"), "{}", server.log());
    assert!(server.alive());
    passes(&server.run(&corpus_program("saxpy")), &server);
    server.wait_children(0);
}

/// In `shared` mode a tenant killed while its kernel never ends would leave that
/// kernel holding the shared context; the watchdog resets the context, and the
/// next tenant gets a fresh one.
#[test]
fn the_watchdog_frees_a_shared_context_from_a_killed_tenants_endless_kernel() {
    let mut server = WorkerServer::start_with(
        "watchdog-shared",
        false,
        &[
            "--sharing",
            "shared",
            "--kernel-timeout",
            "2s",
            "--launch-budget",
            "0",
        ],
    );
    passes(&server.run(&corpus_program("saxpy")), &server);
    let first = workers(&server);
    assert_eq!(first.len(), 1, "{first:?}");
    let mut holder = server.start_program(&test_program("endless_kernel"), &["hold"], "launched");
    let _ = holder.kill();
    let _ = holder.wait();
    // The teardown of the killed session waits for its kernel until the
    // watchdog gives up on the context.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server.log().contains("kernel watchdog") {
        assert!(Instant::now() < deadline, "no reset\n{}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    passes(&server.run(&corpus_program("saxpy")), &server);
    let now = workers(&server);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(
        now[0].0, first[0].0,
        "a fresh shared worker after the reset"
    );
    assert!(server.alive());
}

/// A worker ends with its server, even while a kernel that never ends keeps
/// its threads busy: a killed server leaves no worker holding a context.
#[test]
fn workers_end_with_a_killed_server_even_mid_kernel() {
    let mut server = WorkerServer::start_with("worker-orphan", false, &["--launch-budget", "0"]);
    let mut holder = server.start_program(&test_program("endless_kernel"), &["hold"], "launched");
    let pids: Vec<u32> = workers(&server).iter().map(|w| w.0).collect();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let _ = server.child.kill();
    let _ = server.child.wait();
    // Gone, or a zombie left for whoever adopted it: either way not running.
    let running = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with(|c| c != 'Z')))
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&p| running(p)) {
        assert!(
            Instant::now() < deadline,
            "worker {pids:?} outlived its server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = holder.kill();
    let _ = holder.wait();
}

/// Under `fair` and `priority` copies and memsets pass the scheduling gate as
/// launches do: a tenant that only copies is scheduled, and charged for the
/// device time its copies took.
#[test]
fn copies_and_memsets_are_scheduled_like_launches() {
    for policy in ["fair", "priority"] {
        let server = WorkerServer::start_with(
            &format!("sched-copies-{policy}"),
            false,
            &["--policy", policy],
        );
        let mut copier = server.start_program(&test_program("copies_only"), &["hold"], "holding");
        let json = server.status_json();
        let _ = copier.kill();
        let _ = copier.wait();
        // 64 memsets and 64 copies on the stream, and the synchronous copies.
        let signalled = json["devices"][0]["signalled_launches"].as_u64().unwrap();
        assert!(signalled >= 128, "{policy}: {json}");
        let charged = json["tenants"][0]["gpu_time_ms"].as_f64().unwrap();
        assert!(charged > 0.0, "{policy}: {json}");
    }
}

/// In `shared` mode the tenants' kernels print into one context, whose device
/// printf comes out wherever the next wait flushes it; each program must still
/// see its own lines, all of them, and none of another's.
#[test]
fn printf_in_shared_mode_reaches_only_its_own_program() {
    let server = WorkerServer::start_sharing("shared-printf", false, "shared");
    let program = test_program("printf_tagged");
    let tags = ["abc", "def", "ghi"];
    let runs: Vec<_> = tags
        .iter()
        .map(|tag| {
            server
                .command(&program, &[tag, "40"])
                .spawn()
                .expect("cumux run starts")
        })
        .collect();
    for (tag, run) in tags.iter().zip(runs) {
        let out = wait_bounded(run, LIMIT);
        passes(&out, &server);
        let lines: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| l.starts_with("tag "))
            .collect();
        let own = lines
            .iter()
            .filter(|l| l.starts_with(&format!("tag {tag} ")))
            .count();
        assert_eq!(
            (own, lines.len()),
            (40, 40),
            "{tag}: its own lines, and all device lines it got\n{}",
            out.describe()
        );
    }
}

/// An event window's waits are answered by the client from marks the device
/// stores in its pinned memory (`client::marks`): of `event_window.cu`'s 368
/// synchronizes and 368 queries, few reach the server (the first wait on each
/// of its 32 events, whose first record had no mark, and the fault's), where with
/// `CUMUX_MARKS=off` each synchronize does. Its waits still wait (each
/// checks its kernel's stamp in mapped memory), and the wait after a
/// faulting kernel fails: the device stores no mark behind a fault.
#[test]
fn event_waits_are_answered_from_marks() {
    let dir = TempDir::new("marks-trace");
    let server = WorkerServer::start_sharing("marks", false, "isolated");
    for marks in ["on", "off"] {
        let trace = dir.0.join(marks);
        run_traced(&server, "event_window", &trace, marks);
        let asked = sent(&trace, &["EventSynchronize", "EventQuery", "QueryWithin"]);
        eprintln!("marks {marks}: {asked} event waits reached the server");
        // A record gets a mark once its event was waited on: all but the
        // first record of each of the 32, and the fault's.
        let marks_sent = sent(&trace, &["Mark"]);
        match marks {
            "on" => {
                assert!(asked <= 368 / 2, "{asked} event waits reached the server");
                assert_eq!(marks_sent, 400 - 32 + 1, "marks sent");
            }
            _ => {
                assert!(asked >= 368, "{asked} event waits with marks off");
                assert_eq!(marks_sent, 0, "marks sent with marks off");
            }
        }
    }
}

/// A kernel's printf comes out before the host's next line when the program
/// synchronizes the kernel's stream, in a session's own worker and in a
/// shared context: a session that loaded a printing module has its
/// synchronizes ask the worker, which hands the text over with the answer
/// (answered from completion signals, they left it there until a later
/// call, behind the host's lines; marks are left out for it too).
#[test]
fn printf_comes_with_a_stream_synchronize() {
    for sharing in ["isolated", "shared"] {
        let server = WorkerServer::start_sharing("stream-printf", false, sharing);
        let out = server.run(&test_program("stream_printf"));
        passes(&out, &server);
        device_lines_first(&out.stdout, 6, sharing);
    }
}

/// Stream and context synchronizes and synchronous copies of pinned memory
/// are answered from marks stored behind their work: with marks on, at most
/// a few of `sync_window`'s 200 stream synchronizes and 10 context
/// synchronizes reach the server (the fault's), where with `CUMUX_MARKS=off`
/// each does; every synchronous pinned copy is waited for by a mark. Each
/// wait still waits (the program checks what its kernels wrote), and the
/// synchronize after a faulting kernel fails.
#[test]
fn stream_waits_and_pinned_copies_are_answered_from_marks() {
    let dir = TempDir::new("sync-marks-trace");
    let server = WorkerServer::start_sharing("sync-marks", false, "isolated");
    for marks in ["on", "off"] {
        let trace = dir.0.join(marks);
        run_traced(&server, "sync_window", &trace, marks);
        let waits = [
            "StreamSynchronize",
            "StreamQuery",
            "QueryWithin",
            "ContextSynchronize",
        ];
        let asked = sent(&trace, &waits);
        let marks_sent = sent(&trace, &["Mark"]);
        eprintln!("marks {marks}: {asked} waits reached the server, {marks_sent} marks sent");
        match marks {
            "on" => {
                assert!(asked <= 210 / 2, "{asked} waits reached the server");
                // A mark per stream synchronize and per copy; two a context
                // synchronize (its streams `s` and `t`); the fault's.
                assert!(marks_sent >= 200 * 3 + 10 * 2, "{marks_sent} marks sent");
            }
            _ => {
                assert!(asked >= 210, "{asked} waits with marks off");
                assert_eq!(marks_sent, 0, "marks sent with marks off");
            }
        }
    }
}

/// In a shared context one tenant's printing module leaves only its own
/// marks out: after `event_printf` ran there, `sync_window`'s waits are
/// still answered from marks (each would reach the server otherwise), and
/// the printing program's lines still come in order when it runs again.
#[test]
fn a_printing_tenant_leaves_other_tenants_marks_in_a_shared_context() {
    let dir = TempDir::new("shared-marks-trace");
    let server = WorkerServer::start_sharing("shared-marks", false, "shared");
    passes(&server.run(&test_program("event_printf")), &server);
    let trace = dir.0.join("after-printf");
    run_traced(&server, "sync_window", &trace, "on");
    let asked = sent(&trace, &["StreamSynchronize", "StreamQuery", "QueryWithin"]);
    assert!(asked <= 200 / 2, "{asked} stream waits reached the server");
    let out = server.run(&test_program("event_printf"));
    passes(&out, &server);
    device_lines_first(&out.stdout, 3, "shared");
}

/// A kernel's printf comes out before the host's next line when the program
/// waits on an event recorded after it: the device stores no mark behind
/// printf text, so the wait asks the server, which hands the text over.
#[test]
fn printf_comes_with_an_event_wait() {
    let server = WorkerServer::start_sharing("marks-printf", false, "isolated");
    let out = server.run(&test_program("event_printf"));
    passes(&out, &server);
    device_lines_first(&out.stdout, 3, "isolated");
}

/// Each of the first `n` `device line I` of `stdout` comes before `host line I`.
fn device_lines_first(stdout: &str, n: usize, what: &str) {
    let lines: Vec<&str> = stdout.lines().collect();
    for i in 0..n {
        let device = lines.iter().position(|l| *l == format!("device line {i}"));
        let host = lines.iter().position(|l| *l == format!("host line {i}"));
        assert!(
            matches!((device, host), (Some(d), Some(h)) if d < h),
            "{what}: line {i} out of order: {lines:?}"
        );
    }
}

/// Runs the test program `program` on `server` with the hop trace on into
/// `trace` and `CUMUX_MARKS=marks`: it passes, and reports its fault.
fn run_traced(server: &WorkerServer, program: &str, trace: &std::path::Path, marks: &str) {
    let child = server
        .command(&test_program(program), &[])
        .env("CUMUX_HOP_TRACE", trace)
        .env("CUMUX_MARKS", marks)
        .spawn()
        .expect("cumux run starts");
    let out = wait_bounded(child, LIMIT);
    passes(&out, server);
    assert!(out.stdout.contains("fault: "), "{}", out.describe());
}

/// How many calls of the kinds `names` the client sent (ClientSend is hop 1).
fn sent(trace: &std::path::Path, names: &[&str]) -> usize {
    names.iter().map(|name| hop_records(trace, 1, name)).sum()
}
