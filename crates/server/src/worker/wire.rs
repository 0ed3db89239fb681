//! The worker protocol's own types: the requests a server sends its worker and
//! the replies, which carry the device layer's types as they are (stream work,
//! launches, sync targets, loaded modules), and the stdout markers and nonces
//! that tie printf to a reply.
//!
//! Frames are postcard; bulk bytes (copies, images) travel as raw frames right
//! after the request or reply that announces them. Server and worker are always
//! the same build, so these types change together.

use crate::sm_parts::SmPart;
use std::sync::atomic::{AtomicU64, Ordering};

use cumux_protocol::arrays::{CopyEnd, CopyExtent};
use cumux_protocol::shm::ShmLayout;
use cumux_protocol::{codes, ClusterQuery, CuError, DevicePtr, Handle, TensorMapRequest};
use serde::{Deserialize, Serialize};

use crate::device::arrays::ArrayOp;
use crate::device::host_span::HostSpan;
use crate::device::imported::{ImportedChunk, MappedChunks};
use crate::device::limits::LimitSetting;
use crate::device::{
    KernelLaunch, LaunchGeometry, LoadedModule, MemFill, ModuleId, StreamWork, SyncTarget, VmmOp,
};

/// Bytes that start a stdout marker; the nonce and a little-endian u64 follow.
pub const MARKER_PREFIX: &[u8] = b"\0\x1bcumux-worker-mark\x1b";
/// Bytes of the per-worker nonce.
pub const NONCE_BYTES: usize = 16;
/// Bytes one [`WorkerRequest::MemReadPieces`] may read.
pub const MAX_READ_SPAN: u64 = 1 << 30;
/// Image parts a module load may send (each at most `MAX_CHUNK_BYTES`).
pub const MAX_IMAGE_PARTS: u32 = 64;

/// A call to a worker. Variants marked so are followed by raw frames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum WorkerRequest {
    MemAlloc {
        bytes: u64,
    },
    MemFree {
        ptr: DevicePtr,
        bytes: u64,
    },
    /// Answered by [`WorkerValue::Bytes`] and one raw frame of `len` bytes.
    MemRead {
        src: DevicePtr,
        len: u64,
    },
    /// `len` bytes (at most [`MAX_READ_SPAN`]) read in pieces of `piece`
    /// (at most `MAX_CHUNK_BYTES`), each answered as it is read: by
    /// [`WorkerValue::Fill`] where it is all one byte value, else by
    /// [`WorkerValue::Bytes`] and one raw frame of it. An error is the last answer.
    MemReadPieces {
        src: DevicePtr,
        len: u64,
        piece: u64,
    },
    /// Followed by one raw frame: the bytes to write.
    MemWrite {
        dst: DevicePtr,
    },
    MemCopy {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    },
    MemFill {
        dst: DevicePtr,
        pattern: Vec<u8>,
        count: u64,
    },
    /// Followed by `parts` raw frames: the image, in order.
    ModuleLoad {
        parts: u32,
    },
    ModuleUnload {
        module: ModuleId,
    },
    // A moved session's state (issue 17: `MovableContext`).
    /// Places each (address, bytes) allocation where it was.
    Place {
        allocations: Vec<(DevicePtr, u64)>,
    },
    /// Keeps each (address, bytes) range unused ([`MovableContext::hold`]).
    Hold {
        ranges: Vec<(DevicePtr, u64)>,
    },
    /// `MovableContext::keep_free`: answered by [`WorkerValue::Number`],
    /// the bytes kept.
    KeepFree {
        spans: Vec<(u64, u64)>,
    },
    /// Answered by [`WorkerValue::MoveFacts`].
    MoveFacts,
    /// A context's first request when it is made for a moved session: its
    /// addresses in `window` (the connection's context is replaced by one of
    /// the worker's device in that window, where it is another).
    Window {
        window: u32,
    },
    /// A context's first request when its tenant has an SM cap: the
    /// connection's context is replaced by a green context of the same
    /// device on the stretch `part` of its SMs; answered by [`WorkerValue::Number`]
    /// (the SMs it got).
    SmCap {
        part: SmPart,
    },
    /// Answered by [`WorkerValue::Ptrs`]: the memory module `module`'s
    /// loading allocated, in order.
    ModuleBlocks {
        module: ModuleId,
    },
    /// A module load placing its memory at `blocks`; followed by `parts`
    /// raw frames, as [`WorkerRequest::ModuleLoad`].
    ModuleLoadAt {
        parts: u32,
        blocks: Vec<DevicePtr>,
    },
    Launch(KernelLaunch),
    // Stream-ordered calls (`StreamOrdered`); the handles are the session's.
    StreamCreate {
        stream: Handle,
        flags: u32,
        priority: i32,
    },
    StreamDestroy {
        stream: Handle,
    },
    EventCreate {
        event: Handle,
        flags: u32,
    },
    EventDestroy {
        event: Handle,
    },
    /// A graph of launches for [`StreamWork::Graph`] (`StreamOrdered::graph_create`).
    GraphCreate {
        graph: Handle,
        launches: Vec<WireWork>,
    },
    GraphDestroy {
        graph: Handle,
    },
    /// Posted: the worker answers nothing (a failure comes back from the next
    /// waiting call). `Write` work travels with empty `data`; its bytes follow
    /// as one raw frame.
    Enqueue {
        stream: Handle,
        work: WireWork,
    },
    /// Answered by [`WorkerValue::Bytes`] and one raw frame of `len` bytes.
    StreamRead {
        stream: Handle,
        src: DevicePtr,
        len: u64,
    },
    Synchronize {
        target: WireTarget,
    },
    /// Answered by [`WorkerValue::Done`].
    Query {
        target: WireTarget,
    },
    /// Answered by [`WorkerValue::Ms`].
    Elapsed {
        start: Handle,
        end: Handle,
    },
    /// `DeviceContext::apply_limit`; answered by `Unit`.
    SetLimit {
        limit: u32,
        setting: LimitSetting,
    },
    /// `DeviceContext::reset_limits`; answered by `Unit`.
    ResetLimits,
    /// Answered by [`WorkerValue::TensorMap`].
    TensorMapEncode {
        request: TensorMapRequest,
    },
    /// `DeviceContext::cluster_occupancy`; answered by [`WorkerValue::Number`].
    ClusterOccupancy {
        module: ModuleId,
        kernel: usize,
        geometry: LaunchGeometry,
        query: ClusterQuery,
    },
    /// A virtual memory operation on the context, checked by the session;
    /// answered by [`WorkerValue::Number`].
    Vmm(VmmOp),
    /// An array operation on the context, checked by the session; answered
    /// by [`WorkerValue::Number`].
    Array(ArrayOp),
    /// `DeviceContext::array_copy`: followed by one raw frame, the packed
    /// box, where `src` is the host; where `dst` is, answered by
    /// [`WorkerValue::Bytes`] and one raw frame of the box (at most
    /// `MAX_CHUNK_BYTES`), else by `Unit`.
    ArrayCopy {
        src: CopyEnd,
        dst: CopyEnd,
        extent: CopyExtent,
    },
    /// `StreamOrdered::event_ipc_handle`: answered by [`WorkerValue::IpcHandle`].
    EventIpcHandle {
        event: Handle,
    },
    /// `StreamOrdered::event_open_ipc`.
    EventOpenIpc {
        event: Handle,
        #[serde(with = "serde_bytes")]
        handle: Vec<u8>,
    },
    /// This connection's context's number in the worker: answered by
    /// [`WorkerValue::Number`] (another connection names it for peer access).
    ContextId,
    /// `DeviceContext::peer_access` of this connection's context to the
    /// context numbered `peer` in this worker.
    PeerAccess {
        peer: u64,
        enable: bool,
    },
    /// `DeviceContext::vmm_export` of physical allocation `physical`:
    /// answered by [`WorkerValue::Unit`], the descriptor attached.
    VmmExport {
        physical: u64,
    },
    /// `MovableContext::export_placed` of the placed allocation at `ptr`:
    /// answered by [`WorkerValue::Range`] (the chunk), the descriptor attached.
    PlacedExport {
        ptr: DevicePtr,
    },
    /// `DeviceContext::vmm_import` of the descriptor that comes with the
    /// request (`SCM_RIGHTS`): answered by [`WorkerValue::Number`].
    VmmImport,
    /// `DeviceContext::copy_into_imported`: the allocations `copies` copied
    /// into another context's memory imported here as `chunks`, which are
    /// released either way; answered by [`WorkerValue::Number`] (the bytes).
    PlacedCopy {
        chunks: Vec<ImportedChunk>,
        copies: Vec<(DevicePtr, u64)>,
    },
    /// `MovableContext::modules_blocks`: answered by [`WorkerValue::PtrLists`].
    ModulesBlocks {
        modules: Vec<ModuleId>,
    },
    /// `DeviceContext::mem_read_spans`: answered by [`WorkerValue::Bytes`]
    /// and one raw frame, the spans' bytes one after another.
    MemReadSpans {
        spans: Vec<(DevicePtr, u64)>,
    },
    /// `DeviceContext::mem_write_spans`: followed by one raw frame, the
    /// spans' bytes one after another; answered by `Unit`.
    MemWriteSpans {
        spans: Vec<(DevicePtr, u64)>,
    },
    /// `DeviceContext::map_imported`: answered by [`WorkerValue::Mapped`].
    PlacedMap {
        chunks: Vec<ImportedChunk>,
    },
    /// `DeviceContext::copy_into_mapped`: answered by
    /// [`WorkerValue::Number`] (the bytes).
    PlacedCopyMapped {
        mapped: MappedChunks,
        copies: Vec<(DevicePtr, u64)>,
    },
    /// `DeviceContext::unmap_imported`: answered by `Unit`.
    PlacedUnmap {
        mapped: MappedChunks,
    },
    /// `DeviceContext::ipc_export` of the allocation at `base`; answered by
    /// [`WorkerValue::IpcHandle`].
    IpcExport {
        base: DevicePtr,
    },
    /// `DeviceContext::ipc_open`; answered by [`WorkerValue::Range`].
    IpcOpen {
        #[serde(with = "serde_bytes")]
        handle: Vec<u8>,
        flags: u32,
    },
    /// `DeviceContext::ipc_close`.
    IpcClose {
        base: DevicePtr,
    },
    /// Asks the worker to take further connections to its context, each
    /// served on a thread of its own (`shared` mode); answered by
    /// [`WorkerValue::Sessions`]. Only on the worker's own connection.
    OpenSessions,
    /// Opens the server's signal area at `path` for this connection's
    /// [`StreamWork::Signal`] work (`StreamOrdered::attach_signals`).
    AttachSignals {
        path: String,
    },
    /// Maps a client's pinned host region, whose memfd comes with this
    /// request (`SCM_RIGHTS`), and registers it with the context; answered
    /// by `Number(1)` where the device reaches it at `client_base`, else 0.
    HostRegister {
        region: Handle,
        bytes: u64,
        client_base: u64,
    },
    /// Forgets a region (the server has waited for the work that used it).
    HostUnregister {
        region: Handle,
    },
    /// Polls this connection for `spin_us` before sleeping from now on
    /// (`StreamOrdered::keep_hot`); answers nothing.
    KeepHot {
        spin_us: u64,
    },
    /// Offers this connection a shared-memory area of `layout`, whose memfd
    /// comes with this request (`SCM_RIGHTS`); answered on the socket by
    /// [`WorkerValue::Unit`] (every later frame goes through the area) or an
    /// error (the connection stays on the socket). See [`super::link`].
    ShmAttach {
        layout: ShmLayout,
    },
}

impl WorkerRequest {
    /// Whether serving the request can flush device printf (the driver writes
    /// it at synchronization points), so that its reply names a stdout marker
    /// once a module that can print is loaded.
    pub fn may_flush_printf(&self) -> bool {
        !matches!(
            self,
            WorkerRequest::MemAlloc { .. }
                | WorkerRequest::MemFree { .. }
                | WorkerRequest::StreamCreate { .. }
                | WorkerRequest::EventCreate { .. }
                | WorkerRequest::EventDestroy { .. }
                | WorkerRequest::Query { .. }
                | WorkerRequest::Elapsed { .. }
                | WorkerRequest::TensorMapEncode { .. }
                | WorkerRequest::ClusterOccupancy { .. }
                | WorkerRequest::SetLimit { .. }
                | WorkerRequest::ResetLimits
                | WorkerRequest::IpcExport { .. }
                | WorkerRequest::VmmExport { .. }
                | WorkerRequest::PlacedExport { .. }
                | WorkerRequest::VmmImport
                | WorkerRequest::ContextId
                | WorkerRequest::EventIpcHandle { .. }
                | WorkerRequest::EventOpenIpc { .. }
                | WorkerRequest::PeerAccess { .. }
                | WorkerRequest::IpcOpen { .. }
                | WorkerRequest::MoveFacts
                | WorkerRequest::Window { .. }
                | WorkerRequest::SmCap { .. }
                | WorkerRequest::ModuleBlocks { .. }
                | WorkerRequest::ModulesBlocks { .. }
                | WorkerRequest::MemReadSpans { .. }
        )
    }
}

/// A worker's answer. The first message a worker sends is one with
/// [`WorkerValue::Ready`] (or the error that kept it from creating its context).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerReply {
    pub result: Result<WorkerValue, CuError>,
    /// The stdout marker written after this call's printf output, if any.
    pub marker: Option<u64>,
}

impl WorkerReply {
    /// A reply with no printf of its own.
    pub fn unmarked(result: Result<WorkerValue, CuError>) -> Self {
        WorkerReply {
            result,
            marker: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerValue {
    Ready,
    Unit,
    Ptr(DevicePtr),
    /// One raw frame follows.
    Bytes,
    /// A piece of memory that is all this byte value.
    Fill(u8),
    /// A loaded module, and whether its image can print (as the worker's
    /// detector judges it: the server asks no detector of its own).
    Module(LoadedModule, bool),
    Done(bool),
    Ms(f32),
    TensorMap(#[serde(with = "serde_bytes")] Vec<u8>),
    /// What a [`WorkerRequest::Vmm`] gives: an address, a physical
    /// allocation's id, a granularity, or 0; bytes kept free.
    Number(u64),
    /// A memory handle another process may open.
    IpcHandle(#[serde(with = "serde_bytes")] Vec<u8>),
    /// An allocation: its base and size.
    Range {
        base: DevicePtr,
        size: u64,
    },
    /// What a moved context keeps: its address window, its limits, and
    /// why it cannot move, if it cannot.
    MoveFacts {
        window: u32,
        limits: Vec<(u32, u64)>,
        unmovable: Option<String>,
    },
    Ptrs(Vec<DevicePtr>),
    /// A list of addresses for each of several things, in order.
    PtrLists(Vec<Vec<DevicePtr>>),
    /// Imported chunks mapped ([`WorkerRequest::PlacedMap`]).
    Mapped(MappedChunks),
    /// Where further connections come in, and the token they open with.
    Sessions {
        path: String,
        token: [u8; NONCE_BYTES],
    },
}

// ----- stdout markers and nonces -----

/// The marker bytes that end output for call `seq` of the worker with `nonce`.
pub fn marker_bytes(nonce: &[u8; NONCE_BYTES], seq: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(MARKER_PREFIX.len() + NONCE_BYTES + 8);
    m.extend_from_slice(MARKER_PREFIX);
    m.extend_from_slice(nonce);
    m.extend_from_slice(&seq.to_le_bytes());
    m
}

/// A fresh nonce: std's randomly keyed hasher over the pid, time and a counter.
pub fn new_nonce() -> [u8; NONCE_BYTES] {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut out = [0u8; NONCE_BYTES];
    for (i, half) in out.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n);
        h.write_usize(i);
        h.write_u32(std::process::id());
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

/// `nonce` as lowercase hex, for the worker's command line.
pub fn nonce_to_hex(nonce: &[u8; NONCE_BYTES]) -> String {
    nonce.iter().map(|b| format!("{b:02x}")).collect()
}

/// The nonce a hex string names, if it is one.
pub fn nonce_from_hex(text: &str) -> Option<[u8; NONCE_BYTES]> {
    let text = text.as_bytes();
    if text.len() != NONCE_BYTES * 2 {
        return None;
    }
    let mut out = [0u8; NONCE_BYTES];
    for (i, pair) in text.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// Stream-ordered work as it travels to a worker: the device layer's
/// [`StreamWork`] without what lives in one process only (a signal's area, a
/// host region's mapping). `Write` travels with empty `data`; its bytes follow
/// as raw frames.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WireWork {
    Write {
        dst: DevicePtr,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    Copy {
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    },
    Fill(MemFill),
    Launch(KernelLaunch),
    Record(Handle),
    Wait(Handle),
    Signal {
        slot: u32,
        value: u64,
    },
    HostToDevice(DevicePtr, WireSpan),
    DeviceToHost(DevicePtr, WireSpan),
    Graph(Handle),
    Mark(Option<Handle>, WireSpan, u64),
}

/// A span of a client's pinned host region, by the region's server-wide id;
/// the worker resolves it to its own mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireSpan {
    pub region: Handle,
    pub offset: u64,
    pub bytes: u64,
}

/// What a synchronize or query waits for, on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireTarget {
    Stream(Handle),
    Event(Handle),
    Context,
}

impl From<&HostSpan> for WireSpan {
    fn from(span: &HostSpan) -> Self {
        WireSpan {
            region: span.region,
            offset: span.offset,
            bytes: span.bytes,
        }
    }
}

impl From<WireSpan> for HostSpan {
    /// Unresolved: the worker's region table fills in its mapping.
    fn from(span: WireSpan) -> Self {
        HostSpan {
            region: span.region,
            offset: span.offset,
            bytes: span.bytes,
            mapping: None,
        }
    }
}

impl TryFrom<StreamWork> for WireWork {
    type Error = CuError;

    /// Fails for a signal bound to an area of this process, which cannot travel.
    fn try_from(work: StreamWork) -> Result<Self, CuError> {
        Ok(match work {
            StreamWork::Write { dst, data } => WireWork::Write { dst, data },
            StreamWork::Copy { dst, src, bytes } => WireWork::Copy { dst, src, bytes },
            StreamWork::Fill(fill) => WireWork::Fill(fill),
            StreamWork::Launch(launch) => WireWork::Launch(launch),
            StreamWork::Record { event } => WireWork::Record(event),
            StreamWork::Wait { event } => WireWork::Wait(event),
            StreamWork::Signal { slot, value } => WireWork::Signal { slot, value },
            StreamWork::HostToDevice { dst, host } => WireWork::HostToDevice(dst, (&host).into()),
            StreamWork::DeviceToHost { src, host } => WireWork::DeviceToHost(src, (&host).into()),
            StreamWork::Graph { graph } => WireWork::Graph(graph),
            StreamWork::Mark { event, host, value } => WireWork::Mark(event, (&host).into(), value),
            StreamWork::SignalTo { slot, .. } => {
                return Err(CuError::new(
                    codes::INVALID_VALUE,
                    format!("signal slot {slot}: an area cannot go to a worker"),
                ))
            }
        })
    }
}

impl From<WireWork> for StreamWork {
    fn from(work: WireWork) -> Self {
        match work {
            WireWork::Write { dst, data } => StreamWork::Write { dst, data },
            WireWork::Copy { dst, src, bytes } => StreamWork::Copy { dst, src, bytes },
            WireWork::Fill(fill) => StreamWork::Fill(fill),
            WireWork::Launch(launch) => StreamWork::Launch(launch),
            WireWork::Record(event) => StreamWork::Record { event },
            WireWork::Wait(event) => StreamWork::Wait { event },
            WireWork::Signal { slot, value } => StreamWork::Signal { slot, value },
            WireWork::HostToDevice(dst, span) => StreamWork::HostToDevice {
                dst,
                host: span.into(),
            },
            WireWork::DeviceToHost(src, span) => StreamWork::DeviceToHost {
                src,
                host: span.into(),
            },
            WireWork::Graph(graph) => StreamWork::Graph { graph },
            WireWork::Mark(event, span, value) => StreamWork::Mark {
                event,
                host: span.into(),
                value,
            },
        }
    }
}

impl From<SyncTarget> for WireTarget {
    fn from(target: SyncTarget) -> Self {
        match target {
            SyncTarget::Stream(s) => WireTarget::Stream(s),
            SyncTarget::Event(e) => WireTarget::Event(e),
            SyncTarget::Context => WireTarget::Context,
        }
    }
}

impl From<WireTarget> for SyncTarget {
    fn from(target: WireTarget) -> Self {
        match target {
            WireTarget::Stream(s) => SyncTarget::Stream(s),
            WireTarget::Event(e) => SyncTarget::Event(e),
            WireTarget::Context => SyncTarget::Context,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::host_span::HostSpan;
    use crate::device::{LaunchGeometry, MemFill};
    use cumux_protocol::pinned::{create_memfd, HostMapping};
    use cumux_protocol::{decode, encode, LaunchAttribute};

    #[test]
    fn nonces_round_trip_through_hex() {
        let n = new_nonce();
        assert_ne!(n, new_nonce());
        assert_eq!(nonce_from_hex(&nonce_to_hex(&n)), Some(n));
        assert_eq!(nonce_from_hex("zz"), None);
        assert_eq!(nonce_from_hex(&"g".repeat(32)), None);
    }

    /// A launch of every kind of field, as the session makes them.
    fn launch() -> KernelLaunch {
        KernelLaunch {
            module: 1,
            kernel: 2,
            geometry: LaunchGeometry {
                grid: [1, 2, 3],
                block: [4, 5, 6],
                dynamic_shared_bytes: 7,
                attributes: vec![
                    LaunchAttribute::ClusterDim([2, 1, 1]),
                    LaunchAttribute::Cooperative(1),
                ],
            },
            params: vec![8, 9],
        }
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let requests = [
            WorkerRequest::MemAlloc { bytes: 7 },
            WorkerRequest::MemRead { src: 1, len: 2 },
            WorkerRequest::MemReadPieces {
                src: 1,
                len: 2,
                piece: 3,
            },
            WorkerRequest::ModuleLoad { parts: 3 },
            WorkerRequest::Launch(launch()),
            WorkerRequest::Vmm(VmmOp::Map {
                ptr: 1 << 40,
                size: 2 << 20,
                physical: 3,
            }),
        ];
        for r in requests {
            let back: WorkerRequest = decode(&encode(&r).unwrap()).unwrap();
            assert_eq!(back, r);
        }
        let reply = WorkerReply {
            result: Err(CuError::new(700, "fault")),
            marker: Some(3),
        };
        let back: WorkerReply = decode(&encode(&reply).unwrap()).unwrap();
        assert_eq!(back, reply);
    }

    /// Every kind of queued work that travels keeps what it says; a host span
    /// arrives without its mapping, and a signal bound to an area of this
    /// process does not travel.
    #[test]
    fn stream_work_travels_to_a_worker() {
        let fd = create_memfd(4096).unwrap();
        let mapping = HostMapping::map(std::os::fd::AsFd::as_fd(&fd), 4096).unwrap();
        let span = HostSpan {
            region: 4,
            offset: 8,
            bytes: 16,
            mapping: Some(std::sync::Arc::new(mapping)),
        };
        let works = [
            StreamWork::Fill(MemFill {
                dst: 1,
                pattern: vec![1, 2],
                count: 3,
                pitch: 4,
                height: 5,
            }),
            StreamWork::Launch(launch()),
            StreamWork::Record { event: 1 },
            StreamWork::Wait { event: 2 },
            StreamWork::Signal { slot: 3, value: 4 },
            StreamWork::HostToDevice {
                dst: 5,
                host: span.clone(),
            },
            StreamWork::DeviceToHost { src: 6, host: span },
            StreamWork::Graph { graph: 7 },
        ];
        for work in works {
            let wire = WireWork::try_from(work.clone()).unwrap();
            let r = WorkerRequest::Enqueue {
                stream: 9,
                work: wire,
            };
            let back: WorkerRequest = decode(&encode(&r).unwrap()).unwrap();
            assert_eq!(back, r);
            let WorkerRequest::Enqueue { work: wire, .. } = back else {
                panic!("{back:?}");
            };
            // The same work on the other side (spans compare without mappings).
            let arrived = StreamWork::from(wire);
            assert_eq!(arrived, work);
            if let StreamWork::HostToDevice { host, .. } | StreamWork::DeviceToHost { host, .. } =
                arrived
            {
                assert!(host.mapping.is_none());
            }
        }
        let area = std::sync::Arc::new(crate::device::signals::SignalArea::create().unwrap());
        area.unlink();
        let bound = StreamWork::SignalTo {
            area,
            slot: 1,
            value: 2,
        };
        let refused = WireWork::try_from(bound).unwrap_err();
        assert_eq!(refused.code, codes::INVALID_VALUE);
    }
}
