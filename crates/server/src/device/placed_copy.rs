//! A moved session's memory on its target (issue 17): placed where it changed
//! since it was placed early, then copied device to device, each chunk of the
//! target's placed memory exported, imported by the source, mapped, copied into.

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::sync::Arc;

use super::imported::{ImportedChunk, MappedChunks};
use super::{DeviceContext, MovableContext, VmmOp};
use cumux_protocol::vmm::ACCESS_READWRITE;
use cumux_protocol::{codes, CuError, DevicePtr};

/// An allocation: its address and size.
type Span = (DevicePtr, u64);

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
    let chunks = import_chunks(source, target, allocations)?;
    match chunks.is_empty() {
        true => Ok(0),
        false => source.copy_into_imported(&chunks, allocations),
    }
}

/// [`copy_placed`], where the mappings of `early` mapped the target's memory
/// of some of the allocations beforehand, with those still where they were
/// placed then (`early.1`, from [`place_changes`]): those are only copied, a
/// request a mapping, the rest as [`copy_placed`] copies them.
pub fn copy_placed_after(
    source: &dyn DeviceContext,
    target: &dyn MovableContext,
    allocations: &[(DevicePtr, u64)],
    (mappings, kept): (&[SourceMapping], &[Span]),
) -> Result<u64, CuError> {
    // Only where the memory is still what was mapped: placed early, kept.
    let kept: HashSet<Span> = kept.iter().copied().collect();
    let wanted: HashSet<Span> = allocations.iter().copied().collect();
    let mut copied = 0;
    let mut done: HashSet<Span> = HashSet::new();
    for mapping in mappings {
        let mine: Vec<Span> = mapping
            .allocations
            .iter()
            .copied()
            .filter(|a| kept.contains(a) && wanted.contains(a) && !done.contains(a))
            .collect();
        if mine.is_empty() {
            continue;
        }
        copied += source.copy_into_mapped(&mapping.mapped, &mine)?;
        done.extend(mine);
    }
    let new: Vec<Span> = allocations
        .iter()
        .copied()
        .filter(|a| !done.contains(a))
        .collect();
    if !new.is_empty() {
        copied += copy_placed(source, target, &new)?;
    }
    Ok(copied)
}

/// The target's chunks that hold `allocations`, each exported once and
/// imported by `source`; on failure those imported so far are released.
fn import_chunks(
    source: &dyn DeviceContext,
    target: &dyn MovableContext,
    allocations: &[(DevicePtr, u64)],
) -> Result<Vec<ImportedChunk>, CuError> {
    let mut chunks: Vec<ImportedChunk> = Vec::new();
    let imported = import_into(source, target, allocations, &mut chunks);
    if let Err(e) = imported {
        release_imports(source, &chunks);
        return Err(e);
    }
    Ok(chunks)
}

fn import_into(
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

/// [`DeviceContext::map_imported`] through the context's own virtual memory
/// calls: one reservation for every chunk, each mapped readable and writable
/// there. On failure what it made is undone and the imports released.
pub fn map_chunks<C: DeviceContext + ?Sized>(
    ctx: &C,
    chunks: &[ImportedChunk],
) -> Result<MappedChunks, CuError> {
    let total = chunks
        .iter()
        .try_fold(0u64, |sum, c| sum.checked_add(c.size))
        .filter(|&t| t > 0);
    let Some(total) = total else {
        release_imports(ctx, chunks);
        return Err(CuError::new(codes::INVALID_VALUE, "no memory to map"));
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
    let mut mapped = MappedChunks {
        base,
        total,
        chunks: Vec::with_capacity(chunks.len()),
    };
    let mut at = base;
    for c in chunks {
        let made = ctx.vmm(&VmmOp::Map {
            ptr: at,
            size: c.size,
            physical: c.physical,
        });
        // A chunk mapped is the unmap's to release.
        if made.is_ok() {
            mapped.chunks.push((*c, at));
        }
        let access = made.and_then(|_| {
            ctx.vmm(&VmmOp::SetAccess {
                ptr: at,
                size: c.size,
                flags: ACCESS_READWRITE,
            })
        });
        if let Err(e) = access {
            release_imports(ctx, &chunks[mapped.chunks.len()..]);
            ctx.unmap_imported(&mapped);
            return Err(e);
        }
        at += c.size;
    }
    Ok(mapped)
}

/// [`DeviceContext::copy_into_mapped`] by the context's own copies.
pub fn copy_chunks<C: DeviceContext + ?Sized>(
    ctx: &C,
    mapped: &MappedChunks,
    copies: &[(DevicePtr, u64)],
) -> Result<u64, CuError> {
    let mut copied = 0u64;
    for &(ptr, bytes) in copies.iter().filter(|c| c.1 > 0) {
        ctx.mem_copy(mapped.place_of(ptr, bytes)?, ptr, bytes)?;
        copied += bytes;
    }
    Ok(copied)
}

/// [`DeviceContext::unmap_imported`] by the context's own virtual memory
/// calls: each mapping, the reservation, the imports (never charged to
/// `ctx`: size 0).
pub fn unmap_chunks<C: DeviceContext + ?Sized>(ctx: &C, mapped: &MappedChunks) {
    for &(c, at) in &mapped.chunks {
        let _ = ctx.vmm(&VmmOp::Unmap {
            ptr: at,
            size: c.size,
        });
    }
    let _ = ctx.vmm(&VmmOp::FreeReservation {
        ptr: mapped.base,
        size: mapped.total,
    });
    let chunks: Vec<ImportedChunk> = mapped.chunks.iter().map(|(c, _)| *c).collect();
    release_imports(ctx, &chunks);
}

/// A move's target memory mapped by its source before the pause
/// ([`map_early`]): unmapped when dropped, on whatever thread drops it.
pub struct SourceMapping {
    source: Arc<dyn DeviceContext>,
    pub mapped: MappedChunks,
    /// The allocations `(ptr, bytes)` the chunks were mapped for.
    pub allocations: Vec<(DevicePtr, u64)>,
}

impl Drop for SourceMapping {
    fn drop(&mut self) {
        self.source.unmap_imported(&self.mapped);
    }
}

/// The chunks of `target` holding `allocations`, exported, imported and
/// mapped by `source` while its session runs on, so that a move's pause
/// only copies.
pub fn map_early(
    source: &Arc<dyn DeviceContext>,
    target: &dyn MovableContext,
    allocations: &[(DevicePtr, u64)],
) -> Result<SourceMapping, CuError> {
    let chunks = import_chunks(source.as_ref(), target, allocations)?;
    let mapped = source.map_imported(&chunks)?;
    Ok(SourceMapping {
        source: Arc::clone(source),
        mapped,
        allocations: allocations.to_vec(),
    })
}

/// Memory on the move's target as the session holds it now (`places`), where
/// `early` was placed while it ran: what it freed since goes, what it
/// allocated since is placed. Where a new allocation shares a page with
/// early ones, those (and the early ones sharing their pages) are placed
/// again with it; where even that fails, everything is placed afresh.
/// Says which of `places` still lie where they were placed early.
pub fn place_changes(
    ctx: &dyn DeviceContext,
    placed: &dyn MovableContext,
    early: &[Span],
    places: &[Span],
) -> Result<Vec<Span>, CuError> {
    let now: HashSet<Span> = places.iter().copied().collect();
    let before: HashSet<Span> = early.iter().copied().collect();
    for &(ptr, size) in early.iter().filter(|a| !now.contains(a)) {
        ctx.mem_free(ptr, size)?;
    }
    let mut kept: Vec<Span> = early.iter().copied().filter(|a| now.contains(a)).collect();
    let new: Vec<Span> = places
        .iter()
        .copied()
        .filter(|a| !before.contains(a))
        .collect();
    if new.is_empty() {
        return Ok(kept);
    }
    let Err(e) = placed.place_all(&new) else {
        return Ok(kept);
    };
    tracing::debug!(
        "placing a moved session's new memory beside the early: {}",
        e.detail
    );
    if let Some(near) = sharing_pages(ctx, &new, &kept) {
        for &(ptr, size) in &near {
            ctx.mem_free(ptr, size)?;
        }
        kept.retain(|a| !near.contains(a));
        let again: Vec<Span> = new.iter().chain(&near).copied().collect();
        if placed.place_all(&again).is_ok() {
            return Ok(kept);
        }
    }
    for &(ptr, size) in &kept {
        ctx.mem_free(ptr, size)?;
    }
    placed.place_all(places)?;
    Ok(Vec::new())
}

/// The allocations of `early` in a page (of `ctx`'s granularity) of one of
/// `new`, or of one found so, until no more are; `None` where the
/// granularity is not known.
fn sharing_pages(ctx: &dyn DeviceContext, new: &[Span], early: &[Span]) -> Option<Vec<Span>> {
    let g = ctx
        .vmm(&VmmOp::Granularity { recommended: false })
        .ok()
        .filter(|g| g.is_power_of_two())?;
    let pages = |&(ptr, size): &Span| {
        let end = ptr.saturating_add(size.max(1)).saturating_add(g - 1) & !(g - 1);
        (ptr & !(g - 1), end)
    };
    let mut taken: Vec<(u64, u64)> = new.iter().map(pages).collect();
    let mut near: Vec<Span> = Vec::new();
    loop {
        let found: Vec<Span> = early
            .iter()
            .filter(|a| !near.contains(a))
            .filter(|a| {
                let (lo, hi) = pages(a);
                taken.iter().any(|&(l, h)| lo < h && l < hi)
            })
            .copied()
            .collect();
        if found.is_empty() {
            return Some(near);
        }
        taken.extend(found.iter().map(pages));
        near.extend(found);
    }
}
