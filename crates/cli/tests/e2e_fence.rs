//! Fencing (`--sharing fenced`) end to end: two tenants' programs in one shared
//! CPU-worker context; a kernel aimed at the other tenant's buffer reads and
//! writes only its own partition, unless its tenant is `trusted`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(300);

fn server(tag: &str) -> ServerProc {
    server_sharing(tag, "fenced")
}

/// A worker-cpu server of one context (`sharing`: shared or fenced) with
/// tenants owner, thief and insider (trusted).
fn server_sharing(tag: &str, sharing: &str) -> ServerProc {
    let uid = std::fs::metadata("/proc/self").unwrap().uid();
    let config = format!(
        "allow_unknown = false\n[tenants.owner]\nuids = [{uid}]\n[tenants.thief]\nuids = [{uid}]\n\
         [tenants.insider]\nuids = [{uid}]\ntrusted = true\n"
    );
    let dir = TempDir::new(tag);
    let path = config_file(&dir, &config);
    let args: Vec<String> = [
        "--device",
        "worker-cpu",
        "--memory",
        "1G",
        "--sharing",
        sharing,
        "--config",
    ]
    .map(String::from)
    .into_iter()
    .chain([path.display().to_string()])
    .collect();
    ServerProc::spawn(dir, &args, &[("CUMUX_WORKER_SPARES", "0")])
}

/// Starts the owner; its secret's pointer and its remaining output lines.
fn start_owner(
    server: &ServerProc,
    program: &std::path::Path,
) -> (
    std::process::Child,
    String,
    std::sync::mpsc::Receiver<String>,
) {
    let mut owner = server
        .command_as("owner", program, &["own", "8"])
        .spawn()
        .unwrap();
    let (ptr, lines) = owner_pointer(&mut owner, server);
    (owner, ptr, lines)
}

#[test]
fn a_fenced_kernel_cannot_reach_another_tenants_buffer() {
    let server = server("fence-thief");
    let program = tenant_program("fence_probe");
    let (owner, ptr, lines) = start_owner(&server, &program);
    let thief = server
        .command_as("thief", &program, &["poke", &ptr])
        .spawn()
        .unwrap();
    let out = wait_bounded(thief, LIMIT);
    assert!(
        out.code() == Some(0)
            && out.stdout.contains("kernel: cudaSuccess")
            && out.stdout.contains("secret: not seen"),
        "{}\n--- server log\n{}",
        out.describe(),
        server.log()
    );
    let rest = rest(&lines, Duration::from_secs(60)).join("\n");
    let done = wait_bounded(owner, Duration::from_secs(60));
    assert!(
        done.code() == Some(0) && rest.contains("own: PASS"),
        "{rest}\n{}\n--- server log\n{}",
        done.describe(),
        server.log()
    );
}

#[test]
fn a_trusted_tenants_kernel_is_not_fenced() {
    trusted_or_plain_shared_reads_the_secret(server("fence-trusted"), "insider");
}

/// `--sharing shared` fences no one (fencing is `--sharing fenced`'s).
#[test]
fn plain_shared_mode_is_not_fenced() {
    trusted_or_plain_shared_reads_the_secret(server_sharing("fence-plain", "shared"), "thief");
}

fn trusted_or_plain_shared_reads_the_secret(server: ServerProc, tenant: &str) {
    let program = tenant_program("fence_probe");
    let (mut owner, ptr, _lines) = start_owner(&server, &program);
    let insider = server
        .command_as(tenant, &program, &["poke", &ptr])
        .spawn()
        .unwrap();
    let out = wait_bounded(insider, LIMIT);
    let _ = owner.kill();
    let _ = owner.wait();
    assert!(
        out.code() == Some(0) && out.stdout.contains("secret: seen"),
        "the unfenced kernel reads the secret (what fencing stops)\n{}",
        out.describe()
    );
}

#[test]
fn the_corpus_passes_fenced() {
    let server = server("fence-corpus");
    let dir = cumux_testkit::workspace_root().join("tests/cuda/corpus");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let is_cu = path.extension().is_some_and(|x| x == "cu");
            is_cu.then(|| path.file_stem().unwrap().to_string_lossy().into_owned())
        })
        // Its far pointer folds into its own partition instead of faulting.
        .filter(|name| name != "out_of_bounds")
        .collect();
    names.sort();
    assert!(names.len() >= 15, "{names:?}");
    for name in names {
        let program = corpus_program(&name);
        let out = wait_bounded(
            server.command_as("thief", &program, &[]).spawn().unwrap(),
            LIMIT,
        );
        assert_eq!(
            out.code(),
            Some(0),
            "{name}: {}\n--- server log\n{}",
            out.describe(),
            server.log()
        );
    }
    assert!(
        !server.log().contains("refused a module"),
        "{}",
        server.log()
    );
}
