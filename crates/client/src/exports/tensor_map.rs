//! `cuTensorMapEncode*`: Hopper's tensor-memory-access descriptors. Only the
//! GPU's own driver knows their 128-byte layout, so the server encodes them.

use std::ffi::c_void;

use cumux_protocol::{Call, ReplyBody, TensorMapLayout, TensorMapRequest};

use super::*;
use crate::state::client;

/// Bytes of a `CUtensorMap`.
const TENSOR_MAP_BYTES: usize = 128;
/// Dimensions a tensor map may have.
const MAX_RANK: u32 = 5;

/// `n` values of `T` the program passed by pointer.
fn array<T: Copy>(ptr: *const T, n: usize) -> CuResult<Vec<T>> {
    let bytes = host_bytes(ptr.cast(), n * std::mem::size_of::<T>())?;
    Ok(bytes
        .chunks_exact(std::mem::size_of::<T>())
        // SAFETY: each chunk holds exactly one T (plain integers here), read unaligned.
        .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<T>()) })
        .collect())
}

/// The parts every encoding shares, read from the program's arrays.
#[allow(clippy::too_many_arguments)]
fn request(
    data_type: u32,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    element_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2_promotion: u32,
    oob_fill: u32,
    layout: TensorMapLayout,
) -> CuResult<TensorMapRequest> {
    if !(1..=MAX_RANK).contains(&rank) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let r = rank as usize;
    Ok(TensorMapRequest {
        data_type,
        rank,
        global_address: address as u64,
        global_dim: array(dims, r)?,
        global_strides: array(strides, r - 1)?,
        element_strides: array(element_strides, r)?,
        interleave,
        swizzle,
        l2_promotion,
        oob_fill,
        layout,
    })
}

/// Has the server encode `request` and writes the descriptor to `map`.
fn encode(map: *mut c_void, request: TensorMapRequest) -> CuResult<()> {
    let out = host_bytes_mut(map, TENSOR_MAP_BYTES)?;
    let c = client()?;
    c.lock().context_device()?;
    match c.call(Call::TensorMapEncode { request })? {
        ReplyBody::TensorMap(bytes) if bytes.len() == TENSOR_MAP_BYTES => {
            out.copy_from_slice(&bytes);
            Ok(())
        }
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

driver_fn! {
    fn cuTensorMapEncodeTiled(
        map: *mut c_void,
        data_type: u32,
        rank: u32,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        box_dim: *const u32,
        element_strides: *const u32,
        interleave: u32,
        swizzle: u32,
        l2_promotion: u32,
        oob_fill: u32
    ) {
        let layout = TensorMapLayout::Tiled { box_dim: array(box_dim, rank.min(MAX_RANK) as usize)? };
        let r = request(data_type, rank, address, dims, strides, element_strides, interleave, swizzle, l2_promotion, oob_fill, layout)?;
        encode(map, r)
    }

    fn cuTensorMapEncodeIm2col(
        map: *mut c_void,
        data_type: u32,
        rank: u32,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        lower: *const i32,
        upper: *const i32,
        channels_per_pixel: u32,
        pixels_per_column: u32,
        element_strides: *const u32,
        interleave: u32,
        swizzle: u32,
        l2_promotion: u32,
        oob_fill: u32
    ) {
        // The corners have one entry per spatial dimension (rank - 2).
        let spatial = (rank.min(MAX_RANK) as usize).saturating_sub(2);
        let layout = TensorMapLayout::Im2col {
            lower_corner: array(lower, spatial)?,
            upper_corner: array(upper, spatial)?,
            channels_per_pixel,
            pixels_per_column,
        };
        let r = request(data_type, rank, address, dims, strides, element_strides, interleave, swizzle, l2_promotion, oob_fill, layout)?;
        encode(map, r)
    }

    fn cuTensorMapEncodeIm2colWide(
        map: *mut c_void,
        data_type: u32,
        rank: u32,
        address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        lower_corner_width: i32,
        upper_corner_width: i32,
        channels_per_pixel: u32,
        pixels_per_column: u32,
        element_strides: *const u32,
        interleave: u32,
        mode: u32,
        swizzle: u32,
        l2_promotion: u32,
        oob_fill: u32
    ) {
        let layout = TensorMapLayout::Im2colWide {
            lower_corner_width,
            upper_corner_width,
            channels_per_pixel,
            pixels_per_column,
            mode,
        };
        let r = request(data_type, rank, address, dims, strides, element_strides, interleave, swizzle, l2_promotion, oob_fill, layout)?;
        encode(map, r)
    }
}
