//! The GPU's CUDA arrays: [`ArrayOp`]s and copies to and from arrays as the
//! driver's calls (`cumux_cuda_driver::arrays`), with cumux's types turned
//! into the driver's descriptors.

use cumux_cuda_driver::sys::{
    CUDA_ARRAY3D_DESCRIPTOR, CUDA_RESOURCE_DESC, CUDA_RESOURCE_VIEW_DESC, CUDA_TEXTURE_DESC,
    CU_RESOURCE_TYPE_ARRAY, CU_RESOURCE_TYPE_LINEAR, CU_RESOURCE_TYPE_MIPMAPPED_ARRAY,
    CU_RESOURCE_TYPE_PITCH2D,
};
use cumux_cuda_driver::{self as cu, CopyPlace};
use cumux_protocol::arrays::{ArrayShape, CopyEnd, CopyExtent, Resource, TextureDesc, ViewDesc};
use cumux_protocol::{codes, CuError};

use super::convert::cu_err;
use crate::device::arrays::ArrayOp;

fn size(v: u64) -> Result<usize, CuError> {
    usize::try_from(v).map_err(|_| CuError::new(codes::INVALID_VALUE, "a size past usize"))
}

fn descriptor(shape: &ArrayShape) -> Result<CUDA_ARRAY3D_DESCRIPTOR, CuError> {
    Ok(CUDA_ARRAY3D_DESCRIPTOR {
        width: size(shape.width)?,
        height: size(shape.height)?,
        depth: size(shape.depth)?,
        format: shape.format,
        num_channels: shape.channels,
        flags: shape.flags,
    })
}

/// Format and channels as the resource union's second word keeps them.
fn format_word(format: u32, channels: u32) -> u64 {
    u64::from(format) | u64::from(channels) << 32
}

fn resource(resource: &Resource) -> CUDA_RESOURCE_DESC {
    let mut desc = CUDA_RESOURCE_DESC::default();
    match *resource {
        Resource::Array(array) => {
            desc.res_type = CU_RESOURCE_TYPE_ARRAY;
            desc.res[0] = array;
        }
        Resource::Mipmapped(mipmap) => {
            desc.res_type = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
            desc.res[0] = mipmap;
        }
        Resource::Linear {
            ptr,
            format,
            channels,
            bytes,
        } => {
            desc.res_type = CU_RESOURCE_TYPE_LINEAR;
            desc.res[..3].copy_from_slice(&[ptr, format_word(format, channels), bytes]);
        }
        Resource::Pitch2D {
            ptr,
            format,
            channels,
            width,
            height,
            pitch,
        } => {
            desc.res_type = CU_RESOURCE_TYPE_PITCH2D;
            let words = [ptr, format_word(format, channels), width, height, pitch];
            desc.res[..5].copy_from_slice(&words);
        }
    }
    desc
}

fn texture(t: &TextureDesc) -> CUDA_TEXTURE_DESC {
    CUDA_TEXTURE_DESC {
        address_mode: t.address_mode,
        filter_mode: t.filter_mode,
        flags: t.flags,
        max_anisotropy: t.max_anisotropy,
        mipmap_filter_mode: t.mipmap_filter_mode,
        mipmap_level_bias: t.mipmap_level_bias,
        min_mipmap_level_clamp: t.min_mipmap_level_clamp,
        max_mipmap_level_clamp: t.max_mipmap_level_clamp,
        border_color: t.border_color,
        reserved: [0; 12],
    }
}

fn view(v: &ViewDesc) -> Result<CUDA_RESOURCE_VIEW_DESC, CuError> {
    Ok(CUDA_RESOURCE_VIEW_DESC {
        format: v.format,
        width: size(v.width)?,
        height: size(v.height)?,
        depth: size(v.depth)?,
        first_mipmap_level: v.first_mipmap_level,
        last_mipmap_level: v.last_mipmap_level,
        first_layer: v.first_layer,
        last_layer: v.last_layer,
        reserved: [0; 16],
    })
}

/// Runs `op` on `ctx`: the id of what it made, else 0.
pub fn run(ctx: &cu::Context, op: &ArrayOp) -> Result<u64, CuError> {
    let done = match op {
        ArrayOp::Create { shape, .. } => ctx.array_create(&descriptor(shape)?),
        ArrayOp::Destroy { array, .. } => ctx.array_destroy(*array).map(|()| 0),
        ArrayOp::CreateMipmapped { shape, levels, .. } => {
            ctx.mipmapped_create(&descriptor(shape)?, *levels)
        }
        ArrayOp::Level { mipmap, level } => ctx.mipmapped_level(*mipmap, *level),
        ArrayOp::DestroyMipmapped { mipmap, .. } => ctx.mipmapped_destroy(*mipmap).map(|()| 0),
        ArrayOp::TextureCreate {
            resource: r,
            texture: t,
            view: v,
        } => {
            let v = v.as_ref().map(view).transpose()?;
            ctx.texture_create(&resource(r), &texture(t), v.as_ref())
        }
        ArrayOp::TextureDestroy { texture } => ctx.texture_destroy(*texture).map(|()| 0),
        ArrayOp::SurfaceCreate { array } => ctx.surface_create(*array),
        ArrayOp::SurfaceDestroy { surface } => ctx.surface_destroy(*surface).map(|()| 0),
    };
    done.map_err(cu_err)
}

/// One end of a copy as the driver layer takes it; a host end is `host`.
fn place<'a>(end: &CopyEnd, host: HostSide<'a>) -> CopyPlace<'a> {
    match (*end, host) {
        (CopyEnd::Host, HostSide::In(bytes)) => CopyPlace::HostIn(bytes),
        (CopyEnd::Host, HostSide::Out(bytes)) => CopyPlace::HostOut(bytes),
        (CopyEnd::Device { ptr, pitch, height }, _) => CopyPlace::Device { ptr, pitch, height },
        (
            CopyEnd::Array {
                array,
                x_bytes,
                y,
                z,
            },
            _,
        ) => CopyPlace::Array {
            array,
            x_bytes,
            y,
            z,
        },
    }
}

enum HostSide<'a> {
    In(&'a [u8]),
    Out(&'a mut [u8]),
}

/// Copies `extent` from `src` to `dst` on `stream`, waited for (see
/// [`crate::device::DeviceContext::array_copy`]).
pub fn copy(
    stream: &cu::Stream,
    src: &CopyEnd,
    dst: &CopyEnd,
    extent: &CopyExtent,
    from_host: &[u8],
    to_host: &mut [u8],
) -> Result<(), CuError> {
    let from = place(src, HostSide::In(from_host));
    let to = place(dst, HostSide::Out(to_host));
    stream
        .copy_3d(from, to, extent.width_bytes, extent.height, extent.depth)
        .map_err(cu_err)
}
