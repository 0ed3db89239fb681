//! Two tenants' utilization of one GPU under fifo, from NVIDIA's per-process
//! samples of their isolated workers (the fake GPU and a stand-in NVML).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use cumux_protocol::Call;
use cumux_server::session::Session;
use cumux_server::status::StatusScope;
use cumux_server::worker::device::{cuda_worker_devices, Sharing};
use cumux_server::Server;

const CUMUX: &str = env!("CARGO_BIN_EXE_cumux");

/// A session of `tenant` opened in the test's own process.
fn session(server: &Arc<Server>, tenant: &str) -> Session {
    common::tenant_session(server, &format!("{tenant}-program"), tenant)
}

/// Starts `session`'s context (its worker, where it has one of its own).
fn start(session: &mut Session) {
    let done = session.handle(Call::MemAlloc {
        device: 0,
        bytes: 256,
    });
    assert!(matches!(done, Some(Ok(_))), "{done:?}");
}

/// Our own worker processes.
fn workers() -> Vec<u32> {
    common::children_of(std::process::id())
        .into_iter()
        .filter(|(_, _, cmd)| cmd.contains(" worker "))
        .map(|(pid, _, _)| pid)
        .collect()
}

/// Each tenant's figure for device 0, once the sampler has had `wait`.
fn figures(server: &Server, wait: Duration) -> Vec<(String, Option<u32>)> {
    std::thread::sleep(wait);
    let status = cumux_server::server_status(server, &StatusScope::Everything);
    let mut seen: Vec<_> = status
        .utilization
        .into_iter()
        .filter(|u| u.device == 0)
        .map(|u| (u.tenant, u.gpu_percent))
        .collect();
    seen.sort();
    seen
}

/// Writes the stand-in NVML's samples as one change.
fn set_samples(path: &Path, lines: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, lines).unwrap();
    std::fs::rename(&next, path).unwrap();
}

fn near(figure: Option<u32>, want: u32) -> bool {
    figure.is_some_and(|f| f.abs_diff(want) <= 6)
}

#[test]
fn each_tenants_isolated_workers_give_its_share_of_a_fifo_gpu() {
    let Some(fake) = cumux_testkit::fake_gpu::fake_libcuda("fifo-util", true) else {
        eprintln!("no C compiler: skipping");
        return;
    };
    let dir = std::env::temp_dir().join(format!("cumux-fifo-util-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let nvml = dir.join("libnvidia-ml.so.1");
    let source = cumux_testkit::workspace_root().join("crates/cli/tests/c/fake_nvidia_nvml.c");
    let built = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-o"])
        .arg(&nvml)
        .arg(source)
        .status()
        .is_ok_and(|s| s.success());
    assert!(built, "building the stand-in NVML failed");
    let samples = dir.join("samples");
    set_samples(&samples, "");
    // The only test of this binary: the environment is ours to set.
    std::env::set_var("CUMUX_REAL_LIBCUDA", &fake);
    std::env::set_var("CUMUX_WORKER_SPARES", "0");
    std::env::set_var("CUMUX_REAL_NVML", &nvml);
    std::env::set_var("FAKE_NVML_PROCESS_SAMPLES", &samples);

    // Isolated (the default): a worker per session, whose samples are its tenant's.
    let devices = cuda_worker_devices(PathBuf::from(CUMUX), Sharing::Isolated, None).unwrap();
    let server = Server::new(devices);
    let mut a = session(&server, "a");
    start(&mut a);
    let a_workers = workers();
    assert_eq!(a_workers.len(), 1, "{a_workers:?}");
    let mut b = session(&server, "b");
    start(&mut b);
    let b_worker = *workers().iter().find(|p| !a_workers.contains(p)).unwrap();
    // No samples yet: both idle, by NVIDIA's measure.
    let idle = figures(&server, Duration::from_millis(400));
    assert_eq!(idle, [("a".into(), Some(0)), ("b".into(), Some(0))]);
    // Another process's samples are nobody's here.
    let lines = format!("{} 30\n{b_worker} 50\n1 90\n", a_workers[0]);
    set_samples(&samples, &lines);
    let busy = figures(&server, Duration::from_millis(1500));
    assert!(
        near(busy[0].1, 30) && near(busy[1].1, 50),
        "a at 30 %, b at 50 %: {busy:?}"
    );
    set_samples(&samples, "");
    let after = figures(&server, Duration::from_millis(1500));
    assert_eq!(after, [("a".into(), Some(0)), ("b".into(), Some(0))]);
    drop((a, b));

    // Shared: one worker for every tenant, whose samples cannot be split.
    let devices = cuda_worker_devices(PathBuf::from(CUMUX), Sharing::Shared, None).unwrap();
    let server = Server::new(devices);
    let mut c = session(&server, "c");
    start(&mut c);
    let lines: String = workers().iter().map(|p| format!("{p} 40\n")).collect();
    set_samples(&samples, &lines);
    let shared = figures(&server, Duration::from_millis(500));
    assert_eq!(shared, [("c".into(), None)]);
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
