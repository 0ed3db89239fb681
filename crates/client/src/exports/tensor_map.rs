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

/// Defines the `cuTensorMapEncode*` exports. Each takes the map and the
/// tensor (type, rank, address, dimensions, strides), then its layout's own
/// arguments, then the element strides and the options (the wide form takes
/// `mode` after interleave). Its body makes the layout from its own arguments
/// and `rank`, the rank as a count of entries; the server encodes the rest.
macro_rules! tensor_map_encoders {
    ($(fn $name:ident($($arg:ident: $ty:ty),*) $(mode: $mode:ident)? |$rank:ident| $layout:block)*) => {
        driver_fn! { $(
            fn $name(
                map: *mut c_void,
                data_type: u32,
                rank: u32,
                address: *mut c_void,
                dims: *const u64,
                strides: *const u64,
                $($arg: $ty,)*
                element_strides: *const u32,
                interleave: u32,
                $($mode: u32,)?
                swizzle: u32,
                l2_promotion: u32,
                oob_fill: u32
            ) {
                let $rank = rank.min(MAX_RANK) as usize;
                let layout = $layout;
                if !(1..=MAX_RANK).contains(&rank) {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                let r = rank as usize;
                let request = TensorMapRequest {
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
                };
                encode(map, request)
            }
        )* }
    };
}

tensor_map_encoders! {
    fn cuTensorMapEncodeTiled(box_dim: *const u32) |rank| {
        TensorMapLayout::Tiled { box_dim: array(box_dim, rank)? }
    }

    fn cuTensorMapEncodeIm2col(
        lower: *const i32,
        upper: *const i32,
        channels: u32,
        pixels: u32
    ) |rank| {
        // The corners have one entry per spatial dimension (rank - 2).
        let spatial = rank.saturating_sub(2);
        TensorMapLayout::Im2col {
            lower_corner: array(lower, spatial)?,
            upper_corner: array(upper, spatial)?,
            channels_per_pixel: channels,
            pixels_per_column: pixels,
        }
    }

    fn cuTensorMapEncodeIm2colWide(
        lower_width: i32,
        upper_width: i32,
        channels: u32,
        pixels: u32
    ) mode: mode |_rank| {
        TensorMapLayout::Im2colWide {
            lower_corner_width: lower_width,
            upper_corner_width: upper_width,
            channels_per_pixel: channels,
            pixels_per_column: pixels,
            mode,
        }
    }
}
