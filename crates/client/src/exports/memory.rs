//! Device memory (allocation, copies, memsets, address queries), pinned host
//! memory (client-side, tracked so pointer queries can answer "host"), and
//! the stream-ordered allocator. 2-D and 3-D copies are split into rows here.

use std::ffi::c_void;

use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::{Call, Handle, ReplyBody, DEFAULT_STREAM};

use super::*;
use crate::state::{client, Client, HostRegion};
use cumux_cuda_bindings::{consts::*, types::*};

const PITCH_ALIGN: usize = 512;

fn alloc(c: &Client, bytes: usize) -> CuResult<u64> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let device = c.context_device()?;
    match c.call(Call::MemAlloc {
        device,
        bytes: bytes as u64,
    })? {
        ReplyBody::Ptr(p) => {
            c.tables().allocations.insert(p, bytes as u64);
            Ok(p)
        }
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

fn free(c: &Client, ptr: u64) -> CuResult<()> {
    c.context_device()?;
    if ptr == 0 {
        return Ok(());
    }
    crate::managed::forget(c, ptr);
    c.call(Call::MemFree { ptr })?;
    c.tables().allocations.remove(&ptr);
    Ok(())
}

/// The server stream for a handle, without waiting (queries, sync).
pub(crate) fn stream_handle(c: &Client, s: *mut c_void) -> CuResult<Handle> {
    c.tables().stream_server(handle(s))
}

/// The server stream for new work: waits until host functions queued on it
/// have run, so the work starts after them.
pub(crate) fn stream_of(c: &Client, s: *mut c_void) -> CuResult<Handle> {
    let stream = stream_handle(c, s)?;
    c.gates.get(stream).wait_idle();
    Ok(stream)
}

/// Copies and memsets need a current context; synchronous ones run on the
/// default stream, after its host functions.
fn default_stream_work(c: &Client, stream: Option<Handle>) -> CuResult<()> {
    c.context_device()?;
    if stream.is_none() {
        c.gates.get(DEFAULT_STREAM).wait_idle();
    }
    crate::managed::to_device(c)
}

/// After a synchronous copy: the host may read managed memory again.
fn after_sync_copy(c: &Client, stream: Option<Handle>) -> CuResult<()> {
    if stream.is_none() {
        crate::managed::to_host(c)?;
    }
    Ok(())
}

pub(crate) fn htod(c: &Client, dst: u64, src: &[u8], stream: Option<Handle>) -> CuResult<()> {
    if src.is_empty() {
        return Ok(());
    }
    if let Some(s) = stream {
        let op = crate::graph::GraphOp::HtoD {
            dst,
            src: src.as_ptr() as usize,
            len: src.len(),
        };
        if c.record(s, op).is_none() {
            return Ok(());
        }
    }
    default_stream_work(c, stream)?;
    if let Some((region, offset)) = crate::pinned::span(c, src.as_ptr() as usize, src.len()) {
        c.call(Call::MemcpyHtoDHost {
            dst,
            region,
            offset,
            bytes: src.len() as u64,
            stream,
        })?;
        return after_sync_copy(c, stream);
    }
    if stream.is_none() {
        if let Some(staged) = crate::staging::htod(c, dst, src) {
            staged?;
            return after_sync_copy(c, stream);
        }
    }
    for (i, chunk) in src.chunks(MAX_CHUNK_BYTES).enumerate() {
        c.call_with_bytes(
            Call::MemcpyHtoD {
                dst: dst + (i * MAX_CHUNK_BYTES) as u64,
                data: Vec::new(),
                stream,
            },
            chunk,
        )?;
    }
    after_sync_copy(c, stream)
}

pub(crate) fn dtoh(c: &Client, dst: &mut [u8], src: u64, stream: Option<Handle>) -> CuResult<()> {
    if let Some(s) = stream {
        let op = crate::graph::GraphOp::DtoH {
            dst: dst.as_mut_ptr() as usize,
            src,
            len: dst.len(),
        };
        if c.record(s, op).is_none() {
            return Ok(());
        }
    }
    default_stream_work(c, stream)?;
    if let Some((region, offset)) = crate::pinned::span(c, dst.as_ptr() as usize, dst.len()) {
        // Lands in the program's buffer: with a stream, by the time the
        // program synchronizes, as with CUDA.
        c.call(Call::MemcpyDtoHHost {
            src,
            region,
            offset,
            bytes: dst.len() as u64,
            stream,
        })?;
        return after_sync_copy(c, stream);
    }
    if stream.is_none() {
        if let Some(staged) = crate::staging::dtoh(c, dst, src) {
            staged?;
            return after_sync_copy(c, stream);
        }
    }
    for (i, chunk) in dst.chunks_mut(MAX_CHUNK_BYTES).enumerate() {
        let call = Call::MemcpyDtoH {
            src: src + (i * MAX_CHUNK_BYTES) as u64,
            bytes: chunk.len() as u64,
            stream,
        };
        c.call_into(call, chunk)?;
    }
    after_sync_copy(c, stream)
}

fn dtod(c: &Client, dst: u64, src: u64, bytes: usize, stream: Option<Handle>) -> CuResult<()> {
    if bytes == 0 {
        return Ok(());
    }
    default_stream_work(c, stream)?;
    c.call(Call::MemcpyDtoD {
        dst,
        src,
        bytes: bytes as u64,
        stream,
    })?;
    after_sync_copy(c, stream)
}

/// `cuMemcpy`: the direction follows from the pointers' values.
fn unified(c: &Client, dst: u64, src: u64, bytes: usize, stream: Option<Handle>) -> CuResult<()> {
    match (c.is_device_memory(dst), c.is_device_memory(src)) {
        (true, true) => dtod(c, dst, src, bytes, stream),
        (true, false) => htod(c, dst, host_bytes(src as *const c_void, bytes)?, stream),
        (false, true) => dtoh(c, host_bytes_mut(dst as *mut c_void, bytes)?, src, stream),
        (false, false) => {
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

fn memset(c: &Client, dst: u64, f: Fill, stream: Option<Handle>) -> CuResult<()> {
    if f.count == 0 || f.height == 0 {
        return Ok(());
    }
    if f.height > 1 && f.pitch < f.count * f.elem as usize {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    default_stream_work(c, stream)?;
    c.call(Call::Memset {
        dst,
        value: f.value,
        elem_bytes: f.elem,
        count: f.count as u64,
        pitch: f.pitch as u64,
        height: f.height as u64,
        stream,
    })
    .map(|_| ())
}

/// One side of a strided copy.
#[derive(Clone, Copy)]
enum Side {
    Host(usize),
    Device(u64),
}

fn side(c: &Client, kind: u32, host: usize, device: u64) -> CuResult<Side> {
    match kind {
        CU_MEMORYTYPE_HOST => Ok(Side::Host(host)),
        CU_MEMORYTYPE_DEVICE => Ok(Side::Device(device)),
        CU_MEMORYTYPE_UNIFIED if c.is_device_memory(device) => Ok(Side::Device(device)),
        CU_MEMORYTYPE_UNIFIED => Ok(Side::Host(device as usize)),
        CU_MEMORYTYPE_ARRAY => {
            tracing::warn!("copies to or from CUDA arrays are not implemented");
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Copies `width` bytes for each (source offset, destination offset) row.
/// A synchronous copy (`stream: None`) queues the rows on the default stream
/// and waits once.
fn copy_rows(
    c: &Client,
    src: Side,
    dst: Side,
    width: usize,
    rows: &[(u64, u64)],
    stream: Option<Handle>,
) -> CuResult<()> {
    if width == 0 || rows.is_empty() {
        return Ok(());
    }
    let queue = Some(stream.unwrap_or(DEFAULT_STREAM));
    match (src, dst) {
        (Side::Host(s), Side::Device(d)) => {
            for &(so, dof) in rows {
                htod(
                    c,
                    d + dof,
                    host_bytes((s + so as usize) as *const c_void, width)?,
                    queue,
                )?;
            }
        }
        (Side::Device(s), Side::Device(d)) => {
            for &(so, dof) in rows {
                dtod(c, d + dof, s + so, width, queue)?;
            }
        }
        (Side::Device(s), Side::Host(d)) if pinned_rows(c, d, width, rows) => {
            // Each row straight into the pinned buffer, in stream order.
            for &(so, dof) in rows {
                dtoh(
                    c,
                    host_bytes_mut((d + dof as usize) as *mut c_void, width)?,
                    s + so,
                    queue,
                )?;
            }
        }
        (Side::Device(s), Side::Host(d)) => {
            // One read covering every row, then scatter on the host.
            let lo = rows.iter().map(|r| r.0).min().unwrap_or(0);
            let hi = rows.iter().map(|r| r.0).max().unwrap_or(0) + width as u64;
            let mut span = vec![0u8; (hi - lo) as usize];
            dtoh(c, &mut span, s + lo, stream)?;
            for &(so, dof) in rows {
                let from = &span[(so - lo) as usize..(so - lo) as usize + width];
                host_bytes_mut((d + dof as usize) as *mut c_void, width)?.copy_from_slice(from);
            }
            return Ok(());
        }
        (Side::Host(s), Side::Host(d)) => {
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

/// Whether the host rows at `host` + each row's destination offset all lie
/// in one pinned buffer (so device-to-host rows can land there directly).
fn pinned_rows(c: &Client, host: usize, width: usize, rows: &[(u64, u64)]) -> bool {
    let lo = rows.iter().map(|r| r.1).min().unwrap_or(0) as usize;
    let hi = rows.iter().map(|r| r.1).max().unwrap_or(0) as usize;
    let start = host.checked_add(lo);
    let len = (hi - lo).checked_add(width);
    matches!((start, len), (Some(start), Some(len)) if crate::pinned::span(c, start, len).is_some())
}

fn copy_2d(c: &Client, p: &CUDA_MEMCPY2D, stream: Option<Handle>) -> CuResult<()> {
    let src = side(c, p.srcMemoryType, p.srcHost as usize, p.srcDevice)?;
    let dst = side(c, p.dstMemoryType, p.dstHost as usize, p.dstDevice)?;
    let src_pitch = if p.srcPitch == 0 {
        p.WidthInBytes
    } else {
        p.srcPitch
    };
    let dst_pitch = if p.dstPitch == 0 {
        p.WidthInBytes
    } else {
        p.dstPitch
    };
    if src_pitch < p.WidthInBytes + p.srcXInBytes || dst_pitch < p.WidthInBytes + p.dstXInBytes {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let rows: Vec<(u64, u64)> = (0..p.Height)
        .map(|r| {
            (
                ((p.srcY + r) * src_pitch + p.srcXInBytes) as u64,
                ((p.dstY + r) * dst_pitch + p.dstXInBytes) as u64,
            )
        })
        .collect();
    copy_rows(c, src, dst, p.WidthInBytes, &rows, stream)
}

fn copy_3d(c: &Client, p: &CUDA_MEMCPY3D, stream: Option<Handle>) -> CuResult<()> {
    let src = side(c, p.srcMemoryType, p.srcHost as usize, p.srcDevice)?;
    let dst = side(c, p.dstMemoryType, p.dstHost as usize, p.dstDevice)?;
    let src_pitch = if p.srcPitch == 0 {
        p.WidthInBytes
    } else {
        p.srcPitch
    };
    let dst_pitch = if p.dstPitch == 0 {
        p.WidthInBytes
    } else {
        p.dstPitch
    };
    let src_height = if p.srcHeight == 0 {
        p.Height
    } else {
        p.srcHeight
    };
    let dst_height = if p.dstHeight == 0 {
        p.Height
    } else {
        p.dstHeight
    };
    let mut rows = Vec::with_capacity(p.Height * p.Depth);
    for z in 0..p.Depth {
        for y in 0..p.Height {
            rows.push((
                (((p.srcZ + z) * src_height + p.srcY + y) * src_pitch + p.srcXInBytes) as u64,
                (((p.dstZ + z) * dst_height + p.dstY + y) * dst_pitch + p.dstXInBytes) as u64,
            ));
        }
    }
    copy_rows(c, src, dst, p.WidthInBytes, &rows, stream)
}

fn host_alloc(c: &Client, bytes: usize, flags: u32) -> CuResult<*mut c_void> {
    c.context_device()?;
    if let Some(pinned) = crate::pinned::alloc(c, bytes) {
        let p = pinned.ptr();
        c.tables().host.insert(
            p as usize,
            HostRegion {
                size: bytes,
                flags,
                owned: true,
                pinned: Some(pinned),
            },
        );
        return Ok(p);
    }
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: posix_memalign writes an owned allocation into `p` on success.
    let rc = unsafe { libc::posix_memalign(&mut p, 4096, bytes.max(1)) };
    if rc != 0 || p.is_null() {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    c.tables().host.insert(
        p as usize,
        HostRegion {
            size: bytes,
            flags,
            owned: true,
            pinned: None,
        },
    );
    Ok(p)
}

/// Pool handles: one default pool per device; created pools share its memory.
const DEFAULT_POOL_BASE: usize = 0x7000_0000;

fn pointer_attribute(c: &Client, attr: u32, ptr: u64, data: *mut c_void) -> CuResult<()> {
    let t = c.tables();
    let device = t.allocation_of(ptr);
    let host = t.host_region_of(ptr as usize).map(|(b, r)| (b, r.size));
    drop(t);
    if device.is_none() && host.is_none() {
        if attr == 13 || attr == 8 {
            // MAPPED / IS_MANAGED: a plain "no" for unknown memory.
            return out(data.cast::<u32>(), 0);
        }
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = c.current_device();
    let ctx = c.primary_context(dev);
    let (base, size) = device
        .or(host.map(|(b, s)| (b as u64, s as u64)))
        .unwrap_or((ptr, 0));
    let managed = device.is_some() && c.tables().managed.contains_key(&base);
    match attr {
        1 => out(data.cast::<*mut c_void>(), to_ptr(ctx)),
        2 => out(
            data.cast::<u32>(),
            if device.is_some() {
                CU_MEMORYTYPE_DEVICE
            } else {
                CU_MEMORYTYPE_HOST
            },
        ),
        3 => out(data.cast::<u64>(), ptr),
        4 => out(
            data.cast::<u64>(),
            if device.is_some() && !managed { 0 } else { ptr },
        ),
        6 => out(data.cast::<u32>(), 1),
        7 | 20 => out(data.cast::<u64>(), base),
        8 => out(data.cast::<u32>(), managed as u32),
        9 => out(data.cast::<i32>(), dev as i32),
        10 | 15 | 21 => out(data.cast::<u32>(), 0),
        11 | 19 => out(data.cast::<u64>(), base),
        12 | 18 => out(data.cast::<usize>(), size as usize),
        13 => out(data.cast::<u32>(), 1),
        14 => out(data.cast::<u64>(), 0),
        16 => out(data.cast::<u32>(), 3),
        17 => out(data.cast::<*mut c_void>(), std::ptr::null_mut()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

driver_fn! {
    fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) {
        let c = client()?;
        out(dptr, alloc(c, bytes)?)
    }

    fn cuMemAllocManaged(dptr: *mut u64, bytes: usize, flags: u32) {
        // CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST.
        if flags != 1 && flags != 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = client()?;
        out(dptr, crate::managed::alloc(c, bytes)?)
    }

    fn cuMemAllocPitch_v2(dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: u32) {
        if !matches!(elem, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = client()?;
        let p = width.next_multiple_of(PITCH_ALIGN);
        out(dptr, alloc(c, p * height)?)?;
        out(pitch, p)
    }

    fn cuMemFree_v2(ptr: u64) {
        free(client()?, ptr)
    }

    fn cuMemGetInfo_v2(free_bytes: *mut usize, total: *mut usize) {
        let c = client()?;
        match c.call(Call::MemGetInfo { device: c.context_device()? })? {
            ReplyBody::MemInfo { free, total: t } => {
                out_opt(free_bytes, free as usize);
                out_opt(total, t as usize);
                Ok(())
            }
            _ => Err(CUDA_ERROR_UNKNOWN),
        }
    }

    fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, ptr: u64) {
        let c = client()?;
        let (b, s) = c.tables().allocation_of(ptr).ok_or(CUDA_ERROR_NOT_FOUND)?;
        out_opt(base, b);
        out_opt(size, s as usize);
        Ok(())
    }

    fn cuMemcpyHtoD_v2 | cuMemcpyHtoD_v2_ptds (dst: u64, src: *const c_void, bytes: usize) {
        htod(client()?, dst, host_bytes(src, bytes)?, None)
    }

    fn cuMemcpyDtoH_v2 | cuMemcpyDtoH_v2_ptds (dst: *mut c_void, src: u64, bytes: usize) {
        dtoh(client()?, host_bytes_mut(dst, bytes)?, src, None)
    }

    fn cuMemcpyDtoD_v2 | cuMemcpyDtoD_v2_ptds (dst: u64, src: u64, bytes: usize) {
        dtod(client()?, dst, src, bytes, None)
    }

    fn cuMemcpyHtoDAsync_v2 | cuMemcpyHtoDAsync_v2_ptsz (dst: u64, src: *const c_void, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        htod(c, dst, host_bytes(src, bytes)?, Some(stream_of(c, stream)?))
    }

    fn cuMemcpyDtoHAsync_v2 | cuMemcpyDtoHAsync_v2_ptsz (dst: *mut c_void, src: u64, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        dtoh(c, host_bytes_mut(dst, bytes)?, src, Some(stream_of(c, stream)?))
    }

    fn cuMemcpyDtoDAsync_v2 | cuMemcpyDtoDAsync_v2_ptsz (dst: u64, src: u64, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        dtod(c, dst, src, bytes, Some(stream_of(c, stream)?))
    }

    fn cuMemcpy | cuMemcpy_ptds (dst: u64, src: u64, bytes: usize) {
        unified(client()?, dst, src, bytes, None)
    }

    fn cuMemcpyAsync | cuMemcpyAsync_ptsz (dst: u64, src: u64, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        unified(c, dst, src, bytes, Some(stream_of(c, stream)?))
    }

    fn cuMemcpyPeer | cuMemcpyPeer_ptds (dst: u64, _dst_ctx: *mut c_void, src: u64, _src_ctx: *mut c_void, bytes: usize) {
        dtod(client()?, dst, src, bytes, None)
    }

    fn cuMemcpyPeerAsync | cuMemcpyPeerAsync_ptsz (dst: u64, _dst_ctx: *mut c_void, src: u64, _src_ctx: *mut c_void, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        dtod(c, dst, src, bytes, Some(stream_of(c, stream)?))
    }

    fn cuMemcpy2D_v2 | cuMemcpy2D_v2_ptds | cuMemcpy2DUnaligned_v2 | cuMemcpy2DUnaligned_v2_ptds (p: *const CUDA_MEMCPY2D) {
        copy_2d(client()?, read_in(p)?, None)
    }

    fn cuMemcpy2DAsync_v2 | cuMemcpy2DAsync_v2_ptsz (p: *const CUDA_MEMCPY2D, stream: *mut c_void) {
        let c = client()?;
        copy_2d(c, read_in(p)?, Some(stream_of(c, stream)?))
    }

    fn cuMemcpy3D_v2 | cuMemcpy3D_v2_ptds (p: *const CUDA_MEMCPY3D) {
        copy_3d(client()?, read_in(p)?, None)
    }

    fn cuMemcpy3DAsync_v2 | cuMemcpy3DAsync_v2_ptsz (p: *const CUDA_MEMCPY3D, stream: *mut c_void) {
        let c = client()?;
        copy_3d(c, read_in(p)?, Some(stream_of(c, stream)?))
    }

    fn cuMemsetD8_v2 | cuMemsetD8_v2_ptds (dst: u64, value: u8, n: usize) {
        memset(client()?, dst, Fill { value: value as u32, elem: 1, count: n, pitch: n, height: 1 }, None)
    }

    fn cuMemsetD16_v2 | cuMemsetD16_v2_ptds (dst: u64, value: u16, n: usize) {
        memset(client()?, dst, Fill { value: value as u32, elem: 2, count: n, pitch: n * 2, height: 1 }, None)
    }

    fn cuMemsetD32_v2 | cuMemsetD32_v2_ptds (dst: u64, value: u32, n: usize) {
        memset(client()?, dst, Fill { value, elem: 4, count: n, pitch: n * 4, height: 1 }, None)
    }

    fn cuMemsetD8Async | cuMemsetD8Async_ptsz (dst: u64, value: u8, n: usize, stream: *mut c_void) {
        let c = client()?;
        memset(c, dst, Fill { value: value as u32, elem: 1, count: n, pitch: n, height: 1 }, Some(stream_of(c, stream)?))
    }

    fn cuMemsetD16Async | cuMemsetD16Async_ptsz (dst: u64, value: u16, n: usize, stream: *mut c_void) {
        let c = client()?;
        memset(c, dst, Fill { value: value as u32, elem: 2, count: n, pitch: n * 2, height: 1 }, Some(stream_of(c, stream)?))
    }

    fn cuMemsetD32Async | cuMemsetD32Async_ptsz (dst: u64, value: u32, n: usize, stream: *mut c_void) {
        let c = client()?;
        memset(c, dst, Fill { value, elem: 4, count: n, pitch: n * 4, height: 1 }, Some(stream_of(c, stream)?))
    }

    fn cuMemsetD2D8_v2 | cuMemsetD2D8_v2_ptds (dst: u64, pitch: usize, value: u8, w: usize, h: usize) {
        memset(client()?, dst, Fill { value: value as u32, elem: 1, count: w, pitch, height: h }, None)
    }

    fn cuMemsetD2D16_v2 | cuMemsetD2D16_v2_ptds (dst: u64, pitch: usize, value: u16, w: usize, h: usize) {
        memset(client()?, dst, Fill { value: value as u32, elem: 2, count: w, pitch, height: h }, None)
    }

    fn cuMemsetD2D32_v2 | cuMemsetD2D32_v2_ptds (dst: u64, pitch: usize, value: u32, w: usize, h: usize) {
        memset(client()?, dst, Fill { value, elem: 4, count: w, pitch, height: h }, None)
    }

    fn cuMemsetD2D8Async | cuMemsetD2D8Async_ptsz (dst: u64, pitch: usize, value: u8, w: usize, h: usize, stream: *mut c_void) {
        let c = client()?;
        memset(c, dst, Fill { value: value as u32, elem: 1, count: w, pitch, height: h }, Some(stream_of(c, stream)?))
    }

    fn cuMemsetD2D16Async | cuMemsetD2D16Async_ptsz (dst: u64, pitch: usize, value: u16, w: usize, h: usize, stream: *mut c_void) {
        let c = client()?;
        memset(c, dst, Fill { value: value as u32, elem: 2, count: w, pitch, height: h }, Some(stream_of(c, stream)?))
    }

    fn cuMemsetD2D32Async | cuMemsetD2D32Async_ptsz (dst: u64, pitch: usize, value: u32, w: usize, h: usize, stream: *mut c_void) {
        let c = client()?;
        memset(c, dst, Fill { value, elem: 4, count: w, pitch, height: h }, Some(stream_of(c, stream)?))
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: u32) {
        let c = client()?;
        out(pp, host_alloc(c, bytes, flags)?)
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) {
        let c = client()?;
        out(pp, host_alloc(c, bytes, 0)?)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        let c = client()?;
        let region = c.tables().host.remove(&(p as usize)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if let Some(pinned) = region.pinned {
            crate::pinned::free(c, pinned);
        } else if region.owned {
            // SAFETY: `p` came from posix_memalign in host_alloc and is freed once.
            unsafe { libc::free(p) };
        }
        Ok(())
    }

    fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, flags: u32) {
        let c = client()?;
        c.context_device()?;
        if p.is_null() || bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut t = c.tables();
        if t.host_region_of(p as usize).is_some() {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        t.host.insert(p as usize, HostRegion { size: bytes, flags, owned: false, pinned: None });
        Ok(())
    }

    fn cuMemHostUnregister(p: *mut c_void) {
        let c = client()?;
        let mut t = c.tables();
        match t.host.get(&(p as usize)) {
            Some(r) if !r.owned => {
                t.host.remove(&(p as usize));
                Ok(())
            }
            // Memory from cuMemHostAlloc is not "registered" memory.
            Some(_) => Err(CUDA_ERROR_INVALID_VALUE),
            None => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    }

    fn cuMemHostGetDevicePointer_v2(dptr: *mut u64, p: *mut c_void, flags: u32) {
        let c = client()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        c.tables().host_region_of(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(dptr, p as u64)
    }

    fn cuMemHostGetFlags(flags: *mut u32, p: *mut c_void) {
        let c = client()?;
        let t = c.tables();
        let (_, r) = t.host_region_of(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(flags, r.flags)
    }

    fn cuPointerGetAttribute(data: *mut c_void, attr: u32, ptr: u64) {
        pointer_attribute(client()?, attr, ptr, data)
    }

    fn cuPointerGetAttributes(n: u32, attrs: *mut u32, data: *mut *mut c_void, ptr: u64) {
        let c = client()?;
        let attrs = host_bytes(attrs.cast(), n as usize * 4)?;
        let slots = host_bytes_mut(data.cast(), n as usize * 8)?;
        for i in 0..n as usize {
            let attr = u32::from_ne_bytes(attrs[i * 4..i * 4 + 4].try_into().unwrap_or_default());
            let slot = usize::from_ne_bytes(slots[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            if slot == 0 {
                continue;
            }
            tracing::trace!("cuPointerGetAttributes({ptr:#x}): attribute {attr}");
            match pointer_attribute(c, attr, ptr, slot as *mut c_void) {
                Ok(()) => {}
                // Unknown memory: cuPointerGetAttributes answers "unregistered".
                Err(CUDA_ERROR_INVALID_VALUE) if attr == 2 => out(slot as *mut u32, 0)?,
                Err(CUDA_ERROR_INVALID_VALUE) => {
                    let _ = out(slot as *mut u64, 0);
                    if attr == 9 {
                        out(slot as *mut i32, -2)?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn cuMemAllocAsync | cuMemAllocAsync_ptsz (dptr: *mut u64, bytes: usize, stream: *mut c_void) {
        let c = client()?;
        stream_of(c, stream)?;
        out(dptr, alloc(c, bytes)?)
    }

    fn cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz (dptr: *mut u64, bytes: usize, _pool: *mut c_void, stream: *mut c_void) {
        let c = client()?;
        stream_of(c, stream)?;
        out(dptr, alloc(c, bytes)?)
    }

    fn cuMemFreeAsync | cuMemFreeAsync_ptsz (ptr: u64, stream: *mut c_void) {
        let c = client()?;
        let s = stream_of(c, stream)?;
        // Work queued before the free may still use the memory.
        c.call(Call::StreamSynchronize { stream: s })?;
        free(c, ptr)
    }

    fn cuDeviceGetDefaultMemPool | cuDeviceGetMemPool (pool: *mut *mut c_void, dev: i32) {
        client()?.device(dev)?;
        out(pool, to_ptr(DEFAULT_POOL_BASE + dev as usize * 0x10))
    }

    fn cuDeviceSetMemPool(dev: i32, _pool: *mut c_void) {
        client()?.device(dev).map(|_| ())
    }

    fn cuMemPoolCreate(pool: *mut *mut c_void, _props: *const c_void) {
        let c = client()?;
        out(pool, to_ptr(c.mint()))
    }

    fn cuMemPoolDestroy(_pool: *mut c_void) {
        client().map(|_| ())
    }

    fn cuMemPoolTrimTo(_pool: *mut c_void, _keep: usize) {
        client().map(|_| ())
    }

    fn cuMemPoolSetAttribute(_pool: *mut c_void, _attr: u32, value: *mut c_void) {
        client()?;
        if value.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    }

    fn cuMemPoolGetAttribute(_pool: *mut c_void, attr: u32, value: *mut c_void) {
        client()?;
        match attr {
            // The three reuse policies: on.
            1..=3 => out(value.cast::<i32>(), 1),
            // Release threshold and the reserved/used statistics.
            _ => out(value.cast::<u64>(), 0),
        }
    }
}
