//! Zero-copy pinned host memory: `cuMemHostAlloc` buffers are sealed memfds
//! mapped `MAP_SHARED` and registered with the server, so copies name them
//! (`State::pinned_span`).
//!
//! The server (and the worker behind it) map the same pages: a copy between
//! device memory and such a buffer travels as (region, offset, length), and a
//! device-to-host copy lands in the program's buffer directly. A worker that
//! can map the pages at the program's own address too lets kernels, memsets
//! and copies reach the buffer by the program's pointer, as unified
//! addressing does natively (`cumux_protocol::pinned::FixedMapping`). Where the
//! memfd cannot be made or the server refuses it (a TCP link, the socket
//! transport, an old server), the buffer is plain memory and copies carry
//! their bytes, as before. `CUMUX_PINNED=off` keeps every buffer plain.

use std::os::fd::AsFd;

use cumux_protocol::pinned::{create_memfd, HostMapping};
use cumux_protocol::{Call, ReplyBody};

use crate::errors::CUDA_ERROR_NOT_SUPPORTED;
use crate::state::{Client, PinnedMemory};

/// Set to `off` to keep pinned buffers plain and large pageable copies
/// unstaged ([`crate::staging`]): every copy carries its bytes (for comparisons).
pub const PINNED_ENV: &str = "CUMUX_PINNED";

const PAGE: usize = 4096;

/// Whether copies may name shared buffers at all (`CUMUX_PINNED` is not `off`).
pub fn enabled() -> bool {
    std::env::var(PINNED_ENV).map_or(true, |v| !matches!(v.trim(), "off" | "0"))
}

/// Every buffer, however small, is shared: the device reaches it at the
/// program's address where the server can map it there (XLA's kernels write
/// 8-byte results into pinned buffers), which plain memory never is.
fn wanted(bytes: usize) -> bool {
    bytes > 0 && enabled()
}

/// A buffer of `bytes` the server registered, or `None` (why, at debug
/// level) when this buffer should be plain memory.
pub fn alloc(c: &Client, bytes: usize) -> Option<PinnedMemory> {
    if !wanted(bytes) {
        return None;
    }
    register(c, crate::state::current_device(), bytes, false)
        .map_err(|e| tracing::debug!("pinned memory stays plain: {e}"))
        .ok()
}

/// A buffer of `bytes` registered with `device`'s session (for cumux's own
/// use: `crate::marks`), or `None` (why, at debug level).
pub fn alloc_on(c: &Client, device: u32, bytes: usize) -> Option<PinnedMemory> {
    if !wanted(bytes) {
        return None;
    }
    register(c, device, bytes, false)
        .map_err(|e| tracing::debug!("no pinned buffer on device {device}: {e}"))
        .ok()
}

/// A buffer of `bytes` that the current device reaches by the program's
/// own address (managed memory on a GPU), or why there is none.
pub fn alloc_reached(c: &Client, bytes: usize) -> Result<PinnedMemory, String> {
    register(c, crate::state::current_device(), bytes, true)
}

/// Times a region the device must reach at the program's address is mapped
/// at another address after the worker found its address taken.
const REACH_TRIES: usize = 8;

fn register(c: &Client, device: u32, bytes: usize, reached: bool) -> Result<PinnedMemory, String> {
    let len = bytes
        .checked_next_multiple_of(PAGE)
        .ok_or("too large a buffer")? as u64;
    let fd = create_memfd(len).map_err(|e| format!("no memfd ({e})"))?;
    let mut mapping = HostMapping::map(fd.as_fd(), len).map_err(|e| format!("no mapping ({e})"))?;
    // `device`'s session takes it; the program's sessions on its other
    // devices may name it too (the server shares it among them).
    let mut tries = 0;
    loop {
        let call = Call::HostRegister {
            base: mapping.as_ptr() as u64,
            bytes: len,
            reached,
        };
        match c.call_with_fd_on(device, call, fd.as_fd()) {
            Ok(ReplyBody::Handle(region)) => {
                return Ok(PinnedMemory {
                    region,
                    device,
                    mapping,
                })
            }
            Ok(other) => return Err(format!("the server answered {other:?}")),
            // The worker has something at that address: the same pages at
            // another (chosen at random, where neither process is likely to
            // have anything), as often as that is free here.
            Err(CUDA_ERROR_NOT_SUPPORTED) if reached && tries < REACH_TRIES => {
                tries += 1;
                if let Some(elsewhere) = (0..16)
                    .find_map(|_| HostMapping::map_at(fd.as_fd(), len, random_address(len)).ok())
                {
                    mapping = elsewhere;
                }
            }
            Err(e) => return Err(format!("the server did not take it ({e})")),
        }
    }
}

/// A page-aligned address between 16 and 64 TiB with room for `len` bytes.
fn random_address(len: u64) -> u64 {
    let mut bits = [0u8; 8];
    // SAFETY: getrandom writes at most `bits.len()` bytes into the buffer.
    unsafe { libc::getrandom(bits.as_mut_ptr().cast(), bits.len(), 0) };
    let (low, high) = (1u64 << 44, 1u64 << 46);
    let span = (high - low).saturating_sub(len) / PAGE as u64;
    low + u64::from_ne_bytes(bits) % span.max(1) * PAGE as u64
}

/// Unregisters a buffer (the server waits for work that may use it) and
/// unmaps it.
pub fn free(c: &Client, memory: PinnedMemory) {
    let call = Call::HostUnregister {
        region: memory.region,
    };
    if let Err(e) = c.call_on(memory.device, call) {
        tracing::debug!(region = memory.region, "unregistering pinned memory: {e}");
    }
    drop(memory);
}
