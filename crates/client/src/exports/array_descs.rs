//! The descriptors of texture and surface objects as the driver's C structs
//! hold them (`CUDA_RESOURCE_DESC`, `CUDA_TEXTURE_DESC`,
//! `CUDA_RESOURCE_VIEW_DESC`) and as the wire carries them, both ways.

use std::ffi::c_void;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::arrays::{Resource, TextureDesc, ViewDesc};
use cumux_protocol::Handle;

use super::*;
use crate::state::handles;

/// `CUDA_RESOURCE_DESC`: its type, a 128-byte union of eight-byte words,
/// and flags.
#[repr(C)]
pub(super) struct ResourceDesc {
    pub(super) kind: u32,
    pub(super) words: [u64; 16],
    pub(super) flags: u32,
}

const _: () = assert!(std::mem::size_of::<ResourceDesc>() == 144);

pub(super) fn resource(desc: *const c_void) -> CuResult<Resource> {
    let desc = read_in(desc.cast::<ResourceDesc>())?;
    if desc.flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let w = desc.words;
    let (format, channels) = (w[1] as u32, (w[1] >> 32) as u32);
    Ok(match desc.kind {
        CU_RESOURCE_TYPE_ARRAY => Resource::Array(handles::wire_or_invalid(w[0] as *mut c_void)?),
        CU_RESOURCE_TYPE_MIPMAPPED_ARRAY => {
            Resource::Mipmapped(handles::wire_or_invalid(w[0] as *mut c_void)?)
        }
        CU_RESOURCE_TYPE_LINEAR => Resource::Linear {
            ptr: w[0],
            format,
            channels,
            bytes: w[2],
        },
        CU_RESOURCE_TYPE_PITCH2D => Resource::Pitch2D {
            ptr: w[0],
            format,
            channels,
            width: w[2],
            height: w[3],
            pitch: w[4],
        },
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

/// A resource as `CUDA_RESOURCE_DESC` holds it, arrays as the program's handles.
pub(super) fn resource_desc(resource: &Resource) -> ResourceDesc {
    let mut words = [0u64; 16];
    let program = |h: Handle| handles::to_program(h) as u64;
    let format_word = |format: u32, channels: u32| u64::from(format) | u64::from(channels) << 32;
    let kind = match *resource {
        Resource::Array(h) => {
            words[0] = program(h);
            CU_RESOURCE_TYPE_ARRAY
        }
        Resource::Mipmapped(h) => {
            words[0] = program(h);
            CU_RESOURCE_TYPE_MIPMAPPED_ARRAY
        }
        Resource::Linear {
            ptr,
            format,
            channels,
            bytes,
        } => {
            words[..3].copy_from_slice(&[ptr, format_word(format, channels), bytes]);
            CU_RESOURCE_TYPE_LINEAR
        }
        Resource::Pitch2D {
            ptr,
            format,
            channels,
            width,
            height,
            pitch,
        } => {
            let fields = [ptr, format_word(format, channels), width, height, pitch];
            words[..5].copy_from_slice(&fields);
            CU_RESOURCE_TYPE_PITCH2D
        }
    };
    ResourceDesc {
        kind,
        words,
        flags: 0,
    }
}

pub(super) fn texture(t: &CUDA_TEXTURE_DESC) -> TextureDesc {
    TextureDesc {
        address_mode: t.addressMode,
        filter_mode: t.filterMode,
        flags: t.flags,
        max_anisotropy: t.maxAnisotropy,
        mipmap_filter_mode: t.mipmapFilterMode,
        mipmap_level_bias: t.mipmapLevelBias,
        min_mipmap_level_clamp: t.minMipmapLevelClamp,
        max_mipmap_level_clamp: t.maxMipmapLevelClamp,
        border_color: t.borderColor,
    }
}

pub(super) fn view(v: &CUDA_RESOURCE_VIEW_DESC) -> ViewDesc {
    ViewDesc {
        format: v.format,
        width: v.width as u64,
        height: v.height as u64,
        depth: v.depth as u64,
        first_mipmap_level: v.firstMipmapLevel,
        last_mipmap_level: v.lastMipmapLevel,
        first_layer: v.firstLayer,
        last_layer: v.lastLayer,
    }
}
