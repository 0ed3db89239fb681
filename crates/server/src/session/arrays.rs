//! A session's CUDA arrays, mipmapped arrays, texture and surface objects
//! (`Call::Array`): every handle looked up in the session's own tables,
//! every device pointer and array box checked, arrays charged to the
//! tenant's quota; copies to and from arrays run once their stream's work
//! is done.

use std::sync::atomic::Ordering;

use cumux_protocol::arrays::{
    channel_bytes, ArrayCall, ArrayShape, CopyEnd, CopyExtent, Resource, TextureMade,
    ARRAY_FLAGS_KNOWN,
};
use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::{codes, CuError, Handle, ReplyBody, DEFAULT_STREAM};

use super::array_tables::{charge_of, ArrayEntry, MipmapEntry};
use super::core::{err, release_failed};
use super::{CallResult, Session};
use crate::device::arrays::ArrayOp;
use crate::device::SyncTarget;

fn invalid(detail: impl Into<String>) -> CuError {
    err(codes::INVALID_VALUE, detail)
}

fn unknown(what: &str, handle: u64) -> CuError {
    err(
        codes::INVALID_HANDLE,
        format!("{handle:#x} is not {what} of this session"),
    )
}

/// Whether `offset + extent` fits in `limit`.
fn fits(offset: u64, extent: u64, limit: u64) -> bool {
    offset.checked_add(extent).is_some_and(|end| end <= limit)
}

impl Session {
    pub(super) fn array_call(&mut self, call: ArrayCall) -> CallResult {
        match call {
            ArrayCall::Create { shape } => self.array_create(shape, None),
            ArrayCall::CreateMipmapped { shape, levels } => self.array_create(shape, Some(levels)),
            ArrayCall::Destroy { array } => self.array_destroy(array),
            ArrayCall::DestroyMipmapped { mipmap } => self.mipmap_destroy(mipmap),
            ArrayCall::Describe { array } => {
                let entry = self.arrays.arrays.get(&array);
                let entry = entry.ok_or_else(|| unknown("an array", array))?;
                Ok(ReplyBody::Array(entry.shape))
            }
            ArrayCall::Level { mipmap, level } => self.mipmap_level(mipmap, level),
            ArrayCall::Copy {
                src,
                dst,
                extent,
                stream,
                data,
            } => self.array_copy(src, dst, extent, stream, data),
            ArrayCall::TextureCreate {
                resource,
                texture,
                view,
            } => {
                let made = TextureMade {
                    resource,
                    texture,
                    view,
                };
                let op = ArrayOp::TextureCreate {
                    resource: self.resource(resource)?,
                    texture,
                    view,
                };
                self.room_for_one_more()?;
                let object = self.ctx.array(&op)?;
                self.arrays.textures.insert(object, made);
                Ok(ReplyBody::Value(object))
            }
            ArrayCall::SurfaceCreate { array } => {
                let backend = self.array_entry(array)?.backend;
                self.room_for_one_more()?;
                let object = self.ctx.array(&ArrayOp::SurfaceCreate { array: backend })?;
                self.arrays.surfaces.insert(object, array);
                Ok(ReplyBody::Value(object))
            }
            ArrayCall::TextureDescribe { texture } => match self.arrays.textures.get(&texture) {
                Some(made) => Ok(ReplyBody::Texture(*made)),
                None => Err(unknown("a texture object", texture)),
            },
            ArrayCall::SurfaceDescribe { surface } => match self.arrays.surfaces.get(&surface) {
                Some(&array) => Ok(ReplyBody::Handle(array)),
                None => Err(unknown("a surface object", surface)),
            },
            ArrayCall::TextureDestroy { texture } => {
                if self.arrays.textures.remove(&texture).is_none() {
                    return Err(unknown("a texture object", texture));
                }
                self.ctx.array(&ArrayOp::TextureDestroy { texture })?;
                Ok(ReplyBody::Unit)
            }
            ArrayCall::SurfaceDestroy { surface } => {
                if self.arrays.surfaces.remove(&surface).is_none() {
                    return Err(unknown("a surface object", surface));
                }
                self.ctx.array(&ArrayOp::SurfaceDestroy { surface })?;
                Ok(ReplyBody::Unit)
            }
        }
    }

    fn array_entry(&self, array: Handle) -> Result<&ArrayEntry, CuError> {
        self.arrays
            .arrays
            .get(&array)
            .ok_or_else(|| unknown("an array", array))
    }

    fn room_for_one_more(&self) -> Result<(), CuError> {
        match self.arrays.full() {
            true => Err(err(
                codes::OUT_OF_MEMORY,
                "the session holds as many arrays and texture or surface objects as it may",
            )),
            false => Ok(()),
        }
    }

    /// `cuArray3DCreate` (`levels: None`) or `cuMipmappedArrayCreate`.
    fn array_create(&mut self, shape: ArrayShape, levels: Option<u32>) -> CallResult {
        self.room_for_one_more()?;
        if shape.width == 0 || (shape.height == 0 && shape.depth != 0) {
            return Err(invalid(format!("an array of {shape:?}")));
        }
        if shape.flags & !ARRAY_FLAGS_KNOWN != 0 {
            return Err(err(
                codes::NOT_SUPPORTED,
                format!("array flags {:#x}", shape.flags),
            ));
        }
        if let Some(levels) = levels {
            if levels == 0 || levels > shape.full_levels() {
                return Err(invalid(format!("{levels} mipmap levels of {shape:?}")));
            }
        }
        let bytes = charge_of(&shape, levels.unwrap_or(1)).ok_or_else(|| {
            err(
                codes::NOT_SUPPORTED,
                format!(
                    "array format {:#x} with {} channels (cumux carries 8-, 16- and 32-bit \
                     integers, half and single floats, in 1, 2 or 4 channels)",
                    shape.format, shape.channels
                ),
            )
        })?;
        self.reserve(bytes)?;
        let op = match levels {
            None => ArrayOp::Create { shape, bytes },
            Some(levels) => ArrayOp::CreateMipmapped {
                shape,
                levels,
                bytes,
            },
        };
        let backend = match self.ctx.array(&op) {
            Ok(id) => id,
            Err(e) => {
                self.release(bytes);
                return Err(e);
            }
        };
        let handle = self.mint_handle();
        match levels {
            None => {
                let entry = ArrayEntry {
                    backend,
                    shape,
                    bytes,
                    level_of: None,
                };
                self.arrays.arrays.insert(handle, entry);
            }
            Some(levels) => {
                let entry = MipmapEntry {
                    backend,
                    shape,
                    levels,
                    bytes,
                    level_arrays: Default::default(),
                };
                self.arrays.mipmaps.insert(handle, entry);
            }
        }
        let stats = &self.core.stats;
        stats.mem_used.fetch_add(bytes, Ordering::Relaxed);
        stats.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(ReplyBody::Handle(handle))
    }

    fn array_destroy(&mut self, array: Handle) -> CallResult {
        if self.array_entry(array)?.level_of.is_some() {
            return Err(invalid(format!(
                "{array:#x} is a mipmapped array's level: it goes with its mipmapped array"
            )));
        }
        // Like cuArrayDestroy, after the work that may still use it.
        self.drain_all();
        let Some(entry) = self.arrays.arrays.remove(&array) else {
            return Err(unknown("an array", array));
        };
        let op = ArrayOp::Destroy {
            array: entry.backend,
            bytes: entry.bytes,
        };
        self.uncharge(entry.bytes);
        self.ctx.array(&op)?;
        Ok(ReplyBody::Unit)
    }

    fn mipmap_destroy(&mut self, mipmap: Handle) -> CallResult {
        if !self.arrays.mipmaps.contains_key(&mipmap) {
            return Err(unknown("a mipmapped array", mipmap));
        }
        self.drain_all();
        let Some(entry) = self.arrays.mipmaps.remove(&mipmap) else {
            return Err(unknown("a mipmapped array", mipmap));
        };
        for level in entry.level_arrays.values() {
            self.arrays.arrays.remove(level);
        }
        let op = ArrayOp::DestroyMipmapped {
            mipmap: entry.backend,
            bytes: entry.bytes,
        };
        self.uncharge(entry.bytes);
        self.ctx.array(&op)?;
        Ok(ReplyBody::Unit)
    }

    fn uncharge(&self, bytes: u64) {
        self.release(bytes);
        let stats = &self.core.stats;
        stats.mem_used.fetch_sub(bytes, Ordering::Relaxed);
        stats.allocations.fetch_sub(1, Ordering::Relaxed);
    }

    /// `cuMipmappedArrayGetLevel`: the level's array, made once.
    fn mipmap_level(&mut self, mipmap: Handle, level: u32) -> CallResult {
        let entry = self.arrays.mipmaps.get(&mipmap);
        let entry = entry.ok_or_else(|| unknown("a mipmapped array", mipmap))?;
        if level >= entry.levels {
            return Err(invalid(format!(
                "level {level} of a mipmapped array of {} levels",
                entry.levels
            )));
        }
        if let Some(&array) = entry.level_arrays.get(&level) {
            return Ok(ReplyBody::Handle(array));
        }
        let (backend, shape) = (entry.backend, entry.shape.level(level));
        self.room_for_one_more()?;
        let level_backend = self.ctx.array(&ArrayOp::Level {
            mipmap: backend,
            level,
        })?;
        let handle = self.mint_handle();
        let array = ArrayEntry {
            backend: level_backend,
            shape,
            bytes: 0,
            level_of: Some(mipmap),
        };
        self.arrays.arrays.insert(handle, array);
        if let Some(entry) = self.arrays.mipmaps.get_mut(&mipmap) {
            entry.level_arrays.insert(level, handle);
        }
        Ok(ReplyBody::Handle(handle))
    }

    /// A copy end with its array handle replaced by the backend's, once the
    /// box is checked against the array or the device memory.
    fn copy_end(
        &self,
        end: CopyEnd,
        extent: &CopyExtent,
        writes: bool,
    ) -> Result<CopyEnd, CuError> {
        match end {
            CopyEnd::Host => Ok(CopyEnd::Host),
            CopyEnd::Device { ptr, pitch, height } => {
                if extent.height > 1 && pitch < extent.width_bytes
                    || extent.depth > 1 && height < extent.height
                {
                    return Err(invalid("a pitch or height smaller than the copy"));
                }
                let span = extent
                    .device_span(pitch, height)
                    .ok_or_else(|| invalid("a copy past the address space"))?;
                match writes {
                    true => self.check_range(ptr, span)?,
                    false => self.check_source(ptr, span)?,
                }
                Ok(end)
            }
            CopyEnd::Array {
                array,
                x_bytes,
                y,
                z,
            } => {
                let entry = self.array_entry(array)?;
                let row = entry.shape.row_bytes().unwrap_or(0);
                let (rows, layers) = entry.shape.rows_and_layers();
                let inside = fits(x_bytes, extent.width_bytes, row)
                    && fits(y, extent.height, rows)
                    && fits(z, extent.depth, layers);
                if !inside {
                    return Err(invalid(format!(
                        "a copy of {extent:?} at ({x_bytes}, {y}, {z}) past an array of {:?}",
                        entry.shape
                    )));
                }
                Ok(CopyEnd::Array {
                    array: entry.backend,
                    x_bytes,
                    y,
                    z,
                })
            }
        }
    }

    fn array_copy(
        &mut self,
        src: CopyEnd,
        dst: CopyEnd,
        extent: CopyExtent,
        stream: Option<Handle>,
        data: Vec<u8>,
    ) -> CallResult {
        self.check_optional_stream(stream)?;
        let is_array = |e: &CopyEnd| matches!(e, CopyEnd::Array { .. });
        if !is_array(&src) && !is_array(&dst) {
            return Err(invalid("a copy with no array end"));
        }
        let from_host = src == CopyEnd::Host;
        let to_host = dst == CopyEnd::Host;
        // A host end's bytes travel in one chunk at most.
        let packed = extent
            .packed_bytes()
            .filter(|&b| b <= MAX_CHUNK_BYTES as u64 || !from_host && !to_host)
            .ok_or_else(|| invalid(format!("a copy of {extent:?} is over one chunk")))?;
        if from_host && data.len() as u64 != packed || !from_host && !data.is_empty() {
            return Err(invalid(format!(
                "{} bytes came with a copy of {packed}",
                data.len()
            )));
        }
        let src = self.copy_end(src, &extent, false)?;
        let dst = self.copy_end(dst, &extent, true)?;
        let mut out = vec![0u8; if to_host { packed as usize } else { 0 }];
        if packed > 0 {
            // After the work before it on its stream (the default stream:
            // every blocking stream's), as the driver orders it.
            let target = match stream {
                Some(s) if s != DEFAULT_STREAM => SyncTarget::Stream(s),
                _ => SyncTarget::Context,
            };
            self.synchronize(target)?;
            self.ctx.array_copy(&src, &dst, &extent, &data, &mut out)?;
        }
        Ok(match to_host {
            true => ReplyBody::Data(out),
            false => ReplyBody::Unit,
        })
    }

    /// A texture's resource with its arrays as the backend's ids, its
    /// memory checked.
    fn resource(&self, resource: Resource) -> Result<Resource, CuError> {
        Ok(match resource {
            Resource::Array(array) => Resource::Array(self.array_entry(array)?.backend),
            Resource::Mipmapped(mipmap) => {
                let entry = self.arrays.mipmaps.get(&mipmap);
                Resource::Mipmapped(
                    entry
                        .ok_or_else(|| unknown("a mipmapped array", mipmap))?
                        .backend,
                )
            }
            Resource::Linear { ptr, bytes, .. } => {
                self.check_source(ptr, bytes)?;
                resource
            }
            Resource::Pitch2D {
                ptr,
                format,
                channels,
                width,
                height,
                pitch,
            } => {
                let row = channel_bytes(format)
                    .and_then(|b| b.checked_mul(u64::from(channels)))
                    .and_then(|b| b.checked_mul(width))
                    .unwrap_or(pitch);
                let span = height
                    .saturating_sub(1)
                    .checked_mul(pitch)
                    .and_then(|b| b.checked_add(row))
                    .ok_or_else(|| invalid("a pitched resource past the address space"))?;
                self.check_source(ptr, span)?;
                resource
            }
        })
    }

    /// Destroys every object and array the session still holds (at its end).
    pub(super) fn arrays_teardown(&mut self) {
        let tables = std::mem::take(&mut self.arrays);
        let mut ops: Vec<ArrayOp> = Vec::new();
        ops.extend(
            tables
                .textures
                .into_keys()
                .map(|texture| ArrayOp::TextureDestroy { texture }),
        );
        ops.extend(
            tables
                .surfaces
                .into_keys()
                .map(|surface| ArrayOp::SurfaceDestroy { surface }),
        );
        let mut bytes = Vec::new();
        for entry in tables.arrays.into_values().filter(|a| a.level_of.is_none()) {
            bytes.push(entry.bytes);
            ops.push(ArrayOp::Destroy {
                array: entry.backend,
                bytes: entry.bytes,
            });
        }
        for entry in tables.mipmaps.into_values() {
            bytes.push(entry.bytes);
            ops.push(ArrayOp::DestroyMipmapped {
                mipmap: entry.backend,
                bytes: entry.bytes,
            });
        }
        for op in ops {
            if let Err(e) = self.ctx.array(&op) {
                release_failed(self.id(), format_args!("{op:?} at teardown"), &e);
            }
        }
        for b in bytes {
            self.uncharge(b);
        }
    }
}
