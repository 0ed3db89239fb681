//! Managed memory (`cuMemAllocManaged`) for a device in another process. An
//! allocation has one address for host and device: the server's device
//! address, where the client maps host memory into its reserved window. The
//! two copies are kept coherent at the points where CUDA without concurrent
//! managed access makes them so: before device work the host copy is pushed
//! (if the host may have written it), after synchronisation the device copy
//! is pulled (if the device may have written it).

use cumux_protocol::{Call, ReplyBody};

use crate::errors::*;
use crate::state::{is_device_ptr, Client};

const PAGE: u64 = 4096;

pub struct Managed {
    pub size: u64,
    /// The host copy is the newer one (pushed before the next device work).
    pub host_newer: bool,
}

fn page_range(ptr: u64, size: u64) -> (u64, usize) {
    let start = ptr / PAGE * PAGE;
    let end = (ptr + size.max(1)).div_ceil(PAGE) * PAGE;
    (start, (end - start) as usize)
}

/// Allocates on the server and maps host memory at the same address.
pub fn alloc(c: &Client, bytes: usize) -> CuResult<u64> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let device = c.context_device()?;
    let ptr = match c.call(Call::MemAlloc {
        device,
        bytes: bytes as u64,
    })? {
        ReplyBody::Ptr(p) => p,
        _ => return Err(CUDA_ERROR_UNKNOWN),
    };
    if !is_device_ptr(ptr) || !crate::state::device_window_reserved() {
        let _ = c.call(Call::MemFree { ptr });
        tracing::warn!("managed memory needs the device address window reserved in this process");
        return Err(CUDA_ERROR_NOT_SUPPORTED);
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
        let _ = c.call(Call::MemFree { ptr });
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let mut t = c.tables();
    t.allocations.insert(ptr, bytes as u64);
    t.managed.insert(
        ptr,
        Managed {
            size: bytes as u64,
            host_newer: true,
        },
    );
    Ok(ptr)
}

/// Gives a managed allocation's pages back to the reservation. The caller
/// frees the device side.
pub fn forget(c: &Client, ptr: u64) -> bool {
    let Some(m) = c.tables().managed.remove(&ptr) else {
        return false;
    };
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
    true
}

fn host_bytes(ptr: u64, size: u64) -> &'static mut [u8] {
    // SAFETY: [ptr, ptr + size) is mapped read-write by `alloc` until
    // `forget`; the program's own accesses race only where CUDA says they may.
    unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, size as usize) }
}

/// Before device work: pushes host copies the host may have written.
pub fn to_device(c: &Client) -> CuResult<()> {
    let dirty: Vec<(u64, u64)> = {
        let mut t = c.tables();
        if t.managed.is_empty() {
            return Ok(());
        }
        t.managed
            .iter_mut()
            .filter(|(_, m)| m.host_newer)
            .map(|(p, m)| {
                m.host_newer = false;
                (*p, m.size)
            })
            .collect()
    };
    for (ptr, size) in dirty {
        for (i, chunk) in host_bytes(ptr, size)
            .chunks(cumux_protocol::framing::MAX_CHUNK_BYTES)
            .enumerate()
        {
            c.call(Call::MemcpyHtoD {
                dst: ptr + (i * cumux_protocol::framing::MAX_CHUNK_BYTES) as u64,
                data: chunk.to_vec(),
                stream: None,
            })?;
        }
    }
    Ok(())
}

/// After synchronisation: pulls device copies the device may have written.
pub fn to_host(c: &Client) -> CuResult<()> {
    let stale: Vec<(u64, u64)> = {
        let mut t = c.tables();
        if t.managed.is_empty() {
            return Ok(());
        }
        t.managed
            .iter_mut()
            .filter(|(_, m)| !m.host_newer)
            .map(|(p, m)| {
                m.host_newer = true;
                (*p, m.size)
            })
            .collect()
    };
    for (ptr, size) in stale {
        let host = host_bytes(ptr, size);
        for (i, chunk) in host
            .chunks_mut(cumux_protocol::framing::MAX_CHUNK_BYTES)
            .enumerate()
        {
            let src = ptr + (i * cumux_protocol::framing::MAX_CHUNK_BYTES) as u64;
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
