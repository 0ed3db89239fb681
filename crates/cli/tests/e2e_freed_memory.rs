//! The server's memory after sessions end, through worker processes: programs
//! loading module images of megabytes (as PyTorch loads cuBLAS's) leave the
//! server's anonymous memory, open fds and workers where they were before.

mod common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::*;

const LIMIT: Duration = Duration::from_secs(300);

/// A field of `/proc/PID/status` in KiB (RssAnon, RssShmem, …).
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's status");
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

#[test]
fn large_module_images_leave_no_memory_behind_in_the_server() {
    let dir = TempDir::new("freed-memory");
    let args = ["--device", "worker-cpu", "--memory", "1G"].map(String::from);
    let server = ServerProc::spawn(dir, &args, &[]);
    let pid = server.child.id();
    rounds_leave_nothing_behind(server, "server", |_| vec![pid]);
}

/// A shared device's worker serves every session for the server's life: the
/// images its sessions loaded go back as the server's do.
#[test]
fn large_module_images_leave_no_memory_behind_in_a_shared_worker() {
    let dir = TempDir::new("freed-memory-shared");
    let args = [
        "--device",
        "worker-cpu",
        "--sharing",
        "shared",
        "--memory",
        "1G",
    ];
    let server = ServerProc::spawn(dir, &args.map(String::from), &[]);
    // The shared worker and the spare beside it (for isolated tenants).
    rounds_leave_nothing_behind(server, "shared and spare workers", |server| {
        server.children().iter().map(|w| w.0).collect()
    });
}

/// Runs rounds of `big_modules` through `server` and checks that the
/// anonymous memory of the processes `pids_of` names (the server, or its
/// workers), their open fds and the server's workers come back after each.
fn rounds_leave_nothing_behind(
    mut server: ServerProc,
    what: &str,
    pids_of: impl Fn(&ServerProc) -> Vec<u32>,
) {
    let program = driver_program("big_modules");
    // One run first: what a process keeps once it has served (its code's
    // pages, thread stacks, caches) is not what these sessions left.
    server.run(&program, &["2"], LIMIT).assert_passed();
    let workers_at_start = server.children().len().max(1);
    let settled = |server: &ServerProc| {
        server.status_when("no session and no memory", |j| {
            j["sessions"].as_array().is_some_and(|s| s.is_empty())
                && j["devices"][0]["used_mem"] == 0
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.children().len() > workers_at_start && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        // Freed memory goes back a moment after a session ends.
        std::thread::sleep(Duration::from_secs(3));
    };
    settled(&server);
    let pids = pids_of(&server);
    let anon = || pids.iter().map(|&p| status_kib(p, "RssAnon")).sum::<u64>();
    let fds = || pids.iter().map(|&p| open_fds(p)).sum::<usize>();
    let (anon_before, fds_before) = (anon(), fds());

    // Four programs at once, eight times: 128 images of 4 to 24 MiB. What glibc
    // keeps depends on which arena each session's thread drew, so one round
    // may keep little even without the trims: every round is checked.
    let sizes = [
        ["16", "4", "24", "8"],
        ["12", "20", "6", "10"],
        ["24", "18", "4", "14"],
    ];
    let mut after_rounds = Vec::new();
    for round in 0..8 {
        let runs: Vec<Child> = (0..4)
            .map(|i| {
                let mut run = server.command(&program, &sizes[(round + i) % 3]);
                run.spawn().expect("cumux run starts")
            })
            .collect();
        for run in runs {
            wait_bounded(run, LIMIT).assert_passed();
        }
        settled(&server);
        after_rounds.push(anon());
    }
    assert!(server.alive(), "the server died:\n{}", server.log());
    // Each round moved 16 images of 14 MiB on average through the server;
    // as glibc has it, about 2 rounds in 6 left 18 to 72 MiB resident. More
    // than 8 MiB over the start is memory the sessions left, not the
    // processes' own.
    let worst = after_rounds.iter().copied().max().unwrap_or(0);
    assert!(
        worst < anon_before + 8 * 1024,
        "RssAnon of the {what} went from {anon_before} KiB to {after_rounds:?} KiB after each round, with no session left"
    );
    assert_eq!(
        fds(),
        fds_before,
        "open fds of the {what} with no session left"
    );
    assert!(
        server.children().len() <= workers_at_start,
        "workers left: {:?}",
        server.children()
    );
}
