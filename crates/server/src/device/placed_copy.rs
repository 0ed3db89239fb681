//! A moved session's memory on its target (issue 17): placed where it changed
//! since it was placed early, then copied device to device, each chunk of the
//! target's placed memory exported, imported by the source, mapped, copied into.

use std::collections::HashSet;
use std::os::fd::AsFd;

use cumux_protocol::vmm::ACCESS_READWRITE;
use cumux_protocol::{codes, CuError, DevicePtr};
use serde::{Deserialize, Serialize};

use super::{DeviceContext, MovableContext, VmmOp};

/// A chunk of the target's placed memory as the source imported it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportedChunk {
    /// The chunk's start and size in the target (the program's addresses).
    pub start: u64,
    pub size: u64,
    /// Its physical memory's id in the source ([`DeviceContext::vmm_import`]).
    pub physical: u64,
}

impl ImportedChunk {
    fn holds(&self, ptr: DevicePtr, bytes: u64) -> bool {
        ptr >= self.start && ptr.saturating_add(bytes) <= self.start + self.size
    }
}

/// Copies each `(ptr, bytes)` of `source` into `target`, where the move
/// placed memory at the same addresses, without the bytes leaving the
/// devices: the target exports each chunk that holds an allocation, the
/// source imports it, then maps them all and copies in one step
/// ([`DeviceContext::copy_into_imported`]: one request to a worker). An
/// error leaves the target's bytes partly written (the caller copies them
/// another way); the source's imports and mappings go either way.
pub fn copy_placed(
    source: &dyn DeviceContext,
    target: &dyn MovableContext,
    allocations: &[(DevicePtr, u64)],
) -> Result<u64, CuError> {
    let mut chunks: Vec<ImportedChunk> = Vec::new();
    match import_chunks(source, target, allocations, &mut chunks) {
        Ok(()) => source.copy_into_imported(&chunks, allocations),
        Err(e) => {
            release_imports(source, &chunks);
            Err(e)
        }
    }
}

/// The target's chunks that hold `allocations`, each exported once and
/// imported by `source` into `chunks`.
fn import_chunks(
    source: &dyn DeviceContext,
    target: &dyn MovableContext,
    allocations: &[(DevicePtr, u64)],
    chunks: &mut Vec<ImportedChunk>,
) -> Result<(), CuError> {
    for &(ptr, bytes) in allocations.iter().filter(|a| a.1 > 0) {
        if chunks.iter().any(|c| c.holds(ptr, bytes)) {
            continue;
        }
        let (start, size, fd) = target.export_placed(ptr)?;
        let physical = source.vmm_import(fd.as_fd())?;
        let chunk = ImportedChunk {
            start,
            size,
            physical,
        };
        chunks.push(chunk);
        if !chunk.holds(ptr, bytes) {
            return Err(CuError::new(
                codes::UNKNOWN,
                format!("the chunk placed for {ptr:#x} does not hold its {bytes} bytes"),
            ));
        }
    }
    Ok(())
}

fn release_imports<C: DeviceContext + ?Sized>(ctx: &C, chunks: &[ImportedChunk]) {
    for c in chunks {
        let _ = ctx.vmm(&VmmOp::Release {
            physical: c.physical,
            size: 0,
        });
    }
}

/// [`DeviceContext::copy_into_imported`] through the context's own virtual
/// memory calls: one reservation for every chunk, each mapped readable and
/// writable there, the copies, then the mappings, the reservation and the
/// imports (never charged to `ctx`: size 0) undone, whatever happened.
pub fn copy_mapped<C: DeviceContext + ?Sized>(
    ctx: &C,
    chunks: &[ImportedChunk],
    copies: &[(DevicePtr, u64)],
) -> Result<u64, CuError> {
    let total = chunks
        .iter()
        .try_fold(0u64, |sum, c| sum.checked_add(c.size))
        .filter(|&t| t > 0);
    let Some(total) = total else {
        release_imports(ctx, chunks);
        return match copies.iter().all(|c| c.1 == 0) {
            true => Ok(0),
            false => Err(CuError::new(
                codes::INVALID_VALUE,
                "copies into placed memory without its chunks",
            )),
        };
    };
    let base = match ctx.vmm(&VmmOp::Reserve {
        size: total,
        alignment: 0,
    }) {
        Ok(base) => base,
        Err(e) => {
            release_imports(ctx, chunks);
            return Err(e);
        }
    };
    let mut mapped: Vec<(u64, u64)> = Vec::with_capacity(chunks.len());
    let copied = map_and_copy(ctx, base, chunks, copies, &mut mapped);
    for &(at, size) in &mapped {
        let _ = ctx.vmm(&VmmOp::Unmap { ptr: at, size });
    }
    let _ = ctx.vmm(&VmmOp::FreeReservation {
        ptr: base,
        size: total,
    });
    release_imports(ctx, chunks);
    copied
}

fn map_and_copy<C: DeviceContext + ?Sized>(
    ctx: &C,
    base: u64,
    chunks: &[ImportedChunk],
    copies: &[(DevicePtr, u64)],
    mapped: &mut Vec<(u64, u64)>,
) -> Result<u64, CuError> {
    let mut at = base;
    let mut places = Vec::with_capacity(chunks.len());
    for c in chunks {
        ctx.vmm(&VmmOp::Map {
            ptr: at,
            size: c.size,
            physical: c.physical,
        })?;
        mapped.push((at, c.size));
        ctx.vmm(&VmmOp::SetAccess {
            ptr: at,
            size: c.size,
            flags: ACCESS_READWRITE,
        })?;
        places.push(at);
        at += c.size;
    }
    let mut copied = 0u64;
    for &(ptr, bytes) in copies.iter().filter(|c| c.1 > 0) {
        let i = chunks
            .iter()
            .position(|c| c.holds(ptr, bytes))
            .ok_or_else(|| {
                CuError::new(
                    codes::INVALID_VALUE,
                    format!("no imported chunk holds the {bytes} bytes at {ptr:#x}"),
                )
            })?;
        ctx.mem_copy(places[i] + (ptr - chunks[i].start), ptr, bytes)?;
        copied += bytes;
    }
    Ok(copied)
}

/// Memory on the move's target as the session holds it now (`places`), where
/// `early` was placed while it ran: what it freed since goes, what it
/// allocated since is placed. Where the new does not fit beside the old
/// (an allocation sharing a page with one placed early), everything is
/// placed afresh. Says how many of `places` were placed early and kept.
pub fn place_changes(
    ctx: &dyn DeviceContext,
    placed: &dyn MovableContext,
    early: &[(DevicePtr, u64)],
    places: &[(DevicePtr, u64)],
) -> Result<usize, CuError> {
    let now: HashSet<(DevicePtr, u64)> = places.iter().copied().collect();
    let before: HashSet<(DevicePtr, u64)> = early.iter().copied().collect();
    for &(ptr, size) in early.iter().filter(|a| !now.contains(a)) {
        ctx.mem_free(ptr, size)?;
    }
    let new: Vec<(DevicePtr, u64)> = places
        .iter()
        .copied()
        .filter(|a| !before.contains(a))
        .collect();
    let kept = places.len() - new.len();
    if new.is_empty() {
        return Ok(kept);
    }
    if let Err(e) = placed.place_all(&new) {
        tracing::debug!(
            "placing a moved session's new memory beside the early: {}",
            e.detail
        );
        for &(ptr, size) in early.iter().filter(|a| now.contains(a)) {
            ctx.mem_free(ptr, size)?;
        }
        placed.place_all(places)?;
        return Ok(0);
    }
    Ok(kept)
}
