//! Arbitrary [`Call`]s from the fuzzer's bytes: every variant, with handles and
//! pointers drawn mostly from what the session has handed out ([`Known`]) so a
//! sequence gets past the lookups, and sizes and dimensions at the edges the
//! checks guard (small valid ones, or ones past the limits).

use arbitrary::{Result, Unstructured};
use cumux_protocol::{
    Call, ClusterQuery, CuError, DevicePtr, GraphLaunch, Handle, LaunchAttribute, ParamInfo,
    ReplyBody, TensorMapLayout, TensorMapRequest,
};

/// Module images worth loading: whole, or with one byte changed.
pub type Images = &'static [&'static [u8]];

/// What a session has handed out so far; stale entries stay, so freed handles
/// and pointers get used again.
#[derive(Debug, Default)]
pub struct Known {
    pub allocations: Vec<(DevicePtr, u64)>,
    pub streams: Vec<Handle>,
    pub events: Vec<Handle>,
    pub modules: Vec<Handle>,
    pub functions: Vec<(Handle, Vec<ParamInfo>)>,
    pub graphs: Vec<Handle>,
    /// Registered host regions and their sizes.
    pub regions: Vec<(Handle, u64)>,
}

/// The most entries of one kind [`Known`] keeps.
const KEEP: usize = 32;

fn remember<T>(list: &mut Vec<T>, item: T) {
    if list.len() < KEEP {
        list.push(item);
    }
}

impl Known {
    /// Learns what `reply` handed out for `call`.
    pub fn learn(&mut self, call: &Call, reply: &std::result::Result<ReplyBody, CuError>) {
        match (call, reply) {
            (Call::MemAlloc { bytes, .. }, Ok(ReplyBody::Ptr(p))) => {
                remember(&mut self.allocations, (*p, *bytes))
            }
            (Call::StreamCreate { .. }, Ok(ReplyBody::Handle(h))) => {
                remember(&mut self.streams, *h)
            }
            (Call::EventCreate { .. }, Ok(ReplyBody::Handle(h))) => remember(&mut self.events, *h),
            (Call::GraphCreate { .. }, Ok(ReplyBody::Handle(h))) => remember(&mut self.graphs, *h),
            (Call::HostRegister { bytes, .. }, Ok(ReplyBody::Handle(h))) => {
                remember(&mut self.regions, (*h, *bytes))
            }
            (Call::ModuleLoad { .. }, Ok(ReplyBody::Module(info))) => {
                remember(&mut self.modules, info.module);
                for f in &info.functions {
                    remember(&mut self.functions, (f.handle, f.params.clone()));
                }
                for g in &info.globals {
                    remember(&mut self.allocations, (g.ptr, g.size));
                }
            }
            _ => {}
        }
    }
}

/// One of `list`, mostly; else an arbitrary value, 0, or a small one near the
/// first handle a session issues.
fn handle(u: &mut Unstructured, list: &[Handle]) -> Result<Handle> {
    Ok(match u.int_in_range(0u8..=9)? {
        0 => u.arbitrary()?,
        1 => 0,
        2 => u.int_in_range(0..=0x120)?,
        _ if list.is_empty() => u.int_in_range(0..=0x120)?,
        _ => list[u.choose_index(list.len())?],
    })
}

fn stream(u: &mut Unstructured, known: &Known) -> Result<Handle> {
    handle(u, &known.streams)
}

fn maybe_stream(u: &mut Unstructured, known: &Known) -> Result<Option<Handle>> {
    Ok(if u.arbitrary()? {
        Some(stream(u, known)?)
    } else {
        None
    })
}

/// An address inside or near one of the session's allocations, mostly.
fn pointer(u: &mut Unstructured, known: &Known) -> Result<DevicePtr> {
    if known.allocations.is_empty() || u.ratio(1u8, 8)? {
        return Ok(if u.arbitrary()? { 0 } else { u.arbitrary()? });
    }
    let (base, size) = known.allocations[u.choose_index(known.allocations.len())?];
    Ok(match u.int_in_range(0u8..=3)? {
        0 => base,
        1 => base.wrapping_add(u.int_in_range(0..=size.saturating_add(8))?),
        2 => base.wrapping_add(size).wrapping_sub(u.int_in_range(0..=8)?),
        _ => base.wrapping_add(u.arbitrary::<u16>()? as u64),
    })
}

/// A byte count: mostly small, sometimes a session's allocation size, now and
/// then anything.
fn count(u: &mut Unstructured, known: &Known) -> Result<u64> {
    Ok(match u.int_in_range(0u8..=7)? {
        0 => u.arbitrary()?,
        1 => u.int_in_range(0..=16)?,
        2 if !known.allocations.is_empty() => {
            known.allocations[u.choose_index(known.allocations.len())?].1
        }
        _ => u.int_in_range(0..=4096)?,
    })
}

/// Up to `max` bytes of the input (fewer if it runs out).
fn bytes(u: &mut Unstructured, max: usize) -> Result<Vec<u8>> {
    let n = u.int_in_range(0..=max)?;
    Ok(u.bytes(n.min(u.len()))?.to_vec())
}

/// A launch dimension: a small one, or one past every limit (x is limited to
/// 2^31 - 1 blocks, y and z to 65535, a block to 1024 threads).
fn dims(u: &mut Unstructured, small: u32) -> Result<[u32; 3]> {
    let mut d = [1u32; 3];
    for x in d.iter_mut() {
        *x = if u.ratio(1u8, 16)? {
            u.int_in_range(0x8000_0000..=u32::MAX)?
        } else {
            u.int_in_range(0..=small)?
        };
    }
    Ok(d)
}

/// Parameters for `function`: laid out as its parameters are (pointers into
/// the session's allocations, small numbers), or arbitrary bytes.
fn params(u: &mut Unstructured, known: &Known, function: Handle) -> Result<Vec<u8>> {
    let layout = known
        .functions
        .iter()
        .find(|(h, _)| *h == function)
        .map(|(_, p)| p);
    let Some(layout) = layout.filter(|_| u.ratio(7u8, 8).unwrap_or(false)) else {
        return bytes(u, 600);
    };
    let total = layout
        .iter()
        .map(|p| p.offset as usize + p.size as usize)
        .max()
        .unwrap_or(0)
        .min(4096);
    let mut out = vec![0u8; total];
    for p in layout {
        let at = p.offset as usize;
        let value = if p.size >= 8 {
            pointer(u, known)?
        } else {
            u.int_in_range(0..=3)?
        };
        let n = (p.size as usize).min(8).min(total.saturating_sub(at));
        out[at..at + n].copy_from_slice(&value.to_le_bytes()[..n]);
    }
    Ok(out)
}

fn attributes(u: &mut Unstructured) -> Result<Vec<LaunchAttribute>> {
    let n = u.int_in_range(0..=2)?;
    (0..n)
        .map(|_| {
            Ok(match u.int_in_range(0u8..=5)? {
                0 => LaunchAttribute::ClusterDim(dims(u, 4)?),
                1 => LaunchAttribute::ClusterSchedulingPolicy(u.int_in_range(0..=3)?),
                2 => LaunchAttribute::ProgrammaticSerialization(u.int_in_range(0..=1)?),
                3 => LaunchAttribute::Cooperative(u.int_in_range(0..=1)?),
                4 => LaunchAttribute::Priority(u.arbitrary()?),
                _ => LaunchAttribute::MemSyncDomain(u.int_in_range(0..=2)?),
            })
        })
        .collect()
}

fn graph_launch(u: &mut Unstructured, known: &Known) -> Result<GraphLaunch> {
    let function = handle(u, &known.functions.iter().map(|f| f.0).collect::<Vec<_>>())?;
    Ok(GraphLaunch {
        function,
        grid: dims(u, 4)?,
        block: dims(u, 64)?,
        shared_bytes: if u.ratio(1u8, 8)? { u.arbitrary()? } else { 0 },
        params: params(u, known, function)?,
        attributes: attributes(u)?,
    })
}

/// A vector of `rank` plus or minus one small or arbitrary numbers.
fn ranked<T: for<'a> arbitrary::Arbitrary<'a> + From<u8>>(
    u: &mut Unstructured,
    rank: u32,
) -> Result<Vec<T>> {
    let n = (rank as usize + u.int_in_range(0..=2)?).saturating_sub(1);
    (0..n)
        .map(|_| {
            if u.ratio(1u8, 4)? {
                u.arbitrary()
            } else {
                Ok(T::from(u.int_in_range(0..=64)?))
            }
        })
        .collect()
}

fn tensor_map(u: &mut Unstructured, known: &Known) -> Result<TensorMapRequest> {
    let rank = u.int_in_range(0..=6)?;
    let layout = match u.int_in_range(0u8..=2)? {
        0 => TensorMapLayout::Tiled {
            box_dim: ranked(u, rank)?,
        },
        1 => TensorMapLayout::Im2col {
            lower_corner: ranked::<i16>(u, rank)?.into_iter().map(i32::from).collect(),
            upper_corner: ranked::<i16>(u, rank)?.into_iter().map(i32::from).collect(),
            channels_per_pixel: u.int_in_range(0..=300)?,
            pixels_per_column: u.int_in_range(0..=1100)?,
        },
        _ => TensorMapLayout::Im2colWide {
            lower_corner_width: u.arbitrary::<i16>()? as i32,
            upper_corner_width: u.arbitrary::<i16>()? as i32,
            channels_per_pixel: u.int_in_range(0..=300)?,
            pixels_per_column: u.int_in_range(0..=1100)?,
            mode: u.int_in_range(0..=3)?,
        },
    };
    Ok(TensorMapRequest {
        data_type: u.int_in_range(0..=16)?,
        rank,
        global_address: pointer(u, known)?,
        global_dim: ranked(u, rank)?,
        global_strides: ranked::<u32>(u, rank)?
            .into_iter()
            .map(|s| u64::from(s) * 16)
            .collect(),
        element_strides: ranked(u, rank)?,
        interleave: u.int_in_range(0..=3)?,
        swizzle: u.int_in_range(0..=7)?,
        l2_promotion: u.int_in_range(0..=4)?,
        oob_fill: u.int_in_range(0..=2)?,
        layout,
    })
}

/// One arbitrary call; `images` are module images worth loading.
pub fn call(u: &mut Unstructured, known: &Known, images: Images) -> Result<Call> {
    let functions: Vec<Handle> = known.functions.iter().map(|f| f.0).collect();
    Ok(match u.int_in_range(0u8..=34)? {
        0..=2 => Call::MemAlloc {
            device: if u.ratio(1u8, 16)? { u.arbitrary()? } else { 0 },
            bytes: count(u, known)?,
        },
        3 => Call::MemFree {
            ptr: pointer(u, known)?,
        },
        4 => Call::MemGetInfo {
            device: u.int_in_range(0..=1)?,
        },
        5 => Call::MemAddressRange {
            ptr: pointer(u, known)?,
        },
        6 | 7 => Call::MemcpyHtoD {
            dst: pointer(u, known)?,
            data: bytes(u, 1024)?,
            stream: maybe_stream(u, known)?,
        },
        8 => Call::MemcpyDtoH {
            src: pointer(u, known)?,
            bytes: count(u, known)?,
            stream: maybe_stream(u, known)?,
        },
        9 => Call::MemcpyDtoD {
            dst: pointer(u, known)?,
            src: pointer(u, known)?,
            bytes: count(u, known)?,
            stream: maybe_stream(u, known)?,
        },
        10 => Call::Memset {
            dst: pointer(u, known)?,
            value: u.arbitrary()?,
            elem_bytes: if u.ratio(1u8, 8)? {
                u.arbitrary()?
            } else {
                *u.choose(&[1, 2, 4])?
            },
            count: count(u, known)?,
            pitch: if u.arbitrary()? { 0 } else { count(u, known)? },
            height: if u.arbitrary()? {
                1
            } else {
                u.int_in_range(0..=4)?
            },
            stream: maybe_stream(u, known)?,
        },
        11..=13 => Call::ModuleLoad {
            image: if images.is_empty() || u.ratio(1u8, 8)? {
                bytes(u, 1024)?
            } else {
                let mut image = u.choose(images)?.to_vec();
                if !image.is_empty() && u.ratio(1u8, 4)? {
                    let at = u.choose_index(image.len())?;
                    image[at] = u.arbitrary()?;
                }
                image
            },
        },
        14 => Call::ModuleUnload {
            module: handle(u, &known.modules)?,
        },
        15..=18 => {
            let function = handle(u, &functions)?;
            Call::Launch {
                function,
                grid: dims(u, 4)?,
                block: dims(u, 64)?,
                shared_bytes: if u.ratio(1u8, 8)? { u.arbitrary()? } else { 0 },
                stream: stream(u, known)?,
                params: params(u, known, function)?,
                attributes: attributes(u)?,
            }
        }
        19 => Call::TensorMapEncode {
            request: tensor_map(u, known)?,
        },
        20 => Call::StreamCreate {
            flags: u.int_in_range(0..=2)?,
            priority: u.int_in_range(-8..=8)?,
        },
        21 => Call::StreamDestroy {
            stream: stream(u, known)?,
        },
        22 => Call::StreamSynchronize {
            stream: stream(u, known)?,
        },
        23 => Call::StreamQuery {
            stream: stream(u, known)?,
        },
        24 => Call::StreamWaitEvent {
            stream: stream(u, known)?,
            event: handle(u, &known.events)?,
        },
        25 => Call::EventCreate {
            flags: u.int_in_range(0..=7)?,
        },
        26 => Call::EventRecord {
            event: handle(u, &known.events)?,
            stream: stream(u, known)?,
        },
        27 => match u.int_in_range(0u8..=3)? {
            0 => Call::EventQuery {
                event: handle(u, &known.events)?,
            },
            1 => Call::EventSynchronize {
                event: handle(u, &known.events)?,
            },
            2 => Call::EventElapsed {
                start: handle(u, &known.events)?,
                end: handle(u, &known.events)?,
            },
            _ => Call::EventDestroy {
                event: handle(u, &known.events)?,
            },
        },
        28 => Call::ContextSynchronize,
        29 => match u.int_in_range(0u8..=11)? {
            0 => Call::ServerStatus,
            4 => Call::SessionMove {
                session: u.int_in_range(0..=4)?,
                device: u.int_in_range(0..=2)?,
                wait_ms: u.int_in_range(0..=5)?,
            },
            5 => Call::SessionCheckpoint {
                session: u.int_in_range(0..=4)?,
                wait_ms: u.int_in_range(0..=5)?,
                hold: u.arbitrary()?,
            },
            7 => Call::SessionPark {
                image: u.arbitrary()?,
            },
            8 => Call::SessionRelease {
                session: u.int_in_range(0..=4)?,
                moved_to: u.arbitrary()?,
            },
            9 => Call::ImageRead {
                offset: u.int_in_range(0..=64)?,
                bytes: u.int_in_range(0..=64)?,
            },
            10 => Call::ImageWrite {
                offset: u.int_in_range(0..=64)?,
                data: u.arbitrary()?,
            },
            6 => Call::SessionRestore {
                session: u.int_in_range(0..=4)?,
                image: u.arbitrary()?,
                wait_ms: u.int_in_range(0..=5)?,
            },
            1 => Call::Fence,
            2 => Call::TenantPut {
                name: u.arbitrary()?,
                spec: cumux_protocol::TenantSpec {
                    memory_quota: u.arbitrary()?,
                    weight: u.arbitrary()?,
                    latency_critical: u.arbitrary()?,
                    devices: u.arbitrary()?,
                    uids: u.arbitrary()?,
                    token: u.arbitrary()?,
                },
            },
            3 => Call::TenantRemove {
                name: u.arbitrary()?,
            },
            _ => Call::DeviceHealth {
                device: u.int_in_range(0..=2)?,
                failed: u.arbitrary()?,
            },
        },
        30 => Call::HostRegister {
            base: u.arbitrary()?,
            bytes: u.int_in_range(0..=1 << 16)?,
            reached: u.arbitrary()?,
        },
        31 => Call::HostUnregister {
            region: handle(u, &known.regions.iter().map(|r| r.0).collect::<Vec<_>>())?,
        },
        32 => {
            let region = handle(u, &known.regions.iter().map(|r| r.0).collect::<Vec<_>>())?;
            let (dst_or_src, offset, bytes, stream) = (
                pointer(u, known)?,
                u.int_in_range(0..=1 << 16)?,
                count(u, known)?,
                maybe_stream(u, known)?,
            );
            if u.arbitrary()? {
                Call::MemcpyHtoDHost {
                    dst: dst_or_src,
                    region,
                    offset,
                    bytes,
                    stream,
                }
            } else {
                Call::MemcpyDtoHHost {
                    src: dst_or_src,
                    region,
                    offset,
                    bytes,
                    stream,
                }
            }
        }
        33 => Call::GraphCreate {
            launches: (0..u.int_in_range(0..=4)?)
                .map(|_| graph_launch(u, known))
                .collect::<Result<_>>()?,
        },
        _ => match u.int_in_range(0u8..=3)? {
            3 => Call::ClusterOccupancy {
                launch: graph_launch(u, known)?,
                query: if u.arbitrary()? {
                    ClusterQuery::MaxActiveClusters
                } else {
                    ClusterQuery::MaxPotentialClusterSize {
                        non_portable: u.arbitrary()?,
                    }
                },
            },
            0 | 1 => Call::GraphLaunch {
                graph: handle(u, &known.graphs)?,
                stream: stream(u, known)?,
            },
            _ => Call::GraphDestroy {
                graph: handle(u, &known.graphs)?,
            },
        },
    })
}
