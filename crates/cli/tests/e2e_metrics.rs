//! `cumux serve --metrics`: Prometheus text over real HTTP, with device
//! figures under dcgm-exporter's names and tenant counters that outlive the
//! tenant's sessions; a reachable address needs --insecure.

mod common;

use std::time::Duration;

use common::metrics::{get, metrics_address, sample, scrape};
use common::{corpus_program, serve_command, wait_bounded, ServerProc, TempDir};

#[test]
fn metrics_count_tenants_past_their_sessions() {
    let args: Vec<String> = [
        "--device",
        "cpu",
        "--memory",
        "2G",
        "--metrics",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    let server = ServerProc::spawn(TempDir::new("metrics"), &args, &[]);
    let at = metrics_address(&server);

    let (status, headers, body) = scrape(&at);
    assert!(status.contains("200"), "{status}");
    assert!(
        headers.contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    let total = sample(
        &body,
        "cumux_device_memory_total_bytes{backend=\"cpu\",device=\"0\"}",
    );
    assert_eq!(total, Some(2147483648.0), "{body}");
    assert!(body.contains("DCGM_FI_DEV_FB_USED{gpu=\"0\""), "{body}");

    // Two sessions of one tenant, both over before the scrape.
    for _ in 0..2 {
        let child = server
            .command_as("metered", &corpus_program("vector_add"), &[])
            .spawn()
            .unwrap();
        let out = wait_bounded(child, Duration::from_secs(120));
        assert_eq!(out.code(), Some(0), "{}", out.describe());
    }
    // The sessions end on the server once their clients are gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (_, _, body) = scrape(&at);
        let live = sample(&body, "cumux_tenant_sessions{tenant=\"metered\"}");
        if live.is_none() || std::time::Instant::now() > deadline {
            break body;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let of = |name: &str| sample(&body, &format!("{name}{{tenant=\"metered\"}}"));
    assert_eq!(of("cumux_tenant_sessions_total"), Some(2.0), "{body}");
    let launches = of("cumux_tenant_launches_total").unwrap_or(0.0);
    assert!(launches >= 2.0, "launches {launches}:\n{body}");
    assert_eq!(of("cumux_tenant_quota_refusals_total"), Some(0.0), "{body}");
    assert_eq!(of("cumux_tenant_faults_total"), Some(0.0), "{body}");
    assert!(
        of("cumux_tenant_queue_delay_seconds_total").is_some(),
        "{body}"
    );
    assert!(
        of("cumux_tenant_throttled_seconds_total").is_some(),
        "{body}"
    );
    // The tenant has no live session, so no live figures.
    assert_eq!(of("cumux_tenant_sessions"), None, "{body}");

    // A kernel that faults counts once for its tenant, past its session.
    let child = server
        .command_as("faulty", &corpus_program("out_of_bounds"), &[])
        .spawn()
        .unwrap();
    let out = wait_bounded(child, Duration::from_secs(120));
    // The program expects its illegal address, and says so.
    assert!(out.stdout.contains("IllegalAddress"), "{}", out.describe());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let faults = loop {
        let (_, _, body) = scrape(&at);
        let faults = sample(&body, "cumux_tenant_faults_total{tenant=\"faulty\"}");
        if faults == Some(1.0) || std::time::Instant::now() > deadline {
            break faults;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(faults, Some(1.0));

    // Other paths are not found; the server serves on.
    let (status, _, _) = get(&at, "/other");
    assert!(status.starts_with("HTTP/1.1 404"), "{status}");
}

#[test]
fn metrics_on_a_reachable_address_need_insecure() {
    let out = serve_command(&["--device", "cpu", "--metrics", "0.0.0.0:0"])
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--insecure"), "{stderr}");
}
