//! CUDA arrays, mipmapped arrays, texture and surface objects as they travel
//! in [`crate::Call::Array`], and the facts of the driver's API both sides
//! check them against (element sizes, how far a copy may reach).

use serde::{Deserialize, Serialize};

use crate::{DevicePtr, Handle};

/// `CUDA_ARRAY3D_DESCRIPTOR`: an array's extent in elements (`height` and
/// `depth` 0 for fewer dimensions), its `CUarray_format`, channels and
/// `CUDA_ARRAY3D_*` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayShape {
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub format: u32,
    pub channels: u32,
    pub flags: u32,
}

/// `CUDA_ARRAY3D_SURFACE_LDST`: the array may back a surface object.
pub const ARRAY_SURFACE_LDST: u32 = 0x02;
/// `CUDA_ARRAY3D_LAYERED`, `CUBEMAP`, `TEXTURE_GATHER`: flags an array may carry.
pub const ARRAY_LAYERED: u32 = 0x01;
pub const ARRAY_CUBEMAP: u32 = 0x04;
pub const ARRAY_TEXTURE_GATHER: u32 = 0x08;

/// Flags cumux passes on to the driver; any other is refused.
pub const ARRAY_FLAGS_KNOWN: u32 =
    ARRAY_LAYERED | ARRAY_SURFACE_LDST | ARRAY_CUBEMAP | ARRAY_TEXTURE_GATHER;

/// Bytes of one channel of `format` (a `CUarray_format`), for the formats
/// cumux carries: 8-, 16- and 32-bit integers, half and single floats.
pub fn channel_bytes(format: u32) -> Option<u64> {
    match format {
        0x01 | 0x08 => Some(1),
        0x02 | 0x09 | 0x10 => Some(2),
        0x03 | 0x0a | 0x20 => Some(4),
        _ => None,
    }
}

impl ArrayShape {
    /// Bytes of one element (every channel), if the format is known and the
    /// channels 1, 2 or 4.
    pub fn element_bytes(&self) -> Option<u64> {
        let channels = matches!(self.channels, 1 | 2 | 4).then_some(self.channels as u64)?;
        Some(channel_bytes(self.format)? * channels)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> Option<u64> {
        self.width.checked_mul(self.element_bytes()?)
    }

    /// Rows of one layer and layers: at least 1 each.
    pub fn rows_and_layers(&self) -> (u64, u64) {
        (self.height.max(1), self.depth.max(1))
    }

    /// The shape of mipmap level `level`: each dimension halved `level`
    /// times, never below 1 (a dimension of 0 stays 0; the layers of a
    /// layered or cubemap array stay as they are).
    pub fn level(&self, level: u32) -> ArrayShape {
        let halve = |d: u64| match d {
            0 => 0,
            d => (d >> level.min(63)).max(1),
        };
        let layered = self.flags & (ARRAY_LAYERED | ARRAY_CUBEMAP) != 0;
        ArrayShape {
            width: halve(self.width),
            height: halve(self.height),
            depth: if layered {
                self.depth
            } else {
                halve(self.depth)
            },
            ..*self
        }
    }

    /// How many levels a full mipmap chain of this shape has.
    pub fn full_levels(&self) -> u32 {
        let layered = self.flags & (ARRAY_LAYERED | ARRAY_CUBEMAP) != 0;
        let depth = if layered { 0 } else { self.depth };
        let largest = self.width.max(self.height).max(depth).max(1);
        64 - largest.leading_zeros()
    }
}

/// One end of a copy to or from an array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopyEnd {
    /// The client's memory: the call carries (or the reply brings) the
    /// copied box packed, `width_bytes` per row, rows then layers.
    Host,
    /// Device memory from `ptr`: rows `pitch` bytes apart, layers `height`
    /// rows apart.
    Device {
        ptr: DevicePtr,
        pitch: u64,
        height: u64,
    },
    /// An array of this session, from `x_bytes` into its rows, row `y`,
    /// layer `z`.
    Array {
        array: Handle,
        x_bytes: u64,
        y: u64,
        z: u64,
    },
}

/// A box of `width_bytes` × `height` rows × `depth` layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyExtent {
    pub width_bytes: u64,
    pub height: u64,
    pub depth: u64,
}

impl CopyExtent {
    /// Bytes of the box packed (the host end's bytes), if it fits a u64.
    pub fn packed_bytes(&self) -> Option<u64> {
        self.width_bytes
            .checked_mul(self.height)?
            .checked_mul(self.depth)
    }

    /// Bytes a device end spans from its first byte: `None` on overflow.
    pub fn device_span(&self, pitch: u64, height: u64) -> Option<u64> {
        if self.width_bytes == 0 || self.height == 0 || self.depth == 0 {
            return Some(0);
        }
        let layers = (self.depth - 1).checked_mul(height)?.checked_mul(pitch)?;
        let rows = (self.height - 1).checked_mul(pitch)?;
        layers.checked_add(rows)?.checked_add(self.width_bytes)
    }
}

/// What a texture object reads (`CUDA_RESOURCE_DESC`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resource {
    Array(Handle),
    Mipmapped(Handle),
    Linear {
        ptr: DevicePtr,
        format: u32,
        channels: u32,
        bytes: u64,
    },
    Pitch2D {
        ptr: DevicePtr,
        format: u32,
        channels: u32,
        width: u64,
        height: u64,
        pitch: u64,
    },
}

/// `CUDA_TEXTURE_DESC`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TextureDesc {
    pub address_mode: [u32; 3],
    pub filter_mode: u32,
    pub flags: u32,
    pub max_anisotropy: u32,
    pub mipmap_filter_mode: u32,
    pub mipmap_level_bias: f32,
    pub min_mipmap_level_clamp: f32,
    pub max_mipmap_level_clamp: f32,
    pub border_color: [f32; 4],
}

/// `CUDA_RESOURCE_VIEW_DESC`'s fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewDesc {
    pub format: u32,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub first_mipmap_level: u32,
    pub last_mipmap_level: u32,
    pub first_layer: u32,
    pub last_layer: u32,
}

/// One call about arrays and the objects over them. Answered by `Handle`
/// (an array or mipmapped array), `Value` (a texture or surface object,
/// the driver's own 64-bit value, which kernels take as it is), `Array`
/// (a descriptor), `Data` (a copy's bytes for the host) or `Unit`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum ArrayCall {
    /// `cuArray3DCreate` (and `cuArrayCreate`): answered by `Handle`.
    Create { shape: ArrayShape },
    /// `cuArrayDestroy`.
    Destroy { array: Handle },
    /// `cuArray3DGetDescriptor`: answered by `Array`.
    Describe { array: Handle },
    /// `cuMipmappedArrayCreate` of `levels` levels: answered by `Handle`.
    CreateMipmapped { shape: ArrayShape, levels: u32 },
    /// `cuMipmappedArrayDestroy` (its levels go with it).
    DestroyMipmapped { mipmap: Handle },
    /// `cuMipmappedArrayGetLevel`: the level as an array (`Handle`), the
    /// same one each time it is asked for.
    Level { mipmap: Handle, level: u32 },
    /// A copy where at least one end is an array, after the work queued on
    /// `stream` (`None`: the default stream, every blocking stream's work).
    /// `data` holds the host source's bytes; a host destination's come in
    /// the reply (`Data`). Answered once it is done.
    Copy {
        src: CopyEnd,
        dst: CopyEnd,
        extent: CopyExtent,
        stream: Option<Handle>,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// `cuTexObjectCreate`: answered by `Value`.
    TextureCreate {
        resource: Resource,
        texture: TextureDesc,
        view: Option<ViewDesc>,
    },
    /// `cuTexObjectDestroy`.
    TextureDestroy { texture: u64 },
    /// `cuSurfObjectCreate` over an array: answered by `Value`.
    SurfaceCreate { array: Handle },
    /// `cuSurfObjectDestroy`.
    SurfaceDestroy { surface: u64 },
    /// What a texture object was made of (`cuTexObjectGet*Desc`): answered
    /// by `Texture`.
    TextureDescribe { texture: u64 },
    /// The array under a surface object (`cuSurfObjectGetResourceDesc`):
    /// answered by `Handle`.
    SurfaceDescribe { surface: u64 },
}

/// What a texture object was made of, as its creator gave it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TextureMade {
    pub resource: Resource,
    pub texture: TextureDesc,
    pub view: Option<ViewDesc>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(width: u64, height: u64, depth: u64) -> ArrayShape {
        ArrayShape {
            width,
            height,
            depth,
            format: 0x20,
            channels: 4,
            flags: 0,
        }
    }

    #[test]
    fn levels_halve_to_one() {
        let s = shape(64, 16, 0);
        assert_eq!(s.full_levels(), 7);
        assert_eq!(s.level(3), shape(8, 2, 0));
        assert_eq!(s.level(6), shape(1, 1, 0));
        assert_eq!(s.row_bytes(), Some(64 * 16));
    }

    #[test]
    fn spans_and_packed_bytes() {
        let e = CopyExtent {
            width_bytes: 16,
            height: 3,
            depth: 2,
        };
        assert_eq!(e.packed_bytes(), Some(96));
        assert_eq!(e.device_span(32, 4), Some(4 * 32 + 2 * 32 + 16));
        let odd = ArrayShape {
            channels: 3,
            ..shape(1, 1, 1)
        };
        assert_eq!(odd.element_bytes(), None);
    }
}
