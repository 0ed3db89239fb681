//! The worker protocol's own types: the requests a server sends its worker, the
//! replies, the wire forms of the device layer's types they carry (stream work,
//! launch geometry, sync targets, host spans, loaded modules) with conversions
//! both ways, and the stdout markers and nonces that tie printf to a reply.
//!
//! Frames are postcard; bulk bytes (copies, images) travel as raw frames right
//! after the request or reply that announces them. Server and worker are always
//! the same build, so these types change together.

use std::sync::atomic::{AtomicU64, Ordering};

use cumux_protocol::shm::ShmLayout;
use cumux_protocol::{
    codes, CuError, DevicePtr, FunctionAttrs, Handle, LaunchAttribute, ParamInfo, TensorMapRequest,
};
use serde::{Deserialize, Serialize};

use crate::device::host_span::HostSpan;
use crate::device::{
    GlobalDesc, KernelDesc, LaunchGeometry, LoadedModule, ModuleId, StreamWork, SyncTarget,
};

/// Bytes that start a stdout marker; the nonce and a little-endian u64 follow.
pub const MARKER_PREFIX: &[u8] = b"\0\x1bcumux-worker-mark\x1b";
/// Bytes of the per-worker nonce.
pub const NONCE_BYTES: usize = 16;
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
    },
    /// Answered by [`WorkerValue::Bytes`] and one raw frame of `len` bytes.
    MemRead {
        src: DevicePtr,
        len: u64,
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
    Launch {
        module: ModuleId,
        kernel: u64,
        geometry: WireGeometry,
        #[serde(with = "serde_bytes")]
        params: Vec<u8>,
    },
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
    /// A graph of launches for [`WireWork::Graph`] (`StreamOrdered::graph_create`).
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
    /// Answered by [`WorkerValue::TensorMap`].
    TensorMapEncode {
        request: TensorMapRequest,
    },
    /// Asks the worker to take further connections to its context, each
    /// served on a thread of its own (`shared` mode); answered by
    /// [`WorkerValue::Sessions`]. Only on the worker's own connection.
    OpenSessions,
    /// Opens the server's signal area at `path` for this connection's
    /// [`WireWork::Signal`] work (`StreamOrdered::attach_signals`).
    AttachSignals {
        path: String,
    },
    /// Maps a client's pinned host region, whose memfd comes with this
    /// request (`SCM_RIGHTS`), and registers it with the context.
    HostRegister {
        region: Handle,
        bytes: u64,
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
    Module(WireModule),
    Done(bool),
    Ms(f32),
    TensorMap(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Where further connections come in, and the token they open with.
    Sessions {
        path: String,
        token: [u8; NONCE_BYTES],
    },
}

// ----- the device layer's types on the wire -----

/// [`StreamWork`] on the wire. [`StreamWork::SignalTo`] never travels: its
/// area is an object of the process that made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WireWork {
    /// `data` travels empty in [`WorkerRequest::Enqueue`]; the bytes follow.
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
    Fill {
        dst: DevicePtr,
        #[serde(with = "serde_bytes")]
        pattern: Vec<u8>,
        count: u64,
        pitch: u64,
        height: u64,
    },
    Launch {
        module: ModuleId,
        kernel: usize,
        geometry: WireGeometry,
        #[serde(with = "serde_bytes")]
        params: Vec<u8>,
    },
    Record {
        event: Handle,
    },
    Wait {
        event: Handle,
    },
    Signal {
        slot: u32,
        value: u64,
    },
    HostToDevice {
        dst: DevicePtr,
        host: WireSpan,
    },
    DeviceToHost {
        src: DevicePtr,
        host: WireSpan,
    },
    Graph {
        graph: Handle,
    },
}

/// [`LaunchGeometry`] on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireGeometry {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
    pub attributes: Vec<LaunchAttribute>,
}

/// [`SyncTarget`] on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireTarget {
    Stream(Handle),
    Event(Handle),
    Context,
}

/// [`HostSpan`] on the wire: the region's id and the range; the worker
/// resolves the id to its own mapping of the region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireSpan {
    pub region: Handle,
    pub offset: u64,
    pub bytes: u64,
}

/// [`LoadedModule`] on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireModule {
    pub id: ModuleId,
    pub kernels: Vec<WireKernel>,
    pub globals: Vec<(String, DevicePtr, u64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireKernel {
    pub name: String,
    pub params: Vec<ParamInfo>,
    pub attrs: FunctionAttrs,
}

impl TryFrom<StreamWork> for WireWork {
    type Error = CuError;

    /// Fails only for [`StreamWork::SignalTo`], which cannot leave its process.
    fn try_from(work: StreamWork) -> Result<Self, CuError> {
        Ok(match work {
            StreamWork::Write { dst, data } => WireWork::Write { dst, data },
            StreamWork::Copy { dst, src, bytes } => WireWork::Copy { dst, src, bytes },
            StreamWork::Fill {
                dst,
                pattern,
                count,
                pitch,
                height,
            } => WireWork::Fill {
                dst,
                pattern,
                count,
                pitch,
                height,
            },
            StreamWork::Launch {
                module,
                kernel,
                geometry,
                params,
            } => WireWork::Launch {
                module,
                kernel,
                geometry: geometry.into(),
                params,
            },
            StreamWork::Record { event } => WireWork::Record { event },
            StreamWork::Wait { event } => WireWork::Wait { event },
            StreamWork::Signal { slot, value } => WireWork::Signal { slot, value },
            StreamWork::HostToDevice { dst, host } => WireWork::HostToDevice {
                dst,
                host: host.into(),
            },
            StreamWork::DeviceToHost { src, host } => WireWork::DeviceToHost {
                src,
                host: host.into(),
            },
            StreamWork::Graph { graph } => WireWork::Graph { graph },
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
    /// Host spans come unresolved (no mapping); signals without an area.
    fn from(work: WireWork) -> Self {
        match work {
            WireWork::Write { dst, data } => StreamWork::Write { dst, data },
            WireWork::Copy { dst, src, bytes } => StreamWork::Copy { dst, src, bytes },
            WireWork::Fill {
                dst,
                pattern,
                count,
                pitch,
                height,
            } => StreamWork::Fill {
                dst,
                pattern,
                count,
                pitch,
                height,
            },
            WireWork::Launch {
                module,
                kernel,
                geometry,
                params,
            } => StreamWork::Launch {
                module,
                kernel,
                geometry: geometry.into(),
                params,
            },
            WireWork::Record { event } => StreamWork::Record { event },
            WireWork::Wait { event } => StreamWork::Wait { event },
            WireWork::Signal { slot, value } => StreamWork::Signal { slot, value },
            WireWork::HostToDevice { dst, host } => StreamWork::HostToDevice {
                dst,
                host: host.into(),
            },
            WireWork::DeviceToHost { src, host } => StreamWork::DeviceToHost {
                src,
                host: host.into(),
            },
            WireWork::Graph { graph } => StreamWork::Graph { graph },
        }
    }
}

impl From<LaunchGeometry> for WireGeometry {
    fn from(g: LaunchGeometry) -> Self {
        WireGeometry {
            grid: g.grid,
            block: g.block,
            dynamic_shared_bytes: g.dynamic_shared_bytes,
            attributes: g.attributes,
        }
    }
}

impl From<WireGeometry> for LaunchGeometry {
    fn from(g: WireGeometry) -> Self {
        LaunchGeometry {
            grid: g.grid,
            block: g.block,
            dynamic_shared_bytes: g.dynamic_shared_bytes,
            attributes: g.attributes,
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

impl From<HostSpan> for WireSpan {
    fn from(span: HostSpan) -> Self {
        WireSpan {
            region: span.region,
            offset: span.offset,
            bytes: span.bytes,
        }
    }
}

impl From<WireSpan> for HostSpan {
    fn from(span: WireSpan) -> Self {
        HostSpan {
            region: span.region,
            offset: span.offset,
            bytes: span.bytes,
            mapping: None,
        }
    }
}

impl From<&LoadedModule> for WireModule {
    fn from(m: &LoadedModule) -> Self {
        WireModule {
            id: m.id,
            kernels: m
                .kernels
                .iter()
                .map(|k| WireKernel {
                    name: k.name.clone(),
                    params: k.params.clone(),
                    attrs: k.attrs,
                })
                .collect(),
            globals: m
                .globals
                .iter()
                .map(|g| (g.name.clone(), g.ptr, g.size))
                .collect(),
        }
    }
}

impl From<WireModule> for LoadedModule {
    fn from(m: WireModule) -> Self {
        LoadedModule {
            id: m.id,
            kernels: m
                .kernels
                .into_iter()
                .map(|k| KernelDesc {
                    name: k.name,
                    params: k.params,
                    attrs: k.attrs,
                })
                .collect(),
            globals: m
                .globals
                .into_iter()
                .map(|(name, ptr, size)| GlobalDesc { name, ptr, size })
                .collect(),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use cumux_protocol::{decode, encode};

    #[test]
    fn nonces_round_trip_through_hex() {
        let n = new_nonce();
        assert_ne!(n, new_nonce());
        assert_eq!(nonce_from_hex(&nonce_to_hex(&n)), Some(n));
        assert_eq!(nonce_from_hex("zz"), None);
        assert_eq!(nonce_from_hex(&"g".repeat(32)), None);
    }

    #[test]
    fn requests_and_replies_round_trip() {
        let requests = [
            WorkerRequest::MemAlloc { bytes: 7 },
            WorkerRequest::MemRead { src: 1, len: 2 },
            WorkerRequest::ModuleLoad { parts: 3 },
            WorkerRequest::Launch {
                module: 1,
                kernel: 2,
                geometry: WireGeometry {
                    grid: [1, 2, 3],
                    block: [4, 5, 6],
                    dynamic_shared_bytes: 7,
                    attributes: vec![LaunchAttribute::ClusterDim([2, 1, 1])],
                },
                params: vec![8, 9],
            },
        ];
        for r in requests {
            let back: WorkerRequest = decode(&encode(&r).unwrap()).unwrap();
            assert_eq!(back, r);
        }
        // Every kind of queued work that travels.
        let span = WireSpan {
            region: 4,
            offset: 8,
            bytes: 16,
        };
        let works = [
            WireWork::Record { event: 1 },
            WireWork::Wait { event: 2 },
            WireWork::Signal { slot: 3, value: 4 },
            WireWork::HostToDevice {
                dst: 5,
                host: span.clone(),
            },
            WireWork::DeviceToHost { src: 6, host: span },
        ];
        for work in works {
            let r = WorkerRequest::Enqueue { stream: 9, work };
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

    /// Stream work keeps what it says through its wire form; a signal bound
    /// to an area of this process does not travel.
    #[test]
    fn stream_work_converts_to_the_wire_and_back() {
        let span = HostSpan {
            region: 4,
            offset: 8,
            bytes: 16,
            mapping: None,
        };
        let works = [
            StreamWork::Fill {
                dst: 1,
                pattern: vec![1, 2],
                count: 3,
                pitch: 4,
                height: 5,
            },
            StreamWork::Launch {
                module: 1,
                kernel: 2,
                geometry: LaunchGeometry {
                    grid: [1, 2, 3],
                    block: [4, 5, 6],
                    dynamic_shared_bytes: 7,
                    attributes: vec![LaunchAttribute::Cooperative(1)],
                },
                params: vec![8, 9],
            },
            StreamWork::HostToDevice {
                dst: 5,
                host: span.clone(),
            },
            StreamWork::DeviceToHost { src: 6, host: span },
            StreamWork::Graph { graph: 7 },
        ];
        for work in works {
            let wire = WireWork::try_from(work.clone()).unwrap();
            assert_eq!(StreamWork::from(wire), work);
        }
        let area = std::sync::Arc::new(crate::device::signals::SignalArea::create().unwrap());
        area.unlink();
        let bound = StreamWork::SignalTo {
            area,
            slot: 1,
            value: 2,
        };
        assert_eq!(
            WireWork::try_from(bound).unwrap_err().code,
            codes::INVALID_VALUE
        );
    }
}
