//! The connection to the cumux server: the handshake, then requests and
//! replies through a shared-memory area (unix sockets, by default) or over the
//! socket itself (TCP, with TLS where `CUMUX_TLS_*` ask, `CUMUX_TRANSPORT=socket`,
//! or when the area cannot be set up). A failed call on the link marks the connection dead, and every later
//! call fails fast with `CUDA_ERROR_DEVICE_UNAVAILABLE`.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub use cumux_protocol::address::{server_address, ServerAddress};
use cumux_protocol::hop_trace::{self, Hop};
use cumux_protocol::shm::{self, Endpoint, ShmArea, Side};
use cumux_protocol::stream::{ConnectError, Stream};
use cumux_protocol::{
    self as proto, pinned, Call, ClientRole, DeviceInfo, Hello, HelloReply, Reply, ReplyBody,
    Request, ShmAttach, ShmAttached,
};

use crate::errors::*;
use crate::resume::{self, Resume};
use crate::teardown;

thread_local! {
    /// What the server said of the last call of this thread that failed.
    static LAST_ERROR: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Takes the server's message for the last failed call of the calling
/// thread (a JIT error log's text), empty when none.
pub fn take_last_error_message() -> String {
    LAST_ERROR.try_with(|last| last.take()).unwrap_or_default()
}

/// `CUDA_VISIBLE_DEVICES` for the hello (the server applies it), cut to
/// what a hello carries.
pub fn visible_devices() -> Option<String> {
    let text = std::env::var("CUDA_VISIBLE_DEVICES").ok()?;
    let cut = proto::visible_devices::cut(&text);
    if cut.len() < text.len() {
        tracing::warn!(
            "CUDA_VISIBLE_DEVICES is longer than {} bytes: only its first entries count",
            proto::visible_devices::MAX_TEXT_BYTES
        );
    }
    Some(cut.to_string())
}

/// Why a request could not be written.
enum Sending {
    /// It cannot be encoded.
    Invalid,
    /// The link is gone.
    Lost(String),
}

pub struct Connection {
    /// The socket, behind a lock of its own: the flusher writes a batch it
    /// took while the program's thread encodes the next (a thread holding
    /// the connection's lock may take the wire's, never the other way round).
    wire: Arc<Mutex<Wire>>,
    /// The unix socket's own handle, for descriptors (`SCM_RIGHTS`).
    unix: Option<std::os::unix::net::UnixStream>,
    /// The shared area calls travel through, once the server took it.
    shm: Option<Endpoint>,
    seq: u64,
    /// Calls sent unanswered since the last answered one (see [`proto::FENCE_EVERY`]).
    unanswered: u32,
    /// Streams with work sent since the last context synchronize.
    touched: touched::Touched,
    /// Streams known idle and events known reached, from calls and answers.
    quiet: quiet::Quiet,
    /// A fence sent on the socket whose answer is not read yet: the next
    /// fence waits for it (so at most two windows of calls are unanswered),
    /// and any call's wait passes over it.
    fence_pending: Option<u64>,
    buf: Vec<u8>,
    dead: bool,
    /// A fatal error the server reported (an illegal address, a launch
    /// timeout: `codes::is_fatal`): the context is unusable, so unanswered
    /// calls fail with it at once, as NVIDIA's driver fails every call after
    /// one; waited ones get it from the server.
    fatal: Option<CUresult>,
    /// Unanswered calls not yet written to the socket (`batch`).
    batch: batch::Batch,
    /// This connection behind its link's lock, for the flusher.
    me: Weak<Mutex<Connection>>,
    /// How to resume the session elsewhere, where the program asked for it
    /// (`CUMUX_RESUME=1`) and the server gave a resume key.
    resume: Option<Resume>,
    /// Further connections that carry large copies (TCP).
    lanes: lane_streams::LaneState,
}

/// A connection's socket, and why the flusher thread could not write a
/// batch on it (the next call finds the link lost).
struct Wire {
    stream: Stream,
    failed: Option<String>,
}

/// `wire`, locked (a thread that panicked holding it left it whole).
fn locked(wire: &Mutex<Wire>) -> MutexGuard<'_, Wire> {
    wire.lock().unwrap_or_else(|p| p.into_inner())
}

/// Unanswered calls a client sends on a socket before a fence. The socket's
/// own flow control already holds a client whose server is not reading (the
/// server takes one call at a time, and stops at its launch window), so the
/// fence here only bounds how far the client runs ahead of the server's
/// answers: a larger window than shared memory's ring needs, so that a
/// training step of a few hundred launches pays no round trip for it.
pub(crate) const SOCKET_FENCE_EVERY: u32 = 16 * proto::FENCE_EVERY;

/// Whether synchronizes may be settled ([`Link::settle`]): unless
/// `CUMUX_SETTLE=0`, read once.
fn settling_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("CUMUX_SETTLE").map_or(true, |v| v.trim() != "0"))
}

/// `CUMUX_TRANSPORT=socket` keeps calls on the socket; the default (or `shm`)
/// moves them to shared memory where the server is on a unix socket.
fn shm_wanted(address: &ServerAddress) -> bool {
    let setting = std::env::var("CUMUX_TRANSPORT").unwrap_or_default();
    match setting.trim() {
        "" | "shm" | "auto" => matches!(address, ServerAddress::Unix(_)),
        "socket" => false,
        other => {
            tracing::warn!("CUMUX_TRANSPORT={other}: expected shm or socket; using shm");
            matches!(address, ServerAddress::Unix(_))
        }
    }
}

/// The shared-memory area to offer the server: where it is wanted and can be
/// made.
fn offered_area(address: &ServerAddress) -> Option<(ShmArea, OwnedFd)> {
    if !shm_wanted(address) {
        return None;
    }
    ShmArea::create(shm::DEFAULT_LAYOUT)
        .inspect_err(|e| tracing::debug!("no shared memory ({e}); calls go over the socket"))
        .ok()
}

/// The connection behind its lock, which a call holds for one message (and
/// its reply, when it waits for one): how every call reaches the server.
pub struct Link(Arc<Mutex<Connection>>);

impl Link {
    pub fn new(mut conn: Connection) -> Self {
        Link(Arc::new_cyclic(|me| {
            conn.me = me.clone();
            Mutex::new(conn)
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends a call; waits for its reply unless it is fire-and-forget.
    pub fn call(&self, call: Call) -> CuResult<ReplyBody> {
        self.lock().call(call)
    }

    /// Whether `stream` is known to have no work left on the device (see
    /// [`quiet::Quiet`]): its synchronize or query is answered here. Never
    /// on a lost connection, whose waits must fail.
    pub fn stream_idle(&self, stream: proto::Handle) -> bool {
        let conn = self.lock();
        !conn.dead && conn.quiet.idle(stream)
    }

    /// Whether none of this link's streams may have work left (see
    /// [`quiet::Quiet`]): a context synchronize is answered here.
    pub fn all_idle(&self) -> bool {
        let conn = self.lock();
        !conn.dead && conn.quiet.all_idle()
    }

    /// Answers a synchronize of `stream` (`None`: the context) here when
    /// all the work it waits for is plain (copies in whose bytes went with
    /// their calls, memsets, copies within the device:
    /// [`quiet::Quiet::settleable`]): sends `Call::Settle`, which
    /// the server waits for in the calls' order, and says so. `false`: the
    /// caller waits as before. `CUMUX_SETTLE=0` turns this off.
    pub fn settle(&self, stream: Option<proto::Handle>) -> CuResult<bool> {
        let mut conn = self.lock();
        if conn.dead || !settling_on() || !conn.quiet.settleable(stream) {
            return Ok(false);
        }
        conn.call(Call::Settle { stream })?;
        Ok(true)
    }

    /// A synchronous copy in of `bytes` into memory the client knows, in
    /// the chunks `call` makes (on the default stream, unanswered), settled
    /// (`Call::Settle` after them) when [`quiet::Quiet::copy_in_settleable`]:
    /// as NVIDIA's driver returns from such a copy once it holds the bytes.
    /// `false`: nothing was sent.
    pub fn settled_copy_in(
        &self,
        bytes: &[u8],
        call: impl Fn(u64, &[u8]) -> Call,
    ) -> CuResult<bool> {
        let mut conn = self.lock();
        if conn.dead || !settling_on() || !conn.quiet.copy_in_settleable() {
            return Ok(false);
        }
        conn.calls_with_chunks(bytes, call)?;
        conn.call(Call::Settle {
            stream: Some(proto::DEFAULT_STREAM),
        })?;
        Ok(true)
    }

    /// Notes, before it is sent, a copy to `stream` into memory the client
    /// cannot check: that stream's waits are not settled until it is idle.
    pub fn unchecked_copy(&self, stream: proto::Handle) {
        self.lock().quiet.unchecked_copy(stream);
    }

    /// Sends a synchronize's mark (`Call::Mark` without an event): the
    /// call's number, for [`Link::mark_seen`].
    pub fn send_mark(&self, call: Call) -> CuResult<u64> {
        let mut conn = self.lock();
        conn.call(call)?;
        Ok(conn.seq)
    }

    /// Notes whether the mark sent as call `seq` was seen stored: if it was
    /// and no work went to its stream since, the stream is idle.
    pub fn mark_seen(&self, seq: u64, reached: bool) {
        self.lock().quiet.answered(seq, reached);
    }

    /// Whether `event` is known to be reached (see [`quiet::Quiet`]).
    pub fn event_reached(&self, event: proto::Handle) -> bool {
        let conn = self.lock();
        !conn.dead && conn.quiet.reached(event)
    }

    /// Whether calls travel over a socket (a server across a network,
    /// maybe) rather than through shared memory.
    pub fn on_socket(&self) -> bool {
        !self.lock().uses_shm()
    }

    /// The streams that may have work left on the device (see
    /// [`quiet::Quiet`]), unless the connection is lost.
    pub fn busy_streams(&self) -> Option<Vec<proto::Handle>> {
        let conn = self.lock();
        (!conn.dead).then(|| conn.quiet.busy())
    }

    /// The streams this link sent work for since the last time they were
    /// taken (a context synchronize polls those alone).
    pub fn take_touched(&self) -> std::collections::HashSet<proto::Handle> {
        self.lock().touched.take()
    }

    /// Sends a call whose byte buffer, left empty in `call`, is `bytes`
    /// (through shared memory it is copied once, straight into the bulk ring).
    pub fn call_with_bytes(&self, call: Call, bytes: &[u8]) -> CuResult<ReplyBody> {
        self.lock().call_with_bytes(call, bytes)
    }

    /// A call that carries a descriptor (`Call::carries_fd`): `fd`
    /// follows it on the socket.
    pub fn call_with_fd(&self, call: Call, fd: BorrowedFd<'_>) -> CuResult<ReplyBody> {
        self.lock().call_with_fd(call, fd)
    }

    /// A call whose successful reply brings a descriptor (`Call::returns_fd`).
    pub fn call_for_fd(&self, call: Call) -> CuResult<(ReplyBody, OwnedFd)> {
        self.lock().call_for_fd(call)
    }

    /// Makes a call answered with exactly `out.len()` bytes of data, received
    /// into `out` (through shared memory straight from the bulk ring).
    pub fn call_into(&self, call: Call, out: &mut [u8]) -> CuResult<()> {
        self.lock().call_into(call, out)
    }

    /// The calls `call(offset, chunk)` makes for the chunks of `bytes` (each
    /// at its byte offset), each with its chunk as its byte buffer, all
    /// answered (see [`Connection::calls_with_chunks`]).
    pub fn calls_with_chunks(
        &self,
        bytes: &[u8],
        call: impl Fn(u64, &[u8]) -> Call,
    ) -> CuResult<()> {
        self.lock().calls_with_chunks(bytes, call)
    }

    /// The calls `call(offset, chunk)` makes for the chunks of `out`, each
    /// answered with its chunk's bytes, received into it.
    pub fn calls_into_chunks(
        &self,
        out: &mut [u8],
        call: impl Fn(u64, &[u8]) -> Call,
    ) -> CuResult<()> {
        self.lock().calls_into_chunks(out, call)
    }
}

/// Bytes of one chunk of a large copy on a socket: smaller than the bulk
/// ring's frames, so that chunks sent back to back keep the copies on both
/// ends in cache and overlap them with the network. Under the server's mmap
/// threshold (`server::freed_memory`, 4 MiB), so that each chunk's buffer
/// there is reused from its arenas, not mapped and faulted in afresh: 8 MiB
/// chunks halved 16 and 256 MiB copies over loopback TCP
/// (`bench/results/2026-11-28-cpu-tcp-chunks-ab.txt`).
pub(crate) const SOCKET_CHUNK_BYTES: usize = 1 << 20;

/// What the server said at connect.
pub struct Session {
    pub server: String,
    pub session: u64,
    pub devices: Vec<DeviceInfo>,
    /// The program's group key (`Join::group`).
    pub group: u64,
    /// The session's resume key (0: none) and, for a resumed session, the
    /// first call to send again.
    pub resume: u64,
    pub resume_from: u64,
    /// Lanes the server offered (TCP).
    pub lanes: Option<proto::LaneOffer>,
}

impl Connection {
    /// Opens a session at `address`: the program's first (`join: None`, on
    /// its first device) or one for another of its devices.
    /// `visible` is the hello's `CUDA_VISIBLE_DEVICES` (which of the
    /// tenant's devices there the program sees, in its order).
    pub fn connect(
        address: &ServerAddress,
        join: Option<proto::Join>,
        visible: Option<String>,
    ) -> Result<(Connection, Session), String> {
        // Only a program's first connection resumes: one of several devices
        // cannot move anyway.
        let resumable = join.is_none() && resume::wanted();
        let offer = resumable.then_some(0);
        let (mut conn, session) =
            Connection::hello(address, ClientRole::Driver, join, visible.clone(), offer)
                .map_err(|(why, _)| why)?;
        if resumable {
            if session.resume == 0 {
                tracing::warn!(
                    "{}=1, but the server at {address} gave no resume key: the program's \
                     session cannot be resumed elsewhere",
                    resume::ENV
                );
            } else {
                conn.resume = Some(Resume::new(session.resume, address.clone(), join, visible));
            }
        }
        // A resumable connection keeps its calls to send again: on one socket.
        if let (Some(offer), None) = (session.lanes, &conn.resume) {
            let count = lane_streams::wanted(&offer);
            conn.lanes = lane_streams::LaneState::open(address, session.session, offer, count);
        }
        Ok((conn, session))
    }

    /// Every device a program of this tenant may use at `address`, asked
    /// without opening a session there (a preflight hello).
    pub fn devices_at(address: &ServerAddress) -> Result<Session, String> {
        Connection::hello(address, ClientRole::Preflight, None, None, None)
            .map(|(_, session)| session)
            .map_err(|(why, _)| why)
    }

    /// A hello and its answer. `Err((why, again))`: `again` where trying
    /// again later may succeed (nobody listens yet, or the link broke).
    fn hello(
        address: &ServerAddress,
        role: ClientRole,
        join: Option<proto::Join>,
        visible: Option<String>,
        resume: Option<u64>,
    ) -> Result<(Connection, Session), (String, bool)> {
        let address = address.clone();
        let stream = Stream::connect(&address).map_err(|e| match e {
            ConnectError::Unreachable(e) => (
                format!("cannot reach the cumux server at {address}: {e}"),
                true,
            ),
            ConnectError::Tls(why) => (why, false),
        })?;
        let unix = stream.unix().and_then(|u| u.try_clone().ok());
        let mut conn = Connection {
            wire: Arc::new(Mutex::new(Wire {
                stream,
                failed: None,
            })),
            unix,
            shm: None,
            seq: 0,
            unanswered: 0,
            fence_pending: None,
            touched: touched::Touched::default(),
            quiet: quiet::Quiet::default(),
            buf: Vec::new(),
            dead: false,
            fatal: None,
            batch: batch::Batch::new(batch::batch_age()),
            me: Weak::new(),
            resume: None,
            lanes: Default::default(),
        };
        let area = match role {
            ClientRole::Driver => offered_area(&address),
            _ => None,
        };
        let argv0 = std::env::args().next().unwrap_or_default();
        let program = proto::cut_to(&argv0, proto::MAX_PROGRAM_BYTES).to_string();
        let hello = Hello {
            magic: proto::MAGIC,
            version: proto::PROTOCOL_VERSION,
            pid: std::process::id(),
            role,
            program,
            tenant: std::env::var("CUMUX_TENANT").ok(),
            token: std::env::var("CUMUX_TOKEN").ok(),
            shm: area.is_some(),
            visible_devices: visible,
            join,
            resume,
            lane: None,
        };
        let broken = |e: &dyn std::fmt::Display| (format!("handshake: {e}"), true);
        let bytes = proto::encode(&hello).map_err(|e| (e.to_string(), false))?;
        {
            let mut wire = locked(&conn.wire);
            proto::write_frame(&mut wire.stream, &bytes).map_err(|e| broken(&e))?;
            proto::read_frame(&mut wire.stream, &mut conn.buf).map_err(|e| broken(&e))?;
        }
        // A welcome of another version may have another shape: its variant
        // and version lead it, so read them first.
        if let Ok((0u32, version)) = proto::decode::<(u32, u32)>(&conn.buf) {
            if version != proto::PROTOCOL_VERSION {
                return Err((
                    format!(
                        "protocol version mismatch: client {}, server {version}",
                        proto::PROTOCOL_VERSION
                    ),
                    false,
                ));
            }
        }
        let reply = proto::decode::<HelloReply>(&conn.buf)
            .map_err(|e| (format!("handshake: {e}"), false))?;
        match reply {
            HelloReply::Welcome {
                version: _,
                server,
                session,
                devices,
                shm,
                group,
                resume,
                resume_from,
                lanes,
            } => {
                match (shm, area) {
                    (true, Some(area)) => conn.attach(area).map_err(|why| (why, true))?,
                    (_, Some(_)) => {
                        tracing::debug!(
                            "the server takes no shared memory; calls go over the socket"
                        )
                    }
                    _ => {}
                }
                Ok((
                    conn,
                    Session {
                        server,
                        session,
                        devices,
                        group,
                        resume,
                        resume_from,
                        lanes,
                    },
                ))
            }
            HelloReply::Rejected {
                server_version,
                reason,
            } => Err((
                proto::refusal_text(
                    &address.to_string(),
                    server_version,
                    hello.tenant.as_deref(),
                    &reason,
                ),
                false,
            )),
        }
    }

    /// Hands the server the shared area (its memfd over the socket) and, if it
    /// takes it, moves calls there. A refusal leaves them on the socket; only a
    /// broken socket is an error.
    fn attach(&mut self, area: (ShmArea, OwnedFd)) -> Result<(), String> {
        let (area, fd) = area;
        let unix = match self.unix.as_ref() {
            Some(unix) => unix
                .try_clone()
                .map_err(|e| format!("cannot clone the socket: {e}"))?,
            None => return Err("shared memory over a TCP connection".into()),
        };
        let attach = proto::encode(&ShmAttach {
            layout: area.layout(),
        })
        .map_err(|e| e.to_string())?;
        let mut frame = (attach.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&attach);
        shm::send_with_fd(&unix, &frame, fd.as_fd()).map_err(|e| format!("handshake: {e}"))?;
        drop(fd);
        proto::read_frame(&mut &unix, &mut self.buf).map_err(|e| format!("handshake: {e}"))?;
        let answer: ShmAttached =
            proto::decode(&self.buf).map_err(|e| format!("handshake: {e}"))?;
        match answer.result {
            Ok(()) => {
                self.shm = Some(Endpoint::new(
                    area,
                    Side::Client,
                    Some(unix.into()),
                    shm::answer_spin_from_env(),
                ));
                tracing::debug!("calls go through shared memory");
            }
            Err(why) => {
                tracing::debug!(
                    "the server refused shared memory ({why}); calls go over the socket"
                )
            }
        }
        Ok(())
    }

    /// Whether calls travel through shared memory.
    pub fn uses_shm(&self) -> bool {
        self.shm.is_some()
    }

    fn lost(&mut self, why: impl std::fmt::Display) -> CUresult {
        // A thread being torn down (the program is ending) only finds the
        // server gone; every later call fails with the code anyway.
        if !self.dead && teardown::thread_ending() {
            tracing::debug!("connection to the cumux server lost while the thread ends: {why}");
        } else if !self.dead {
            tracing::error!("connection to the cumux server lost: {why}");
        }
        self.dead = true;
        self.batch.clear();
        self.lanes.close();
        // Tells a server still there at once (closed flag and doorbell).
        self.shm = None;
        locked(&self.wire).stream.shutdown();
        CUDA_ERROR_DEVICE_UNAVAILABLE
    }

    /// Sends one request; `bytes`, when given, is the call's byte buffer (left
    /// empty in `call`), sent from where it lies. A resumable connection
    /// keeps it until it is answered, and resumes where the link is lost.
    fn send(&mut self, seq: u64, call: Call, bytes: Option<&[u8]>) -> CuResult<()> {
        self.quiet.sent(seq, &call);
        if let Some(resume) = self.resume.as_mut() {
            let mut kept = call.clone();
            if let Some(b) = bytes {
                shm::put_call_bulk(&mut kept, b.to_vec()).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
            }
            resume.keep(seq, kept);
        }
        match self.transmit(seq, call, bytes) {
            Ok(()) => Ok(()),
            Err(Sending::Invalid) => Err(CUDA_ERROR_INVALID_VALUE),
            // Resumed: the call was sent again with the others kept.
            Err(Sending::Lost(why)) => self.recover(why),
        }
    }

    /// Writes one request to the link.
    fn transmit(&mut self, seq: u64, mut call: Call, bytes: Option<&[u8]>) -> Result<(), Sending> {
        match (self.shm.as_mut(), bytes) {
            (Some(ep), bytes) => {
                // A large byte buffer goes through the bulk ring, not the encoder.
                let owned;
                let bulk: &[u8] = match bytes {
                    Some(b) if b.len() >= shm::BULK_THRESHOLD => b,
                    Some(b) => {
                        shm::put_call_bulk(&mut call, b.to_vec()).map_err(|_| Sending::Invalid)?;
                        &[]
                    }
                    None => {
                        owned = shm::take_call_bulk(&mut call);
                        &owned
                    }
                };
                let msg = proto::encode(&Request { seq, call }).map_err(|_| Sending::Invalid)?;
                ep.send(&msg, bulk)
                    .map_err(|e| Sending::Lost(e.to_string()))?;
            }
            (None, bytes) => {
                if let Some(why) = locked(&self.wire).failed.take() {
                    return Err(Sending::Lost(why));
                }
                let forget = call.is_fire_and_forget();
                // The bytes go in a bulk frame of their own, written from
                // where they lie.
                let owned;
                let bulk: &[u8] = match bytes {
                    Some(b) => b,
                    None => {
                        owned = shm::take_call_bulk(&mut call);
                        &owned
                    }
                };
                let msg = proto::encode(&Request { seq, call }).map_err(|_| Sending::Invalid)?;
                let lost = |e: std::io::Error| Sending::Lost(e.to_string());
                if bulk.len() > batch::BATCH_BYTES {
                    // Large data goes from where it lies, after what waits.
                    let mut wire = locked(&self.wire);
                    self.batch.flush(&mut wire.stream).map_err(lost)?;
                    proto::write_message(&mut wire.stream, &msg, bulk)
                        .map_err(|e| Sending::Lost(e.to_string()))?;
                    return Ok(());
                }
                let started = self.batch.push(&msg, bulk).map_err(|_| Sending::Invalid)?;
                // A call that waits takes the batch with it; an unanswered
                // one goes once the batch is due, else the flusher sends it.
                // A connection no link holds (no flusher can reach it)
                // writes each call at once.
                let watched = || match self.batch.due_at() {
                    Some(due) => batch::watch(self.me.clone() as Weak<dyn batch::Flush>, due),
                    None => false,
                };
                if !forget || self.batch.due() || self.me.strong_count() == 0 {
                    self.batch
                        .flush(&mut locked(&self.wire).stream)
                        .map_err(lost)?;
                } else if started && !watched() {
                    // No flusher thread: nothing would write it later.
                    self.batch
                        .flush(&mut locked(&self.wire).stream)
                        .map_err(lost)?;
                }
            }
        }
        Ok(())
    }

    /// A lost link, resumed where the program asked for it: a new
    /// connection to where its session is now, a hello with its resume key,
    /// and every call kept from where the session resumes sent again. Tried
    /// for [`resume::patience`]; else (or not resumable) the connection is dead.
    fn recover(&mut self, why: impl std::fmt::Display) -> CuResult<()> {
        let Some(resume) = self.resume.as_ref().filter(|_| !self.dead) else {
            return Err(self.lost(why));
        };
        let address = resume.address.clone();
        let patience = resume::patience();
        tracing::warn!(
            "lost the connection to the cumux server at {address} ({why}); reconnecting to \
             resume the program's session, for up to {patience:?}"
        );
        self.shm = None;
        self.batch.clear();
        locked(&self.wire).stream.shutdown();
        let deadline = std::time::Instant::now() + patience;
        let mut tries = 0u32;
        loop {
            let Some(resume) = self.resume.as_ref() else {
                return Err(self.lost("no way to resume"));
            };
            let (address, join, visible, key) = (
                resume.address.clone(),
                resume.join,
                resume.visible.clone(),
                resume.key,
            );
            let failure =
                match Connection::hello(&address, ClientRole::Driver, join, visible, Some(key)) {
                    Ok((fresh, session)) => match self.take_over(fresh, &session) {
                        Ok(sent) => {
                            tracing::warn!(
                                "resumed the program's session on the cumux server at {address} \
                             (session {}): {sent} calls sent again",
                                session.session
                            );
                            return Ok(());
                        }
                        Err(failure) => failure,
                    },
                    Err(failure) => failure,
                };
            match failure {
                (why, true) if std::time::Instant::now() < deadline => {
                    tries += 1;
                    if tries.is_multiple_of(50) {
                        tracing::warn!(
                            "no cumux server to resume at {address} yet ({why}); still trying"
                        );
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                (why, _) => {
                    self.resume = None;
                    return Err(self.lost(format!(
                        "cannot resume the program's session at {address}: {why}"
                    )));
                }
            }
        }
    }

    /// Calls go over `fresh`'s link from now on, starting with those the
    /// resumed session wants again: how many. `Err((why, again))` as for a hello.
    fn take_over(&mut self, fresh: Connection, session: &Session) -> Result<usize, (String, bool)> {
        self.wire = fresh.wire;
        self.unix = fresh.unix;
        self.shm = fresh.shm;
        let last = self.seq;
        let again = match self.resume.as_ref() {
            Some(resume) => resume
                .from(session.resume_from, last)
                .map_err(|why| (why, false))?,
            None => return Err(("no way to resume".into(), false)),
        };
        let count = again.len();
        for (seq, call) in again {
            match self.transmit(seq, call, None) {
                Ok(()) => {}
                Err(Sending::Invalid) => {
                    return Err(("a kept call cannot be encoded".into(), false))
                }
                Err(Sending::Lost(why)) => return Err((why, true)),
            }
        }
        Ok(count)
    }

    /// Follows a session that moved to the server at `address`.
    fn follow(&mut self, address: &str) -> CuResult<()> {
        let parsed = proto::address::parse(address);
        match (self.resume.as_mut(), parsed) {
            (Some(resume), Ok(to)) => {
                tracing::warn!("the program's session moved to the cumux server at {to}");
                resume.address = to;
                self.recover(format_args!("the session moved to {address}"))
            }
            (_, Err(why)) => Err(self.lost(format!("the session moved to {address}: {why}"))),
            (None, _) => Err(self.lost(format!(
                "the session moved to {address}, and this connection cannot resume it"
            ))),
        }
    }

    /// Sends a call; waits for its reply unless it is fire-and-forget (then
    /// `Unit` comes back at once).
    pub fn call(&mut self, call: Call) -> CuResult<ReplyBody> {
        self.call_with(call, None)
    }

    /// A call whose byte buffer (empty in `call`: `MemcpyHtoD`'s data,
    /// `ModuleLoad`'s image, `Launch`'s parameters) is `bytes`. Through shared
    /// memory a large one goes straight from the program's memory to the bulk ring.
    pub fn call_with_bytes(&mut self, call: Call, bytes: &[u8]) -> CuResult<ReplyBody> {
        self.call_with(call, Some(bytes))
    }

    fn call_with(&mut self, call: Call, bytes: Option<&[u8]>) -> CuResult<ReplyBody> {
        if self.dead {
            return Err(CUDA_ERROR_DEVICE_UNAVAILABLE);
        }
        let forget = call.is_fire_and_forget();
        if forget {
            if let Some(code) = self.fatal {
                return Err(code);
            }
            self.touched.note(&call);
        }
        let kind: &'static str = (&call).into();
        // Timed only when the caller waits (see `proto::SLOW_CALL_US`).
        let started = (!forget).then(std::time::Instant::now);
        self.seq += 1;
        let seq = self.seq;
        hop_trace::mark(Hop::ClientSend, kind);
        self.send(seq, call, bytes)?;
        if forget {
            self.unanswered += 1;
            let full = self.resume.as_ref().is_some_and(Resume::full);
            let window = match self.shm.is_some() || self.resume.is_some() {
                true => proto::FENCE_EVERY,
                false => SOCKET_FENCE_EVERY,
            };
            if self.unanswered >= window || full {
                // A program that never synchronizes is held as NVIDIA's driver
                // holds it: until the server has taken every call so far; on
                // a socket, up to the fence before this one, so that the
                // link's round trip is not paid every window.
                self.unanswered = 0;
                if self.shm.is_some() || self.resume.is_some() {
                    self.call_with(Call::Fence, None)?;
                } else {
                    self.pipelined_fence()?;
                }
            }
            return Ok(ReplyBody::Unit);
        }
        self.unanswered = 0;
        loop {
            let reply = self.next_reply()?;
            if let Some(result) = self.answer(seq, reply) {
                hop_trace::mark(Hop::ClientAnswer, kind);
                let us = started.map_or(0, |t| t.elapsed().as_micros());
                if us > proto::SLOW_CALL_US {
                    tracing::debug!(target: "cumux::slow", seq, us, kind, "client: slow call");
                }
                return result;
            }
        }
    }

    /// Waits for the fence sent a window ago, if its answer is not in yet,
    /// then sends one for the calls so far without waiting for it.
    fn pipelined_fence(&mut self) -> CuResult<()> {
        while let Some(pending) = self.fence_pending {
            let reply = self.next_reply()?;
            if reply.seq != pending {
                tracing::warn!(
                    "reply for call {} while waiting for fence {pending}",
                    reply.seq
                );
            }
            // A fence's failure is the session's sticky one: the next
            // synchronizing call reports it.
            let _ = self.answer(reply.seq, reply);
        }
        self.seq += 1;
        let seq = self.seq;
        hop_trace::mark(Hop::ClientSend, "Fence");
        self.send(seq, Call::Fence, None)?;
        self.fence_pending = Some(seq);
        Ok(())
    }

    /// A call that carries a descriptor (`Call::carries_fd`), which follows
    /// it on the socket (`SCM_RIGHTS`): shared memory only, where the socket
    /// carries nothing else.
    pub fn call_with_fd(&mut self, call: Call, fd: BorrowedFd<'_>) -> CuResult<ReplyBody> {
        if self.dead {
            return Err(CUDA_ERROR_DEVICE_UNAVAILABLE);
        }
        if self.unix.is_none() || self.shm.is_none() {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        self.seq += 1;
        let seq = self.seq;
        self.send(seq, call, None)?;
        let sent = match self.unix.as_ref() {
            Some(unix) => shm::send_with_fd(unix, &[pinned::FD_TAG], fd),
            None => Err(std::io::Error::other("not a unix socket")),
        };
        if let Err(e) = sent {
            return Err(self.lost(e));
        }
        loop {
            let reply = self.next_reply()?;
            if let Some(result) = self.answer(seq, reply) {
                return result;
            }
        }
    }

    /// A call whose successful reply brings a descriptor (`Call::returns_fd`),
    /// which follows it on the socket: shared memory only.
    pub fn call_for_fd(&mut self, call: Call) -> CuResult<(ReplyBody, OwnedFd)> {
        if self.unix.is_none() || self.shm.is_none() {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let body = self.call(call)?;
        let Some(unix) = self.unix.as_ref() else {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        };
        let mut tag = [0u8; 1];
        let mut fds = Vec::new();
        let _ = unix.set_read_timeout(Some(std::time::Duration::from_secs(10)));
        let got = shm::recv_with_fds(unix.as_fd(), &mut tag, 0, &mut fds);
        let _ = unix.set_read_timeout(None);
        match got {
            Ok(1) if tag[0] == pinned::FD_TAG && fds.len() == 1 => Ok((body, fds.remove(0))),
            Ok(_) => Err(CUDA_ERROR_UNKNOWN),
            Err(e) => Err(self.lost(e)),
        }
    }

    /// A call answered with `Data` of exactly `out.len()` bytes (`MemcpyDtoH`),
    /// received into `out`: straight from the bulk ring through shared
    /// memory, straight from the bulk frame on a socket.
    pub fn call_into(&mut self, call: Call, out: &mut [u8]) -> CuResult<()> {
        if self.dead {
            return Err(CUDA_ERROR_DEVICE_UNAVAILABLE);
        }
        if call.is_fire_and_forget() {
            return match self.call(call)? {
                ReplyBody::Data(d) if d.len() == out.len() => {
                    out.copy_from_slice(&d);
                    Ok(())
                }
                _ => Err(CUDA_ERROR_UNKNOWN),
            };
        }
        self.seq += 1;
        let seq = self.seq;
        let kind: &'static str = (&call).into();
        hop_trace::mark(Hop::ClientSend, kind);
        self.send(seq, call, None)?;
        let result = match self.shm {
            Some(_) => self.receive_into(seq, out),
            None => self.receive_from_socket_into(seq, out),
        };
        hop_trace::mark(Hop::ClientAnswer, kind);
        result
    }

    /// The rest of [`Connection::call_into`] through shared memory: `seq`'s
    /// answer, its bytes into `out`.
    fn receive_into(&mut self, seq: u64, out: &mut [u8]) -> CuResult<()> {
        loop {
            let Some(ep) = self.shm.as_mut() else {
                // Resumed over a socket.
                return self.receive_from_socket_into(seq, out);
            };
            let bulk_len = match ep.recv_message(&mut self.buf) {
                Ok(n) => n,
                Err(e) => {
                    self.recover(e)?;
                    continue;
                }
            };
            let mut reply: Reply = match proto::decode(&self.buf) {
                Ok(r) => r,
                Err(e) => return Err(self.lost(format!("malformed reply: {e}"))),
            };
            let direct = reply.seq == seq
                && bulk_len == out.len()
                && matches!(&reply.result, Ok(ReplyBody::Data(d)) if d.is_empty());
            let received = if direct {
                ep.recv_bulk_into(out)
            } else {
                let mut bulk = Vec::new();
                ep.recv_bulk_vec(&mut bulk, bulk_len)
                    .and_then(|()| shm::put_reply_bulk(&mut reply, bulk))
            };
            if let Err(e) = received {
                self.recover(e)?;
                continue;
            }
            if let Some(result) = self.landed(seq, reply, direct, out) {
                return result;
            }
        }
    }

    /// What `seq`'s answer to a call answered into `out` says (its bytes
    /// already there where `direct`): `None` for a stray reply.
    fn landed(
        &mut self,
        seq: u64,
        reply: Reply,
        direct: bool,
        out: &mut [u8],
    ) -> Option<CuResult<()>> {
        Some(match self.answer(seq, reply)? {
            Err(e) => Err(e),
            Ok(ReplyBody::Data(d)) if direct && d.is_empty() => Ok(()),
            Ok(ReplyBody::Data(d)) if d.len() == out.len() => {
                out.copy_from_slice(&d);
                Ok(())
            }
            Ok(_) => Err(CUDA_ERROR_UNKNOWN),
        })
    }

    /// Reads the answers of calls `first..=self.seq`, in order; the first
    /// failure, once all are read.
    fn answers(&mut self, first: u64) -> CuResult<()> {
        let mut failed = None;
        for seq in first..=self.seq {
            loop {
                let reply = self.next_reply()?;
                if let Some(result) = self.answer(seq, reply) {
                    if let Err(e) = result {
                        failed = failed.or(Some(e));
                    }
                    break;
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// [`Connection::call_into`] on the socket: `seq`'s answer, its bulk
    /// frame read straight into `out`.
    fn receive_from_socket_into(&mut self, seq: u64, out: &mut [u8]) -> CuResult<()> {
        loop {
            if self.shm.is_some() {
                // Resumed through shared memory.
                return self.receive_into(seq, out);
            }
            let (reply, direct) = match self.socket_reply(Some((seq, &mut *out))) {
                Ok(got) => got,
                Err(why) => {
                    self.recover(why)?;
                    continue;
                }
            };
            if let Some(result) = self.landed(seq, reply, direct, out) {
                return result;
            }
        }
    }

    /// The next reply on the socket, its bulk frame put back into it; or,
    /// where it is `into`'s call's data of exactly the length of its buffer,
    /// read into that buffer instead (then `true`).
    fn socket_reply(&mut self, into: Option<(u64, &mut [u8])>) -> Result<(Reply, bool), String> {
        let mut wire = locked(&self.wire);
        let bulk_len =
            proto::read_message(&mut wire.stream, &mut self.buf).map_err(|e| e.to_string())?;
        let mut reply: Reply =
            proto::decode(&self.buf).map_err(|e| format!("malformed reply: {e}"))?;
        let Some(len) = bulk_len else {
            return Ok((reply, false));
        };
        match into {
            Some((seq, out))
                if reply.seq == seq
                    && len == out.len()
                    && matches!(&reply.result, Ok(ReplyBody::Data(d)) if d.is_empty()) =>
            {
                std::io::Read::read_exact(&mut wire.stream, out).map_err(|e| e.to_string())?;
                Ok((reply, true))
            }
            _ => {
                let bulk = proto::read_bulk(&mut wire.stream, len).map_err(|e| e.to_string())?;
                shm::put_reply_bulk(&mut reply, bulk).map_err(|e| e.to_string())?;
                Ok((reply, false))
            }
        }
    }

    /// What a reply says for call `seq`: `None` for a stray reply (skipped).
    /// Its device `printf` output goes to the program's stdout either way.
    fn answer(&mut self, seq: u64, reply: Reply) -> Option<CuResult<ReplyBody>> {
        write_program_stdout(&reply.stdout);
        if let Ok(ReplyBody::Moved { address }) = &reply.result {
            // The session went to another server: the call is answered there.
            return self.follow(&address.clone()).err().map(Err);
        }
        if let Some(resume) = self.resume.as_mut() {
            resume.answered(reply.seq);
        }
        self.quiet.answered(reply.seq, reply.result.is_ok());
        if self.fence_pending == Some(reply.seq) {
            // The fence sent without waiting (`pipelined_fence`).
            self.fence_pending = None;
            if reply.seq != seq {
                return None;
            }
        }
        if reply.seq != seq {
            tracing::warn!(
                "reply for call {} while waiting for {seq}; skipped",
                reply.seq
            );
            return None;
        }
        if let Err(e) = &reply.result {
            if proto::codes::is_fatal(e.code) {
                self.fatal = Some(e.code);
            }
        }
        Some(reply.result.map_err(|e| {
            tracing::debug!("server: {e}");
            let _ = LAST_ERROR.try_with(|last| last.replace(e.detail.clone()));
            if e.code == 0 {
                CUDA_ERROR_UNKNOWN
            } else {
                e.code
            }
        }))
    }

    /// Receives the next reply (on a resumed link, where the link was lost).
    fn next_reply(&mut self) -> CuResult<Reply> {
        loop {
            let got = match self.shm.as_mut() {
                None => self.socket_reply(None).map(|(reply, _)| reply),
                Some(ep) => shm_reply(ep, &mut self.buf),
            };
            match got {
                Ok(reply) => return Ok(reply),
                Err(why) => self.recover(why)?,
            }
        }
    }
}

/// The next reply through the shared area.
fn shm_reply(ep: &mut Endpoint, buf: &mut Vec<u8>) -> Result<Reply, String> {
    let mut bulk = Vec::new();
    ep.recv(buf, &mut bulk).map_err(|e| e.to_string())?;
    let mut reply: Reply = proto::decode(buf).map_err(|e| format!("malformed reply: {e}"))?;
    shm::put_reply_bulk(&mut reply, bulk).map_err(|e| e.to_string())?;
    Ok(reply)
}

extern "C" {
    /// The C library's `stdout` stream of the program.
    static mut stdout: *mut libc::FILE;
}

/// Device `printf` output goes to the program's own standard output through
/// its C `stdout` stream (so it lands after what the program printed before
/// the kernel, as with NVIDIA's driver), flushed at once.
fn write_program_stdout(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let _ = std::io::stdout().flush();
    // SAFETY: reading the C library's `stdout` pointer, which it initialises
    // before any program code runs; fwrite/fflush lock the stream themselves.
    unsafe {
        let out = stdout;
        if out.is_null() {
            return;
        }
        libc::fwrite(bytes.as_ptr().cast(), 1, bytes.len(), out);
        libc::fflush(out);
    }
}

mod batch;
mod chunks;
mod flushing;
mod lane_copies;
mod lane_streams;
mod quiet;
#[cfg(test)]
mod test_calls;
mod touched;

#[cfg(test)]
mod tests;
