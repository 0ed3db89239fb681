//! One hop of the shared-memory transport, timed: two threads (or two
//! processes' worth of mapping) bounce a launch-sized call back and forth.
//!
//! `cargo run --release -p cumux-protocol --example ring_latency [ROUNDS]`
//! prints the round trip's p50 / p99 for raw bytes and for an encoded
//! `Call::Launch` (postcard both ways), and half of each: one hop's cost
//! when both sides spin, the floor under every same-host call.

use std::time::{Duration, Instant};

use cumux_protocol::shm::{Endpoint, ShmArea, Side, DEFAULT_LAYOUT};
use cumux_protocol::{decode, encode, Call, Request};

fn pair() -> (Endpoint, Endpoint) {
    let (area, fd) = ShmArea::create(DEFAULT_LAYOUT).expect("memfd");
    let server = ShmArea::attach(fd, DEFAULT_LAYOUT).expect("attach");
    let spin = Duration::from_millis(50);
    (
        Endpoint::new(area, Side::Client, None, spin),
        Endpoint::new(server, Side::Server, None, spin),
    )
}

fn launch(seq: u64) -> Request {
    Request {
        seq,
        call: Call::Launch {
            function: 0x1_0000_0042,
            grid: [128, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
            stream: 0x2_0000_0001,
            params: vec![7u8; 24],
            attributes: Vec::new(),
        },
    }
}

/// The two CPUs the sides run on: `PIN=a,b`, else 0 and 1.
fn cpus() -> (usize, usize) {
    let pin = std::env::var("PIN").unwrap_or_default();
    let mut it = pin.split(',').filter_map(|c| c.trim().parse().ok());
    (it.next().unwrap_or(0), it.next().unwrap_or(1))
}

/// Pins the calling thread to `cpu`, so that runs compare like with like.
fn pin(cpu: usize) {
    // SAFETY: an all-zero cpu_set_t is valid; CPU_SET and sched_setaffinity
    // get a pointer to the set we own.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn run(rounds: usize, encoded: bool) -> (f64, f64) {
    let (mut client, mut server) = pair();
    let echo = std::thread::spawn(move || {
        pin(cpus().1);
        let (mut msg, mut bulk) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            server.recv(&mut msg, &mut bulk).expect("recv");
            if encoded {
                let request: Request = decode(&msg).expect("decode");
                let bytes = encode(&request).expect("encode");
                server.send(&bytes, &[]).expect("send");
            } else {
                server.send(&msg, &[]).expect("send");
            }
        }
    });
    let raw = encode(&launch(0)).expect("encode");
    let (mut msg, mut bulk) = (Vec::new(), Vec::new());
    let mut times = Vec::with_capacity(rounds);
    for seq in 0..rounds as u64 {
        let started = Instant::now();
        if encoded {
            let bytes = encode(&launch(seq)).expect("encode");
            client.send(&bytes, &[]).expect("send");
            client.recv(&mut msg, &mut bulk).expect("recv");
            let back: Request = decode(&msg).expect("decode");
            assert_eq!(back.seq, seq);
        } else {
            client.send(&raw, &[]).expect("send");
            client.recv(&mut msg, &mut bulk).expect("recv");
        }
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().expect("echo thread");
    let warm = &mut times[rounds / 10..];
    warm.sort_by(f64::total_cmp);
    (percentile(warm, 0.5), percentile(warm, 0.99))
}

/// The floor: one atomic word bounced between the two threads.
fn floor(rounds: usize) -> (f64, f64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let word = Arc::new(AtomicU64::new(0));
    let other = Arc::clone(&word);
    let echo = std::thread::spawn(move || {
        pin(cpus().1);
        for k in 0..rounds as u64 {
            while other.load(Ordering::Acquire) != 2 * k + 1 {
                std::hint::spin_loop();
            }
            other.store(2 * k + 2, Ordering::Release);
        }
    });
    let mut times = Vec::with_capacity(rounds);
    for k in 0..rounds as u64 {
        let started = Instant::now();
        word.store(2 * k + 1, Ordering::Release);
        while word.load(Ordering::Acquire) != 2 * k + 2 {
            std::hint::spin_loop();
        }
        times.push(started.elapsed().as_secs_f64() * 1e6);
    }
    echo.join().expect("echo thread");
    let warm = &mut times[rounds / 10..];
    warm.sort_by(f64::total_cmp);
    (percentile(warm, 0.5), percentile(warm, 0.99))
}

fn main() {
    pin(cpus().0);
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let (p50, p99) = floor(rounds);
    println!(
        "{:<16} round trip p50 {p50:6.3} us  p99 {p99:6.3} us   one hop p50 {:6.3} us",
        "one atomic word",
        p50 / 2.0
    );
    let only_raw = std::env::var_os("ONLY_RAW").is_some();
    let only_encoded = std::env::var_os("ONLY_ENCODED").is_some();
    for (name, encoded) in [("raw bytes", false), ("encoded launch", true)] {
        if (only_raw && encoded) || (only_encoded && !encoded) {
            continue;
        }
        let (p50, p99) = run(rounds, encoded);
        println!(
            "{name:<16} round trip p50 {p50:6.3} us  p99 {p99:6.3} us   one hop p50 {:6.3} us",
            p50 / 2.0
        );
    }
}
