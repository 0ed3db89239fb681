//! Device memory placed at addresses a moved session's program already holds
//! (issue 17): address ranges reserved where the source process had them
//! (`cuMemAddressReserve` at a hint, which the driver honours only where the
//! range is free here), physical memory created and mapped into them.
//!
//! Allocations that shared a page of the driver's granularity in the source
//! share one chunk here; a chunk goes once its last allocation is freed, a
//! reservation once its last chunk is. Ranges are first asked in 1 GiB
//! windows around them, then in aligned 256 and 64 MiB blocks, then
//! exactly: in a probe on the H100 the driver put 64 MiB and larger ranges
//! where asked and passed over the hints of 2-4 MiB ones. Room kept free
//! ([`Placed::keep_free`]) is spare until memory is placed in it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use cumux_cuda_driver as cu;
use cumux_protocol::{codes, CuError, DevicePtr};

use super::convert::cu_err;

/// The window a placed range is first asked in.
const WINDOW: u64 = 1 << 30;

/// Aligned blocks a range is asked in where its window is taken in part:
/// hints for 64 MiB and more were honoured where free.
const BLOCKS: [u64; 2] = [256 << 20, 64 << 20];

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
const READ_WRITE: u32 = 3;

struct Chunk {
    size: u64,
    physical: u64,
    /// Placed allocations inside it.
    live: u32,
}

/// The memory of one context placed at given addresses.
#[derive(Default)]
pub struct Placed {
    /// Reservations: start → size.
    windows: BTreeMap<u64, u64>,
    /// Mapped physical memory: start → chunk.
    chunks: BTreeMap<u64, Chunk>,
    /// Each placed allocation's chunk, and its size.
    allocations: HashMap<DevicePtr, (u64, u64)>,
    /// Ranges kept unused ([`Placed::hold`]): their reservations stay.
    held: Vec<(u64, u64)>,
    /// Reservations kept free ([`Placed::keep_free`]) with nothing placed
    /// or held in them yet: given back where a range across them is placed.
    spare: BTreeSet<u64>,
}

fn down(x: u64, to: u64) -> u64 {
    x & !(to - 1)
}

fn up(x: u64, to: u64) -> Option<u64> {
    Some(x.checked_add(to - 1)? & !(to - 1))
}

/// Sorted ranges merged where they overlap (or touch, with `touching`).
fn merged(mut ranges: Vec<(u64, u64)>, touching: bool) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo < last.1 || (touching && lo == last.1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// Whether one reservation of `map` holds all of `[lo, hi)`.
fn covers(map: &BTreeMap<u64, u64>, lo: u64, hi: u64) -> bool {
    map.range(..=lo)
        .next_back()
        .is_some_and(|(&s, &len)| hi <= s + len)
}

fn overlaps(map: &BTreeMap<u64, u64>, lo: u64, hi: u64) -> bool {
    map.range(..hi)
        .next_back()
        .is_some_and(|(&s, &len)| s + len > lo)
}

/// The refusal of `[lo, hi)`, which `ctx`'s driver would not reserve
/// (`why`), naming the device memory the driver knows there, if any (its
/// own, or a module's).
fn taken(ctx: &cu::Context, lo: u64, hi: u64, why: &str) -> CuError {
    let holders: Vec<String> = [lo, hi - 1]
        .iter()
        .filter_map(|&at| ctx.address_range(at).ok())
        .map(|(base, size)| format!("; [{base:#x}, +{size}) is device memory there"))
        .collect();
    CuError::new(
        codes::OUT_OF_MEMORY,
        format!(
            "the addresses [{lo:#x}, {hi:#x}) are taken in the target's process ({why}{}): the \
             session cannot keep its pointers there",
            holders.concat()
        ),
    )
}

/// The pages of the driver's granularity that each `(ptr, bytes)` covers,
/// merged where they overlap.
fn pages(ctx: &cu::Context, ranges: &[(DevicePtr, u64)]) -> Result<Vec<(u64, u64)>, CuError> {
    let granularity = ctx.vmm_granularity(false).map_err(cu_err)?.max(1);
    if !granularity.is_power_of_two() {
        return Err(CuError::new(
            codes::UNKNOWN,
            format!("granularity {granularity}"),
        ));
    }
    let covered = ranges
        .iter()
        .map(|&(ptr, bytes)| {
            let end = ptr
                .checked_add(bytes.max(1))
                .and_then(|end| up(end, granularity))
                .ok_or_else(|| {
                    CuError::new(codes::INVALID_VALUE, "an allocation past the address space")
                })?;
            Ok((down(ptr, granularity), end))
        })
        .collect::<Result<Vec<_>, CuError>>()?;
    Ok(merged(covered, false))
}

impl Placed {
    /// Whether `ptr` is a placed allocation's start.
    pub fn holds(&self, ptr: DevicePtr) -> bool {
        self.allocations.contains_key(&ptr)
    }

    /// Places every allocation `(ptr, bytes)` at its address, zero-filled;
    /// on failure nothing of this call stays.
    pub fn place(
        &mut self,
        ctx: &cu::Context,
        allocations: &[(DevicePtr, u64)],
    ) -> Result<(), CuError> {
        if let Some(&(ptr, _)) = allocations
            .iter()
            .find(|(ptr, _)| self.allocations.contains_key(ptr))
        {
            return Err(CuError::new(
                codes::INVALID_VALUE,
                format!("{ptr:#x} is placed already"),
            ));
        }
        let chunks = pages(ctx, allocations)?;
        for &(lo, hi) in &chunks {
            let clash = self
                .chunks
                .range(..hi)
                .next_back()
                .is_some_and(|(&s, c)| s + c.size > lo);
            if clash {
                return Err(CuError::new(
                    codes::INVALID_VALUE,
                    format!("[{lo:#x}, {hi:#x}) overlaps memory placed already"),
                ));
            }
        }
        self.give_back_spare(ctx, &chunks);
        let mut made = Placed::default();
        let result = made
            .reserve(ctx, &chunks, &self.windows)
            .and_then(|()| made.map(ctx, &chunks));
        if let Err(e) = result {
            made.release_all(ctx);
            return Err(e);
        }
        for &(ptr, bytes) in allocations {
            if let Some((&start, c)) = made.chunks.range_mut(..=ptr).next_back() {
                c.live += 1;
                self.allocations.insert(ptr, (start, bytes));
            }
        }
        self.windows.append(&mut made.windows);
        self.chunks.append(&mut made.chunks);
        self.unspare(&chunks);
        Ok(())
    }

    /// The spare reservations that `ranges` overlap are spare no more:
    /// memory is placed or a range held in them.
    fn unspare(&mut self, ranges: &[(u64, u64)]) {
        let windows = &self.windows;
        self.spare.retain(|&w| {
            let end = w + windows.get(&w).copied().unwrap_or(0);
            !ranges.iter().any(|&(lo, hi)| lo < end && w < hi)
        });
    }

    /// Keeps what the driver lets it of each `[lo, hi)` span reserved and
    /// unmapped, in windows or else aligned blocks, so that the driver
    /// puts nothing of its own there (a prepared target's modules), and
    /// memory placed later has its addresses free. Best effort: the bytes
    /// kept.
    pub fn keep_free(&mut self, ctx: &cu::Context, spans: &[(u64, u64)]) -> u64 {
        let mut kept = 0;
        for (lo, hi) in merged(spans.to_vec(), true) {
            let Some(end) = up(hi, WINDOW) else {
                continue;
            };
            let mut at = down(lo, WINDOW);
            while at < end {
                kept += self.keep_block(ctx, at, WINDOW);
                at += WINDOW;
            }
        }
        kept
    }

    /// Reserves `[at, at + size)` as spare, else the aligned blocks of the
    /// next size of [`BLOCKS`] in it that it can: the bytes kept.
    fn keep_block(&mut self, ctx: &cu::Context, at: u64, size: u64) -> u64 {
        if !overlaps(&self.windows, at, at + size) && self.try_reserve(ctx, at, at + size).is_ok() {
            self.spare.insert(at);
            return size;
        }
        match BLOCKS.iter().copied().find(|&b| b < size) {
            Some(block) => (0..size / block)
                .map(|i| self.keep_block(ctx, at + i * block, block))
                .sum(),
            None => 0,
        }
    }

    /// Gives back the spare reservations in the windows of each chunk that
    /// no one reservation covers: a range cannot be mapped across two, so
    /// such a chunk is reserved afresh over them.
    fn give_back_spare(&mut self, ctx: &cu::Context, chunks: &[(u64, u64)]) {
        for &(lo, hi) in chunks {
            if covers(&self.windows, lo, hi) {
                continue;
            }
            let (from, to) = (down(lo, WINDOW), up(hi, WINDOW).unwrap_or(u64::MAX));
            let spare: Vec<(u64, u64)> = self
                .windows
                .range(from..to)
                .map(|(&s, &len)| (s, len))
                .filter(|&(s, _)| self.spare.contains(&s))
                .collect();
            for (start, len) in spare {
                self.windows.remove(&start);
                self.spare.remove(&start);
                if let Err(e) = ctx.vmm_address_free(start, len) {
                    tracing::warn!("giving back the spare reservation at {start:#x}: {e}");
                }
            }
        }
    }

    /// Keeps each `(ptr, bytes)` range reserved and unmapped (unless it
    /// lies in memory placed already), for as long as the context lives.
    pub fn hold(&mut self, ctx: &cu::Context, ranges: &[(DevicePtr, u64)]) -> Result<(), CuError> {
        let pages = pages(ctx, ranges)?;
        let mut made = Placed::default();
        if let Err(e) = made.reserve(ctx, &pages, &self.windows) {
            made.release_all(ctx);
            return Err(e);
        }
        self.windows.append(&mut made.windows);
        self.unspare(&pages);
        self.held.extend(pages);
        Ok(())
    }

    /// Reserves addresses covering `chunks`, none overlapping `existing`
    /// reservations (of which chunks inside need none).
    fn reserve(
        &mut self,
        ctx: &cu::Context,
        chunks: &[(u64, u64)],
        existing: &BTreeMap<u64, u64>,
    ) -> Result<(), CuError> {
        let needed: Vec<(u64, u64)> = chunks
            .iter()
            .copied()
            .filter(|&(lo, hi)| !covers(existing, lo, hi))
            .collect();
        let windows = merged(
            needed
                .iter()
                .filter_map(|&(lo, hi)| Some((down(lo, WINDOW), up(hi, WINDOW)?)))
                .collect(),
            true,
        );
        for (lo, hi) in windows {
            let within: Vec<(u64, u64)> = needed
                .iter()
                .copied()
                .filter(|&(l, h)| l >= lo && h <= hi)
                .collect();
            if !overlaps(existing, lo, hi) && self.try_reserve(ctx, lo, hi).is_ok() {
                continue;
            }
            for (l, h) in within {
                if self.reserve_block(ctx, existing, (lo, hi), (l, h)) {
                    continue;
                }
                self.try_reserve(ctx, l, h)
                    .map_err(|why| taken(ctx, l, h, &why))?;
            }
        }
        Ok(())
    }

    /// Where a chunk's window cannot be had whole: the driver passes over
    /// the hints of small ranges, so the aligned block of [`BLOCKS`] around
    /// the chunk, inside `window` and clear of every reservation made, is
    /// asked for first. Whether the chunk is reserved now.
    fn reserve_block(
        &mut self,
        ctx: &cu::Context,
        existing: &BTreeMap<u64, u64>,
        window: (u64, u64),
        (l, h): (u64, u64),
    ) -> bool {
        if covers(&self.windows, l, h) {
            return true;
        }
        for block in BLOCKS {
            let Some(b) = up(h, block) else {
                continue;
            };
            let a = down(l, block);
            let fits = a >= window.0 && b <= window.1;
            let clear = !overlaps(existing, a, b) && !overlaps(&self.windows, a, b);
            if fits && clear && self.try_reserve(ctx, a, b).is_ok() {
                return true;
            }
        }
        false
    }

    /// Reserves `[lo, hi)` where asked, else says why not (the driver's
    /// error, or where it offered the range instead: given back).
    fn try_reserve(&mut self, ctx: &cu::Context, lo: u64, hi: u64) -> Result<(), String> {
        let got = ctx.vmm_reserve_at(hi - lo, lo).map_err(|e| e.to_string())?;
        if got == lo {
            self.windows.insert(lo, hi - lo);
            return Ok(());
        }
        if let Err(e) = ctx.vmm_address_free(got, hi - lo) {
            tracing::warn!("giving back a reservation at {got:#x}: {e}");
        }
        Err(format!("its driver offered {got:#x}"))
    }

    /// Physical memory for each chunk, mapped, readable and writable, zeroed.
    fn map(&mut self, ctx: &cu::Context, chunks: &[(u64, u64)]) -> Result<(), CuError> {
        for &(lo, hi) in chunks {
            let size = hi - lo;
            // Shareable, so that a move can copy into it device to device
            // from the source's process ([`Placed::export`]); where the
            // driver refuses that, the move's bytes come through the server.
            let physical = match ctx.vmm_create(size, true, false) {
                Ok(physical) => physical,
                Err(_) => ctx.vmm_create(size, false, false).map_err(cu_err)?,
            };
            if let Err(e) = ctx.vmm_map(lo, size, physical) {
                let _ = ctx.vmm_release(physical);
                return Err(cu_err(e));
            }
            self.chunks.insert(
                lo,
                Chunk {
                    size,
                    physical,
                    live: 0,
                },
            );
            ctx.vmm_set_access(lo, size, READ_WRITE).map_err(cu_err)?;
            ctx.memset(lo, cu::MemsetValue::D8(0), size)
                .map_err(cu_err)?;
        }
        Ok(())
    }

    /// The chunk that holds placed allocation `ptr`: its start, its size,
    /// and its physical memory as a descriptor another process imports.
    pub fn export(
        &self,
        ctx: &cu::Context,
        ptr: DevicePtr,
    ) -> Result<(u64, u64, std::os::fd::OwnedFd), CuError> {
        let (start, _) = self.allocations.get(&ptr).ok_or_else(|| {
            CuError::new(
                codes::INVALID_VALUE,
                format!("{ptr:#x} is no placed allocation"),
            )
        })?;
        let chunk = self.chunks.get(start).ok_or_else(|| {
            CuError::new(codes::UNKNOWN, format!("no placed chunk at {start:#x}"))
        })?;
        let fd = ctx.vmm_export(chunk.physical).map_err(cu_err)?;
        Ok((*start, chunk.size, fd))
    }

    /// Frees the placed allocation at `ptr`: its size, or `None` if `ptr`
    /// is no placed allocation (the driver's own, then).
    pub fn free(&mut self, ctx: &cu::Context, ptr: DevicePtr) -> Option<u64> {
        let (chunk, bytes) = self.allocations.remove(&ptr)?;
        let last = match self.chunks.get_mut(&chunk) {
            Some(c) => {
                c.live = c.live.saturating_sub(1);
                c.live == 0
            }
            None => false,
        };
        if last {
            if let Some(c) = self.chunks.remove(&chunk) {
                self.unmap(ctx, chunk, &c);
            }
            let window = self
                .windows
                .range(..=chunk)
                .next_back()
                .map(|(&s, &len)| (s, len));
            if let Some((start, len)) = window {
                let held = self
                    .held
                    .iter()
                    .any(|&(lo, _)| lo >= start && lo < start + len);
                if !held && self.chunks.range(start..start + len).next().is_none() {
                    self.windows.remove(&start);
                    self.spare.remove(&start);
                    if let Err(e) = ctx.vmm_address_free(start, len) {
                        tracing::warn!("giving back the reservation at {start:#x}: {e}");
                    }
                }
            }
        }
        Some(bytes)
    }

    fn unmap(&self, ctx: &cu::Context, start: u64, c: &Chunk) {
        if let Err(e) = ctx.vmm_unmap(start, c.size) {
            tracing::warn!("unmapping placed memory at {start:#x}: {e}");
        }
        if let Err(e) = ctx.vmm_release(c.physical) {
            tracing::warn!("releasing placed memory at {start:#x}: {e}");
        }
    }

    /// Unmaps and frees everything (the context is going).
    pub fn release_all(&mut self, ctx: &cu::Context) {
        for (start, c) in std::mem::take(&mut self.chunks) {
            self.unmap(ctx, start, &c);
        }
        for (start, len) in std::mem::take(&mut self.windows) {
            if let Err(e) = ctx.vmm_address_free(start, len) {
                tracing::warn!("giving back the reservation at {start:#x}: {e}");
            }
        }
        self.allocations.clear();
        self.held.clear();
        self.spare.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_where_they_overlap() {
        assert_eq!(
            merged(vec![(4, 6), (0, 2), (1, 3)], false),
            vec![(0, 3), (4, 6)]
        );
        assert_eq!(merged(vec![(0, 2), (2, 4)], false), vec![(0, 2), (2, 4)]);
        assert_eq!(merged(vec![(0, 2), (2, 4)], true), vec![(0, 4)]);
    }

    #[test]
    fn rounding_keeps_to_the_granularity() {
        assert_eq!(down(0x7f05_b7e0_0200, 2 << 20), 0x7f05_b7e0_0000);
        assert_eq!(up(0x7f05_b7e0_0200, 2 << 20), Some(0x7f05_b800_0000));
        assert_eq!(up(u64::MAX - 3, 2 << 20), None);
    }
}
