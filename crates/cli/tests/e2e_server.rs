//! The server and CLI end to end: a faulting program does not hurt the server or
//! the next program, two programs share it, a killed server makes a looping
//! program fail instead of hang, `cumux status --json` shows live sessions (and
//! whether they talk through shared memory or the socket) and their clean-up, a
//! killed program's endless kernel is cancelled at once, and `cumux run` /
//! `cumux serve` behave at their edges (a config's `[devices.N]` policy among
//! them).

mod common;

use std::os::unix::net::UnixListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(300);
/// How long a looping program may take to start.
const STARTED: Duration = Duration::from_secs(120);

/// `loop_launches 120` through `server`: it prints `started`, then launches
/// kernels for two minutes.
fn looping(server: &ServerProc) -> Command {
    server.command(&test_program("loop_launches"), &["120"])
}

fn assert_pass(out: &RunOutput, name: &str) {
    assert!(
        out.code() == Some(0) && out.stdout.contains(&format!("{name}: PASS")),
        "{name}: {}",
        out.describe()
    );
}

#[test]
fn a_faulting_program_leaves_the_server_and_the_next_program_fine() {
    let mut server = ServerProc::start("fault");
    let out = server.run(&corpus_program("out_of_bounds"), &[], LIMIT);
    assert_pass(&out, "out_of_bounds");
    assert!(server.alive(), "the server died: {}", server.log());
    let out = server.run(&corpus_program("vector_add"), &[], LIMIT);
    assert_pass(&out, "vector_add");
    assert!(server.alive());
}

#[test]
fn two_programs_at_once() {
    let server = ServerProc::start("two");
    let a = server
        .command(&corpus_program("matmul_tiled"), &[])
        .spawn()
        .unwrap();
    let b = server
        .command(&corpus_program("histogram"), &[])
        .spawn()
        .unwrap();
    let (a, b) = (wait_bounded(a, LIMIT), wait_bounded(b, LIMIT));
    assert_pass(&a, "matmul_tiled");
    assert_pass(&b, "histogram");
}

#[test]
fn status_shows_a_running_session_and_its_clean_up() {
    let server = ServerProc::start("status");
    let (child, _lines) = server.start_until(looping(&server), "started", STARTED);
    let status = server.status_json();
    let session = session_of(&status, "loop_launches");
    assert!(session["launches"].as_u64().unwrap() >= 1, "{session:#}");
    // A program on the unix socket talks through shared memory by default.
    assert_eq!(session["transport"], "shm", "{session:#}");
    assert!(session["allocations"].as_u64().unwrap() >= 1, "{session:#}");
    assert!(
        status["devices"][0]["used_mem"].as_u64().unwrap() >= 4,
        "{status:#}"
    );
    assert_eq!(status["devices"][0]["backend"], "cpu");
    // The human table names it too.
    assert!(server.status_table().contains("loop_launches"));
    // Killing the program (the session's pid, not `cumux run`) releases
    // everything it held.
    kill_program(&session);
    let out = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(out.code(), Some(128 + 9), "{}", out.describe());
    server.status_when("cleaned up", |status| {
        status["sessions"].as_array().unwrap().is_empty()
            && status["devices"][0]["used_mem"].as_u64() == Some(0)
    });
}

/// The state letters of the server's threads named `prefix…`.
fn thread_states(server: &ServerProc, prefix: &str) -> Vec<char> {
    let tasks = format!("/proc/{}/task", server.child.id());
    let Ok(entries) = std::fs::read_dir(tasks) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_whitespace().next()?.chars().next()
        })
        .collect()
}

/// A program killed while its kernel never ends on the in-process CPU device
/// (whose default budget allows minutes): the teardown cancels the running
/// kernel instead of waiting for it, so the session, its memory and its
/// stream threads are gone within seconds, and the next program runs.
#[test]
fn a_killed_programs_endless_kernel_is_cancelled_and_its_session_freed_at_once() {
    for mode in ["hold", "wait-killed"] {
        killed_mid_kernel(mode);
    }
}

/// `endless_kernel MODE` killed while its kernel runs: `hold` sleeps, so the
/// connection's thread notices at its next read; `wait-killed` is in a
/// synchronize, so the server's hang-up watcher must cancel the kernel.
fn killed_mid_kernel(mode: &str) {
    let server = ServerProc::spawn(
        TempDir::new(&format!("cancel-endless-{mode}")),
        &["--device", "cpu", "--memory", "2G"].map(String::from),
        &[],
    );
    let hold = server.command(&test_program("endless_kernel"), &[mode]);
    let (child, _lines) = server.start_until(hold, "launched", STARTED);
    let session = session_of(&server.status_json(), "endless_kernel");
    // Its stream thread runs the kernel (a one-block grid runs on it).
    let threads = format!("cumux-s{}-", session["session"]);
    poll("the kernel never ran", Duration::from_secs(30), || {
        thread_states(&server, &threads)
            .contains(&'R')
            .then_some(())
    });
    kill_program(&session);
    poll(
        &format!("the killed session ({mode}) held on past 5 s"),
        Duration::from_secs(5),
        || {
            let status = server.status_json();
            (status["sessions"].as_array().unwrap().is_empty()
                && status["devices"][0]["used_mem"].as_u64() == Some(0)
                && thread_states(&server, &threads).is_empty())
            .then_some(())
        },
    );
    let out = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(out.code(), Some(128 + 9), "{}", out.describe());
    let out = server.run(&corpus_program("vector_add"), &[], LIMIT);
    assert_pass(&out, "vector_add");
}

/// The same through a worker process (the path GPUs take): a client killed
/// in a synchronize on a kernel that never ends has its worker stopped at
/// once, and its session is gone.
#[test]
fn a_killed_programs_worker_is_stopped_while_it_waits() {
    let server = ServerProc::spawn(
        TempDir::new("cancel-endless-worker"),
        &["--device", "worker-cpu", "--memory", "2G"].map(String::from),
        &[],
    );
    let wait = server.command(&test_program("endless_kernel"), &["wait-killed"]);
    let (child, _lines) = server.start_until(wait, "launched", STARTED);
    let session = session_of(&server.status_json(), "endless_kernel");
    // Into its synchronize.
    std::thread::sleep(Duration::from_millis(300));
    let workers_before = server.children().len();
    assert!(workers_before >= 1, "no worker");
    kill_program(&session);
    poll(
        "the killed session held on past 5 s",
        Duration::from_secs(5),
        || {
            let status = server.status_json();
            (status["sessions"].as_array().unwrap().is_empty()
                && status["devices"][0]["used_mem"].as_u64() == Some(0))
            .then_some(())
        },
    );
    let log = server.log();
    assert!(
        log.contains("stopping the worker of a client that hung up"),
        "{log}"
    );
    let out = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(out.code(), Some(128 + 9), "{}", out.describe());
    let out = server.run(&corpus_program("vector_add"), &[], LIMIT);
    assert_pass(&out, "vector_add");
}

#[test]
fn the_socket_transport_still_works() {
    let server = ServerProc::start("socket");
    // A whole program with every call on the socket.
    let out = wait_bounded(
        server
            .command(&corpus_program("vector_add"), &[])
            .env("CUMUX_TRANSPORT", "socket")
            .spawn()
            .unwrap(),
        LIMIT,
    );
    assert_pass(&out, "vector_add");
    // And status says so while one runs.
    let mut on_socket = looping(&server);
    on_socket.env("CUMUX_TRANSPORT", "socket");
    let (mut child, _lines) = server.start_until(on_socket, "started", STARTED);
    let status = server.status_json();
    let _ = child.kill();
    let _ = child.wait();
    let session = session_of(&status, "loop_launches");
    assert_eq!(session["transport"], "unix", "{session:#}");
}

#[test]
fn a_killed_server_makes_the_program_fail_not_hang() {
    let mut server = ServerProc::start("killed");
    let (child, lines) = server.start_until(looping(&server), "started", STARTED);
    server.kill(); // SIGKILL
    let out = wait_bounded(child, Duration::from_secs(60));
    assert_ne!(out.code(), Some(0), "{}", out.describe());
    let rest: Vec<String> = lines.try_iter().collect();
    assert!(
        rest.iter().any(|l| l.contains("failed")),
        "the program should report the failed call: {rest:?} {}",
        out.describe()
    );
}

#[test]
fn run_passes_exit_codes_signals_and_environment_through() {
    // No server: `cumux status` fails saying so (`cumux run` too: e2e_run).
    let server = ServerProc::start("run-edges");
    let nowhere = format!("unix:{}", server.dir.0.join("none.sock").display());
    let run = |script: &str| {
        let child = Command::new(CUMUX)
            .args([
                "run",
                "--server",
                &server.address,
                "--tenant",
                "team-x",
                "--",
                "sh",
                "-c",
                script,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_bounded(child, Duration::from_secs(60))
    };
    let status = Command::new(CUMUX)
        .args(["status", "--server", &nowhere])
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&status.stderr).contains("no cumux server answers"));
    let out = run("exit 7");
    assert_eq!(out.code(), Some(7), "{}", out.describe());
    let out = run("kill -9 $$");
    assert_eq!(out.code(), Some(128 + 9), "{}", out.describe());
    let out = run("echo $CUMUX_SERVER; echo $CUMUX_TENANT; d=${LD_LIBRARY_PATH%%:*}; readlink $d/libcuda.so.1; readlink $d/libcuda.so");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], server.address);
    assert_eq!(lines[1], "team-x");
    assert!(lines[2].ends_with("libcumux_client.so"), "{lines:?}");
    assert_eq!(lines[2], lines[3]);
}

#[test]
fn killing_cumux_run_ends_the_program() {
    let server = ServerProc::start("orphan");
    let pidfile = server.dir.0.join("pid");
    let mut run = Command::new(CUMUX)
        .args(["run", "--server", &server.address, "--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 120", pidfile.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid: u32 = poll("the program never started", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&pidfile).ok()?;
        text.trim().parse().ok()
    });
    run.kill().unwrap();
    run.wait().unwrap();
    let stat = format!("/proc/{pid}/stat");
    poll(
        "the program outlived cumux run",
        Duration::from_secs(30),
        || {
            let gone = std::fs::read_to_string(&stat).map_or(true, |s| s.contains(") Z "));
            gone.then_some(())
        },
    );
}

#[test]
fn a_program_without_a_server_sees_the_cuda_error() {
    // `cumux run` would not start it (e2e_run): start it with the driver directly.
    let dir = TempDir::new("no-server");
    let nowhere = format!("unix:{}", dir.0.join("none.sock").display());
    ensure_driver();
    let driver = std::path::Path::new(CUMUX).with_file_name("libcumux_client.so");
    let folder = linked_folder("no-server-driver", "libcuda.so.1", &driver);
    let child = Command::new(corpus_program("vector_add"))
        .env("LD_LIBRARY_PATH", &folder)
        .env("CUMUX_SERVER", &nowhere)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, Duration::from_secs(60));
    assert_ne!(out.code(), Some(0), "{}", out.describe());
    assert!(!out.stdout.contains("PASS"), "{}", out.describe());
}

#[test]
fn serve_replaces_a_stale_socket_and_refuses_a_live_one() {
    let dir = TempDir::new("stale");
    let socket = dir.0.join("s.sock");
    drop(UnixListener::bind(&socket).unwrap()); // leaves the file, nobody listens
    assert!(socket.exists());
    let address = format!("unix:{}", socket.display());
    let mut first = serve_command(&["--device", "cpu", "--memory", "64M", "--listen", &address])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = lines_of(first.stdout.take().unwrap());
    let line = listening_line(&lines);
    assert!(line.contains(&address) && line.contains("cpu"), "{line}");
    let second = Command::new(CUMUX)
        .args(["serve", "--device", "cpu", "--listen", &address])
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("already listens"));
    let cuda = Command::new(CUMUX)
        .args(["serve", "--device", "cuda", "--listen", &address])
        .output()
        .unwrap();
    // Without NVIDIA's driver (CI) the cuda backend cannot start; with it, the
    // address is taken. Either way serve fails and says why.
    assert!(!cuda.status.success());
    let why = String::from_utf8_lossy(&cuda.stderr);
    assert!(
        ["libcuda", "no GPU", "already listens"]
            .iter()
            .any(|w| why.contains(w)),
        "{why}"
    );
    let _ = first.kill();
    let _ = first.wait();
}

/// Starts `serve` (a `cumux serve` command, stdout piped) and, once it
/// listens, asks it for `cumux status --json` at `address` (else at the tcp
/// address it names), then kills it: the line it printed when it listened,
/// the status command's output, and the killed child.
fn serve_status(
    mut serve: Command,
    address: Option<&str>,
) -> (String, std::process::Output, std::process::Child) {
    let mut server = serve.spawn().unwrap();
    let lines = lines_of(server.stdout.take().unwrap());
    let line = listening_line(&lines);
    let address = address.map_or_else(|| tcp_address_in(&line), str::to_string);
    let out = status_output(&address, &["--json"]);
    let _ = server.kill();
    (line, out, server)
}

#[test]
fn status_over_tcp_with_a_config_file() {
    let dir = TempDir::new("tcp");
    let text = "# test server\ndevice = \"cpu\"\nmemory = \"64M\"\npolicy = \"priority\"\n";
    let config = config_file(&dir, text);
    let mut serve = serve_command(&["--listen", "tcp:127.0.0.1:0", "--policy", "fair"]);
    serve.arg("--config").arg(&config).stderr(Stdio::null());
    let (_, out, mut server) = serve_status(serve, None);
    let _ = server.wait();
    let status = status_json(&out);
    assert_eq!(status["devices"][0]["total_mem"], 64 << 20);
    // The flag wins over the file's `policy = "priority"`.
    assert_eq!(status["devices"][0]["policy"], "fair");
}

#[test]
fn a_device_table_gives_its_device_a_policy_of_its_own() {
    let dir = TempDir::new("device-policy");
    let text =
        "policy = \"priority\"\n[devices.0]\npolicy = \"fair\"\n[devices.7]\npolicy = \"fifo\"\n";
    let config = config_file(&dir, text);
    let address = format!("unix:{}", dir.0.join("s.sock").display());
    let mut serve = serve_command(&["--device", "cpu", "--memory", "64M", "--listen", &address]);
    // The flag sets every device's default; device 0's table still wins.
    serve
        .args(["--policy", "fifo", "--config"])
        .arg(&config)
        .env("CUMUX_LOG", "warn")
        .stderr(Stdio::piped());
    let (line, out, mut server) = serve_status(serve, Some(&address));
    let mut log = String::new();
    std::io::Read::read_to_string(&mut server.stderr.take().unwrap(), &mut log).unwrap();
    let _ = server.wait();
    assert!(
        line.contains("device 0:") && line.contains("fair"),
        "{line}"
    );
    let status = status_json(&out);
    assert_eq!(status["devices"][0]["policy"], "fair");
    // A table for a device the server does not have is a warning, not a failure.
    assert!(log.contains("[devices.7]"), "{log}");
}

#[test]
fn the_default_socket_lives_in_a_private_runtime_folder() {
    use std::os::unix::fs::PermissionsExt;
    let runtime = TempDir::new("xdg");
    let serve = || {
        serve_command(&["--device", "cpu", "--memory", "64M"])
            .env("XDG_RUNTIME_DIR", &runtime.0)
            .env_remove("CUMUX_SERVER")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut server = serve();
    let lines = lines_of(server.stdout.take().unwrap());
    let line = listening_line(&lines);
    let folder = runtime.0.join("cumux");
    assert!(
        line.contains(&folder.join("cumux.sock").display().to_string()),
        "{line}"
    );
    let mode = std::fs::metadata(&folder).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let status = Command::new(CUMUX)
        .args(["status", "--json"])
        .env("XDG_RUNTIME_DIR", &runtime.0)
        .env_remove("CUMUX_SERVER")
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    // A folder others may write into is refused.
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused = wait_bounded(serve(), Duration::from_secs(30));
    assert_eq!(refused.code(), Some(1), "{}", refused.describe());
    assert!(
        refused.stderr.contains("mode 0700"),
        "{}",
        refused.describe()
    );
}

#[test]
fn cumux_calls_lists_the_driver_calls_and_looks_names_up() {
    let run = |args: &[&str]| {
        Command::new(CUMUX)
            .arg("calls")
            .args(args)
            .output()
            .unwrap()
    };
    let all = run(&[]);
    assert!(all.status.success());
    let text = String::from_utf8_lossy(&all.stdout);
    assert!(
        text.lines().any(|l| l == "answered  cuMemAlloc_v2"),
        "{text}"
    );
    assert!(text.lines().any(|l| l == "refused   cuGLInit"), "{text}");
    assert!(text.trim_end().ends_with("driver symbols"), "{text}");
    let refused = run(&["--refused"]);
    let text = String::from_utf8_lossy(&refused.stdout);
    assert!(!text.contains("answered "), "{text}");
    let looked_up = run(&["cuLaunchKernel", "cuGraphicsGLRegisterImage"]);
    assert_eq!(
        String::from_utf8_lossy(&looked_up.stdout),
        "answered  cuLaunchKernel\nrefused   cuGraphicsGLRegisterImage\n"
    );
    let unknown = run(&["cuNotACall"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("not a symbol of NVIDIA's driver"));
}
