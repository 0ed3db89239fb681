//! CUDA arrays, mipmapped arrays, texture and surface objects (`cuArray*`,
//! `cuMipmappedArray*`, `cuTexObject*`, `cuSurfObject*`), and copies where
//! either end is an array (reached from `cuMemcpy2D`/`3D` in `copy`): arrays
//! are server handles; texture and surface objects are the device driver's
//! own values, which kernels take unchanged. The server checks everything.

use std::ffi::c_void;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::arrays::{ArrayCall, ArrayShape, CopyEnd, CopyExtent, Resource, TextureMade};
use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::{device_of_handle, Call, Handle, ReplyBody, DEFAULT_STREAM};

use super::array_descs::{resource, resource_desc, texture, view, ResourceDesc};
use super::*;
use crate::state::{client, handles, Client};

/// One end of a copy to or from an array, as the client sees it: host and
/// device ends from their first byte (offsets applied), rows `pitch` bytes
/// and layers `height` rows apart.
#[derive(Clone, Copy)]
pub(crate) enum End {
    Host {
        at: usize,
        pitch: usize,
        height: usize,
    },
    Device {
        at: u64,
        pitch: u64,
        height: u64,
    },
    Array {
        array: Handle,
        x: u64,
        y: u64,
        z: u64,
    },
}

/// An array call; where the device has no arrays, says once on stderr why
/// (the server's words).
fn call(c: &Client, call: ArrayCall) -> CuResult<ReplyBody> {
    refused_once(c.call(Call::Array(call)))
}

fn refused_once(reply: CuResult<ReplyBody>) -> CuResult<ReplyBody> {
    static SAID: std::sync::Once = std::sync::Once::new();
    if matches!(reply, Err(CUDA_ERROR_NOT_SUPPORTED)) {
        let why = crate::transport::take_last_error_message();
        SAID.call_once(|| {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "cumux: CUDA arrays, textures and surfaces: {why} (CUDA_ERROR_NOT_SUPPORTED)"
            );
        });
    }
    reply
}

fn handle_of(reply: ReplyBody) -> CuResult<Handle> {
    match reply {
        ReplyBody::Handle(h) => Ok(h),
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

fn value_of(reply: ReplyBody) -> CuResult<u64> {
    match reply {
        ReplyBody::Value(v) => Ok(v),
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

fn shape_3d(d: &CUDA_ARRAY3D_DESCRIPTOR) -> ArrayShape {
    ArrayShape {
        width: d.Width as u64,
        height: d.Height as u64,
        depth: d.Depth as u64,
        format: d.Format,
        channels: d.NumChannels,
        flags: d.Flags,
    }
}

fn describe(c: &Client, array: CUarray) -> CuResult<ArrayShape> {
    describe_handle(c, handles::wire_or_invalid(array)?)
}

fn describe_handle(c: &Client, array: Handle) -> CuResult<ArrayShape> {
    match call(c, ArrayCall::Describe { array })? {
        ReplyBody::Array(shape) => Ok(shape),
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

fn create(c: &Client, out_handle: *mut CUarray, shape: ArrayShape) -> CuResult<()> {
    non_null(out_handle)?;
    c.lock().context_device()?;
    let array = handle_of(call(c, ArrayCall::Create { shape })?)?;
    out(out_handle, handles::to_program(array))
}

/// Boxes of a copy small enough for one call each, with the host's bytes:
/// (first layer, layers, first row, rows).
fn pieces(extent: CopyExtent) -> CuResult<Vec<(u64, u64, u64, u64)>> {
    let limit = MAX_CHUNK_BYTES as u64;
    let CopyExtent {
        width_bytes: w,
        height: h,
        depth: d,
    } = extent;
    let layer = w.checked_mul(h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if w > limit {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if layer.checked_mul(d).is_some_and(|all| all <= limit) {
        return Ok(vec![(0, d, 0, h)]);
    }
    let mut pieces = Vec::new();
    if layer <= limit {
        let step = limit / layer;
        let mut z = 0;
        while z < d {
            pieces.push((z, step.min(d - z), 0, h));
            z += step;
        }
        return Ok(pieces);
    }
    let step = limit / w;
    for z in 0..d {
        let mut y = 0;
        while y < h {
            pieces.push((z, 1, y, step.min(h - y)));
            y += step;
        }
    }
    Ok(pieces)
}

/// The wire's end for the box of `piece` within `end`.
fn wire_end(end: End, piece: (u64, u64, u64, u64)) -> CopyEnd {
    let (z0, _, y0, _) = piece;
    match end {
        End::Host { .. } => CopyEnd::Host,
        End::Device { at, pitch, height } => CopyEnd::Device {
            ptr: at + (z0 * height + y0) * pitch,
            pitch,
            height,
        },
        End::Array { array, x, y, z } => CopyEnd::Array {
            array,
            x_bytes: x,
            y: y + y0,
            z: z + z0,
        },
    }
}

/// The host rows of `piece`: each one's first byte.
fn host_rows(at: usize, pitch: usize, height: usize, piece: (u64, u64, u64, u64)) -> Vec<usize> {
    let (z0, nz, y0, ny) = piece;
    let mut rows = Vec::with_capacity((nz * ny) as usize);
    for z in z0..z0 + nz {
        for y in y0..y0 + ny {
            rows.push(at + (z as usize * height + y as usize) * pitch);
        }
    }
    rows
}

/// A copy where `src` or `dst` is an array: after the work queued on its
/// stream, done when it returns (an asynchronous copy too, which CUDA
/// allows); in pieces of at most one chunk where the host is an end.
pub(crate) fn copy(
    c: &Client,
    src: End,
    dst: End,
    extent: CopyExtent,
    stream: Option<Handle>,
) -> CuResult<()> {
    let queue = stream.unwrap_or(DEFAULT_STREAM);
    let st = c.ready_stream(c.lock(), queue)?;
    st.context_device()?;
    if st.capturing(queue) {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    drop(st);
    if extent.width_bytes == 0 || extent.height == 0 || extent.depth == 0 {
        return Ok(());
    }
    let device = match (src, dst) {
        (End::Array { array, .. }, _) | (_, End::Array { array, .. }) => device_of_handle(array),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let host = matches!(src, End::Host { .. }) || matches!(dst, End::Host { .. });
    let whole = (0, extent.depth, 0, extent.height);
    let pieces = if host { pieces(extent)? } else { vec![whole] };
    let width = extent.width_bytes as usize;
    for piece in pieces {
        let piece_extent = CopyExtent {
            width_bytes: extent.width_bytes,
            height: piece.3,
            depth: piece.1,
        };
        let mut data = Vec::new();
        if let End::Host { at, pitch, height } = src {
            data.reserve(width * (piece.1 * piece.3) as usize);
            for row in host_rows(at, pitch, height, piece) {
                data.extend_from_slice(host_bytes(row as *const c_void, width)?);
            }
        }
        let call = Call::Array(ArrayCall::Copy {
            src: wire_end(src, piece),
            dst: wire_end(dst, piece),
            extent: piece_extent,
            stream,
            data,
        });
        let reply = refused_once(c.call_on(device, call))?;
        if let End::Host { at, pitch, height } = dst {
            let ReplyBody::Data(bytes) = reply else {
                return Err(CUDA_ERROR_UNKNOWN);
            };
            let rows = host_rows(at, pitch, height, piece);
            if bytes.len() != rows.len() * width {
                return Err(CUDA_ERROR_UNKNOWN);
            }
            for (row, from) in rows.into_iter().zip(bytes.chunks_exact(width.max(1))) {
                host_bytes_mut(row as *mut c_void, width)?.copy_from_slice(from);
            }
        }
    }
    Ok(())
}

/// One end of a `cuMemcpy2D`/`3D` as its fields give it: memory type, host
/// and device pointers, array, offsets (`x` in bytes), pitch and height
/// (0: as wide or high as the copy).
struct Fields {
    kind: CUmemorytype,
    host: usize,
    device: u64,
    array: CUarray,
    x: usize,
    y: usize,
    z: usize,
    pitch: usize,
    height: usize,
}

/// The [`End`] the fields name, from its first byte.
fn end_of(c: &Client, f: Fields, width: usize, rows: usize) -> CuResult<End> {
    let pitch = if f.pitch == 0 { width } else { f.pitch };
    let height = if f.height == 0 { rows } else { f.height };
    let first = (f.z * height + f.y) * pitch + f.x;
    let host = |at: usize| End::Host {
        at: at + first,
        pitch,
        height,
    };
    let device = |at: u64| End::Device {
        at: at + first as u64,
        pitch: pitch as u64,
        height: height as u64,
    };
    Ok(match f.kind {
        CU_MEMORYTYPE_HOST => host(f.host),
        CU_MEMORYTYPE_DEVICE => device(f.device),
        CU_MEMORYTYPE_UNIFIED if c.lock().is_device_memory(f.device) => device(f.device),
        CU_MEMORYTYPE_UNIFIED => host(f.device as usize),
        CU_MEMORYTYPE_ARRAY => End::Array {
            array: handles::wire_or_invalid(f.array)?,
            x: f.x as u64,
            y: f.y as u64,
            z: f.z as u64,
        },
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// `cuMemcpy2D` with an array end (from `copy`).
pub(crate) fn memcpy_2d(c: &Client, p: &CUDA_MEMCPY2D, stream: Option<Handle>) -> CuResult<()> {
    let (w, h) = (p.WidthInBytes, p.Height);
    let src = Fields {
        kind: p.srcMemoryType,
        host: p.srcHost as usize,
        device: p.srcDevice,
        array: p.srcArray,
        x: p.srcXInBytes,
        y: p.srcY,
        z: 0,
        pitch: p.srcPitch,
        height: 0,
    };
    let dst = Fields {
        kind: p.dstMemoryType,
        host: p.dstHost as usize,
        device: p.dstDevice,
        array: p.dstArray,
        x: p.dstXInBytes,
        y: p.dstY,
        z: 0,
        pitch: p.dstPitch,
        height: 0,
    };
    let extent = CopyExtent {
        width_bytes: w as u64,
        height: h as u64,
        depth: 1,
    };
    copy(
        c,
        end_of(c, src, w, h)?,
        end_of(c, dst, w, h)?,
        extent,
        stream,
    )
}

/// `cuMemcpy3D` with an array end (from `copy`).
pub(crate) fn memcpy_3d(c: &Client, p: &CUDA_MEMCPY3D, stream: Option<Handle>) -> CuResult<()> {
    let (w, h) = (p.WidthInBytes, p.Height);
    let src = Fields {
        kind: p.srcMemoryType,
        host: p.srcHost as usize,
        device: p.srcDevice,
        array: p.srcArray,
        x: p.srcXInBytes,
        y: p.srcY,
        z: p.srcZ,
        pitch: p.srcPitch,
        height: p.srcHeight,
    };
    let dst = Fields {
        kind: p.dstMemoryType,
        host: p.dstHost as usize,
        device: p.dstDevice,
        array: p.dstArray,
        x: p.dstXInBytes,
        y: p.dstY,
        z: p.dstZ,
        pitch: p.dstPitch,
        height: p.dstHeight,
    };
    let extent = CopyExtent {
        width_bytes: w as u64,
        height: h as u64,
        depth: p.Depth as u64,
    };
    copy(
        c,
        end_of(c, src, w, h)?,
        end_of(c, dst, w, h)?,
        extent,
        stream,
    )
}

fn texture_made(c: &Client, texture: CUtexObject) -> CuResult<TextureMade> {
    match call(c, ArrayCall::TextureDescribe { texture })? {
        ReplyBody::Texture(made) => Ok(made),
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

/// A one-dimensional copy of `bytes` where an end is an array, from a byte
/// offset that counts through its rows (and layers) as they lie in order:
/// split into boxes of whole rows and the parts of rows around them.
fn linear(
    c: &Client,
    src: End,
    dst: End,
    bytes: usize,
    stream: *mut c_void,
    is_async: bool,
) -> CuResult<()> {
    let stream = match is_async {
        true => Some(handles::stream(stream)?),
        false => None,
    };
    let array = match (src, dst) {
        (End::Array { array, x, .. }, other) | (other, End::Array { array, x, .. }) => {
            Some((array, x, matches!(other, End::Array { .. })))
        }
        _ => None,
    };
    let Some((array, offset, both)) = array else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let shape = describe_handle(c, array)?;
    let row = shape.row_bytes().ok_or(CUDA_ERROR_INVALID_VALUE)?.max(1);
    let (rows, _) = shape.rows_and_layers();
    let one_row = offset % row + bytes as u64 <= row;
    if both || one_row {
        // Array to array, or inside one row: one box.
        let at = |end: End| match end {
            End::Array { array, x, .. } => End::Array {
                array,
                x: x % row,
                y: x / row % rows,
                z: x / row / rows,
            },
            other => other,
        };
        let extent = CopyExtent {
            width_bytes: bytes as u64,
            height: 1,
            depth: 1,
        };
        return copy(c, at(src), at(dst), extent, stream);
    }
    let (mut pos, mut done, mut left) = (offset, 0u64, bytes as u64);
    while left > 0 {
        let (x, y_all) = (pos % row, pos / row);
        let (y, z) = (y_all % rows, y_all / rows);
        let (width, height) = match x == 0 && left >= row {
            true => (row, (left / row).min(rows - y)),
            false => ((row - x).min(left), 1),
        };
        let in_array = End::Array { array, x, y, z };
        let other = |end: End| match end {
            End::Host { at, .. } => End::Host {
                at: at + done as usize,
                pitch: width as usize,
                height: height as usize,
            },
            End::Device { at, .. } => End::Device {
                at: at + done,
                pitch: width,
                height,
            },
            array_end => array_end,
        };
        let (from, to) = match src {
            End::Array { .. } => (in_array, other(dst)),
            _ => (other(src), in_array),
        };
        let extent = CopyExtent {
            width_bytes: width,
            height,
            depth: 1,
        };
        copy(c, from, to, extent, stream)?;
        let moved = width * height;
        pos += moved;
        done += moved;
        left -= moved;
    }
    Ok(())
}

fn in_array(array: CUarray, offset: usize) -> CuResult<End> {
    Ok(End::Array {
        array: handles::wire_or_invalid(array)?,
        x: offset as u64,
        y: 0,
        z: 0,
    })
}

fn host_end(at: usize, bytes: usize) -> End {
    End::Host {
        at,
        pitch: bytes,
        height: 1,
    }
}

fn device_end(at: u64, bytes: usize) -> End {
    End::Device {
        at,
        pitch: bytes as u64,
        height: 1,
    }
}

driver_fn! {
    fn cuMemcpyHtoA_v2 | cuMemcpyHtoA_v2_ptds (dst: CUarray, offset: usize, src: *const c_void, bytes: usize) {
        let null = std::ptr::null_mut();
        linear(client()?, host_end(src as usize, bytes), in_array(dst, offset)?, bytes, null, false)
    }

    fn cuMemcpyHtoAAsync_v2 | cuMemcpyHtoAAsync_v2_ptsz (dst: CUarray, offset: usize, src: *const c_void, bytes: usize, stream: CUstream) {
        linear(client()?, host_end(src as usize, bytes), in_array(dst, offset)?, bytes, stream, true)
    }

    fn cuMemcpyAtoH_v2 | cuMemcpyAtoH_v2_ptds (dst: *mut c_void, src: CUarray, offset: usize, bytes: usize) {
        let null = std::ptr::null_mut();
        linear(client()?, in_array(src, offset)?, host_end(dst as usize, bytes), bytes, null, false)
    }

    fn cuMemcpyAtoHAsync_v2 | cuMemcpyAtoHAsync_v2_ptsz (dst: *mut c_void, src: CUarray, offset: usize, bytes: usize, stream: CUstream) {
        linear(client()?, in_array(src, offset)?, host_end(dst as usize, bytes), bytes, stream, true)
    }

    fn cuMemcpyDtoA_v2 | cuMemcpyDtoA_v2_ptds (dst: CUarray, offset: usize, src: CUdeviceptr, bytes: usize) {
        let null = std::ptr::null_mut();
        linear(client()?, device_end(src, bytes), in_array(dst, offset)?, bytes, null, false)
    }

    fn cuMemcpyAtoD_v2 | cuMemcpyAtoD_v2_ptds (dst: CUdeviceptr, src: CUarray, offset: usize, bytes: usize) {
        let null = std::ptr::null_mut();
        linear(client()?, in_array(src, offset)?, device_end(dst, bytes), bytes, null, false)
    }

    fn cuMemcpyAtoA_v2 | cuMemcpyAtoA_v2_ptds (dst: CUarray, dst_offset: usize, src: CUarray, src_offset: usize, bytes: usize) {
        let null = std::ptr::null_mut();
        linear(client()?, in_array(src, src_offset)?, in_array(dst, dst_offset)?, bytes, null, false)
    }

    fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) {
        let d = read_in(desc)?;
        let shape = ArrayShape {
            width: d.Width as u64,
            height: d.Height as u64,
            depth: 0,
            format: d.Format,
            channels: d.NumChannels,
            flags: 0,
        };
        create(client()?, handle, shape)
    }

    fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) {
        create(client()?, handle, shape_3d(read_in(desc)?))
    }

    fn cuArrayDestroy(array: CUarray) {
        let c = client()?;
        let array = handles::wire_or_invalid(array)?;
        call(c, ArrayCall::Destroy { array }).map(drop)
    }

    fn cuArrayGetDescriptor_v2(desc: *mut CUDA_ARRAY_DESCRIPTOR, array: CUarray) {
        non_null(desc)?;
        let s = describe(client()?, array)?;
        let d = CUDA_ARRAY_DESCRIPTOR {
            Width: s.width as usize,
            Height: s.height as usize,
            Format: s.format,
            NumChannels: s.channels,
        };
        out(desc, d)
    }

    fn cuArray3DGetDescriptor_v2(desc: *mut CUDA_ARRAY3D_DESCRIPTOR, array: CUarray) {
        non_null(desc)?;
        let s = describe(client()?, array)?;
        let d = CUDA_ARRAY3D_DESCRIPTOR {
            Width: s.width as usize,
            Height: s.height as usize,
            Depth: s.depth as usize,
            Format: s.format,
            NumChannels: s.channels,
            Flags: s.flags,
        };
        out(desc, d)
    }

    fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: u32) {
        let c = client()?;
        non_null(handle)?;
        let shape = shape_3d(read_in(desc)?);
        c.lock().context_device()?;
        let mipmap = handle_of(call(c, ArrayCall::CreateMipmapped { shape, levels })?)?;
        out(handle, handles::to_program(mipmap))
    }

    fn cuMipmappedArrayGetLevel(level_array: *mut CUarray, mipmap: CUmipmappedArray, level: u32) {
        let c = client()?;
        non_null(level_array)?;
        let mipmap = handles::wire_or_invalid(mipmap)?;
        let array = handle_of(call(c, ArrayCall::Level { mipmap, level })?)?;
        out(level_array, handles::to_program(array))
    }

    fn cuMipmappedArrayDestroy(mipmap: CUmipmappedArray) {
        let c = client()?;
        let mipmap = handles::wire_or_invalid(mipmap)?;
        call(c, ArrayCall::DestroyMipmapped { mipmap }).map(drop)
    }

    fn cuTexObjectCreate(object: *mut CUtexObject, res: *const c_void, tex: *const CUDA_TEXTURE_DESC, res_view: *const CUDA_RESOURCE_VIEW_DESC) {
        let c = client()?;
        non_null(object)?;
        let resource = resource(res)?;
        let texture = texture(read_in(tex)?);
        let view = match res_view.is_null() {
            true => None,
            false => Some(view(read_in(res_view)?)),
        };
        c.lock().context_device()?;
        let value = value_of(call(c, ArrayCall::TextureCreate { resource, texture, view })?)?;
        out(object, value)
    }

    fn cuTexObjectDestroy(object: CUtexObject) {
        call(client()?, ArrayCall::TextureDestroy { texture: object }).map(drop)
    }

    fn cuSurfObjectCreate(object: *mut CUsurfObject, res: *const c_void) {
        let c = client()?;
        non_null(object)?;
        let Resource::Array(array) = resource(res)? else {
            return Err(CUDA_ERROR_INVALID_VALUE);
        };
        let value = value_of(call(c, ArrayCall::SurfaceCreate { array })?)?;
        out(object, value)
    }

    fn cuTexObjectGetResourceDesc(desc: *mut c_void, object: CUtexObject) {
        non_null(desc)?;
        let made = texture_made(client()?, object)?;
        out(desc.cast::<ResourceDesc>(), resource_desc(&made.resource))
    }

    fn cuTexObjectGetTextureDesc(desc: *mut CUDA_TEXTURE_DESC, object: CUtexObject) {
        non_null(desc)?;
        let t = texture_made(client()?, object)?.texture;
        let d = CUDA_TEXTURE_DESC {
            addressMode: t.address_mode,
            filterMode: t.filter_mode,
            flags: t.flags,
            maxAnisotropy: t.max_anisotropy,
            mipmapFilterMode: t.mipmap_filter_mode,
            mipmapLevelBias: t.mipmap_level_bias,
            minMipmapLevelClamp: t.min_mipmap_level_clamp,
            maxMipmapLevelClamp: t.max_mipmap_level_clamp,
            borderColor: t.border_color,
            reserved: [0; 12],
        };
        out(desc, d)
    }

    fn cuTexObjectGetResourceViewDesc(desc: *mut CUDA_RESOURCE_VIEW_DESC, object: CUtexObject) {
        non_null(desc)?;
        // A texture made without a view has none to give.
        let v = texture_made(client()?, object)?.view.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let d = CUDA_RESOURCE_VIEW_DESC {
            format: v.format,
            width: v.width as usize,
            height: v.height as usize,
            depth: v.depth as usize,
            firstMipmapLevel: v.first_mipmap_level,
            lastMipmapLevel: v.last_mipmap_level,
            firstLayer: v.first_layer,
            lastLayer: v.last_layer,
            reserved: [0; 16],
        };
        out(desc, d)
    }

    fn cuSurfObjectGetResourceDesc(desc: *mut c_void, object: CUsurfObject) {
        non_null(desc)?;
        let array = handle_of(call(client()?, ArrayCall::SurfaceDescribe { surface: object })?)?;
        out(desc.cast::<ResourceDesc>(), resource_desc(&Resource::Array(array)))
    }

    fn cuSurfObjectDestroy(object: CUsurfObject) {
        call(client()?, ArrayCall::SurfaceDestroy { surface: object }).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_copies_go_in_pieces_that_cover_the_box() {
        let chunk = MAX_CHUNK_BYTES as u64;
        let small = CopyExtent {
            width_bytes: 16,
            height: 4,
            depth: 2,
        };
        assert_eq!(pieces(small).unwrap(), vec![(0, 2, 0, 4)]);
        let layers = CopyExtent {
            width_bytes: 1024,
            height: 1024,
            depth: 200,
        };
        let p = pieces(layers).unwrap();
        assert_eq!(p.iter().map(|p| p.1).sum::<u64>(), 200);
        assert!(p.iter().all(|p| p.1 * 1024 * 1024 <= chunk));
        let rows = CopyExtent {
            width_bytes: 1 << 20,
            height: 100,
            depth: 2,
        };
        let p = pieces(rows).unwrap();
        assert_eq!(p.iter().map(|p| p.3).sum::<u64>(), 200);
        assert!(p.iter().all(|p| p.3 << 20 <= chunk));
    }
}
