//! CUDA arrays on a [`Context`]: arrays and mipmapped arrays, copies where
//! either end is one (on a [`Stream`], waited for), texture and surface
//! objects. The caller keeps the tables; these are the driver's calls.

use std::ffi::c_void;

use crate::driver::{cu, to_usize, Context};
use crate::error::CudaError;
use crate::objects::Stream;
use crate::sys::*;

/// One end of a [`Context::copy_3d`].
pub enum CopyPlace<'a> {
    /// Host bytes read from, packed (`width_bytes` a row, rows then layers).
    HostIn(&'a [u8]),
    /// Host bytes written to, packed likewise.
    HostOut(&'a mut [u8]),
    /// Device memory: rows `pitch` bytes apart, layers `height` rows apart.
    Device { ptr: u64, pitch: u64, height: u64 },
    /// An array, from `x_bytes` into row `y` of layer `z`.
    Array {
        array: u64,
        x_bytes: u64,
        y: u64,
        z: u64,
    },
}

/// A `u64` handle as the driver's pointer-typed handle.
fn handle(raw: u64) -> *mut c_void {
    raw as usize as *mut c_void
}

fn invalid(detail: &str) -> CudaError {
    CudaError::new(CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "copy").with_detail(detail)
}

/// Fills one end of `copy` (`src` or `dst`) from `place`; a host slice must
/// hold the packed box (`packed` bytes).
struct End {
    x: usize,
    y: usize,
    z: usize,
    memory_type: std::ffi::c_uint,
    host: *mut c_void,
    device: u64,
    array: *mut c_void,
    pitch: usize,
    height: usize,
}

fn end(place: &mut CopyPlace<'_>, packed: u64, width: u64, rows: u64) -> Result<End, CudaError> {
    let host = |ptr: *mut c_void, len: usize| -> Result<End, CudaError> {
        if (len as u64) < packed {
            return Err(invalid("a host buffer smaller than the copy"));
        }
        Ok(End {
            x: 0,
            y: 0,
            z: 0,
            memory_type: CU_MEMORYTYPE_HOST,
            host: ptr,
            device: 0,
            array: std::ptr::null_mut(),
            pitch: to_usize(width)?,
            height: to_usize(rows)?,
        })
    };
    match place {
        CopyPlace::HostIn(bytes) => host(bytes.as_ptr() as *mut c_void, bytes.len()),
        CopyPlace::HostOut(bytes) => host(bytes.as_mut_ptr().cast(), bytes.len()),
        CopyPlace::Device { ptr, pitch, height } => Ok(End {
            x: 0,
            y: 0,
            z: 0,
            memory_type: CU_MEMORYTYPE_DEVICE,
            host: std::ptr::null_mut(),
            device: *ptr,
            array: std::ptr::null_mut(),
            pitch: to_usize(*pitch)?,
            height: to_usize(*height)?,
        }),
        CopyPlace::Array {
            array,
            x_bytes,
            y,
            z,
        } => Ok(End {
            x: to_usize(*x_bytes)?,
            y: to_usize(*y)?,
            z: to_usize(*z)?,
            memory_type: CU_MEMORYTYPE_ARRAY,
            host: std::ptr::null_mut(),
            device: 0,
            array: handle(*array),
            pitch: 0,
            height: 0,
        }),
    }
}

impl Context {
    /// `cuArray3DCreate`: the array's handle.
    pub fn array_create(&self, desc: &CUDA_ARRAY3D_DESCRIPTOR) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut array: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer and a descriptor that outlive the call.
        unsafe { cu!(self.driver, cuArray3DCreate(&mut array, desc))? };
        Ok(array as u64)
    }

    /// `cuArrayDestroy` of an array [`Context::array_create`] gave.
    pub fn array_destroy(&self, array: u64) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: the driver checks the handle.
        unsafe { cu!(self.driver, cuArrayDestroy(handle(array))) }
    }

    /// `cuMipmappedArrayCreate` of `levels` levels: its handle.
    pub fn mipmapped_create(
        &self,
        desc: &CUDA_ARRAY3D_DESCRIPTOR,
        levels: u32,
    ) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut mipmap: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer and a descriptor that outlive the call.
        unsafe {
            cu!(
                self.driver,
                cuMipmappedArrayCreate(&mut mipmap, desc, levels)
            )?
        };
        Ok(mipmap as u64)
    }

    /// `cuMipmappedArrayGetLevel`: the level's array (the mipmap owns it).
    pub fn mipmapped_level(&self, mipmap: u64, level: u32) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut array: *mut c_void = std::ptr::null_mut();
        // SAFETY: an out-pointer; the driver checks the handle.
        unsafe {
            cu!(
                self.driver,
                cuMipmappedArrayGetLevel(&mut array, handle(mipmap), level)
            )?
        };
        Ok(array as u64)
    }

    /// `cuMipmappedArrayDestroy`.
    pub fn mipmapped_destroy(&self, mipmap: u64) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: the driver checks the handle.
        unsafe { cu!(self.driver, cuMipmappedArrayDestroy(handle(mipmap))) }
    }

    /// `cuTexObjectCreate`: the texture object, as kernels take it.
    pub fn texture_create(
        &self,
        resource: &CUDA_RESOURCE_DESC,
        texture: &CUDA_TEXTURE_DESC,
        view: Option<&CUDA_RESOURCE_VIEW_DESC>,
    ) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut object = 0u64;
        let view = view.map_or(std::ptr::null(), |v| v as *const _);
        // SAFETY: an out-pointer and descriptors that outlive the call.
        unsafe {
            cu!(
                self.driver,
                cuTexObjectCreate(&mut object, resource, texture, view)
            )?
        };
        Ok(object)
    }

    /// `cuTexObjectDestroy`.
    pub fn texture_destroy(&self, texture: u64) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: the driver checks the object.
        unsafe { cu!(self.driver, cuTexObjectDestroy(texture)) }
    }

    /// `cuSurfObjectCreate` over `array`: the surface object.
    pub fn surface_create(&self, array: u64) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut resource = CUDA_RESOURCE_DESC {
            res_type: CU_RESOURCE_TYPE_ARRAY,
            ..Default::default()
        };
        resource.res[0] = array;
        let mut object = 0u64;
        // SAFETY: an out-pointer and a descriptor that outlive the call.
        unsafe { cu!(self.driver, cuSurfObjectCreate(&mut object, &resource))? };
        Ok(object)
    }

    /// `cuSurfObjectDestroy`.
    pub fn surface_destroy(&self, surface: u64) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: the driver checks the object.
        unsafe { cu!(self.driver, cuSurfObjectDestroy(surface)) }
    }
}

impl Stream {
    /// `cuMemcpy3DAsync` of `width_bytes` × `height` rows × `depth` layers
    /// from `src` to `dst` on this stream, after its earlier work; returns
    /// once the stream has finished it (so the host ends' borrows end when
    /// the driver is done with them).
    pub fn copy_3d(
        &self,
        mut src: CopyPlace<'_>,
        mut dst: CopyPlace<'_>,
        width_bytes: u64,
        height: u64,
        depth: u64,
    ) -> Result<(), CudaError> {
        let packed = width_bytes
            .checked_mul(height)
            .and_then(|b| b.checked_mul(depth))
            .ok_or_else(|| invalid("a copy larger than the address space"))?;
        if matches!(src, CopyPlace::HostOut(_)) || matches!(dst, CopyPlace::HostIn(_)) {
            return Err(invalid("a host end the wrong way round"));
        }
        let s = end(&mut src, packed, width_bytes, height)?;
        let d = end(&mut dst, packed, width_bytes, height)?;
        let copy = CUDA_MEMCPY3D {
            src_x_in_bytes: s.x,
            src_y: s.y,
            src_z: s.z,
            src_lod: 0,
            src_memory_type: s.memory_type,
            src_host: s.host,
            src_device: s.device,
            src_array: s.array,
            reserved0: std::ptr::null_mut(),
            src_pitch: s.pitch,
            src_height: s.height,
            dst_x_in_bytes: d.x,
            dst_y: d.y,
            dst_z: d.z,
            dst_lod: 0,
            dst_memory_type: d.memory_type,
            dst_host: d.host,
            dst_device: d.device,
            dst_array: d.array,
            reserved1: std::ptr::null_mut(),
            dst_pitch: d.pitch,
            dst_height: d.height,
            width_in_bytes: to_usize(width_bytes)?,
            height: to_usize(height)?,
            depth: to_usize(depth)?,
        };
        let ctx = self.context();
        ctx.make_current()?;
        // SAFETY: host ends point into slices borrowed for the call that
        // hold the whole packed box (checked above); the driver checks the
        // device ends and arrays; the stream is live while `self` is.
        unsafe { cu!(ctx.driver, cuMemcpy3DAsync(&copy, self.raw()))? };
        self.synchronize()
    }
}
