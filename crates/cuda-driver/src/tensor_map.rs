//! Tensor-memory-access descriptors (`cuTensorMapEncode*`): the driver packs a
//! tensor's address, shape, strides and tile into 128 opaque bytes on the host.

use std::ffi::{c_int, c_uint, c_void};

use crate::driver::{cu, Driver};
use crate::error::CudaError;
use crate::sys::*;

/// Bytes of a `CUtensorMap`.
pub const TENSOR_MAP_BYTES: usize = 128;

/// `CUtensorMap`: 128 bytes, 64-byte aligned.
#[repr(C, align(64))]
struct RawTensorMap([u8; TENSOR_MAP_BYTES]);

/// What every encoding takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorShape<'a> {
    pub data_type: u32,
    pub rank: u32,
    pub address: u64,
    pub dims: &'a [u64],
    /// Strides in bytes of dimensions 1 ..= rank-1.
    pub strides: &'a [u64],
    pub element_strides: &'a [u32],
    pub interleave: u32,
    pub swizzle: u32,
    pub l2_promotion: u32,
    pub oob_fill: u32,
}

/// How the tile is cut from the tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorTile<'a> {
    Tiled {
        box_dim: &'a [u32],
    },
    Im2col {
        lower: &'a [i32],
        upper: &'a [i32],
        channels: u32,
        pixels: u32,
    },
    Im2colWide {
        lower_width: i32,
        upper_width: i32,
        channels: u32,
        pixels: u32,
        mode: u32,
    },
}

fn too_short(what: &str) -> CudaError {
    CudaError::new(
        CUDA_ERROR_INVALID_VALUE,
        "CUDA_ERROR_INVALID_VALUE",
        "cuTensorMapEncode",
    )
    .with_detail(format!("{what} shorter than the rank needs"))
}

impl Driver {
    /// Encodes a descriptor as `cuTensorMapEncodeTiled`/`Im2col`/`Im2colWide` would.
    pub fn tensor_map_encode(
        &self,
        shape: &TensorShape<'_>,
        tile: &TensorTile<'_>,
    ) -> Result<[u8; TENSOR_MAP_BYTES], CudaError> {
        let rank = shape.rank as usize;
        if shape.dims.len() < rank
            || shape.strides.len() + 1 < rank
            || shape.element_strides.len() < rank
        {
            return Err(too_short("dimensions, strides or element strides"));
        }
        let mut map = RawTensorMap([0; TENSOR_MAP_BYTES]);
        let out: *mut c_void = (&mut map as *mut RawTensorMap).cast();
        let address = shape.address as usize as *mut c_void;
        let s = shape;
        // Calls `$entry` with the tile's arguments amid the shape's: the six
        // every encoding starts with, then the tile's, then the element
        // strides and the options (the wide form takes `mode` after interleave).
        macro_rules! encode {
            ($entry:ident($($tile:expr),*) $(, mode: $mode:expr)?) => {
                cu!(
                    self,
                    $entry(
                        out,
                        s.data_type as c_uint,
                        s.rank as c_uint,
                        address,
                        s.dims.as_ptr(),
                        s.strides.as_ptr(),
                        $($tile,)*
                        s.element_strides.as_ptr(),
                        s.interleave as c_uint,
                        $($mode as c_uint,)?
                        s.swizzle as c_uint,
                        s.l2_promotion as c_uint,
                        s.oob_fill as c_uint
                    )
                )
            };
        }
        // SAFETY (every arm): `out` is a 64-byte aligned 128-byte buffer; the
        // arrays hold at least what the rank reads (checked above and in each
        // arm); the driver reads them during the call only.
        match *tile {
            TensorTile::Tiled { box_dim } => {
                if box_dim.len() < rank {
                    return Err(too_short("box dimensions"));
                }
                // SAFETY: as above; `box_dim` holds `rank` entries.
                unsafe { encode!(cuTensorMapEncodeTiled(box_dim.as_ptr()))? }
            }
            TensorTile::Im2col {
                lower,
                upper,
                channels,
                pixels,
            } => {
                let spatial = rank.saturating_sub(2);
                if lower.len() < spatial || upper.len() < spatial {
                    return Err(too_short("pixel box corners"));
                }
                let (channels, pixels) = (channels as c_uint, pixels as c_uint);
                // SAFETY: as above; the corners hold `rank - 2` entries each.
                unsafe {
                    encode!(cuTensorMapEncodeIm2col(
                        lower.as_ptr(),
                        upper.as_ptr(),
                        channels,
                        pixels
                    ))?
                }
            }
            TensorTile::Im2colWide {
                lower_width,
                upper_width,
                channels,
                pixels,
                mode,
            } => {
                let (lower, upper) = (lower_width as c_int, upper_width as c_int);
                let (channels, pixels) = (channels as c_uint, pixels as c_uint);
                // SAFETY: as above; the wide mode takes scalars only beyond the shape.
                unsafe {
                    encode!(
                        cuTensorMapEncodeIm2colWide(lower, upper, channels, pixels),
                        mode: mode
                    )?
                }
            }
        }
        Ok(map.0)
    }
}
