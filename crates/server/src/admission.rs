//! Admission: how many sessions the server holds in all, per peer (a TCP
//! address, or a client process on the unix socket), per uid and per tenant
//! ([`SessionLimits`]), the seats that count them ([`Seats`], [`Seat`]), and the
//! rate-limited log line each refused connection leaves ([`log_refusal`]).
//!
//! A connection takes its seat when it is accepted, before it gets a thread, so
//! a flood of connections costs the server no more than its limits allow; the
//! tenant part of the seat is taken once the hello names the tenant.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::locking::lock;

/// The most sessions the server holds at once, in all and per holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SessionLimits {
    /// Sessions (and connections waiting for their hello) in all.
    pub total: u32,
    /// Per peer: one TCP address, or one client process on the unix socket.
    pub per_peer: u32,
    /// Per uid of the peer (unix sockets).
    pub per_uid: u32,
    /// Per tenant, over all its sessions.
    pub per_tenant: u32,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            total: 512,
            per_peer: 64,
            per_uid: 256,
            per_tenant: 256,
        }
    }
}

impl SessionLimits {
    /// Checks values a config file could get wrong.
    pub fn validate(&self) -> Result<(), String> {
        let all = [
            ("sessions", self.total),
            ("sessions_per_peer", self.per_peer),
            ("sessions_per_uid", self.per_uid),
            ("sessions_per_tenant", self.per_tenant),
        ];
        match all.iter().find(|(_, n)| *n == 0) {
            Some((name, _)) => Err(format!("[limits] {name} must be at least 1")),
            None => Ok(()),
        }
    }
}

/// The server's own user id (the owner of `/proc/self`), looked up once.
pub fn own_uid() -> u32 {
    static UID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *UID.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(0)
    })
}

/// Who is at the other end of a connection, as far as the transport tells.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A TCP client's address.
    Tcp(IpAddr),
    /// A client process on the unix socket (`SO_PEERCRED`).
    Process(u32),
    /// The transport does not say.
    Unknown,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Tcp(ip) => write!(f, "tcp {ip}"),
            Peer::Process(pid) => write!(f, "pid {pid}"),
            Peer::Unknown => write!(f, "an unknown peer"),
        }
    }
}

#[derive(Default)]
struct Counts {
    total: u32,
    peers: HashMap<Peer, u32>,
    uids: HashMap<u32, u32>,
    tenants: HashMap<String, u32>,
}

fn count_down<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: &K) {
    if let Some(n) = map.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// The server's seats: what its connections hold against [`SessionLimits`].
pub struct Seats {
    limits: SessionLimits,
    counts: Mutex<Counts>,
    failures: Mutex<HashMap<Claimant, Failures>>,
}

/// Who failed to authenticate: a TCP address, else a uid (a unix socket's
/// processes come and go; their user stays).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Claimant {
    Address(IpAddr),
    Uid(Option<u32>),
}

impl Claimant {
    fn of(peer: &Peer, uid: Option<u32>) -> Claimant {
        match peer {
            Peer::Tcp(ip) => Claimant::Address(*ip),
            _ => Claimant::Uid(uid),
        }
    }
}

/// Failed authentications of one claimant in the current window.
#[derive(Debug, Clone, Copy)]
struct Failures {
    since: Instant,
    count: u32,
}

/// Failed authentications one claimant may have within [`FAILURE_WINDOW`];
/// past them its hellos are refused unchecked until the window ends.
pub const MAX_FAILURES: u32 = 5;
pub const FAILURE_WINDOW: Duration = Duration::from_secs(30);
/// Claimants remembered at most (the oldest windows go first).
const FAILURES_KEPT: usize = 4096;

impl Seats {
    pub fn new(limits: SessionLimits) -> Arc<Self> {
        Arc::new(Seats {
            limits,
            counts: Mutex::new(Counts::default()),
            failures: Mutex::new(HashMap::new()),
        })
    }

    /// Whether `peer` (of `uid`) may try to authenticate now, or why not.
    pub fn may_authenticate(&self, peer: &Peer, uid: Option<u32>) -> Result<(), String> {
        let mut failures = lock(&self.failures);
        let claimant = Claimant::of(peer, uid);
        let Some(f) = failures.get(&claimant).copied() else {
            return Ok(());
        };
        let waited = f.since.elapsed();
        if waited >= FAILURE_WINDOW {
            failures.remove(&claimant);
            return Ok(());
        }
        if f.count < MAX_FAILURES {
            return Ok(());
        }
        Err(format!(
            "too many failed authentications from {peer}: {} in {} s; try again in {} s",
            f.count,
            FAILURE_WINDOW.as_secs(),
            (FAILURE_WINDOW - waited).as_secs() + 1
        ))
    }

    /// Counts a failed authentication of `peer` (of `uid`).
    pub fn failed_authentication(&self, peer: &Peer, uid: Option<u32>) {
        let mut failures = lock(&self.failures);
        if failures.len() >= FAILURES_KEPT {
            failures.retain(|_, f| f.since.elapsed() < FAILURE_WINDOW);
            if failures.len() >= FAILURES_KEPT {
                if let Some(oldest) = failures
                    .iter()
                    .min_by_key(|(_, f)| f.since)
                    .map(|(k, _)| k.clone())
                {
                    failures.remove(&oldest);
                }
            }
        }
        let entry = failures.entry(Claimant::of(peer, uid)).or_insert(Failures {
            since: Instant::now(),
            count: 0,
        });
        if entry.since.elapsed() >= FAILURE_WINDOW {
            *entry = Failures {
                since: Instant::now(),
                count: 0,
            };
        }
        entry.count += 1;
    }

    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    /// Seats taken now.
    pub fn taken(&self) -> u32 {
        lock(&self.counts).total
    }

    /// A seat for a new connection from `peer` (of `uid`, where the transport
    /// tells), or why there is none.
    pub fn take(self: &Arc<Self>, peer: Peer, uid: Option<u32>) -> Result<Seat, String> {
        let mut counts = lock(&self.counts);
        let limits = &self.limits;
        if counts.total >= limits.total {
            return Err(format!(
                "server at capacity: {} sessions (the limit `sessions`)",
                limits.total
            ));
        }
        let of_peer = counts.peers.get(&peer).copied().unwrap_or(0);
        if peer != Peer::Unknown && of_peer >= limits.per_peer {
            return Err(format!(
                "{peer} holds {of_peer} sessions, the most one peer may (the limit `sessions_per_peer`)"
            ));
        }
        if let Some(uid) = uid {
            let of_uid = counts.uids.get(&uid).copied().unwrap_or(0);
            if of_uid >= limits.per_uid {
                return Err(format!(
                    "uid {uid} holds {of_uid} sessions, the most one uid may (the limit `sessions_per_uid`)"
                ));
            }
            *counts.uids.entry(uid).or_default() += 1;
        }
        counts.total += 1;
        *counts.peers.entry(peer.clone()).or_default() += 1;
        Ok(Seat {
            seats: Arc::clone(self),
            peer,
            uid,
            tenant: None,
            given_back: false,
        })
    }
}

/// One connection's seat, given back when it drops.
pub struct Seat {
    seats: Arc<Seats>,
    peer: Peer,
    uid: Option<u32>,
    tenant: Option<String>,
    /// Given back before the connection ended ([`Seat::give_back`]).
    given_back: bool,
}

impl Seat {
    /// Gives the seat back now: the connection is part of a session that
    /// holds its own (a lane), and ends with it.
    pub fn give_back(&mut self) {
        if !std::mem::replace(&mut self.given_back, true) {
            self.seats.count_out(self);
        }
    }

    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// Counts the seat for `tenant` too, or says why the tenant may have no more.
    pub fn join_tenant(&mut self, tenant: &str) -> Result<(), String> {
        if self.tenant.is_some() {
            return Ok(());
        }
        let limit = self.seats.limits.per_tenant;
        let mut counts = lock(&self.seats.counts);
        let held = counts.tenants.get(tenant).copied().unwrap_or(0);
        if held >= limit {
            return Err(format!(
                "tenant {tenant:?} holds {held} sessions, the most one tenant may (the limit `sessions_per_tenant`)"
            ));
        }
        *counts.tenants.entry(tenant.to_string()).or_default() += 1;
        drop(counts);
        self.tenant = Some(tenant.to_string());
        Ok(())
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl Seats {
    /// Takes `seat` out of the counts.
    fn count_out(&self, seat: &Seat) {
        let mut counts = lock(&self.counts);
        counts.total = counts.total.saturating_sub(1);
        count_down(&mut counts.peers, &seat.peer);
        if let Some(uid) = seat.uid {
            count_down(&mut counts.uids, &uid);
        }
        if let Some(tenant) = &seat.tenant {
            count_down(&mut counts.tenants, tenant);
        }
    }
}

/// Refusals logged per window; the rest are counted and summed up later.
const REFUSALS_PER_WINDOW: u32 = 10;
const REFUSAL_WINDOW: Duration = Duration::from_secs(10);

struct RefusalLog {
    window_start: Option<Instant>,
    logged: u32,
    unlogged: u64,
}

static REFUSALS: Mutex<RefusalLog> = Mutex::new(RefusalLog {
    window_start: None,
    logged: 0,
    unlogged: 0,
});

/// Logs one refused connection (a warning with the peer and the reason, which
/// names the versions where they differ), at most [`REFUSALS_PER_WINDOW`] a
/// window; the next logged refusal says how many were left out.
pub fn log_refusal(peer: &Peer, uid: Option<u32>, reason: &str) {
    let mut log = lock(&REFUSALS);
    let now = Instant::now();
    let fresh = log
        .window_start
        .is_none_or(|start| now.duration_since(start) >= REFUSAL_WINDOW);
    if fresh {
        log.window_start = Some(now);
        log.logged = 0;
    }
    if log.logged >= REFUSALS_PER_WINDOW {
        log.unlogged += 1;
        return;
    }
    log.logged += 1;
    let unlogged = std::mem::take(&mut log.unlogged);
    drop(log);
    match unlogged {
        0 => tracing::warn!(%peer, ?uid, "connection refused: {reason}"),
        n => tracing::warn!(
            %peer,
            ?uid,
            "connection refused: {reason} ({n} earlier refusals were not logged)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> SessionLimits {
        SessionLimits {
            total: 4,
            per_peer: 2,
            per_uid: 3,
            per_tenant: 2,
        }
    }

    #[test]
    fn each_limit_holds_and_seats_come_back() {
        let seats = Seats::new(limits());
        let a = Peer::Process(10);
        let one = seats.take(a.clone(), Some(7)).unwrap();
        let two = seats.take(a.clone(), Some(7)).unwrap();
        let refused = seats.take(a.clone(), Some(7)).err().unwrap();
        assert!(refused.contains("pid 10 holds 2 sessions"), "{refused}");
        let three = seats.take(Peer::Process(11), Some(7)).unwrap();
        let refused = seats.take(Peer::Process(12), Some(7)).err().unwrap();
        assert!(refused.contains("uid 7 holds 3"), "{refused}");
        let mut four = seats.take(Peer::Tcp([10, 0, 0, 1].into()), None).unwrap();
        assert_eq!(seats.taken(), 4);
        let refused = seats.take(Peer::Unknown, None).err().unwrap();
        assert_eq!(
            refused,
            "server at capacity: 4 sessions (the limit `sessions`)"
        );
        drop(one);
        let mut five = seats.take(Peer::Unknown, None).unwrap();
        four.join_tenant("t").unwrap();
        five.join_tenant("t").unwrap();
        let mut six_seat = {
            drop(two);
            seats.take(Peer::Unknown, None).unwrap()
        };
        let refused = six_seat.join_tenant("t").err().unwrap();
        assert!(
            refused.contains("tenant \"t\" holds 2 sessions"),
            "{refused}"
        );
        drop((three, four, five, six_seat));
        assert_eq!(seats.taken(), 0);
        let counts = lock(&seats.counts);
        assert!(counts.peers.is_empty() && counts.uids.is_empty() && counts.tenants.is_empty());
    }

    #[test]
    fn a_seat_given_back_counts_once() {
        // A lane gives its seat back once it joins its session.
        let seats = Seats::new(limits());
        let held = seats.take(Peer::Process(10), Some(7)).unwrap();
        let mut lane = seats.take(Peer::Process(10), Some(7)).unwrap();
        assert!(seats.take(Peer::Process(10), Some(7)).is_err());
        lane.give_back();
        lane.give_back();
        assert_eq!(seats.taken(), 1);
        let again = seats.take(Peer::Process(10), Some(7)).unwrap();
        drop((lane, held, again));
        assert_eq!(seats.taken(), 0);
        assert!(lock(&seats.counts).peers.is_empty());
    }

    #[test]
    fn zero_limits_are_refused_by_name() {
        let bad = SessionLimits {
            per_uid: 0,
            ..SessionLimits::default()
        };
        assert_eq!(
            bad.validate().unwrap_err(),
            "[limits] sessions_per_uid must be at least 1"
        );
        assert!(SessionLimits::default().validate().is_ok());
    }
}
