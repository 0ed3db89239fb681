//! Every message that crosses the wire: the handshake, calls and their replies.
//! Calls that are stream-ordered get no reply; their failures are sticky on the session.

use serde::{Deserialize, Serialize};

/// Bytes of a session image one `Data` reply or [`Call::ImageWrite`] carries
/// at most: a larger image travels in pieces.
pub const IMAGE_PIECE_BYTES: usize = 32 << 20;

/// A device pointer in the server's device address space.
pub type DevicePtr = u64;

/// A server-issued handle (stream, event, module, function). 0 is never issued.
pub type Handle = u64;

/// The default (legacy/null) stream of the session.
pub const DEFAULT_STREAM: Handle = 0;

/// Where a session's handles start: the session for a program's device `n`
/// (its [`Join::device`]; 0 for the first connection) issues them upward from
/// `first_handle(n)`, well clear of 0 (the default stream) and CUDA's special
/// stream values 1 and 2, so a program's handles of two devices never meet
/// and the client tells a handle's device by [`device_of_handle`].
pub const fn first_handle(device: u32) -> Handle {
    0x100 + ((device as Handle) << HANDLE_DEVICE_SHIFT)
}

/// Handles of one session stay below `1 << HANDLE_DEVICE_SHIFT` past their first.
pub const HANDLE_DEVICE_SHIFT: u32 = 36;

/// Streams one session may have at once (besides the default one).
pub const MAX_STREAMS: usize = 512;

/// Where a device's client-minted handles ([`Call::NewStream`],
/// [`Call::NewEvent`]) start: the upper half of its session's range, which
/// the handles the server issues never reach.
pub const MINTED_OFFSET: Handle = 1 << (HANDLE_DEVICE_SHIFT - 1);

/// The `n`th handle a client mints for its device `device`, if there is one.
pub const fn minted_handle(device: u32, n: u64) -> Option<Handle> {
    if n >= MINTED_OFFSET - 0x100 {
        return None;
    }
    Some(first_handle(device) + MINTED_OFFSET + n)
}

/// Whether `handle` lies in the minted range of the session for `device`.
pub const fn is_minted(device: u32, handle: Handle) -> bool {
    let base = first_handle(device) + MINTED_OFFSET;
    handle >= base && handle < base + (MINTED_OFFSET - 0x100)
}

/// The program's device whose session issued `handle`.
pub const fn device_of_handle(handle: Handle) -> u32 {
    (handle >> HANDLE_DEVICE_SHIFT) as u32
}

/// Sent first by every client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// First of every hello of every version, with `version`; a hello's frame
    /// has at most [`MAX_HELLO_BYTES`], its `program` at most
    /// [`MAX_PROGRAM_BYTES`] (a longer one is cut by the client, refused by
    /// the server).
    pub magic: u32,
    pub version: u32,
    pub pid: u32,
    /// What the client is: a program's driver, or the CLI asking for status.
    pub role: ClientRole,
    /// Program name, for logs and `cumux status`.
    pub program: String,
    /// Tenant asked for with `cumux run --tenant NAME`.
    pub tenant: Option<String>,
    /// A tenant's (or the server's admin) token (`CUMUX_TOKEN`): over TCP the
    /// only proof of who a client is. At most [`MAX_TOKEN_BYTES`].
    pub token: Option<String>,
    /// The client holds a shared-memory area ([`crate::shm`]) and, if the
    /// welcome accepts it, sends it next in a [`ShmAttach`] (unix sockets only).
    pub shm: bool,
    /// The program's `CUDA_VISIBLE_DEVICES`, as written (at most
    /// [`crate::visible_devices::MAX_TEXT_BYTES`]): the server shows it
    /// those of its tenant's devices, in that order.
    pub visible_devices: Option<String>,
    /// A further connection of a program already connected, for another of
    /// its devices; `None`: the program's first connection, on its first
    /// device.
    pub join: Option<Join>,
    /// Whether, and as what, the program's session may be resumed after its
    /// connection is lost (`CUMUX_RESUME=1`): `None`, it may not; `Some(0)`,
    /// a new session whose client keeps its unanswered calls and can send
    /// them again; `Some(key)`, the session parked under the resume key its
    /// first welcome gave (protocol 18).
    pub resume: Option<u64>,
    /// A lane of a session this program opened on another connection
    /// ([`ClientRole::Lane`]; protocol 29).
    pub lane: Option<LaneJoin>,
}

/// What a lane's hello says: the session it joins and the key that session's
/// welcome gave ([`LaneOffer`]), and which of its lanes it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneJoin {
    pub session: u64,
    pub key: [u8; 16],
    pub index: u32,
}

/// A welcome's offer of lanes: further TCP connections of the same session
/// that carry large copies' bytes beside the first (several TLS streams move
/// more than one), joined with this key, at most `most` of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneOffer {
    pub key: [u8; 16],
    pub most: u32,
}

/// What a program's further connection says: which of its devices it is for,
/// and the group its first welcome on this server gave it (a program is one
/// group per server: its contexts there share one address space, so its
/// pointers of two devices never alias and its devices reach each other's
/// memory where the hardware can).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Join {
    /// The key of the program's first welcome from this server
    /// ([`HelloReply::Welcome`]'s `group`); [`NEW_GROUP`] where this is its
    /// first connection to this server but not to every server (a program
    /// on several servers).
    pub group: u64,
    /// The device, numbered as this server's welcome lists them.
    pub device: u32,
    /// The same device as the program numbers its devices (every server's
    /// together): the session's handles and device numbers in calls.
    pub ordinal: u32,
}

/// [`Join::group`] of a program's first connection to one of its servers.
pub const NEW_GROUP: u64 = 0;

/// The largest hello frame a server reads.
pub const MAX_HELLO_BYTES: usize = 4 << 10;
/// The longest program name a hello may carry (bytes).
pub const MAX_PROGRAM_BYTES: usize = 256;
/// The longest token a hello may carry (bytes).
pub const MAX_TOKEN_BYTES: usize = 256;

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn cut_to(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Sent by the client right after a welcome that accepted shared memory, with
/// the area's memfd attached (`SCM_RIGHTS`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShmAttach {
    pub layout: crate::shm::ShmLayout,
}

/// The server's answer to [`ShmAttach`]: `Ok`, and from now on calls and
/// replies travel through the area; `Err(why)`, and they stay on the socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShmAttached {
    pub result: Result<(), String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientRole {
    Driver,
    Status,
    /// `cumux run` asking, before it starts a program, whether a driver with
    /// this hello would be let in: the server answers with the welcome such a
    /// driver would get (session 0, the tenant's devices) or with the
    /// refusal, and closes; no session opens.
    Preflight,
    /// `cumux run --pool` holding the devices it placed a program on (the
    /// hello's `visible_devices`; its `pid` is the program's) until the
    /// program opens a session or `cumux run` ends: answered as a preflight,
    /// the connection then stays open and carries nothing. Placements made
    /// meanwhile count it ([`DeviceStatus::claims`]).
    Claim,
    /// A lane of a program's session ([`Hello::lane`]): answered with a
    /// welcome of that session (no devices), it then carries the frames of
    /// copies that [`Call::Lanes`] sends its way.
    Lane,
}

/// The server's answer to `Hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum HelloReply {
    Welcome {
        version: u32,
        server: String,
        session: u64,
        devices: Vec<DeviceInfo>,
        /// The server takes the client's shared-memory area: a [`ShmAttach`] follows.
        shm: bool,
        /// The key a further connection of the same program names in its
        /// [`Join`]; 0 where none may join (status, preflight).
        group: u64,
        /// The session's resume key, for a client that offered to resume
        /// ([`Hello::resume`]); 0: none.
        resume: u64,
        /// On a resumed session, the first call the client must send again
        /// (every earlier one is in the state it resumes); 0 otherwise.
        resume_from: u64,
        /// Lanes the client may open for large copies (TCP only).
        lanes: Option<LaneOffer>,
    },
    Rejected {
        server_version: u32,
        reason: String,
    },
}

/// Everything the client caches about a device at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub ordinal: u32,
    pub name: String,
    pub uuid: [u8; 16],
    /// PCI domain, bus, device.
    pub pci: [u32; 3],
    pub total_mem: u64,
    /// `CUdevice_attribute` number → value, for every attribute the device knows.
    pub attributes: Vec<(u32, i32)>,
    /// Which backend serves it: "cpu" or "cuda".
    pub backend: String,
    /// The devices whose memory its kernels may reach (peer access), by
    /// server ordinal, each with `cuDeviceGetP2PAttribute`'s values 1 ..= 4
    /// (performance rank, access, native atomics, array access).
    pub peers: Vec<(u32, [i32; 4])>,
    /// (minimum, recommended) granularity of its pinned memory for virtual
    /// memory management, where the server could ask the driver without a
    /// context: the client answers `cuMemGetAllocationGranularity` with it,
    /// so a query about a device starts no context there.
    pub vmm_granularity: Option<(u64, u64)>,
}

/// One call from a client. `seq` increases by one per call on a connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub seq: u64,
    pub call: Call,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum Call {
    MemAlloc {
        device: u32,
        bytes: u64,
    },
    MemFree {
        ptr: DevicePtr,
    },
    MemGetInfo {
        device: u32,
    },
    /// Base and size of the allocation containing `ptr`.
    MemAddressRange {
        ptr: DevicePtr,
    },
    /// `stream: None` is a synchronous copy (replied); `Some` is stream-ordered.
    MemcpyHtoD {
        dst: DevicePtr,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        stream: Option<Handle>,
    },
    /// Always replied with the bytes, once the stream has reached the copy.
    MemcpyDtoH {
        src: DevicePtr,
        bytes: u64,
        stream: Option<Handle>,
    },
    MemcpyDtoD {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
        stream: Option<Handle>,
    },
    /// Fills `count` elements of `elem_bytes` (1, 2 or 4) with `value`, row by
    /// row: `height` rows of `count` elements, `pitch` bytes apart.
    Memset {
        dst: DevicePtr,
        value: u32,
        elem_bytes: u8,
        count: u64,
        pitch: u64,
        height: u64,
        stream: Option<Handle>,
    },
    /// Loads a fat binary, cubin or PTX image (NUL-terminated text accepted).
    ModuleLoad {
        #[serde(with = "serde_bytes")]
        image: Vec<u8>,
    },
    ModuleUnload {
        module: Handle,
    },
    /// Stream-ordered; `params` is the packed parameter buffer laid out as the
    /// kernel's parameter info says.
    Launch {
        function: Handle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: Handle,
        #[serde(with = "serde_bytes")]
        params: Vec<u8>,
        /// `cuLaunchKernelEx` attributes the device must honour.
        attributes: Vec<LaunchAttribute>,
    },
    /// Encodes a tensor-memory-access descriptor (`cuTensorMapEncode*`) for
    /// memory of this session; answered by [`ReplyBody::TensorMap`].
    TensorMapEncode {
        request: TensorMapRequest,
    },
    StreamCreate {
        flags: u32,
        priority: i32,
    },
    StreamDestroy {
        stream: Handle,
    },
    StreamSynchronize {
        stream: Handle,
    },
    /// Replied `Unit` when idle, `CUDA_ERROR_NOT_READY` otherwise.
    StreamQuery {
        stream: Handle,
    },
    /// Stream-ordered.
    StreamWaitEvent {
        stream: Handle,
        event: Handle,
    },
    EventCreate {
        flags: u32,
    },
    /// Stream-ordered.
    EventRecord {
        event: Handle,
        stream: Handle,
    },
    EventQuery {
        event: Handle,
    },
    EventSynchronize {
        event: Handle,
    },
    EventElapsed {
        start: Handle,
        end: Handle,
    },
    EventDestroy {
        event: Handle,
    },
    /// Waits for every stream of the session; returns (and clears) a sticky error.
    ContextSynchronize,
    /// For `cumux status`.
    ServerStatus,
    /// Registers `bytes` of pinned host memory at the client's address `base`:
    /// right after this call the client sends the region's sealed memfd on the
    /// socket (`SCM_RIGHTS`, with [`crate::pinned::FD_TAG`]). Answered by
    /// [`ReplyBody::Handle`], the region (shared memory only). `reached`:
    /// the program needs the device to reach the region by `base` itself
    /// (managed memory on a GPU); where it cannot, the region is refused
    /// (`CUDA_ERROR_NOT_SUPPORTED`) rather than kept for copies only.
    HostRegister {
        base: u64,
        bytes: u64,
        reached: bool,
    },
    /// Unregisters a region once the session's work is done (`cuMemFreeHost`).
    HostUnregister {
        region: Handle,
    },
    /// A copy from `bytes` of a registered region at `offset`: no bytes on
    /// the wire. `stream: None` is synchronous (replied); `Some` stream-ordered.
    MemcpyHtoDHost {
        dst: DevicePtr,
        region: Handle,
        offset: u64,
        bytes: u64,
        stream: Option<Handle>,
    },
    /// A copy into a registered region: the bytes land in the program's
    /// buffer. `stream: None` is replied once they are there; with `Some` the
    /// program synchronizes before it reads them, as with CUDA.
    MemcpyDtoHHost {
        src: DevicePtr,
        region: Handle,
        offset: u64,
        bytes: u64,
        stream: Option<Handle>,
    },
    /// A graph of kernel launches, in order (a captured CUDA graph of launches
    /// alone), made once and launched as one piece: answered by a handle.
    GraphCreate {
        launches: Vec<GraphLaunch>,
    },
    /// Runs a graph's launches on `stream`, in order.
    GraphLaunch {
        graph: Handle,
        stream: Handle,
    },
    GraphDestroy {
        graph: Handle,
    },
    /// Virtual memory management: reservations, physical allocations and
    /// their mappings (`crate::vmm`).
    Vmm(crate::vmm::VmmCall),
    /// Lists a tenant, or changes its entry, while the server runs: for an
    /// admin (the server's own uid or root on the unix socket, or the admin
    /// token) only.
    TenantPut {
        name: String,
        spec: TenantSpec,
    },
    /// Takes a tenant off the table (admins only); its sessions run on.
    TenantRemove {
        name: String,
    },
    /// Moves a driver session to the server's device `device` (admins
    /// only), at the session's next call within `wait_ms`; answered once it
    /// moved, or with why it did not (protocol 17).
    SessionMove {
        session: u64,
        device: u32,
        wait_ms: u64,
    },
    /// A checkpoint of a driver session, taken at its next call within
    /// `wait_ms` (admins only): answered by `Data`, the session's image.
    SessionCheckpoint {
        session: u64,
        wait_ms: u64,
        /// Hold the call the checkpoint was taken at unanswered (the image
        /// records it), until [`Call::SessionRelease`] or the server stops:
        /// the state of a session to resume elsewhere (protocol 18).
        hold: bool,
    },
    /// [`Call::SessionCheckpoint`] written by the server into the file whose
    /// descriptor comes with the call (a unix socket's frame carries it):
    /// the checkpoint streamed to disk with no image whole in memory on
    /// either side; answered by `Data`, a line saying what was written
    /// (protocol 24).
    SessionCheckpointFile {
        session: u64,
        wait_ms: u64,
        hold: bool,
    },
    /// [`Call::SessionRestore`] from the checkpoint file whose descriptor
    /// comes with the call, read and checked by the server as it rebuilds
    /// (protocol 24).
    SessionRestoreFile {
        session: u64,
        wait_ms: u64,
    },
    /// Keeps a held checkpoint's image on this server under its resume key
    /// (admins only), for its program's client to resume: answered by
    /// `Data`, a line saying so.
    SessionPark {
        #[serde(with = "serde_bytes")]
        image: Vec<u8>,
    },
    /// A piece of the session image this connection's last checkpoint
    /// staged ([`ReplyBody::ImageStaged`]): `bytes` from `offset`, answered
    /// by `Data` (admins only).
    ImageRead {
        offset: u64,
        bytes: u64,
    },
    /// Appends a piece, at `offset` (the bytes staged so far), to the image
    /// this connection stages for its next `SessionRestore` or `SessionPark`
    /// with an empty image (admins only): images larger than a frame travel
    /// so.
    ImageWrite {
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Ends the hold of a session checkpointed with `hold` (admins only):
    /// `moved_to: None`, it carries on with the held call; `Some(address)`,
    /// its held call is answered with [`ReplyBody::Moved`] and it ends.
    SessionRelease {
        session: u64,
        moved_to: Option<String>,
    },
    /// Replaces a driver session's state by a checkpoint's image (admins
    /// only), at its next call within `wait_ms`.
    SessionRestore {
        session: u64,
        #[serde(with = "serde_bytes")]
        image: Vec<u8>,
        wait_ms: u64,
    },
    /// Answered (`Unit`) once every earlier call of the session is handled.
    /// The client sends one after every [`crate::FENCE_EVERY`] unanswered
    /// calls, so it never runs further ahead of the server than that, and the
    /// server holds a session's launches near its device.
    Fence,
    /// `cuIpcGetMemHandle`: a handle to the allocation holding `ptr` that
    /// another program of the same tenant may open; answered by `Data` of
    /// [`IPC_HANDLE_BYTES`].
    IpcGetMemHandle {
        ptr: DevicePtr,
    },
    /// `cuIpcOpenMemHandle`: maps the allocation `handle` names (another
    /// program's, of this tenant) into this session; answered by `Range`.
    IpcOpenMemHandle {
        #[serde(with = "serde_bytes")]
        handle: Vec<u8>,
        flags: u32,
    },
    /// `cuIpcCloseMemHandle` of memory opened at `ptr`.
    IpcCloseMemHandle {
        ptr: DevicePtr,
    },
    /// `cuIpcGetEventHandle` of an event made interprocess: answered by
    /// `Data` of [`IPC_HANDLE_BYTES`].
    IpcGetEventHandle {
        event: Handle,
    },
    /// `cuIpcOpenEventHandle` of another program's event (of this tenant):
    /// answered by `Handle`, an event of this session.
    IpcOpenEventHandle {
        #[serde(with = "serde_bytes")]
        handle: Vec<u8>,
    },
    /// `cuCtxEnablePeerAccess` (`enable`) or `cuCtxDisablePeerAccess`: this
    /// session's context and the program's session on device `peer` (its
    /// numbering of its devices).
    PeerAccess {
        peer: u32,
        enable: bool,
    },
    /// `cuCtxSetLimit` (stack size, printf buffer, device `malloc` heap, ...),
    /// applied by the device; answered with `Unit`.
    SetLimit {
        limit: u32,
        value: u64,
    },
    /// CUDA arrays, mipmapped arrays, texture and surface objects, and
    /// copies to and from arrays (`crate::arrays`; protocol 19).
    Array(crate::arrays::ArrayCall),
    /// `query` (a `StreamQuery` or `EventQuery`, nothing else) asked again by
    /// the server while it says "not ready", for up to `within_us`
    /// microseconds (at most [`MAX_QUERY_WITHIN_US`]), then answered as the
    /// query: a client across a network polls without a round trip per poll
    /// (protocol 21).
    QueryWithin {
        query: Box<Call>,
        within_us: u32,
    },
    /// A `StreamCreate` under `handle`, which the client chose in its minted
    /// range ([`minted_handle`]): sent without waiting for an answer, so that
    /// making a stream costs no round trip (protocol 22). A failure comes
    /// back from the next synchronizing call, and the handle stays unknown.
    NewStream {
        handle: Handle,
        flags: u32,
        priority: i32,
    },
    /// An `EventCreate` under `handle`, as [`Call::NewStream`].
    NewEvent {
        handle: Handle,
        flags: u32,
    },
    /// Marks the server's device `device` failed, with `failed` its reason
    /// (it takes no new programs, and the server moves its sessions off it
    /// as its `on_device_failure` says), or healthy again with `None`
    /// (admins only); answered by `Data`, a line saying what was done
    /// (protocol 26).
    DeviceHealth {
        device: u32,
        failed: Option<String>,
    },
    /// A synchronize of `stream` (of the context with `None`) that the
    /// client answered itself, since the work it waits for is only copies
    /// to the device of bytes their calls carried, memsets and copies
    /// within the device, on memory the client knows: such work depends on
    /// nothing the program does later. The server waits for it here, before
    /// it takes the connection's next call, so every later call sees it
    /// done; a failure is kept for the next synchronizing call. Unanswered
    /// (protocol 27).
    Settle {
        stream: Option<Handle>,
    },
    /// The next `count` calls' frames (with their bytes) come on the
    /// session's lanes 0..`lanes` in turn rather than on this connection;
    /// with `replies`, the calls come here and their replies go out on the
    /// lanes in turn. Taken by the connection, never answered (protocol 29).
    Lanes {
        count: u32,
        lanes: u32,
        replies: bool,
    },
    /// `cuOccupancyMaxActiveClusters` or `cuOccupancyMaxPotentialClusterSize`
    /// for a launch of this shape (its `params` empty), asked of the
    /// device's driver: how clusters fit a GPU's processing clusters is the
    /// chip's own, and libraries size their grids by the answer. Answered by
    /// [`ReplyBody::Value`] (protocol 28).
    ClusterOccupancy {
        launch: GraphLaunch,
        query: ClusterQuery,
    },
    /// Once `event`, just recorded on `stream`, is reached (`None`: once
    /// the work queued on `stream` so far is done, protocol 32), the device
    /// stores `value` in the 8 bytes at `offset` (a multiple of 8) of the
    /// client's pinned `region`: how a client sees an event it recorded
    /// reached, or a stream it synchronizes idle, without asking. The
    /// server leaves the store out when the session holds a failure or
    /// device `printf` output that a synchronize must return, so a mark
    /// never stands for a wait that would have failed. Unanswered
    /// (protocol 31).
    Mark {
        event: Option<Handle>,
        stream: Handle,
        region: Handle,
        offset: u64,
        value: u64,
    },
}

/// What a [`Call::ClusterOccupancy`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClusterQuery {
    /// How many clusters of the launch's size can be resident at once.
    MaxActiveClusters,
    /// The largest cluster the launch could run in; over the portable 8
    /// blocks only where the kernel allows non-portable sizes.
    MaxPotentialClusterSize { non_portable: bool },
}

/// The longest a `Call::QueryWithin` holds its connection: the calls of the
/// program's other threads on it wait behind it for at most this long.
pub const MAX_QUERY_WITHIN_US: u32 = 200_000;

/// Bytes of a `CUipcMemHandle`.
pub const IPC_HANDLE_BYTES: usize = 64;

/// One launch of a [`Call::GraphCreate`]: a [`Call::Launch`] without its stream.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GraphLaunch {
    pub function: Handle,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    #[serde(with = "serde_bytes")]
    pub params: Vec<u8>,
    pub attributes: Vec<LaunchAttribute>,
}

/// A call or request slower than this (microseconds) is logged at debug level
/// under the target `cumux::slow` by the client, the server and the worker, so
/// one run with `CUMUX_LOG=warn,cumux::slow=debug` shows which hop a slow
/// synchronizing call spent its time in (timestamps are the host's clock).
pub const SLOW_CALL_US: u128 = 250;

impl Call {
    /// Whether a file descriptor follows the call on the socket.
    pub fn carries_fd(&self) -> bool {
        matches!(
            self,
            Call::HostRegister { .. }
                | Call::Vmm(crate::vmm::VmmCall::Import)
                | Call::SessionCheckpointFile { .. }
                | Call::SessionRestoreFile { .. }
        )
    }

    /// Whether a file descriptor follows a successful reply on the socket.
    pub fn returns_fd(&self) -> bool {
        matches!(self, Call::Vmm(crate::vmm::VmmCall::Export { .. }))
    }

    /// Stream-ordered calls are fire-and-forget: the server sends no reply.
    pub fn is_fire_and_forget(&self) -> bool {
        match self {
            Call::MemcpyHtoD { stream, .. }
            | Call::MemcpyDtoD { stream, .. }
            | Call::Memset { stream, .. }
            | Call::MemcpyHtoDHost { stream, .. }
            | Call::MemcpyDtoHHost { stream, .. } => stream.is_some(),
            Call::Launch { .. }
            | Call::GraphLaunch { .. }
            | Call::StreamWaitEvent { .. }
            | Call::EventRecord { .. }
            | Call::NewStream { .. }
            | Call::NewEvent { .. }
            | Call::Settle { .. }
            | Call::Lanes { .. }
            | Call::Mark { .. } => true,
            _ => false,
        }
    }
}

/// A driver error: the `CUresult` code NVIDIA's driver would give, and a detail
/// for logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CuError {
    pub code: u32,
    pub detail: String,
}

impl CuError {
    pub fn new(code: u32, detail: impl Into<String>) -> Self {
        CuError {
            code,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for CuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CUresult {}: {}", self.code, self.detail)
    }
}

/// The server's answer to a call that expects one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub seq: u64,
    pub result: Result<ReplyBody, CuError>,
    /// Device `printf` output produced since the last reply, for the
    /// program's own stdout.
    #[serde(with = "serde_bytes")]
    pub stdout: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReplyBody {
    Unit,
    Ptr(DevicePtr),
    Handle(Handle),
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    MemInfo {
        free: u64,
        total: u64,
    },
    Range {
        base: DevicePtr,
        size: u64,
    },
    Module(ModuleInfo),
    ElapsedMs(f32),
    Status(ServerStatus),
    /// A `CUtensorMap`: 128 opaque bytes.
    TensorMap(#[serde(with = "serde_bytes")] Vec<u8>),
    /// A number a [`crate::vmm::VmmCall`] asks for (a granularity, access flags).
    Value(u64),
    /// A physical allocation's properties ([`crate::vmm::VmmCall::Properties`]).
    VmmProperties(crate::vmm::VmmProperties),
    /// A checkpoint's image too large for one reply, staged on the
    /// connection: read it with [`Call::ImageRead`].
    ImageStaged {
        bytes: u64,
    },
    /// The session moved to the server at `address` (a reply to whatever
    /// call it was held at): its client reconnects there with its resume key
    /// and sends again every call from this reply's `seq` on.
    Moved {
        address: String,
    },
    /// An array's descriptor ([`crate::arrays::ArrayCall::Describe`]).
    Array(crate::arrays::ArrayShape),
    /// A texture object's descriptors ([`crate::arrays::ArrayCall::TextureDescribe`]).
    Texture(crate::arrays::TextureMade),
}

/// A `cuLaunchKernelEx` attribute that changes how a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LaunchAttribute {
    /// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`: blocks per thread-block cluster.
    ClusterDim([u32; 3]),
    /// `CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE`.
    ClusterSchedulingPolicy(u32),
    /// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: the kernel may
    /// start before the previous one of its stream ends (dependent launch).
    ProgrammaticSerialization(u32),
    /// `CU_LAUNCH_ATTRIBUTE_COOPERATIVE`.
    Cooperative(u32),
    /// `CU_LAUNCH_ATTRIBUTE_PRIORITY`.
    Priority(i32),
    /// `CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN`.
    MemSyncDomain(u32),
}

/// The arguments of `cuTensorMapEncodeTiled`/`Im2col`/`Im2colWide`, less the
/// output: dimensions, strides and enums as the driver takes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorMapRequest {
    pub data_type: u32,
    pub rank: u32,
    pub global_address: DevicePtr,
    pub global_dim: Vec<u64>,
    /// Bytes between elements of dimensions 1 ..= rank-1.
    pub global_strides: Vec<u64>,
    pub element_strides: Vec<u32>,
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
    pub layout: TensorMapLayout,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TensorMapLayout {
    Tiled {
        box_dim: Vec<u32>,
    },
    Im2col {
        lower_corner: Vec<i32>,
        upper_corner: Vec<i32>,
        channels_per_pixel: u32,
        pixels_per_column: u32,
    },
    Im2colWide {
        lower_corner_width: i32,
        upper_corner_width: i32,
        channels_per_pixel: u32,
        pixels_per_column: u32,
        mode: u32,
    },
}

/// What a loaded module holds, so the client needs no round trip per lookup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModuleInfo {
    pub module: Handle,
    pub functions: Vec<FunctionInfo>,
    pub globals: Vec<GlobalInfo>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionInfo {
    pub name: String,
    pub handle: Handle,
    /// Byte offset and size of each parameter in the packed buffer.
    pub params: Vec<ParamInfo>,
    pub attrs: FunctionAttrs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamInfo {
    pub offset: u32,
    pub size: u32,
}

/// The values `cuFuncGetAttribute` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FunctionAttrs {
    pub max_threads_per_block: i32,
    pub shared_size_bytes: i32,
    pub const_size_bytes: i32,
    pub local_size_bytes: i32,
    pub num_regs: i32,
    pub ptx_version: i32,
    pub binary_version: i32,
    pub max_dynamic_shared_size_bytes: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalInfo {
    pub name: String,
    pub ptr: DevicePtr,
    pub size: u64,
}

/// The server's view of itself, for `cumux status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerStatus {
    pub server: String,
    pub version: u32,
    pub uptime_s: f64,
    pub devices: Vec<DeviceStatus>,
    pub sessions: Vec<SessionStatus>,
    /// Tenants with live sessions. Only the CLI decodes `ServerStatus`.
    pub tenants: Vec<TenantStatus>,
    pub limits: LimitsStatus,
    /// Each shown tenant's utilization of each device where it has run work
    /// in the last second (protocol 23); a tenant not listed has none.
    pub utilization: Vec<TenantUtilization>,
    /// Whose sessions and tenants the status shows: `all` (to the server's
    /// own uid and root), `tenant NAME` (to that tenant), or `none`.
    pub shown: String,
}

/// A tenant's share of one device's last second, as NVML reports a GPU's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantUtilization {
    pub tenant: String,
    /// The server's ordinal of the device.
    pub device: u32,
    /// Percent of the last second in which the device ran the tenant's work;
    /// `None` where the server does not time that work (queued on a GPU under
    /// `fifo`, which has no scheduler to see it finish).
    pub gpu_percent: Option<u32>,
}

/// The server's session limits, and the seats its connections hold now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsStatus {
    /// Connections (sessions, and those waiting for their hello) now.
    pub taken: u32,
    pub sessions: u32,
    pub per_peer: u32,
    pub per_uid: u32,
    pub per_tenant: u32,
}

/// One tenant's use of the server, over all its sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantStatus {
    pub name: String,
    pub sessions: u64,
    /// Device memory held: allocations and module globals.
    pub mem_used: u64,
    /// `None`: no quota.
    pub memory_quota: Option<u64>,
    pub weight: u32,
    /// `latency-critical` or `batch`.
    pub class: String,
    /// The share of a GPU's SMs its kernels may use (`None`: all; protocol 25).
    pub sm_percent: Option<u8>,
    /// Launches run by the tenant's live sessions (and earlier ones, while any lived).
    pub launches: u64,
    /// Their measured time on the device: each launch's wall time in the backend
    /// where server threads run launches; under `fair` and `priority`, on devices
    /// where launches stay queued, the time the scheduler charged the tenant.
    pub gpu_time_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub ordinal: u32,
    pub name: String,
    /// The device's UUID, as its programs see it (`cuDeviceGetUuid`).
    pub uuid: [u8; 16],
    pub backend: String,
    pub total_mem: u64,
    pub used_mem: u64,
    /// The scheduling policy of the device: `fifo`, `fair` or `priority`.
    pub policy: String,
    /// Launches its scheduler saw finish by their completion signal (queued on the
    /// device rather than run one by one); 0 under `fifo`.
    pub signalled_launches: u64,
    /// Programs' sessions on it now, every tenant's (a count, no names).
    pub sessions: u32,
    /// Programs placed on it ([`ClientRole::Claim`]) that have no session yet.
    pub claims: u32,
    /// `ok`; `reserve` (kept for moves off a failed device, offered to no
    /// program); or `failed`, with why and since when (protocol 26).
    pub health: String,
    /// Turns given under `fair` on a time-sliced GPU, the nanoseconds holders kept
    /// an idle turn while others had work (the GPU idle), and turns ended by an
    /// overrunning item; zeros elsewhere (protocol 30).
    pub turns: u64,
    pub turn_idle_held_ns: u64,
    pub turn_overruns: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    pub session: u64,
    pub pid: u32,
    pub program: String,
    pub tenant: String,
    /// The server's ordinal of the session's device.
    pub device: u32,
    pub mem_used: u64,
    pub allocations: u64,
    pub launches: u64,
    pub gpu_time_ms: f64,
    /// How the session's calls travel: `shm`, `unix` (socket) or `tcp`.
    pub transport: String,
    /// What an admin's move, checkpoint or restore of it is at, while one is
    /// under way (protocol 17).
    pub moving: Option<String>,
}

/// A tenant's entry as `Call::TenantPut` gives it (the config file's keys).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TenantSpec {
    /// Bytes of device memory; `None`: as much as the device has.
    pub memory_quota: Option<u64>,
    /// Share of device time under `fair` (at least 1).
    pub weight: u32,
    /// `latency-critical`, else batch.
    pub latency_critical: bool,
    /// Server device ordinals it may use; `None`: all.
    pub devices: Option<Vec<u32>>,
    /// Peer uids that may act as it; `None`: anyone.
    pub uids: Option<Vec<u32>>,
    /// The secret that names it (`CUMUX_TOKEN`).
    pub token: Option<String>,
}

/// `CUresult` codes the protocol itself produces.
pub mod codes {
    pub const SUCCESS: u32 = 0;
    pub const INVALID_VALUE: u32 = 1;
    pub const OUT_OF_MEMORY: u32 = 2;
    pub const NOT_INITIALIZED: u32 = 3;
    pub const DEVICE_UNAVAILABLE: u32 = 46;
    pub const NO_DEVICE: u32 = 100;
    pub const INVALID_DEVICE: u32 = 101;
    pub const INVALID_IMAGE: u32 = 200;
    pub const INVALID_CONTEXT: u32 = 201;
    pub const NO_BINARY_FOR_GPU: u32 = 209;
    pub const PEER_ACCESS_UNSUPPORTED: u32 = 217;
    pub const INVALID_PTX: u32 = 218;
    pub const INVALID_SOURCE: u32 = 300;
    pub const NOT_FOUND: u32 = 500;
    pub const INVALID_HANDLE: u32 = 400;
    pub const NOT_READY: u32 = 600;
    pub const ECC_UNCORRECTABLE: u32 = 214;
    pub const NVLINK_UNCORRECTABLE: u32 = 220;
    pub const ILLEGAL_ADDRESS: u32 = 700;
    pub const PEER_ACCESS_ALREADY_ENABLED: u32 = 704;
    pub const PEER_ACCESS_NOT_ENABLED: u32 = 705;
    pub const LAUNCH_OUT_OF_RESOURCES: u32 = 701;
    pub const LAUNCH_TIMEOUT: u32 = 702;
    pub const ASSERT: u32 = 710;
    pub const MISALIGNED_ADDRESS: u32 = 716;
    pub const LAUNCH_FAILED: u32 = 719;
    pub const NOT_PERMITTED: u32 = 800;
    pub const NOT_SUPPORTED: u32 = 801;
    pub const UNKNOWN: u32 = 999;

    /// Codes after which CUDA's context is unusable: every later call fails with them.
    pub fn is_fatal(code: u32) -> bool {
        matches!(code, ILLEGAL_ADDRESS | LAUNCH_TIMEOUT | ASSERT | 714..=719)
    }

    /// Codes only a broken device gives (its memory or its links failed):
    /// the server marks the device failed when a call returns one.
    pub fn is_device_failure(code: u32) -> bool {
        matches!(code, ECC_UNCORRECTABLE | NVLINK_UNCORRECTABLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let req = Request {
            seq: 7,
            call: Call::Launch {
                function: 3,
                grid: [4, 1, 1],
                block: [256, 1, 1],
                shared_bytes: 0,
                stream: DEFAULT_STREAM,
                params: vec![1, 2, 3],
                attributes: Vec::new(),
            },
        };
        let bytes = crate::encode(&req).unwrap();
        let back: Request = crate::decode(&bytes).unwrap();
        assert_eq!(back, req);
        assert!(back.call.is_fire_and_forget());
    }

    /// Byte buffers are encoded as one slice (`serde_bytes`), not byte by byte,
    /// yet postcard puts the same bytes on the wire either way.
    #[test]
    fn byte_buffers_keep_the_wire_format() {
        #[derive(Serialize)]
        struct PlainSeq {
            data: Vec<u8>,
        }
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let call = Call::MemcpyHtoD {
            dst: 0,
            data: data.clone(),
            stream: None,
        };
        let encoded = crate::encode(&call).unwrap();
        let plain = crate::encode(&PlainSeq { data }).unwrap();
        assert!(encoded.ends_with(&[&plain[..], &[0u8][..]].concat()));
    }

    #[test]
    fn garbage_is_an_error() {
        for bytes in [&[][..], &[0xff; 3][..], &[0, 200, 1, 2, 3][..]] {
            assert!(crate::decode::<Request>(bytes).is_err());
        }
    }
}
