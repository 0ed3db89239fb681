//! Scraping `cumux serve --metrics` in tests: its address from the server's
//! log, one `GET` over HTTP/1.1, and a sample's value.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::ServerProc;

/// The address the server's log says it serves metrics on. The server may
/// take its socket's first connection before it writes that line: waits for
/// it up to 10 s.
pub fn metrics_address(server: &ServerProc) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = server.log();
        let at = log
            .split("metrics on http://")
            .nth(1)
            .and_then(|rest| rest.split("/metrics").next());
        match at {
            Some(at) => return at.to_string(),
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            None => panic!("no metrics address in the log:\n{log}"),
        }
    }
}

/// `GET /metrics` over HTTP/1.1: (status line, headers, body).
pub fn scrape(at: &str) -> (String, String, String) {
    get(at, "/metrics")
}

/// `GET path` over HTTP/1.1: (status line, headers, body).
pub fn get(at: &str, path: &str) -> (String, String, String) {
    let mut stream = TcpStream::connect(at).expect("the metrics port answers");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {at}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_lowercase(), body.to_string())
}

/// The value of the sample `name{labels}` (labels exactly as written).
pub fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}
