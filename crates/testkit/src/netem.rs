//! A network emulator for tests and benchmarks: a TCP relay on loopback that
//! delays each direction (with jitter), limits its bandwidth, and loses
//! segments the way TCP shows a loss to its reader (a late retransmission).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What the link between client and server is like.
#[derive(Debug, Clone, Copy)]
pub struct Link {
    /// Round-trip time: each direction delays by half of it.
    pub rtt: Duration,
    /// Each chunk's delay varies by up to this much (never reordering).
    pub jitter: Duration,
    /// Bytes per second in each direction; `None`: unlimited.
    pub bandwidth: Option<u64>,
    /// The share of chunks lost once, each arriving a retransmission
    /// timeout ([`RETRANSMIT`]) late, with all behind it.
    pub loss: f64,
}

impl Link {
    /// A link with this round trip and nothing else in the way.
    pub fn with_rtt(rtt: Duration) -> Self {
        Link {
            rtt,
            jitter: Duration::ZERO,
            bandwidth: None,
            loss: 0.0,
        }
    }

    /// Bandwidth in gigabits per second.
    pub fn gbit(mut self, gbit_per_s: f64) -> Self {
        self.bandwidth = Some((gbit_per_s * 1e9 / 8.0) as u64);
        self
    }
}

/// How late a lost segment arrives: Linux's minimum retransmission timeout.
pub const RETRANSMIT: Duration = Duration::from_millis(200);

/// The most a chunk read at once carries.
const CHUNK: usize = 256 << 10;

/// Bytes a direction holds beyond those in flight on the link (a switch's
/// and the far socket's buffers): past them the sender waits, as a real
/// link's flow control holds it.
const BUFFERED: usize = 4 << 20;

/// Bytes a direction of an unlimited link holds at most.
const UNLIMITED_HELD: usize = 64 << 20;

/// Bytes one direction of one connection holds now, and a wake-up when the
/// writer has passed some on.
type Held = Arc<(Mutex<usize>, Condvar)>;

/// When each direction of the link is free again: one link, whichever of
/// the relay's connections a chunk is on (client to server, then back).
type Busy = Arc<[Mutex<Instant>; 2]>;

/// A running relay: connections to [`Relay::address`] reach `target` through
/// the emulated link. Dropped, it stops accepting and cuts its connections.
pub struct Relay {
    address: String,
    stop: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<TcpStream>>>,
    /// Bytes relayed, both directions together.
    relayed: Arc<AtomicU64>,
}

impl Relay {
    /// Starts relaying to `target` (`HOST:PORT`) over `link`, on a free
    /// loopback port.
    pub fn start(target: &str, link: Link) -> io::Result<Relay> {
        Relay::start_at("127.0.0.1:0", target, link)
    }

    /// Starts relaying to `target` over `link`, listening at `listen`.
    pub fn start_at(listen: &str, target: &str, link: Link) -> io::Result<Relay> {
        let listener = TcpListener::bind(listen)?;
        let address = listener.local_addr()?.to_string();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let relayed = Arc::new(AtomicU64::new(0));
        let (target, accepting) = (target.to_string(), Arc::clone(&stop));
        let (held, counted) = (Arc::clone(&connections), Arc::clone(&relayed));
        let busy: Busy = Arc::new([Mutex::new(Instant::now()), Mutex::new(Instant::now())]);
        thread::Builder::new()
            .name("netem-accept".into())
            .spawn(move || {
                while !accepting.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let relaying = (&*held, &counted, &busy);
                            if let Err(e) = connect(client, &target, link, relaying) {
                                eprintln!("netem: cannot reach {target}: {e}");
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(5))
                        }
                        Err(e) => eprintln!("netem: accept: {e}"),
                    }
                }
            })?;
        Ok(Relay {
            address,
            stop,
            connections,
            relayed,
        })
    }

    /// `HOST:PORT` to connect to instead of the target.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Bytes relayed so far, both directions.
    pub fn relayed(&self) -> u64 {
        self.relayed.load(Ordering::Relaxed)
    }

    /// Cuts every connection now (as a failed link the peers see close).
    pub fn cut(&self) {
        for s in self
            .connections
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

/// Relays one accepted connection to `target`, a pair of threads each way,
/// over the link the relay's other connections share.
fn connect(
    client: TcpStream,
    target: &str,
    link: Link,
    (held, relayed, busy): (&Mutex<Vec<TcpStream>>, &Arc<AtomicU64>, &Busy),
) -> io::Result<()> {
    client.set_nonblocking(false)?;
    let server = TcpStream::connect(target)?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
    }
    {
        let mut held = held.lock().unwrap_or_else(|p| p.into_inner());
        held.push(client.try_clone()?);
        held.push(server.try_clone()?);
    }
    let out = (Arc::clone(busy), 0);
    direction(client.try_clone()?, server.try_clone()?, link, relayed, out)?;
    direction(server, client, link, relayed, (Arc::clone(busy), 1))
}

/// `from` → `to` over `link`: a reader stamping each chunk with when it may
/// leave, a writer sending it then.
fn direction(
    from: TcpStream,
    to: TcpStream,
    link: Link,
    relayed: &Arc<AtomicU64>,
    way: (Busy, usize),
) -> io::Result<()> {
    let (send, receive) = channel::<(Instant, Vec<u8>)>();
    let held: Held = Arc::default();
    let passed = Arc::clone(&held);
    thread::Builder::new()
        .name("netem-read".into())
        .spawn(move || read_side(from, link, way, (send, held)))?;
    let relayed = Arc::clone(relayed);
    thread::Builder::new()
        .name("netem-write".into())
        .spawn(move || write_side(to, receive, &relayed, &passed))?;
    Ok(())
}

/// What one direction of `link` holds at most: the bytes in flight over
/// its one-way delay, and [`BUFFERED`].
fn holds(link: &Link) -> usize {
    match link.bandwidth {
        Some(rate) if rate > 0 => {
            let in_flight = rate as f64 * (link.rtt / 2 + link.jitter).as_secs_f64();
            in_flight as usize + BUFFERED
        }
        _ => UNLIMITED_HELD,
    }
}

fn read_side(
    mut from: TcpStream,
    link: Link,
    (busy, way): (Busy, usize),
    (send, held): (Sender<(Instant, Vec<u8>)>, Held),
) {
    let one_way = link.rtt / 2;
    let most = holds(&link);
    let mut rng = fastrand::Rng::new();
    // The last chunk's due time (jitter never reorders a stream).
    let mut last_due = Instant::now();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        {
            let (bytes, passed) = &*held;
            let mut bytes = bytes.lock().unwrap_or_else(|p| p.into_inner());
            while *bytes > 0 && *bytes + n > most {
                bytes = passed.wait(bytes).unwrap_or_else(|p| p.into_inner());
            }
            *bytes += n;
        }
        let serialized = match link.bandwidth {
            Some(rate) if rate > 0 => Duration::from_secs_f64(n as f64 / rate as f64),
            _ => Duration::ZERO,
        };
        // The link carries the chunk once it has carried what came before
        // on any connection.
        let free_at = {
            let mut free = busy[way].lock().unwrap_or_else(|p| p.into_inner());
            *free = (*free).max(Instant::now()) + serialized;
            *free
        };
        let jitter = link.jitter.mul_f64(rng.f64());
        let lost = link.loss > 0.0 && rng.f64() < link.loss;
        let mut due = free_at + one_way + jitter;
        if lost {
            due += RETRANSMIT;
        }
        due = due.max(last_due);
        last_due = due;
        if send.send((due, buf[..n].to_vec())).is_err() {
            break;
        }
    }
}

fn write_side(
    mut to: TcpStream,
    receive: Receiver<(Instant, Vec<u8>)>,
    relayed: &AtomicU64,
    held: &Held,
) {
    for (due, bytes) in receive {
        let wait = due.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            thread::sleep(wait);
        }
        if to.write_all(&bytes).is_err() {
            break;
        }
        relayed.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let (held_bytes, passed) = &**held;
        *held_bytes.lock().unwrap_or_else(|p| p.into_inner()) -= bytes.len();
        passed.notify_one();
    }
    // Nothing more passes: a reader waiting for room goes on to find the
    // writer gone.
    let (held_bytes, passed) = &**held;
    *held_bytes.lock().unwrap_or_else(|p| p.into_inner()) = 0;
    passed.notify_all();
    let _ = to.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback; its address.
    fn echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(mut s) = s else { return };
                thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let _ = io::copy(&mut r, &mut s);
                });
            }
        });
        address
    }

    #[test]
    fn a_round_trip_takes_the_links_rtt() {
        let relay = Relay::start(&echo(), Link::with_rtt(Duration::from_millis(40))).unwrap();
        let mut s = TcpStream::connect(relay.address()).unwrap();
        s.set_nodelay(true).unwrap();
        let mut got = [0u8; 5];
        let started = Instant::now();
        s.write_all(b"hello").unwrap();
        s.read_exact(&mut got).unwrap();
        let took = started.elapsed();
        assert_eq!(&got, b"hello");
        // Out and back through the relay: the RTT.
        assert!(took >= Duration::from_millis(40), "{took:?}");
        assert!(took < Duration::from_millis(500), "{took:?}");
    }

    #[test]
    fn a_bandwidth_limit_paces_a_transfer() {
        // 8 Mbit/s: 256 KiB takes 0.26 s each way (the echo overlaps them).
        let link = Link::with_rtt(Duration::ZERO).gbit(0.008);
        let relay = Relay::start(&echo(), link).unwrap();
        let mut s = TcpStream::connect(relay.address()).unwrap();
        let data = vec![7u8; 256 << 10];
        let started = Instant::now();
        let mut writer = s.try_clone().unwrap();
        let sent = data.clone();
        let w = thread::spawn(move || writer.write_all(&sent).unwrap());
        let mut back = vec![0u8; data.len()];
        s.read_exact(&mut back).unwrap();
        w.join().unwrap();
        let took = started.elapsed();
        assert_eq!(back, data);
        assert!(took >= Duration::from_millis(250), "{took:?}");
        // The relay counts a chunk once it has written it on: the echo may be
        // read back a moment before the count of its last chunk.
        let counted = Instant::now() + Duration::from_secs(5);
        while relay.relayed() < 2 * data.len() as u64 && Instant::now() < counted {
            thread::sleep(Duration::from_millis(5));
        }
        assert!(relay.relayed() >= 2 * data.len() as u64);
    }

    #[test]
    fn connections_share_the_links_bandwidth() {
        // 8 Mbit/s for both: 2 × 128 KiB each way takes 0.26 s, not 0.13.
        let link = Link::with_rtt(Duration::ZERO).gbit(0.008);
        let relay = Relay::start(&echo(), link).unwrap();
        let data = vec![5u8; 128 << 10];
        let started = Instant::now();
        let echoed: Vec<_> = (0..2)
            .map(|_| {
                let mut s = TcpStream::connect(relay.address()).unwrap();
                let mut writer = s.try_clone().unwrap();
                let sent = data.clone();
                thread::spawn(move || {
                    let w = thread::spawn(move || writer.write_all(&sent).unwrap());
                    let mut back = vec![0u8; 128 << 10];
                    s.read_exact(&mut back).unwrap();
                    w.join().unwrap();
                    back
                })
            })
            .collect();
        for back in echoed {
            assert_eq!(back.join().unwrap(), data);
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(250), "{took:?}");
    }

    #[test]
    fn a_slow_link_holds_its_sender_back() {
        // 8 Mbit/s: in a second the link passes 1 MB, and the relay holds
        // at most BUFFERED more; the sender's and the sink's sockets the
        // rest. Without the bound the relay would take all 64 MiB at once.
        let sink = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = sink.local_addr().unwrap().to_string();
        thread::spawn(move || {
            let (mut s, _) = sink.accept().unwrap();
            let _ = io::copy(&mut s, &mut io::sink());
        });
        let relay = Relay::start(&at, Link::with_rtt(Duration::ZERO).gbit(0.008)).unwrap();
        let mut s = TcpStream::connect(relay.address()).unwrap();
        s.set_nonblocking(true).unwrap();
        let chunk = vec![1u8; 1 << 20];
        let (mut accepted, until) = (0usize, Instant::now() + Duration::from_secs(1));
        while Instant::now() < until && accepted < 64 << 20 {
            match s.write(&chunk) {
                Ok(n) => accepted += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    thread::sleep(Duration::from_millis(5))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(
            accepted < 40 << 20,
            "the relay took {accepted} bytes in a second"
        );
    }

    #[test]
    fn a_cut_link_closes_both_ends() {
        let relay = Relay::start(&echo(), Link::with_rtt(Duration::ZERO)).unwrap();
        let mut s = TcpStream::connect(relay.address()).unwrap();
        s.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one).unwrap();
        relay.cut();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(matches!(s.read(&mut one), Ok(0) | Err(_)));
    }
}
