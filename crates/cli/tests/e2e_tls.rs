//! TLS on TCP end to end, with the `cumux` binary and a real program: a
//! pinned fingerprint or a CA lets it in; a wrong pin, an expired certificate,
//! a plain client to a TLS server and the reverse, a missing client
//! certificate under mutual TLS and a wrong token each fail with a clear
//! error and leave the server serving; a reachable address gets TLS by default.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use rcgen::{date_time_ymd, BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

const LIMIT: Duration = Duration::from_secs(120);

/// PEM files of a certificate and its key, and the certificate's DER.
struct Pair {
    cert: PathBuf,
    key: PathBuf,
    der: Vec<u8>,
}

fn write_pair(dir: &Path, name: &str, pem: String, key: &KeyPair, der: &[u8]) -> Pair {
    let cert = dir.join(format!("{name}-cert.pem"));
    let key_path = dir.join(format!("{name}-key.pem"));
    std::fs::write(&cert, pem).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    Pair {
        cert,
        key: key_path,
        der: der.to_vec(),
    }
}

impl Pair {
    /// `cumux serve`'s flags showing this certificate.
    fn serve_args(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
        ]
    }
}

/// A TLS server on loopback showing `pair`, with `extra` flags.
fn tls_server(dir: &Path, pair: &Pair, extra: &[&str]) -> TcpServer {
    let mut args = pair.serve_args();
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    TcpServer::start(dir, "tcp:127.0.0.1:0", &args, &[])
}

/// Parameters for a server certificate of 127.0.0.1, expired if asked.
fn server_params(expired: bool) -> CertificateParams {
    let mut params = CertificateParams::new(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    if expired {
        params.not_before = date_time_ymd(2019, 1, 1);
        params.not_after = date_time_ymd(2020, 1, 1);
    }
    params
}

fn self_signed(dir: &Path, name: &str, expired: bool) -> Pair {
    let key = KeyPair::generate().unwrap();
    let cert = server_params(expired).self_signed(&key).unwrap();
    write_pair(dir, name, cert.pem(), &key, cert.der())
}

/// A CA (its certificate file) and a certificate for `names` it signed.
fn ca_and_signed(dir: &Path, names: &[&str], expired: bool) -> (PathBuf, Pair) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let ca_file = dir.join(format!("ca-{}.pem", names.join("-")));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    if expired {
        params.not_before = date_time_ymd(2019, 1, 1);
        params.not_after = date_time_ymd(2020, 1, 1);
    }
    let cert = params.signed_by(&key, &ca).unwrap();
    let pair = write_pair(dir, &names.join("-"), cert.pem(), &key, cert.der());
    (ca_file, pair)
}

/// A `cumux serve` on a TCP address; its address, and the certificate
/// fingerprint its listening line gives (if it speaks TLS).
struct TcpServer {
    child: Child,
    address: String,
    /// The line it printed once it listened.
    line: String,
    fingerprint: Option<String>,
    log: PathBuf,
}

impl TcpServer {
    fn start(dir: &Path, listen: &str, args: &[&str], envs: &[(&str, &str)]) -> TcpServer {
        ensure_driver();
        let log = dir.join(format!("server-{}.log", args.len()));
        let mut serve = serve_command(&["--device", "cpu", "--memory", "256M", "--listen", listen]);
        serve
            .args(args)
            .envs(envs.iter().copied())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut child = serve.spawn().unwrap();
        let line = listening_line(&lines_of(child.stdout.take().unwrap()));
        let fingerprint = line
            .split_whitespace()
            .find(|w| w.starts_with("sha256:"))
            .map(|w| w.trim_end_matches([')', ';']).to_string());
        TcpServer {
            address: tcp_address_in(&line),
            line: line.clone(),
            child,
            fingerprint,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `cumux run` of vector_add against this server with `envs`.
    fn run(&self, envs: &[(&str, &str)], options: &[&str]) -> RunOutput {
        let mut run = run_command_at(&self.address, options, &corpus_program("vector_add"), &[]);
        run.env_remove("CUMUX_TLS_FINGERPRINT")
            .env_remove("CUMUX_TLS_CA")
            .envs(envs.iter().copied());
        wait_bounded(run.spawn().unwrap(), LIMIT)
    }

    fn assert_pass(&self, out: &RunOutput) {
        assert!(
            out.code() == Some(0) && out.stdout.contains("vector_add: PASS"),
            "{}\n--- server log\n{}",
            out.describe(),
            self.log()
        );
    }

    fn assert_refused(&mut self, out: &RunOutput, says: &[&str]) {
        assert_ne!(out.code(), Some(0), "{}", out.describe());
        for words in says {
            assert!(
                out.stderr.contains(words),
                "expected {words:?} in\n{}",
                out.describe()
            );
        }
        assert!(
            matches!(self.child.try_wait(), Ok(None)),
            "the server died: {}",
            self.log()
        );
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_pinned_fingerprint_lets_a_program_in_and_a_wrong_one_does_not() {
    let dir = TempDir::new("tls-pin");
    let pair = self_signed(&dir.0, "server", false);
    let other = self_signed(&dir.0, "other", false);
    let mut server = tls_server(&dir.0, &pair, &[]);
    let printed = server
        .fingerprint
        .clone()
        .expect("the line gives the fingerprint");
    assert_eq!(printed, cumux_protocol::tls::fingerprint(&pair.der));
    server.assert_pass(&server.run(&[("CUMUX_TLS_FINGERPRINT", &printed)], &[]));
    let wrong = cumux_protocol::tls::fingerprint(&other.der);
    let out = server.run(&[("CUMUX_TLS_FINGERPRINT", &wrong)], &[]);
    server.assert_refused(&out, &["not the one CUMUX_TLS_FINGERPRINT pins"]);
    // `cumux status` speaks TLS too.
    let status = Command::new(env!("CARGO_BIN_EXE_cumux"))
        .args(["status", "--server", &server.address])
        .env("CUMUX_TLS_FINGERPRINT", &printed)
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    assert!(
        String::from_utf8_lossy(&status.stdout).contains(&server.address),
        "{status:?}"
    );
    server.assert_pass(&server.run(&[("CUMUX_TLS_FINGERPRINT", &printed)], &[]));
    // A program that ends without TLS's close_notify ends its session
    // cleanly: no "connection dropped" for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !server.log().contains("session closed") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let log = server.log();
    assert!(log.contains("session closed"), "{log}");
    assert!(!log.contains("close_notify"), "{log}");
}

#[test]
fn a_ca_vouches_for_the_server_by_its_name() {
    let dir = TempDir::new("tls-ca");
    let (ca, pair) = ca_and_signed(&dir.0, &["127.0.0.1", "localhost"], false);
    let mut server = tls_server(&dir.0, &pair, &[]);
    let ca = ca.display().to_string();
    server.assert_pass(&server.run(&[("CUMUX_TLS_CA", &ca)], &[]));
    // A CA that did not sign it.
    let (stranger, _) = ca_and_signed(&dir.0, &["elsewhere"], false);
    let out = server.run(&[("CUMUX_TLS_CA", &stranger.display().to_string())], &[]);
    server.assert_refused(
        &out,
        &[
            "TLS handshake",
            "not issued by a CA that CUMUX_TLS_CA trusts",
        ],
    );
}

#[test]
fn an_expired_certificate_is_refused_by_pin_and_by_ca() {
    let dir = TempDir::new("tls-expired");
    let pinned = self_signed(&dir.0, "old", true);
    let mut server = tls_server(&dir.0, &pinned, &[]);
    let print = cumux_protocol::tls::fingerprint(&pinned.der);
    let out = server.run(&[("CUMUX_TLS_FINGERPRINT", &print)], &[]);
    server.assert_refused(&out, &["TLS handshake", "certificate has expired"]);

    let (ca, signed) = ca_and_signed(&dir.0, &["127.0.0.1"], true);
    let mut by_ca = tls_server(&dir.0, &signed, &["--policy", "fifo"]);
    let out = by_ca.run(&[("CUMUX_TLS_CA", &ca.display().to_string())], &[]);
    by_ca.assert_refused(&out, &["TLS handshake", "certificate has expired"]);
}

#[test]
fn plain_and_tls_clients_meeting_the_other_kind_of_server_are_told_why() {
    let dir = TempDir::new("tls-mismatch");
    let pair = self_signed(&dir.0, "server", false);
    let mut tls = tls_server(&dir.0, &pair, &[]);
    let out = tls.run(&[], &[]);
    tls.assert_refused(&out, &["TLS only", "CUMUX_TLS_FINGERPRINT"]);
    let print = tls.fingerprint.clone().unwrap();
    tls.assert_pass(&tls.run(&[("CUMUX_TLS_FINGERPRINT", &print)], &[]));
    assert!(tls.log().contains("TLS only"), "{}", tls.log());

    let mut plain = TcpServer::start(&dir.0, "tcp:127.0.0.1:0", &["--policy", "fifo"], &[]);
    assert!(plain.fingerprint.is_none());
    let out = plain.run(&[("CUMUX_TLS_FINGERPRINT", &print)], &[]);
    plain.assert_refused(&out, &["TLS handshake", "does it listen with TLS"]);
    assert!(
        plain.log().contains("this server listens on plain TCP"),
        "{}",
        plain.log()
    );
    plain.assert_pass(&plain.run(&[], &[]));
}

#[test]
fn mutual_tls_wants_a_certificate_its_ca_signed() {
    let dir = TempDir::new("tls-mutual");
    let pair = self_signed(&dir.0, "server", false);
    let (client_ca, client) = ca_and_signed(&dir.0, &["client"], false);
    let mut server = tls_server(
        &dir.0,
        &pair,
        &["--tls-client-ca", &client_ca.display().to_string()],
    );
    let print = server.fingerprint.clone().unwrap();
    let out = server.run(&[("CUMUX_TLS_FINGERPRINT", &print)], &[]);
    server.assert_refused(&out, &["CertificateRequired"]);
    let (client_cert, client_key) = (
        client.cert.display().to_string(),
        client.key.display().to_string(),
    );
    server.assert_pass(&server.run(
        &[
            ("CUMUX_TLS_FINGERPRINT", &print),
            ("CUMUX_TLS_CERT", &client_cert),
            ("CUMUX_TLS_KEY", &client_key),
        ],
        &[],
    ));
}

#[test]
fn over_tls_a_wrong_token_is_refused_and_the_right_one_names_the_tenant() {
    let dir = TempDir::new("tls-token");
    let pair = self_signed(&dir.0, "server", false);
    let config = config_file(
        &dir,
        "[tenants.alice]\nmemory_quota = \"64M\"\ntoken = \"alice-token-0123456789abcdef\"\n",
    );
    let mut server = tls_server(&dir.0, &pair, &["--config", &config.display().to_string()]);
    let print = server.fingerprint.clone().unwrap();
    let out = server.run(
        &[
            ("CUMUX_TLS_FINGERPRINT", &print),
            ("CUMUX_TOKEN", "not-the-token-0123456789abcdef"),
        ],
        &[],
    );
    server.assert_refused(&out, &["token"]);
    assert!(
        !server.log().contains("not-the-token"),
        "a token was logged"
    );
    server.assert_pass(&server.run(
        &[
            ("CUMUX_TLS_FINGERPRINT", &print),
            ("CUMUX_TOKEN", "alice-token-0123456789abcdef"),
        ],
        &[],
    ));
}

#[test]
fn a_reachable_address_gets_a_self_signed_certificate_unless_insecure() {
    let dir = TempDir::new("tls-default");
    let state = dir.0.join("state");
    let state_env = state.display().to_string();
    let envs = [("XDG_STATE_HOME", state_env.as_str())];
    let first = TcpServer::start(&dir.0, "tcp:0.0.0.0:0", &[], &envs);
    let print = first.fingerprint.clone().expect("TLS by default");
    assert!(state.join("cumux/server-key.pem").exists());
    let port = first.address.rsplit(':').next().unwrap().to_string();
    let local = format!("tcp:127.0.0.1:{port}");
    let mut run = run_command_at(&local, &[], &corpus_program("vector_add"), &[]);
    run.env("CUMUX_TLS_FINGERPRINT", &print);
    first.assert_pass(&wait_bounded(run.spawn().unwrap(), LIMIT));
    drop(first);
    // The pair is kept: a restart shows the same certificate.
    let again = TcpServer::start(&dir.0, "tcp:0.0.0.0:0", &["--policy", "fifo"], &envs);
    assert_eq!(again.fingerprint.as_deref(), Some(print.as_str()));
    drop(again);
    let plain = TcpServer::start(&dir.0, "tcp:0.0.0.0:0", &["--insecure"], &envs);
    assert!(plain.fingerprint.is_none());
    assert!(plain.log().contains("in the clear"), "{}", plain.log());
}

#[test]
fn plain_tcp_to_another_host_needs_the_clients_consent() {
    ensure_driver();
    // Nothing is sent: the client refuses before it connects.
    let mut run = run_command_at(
        "tcp:192.0.2.1:7000",
        &[],
        &corpus_program("vector_add"),
        &[],
    );
    run.env_remove("CUMUX_TLS_FINGERPRINT")
        .env_remove("CUMUX_TLS_CA")
        .env_remove("CUMUX_INSECURE")
        .stdin(Stdio::null());
    let out = wait_bounded(run.spawn().unwrap(), Duration::from_secs(30));
    assert_ne!(out.code(), Some(0));
    assert!(
        out.stderr.contains("CUMUX_INSECURE=1") && out.stderr.contains("plain TCP"),
        "{}",
        out.describe()
    );
}

#[test]
fn a_program_crosses_a_slow_lossy_link_over_tls() {
    use cumux_testkit::netem::{Link, Relay};
    let dir = TempDir::new("tls-netem");
    let pair = self_signed(&dir.0, "server", false);
    let server = tls_server(&dir.0, &pair, &[]);
    let link = Link {
        rtt: Duration::from_millis(10),
        jitter: Duration::from_millis(2),
        bandwidth: Some(100 << 20),
        loss: 0.01,
    };
    let relay = Relay::start(server.address.trim_start_matches("tcp:"), link).unwrap();
    let print = server.fingerprint.clone().unwrap();
    let mut run = run_command_at(
        &format!("tcp:{}", relay.address()),
        &[],
        &corpus_program("vector_add"),
        &[],
    );
    run.env("CUMUX_TLS_FINGERPRINT", &print);
    server.assert_pass(&wait_bounded(run.spawn().unwrap(), LIMIT));
    assert!(relay.relayed() > 0);
}

#[test]
fn large_copies_arrive_whole_over_tcp_and_tls() {
    // bench/cuda/microbench checks every byte it copies back (exit 3 if not):
    // 16 MiB each way is two pipelined chunks on a socket.
    let microbench = cumux_testkit::compile_program(
        cumux_testkit::workspace_root().join("bench/cuda/microbench.cu"),
        &[],
    );
    let dir = TempDir::new("tls-copies");
    let pair = self_signed(&dir.0, "server", false);
    let tls = tls_server(&dir.0, &pair, &[]);
    let plain = TcpServer::start(&dir.0, "tcp:127.0.0.1:0", &["--policy", "fifo"], &[]);
    let print = tls.fingerprint.clone().unwrap();
    for (server, envs) in [
        (&tls, vec![("CUMUX_TLS_FINGERPRINT", print.as_str())]),
        (&plain, vec![]),
    ] {
        let mut run = run_command_at(
            &server.address,
            &[],
            &microbench,
            &["bandwidth", "0.1", &(32u64 << 20).to_string()],
        );
        run.envs(envs);
        let out = wait_bounded(run.spawn().unwrap(), LIMIT);
        assert!(
            out.code() == Some(0) && out.stdout.contains("dtoh_pageable_16m_gbps"),
            "{}\n--- server log\n{}",
            out.describe(),
            server.log()
        );
    }
}

/// Bytes the server's lanes carried in and out, from its `/metrics`.
fn lane_bytes(server: &TcpServer) -> (f64, f64) {
    let at = server
        .line
        .split("metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split("/metrics").next())
        .expect("the listening line names the metrics address");
    let (_, _, body) = common::metrics::scrape(at);
    let carried = |direction| {
        let series = format!("cumux_lane_bytes_total{{direction=\"{direction}\"}}");
        common::metrics::sample(&body, &series).unwrap_or(0.0)
    };
    (carried("in"), carried("out"))
}

#[test]
fn large_copies_go_on_lanes_and_arrive_whole() {
    // A copy of two 1 MiB chunks or more goes on the session's lanes (more
    // TLS connections, each on its own thread) in turn; microbench checks
    // every byte it copies back. `CUMUX_LANES=0` keeps them on the one.
    let microbench = cumux_testkit::compile_program(
        cumux_testkit::workspace_root().join("bench/cuda/microbench.cu"),
        &[],
    );
    let dir = TempDir::new("tls-lanes");
    let pair = self_signed(&dir.0, "server", false);
    let tls = tls_server(&dir.0, &pair, &["--metrics", "127.0.0.1:0"]);
    let print = tls.fingerprint.clone().unwrap();
    for lanes in ["3", "0"] {
        let before = lane_bytes(&tls);
        let mut run = run_command_at(
            &tls.address,
            &[],
            &microbench,
            &["bandwidth", "0.05", &(32u64 << 20).to_string()],
        );
        run.envs([
            ("CUMUX_TLS_FINGERPRINT", print.as_str()),
            ("CUMUX_LANES", lanes),
        ]);
        let out = wait_bounded(run.spawn().unwrap(), LIMIT);
        assert!(
            out.code() == Some(0) && out.stdout.contains("dtoh_pageable_16m_gbps"),
            "{}\n--- server log\n{}",
            out.describe(),
            tls.log()
        );
        let after = lane_bytes(&tls);
        let carried = (after.0 - before.0, after.1 - before.1);
        match lanes {
            "0" => assert_eq!(carried, (0.0, 0.0)),
            _ => assert!(
                carried.0 >= (32 << 20) as f64 && carried.1 >= (32 << 20) as f64,
                "lanes carried {carried:?} bytes in and out"
            ),
        }
    }
}

#[test]
fn stream_ordered_programs_run_over_tcp_and_tls() {
    // Copies on streams are unanswered calls: on a socket they go as they
    // are, never waiting for an answer that does not come.
    let dir = TempDir::new("tls-streams");
    let pair = self_signed(&dir.0, "server", false);
    let tls = tls_server(&dir.0, &pair, &[]);
    let plain = TcpServer::start(&dir.0, "tcp:127.0.0.1:0", &["--policy", "fifo"], &[]);
    let print = tls.fingerprint.clone().unwrap();
    for program in ["pinned_copies", "pinned_memory", "host_callback", "threads"] {
        for (server, envs) in [
            (&tls, vec![("CUMUX_TLS_FINGERPRINT", print.as_str())]),
            (&plain, vec![]),
        ] {
            let mut run = run_command_at(&server.address, &[], &driver_program(program), &[]);
            run.envs(envs);
            let out = wait_bounded(run.spawn().unwrap(), LIMIT);
            assert!(
                out.code() == Some(0) && out.stdout.contains("PASS"),
                "{program}: {}\n--- server log\n{}",
                out.describe(),
                server.log()
            );
        }
    }
}

/// `GET path` over HTTPS to `at` (`HOST:PORT`), trusting the certificate
/// `print` pins: the status line and the body.
fn https_get(at: &str, print: &str, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let pin = cumux_protocol::tls::parse_fingerprint(print).unwrap();
    let config =
        cumux_protocol::tls::client_config(cumux_protocol::tls::Trust::Pinned(vec![pin]), None)
            .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let conn = rustls::ClientConnection::new(config, name).unwrap();
    let tcp = std::net::TcpStream::connect(at).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    match tls.read_to_end(&mut answer) {
        Ok(_) => {}
        // Some servers close without close_notify once they answered.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    Ok(String::from_utf8_lossy(&answer).to_string())
}

#[test]
fn the_functions_api_speaks_https_with_the_servers_certificate() {
    let dir = TempDir::new("tls-functions");
    let pair = self_signed(&dir.0, "server", false);
    let config = config_file(
        &dir,
        "[tenants.alice]\ntoken = \"alice-token-0123456789abcdef\"\n",
    );
    let server = tls_server(
        &dir.0,
        &pair,
        &[
            "--functions",
            "127.0.0.1:0",
            "--config",
            &config.display().to_string(),
        ],
    );
    let line = &server.line;
    let at = line
        .split("functions on https://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no https functions address in: {line}"))
        .to_string();
    let print = server.fingerprint.clone().unwrap();
    let answer = https_get(&at, &print, "/v1/openapi.json").unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"openapi\""), "{answer}");
    // Plain HTTP to it gets no answer a client could take for one.
    use std::io::{Read, Write};
    let mut plain = std::net::TcpStream::connect(&at).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    plain
        .write_all(b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let _ = plain.read_to_end(&mut got);
    assert!(!String::from_utf8_lossy(&got).contains("openapi"));
    // `cumux fn` speaks HTTPS, trusting the pinned certificate only.
    let url = format!("https://{at}");
    let list = |print: Option<&str>| {
        let mut fn_list = Command::new(env!("CARGO_BIN_EXE_cumux"));
        fn_list
            .args(["fn", "--url", &url, "list"])
            .env("CUMUX_TOKEN", "alice-token-0123456789abcdef")
            .env_remove("CUMUX_TLS_FINGERPRINT")
            .env_remove("CUMUX_TLS_CA");
        if let Some(print) = print {
            fn_list.env("CUMUX_TLS_FINGERPRINT", print);
        }
        fn_list.output().unwrap()
    };
    let listed = list(Some(&print));
    assert!(listed.status.success(), "{listed:?}");
    let untrusted = list(None);
    assert!(!untrusted.status.success());
    assert!(
        String::from_utf8_lossy(&untrusted.stderr).contains("CUMUX_TLS_FINGERPRINT"),
        "{untrusted:?}"
    );
    let other = self_signed(&dir.0, "other", false);
    let wrong = list(Some(&cumux_protocol::tls::fingerprint(&other.der)));
    assert!(!wrong.status.success(), "{wrong:?}");
}

#[test]
fn a_certificate_nothing_would_use_is_refused() {
    let dir = TempDir::new("tls-unused");
    let pair = self_signed(&dir.0, "server", false);
    let socket = dir.0.join("s.sock");
    let mut args = pair.serve_args();
    args.extend(["--device", "cpu", "--memory", "64M", "--listen"].map(String::from));
    args.push(format!("unix:{}", socket.display()));
    let out = Command::new(env!("CARGO_BIN_EXE_cumux"))
        .arg("serve")
        .args(&args)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let why = String::from_utf8_lossy(&out.stderr);
    assert!(why.contains("nothing here speaks TLS"), "{why}");
}
