//! Copies and memsets. Each takes the state lock once: it checks the stream
//! and the context, waits for host functions its work must follow, notes
//! the managed memory to push and the route its host side takes (a pinned
//! buffer, the staging buffer, or bytes on the wire), records the work when
//! its stream is being captured, and lets the lock go before anything moves.
//! 2-D and 3-D copies are split into rows here; those with an array end are
//! `array`'s.

use std::ffi::c_void;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::{Call, Handle, DEFAULT_STREAM};

use super::sync::AfterSync;
use super::*;
use crate::graph::GraphOp;
use crate::state::handles;
use crate::state::{client, Client, StagingBuffer, StagingLoan, State, StateGuard};
use crate::transport::SOCKET_CHUNK_BYTES;

/// The state, locked, with `stream` (if any) known and its host functions
/// run: where every copy and memset starts.
pub(crate) fn ready(c: &Client, stream: Option<Handle>) -> CuResult<StateGuard<'_>> {
    let st = c.lock();
    match stream {
        Some(s) => c.ready_stream(st, s),
        None => Ok(st),
    }
}

/// What a copy or memset noted under the lock to do outside it: the managed
/// memory to push before it goes out, and what follows a synchronous copy.
struct Begun {
    push: Vec<(u64, u64)>,
    after: AfterSync,
}

/// Under the lock: a current context; synchronous work (`stream: None`) runs
/// on the legacy default stream, after its host functions.
fn begin<'a>(
    c: &'a Client,
    st: StateGuard<'a>,
    stream: Option<Handle>,
) -> CuResult<(StateGuard<'a>, Begun)> {
    st.context_device()?;
    let mut st = match stream {
        None => c.ready_stream(st, DEFAULT_STREAM)?,
        Some(_) => st,
    };
    let push = st.managed_to_push(None);
    let after = match stream {
        None => AfterSync::managed(&st),
        Some(_) => AfterSync::none(),
    };
    Ok((st, Begun { push, after }))
}

/// Where a copy's host side lies, if in a registered pinned buffer: (region,
/// offset); no bytes on the wire then.
pub(crate) type Pinned = Option<(Handle, u64)>;

/// The route of a copy's host side.
enum Route {
    /// Through the client's staging buffer (a large synchronous pageable
    /// copy), on the copy's device.
    Staged(StagingLoan, u32),
    /// From or into a pinned buffer, else with the bytes on the wire.
    Direct(Pinned),
}

fn route(st: &mut State, host: usize, len: usize, stream: Option<Handle>, device: u32) -> Route {
    let pinned = st.pinned_span(host, len);
    if pinned.is_none() && stream.is_none() && len >= crate::staging::MIN_BYTES {
        if let Some(loan) = st.borrow_staging(device) {
            return Route::Staged(loan, device);
        }
    }
    Route::Direct(pinned)
}

/// Runs a copy on the lent staging buffer and gives the buffer back; `None`
/// when it cannot be had (the copy then carries its bytes).
fn staged(
    c: &Client,
    device: u32,
    loan: StagingLoan,
    copy: impl FnOnce(&StagingBuffer) -> CuResult<()>,
) -> Option<CuResult<()>> {
    let buffer = crate::staging::buffer(c, loan, device);
    let result = buffer.as_ref().map(copy);
    c.lock().return_staging(buffer);
    result
}

/// What a copy between host and device does under the lock: records `op`
/// (its host side `len` bytes at `host`) if its stream is being captured
/// (`None`: nothing left to do); else `begin`s and finds the host side's
/// route, lets the lock go and pushes managed memory.
fn prepare(
    c: &Client,
    mut st: StateGuard<'_>,
    op: GraphOp,
    host: usize,
    len: usize,
    stream: Option<Handle>,
) -> CuResult<Option<(Route, AfterSync)>> {
    let device = match &op {
        GraphOp::HtoD { dst: on, .. } | GraphOp::DtoH { src: on, .. } => c.device_for(*on, stream),
        _ => crate::state::current_device(),
    };
    if let Some(s) = stream {
        if st.capture(s, op).is_none() {
            return Ok(None);
        }
    }
    let (mut st, begun) = begin(c, st, stream)?;
    let route = route(&mut st, host, len, stream, device);
    drop(st);
    if let Err(e) = crate::managed::push(c, begun.push, None) {
        if let Route::Staged(loan, _) = route {
            c.lock().unborrow_staging(loan);
        }
        return Err(e);
    }
    Ok(Some((route, begun.after)))
}

/// How a copy's bytes move once prepared: through the lent staging buffer,
/// or from or into a pinned buffer, else on the wire.
enum Via<'b> {
    Staging(&'b StagingBuffer),
    Direct(Pinned),
}

/// A copy between host and device: [`prepare`]s it, moves its bytes with
/// `copy` by its route (on the wire where the staging buffer cannot be had)
/// and finishes it.
fn carry(
    c: &Client,
    st: StateGuard<'_>,
    op: GraphOp,
    host: usize,
    len: usize,
    stream: Option<Handle>,
    mut copy: impl FnMut(Via<'_>) -> CuResult<()>,
) -> CuResult<()> {
    let Some((route, after)) = prepare(c, st, op, host, len, stream)? else {
        return Ok(());
    };
    match route {
        Route::Staged(loan, device) => match staged(c, device, loan, |b| copy(Via::Staging(b))) {
            Some(done) => done?,
            None => copy(Via::Direct(None))?,
        },
        Route::Direct(pinned) => copy(Via::Direct(pinned))?,
    }
    after.finish(c)
}

/// Host to device; `st` from [`ready`].
pub(crate) fn htod(
    c: &Client,
    st: StateGuard<'_>,
    dst: u64,
    src: &[u8],
    stream: Option<Handle>,
) -> CuResult<()> {
    if src.is_empty() {
        return Ok(());
    }
    if pinned_host(&st, dst) {
        drop(st);
        return unified(c, dst, src.as_ptr() as u64, src.len(), stream);
    }
    let (host, len) = (src.as_ptr() as usize, src.len());
    let op = GraphOp::HtoD {
        dst,
        src: host,
        len,
    };
    carry(c, st, op, host, len, stream, |via| match via {
        Via::Staging(b) => crate::staging::htod(c, b, dst, src),
        Via::Direct(pinned) => send_htod(c, dst, src, pinned, stream),
    })
}

/// Host to device from a pinned buffer, or with the bytes on the wire (in
/// chunks).
pub(crate) fn send_htod(
    c: &Client,
    dst: u64,
    src: &[u8],
    pinned: Pinned,
    stream: Option<Handle>,
) -> CuResult<()> {
    if let Some((region, offset)) = pinned {
        let device = c.device_for(dst, stream);
        let call = |stream| Call::MemcpyHtoDHost {
            dst,
            region,
            offset,
            bytes: src.len() as u64,
            stream,
        };
        return pinned_copy(c, device, stream, call);
    }
    let link = c.link(c.device_for(dst, stream), "MemcpyHtoD")?;
    let checked = c.lock().plain_device_span(dst, src.len() as u64);
    if !checked {
        link.unchecked_copy(stream.unwrap_or(DEFAULT_STREAM));
    }
    // A synchronous copy returns once its bytes are sent (NVIDIA's driver:
    // once it holds them) where all it waits for is copies in.
    if stream.is_none()
        && checked
        && link.settled_copy_in(src, |offset, _| Call::MemcpyHtoD {
            dst: dst + offset,
            data: Vec::new(),
            stream: Some(DEFAULT_STREAM),
        })?
    {
        return Ok(());
    }
    if stream.is_none() && src.len() > SOCKET_CHUNK_BYTES && link.on_socket() {
        // A synchronous copy of several chunks over a socket: they go in
        // the default stream's order, unanswered, so the server hands each
        // to the device while it reads the next; one synchronize of that
        // stream then answers for them all (and for any that failed).
        link.calls_with_chunks(src, |offset, _| Call::MemcpyHtoD {
            dst: dst + offset,
            data: Vec::new(),
            stream: Some(DEFAULT_STREAM),
        })?;
        return link
            .call(Call::StreamSynchronize {
                stream: DEFAULT_STREAM,
            })
            .map(drop);
    }
    link.calls_with_chunks(src, |offset, _| Call::MemcpyHtoD {
        dst: dst + offset,
        data: Vec::new(),
        stream,
    })
}

/// A copy between device `device` and a pinned buffer, `call(stream)`. A
/// synchronous one (`stream: None`) goes on the default stream unanswered
/// and is waited for through a mark behind it where the device has marks:
/// no round trip when the mark comes; a synchronize of that stream (which
/// returns the copy's failure, if it failed) when it does not.
fn pinned_copy(
    c: &Client,
    device: u32,
    stream: Option<Handle>,
    call: impl Fn(Option<Handle>) -> Call,
) -> CuResult<()> {
    if stream.is_some() || !crate::marks::ready(c, device) {
        c.call_on(device, call(stream))?;
        if stream.is_none() {
            crate::marks::after_wait(c, device);
        }
        return Ok(());
    }
    c.call_on(device, call(Some(DEFAULT_STREAM)))?;
    if crate::marks::sync_streams(c, device, &[DEFAULT_STREAM])? {
        return Ok(());
    }
    let sync = Call::StreamSynchronize {
        stream: DEFAULT_STREAM,
    };
    c.call_on(device, sync).map(drop)
}

/// Whether `p`, passed where device memory goes, is the program's pinned host
/// memory instead (NVIDIA's driver takes either, its addresses being unified:
/// XLA reads 8-byte results from pinned buffers with `cuMemcpyDtoHAsync`).
/// Such a copy is [`unified`]'s, made on the host.
fn pinned_host(st: &State, p: u64) -> bool {
    !st.is_device_memory(p) && st.host_region_of(p as usize).is_some()
}

/// Device to host; `st` from [`ready`].
pub(crate) fn dtoh(
    c: &Client,
    st: StateGuard<'_>,
    dst: &mut [u8],
    src: u64,
    stream: Option<Handle>,
) -> CuResult<()> {
    if pinned_host(&st, src) {
        drop(st);
        return unified(c, dst.as_mut_ptr() as u64, src, dst.len(), stream);
    }
    let (host, len) = (dst.as_mut_ptr() as usize, dst.len());
    let op = GraphOp::DtoH {
        dst: host,
        src,
        len,
    };
    carry(c, st, op, host, len, stream, |via| match via {
        Via::Staging(b) => crate::staging::dtoh(c, b, dst, src),
        Via::Direct(pinned) => send_dtoh(c, dst, src, pinned, stream),
    })
}

/// Device to host into a pinned buffer (landing in the program's buffer:
/// with a stream, by the time the program synchronizes, as with CUDA), or
/// with the bytes on the wire (in chunks).
pub(crate) fn send_dtoh(
    c: &Client,
    dst: &mut [u8],
    src: u64,
    pinned: Pinned,
    stream: Option<Handle>,
) -> CuResult<()> {
    if let Some((region, offset)) = pinned {
        let device = c.device_for(src, stream);
        let call = |stream| Call::MemcpyDtoHHost {
            src,
            region,
            offset,
            bytes: dst.len() as u64,
            stream,
        };
        return pinned_copy(c, device, stream, call);
    }
    let link = c.link(c.device_for(src, stream), "MemcpyDtoH")?;
    link.calls_into_chunks(dst, |offset, chunk| Call::MemcpyDtoH {
        src: src + offset,
        bytes: chunk.len() as u64,
        stream,
    })
}

/// Device to device; `st` from [`ready`].
fn dtod(
    c: &Client,
    st: StateGuard<'_>,
    dst: u64,
    src: u64,
    bytes: usize,
    stream: Option<Handle>,
) -> CuResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    if pinned_host(&st, dst) || pinned_host(&st, src) {
        drop(st);
        return unified(c, dst, src, bytes, stream);
    }
    let placements = c.placements();
    if let (Some(from), Some(to)) = (placements.device_of(src), placements.device_of(dst)) {
        if from != to {
            return peer_copy(c, st, dst, src, bytes, stream);
        }
    }
    let (mut st, begun) = begin(c, st, stream)?;
    let plain = st.plain_device_span(dst, bytes as u64) && st.plain_device_span(src, bytes as u64);
    let call = st.capture_call(Call::MemcpyDtoD {
        dst,
        src,
        bytes: bytes as u64,
        stream,
    });
    drop(st);
    crate::managed::push(c, begun.push, None)?;
    if let Some(call) = call {
        c.call(unwaited(c, call, dst, stream, plain)?)?;
    }
    begun.after.finish(c)
}

/// `call`, device work on `dst` in `stream`'s order (`None`: synchronous),
/// as it goes out: where it touches only plain device memory (`plain`,
/// [`crate::state::State::plain_device_span`]), a synchronous one goes
/// unanswered on the legacy default stream, as NVIDIA's driver returns from a
/// memset or a copy within the device at once; elsewhere its stream's waits
/// are left to the server (`Link::unchecked_copy`).
fn unwaited(
    c: &Client,
    mut call: Call,
    dst: u64,
    stream: Option<Handle>,
    plain: bool,
) -> CuResult<Call> {
    if !plain {
        if let Some(s) = stream {
            c.link(c.device_for(dst, stream), (&call).into())?
                .unchecked_copy(s);
        }
        return Ok(call);
    }
    if let Call::MemcpyDtoD { stream, .. } | Call::Memset { stream, .. } = &mut call {
        stream.get_or_insert(DEFAULT_STREAM);
    }
    Ok(call)
}

/// A copy between two of the program's devices: read from the source's
/// session, written through the destination's (each device is a session of
/// its own; devices of two servers reach each other only through the
/// program). The read waits for the work queued on `stream` before it: in
/// that stream's order where it is the source device's (the copy then costs
/// the read's round trip and the write's, and the stream is known idle
/// after, so an event recorded behind the copy is reached without asking),
/// else after synchronizing the stream. The write is answered before this
/// returns, so whatever the program orders after the copy finds it done.
/// Not in a captured stream.
fn peer_copy(
    c: &Client,
    st: StateGuard<'_>,
    dst: u64,
    src: u64,
    bytes: usize,
    stream: Option<Handle>,
) -> CuResult<()> {
    if stream.is_some_and(|s| st.capturing(s)) {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    drop(st);
    let source = c.device_for(src, None);
    let read_on = match stream {
        Some(s) if c.device_for(src, Some(s)) == source => Some(s),
        Some(s) => {
            c.call_on(
                c.device_for(dst, Some(s)),
                Call::StreamSynchronize { stream: s },
            )?;
            None
        }
        None => None,
    };
    let mut staged = vec![0u8; bytes];
    dtoh(c, ready(c, read_on)?, &mut staged, src, read_on)?;
    htod(c, ready(c, None)?, dst, &staged, None)
}

/// `cuMemcpy`: the direction follows from the pointers.
fn unified(c: &Client, dst: u64, src: u64, bytes: usize, stream: Option<Handle>) -> CuResult<()> {
    let st = ready(c, stream)?;
    match (st.is_device_memory(dst), st.is_device_memory(src)) {
        (true, true) => dtod(c, st, dst, src, bytes, stream),
        (true, false) => htod(c, st, dst, host_bytes(src as *const c_void, bytes)?, stream),
        (false, true) => dtoh(
            c,
            st,
            host_bytes_mut(dst as *mut c_void, bytes)?,
            src,
            stream,
        ),
        (false, false) => {
            drop(st);
            if let Some(s) = stream {
                c.call(Call::StreamSynchronize { stream: s })?;
            }
            let from = host_bytes(src as *const c_void, bytes)?;
            host_bytes_mut(dst as *mut c_void, bytes)?.copy_from_slice(from);
            Ok(())
        }
    }
}

/// A memset's shape: `height` rows of `count` elements of `elem` bytes,
/// `pitch` bytes apart.
struct Fill {
    value: u32,
    elem: u8,
    count: usize,
    pitch: usize,
    height: usize,
}

impl Fill {
    /// One row of `count` elements.
    fn row(value: u32, elem: u8, count: usize) -> Fill {
        Fill {
            value,
            elem,
            count,
            pitch: count * elem as usize,
            height: 1,
        }
    }
}

fn memset(c: &Client, dst: u64, f: Fill, stream: *mut c_void, asynchronous: bool) -> CuResult<()> {
    let c_stream = if asynchronous {
        Some(handles::stream(stream)?)
    } else {
        None
    };
    let st = ready(c, c_stream)?;
    if f.count == 0 || f.height == 0 {
        return Ok(());
    }
    if f.height > 1 && f.pitch < f.count * f.elem as usize {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (mut st, begun) = begin(c, st, c_stream)?;
    let span = f.pitch as u64 * (f.height as u64 - 1) + f.count as u64 * f.elem as u64;
    let plain = st.plain_device_span(dst, span);
    let call = st.capture_call(Call::Memset {
        dst,
        value: f.value,
        elem_bytes: f.elem,
        count: f.count as u64,
        pitch: f.pitch as u64,
        height: f.height as u64,
        stream: c_stream,
    });
    drop(st);
    crate::managed::push(c, begun.push, None)?;
    match call {
        Some(call) => c.call(unwaited(c, call, dst, c_stream, plain)?).map(|_| ()),
        None => Ok(()),
    }
}

/// One side of a strided copy.
#[derive(Clone, Copy)]
enum Side {
    Host(usize),
    Device(u64),
}

fn side(st: &State, kind: CUmemorytype, host: usize, device: u64) -> CuResult<Side> {
    match kind {
        CU_MEMORYTYPE_HOST => Ok(Side::Host(host)),
        CU_MEMORYTYPE_DEVICE => Ok(Side::Device(device)),
        CU_MEMORYTYPE_UNIFIED if st.is_device_memory(device) => Ok(Side::Device(device)),
        CU_MEMORYTYPE_UNIFIED => Ok(Side::Host(device as usize)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Where one side of a strided copy starts (`x` bytes, `y` rows, `z`
/// layers in) and how far its rows (`pitch` bytes) and layers (`height`
/// rows) lie apart.
struct Layout {
    x: usize,
    y: usize,
    z: usize,
    pitch: usize,
    height: usize,
}

/// (source offset, destination offset) of each row of `height` rows in each
/// of `depth` layers.
fn rows(src: Layout, dst: Layout, height: usize, depth: usize) -> Vec<(u64, u64)> {
    let at =
        |l: &Layout, z: usize, y: usize| (((l.z + z) * l.height + l.y + y) * l.pitch + l.x) as u64;
    let mut rows = Vec::with_capacity(height * depth);
    for z in 0..depth {
        for y in 0..height {
            rows.push((at(&src, z, y), at(&dst, z, y)));
        }
    }
    rows
}

/// The range of the host side's rows: (first byte's offset, length).
fn host_span(offsets: impl Iterator<Item = u64> + Clone, width: usize) -> (u64, usize) {
    let lo = offsets.clone().min().unwrap_or(0);
    let hi = offsets.max().unwrap_or(0) + width as u64;
    (lo, (hi - lo) as usize)
}

/// Copies `width` bytes for each (source offset, destination offset) row;
/// `st` from [`ready`]. A synchronous copy (`stream: None`) queues the rows
/// on the default stream and waits once.
fn copy_rows(
    c: &Client,
    mut st: StateGuard<'_>,
    src: Side,
    dst: Side,
    width: usize,
    rows: &[(u64, u64)],
    stream: Option<Handle>,
) -> CuResult<()> {
    if width == 0 || rows.is_empty() {
        return Ok(());
    }
    let queue = stream.unwrap_or(DEFAULT_STREAM);
    match (src, dst) {
        (Side::Host(s), Side::Device(d)) => {
            if st.capturing(queue) {
                for &(so, dof) in rows {
                    let src = s + so as usize;
                    host_bytes(src as *const c_void, width)?;
                    let op = GraphOp::HtoD {
                        dst: d + dof,
                        src,
                        len: width,
                    };
                    st.capture(queue, op);
                }
                return Ok(());
            }
            let (st, begun) = begin(c, st, Some(queue))?;
            // Rows all in one pinned buffer go straight from it.
            let (lo, len) = host_span(rows.iter().map(|r| r.0), width);
            let pinned = s
                .checked_add(lo as usize)
                .and_then(|start| st.pinned_span(start, len));
            drop(st);
            crate::managed::push(c, begun.push, None)?;
            for &(so, dof) in rows {
                let bytes = host_bytes((s + so as usize) as *const c_void, width)?;
                let at = pinned.map(|(region, offset)| (region, offset + (so - lo)));
                send_htod(c, d + dof, bytes, at, Some(queue))?;
            }
        }
        (Side::Device(s), Side::Device(d)) => {
            let (mut st, begun) = begin(c, st, Some(queue))?;
            let captured = st.capturing(queue);
            let row = |(so, dof): (u64, u64)| Call::MemcpyDtoD {
                dst: d + dof,
                src: s + so,
                bytes: width as u64,
                stream: Some(queue),
            };
            if captured {
                for &r in rows {
                    st.capture_call(row(r));
                }
            }
            drop(st);
            crate::managed::push(c, begun.push, None)?;
            if !captured {
                for &r in rows {
                    c.call(row(r))?;
                }
            }
        }
        (Side::Device(s), Side::Host(d)) => {
            let (lo, len) = host_span(rows.iter().map(|r| r.1), width);
            let pinned = d
                .checked_add(lo as usize)
                .and_then(|start| st.pinned_span(start, len));
            let Some((region, offset)) = pinned else {
                // One read covering every row, then scatter on the host.
                let (lo, len) = host_span(rows.iter().map(|r| r.0), width);
                let mut span = vec![0u8; len];
                dtoh(c, st, &mut span, s + lo, stream)?;
                for &(so, dof) in rows {
                    let from = &span[(so - lo) as usize..(so - lo) as usize + width];
                    host_bytes_mut((d + dof as usize) as *mut c_void, width)?.copy_from_slice(from);
                }
                return Ok(());
            };
            // Each row straight into the pinned buffer, in stream order.
            if st.capturing(queue) {
                for &(so, dof) in rows {
                    let op = GraphOp::DtoH {
                        dst: d + dof as usize,
                        src: s + so,
                        len: width,
                    };
                    st.capture(queue, op);
                }
                return Ok(());
            }
            let (st, begun) = begin(c, st, Some(queue))?;
            drop(st);
            crate::managed::push(c, begun.push, None)?;
            for &(so, dof) in rows {
                let bytes = host_bytes_mut((d + dof as usize) as *mut c_void, width)?;
                let at = Some((region, offset + (dof - lo)));
                send_dtoh(c, bytes, s + so, at, Some(queue))?;
            }
        }
        (Side::Host(s), Side::Host(d)) => {
            drop(st);
            if let Some(st) = stream {
                c.call(Call::StreamSynchronize { stream: st })?;
            }
            for &(so, dof) in rows {
                let from = host_bytes((s + so as usize) as *const c_void, width)?;
                host_bytes_mut((d + dof as usize) as *mut c_void, width)?.copy_from_slice(from);
            }
            return Ok(());
        }
    }
    if stream.is_none() {
        c.call(Call::StreamSynchronize {
            stream: DEFAULT_STREAM,
        })?;
    }
    Ok(())
}

/// A pitch or height of 0 means "as wide (high) as the copy".
fn or(value: usize, default: usize) -> usize {
    if value == 0 {
        default
    } else {
        value
    }
}

fn copy_2d(c: &Client, p: &CUDA_MEMCPY2D, stream: Option<Handle>) -> CuResult<()> {
    if p.srcMemoryType == CU_MEMORYTYPE_ARRAY || p.dstMemoryType == CU_MEMORYTYPE_ARRAY {
        return super::array::memcpy_2d(c, p, stream);
    }
    let st = ready(c, stream)?;
    let src = side(&st, p.srcMemoryType, p.srcHost as usize, p.srcDevice)?;
    let dst = side(&st, p.dstMemoryType, p.dstHost as usize, p.dstDevice)?;
    let src_pitch = or(p.srcPitch, p.WidthInBytes);
    let dst_pitch = or(p.dstPitch, p.WidthInBytes);
    if src_pitch < p.WidthInBytes + p.srcXInBytes || dst_pitch < p.WidthInBytes + p.dstXInBytes {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let layout = |x, y, pitch| Layout {
        x,
        y,
        z: 0,
        pitch,
        height: 0,
    };
    let rows = rows(
        layout(p.srcXInBytes, p.srcY, src_pitch),
        layout(p.dstXInBytes, p.dstY, dst_pitch),
        p.Height,
        1,
    );
    copy_rows(c, st, src, dst, p.WidthInBytes, &rows, stream)
}

pub(crate) fn copy_3d(c: &Client, p: &CUDA_MEMCPY3D, stream: Option<Handle>) -> CuResult<()> {
    if p.srcMemoryType == CU_MEMORYTYPE_ARRAY || p.dstMemoryType == CU_MEMORYTYPE_ARRAY {
        return super::array::memcpy_3d(c, p, stream);
    }
    let st = ready(c, stream)?;
    let src = side(&st, p.srcMemoryType, p.srcHost as usize, p.srcDevice)?;
    let dst = side(&st, p.dstMemoryType, p.dstHost as usize, p.dstDevice)?;
    let src_layout = Layout {
        x: p.srcXInBytes,
        y: p.srcY,
        z: p.srcZ,
        pitch: or(p.srcPitch, p.WidthInBytes),
        height: or(p.srcHeight, p.Height),
    };
    let dst_layout = Layout {
        x: p.dstXInBytes,
        y: p.dstY,
        z: p.dstZ,
        pitch: or(p.dstPitch, p.WidthInBytes),
        height: or(p.dstHeight, p.Height),
    };
    let rows = rows(src_layout, dst_layout, p.Height, p.Depth);
    copy_rows(c, st, src, dst, p.WidthInBytes, &rows, stream)
}

/// The server stream of an asynchronous copy's stream argument.
fn on(stream: *mut c_void) -> CuResult<Option<Handle>> {
    handles::stream(stream).map(Some)
}

driver_fn! {
    fn cuMemcpyHtoD_v2 | cuMemcpyHtoD_v2_ptds (dst: u64, src: *const c_void, bytes: usize) {
        let c = client()?;
        let src = host_bytes(src, bytes)?;
        htod(c, c.lock(), dst, src, None)
    }

    fn cuMemcpyDtoH_v2 | cuMemcpyDtoH_v2_ptds (dst: *mut c_void, src: u64, bytes: usize) {
        let c = client()?;
        let dst = host_bytes_mut(dst, bytes)?;
        dtoh(c, c.lock(), dst, src, None)
    }

    fn cuMemcpyDtoD_v2 | cuMemcpyDtoD_v2_ptds (dst: u64, src: u64, bytes: usize) {
        let c = client()?;
        dtod(c, c.lock(), dst, src, bytes, None)
    }

    fn cuMemcpyHtoDAsync_v2 | cuMemcpyHtoDAsync_v2_ptsz (dst: u64, src: *const c_void, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        let src = host_bytes(src, bytes)?;
        let stream = on(stream)?;
        htod(c, ready(c, stream)?, dst, src, stream)
    }

    fn cuMemcpyDtoHAsync_v2 | cuMemcpyDtoHAsync_v2_ptsz (dst: *mut c_void, src: u64, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        let dst = host_bytes_mut(dst, bytes)?;
        let stream = on(stream)?;
        dtoh(c, ready(c, stream)?, dst, src, stream)
    }

    fn cuMemcpyDtoDAsync_v2 | cuMemcpyDtoDAsync_v2_ptsz (dst: u64, src: u64, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        let stream = on(stream)?;
        dtod(c, ready(c, stream)?, dst, src, bytes, stream)
    }

    fn cuMemcpy | cuMemcpy_ptds (dst: u64, src: u64, bytes: usize) {
        unified(client()?, dst, src, bytes, None)
    }

    fn cuMemcpyAsync | cuMemcpyAsync_ptsz (dst: u64, src: u64, bytes: usize, stream: *mut c_void) {
        unified(client()?, dst, src, bytes, on(stream)?)
    }

    fn cuMemcpyPeer | cuMemcpyPeer_ptds (dst: u64, _dst_ctx: *mut c_void, src: u64, _src_ctx: *mut c_void, bytes: usize) {
        let c = client()?;
        dtod(c, c.lock(), dst, src, bytes, None)
    }

    fn cuMemcpyPeerAsync | cuMemcpyPeerAsync_ptsz (dst: u64, _dst_ctx: *mut c_void, src: u64, _src_ctx: *mut c_void, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        let stream = on(stream)?;
        dtod(c, ready(c, stream)?, dst, src, bytes, stream)
    }

    fn cuMemcpy2D_v2 | cuMemcpy2D_v2_ptds | cuMemcpy2DUnaligned_v2 | cuMemcpy2DUnaligned_v2_ptds (p: *const CUDA_MEMCPY2D) {
        copy_2d(client()?, read_in(p)?, None)
    }

    fn cuMemcpy2DAsync_v2 | cuMemcpy2DAsync_v2_ptsz (p: *const CUDA_MEMCPY2D, stream: *mut c_void) {
        let c = client()?;
        let p = read_in(p)?;
        copy_2d(c, p, on(stream)?)
    }

    fn cuMemcpy3D_v2 | cuMemcpy3D_v2_ptds (p: *const CUDA_MEMCPY3D) {
        copy_3d(client()?, read_in(p)?, None)
    }

    fn cuMemcpy3DAsync_v2 | cuMemcpy3DAsync_v2_ptsz (p: *const CUDA_MEMCPY3D, stream: *mut c_void) {
        let c = client()?;
        let p = read_in(p)?;
        copy_3d(c, p, on(stream)?)
    }

    fn cuMemsetD8_v2 | cuMemsetD8_v2_ptds (dst: u64, value: u8, n: usize) {
        memset(client()?, dst, Fill::row(value as u32, 1, n), std::ptr::null_mut(), false)
    }

    fn cuMemsetD16_v2 | cuMemsetD16_v2_ptds (dst: u64, value: u16, n: usize) {
        memset(client()?, dst, Fill::row(value as u32, 2, n), std::ptr::null_mut(), false)
    }

    fn cuMemsetD32_v2 | cuMemsetD32_v2_ptds (dst: u64, value: u32, n: usize) {
        memset(client()?, dst, Fill::row(value, 4, n), std::ptr::null_mut(), false)
    }

    fn cuMemsetD8Async | cuMemsetD8Async_ptsz (dst: u64, value: u8, n: usize, stream: *mut c_void) {
        memset(client()?, dst, Fill::row(value as u32, 1, n), stream, true)
    }

    fn cuMemsetD16Async | cuMemsetD16Async_ptsz (dst: u64, value: u16, n: usize, stream: *mut c_void) {
        memset(client()?, dst, Fill::row(value as u32, 2, n), stream, true)
    }

    fn cuMemsetD32Async | cuMemsetD32Async_ptsz (dst: u64, value: u32, n: usize, stream: *mut c_void) {
        memset(client()?, dst, Fill::row(value, 4, n), stream, true)
    }

    fn cuMemsetD2D8_v2 | cuMemsetD2D8_v2_ptds (dst: u64, pitch: usize, value: u8, w: usize, h: usize) {
        memset(client()?, dst, Fill { value: value as u32, elem: 1, count: w, pitch, height: h }, std::ptr::null_mut(), false)
    }

    fn cuMemsetD2D16_v2 | cuMemsetD2D16_v2_ptds (dst: u64, pitch: usize, value: u16, w: usize, h: usize) {
        memset(client()?, dst, Fill { value: value as u32, elem: 2, count: w, pitch, height: h }, std::ptr::null_mut(), false)
    }

    fn cuMemsetD2D32_v2 | cuMemsetD2D32_v2_ptds (dst: u64, pitch: usize, value: u32, w: usize, h: usize) {
        memset(client()?, dst, Fill { value, elem: 4, count: w, pitch, height: h }, std::ptr::null_mut(), false)
    }

    fn cuMemsetD2D8Async | cuMemsetD2D8Async_ptsz (dst: u64, pitch: usize, value: u8, w: usize, h: usize, stream: *mut c_void) {
        memset(client()?, dst, Fill { value: value as u32, elem: 1, count: w, pitch, height: h }, stream, true)
    }

    fn cuMemsetD2D16Async | cuMemsetD2D16Async_ptsz (dst: u64, pitch: usize, value: u16, w: usize, h: usize, stream: *mut c_void) {
        memset(client()?, dst, Fill { value: value as u32, elem: 2, count: w, pitch, height: h }, stream, true)
    }

    fn cuMemsetD2D32Async | cuMemsetD2D32Async_ptsz (dst: u64, pitch: usize, value: u32, w: usize, h: usize, stream: *mut c_void) {
        memset(client()?, dst, Fill { value, elem: 4, count: w, pitch, height: h }, stream, true)
    }
}
