//! Live migration end to end (issue 17): `tests/cuda/driver/migrate_loop.cu`,
//! unmodified, moved between the two CPU devices of `cumux serve
//! --cpu-devices 2` many times mid-run by `cumux migrate` and `cumux drain`,
//! checking its results all along; checkpoints written by `cumux checkpoint`,
//! and a corrupt or truncated one refused by `cumux restore` (more in
//! `e2e_checkpoint.rs`).

mod common;

use std::time::Duration;

use common::metrics::{metrics_address, sample, scrape};
use common::{
    driver_program, e2e_device, output_text, progressed, rest, session_of, stop_and_pass,
    ServerProc, TempDir,
};

const LIMIT: Duration = Duration::from_secs(180);

fn two_device_server(tag: &str) -> ServerProc {
    let args = [
        "--device",
        &e2e_device(),
        "--cpu-devices",
        "2",
        "--memory",
        "1G",
        "--metrics",
        "127.0.0.1:0",
    ];
    ServerProc::spawn(TempDir::new(tag), &args.map(String::from), &[])
}

fn device_of(server: &ServerProc) -> u64 {
    session_of(&server.status_json(), "migrate_loop")["device"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_running_program_moves_between_two_cpu_devices_many_times_and_passes() {
    let server = two_device_server("migrate");
    let stop = server.dir.0.join("stop");
    let program = driver_program("migrate_loop");
    let run = server.command(&program, &[stop.to_str().unwrap()]);
    let (mut child, lines) = server.start_until(run, "progress 10", LIMIT);
    let session = session_of(&server.status_json(), "migrate_loop")["session"]
        .as_u64()
        .unwrap()
        .to_string();
    // No such session, no such device: clear refusals.
    let out = server.cumux(&["migrate", "987654", "--to", "1"]);
    assert!(!out.status.success(), "{}", output_text(&out));
    assert!(
        output_text(&out).contains("no driver session 987654"),
        "{}",
        output_text(&out)
    );
    let out = server.cumux(&["drain", "5"]);
    assert!(
        output_text(&out).contains("the server has no device 5"),
        "{}",
        output_text(&out)
    );
    {
        for round in 1..=6u64 {
            let to = (round % 2).to_string();
            let out = server.cumux(&["migrate", &session, "--to", &to]);
            assert!(
                out.status.success(),
                "round {round}: {}\n{}",
                output_text(&out),
                server.log()
            );
            assert!(
                output_text(&out).contains(&format!("to device {to}")),
                "{}",
                output_text(&out)
            );
            // Its one allocation was placed while it ran, not in the pause.
            assert!(
                output_text(&out).contains("(1 of 1 allocations placed beforehand)"),
                "{}",
                output_text(&out)
            );
            assert_eq!(device_of(&server), round % 2);
            progressed(&lines, LIMIT, &|| server.log());
        }
        // Draining device 0 moves it to the only other one.
        let out = server.cumux(&["drain", "0"]);
        assert!(out.status.success(), "{}", output_text(&out));
        assert!(
            output_text(&out).contains("device 0 drained: 1 sessions"),
            "{}",
            output_text(&out)
        );
        assert_eq!(device_of(&server), 1);
        progressed(&lines, LIMIT, &|| server.log());
        // Six moves and the drain's, each counted once.
        let (_, _, body) = scrape(&metrics_address(&server));
        let done = r#"cumux_migrations_total{kind="move",outcome="done"}"#;
        assert_eq!(sample(&body, done), Some(7.0), "{body}");
    }
    stop_and_pass(&stop, &mut child, &lines, LIMIT, &|| server.log());
}

#[test]
fn a_checkpoint_is_written_and_a_corrupt_or_truncated_one_is_refused() {
    let server = two_device_server("checkpoint");
    let stop = server.dir.0.join("stop");
    let program = driver_program("migrate_loop");
    let run = server.command(&program, &[stop.to_str().unwrap()]);
    let (mut child, lines) = server.start_until(run, "progress 10", LIMIT);
    let session = session_of(&server.status_json(), "migrate_loop")["session"]
        .as_u64()
        .unwrap()
        .to_string();
    let file = server.dir.0.join("loop.ckpt");
    let out = server.cumux(&["checkpoint", &session, file.to_str().unwrap()]);
    {
        assert!(
            out.status.success(),
            "{}\n{}",
            output_text(&out),
            server.log()
        );
        let bytes = std::fs::read(&file).unwrap();
        assert!(bytes.starts_with(b"CUMUXCKP"));
        // Truncated, or with a byte changed: refused by the server as it
        // reads, the session left as it was.
        let bad = server.dir.0.join("bad.ckpt");
        for (what, broken, said) in [
            (
                "truncated",
                bytes[..bytes.len() - 100].to_vec(),
                "truncated",
            ),
            (
                "corrupt",
                {
                    let mut b = bytes.clone();
                    b[bytes.len() / 2] ^= 0x40;
                    b
                },
                "corrupt",
            ),
        ] {
            std::fs::write(&bad, broken).unwrap();
            let out = server.cumux(&["restore", bad.to_str().unwrap(), "--session", &session]);
            assert!(!out.status.success(), "{what}: {}", output_text(&out));
            assert!(
                output_text(&out).contains(said),
                "{what}: {}",
                output_text(&out)
            );
        }
        std::fs::write(&bad, b"not a checkpoint at all").unwrap();
        let out = server.cumux(&["restore", bad.to_str().unwrap(), "--session", &session]);
        assert!(
            output_text(&out).contains("not a cumux checkpoint"),
            "{}",
            output_text(&out)
        );
        progressed(&lines, LIMIT, &|| server.log());
    }
    std::fs::write(&stop, b"").unwrap();
    let tail = rest(&lines, LIMIT);
    assert!(
        child.wait().unwrap().success() && tail.iter().any(|l| l == "PASS"),
        "{tail:?}"
    );
}
