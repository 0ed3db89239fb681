//! Server addresses (`unix:PATH`, `tcp:HOST:PORT`), the default socket path,
//! binding (with stale-socket removal, then the socket's mode and group) and
//! the accept loop that gives every connection a thread of its own, until a
//! shutdown drains it.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cumux_protocol::shm::peer_credentials;

use crate::admission::{log_refusal, own_uid, Peer};
pub use crate::connection::HELLO_TIMEOUT;
use crate::connection::{refuse, serve_connection, Socket};
use crate::shutdown::{wait_for, DrainEnd, Drained, Shutdown, Woken, SHUTTING_DOWN};
use crate::tls::ServerTls;
use crate::Server;

/// Where a server listens and clients connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    /// `HOST:PORT`.
    Tcp(String),
}

impl Address {
    /// Parses `unix:PATH` or `tcp:HOST:PORT`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path".into());
            }
            Ok(Address::Unix(PathBuf::from(path)))
        } else if let Some(hostport) = text.strip_prefix("tcp:") {
            match hostport.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    Ok(Address::Tcp(hostport.to_string()))
                }
                _ => Err(format!("tcp address {hostport:?} is not HOST:PORT")),
            }
        } else {
            Err(format!(
                "address {text:?} is neither unix:PATH nor tcp:HOST:PORT"
            ))
        }
    }

    /// A comma-separated list of addresses (the servers of a program that
    /// uses the devices of several), each named once.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, String> {
        let mut list: Vec<Address> = Vec::new();
        for part in text.split(',') {
            let address = Address::parse(part.trim())?;
            if list.contains(&address) {
                return Err(format!("{address} is listed twice"));
            }
            list.push(address);
        }
        Ok(list)
    }

    /// `$XDG_RUNTIME_DIR/cumux/cumux.sock`, else `/tmp/cumux-$UID/cumux.sock`.
    pub fn default_unix() -> Self {
        let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            Some(runtime) => PathBuf::from(runtime).join("cumux"),
            None => PathBuf::from(format!("/tmp/cumux-{}", own_uid())),
        };
        Address::Unix(dir.join("cumux.sock"))
    }

    /// `CUMUX_SERVER` if set, else the default socket.
    pub fn from_env_or_default() -> Result<Self, String> {
        let mut list = Address::list_from_env_or_default()?;
        match list.len() {
            1 => Ok(list.remove(0)),
            n => Err(format!(
                "CUMUX_SERVER names {n} servers ({}); this command acts on one: pass --server \
                 with the one you mean",
                list.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// Every server `CUMUX_SERVER` names (comma-separated), else the default
    /// socket.
    pub fn list_from_env_or_default() -> Result<Vec<Self>, String> {
        match std::env::var("CUMUX_SERVER") {
            Ok(text) if !text.is_empty() => Address::parse_list(&text),
            _ => Ok(vec![Address::default_unix()]),
        }
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "unix:{}", path.display()),
            Address::Tcp(hostport) => write!(f, "tcp:{hostport}"),
        }
    }
}

/// A bound, not yet serving, listener.
pub enum BoundListener {
    Unix(UnixListener, PathBuf),
    /// With the TLS its clients must speak, if any.
    Tcp(TcpListener, Option<Arc<ServerTls>>),
}

/// Binds `address`. For a unix socket the folder is made (mode 0700) and a
/// stale socket file that nothing listens on any more is removed.
pub fn bind(address: &Address) -> io::Result<BoundListener> {
    match address {
        Address::Unix(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)?;
                if *address == Address::default_unix() {
                    check_private_dir(dir)?;
                }
            }
            remove_stale_socket(path)?;
            Ok(BoundListener::Unix(UnixListener::bind(path)?, path.clone()))
        }
        Address::Tcp(hostport) => Ok(BoundListener::Tcp(
            TcpListener::bind(hostport.as_str())?,
            None,
        )),
    }
}

/// The default socket's folder must be ours and closed to others (it may sit
/// in a shared /tmp, where anybody could have made it first).
fn check_private_dir(dir: &Path) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != own_uid() || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} must be a folder owned by uid {} with mode 0700; remove it or use --listen",
                dir.display(),
                own_uid()
            ),
        ));
    }
    Ok(())
}

fn remove_stale_socket(path: &Path) -> io::Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("a server already listens on {}", path.display()),
        ));
    }
    tracing::info!("removing stale socket {}", path.display());
    std::fs::remove_file(path)
}

impl BoundListener {
    /// A TCP listener whose clients must speak TLS with `tls` (a unix
    /// socket's clients are on this host: `tls` is refused there).
    pub fn with_tls(mut self, tls: ServerTls) -> io::Result<Self> {
        match &mut self {
            BoundListener::Tcp(_, slot) => {
                *slot = Some(Arc::new(tls));
                Ok(self)
            }
            BoundListener::Unix(..) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "TLS applies to a TCP address, not to a unix socket",
            )),
        }
    }

    /// The TLS a TCP listener speaks.
    pub fn tls(&self) -> Option<&ServerTls> {
        match self {
            BoundListener::Tcp(_, tls) => tls.as_deref(),
            BoundListener::Unix(..) => None,
        }
    }

    /// The address clients should use.
    pub fn address(&self) -> Address {
        match self {
            BoundListener::Unix(_, path) => Address::Unix(path.clone()),
            BoundListener::Tcp(l, _) => match l.local_addr() {
                Ok(a) => Address::Tcp(a.to_string()),
                Err(_) => Address::Tcp("?".into()),
            },
        }
    }

    /// Gives a unix socket `mode` (permission bits) and group `gid`, if set.
    /// Returns a warning when the mode opens it to others whom its private
    /// folder keeps out.
    pub fn set_access(&self, mode: Option<u32>, gid: Option<u32>) -> io::Result<Option<String>> {
        let BoundListener::Unix(_, path) = self else {
            return match (mode, gid) {
                (None, None) => Ok(None),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "socket_mode and socket_group apply to a unix socket, not to TCP",
                )),
            };
        };
        if let Some(gid) = gid {
            std::os::unix::fs::chown(path, None, Some(gid))?;
        }
        let Some(mode) = mode else {
            return Ok(None);
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        let dir_mode = match dir {
            Some(dir) => std::fs::metadata(dir)?.mode(),
            None => std::fs::metadata(".")?.mode(),
        };
        Ok((mode & 0o066 != 0 && dir_mode & 0o011 == 0).then(|| {
            format!(
                "socket mode {mode:04o} opens {} to others, but its folder (mode {:04o}) \
                 lets nobody else reach it; listen in a folder the group can enter (e.g. \
                 /run/cumux, mode 0750)",
                path.display(),
                dir_mode & 0o7777
            )
        }))
    }

    /// Accepts connections forever, one thread each while the session limits
    /// allow; past them, a connection is told why by the one refusing thread
    /// and closed (or, while that thread is behind, closed at once).
    pub fn serve(self, server: Arc<Server>) -> io::Result<()> {
        let never = Shutdown::new()?;
        self.serve_until(server, &never, Duration::MAX).map(|_| ())
    }

    /// Serves as [`BoundListener::serve`] until `shutdown` is pulled, then
    /// drains: every new connection is refused ([`SHUTTING_DOWN`]) while
    /// those open may finish, for at most `grace` (a second pull ends it at
    /// once). Returns what was left; the socket file goes when `self` drops.
    pub fn serve_until(
        self,
        server: Arc<Server>,
        shutdown: &Shutdown,
        grace: Duration,
    ) -> io::Result<Drained> {
        let refusals = spawn_refuser()?;
        // `poll` says when to accept; a connection gone by then must not block.
        self.set_nonblocking()?;
        let mut accepted: u64 = 0;
        let mut draining: Option<Instant> = None;
        loop {
            if let Some(began) = draining {
                let end = match (shutdown.requests(), server.seats().taken()) {
                    (2.., _) => Some(DrainEnd::Stopped),
                    (_, 0) => Some(DrainEnd::Finished),
                    _ if began.elapsed() >= grace => Some(DrainEnd::TimedOut),
                    _ => None,
                };
                if let Some(end) = end {
                    return Ok(Drained {
                        end,
                        waited: began.elapsed(),
                        open: server.seats().taken(),
                        sessions: server.registry().entries(),
                    });
                }
            } else if shutdown.requests() > 0 {
                tracing::info!(
                    open = server.seats().taken(),
                    "draining: new connections are refused; those open may finish for {}",
                    seconds(grace)
                );
                draining = Some(Instant::now());
                continue;
            }
            // While draining, look again at least every DRAIN_CHECK.
            let timeout =
                draining.map(|began| grace.saturating_sub(began.elapsed()).min(DRAIN_CHECK));
            match wait_for(self.raw_fd(), shutdown, timeout)? {
                Woken::Connection => {}
                Woken::Shutdown | Woken::Timeout => continue,
            }
            let (socket, peer, uid) = match self.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    // Out of descriptors: say so, back off, keep serving.
                    tracing::error!("cannot accept a connection: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            let seat = match draining {
                Some(_) => Err(SHUTTING_DOWN.to_string()),
                None => server.seats().take(peer.clone(), uid),
            };
            let seat = match seat {
                Ok(seat) => seat,
                Err(reason) => {
                    if let Err(TrySendError::Full((_, peer, uid, reason))) =
                        refusals.try_send((socket, peer, uid, reason))
                    {
                        log_refusal(&peer, uid, &format!("{reason} (closed unanswered)"));
                    }
                    continue;
                }
            };
            accepted += 1;
            let name = format!("cumux-conn{accepted}");
            let server = Arc::clone(&server);
            let tls = match &self {
                BoundListener::Tcp(_, tls) => tls.clone(),
                BoundListener::Unix(..) => None,
            };
            let spawned = std::thread::Builder::new()
                .name(name)
                .spawn(move || serve_connection(server, uid, socket, tls.as_deref(), seat));
            if let Err(e) = spawned {
                // Out of threads: say so, back off, keep serving.
                tracing::error!("cannot start a connection's thread: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            BoundListener::Unix(listener, _) => listener.set_nonblocking(true),
            BoundListener::Tcp(listener, _) => listener.set_nonblocking(true),
        }
    }

    fn raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            BoundListener::Unix(listener, _) => listener.as_raw_fd(),
            BoundListener::Tcp(listener, _) => listener.as_raw_fd(),
        }
    }

    /// The next connection, with who is at its other end.
    fn accept(&self) -> io::Result<(Socket, Peer, Option<u32>)> {
        match self {
            BoundListener::Unix(listener, _) => {
                let (stream, _) = listener.accept()?;
                let (peer, uid) = match peer_credentials(&stream) {
                    Some(cred) => (Peer::Process(cred.pid as u32), Some(cred.uid)),
                    None => (Peer::Unknown, None),
                };
                Ok((Socket::unix(stream), peer, uid))
            }
            BoundListener::Tcp(listener, _) => {
                let (stream, address) = listener.accept()?;
                tracing::debug!(%address, "tcp connection");
                let _ = stream.set_nodelay(true);
                Ok((Socket::Tcp(stream), Peer::Tcp(address.ip()), None))
            }
        }
    }
}

/// How often a drain looks whether every connection has closed.
const DRAIN_CHECK: Duration = Duration::from_millis(50);

/// `30.0 s`, `2.5 s`.
fn seconds(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// A connection to turn away: its socket, its peer, and why.
type Refusal = (Socket, Peer, Option<u32>, String);

/// Connections waiting for the refusing thread; more are closed unanswered.
const REFUSALS_QUEUED: usize = 64;
/// How long a refused connection stays half-open, so that its peer reads the
/// refusal before the close; and the most kept so at once.
const REFUSED_LINGER: Duration = Duration::from_millis(500);
const REFUSED_KEPT: usize = 256;

/// The one thread that tells connections past the limits why: it answers at
/// once, waiting for no hello, so a silent connection cannot hold it up.
fn spawn_refuser() -> io::Result<SyncSender<Refusal>> {
    let (send, receive) = sync_channel::<Refusal>(REFUSALS_QUEUED);
    std::thread::Builder::new()
        .name("cumux-refuser".into())
        .spawn(move || {
            let mut lingering: VecDeque<(Instant, Socket)> = VecDeque::new();
            loop {
                let wait = lingering
                    .front()
                    .map_or(Duration::from_secs(3600), |(at, _)| {
                        (*at + REFUSED_LINGER).saturating_duration_since(Instant::now())
                    });
                match receive.recv_timeout(wait) {
                    Ok((mut socket, peer, uid, reason)) => {
                        refuse(&mut socket, &peer, uid, &reason);
                        if lingering.len() >= REFUSED_KEPT {
                            lingering.pop_front();
                        }
                        lingering.push_back((Instant::now(), socket));
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                while lingering
                    .front()
                    .is_some_and(|(at, _)| at.elapsed() >= REFUSED_LINGER)
                {
                    // What the peer sent is read first: a TCP close with
                    // unread bytes resets the connection, refusal and all.
                    if let Some((_, mut socket)) = lingering.pop_front() {
                        socket.drain();
                    }
                }
            }
        })?;
    Ok(send)
}

/// The uid of the process at the other end of a unix socket (`SO_PEERCRED`).
pub fn peer_uid(stream: &UnixStream) -> Option<u32> {
    peer_credentials(stream).map(|cred| cred.uid)
}

impl Drop for BoundListener {
    fn drop(&mut self) {
        if let BoundListener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}
