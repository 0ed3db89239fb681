//! `cumux-netem`: the test kit's network emulator as a program, for
//! benchmarks on machines without Rust (a relay per link, until killed).

use std::time::Duration;

use clap::Parser;
use cumux_testkit::netem::{Link, Relay};

/// Relays TCP connections from --listen to --to over an emulated link.
#[derive(Parser)]
struct Options {
    /// Where to listen (HOST:PORT; port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Where to connect each connection on to (HOST:PORT).
    #[arg(long)]
    to: String,
    /// Round-trip time, e.g. 0.5ms, 30ms.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0ms")]
    rtt: Duration,
    /// Up to this much more delay per chunk (never reordering).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0ms")]
    jitter: Duration,
    /// Gigabits per second in each direction (default: unlimited).
    #[arg(long)]
    gbit: Option<f64>,
    /// The share of chunks lost once (each a retransmission late).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
}

fn main() {
    let o = Options::parse();
    if !(0.0..1.0).contains(&o.loss) {
        eprintln!("cumux-netem: --loss {} is not a share in [0, 1)", o.loss);
        std::process::exit(2);
    }
    let mut link = Link::with_rtt(o.rtt);
    link.jitter = o.jitter;
    link.loss = o.loss;
    if let Some(gbit) = o.gbit {
        link = link.gbit(gbit);
    }
    let relay = match Relay::start_at(&o.listen, &o.to, link) {
        Ok(relay) => relay,
        Err(e) => {
            eprintln!("cumux-netem: cannot listen on {}: {e}", o.listen);
            std::process::exit(1);
        }
    };
    println!("cumux-netem: listening on {} for {}", relay.address(), o.to);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
