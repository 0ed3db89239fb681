//! Managed memory (`cuMemAllocManaged`) for a device in another process. An
//! allocation has one address for host and device: the server's device
//! address, where the client maps host memory into its reserved window. The
//! two copies are kept coherent at the points where CUDA without concurrent
//! managed access makes them so: before device work the host copy is pushed
//! (if the host may have written it), after synchronisation the device copy
//! is pulled (if the device may have written it). Which ones, the state says
//! under its lock (`State::managed_to_push`, `State::managed_to_pull`); the
//! bytes move here, after it is let go. A host access while device work is
//! out waits here for the device (`settle`, called by `managed_guard`).

use std::time::{Duration, Instant};

use cumux_protocol::framing::MAX_CHUNK_BYTES;
use cumux_protocol::{Call, Handle, ReplyBody, DEFAULT_STREAM};

use crate::errors::*;
use crate::managed_guard::{self, Attach};
use crate::state::{device_window_reserved, is_device_ptr, Client, Managed};

fn page_range(ptr: u64, size: u64) -> (u64, usize) {
    let (start, end) = managed_guard::pages(ptr, size);
    (start, (end - start) as usize)
}

/// Allocates `bytes` on `device` and maps host memory at the same address;
/// device work uses it as `attach` says.
pub fn alloc(c: &Client, device: u32, bytes: usize, attach: Attach) -> CuResult<u64> {
    let ptr = match c.call_on(
        device,
        Call::MemAlloc {
            device,
            bytes: bytes as u64,
        },
    )? {
        ReplyBody::Ptr(p) => p,
        _ => return Err(CUDA_ERROR_UNKNOWN),
    };
    if !is_device_ptr(ptr) {
        // A GPU: its addresses are its driver's, not in this process's window.
        let _ = c.call_on(device, Call::MemFree { ptr });
        return reached(c, device, bytes, attach);
    }
    if !device_window_reserved() {
        let _ = c.call_on(device, Call::MemFree { ptr });
        tracing::warn!("managed memory needs the device address window reserved in this process");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    if let Err(e) = c.place(ptr, bytes as u64, device) {
        let _ = c.call_on(device, Call::MemFree { ptr });
        return Err(e);
    }
    let (start, len) = page_range(ptr, bytes as u64);
    // SAFETY: the range lies inside the device window this process reserved
    // (PROT_NONE); MAP_FIXED replaces that reservation with readable,
    // writable, zeroed memory.
    let p = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let _ = c.call_on(device, Call::MemFree { ptr });
        c.placements().remove(ptr);
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let mut s = c.lock();
    s.allocations.insert(ptr, bytes as u64);
    let managed = Managed {
        size: bytes as u64,
        host_newer: true,
    };
    s.managed.insert(ptr, managed);
    drop(s);
    managed_guard::register(ptr, bytes as u64, attach, settle);
    Ok(ptr)
}

/// Managed memory on a GPU: shared host memory that the worker maps at the
/// same address and the device reaches there over the bus, so host and
/// device see one copy at every moment (as with concurrent managed access),
/// at the link's speed for kernels. Refused where the device cannot reach it
/// at that address.
fn reached(c: &Client, device: u32, bytes: usize, attach: Attach) -> CuResult<u64> {
    let memory = crate::pinned::alloc_reached(c, bytes).map_err(|why| {
        tracing::warn!("cuMemAllocManaged of {bytes} bytes: {why}");
        CUDA_ERROR_NOT_SUPPORTED
    })?;
    let ptr = memory.ptr() as u64;
    if let Err(e) = c.place(ptr, bytes as u64, device) {
        crate::pinned::free(c, memory);
        return Err(e);
    }
    let mut s = c.lock();
    s.allocations.insert(ptr, bytes as u64);
    s.managed_reached.insert(ptr, memory);
    drop(s);
    managed_guard::register(ptr, bytes as u64, attach, settle);
    Ok(ptr)
}

/// Gives a managed allocation's pages (`State::managed` gave it up) back to
/// the reservation. The caller frees the device side.
pub fn unmap(ptr: u64, m: Managed) {
    let (start, len) = page_range(ptr, m.size);
    // SAFETY: the pages were mapped by `alloc` inside our own reservation;
    // mapping PROT_NONE over them restores the reservation.
    unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        );
    }
}

fn host_bytes(ptr: u64, size: u64) -> &'static mut [u8] {
    // SAFETY: [ptr, ptr + size) is mapped read-write by `alloc` until
    // `unmap`; the program's own accesses race only where CUDA says they may.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, size as usize) }
}

/// Before device work: sends the host copies `State::managed_to_push` named,
/// taken now. In `stream`'s order, before the work queued next, as the
/// driver migrates managed memory for a launch: a copy on the legacy stream
/// would wait for every blocking stream's work, which may itself wait for
/// the host (a kernel spinning on a pinned latch the host sets later).
/// `None`: synchronous, on the legacy stream (before a copy or memset).
pub fn push(c: &Client, allocations: Vec<(u64, u64)>, stream: Option<Handle>) -> CuResult<()> {
    for (ptr, size) in allocations {
        for (i, chunk) in host_bytes(ptr, size).chunks(MAX_CHUNK_BYTES).enumerate() {
            c.call(Call::MemcpyHtoD {
                dst: ptr + (i * MAX_CHUNK_BYTES) as u64,
                data: chunk.to_vec(),
                stream,
            })?;
        }
    }
    Ok(())
}

/// After synchronisation: fetches the device copies `State::managed_to_pull`
/// named.
pub fn pull(c: &Client, allocations: Vec<(u64, u64)>) -> CuResult<()> {
    for (ptr, size) in allocations {
        let host = host_bytes(ptr, size);
        for (i, chunk) in host.chunks_mut(MAX_CHUNK_BYTES).enumerate() {
            let src = ptr + (i * MAX_CHUNK_BYTES) as u64;
            match c.call(Call::MemcpyDtoH {
                src,
                bytes: chunk.len() as u64,
                stream: None,
            })? {
                ReplyBody::Data(d) if d.len() == chunk.len() => chunk.copy_from_slice(&d),
                _ => return Err(CUDA_ERROR_UNKNOWN),
            }
        }
    }
    Ok(())
}

/// The longest a host access waits for the device before it goes ahead.
const WAIT_LIMIT: Duration = Duration::from_secs(5);

/// A host access to a closed allocation: waits until the device has no work
/// left (at most [`WAIT_LIMIT`]), opens every allocation and brings the host
/// copies up to date.
pub fn settle(addr: u64) {
    let Ok(c) = crate::state::client() else {
        managed_guard::open_all();
        return;
    };
    let idle = wait_idle(c, Instant::now() + WAIT_LIMIT);
    managed_guard::open_all();
    match idle {
        Ok(true) => {
            let stale = c.lock().managed_to_pull();
            if let Err(e) = pull(c, stale) {
                tracing::warn!("managed memory: the device copy was not fetched: {}", name(e));
            }
        }
        Ok(false) => tracing::warn!(
            "a host access to managed memory at {addr:#x} waited {} s for the device's work and \
             went ahead while it runs: this device has no concurrent managed access",
            WAIT_LIMIT.as_secs()
        ),
        Err(e) => tracing::warn!(
            "a host access to managed memory at {addr:#x} went ahead: waiting for the device failed ({})",
            name(e)
        ),
    }
}

/// Polls every stream of every device in use until none has work (true), or
/// until `deadline` (false).
fn wait_idle(c: &Client, deadline: Instant) -> CuResult<bool> {
    for (device, link) in c.opened_links() {
        if link.all_idle() {
            continue;
        }
        let mut streams = c.lock().streams_on(device);
        streams.push(DEFAULT_STREAM);
        for stream in streams {
            let mut pause = Duration::from_micros(20);
            while !link.stream_idle(stream) {
                match c.call_on(device, Call::StreamQuery { stream }) {
                    Ok(_) => break,
                    Err(CUDA_ERROR_NOT_READY) if Instant::now() < deadline => {
                        std::thread::sleep(pause);
                        pause = (pause * 2).min(Duration::from_millis(1));
                    }
                    Err(CUDA_ERROR_NOT_READY) => return Ok(false),
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(true)
}
