//! One client connection on the wire: the version handshake, the switch to
//! shared memory for same-host clients that offer it, then a loop of requests
//! and replies over a session. Malformed bytes — on the socket or in the shared
//! area — close the connection (and its session) and never reach anything else.

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::shm::{self, Endpoint, ShmArea, ShmError, Side};
use cumux_protocol::{
    codes, decode, encode, pinned, read_frame_within, write_frame, Call, ClientRole, CuError,
    FrameError, Hello, HelloReply, Reply, ReplyBody, Request, ShmAttach, ShmAttached, MAGIC,
    MAX_HELLO_BYTES, MAX_PROGRAM_BYTES, MAX_TOKEN_BYTES, PROTOCOL_VERSION,
};

mod fd_inbox;
mod lane_wire;
mod socket_wire;

pub use fd_inbox::FdInbox;

use socket_wire::{SocketWire, Unread};

use crate::admission::{log_refusal, Peer, Seat};
use crate::session::Session;
use crate::status::StatusScope;
use crate::tls::{ServerTls, TlsStream, HANDSHAKE_RECORD};
use crate::Server;

/// A lane's connection reads ahead in pieces of this size, at most this
/// many pieces ahead of its session.
const LANE_PIECE_BYTES: usize = 256 << 10;
const LANE_PIECES_AHEAD: usize = 16;

/// How long a new connection may take to send its hello (and its shared area).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A [`Socket`]'s operating-system socket.
enum RawSocket<'a> {
    Unix(&'a UnixStream),
    Tcp(&'a TcpStream),
}

/// The socket a client connected on.
pub enum Socket {
    /// With the descriptor that came last with its bytes.
    Unix(UnixStream, FdInbox),
    Tcp(TcpStream),
    Tls(TlsStream),
}

impl Socket {
    /// A unix socket's connection.
    pub fn unix(stream: UnixStream) -> Socket {
        Socket::Unix(stream, FdInbox::default())
    }

    fn try_clone(&self) -> std::io::Result<Socket> {
        Ok(match self {
            Socket::Unix(s, fds) => Socket::Unix(s.try_clone()?, fds.clone()),
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Tls(s) => Socket::Tls(s.clone()),
        })
    }

    /// The socket underneath (a TLS connection's TCP one), for its options.
    fn raw(&self) -> RawSocket<'_> {
        match self {
            Socket::Unix(s, _) => RawSocket::Unix(s),
            Socket::Tcp(s) => RawSocket::Tcp(s),
            Socket::Tls(s) => RawSocket::Tcp(s.tcp()),
        }
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        match self.raw() {
            RawSocket::Unix(s) => s.set_read_timeout(timeout),
            RawSocket::Tcp(s) => s.set_read_timeout(timeout),
        }
    }

    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match self.raw() {
            RawSocket::Unix(s) => s.as_fd(),
            RawSocket::Tcp(s) => s.as_fd(),
        }
    }

    fn set_write_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        match self.raw() {
            RawSocket::Unix(s) => s.set_write_timeout(timeout),
            RawSocket::Tcp(s) => s.set_write_timeout(timeout),
        }
    }

    fn shut_both(&self) {
        let _ = match self.raw() {
            RawSocket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
            RawSocket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }

    fn shut_writing(&self) {
        let _ = match self.raw() {
            RawSocket::Unix(s) => s.shutdown(std::net::Shutdown::Write),
            RawSocket::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
        };
    }

    /// Reads and drops what the peer sent, without waiting.
    pub fn drain(&mut self) {
        let nonblocking = match self.raw() {
            RawSocket::Unix(s) => s.set_nonblocking(true),
            RawSocket::Tcp(s) => s.set_nonblocking(true),
        };
        if nonblocking.is_err() {
            return;
        }
        let mut sink = [0u8; 4096];
        while matches!(self.read(&mut sink), Ok(n) if n > 0) {}
    }

    /// How calls travel when they stay on this socket, for status.
    fn transport(&self) -> &'static str {
        match self {
            Socket::Unix(..) => "unix",
            Socket::Tcp(_) => "tcp",
            Socket::Tls(_) => "tls",
        }
    }

    /// A TCP connection in TLS where `tls` is given and the client starts a
    /// handshake. `Err`: the connection ends. A plain client where TLS is
    /// wanted comes back as it is, with the refusal to send it after its hello.
    fn secure(self, tls: Option<&ServerTls>) -> Result<(Socket, Option<String>), Ending> {
        let Socket::Tcp(tcp) = self else {
            return Ok((self, None));
        };
        let mut first = [0u8; 1];
        let starts_tls = match tcp.peek(&mut first) {
            Ok(0) => return Err(Ending::Closed),
            Ok(_) => first[0] == HANDSHAKE_RECORD,
            Err(e) => return Err(Ending::Broken(format!("{NO_HELLO}: {e}"))),
        };
        match (tls, starts_tls) {
            (Some(tls), true) => match tls.accept(tcp, HELLO_TIMEOUT) {
                Ok(stream) => Ok((Socket::Tls(stream), None)),
                Err(why) => Err(Ending::Broken(format!("{NO_HELLO}: {why}"))),
            },
            (Some(_), false) => Ok((
                Socket::Tcp(tcp),
                Some(
                    "this server takes TCP clients over TLS only: set CUMUX_TLS_FINGERPRINT \
                     (the fingerprint `cumux serve` prints) or CUMUX_TLS_CA"
                        .to_string(),
                ),
            )),
            (None, true) => Err(Ending::Broken(format!(
                "{NO_HELLO}: a TLS handshake, but this server listens on plain TCP"
            ))),
            (None, false) => Ok((Socket::Tcp(tcp), None)),
        }
    }
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Socket::Unix(s, fds) => fds.read(s, buf),
            Socket::Tcp(s) => s.read(buf),
            Socket::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Socket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Socket::Unix(s, _) => s.write(buf),
            Socket::Tcp(s) => s.write(buf),
            Socket::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Socket::Tls(s) => s.flush(),
            _ => Ok(()),
        }
    }
}

/// Why a connection ended, for the log.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// The client closed it.
    Closed,
    /// The client was turned away at the handshake.
    Rejected(String),
    /// The client sent something that is not the protocol, or the link broke.
    Broken(String),
}

/// Serves one connection until it ends; the session's resources are all
/// released before this returns, and then its `seat`. `peer_uid` is the uid of
/// the process at the other end, where the transport can tell (unix sockets).
/// Every refusal leaves a (rate-limited) log line.
pub fn serve_connection(
    server: Arc<Server>,
    peer_uid: Option<u32>,
    socket: Socket,
    tls: Option<&ServerTls>,
    mut seat: Seat,
) -> Ending {
    let ending = serve_seated(server, peer_uid, socket, tls, &mut seat);
    // The session and its buffers are gone by now: give what they freed back.
    crate::freed_memory::after_session();
    match &ending {
        Ending::Rejected(reason) => log_refusal(seat.peer(), peer_uid, reason),
        Ending::Broken(why) if why.starts_with(NO_HELLO) => log_refusal(seat.peer(), peer_uid, why),
        _ => {}
    }
    ending
}

/// Tells a connection that will not be served why, without waiting for its
/// hello (a client reads the refusal where it expects the answer to it), and
/// logs the refusal. The socket is left half-closed: its owner closes it a
/// little later, so that a TCP peer reads the refusal before the close.
pub fn refuse(socket: &mut Socket, peer: &Peer, peer_uid: Option<u32>, reason: &str) {
    log_refusal(peer, peer_uid, reason);
    if socket
        .set_write_timeout(Some(REFUSAL_WRITE_TIMEOUT))
        .is_ok()
    {
        let _ = send(socket, &reject(reason.to_string()));
    }
    socket.shut_writing();
}

/// How long sending a refusal may take.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_millis(100);

/// How a broken handshake's reason starts.
const NO_HELLO: &str = "no hello";

fn serve_seated(
    server: Arc<Server>,
    peer_uid: Option<u32>,
    socket: Socket,
    tls: Option<&ServerTls>,
    seat: &mut Seat,
) -> Ending {
    // A peer that connects and says nothing must not hold a thread for ever.
    if let Err(e) = socket.set_read_timeout(Some(HELLO_TIMEOUT)) {
        return Ending::Broken(format!("cannot set the handshake timeout: {e}"));
    }
    let (socket, plain_refused) = match socket.secure(tls) {
        Ok(secured) => secured,
        Err(ending) => return ending,
    };
    let mut reader = match socket.try_clone() {
        Ok(clone) => BufReader::with_capacity(256 << 10, clone),
        Err(e) => return Ending::Broken(format!("cannot clone the socket: {e}")),
    };
    let mut writer = socket;
    let mut buf = Vec::new();
    let hello = match read_hello(&mut reader, &mut buf) {
        Ok(hello) => hello,
        Err(Handshake::Broken(why)) => return Ending::Broken(why),
        Err(Handshake::Reject(reason)) => {
            let _ = send(&mut writer, &reject(reason.clone()));
            return Ending::Rejected(reason);
        }
    };
    if let Some(reason) = plain_refused {
        let _ = send(&mut writer, &reject(reason.clone()));
        return Ending::Rejected(reason);
    }
    let tenant = match hello.role {
        ClientRole::Lane => return serve_lane(&server, &hello, peer_uid, seat, reader, writer),
        ClientRole::Preflight => return preflight(&server, &hello, peer_uid, seat, &mut writer),
        ClientRole::Claim => {
            return hold_claim(&server, &hello, peer_uid, seat, &mut reader, &mut writer)
        }
        ClientRole::Status => None,
        ClientRole::Driver => match admit(&server, &hello, peer_uid, seat.peer()) {
            Ok(tenant) => Some(tenant),
            Err(reason) => {
                let _ = send(&mut writer, &reject(reason.clone()));
                return Ending::Rejected(reason);
            }
        },
    };
    if let Some((name, _)) = &tenant {
        if let Err(reason) = seat.join_tenant(name) {
            let _ = send(&mut writer, &reject(reason.clone()));
            return Ending::Rejected(reason);
        }
    }
    let devices = match &tenant {
        Some((_, settings)) => server
            .devices_seen(settings, hello.visible_devices.as_deref())
            .0
            .into_iter()
            .map(|(_, info)| info)
            .collect(),
        None => server.device_infos(),
    };
    let tenant_name = tenant.as_ref().map(|t| t.0.clone());
    let scope = status_scope(&server, &hello, peer_uid, tenant_name.as_deref());
    let mut session = match Session::open(Arc::clone(&server), &hello, tenant) {
        Ok(session) => session,
        Err(e) => {
            let _ = send(&mut writer, &reject(e.to_string()));
            return Ending::Rejected(e.to_string());
        }
    };
    session.set_status_scope(scope);
    // A program resuming a checkpoint parked here under its key.
    let resume_from = match hello.resume {
        Some(key) if key != 0 && hello.role == ClientRole::Driver => {
            match session.resume_parked() {
                Ok(seq) => seq,
                Err(e) => {
                    let reason = format!("cannot resume the program's session: {}", e.detail);
                    let _ = send(&mut writer, &reject(reason.clone()));
                    if catch_unwind(AssertUnwindSafe(|| session.close())).is_err() {
                        tracing::error!("session clean-up panicked");
                    }
                    return Ending::Rejected(reason);
                }
            }
        }
        _ => 0,
    };
    // Shared memory only over a unix socket, whose far end is on this host.
    let offer_shm = hello.shm && matches!(writer, Socket::Unix(..));
    // Lanes only where several streams may move more than one: TCP.
    let lanes = match (&writer, hello.role) {
        (Socket::Tcp(_) | Socket::Tls(_), ClientRole::Driver) => server.lanes().offer(session.id()),
        _ => None,
    };
    let welcome = HelloReply::Welcome {
        version: PROTOCOL_VERSION,
        server: server.name().to_string(),
        session: session.id(),
        devices,
        shm: offer_shm,
        group: session.group_key(),
        resume: session.resume_key(),
        resume_from,
        lanes: lanes.as_ref().map(|(offer, _)| *offer),
    };
    tracing::info!(
        session = session.id(),
        pid = hello.pid,
        program = %hello.program,
        tenant = tenant_name.as_deref().unwrap_or("-"),
        ?peer_uid,
        role = ?hello.role,
        "session opened"
    );
    // Status tells the transport from the moment the client learns it.
    let id = session.id();
    let record = |transport: &'static str| {
        server.registry().set_transport(id, transport);
        tracing::debug!(session = id, transport, "transport chosen");
    };
    if !offer_shm {
        record(writer.transport());
    }
    // A client that hangs up while a call waits for its work (a synchronize
    // on a kernel that never ends) has that work cancelled at once.
    let hangup = server.hangups().and_then(|hangups| {
        hangups
            .watch(writer.fd(), session.canceller())
            .map_err(|e| tracing::warn!(session = id, "cannot watch for a hang-up: {e}"))
            .ok()
    });
    let ending = match send(&mut writer, &welcome) {
        Ok(()) => {
            let shared = match (&writer, offer_shm) {
                (Socket::Unix(unix, _), true) => {
                    let spin = match session.latency_critical() {
                        true => crate::device::spin::hot_spin_time(),
                        false => shm::spin_from_env(),
                    };
                    attach_shm(&mut reader, unix, &mut buf, record, spin)
                }
                _ => Ok(None),
            };
            match shared {
                Err(ending) => ending,
                Ok(shared) => match writer.set_read_timeout(None) {
                    Err(e) => Ending::Broken(format!("cannot clear the handshake timeout: {e}")),
                    Ok(()) => match shared {
                        Some((endpoint, socket)) => {
                            request_loop(&mut session, &mut ShmWire::new(endpoint, socket))
                        }
                        None => {
                            let fds = match &writer {
                                Socket::Unix(_, fds) => Some(fds.clone()),
                                _ => None,
                            };
                            let arrivals = lanes.map(|(_, arrivals)| arrivals);
                            let mut wire = SocketWire::new(reader, writer, buf)
                                .with_fds(fds)
                                .with_lanes(arrivals);
                            request_loop(&mut session, &mut wire)
                        }
                    },
                },
            }
        }
        Err(e) => Ending::Broken(e),
    };
    drop(hangup);
    server.lanes().withdraw(id);
    let (launches, gpu_ms) = session.totals();
    let zero_copy_bytes = session.zero_copy_bytes();
    let closing = std::time::Instant::now();
    if catch_unwind(AssertUnwindSafe(|| session.close())).is_err() {
        tracing::error!(session = id, "session clean-up panicked");
    }
    // How long freeing the session's memory and modules took.
    let teardown_ms = closing.elapsed().as_secs_f64() * 1e3;
    match &ending {
        Ending::Broken(why) => {
            tracing::warn!(
                session = id,
                launches,
                gpu_ms,
                teardown_ms,
                "connection dropped: {why}"
            )
        }
        _ => tracing::info!(
            session = id,
            launches,
            gpu_ms,
            zero_copy_bytes,
            teardown_ms,
            "session closed"
        ),
    }
    ending
}

/// The tenant a driver's or preflight's hello names. A peer whose tokens
/// keep failing is refused for a while without a look at its token.
fn admit(
    server: &Server,
    hello: &Hello,
    peer_uid: Option<u32>,
    peer: &Peer,
) -> Result<(String, crate::tenants::TenantSettings), String> {
    let seats = server.seats();
    if hello.token.is_some() {
        seats.may_authenticate(peer, peer_uid)?;
    }
    server
        .tenants()
        .admit(hello.tenant.as_deref(), peer_uid, hello.token.as_deref())
        .inspect_err(|_| {
            if hello.token.is_some() {
                seats.failed_authentication(peer, peer_uid);
            }
        })
}

/// Answers `cumux run`'s question before it starts a program: would a driver
/// with this hello be let in? The same checks as a driver's handshake (the
/// tenant, its session limit, a device to run on), then the welcome it would
/// get, with every device of its tenant, or the refusal; no session opens.
fn preflight(
    server: &Server,
    hello: &Hello,
    peer_uid: Option<u32>,
    seat: &mut Seat,
    writer: &mut Socket,
) -> Ending {
    match admitted_devices(server, hello, peer_uid, seat) {
        Ok(devices) => {
            let _ = send(writer, &preflight_welcome(server, devices));
            Ending::Closed
        }
        Err(reason) => {
            let _ = send(writer, &reject(reason.clone()));
            Ending::Rejected(reason)
        }
    }
}

/// The devices a driver with `hello` would see here, or why it would be refused.
fn admitted_devices(
    server: &Server,
    hello: &Hello,
    peer_uid: Option<u32>,
    seat: &mut Seat,
) -> Result<Vec<crate::SeenDevice>, String> {
    let (name, settings) = admit(server, hello, peer_uid, seat.peer())?;
    seat.join_tenant(&name)?;
    let (devices, _) = server.devices_seen(&settings, hello.visible_devices.as_deref());
    if devices.is_empty() {
        return Err(format!(
            "tenant {name:?} may use no device of this server{}",
            server.failed_devices_note()
        ));
    }
    Ok(devices)
}

fn preflight_welcome(server: &Server, devices: Vec<crate::SeenDevice>) -> HelloReply {
    HelloReply::Welcome {
        version: PROTOCOL_VERSION,
        server: server.name().to_string(),
        session: 0,
        devices: devices.into_iter().map(|(_, info)| info).collect(),
        shm: false,
        group: 0,
        resume: 0,
        resume_from: 0,
        lanes: None,
    }
}

/// A lane of a session (`ClientRole::Lane`): joined where its key is the
/// session's, welcomed, then its connection reads ahead for the session
/// (decrypting on this thread) until either ends.
fn serve_lane(
    server: &Server,
    hello: &Hello,
    peer_uid: Option<u32>,
    seat: &mut Seat,
    mut reader: BufReader<Socket>,
    mut writer: Socket,
) -> Ending {
    let seats = server.seats();
    let refuse = |writer: &mut Socket, reason: String| {
        let _ = send(writer, &reject(reason.clone()));
        Ending::Rejected(reason)
    };
    if let Err(reason) = seats.may_authenticate(seat.peer(), peer_uid) {
        return refuse(&mut writer, reason);
    }
    let Some(join) = hello.lane else {
        return refuse(&mut writer, "a lane's hello names no session".into());
    };
    let (halves, closer) = match (writer.try_clone(), writer.try_clone()) {
        (Ok(half), Ok(closer)) => (half, closer),
        (Err(e), _) | (_, Err(e)) => {
            return Ending::Broken(format!("cannot clone the socket: {e}"))
        }
    };
    let (pieces_to, pieces) = std::sync::mpsc::sync_channel(LANE_PIECES_AHEAD);
    let (spent, spent_back) = std::sync::mpsc::channel::<Vec<u8>>();
    let lane = crate::lanes::JoinedLane {
        index: join.index,
        pieces,
        spent,
        writer: Box::new(server.lanes().counted(halves)),
        close: Box::new(move || closer.shut_both()),
    };
    // Welcomed only once joined; its client sends nothing on it before.
    match server.lanes().join(&join, lane) {
        Ok(()) => {}
        Err(crate::lanes::Refused::NoSession) => {
            let reason = format!("session {} takes no lanes (it ended)", join.session);
            return refuse(&mut writer, reason);
        }
        Err(crate::lanes::Refused::WrongKey) => {
            seats.failed_authentication(seat.peer(), peer_uid);
            return refuse(&mut writer, "a lane with a wrong key".into());
        }
    }
    let welcome = HelloReply::Welcome {
        version: PROTOCOL_VERSION,
        server: server.name().to_string(),
        session: join.session,
        devices: Vec::new(),
        shm: false,
        group: 0,
        resume: 0,
        resume_from: 0,
        lanes: None,
    };
    if let Err(e) = send(&mut writer, &welcome) {
        return Ending::Broken(e);
    }
    if let Err(e) = writer.set_read_timeout(None) {
        return Ending::Broken(format!("cannot clear the handshake timeout: {e}"));
    }
    tracing::debug!(session = join.session, lane = join.index, "lane joined");
    // Part of its session now, which holds the seat, and ends with it.
    seat.give_back();
    loop {
        let mut piece = spent_back
            .try_recv()
            .unwrap_or_else(|_| vec![0u8; LANE_PIECE_BYTES]);
        let n = match reader.read(&mut piece) {
            Ok(0) => return Ending::Closed,
            Ok(n) => n,
            Err(e) => return Ending::Broken(format!("lane {}: {e}", join.index)),
        };
        server.lanes().count_in(n);
        if pieces_to.send((piece, n)).is_err() {
            // The session ended.
            return Ending::Closed;
        }
    }
}

/// A placement held (`ClientRole::Claim`): admitted as a preflight, then
/// counted on its devices until the client closes the connection or the
/// program opens a session (then the connection is closed, so that a
/// running program holds one seat, not two). The client sends nothing
/// more; bytes from it end the claim.
fn hold_claim(
    server: &Server,
    hello: &Hello,
    peer_uid: Option<u32>,
    seat: &mut Seat,
    reader: &mut BufReader<Socket>,
    writer: &mut Socket,
) -> Ending {
    let devices = match admitted_devices(server, hello, peer_uid, seat) {
        Ok(devices) => devices,
        Err(reason) => {
            let _ = send(writer, &reject(reason.clone()));
            return Ending::Rejected(reason);
        }
    };
    let ordinals = devices.iter().map(|(d, _)| d.info().ordinal).collect();
    if let Err(e) = writer.set_read_timeout(Some(CLAIM_CHECK)) {
        return Ending::Broken(format!("cannot set a claim's timeout: {e}"));
    }
    let claim = server.registry().claim(hello.pid, ordinals);
    let held = match send(writer, &preflight_welcome(server, devices)) {
        Ok(()) => loop {
            let mut byte = [0u8; 1];
            match reader.read(&mut byte) {
                Ok(0) => break Ending::Closed,
                Ok(_) => break Ending::Broken("a claim's client sent bytes".into()),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    if server.registry().has_session_of(hello.pid) {
                        break Ending::Closed;
                    }
                }
                Err(e) => break Ending::Broken(format!("a claim's connection broke: {e}")),
            }
        },
        Err(e) => Ending::Broken(format!("cannot answer a claim: {e}")),
    };
    server.registry().release(claim);
    held
}

/// How often a held claim looks for its program's session.
const CLAIM_CHECK: Duration = Duration::from_millis(500);

/// Whose sessions a connection's status calls show: everyone's to the
/// server's own uid and to root (on the unix socket, where the uid is
/// known) and to the admin token; else the tenant it is (a driver) or
/// claims and may be (status).
fn status_scope(
    server: &Server,
    hello: &Hello,
    peer_uid: Option<u32>,
    tenant: Option<&str>,
) -> StatusScope {
    let own_uid = crate::admission::own_uid();
    if peer_uid.is_some_and(|uid| uid == own_uid || uid == 0)
        || server.tenants().is_admin_token(hello.token.as_deref())
    {
        return StatusScope::Everything;
    }
    let tenant = match (tenant, &hello.role) {
        (Some(name), _) => Some(name.to_string()),
        (None, ClientRole::Status) => server
            .tenants()
            .admit(hello.tenant.as_deref(), peer_uid, hello.token.as_deref())
            .ok()
            .map(|(name, _)| name),
        (
            None,
            ClientRole::Driver | ClientRole::Preflight | ClientRole::Claim | ClientRole::Lane,
        ) => None,
    };
    tenant.map_or(StatusScope::Devices, StatusScope::Tenant)
}

/// Receives the client's shared area (a [`ShmAttach`] frame with its memfd) and
/// answers it. `Ok(Some)`: calls move to the area (the socket stays, for the
/// memfds of pinned regions); `Ok(None)`: the area was unusable, they stay on
/// the socket (the client was told why); `Err`: the client broke the protocol.
fn attach_shm(
    reader: &mut BufReader<Socket>,
    socket: &UnixStream,
    buf: &mut Vec<u8>,
    record: impl Fn(&'static str),
    spin: Duration,
) -> Result<Option<(Endpoint, UnixStream)>, Ending> {
    // The client sends nothing between its hello and the attach, so nothing may
    // be buffered: the descriptor comes with the attach frame's first bytes.
    if !reader.buffer().is_empty() {
        return Err(Ending::Broken(
            "bytes between the hello and the shared area".into(),
        ));
    }
    let mut header = [0u8; 4];
    let (got, fd) = shm::recv_with_fd(socket, &mut header)
        .map_err(|e| Ending::Broken(format!("no shared area: {e}")))?;
    if got == 0 {
        return Err(Ending::Closed);
    }
    reader
        .read_exact(&mut header[got..])
        .map_err(|e| Ending::Broken(format!("no shared area: {e}")))?;
    let len = u32::from_le_bytes(header) as usize;
    if len > 4096 {
        return Err(Ending::Broken(format!(
            "a shared-area frame of {len} bytes"
        )));
    }
    buf.resize(len, 0);
    reader
        .read_exact(buf)
        .map_err(|e| Ending::Broken(format!("no shared area: {e}")))?;
    let attach: ShmAttach =
        decode(buf).map_err(|e| Ending::Broken(format!("undecodable shared-area frame: {e}")))?;
    let mapped = match fd {
        None => Err("no descriptor came with it".to_string()),
        Some(fd) => ShmArea::attach(fd, attach.layout),
    };
    let mut writer = socket;
    match mapped {
        Ok(area) => {
            record("shm");
            send(&mut writer, &ShmAttached { result: Ok(()) }).map_err(Ending::Broken)?;
            let clone = || {
                socket
                    .try_clone()
                    .map_err(|e| Ending::Broken(format!("cannot clone the socket: {e}")))
            };
            let endpoint = Endpoint::new(area, Side::Server, Some(clone()?.into()), spin);
            Ok(Some((endpoint, clone()?)))
        }
        Err(why) => {
            tracing::debug!("shared area refused, staying on the socket: {why}");
            record("unix");
            send(&mut writer, &ShmAttached { result: Err(why) }).map_err(Ending::Broken)?;
            Ok(None)
        }
    }
}

/// How requests arrive and replies leave on one connection.
trait Wire {
    /// The next request, or how the connection ended.
    fn receive(&mut self) -> Result<Request, Ending>;
    /// Sends a reply; a failure ends the connection.
    fn reply(&mut self, reply: Reply) -> Result<(), String>;
    /// Has `session` handle `call` (request `seq`); `Err`: the connection ends.
    fn handle(
        &mut self,
        session: &mut Session,
        call: Call,
        seq: u64,
    ) -> Result<Option<Result<ReplyBody, CuError>>, Ending> {
        let _ = seq;
        Ok(session.handle(call))
    }
    /// The descriptor a client sends right after a call that carries one
    /// (`Call::carries_fd`; shared memory only: on the socket, calls travel
    /// as frames).
    fn receive_fd(&mut self) -> Result<OwnedFd, String> {
        Err("passing a descriptor needs the shared-memory transport".into())
    }
    /// Sends a descriptor after the reply that says it comes (`Call::returns_fd`).
    fn send_fd(&mut self, fd: OwnedFd) -> Result<(), String> {
        drop(fd);
        Err("passing a descriptor needs the shared-memory transport".into())
    }
    /// Polls for the next request as long as the server polls for a
    /// worker's answer before sleeping (then as before): the client waits
    /// for something that will bring it back at once. A socket's reads do
    /// not poll.
    fn poll_next_longer(&mut self) {}
}

impl<R: Read, W: Write + Send + 'static> Wire for SocketWire<R, W> {
    fn handle(
        &mut self,
        session: &mut Session,
        call: Call,
        seq: u64,
    ) -> Result<Option<Result<ReplyBody, CuError>>, Ending> {
        SocketWire::handle(self, session, call, seq).map_err(Ending::Broken)
    }

    fn receive(&mut self) -> Result<Request, Ending> {
        self.next_request().map_err(|unread| match unread {
            Unread::Closed => Ending::Closed,
            Unread::Broken(why) => Ending::Broken(why),
        })
    }

    fn reply(&mut self, reply: Reply) -> Result<(), String> {
        self.send_reply(reply)
    }

    fn receive_fd(&mut self) -> Result<OwnedFd, String> {
        self.take_fd().ok_or_else(|| {
            "no descriptor came with the call (one passes only on a unix socket, attached to \
             the call's frame)"
                .into()
        })
    }
}

/// The rings of a client's shared area. Every request is copied out of the
/// area before it is decoded; whatever the client wrote there can only end
/// this connection.
struct ShmWire {
    endpoint: Endpoint,
    msg: Vec<u8>,
    /// The connection's socket, which carries only pinned regions' memfds.
    socket: UnixStream,
    /// How long the next receive polls after [`Wire::poll_next_longer`] (`device::spin::answer_spin_time`, asked once:
    /// the host's cores are read from cgroup files, tens of µs).
    long_spin: std::time::Duration,
}

impl ShmWire {
    fn new(endpoint: Endpoint, socket: UnixStream) -> Self {
        ShmWire {
            endpoint,
            msg: Vec::new(),
            socket,
            long_spin: crate::device::spin::answer_spin_time(),
        }
    }
}

/// How long the server waits for a pinned region's memfd after its call.
pub const FD_WAIT: Duration = Duration::from_secs(5);

fn shm_ending(e: ShmError) -> Ending {
    match e {
        ShmError::PeerGone => Ending::Closed,
        ShmError::Violation(why) => Ending::Broken(format!("shared area: {why}")),
    }
}

impl Wire for ShmWire {
    fn receive(&mut self) -> Result<Request, Ending> {
        // A fresh vector for the bulk: it becomes the call's buffer.
        let mut bulk = Vec::new();
        self.endpoint
            .recv(&mut self.msg, &mut bulk)
            .map_err(shm_ending)?;
        let mut request: Request = decode(&self.msg).map_err(|e| {
            Ending::Broken(format!(
                "undecodable request ({} bytes): {e}",
                self.msg.len()
            ))
        })?;
        shm::put_call_bulk(&mut request.call, bulk).map_err(shm_ending)?;
        Ok(request)
    }

    fn poll_next_longer(&mut self) {
        self.endpoint.spin_longer_once(self.long_spin);
    }

    fn receive_fd(&mut self) -> Result<OwnedFd, String> {
        let mut pfd = libc::pollfd {
            fd: self.socket.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; waits at most FD_WAIT.
        let ready = unsafe { libc::poll(&mut pfd, 1, FD_WAIT.as_millis() as libc::c_int) };
        if ready <= 0 {
            return Err(format!("no memfd came within {FD_WAIT:?}"));
        }
        let mut tag = [0u8; 1];
        let mut fds = Vec::new();
        let got = shm::recv_with_fds(self.socket.as_fd(), &mut tag, libc::MSG_DONTWAIT, &mut fds)
            .map_err(|e| format!("cannot receive the memfd: {e}"))?;
        match (got, tag[0], fds.len()) {
            (1, pinned::FD_TAG, 1) => Ok(fds.remove(0)),
            (0, _, _) => Err("the socket closed".into()),
            (_, tag, n) => Err(format!("{n} descriptors with byte {tag:#x}")),
        }
    }

    fn send_fd(&mut self, fd: OwnedFd) -> Result<(), String> {
        shm::send_with_fd(&self.socket, &[pinned::FD_TAG], fd.as_fd())
            .map_err(|e| format!("cannot send a descriptor: {e}"))
    }

    fn reply(&mut self, mut reply: Reply) -> Result<(), String> {
        let bulk = shm::take_reply_bulk(&mut reply);
        let bytes = encode(&reply).map_err(|e| format!("cannot encode a reply: {e}"))?;
        self.endpoint
            .send(&bytes, &bulk)
            .map_err(|e| format!("cannot send: {e}"))
    }
}

fn request_loop(session: &mut Session, wire: &mut impl Wire) -> Ending {
    loop {
        let request = match wire.receive() {
            Ok(request) => request,
            Err(ending) => return ending,
        };
        let seq = request.seq;
        tracing::trace!(session = session.id(), seq, "call");
        let kind: &'static str = (&request.call).into();
        hop_trace::mark(Hop::ServerReceive, kind);
        let started = std::time::Instant::now();
        session.set_seq(seq);
        if request.call.carries_fd() {
            session.give_fd(wire.receive_fd());
        }
        // A synchronize's mark: the client watches for it and calls again
        // as soon as it lands, after as long as the work takes (a thread
        // asleep by then costs the next call a wake-up).
        let client_waits = matches!(request.call, Call::Mark { event: None, .. });
        let handled = catch_unwind(AssertUnwindSafe(|| wire.handle(session, request.call, seq)));
        let result = match handled {
            Ok(Ok(result)) => result,
            Ok(Err(ending)) => return ending,
            Err(_) => {
                tracing::error!(
                    session = session.id(),
                    seq,
                    "a call panicked; closing the session"
                );
                let reply = Reply {
                    seq,
                    result: Err(CuError::new(codes::UNKNOWN, "internal server error")),
                    stdout: Vec::new(),
                };
                let _ = wire.reply(reply);
                return Ending::Broken("a call panicked".into());
            }
        };
        if let Some(result) = result {
            let reply = Reply {
                seq,
                result,
                stdout: session.take_stdout(),
            };
            if let Err(e) = wire.reply(reply) {
                return Ending::Broken(e);
            }
            if let Some(fd) = session.take_outgoing_fd() {
                if let Err(e) = wire.send_fd(fd) {
                    return Ending::Broken(e);
                }
            }
        }
        if session.leaving() {
            session.vacate();
            return moved_away(wire);
        }
        if client_waits {
            wire.poll_next_longer();
        }
        hop_trace::mark(Hop::ServerReply, kind);
        let us = started.elapsed().as_micros();
        if us > cumux_protocol::SLOW_CALL_US {
            tracing::debug!(target: "cumux::slow", session = session.id(), seq, us, kind, "server: slow call");
        }
    }
}

/// The connection of a session that moved to another server: its client
/// reads where it went at its next wait for a reply, and may send calls till
/// then, which go unread (it keeps them, to send again there).
fn moved_away(wire: &mut impl Wire) -> Ending {
    while wire.receive().is_ok() {}
    Ending::Closed
}

enum Handshake {
    Broken(String),
    Reject(String),
}

fn read_hello(reader: &mut impl Read, buf: &mut Vec<u8>) -> Result<Hello, Handshake> {
    match read_frame_within(reader, buf, MAX_HELLO_BYTES) {
        Ok(()) => {}
        Err(e @ FrameError::TooLarge { .. }) => {
            return Err(Handshake::Reject(format!("a hello too large: {e}")))
        }
        // A connection closed at once (a probe of the port) is no refusal.
        Err(FrameError::Closed) => return Err(Handshake::Broken("closed before its hello".into())),
        Err(e) => return Err(Handshake::Broken(format!("{NO_HELLO}: {e}"))),
    }
    // Magic and version lead every hello of every version: read them first, so a
    // client of another version is told so even if the rest has changed shape.
    let (magic, version): (u32, u32) =
        decode(buf).map_err(|e| Handshake::Broken(format!("undecodable hello: {e}")))?;
    if magic != MAGIC {
        return Err(Handshake::Reject(format!(
            "bad magic {magic:#x} (expected {MAGIC:#x}): not a cumux client of protocol version {PROTOCOL_VERSION}"
        )));
    }
    if version != PROTOCOL_VERSION {
        return Err(Handshake::Reject(format!(
            "protocol version mismatch: the client speaks version {version}, this server speaks version {PROTOCOL_VERSION}"
        )));
    }
    let hello: Hello = decode(buf).map_err(|e| {
        Handshake::Reject(format!(
            "malformed hello for protocol version {PROTOCOL_VERSION}: {e}"
        ))
    })?;
    if hello
        .token
        .as_ref()
        .is_some_and(|t| t.len() > MAX_TOKEN_BYTES)
    {
        return Err(Handshake::Reject(format!(
            "a token of more than {MAX_TOKEN_BYTES} bytes"
        )));
    }
    if hello.program.len() > MAX_PROGRAM_BYTES {
        return Err(Handshake::Reject(format!(
            "a program name of {} bytes: at most {MAX_PROGRAM_BYTES}",
            hello.program.len()
        )));
    }
    Ok(hello)
}

fn reject(reason: String) -> HelloReply {
    HelloReply::Rejected {
        server_version: PROTOCOL_VERSION,
        reason,
    }
}

fn send<T: serde::Serialize>(writer: &mut impl Write, msg: &T) -> Result<(), String> {
    let bytes = encode(msg).map_err(|e| format!("cannot encode a reply: {e}"))?;
    write_frame(writer, &bytes).map_err(|e| format!("cannot send: {e}"))?;
    writer.flush().map_err(|e| format!("cannot send: {e}"))
}
