//! Device memory (allocation, freeing, address queries), pinned host memory
//! (client-side, tracked so pointer queries can answer "host") and the
//! stream-ordered allocator. Copies and memsets are in `copy`.

use std::ffi::c_void;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::{Call, ReplyBody};

use super::copy::ready;
use super::*;
use crate::graph::GraphOp;
use crate::state::handles;
use crate::state::{client, Client, HostRegion, State, StateGuard};

const PITCH_ALIGN: usize = 512;

/// Allocates device memory on the current context's device; `st` from
/// `copy::ready` (the state lock is let go for the round trip).
pub(super) fn alloc(c: &Client, st: StateGuard<'_>, bytes: usize) -> CuResult<u64> {
    let device = st.context_device()?;
    drop(st);
    alloc_on(c, device, bytes)
}

/// Allocates `bytes` of device memory on `device`.
pub(super) fn alloc_on(c: &Client, device: u32, bytes: usize) -> CuResult<u64> {
    if bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Devices of two servers may hand out the same addresses: an allocation
    // that overlaps another device's is held while another is asked for.
    let mut clashing = Vec::new();
    let placed = loop {
        let call = Call::MemAlloc {
            device,
            bytes: bytes as u64,
        };
        let p = match c.call_on(device, call) {
            Ok(ReplyBody::Ptr(p)) => p,
            Ok(_) => break Err(CUDA_ERROR_UNKNOWN),
            Err(e) => break Err(e),
        };
        match c.placements().place(p, bytes as u64, device) {
            Ok(()) => break Ok(p),
            Err(other) if clashing.len() < CLASH_RETRIES => {
                tracing::warn!(
                    "device {device} gave {p:#x}, where device {other} (another server's) has \
                     memory; asking again"
                );
                clashing.push(p);
            }
            Err(other) => {
                tracing::error!(
                    "device {device}'s allocations keep overlapping device {other}'s: their \
                     servers hand out the same addresses (CPU devices: give each server its own \
                     --cpu-window); refusing the allocation"
                );
                clashing.push(p);
                break Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
        }
    };
    for p in clashing {
        let _ = c.call_on(device, Call::MemFree { ptr: p });
    }
    let p = placed?;
    c.lock().allocations.insert(p, bytes as u64);
    Ok(p)
}

/// Allocations of a device that overlap another device's, held while
/// another is asked for, before an allocation is refused.
const CLASH_RETRIES: usize = 4;

/// Frees device memory (managed memory's host pages too).
pub(super) fn free(c: &Client, ptr: u64) -> CuResult<()> {
    if super::pool_ipc::free(c, ptr) {
        c.lock().pools.gave_back(ptr);
        return Ok(());
    }
    let managed = {
        let mut st = c.lock();
        st.context_device()?;
        if ptr == 0 {
            return Ok(());
        }
        if let Some(memory) = st.managed_reached.remove(&ptr) {
            st.allocations.remove(&ptr);
            drop(st);
            crate::managed_guard::unregister(ptr);
            crate::pinned::free(c, memory);
            c.placements().remove(ptr);
            return Ok(());
        }
        st.pools.gave_back(ptr);
        st.managed.remove(&ptr)
    };
    if let Some(m) = managed {
        crate::managed_guard::unregister(ptr);
        crate::managed::unmap(ptr, m);
    }
    c.call(Call::MemFree { ptr })?;
    c.placements().remove(ptr);
    c.lock().allocations.remove(&ptr);
    Ok(())
}

fn host_alloc(c: &Client, bytes: usize, flags: u32) -> CuResult<*mut c_void> {
    c.lock().context_device()?;
    let (p, pinned) = match crate::pinned::alloc(c, bytes) {
        Some(pinned) => (pinned.ptr(), Some(pinned)),
        None => {
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: posix_memalign writes an owned allocation into `p` on success.
            let rc = unsafe { libc::posix_memalign(&mut p, 4096, bytes.max(1)) };
            if rc != 0 || p.is_null() {
                return Err(CUDA_ERROR_OUT_OF_MEMORY);
            }
            (p, None)
        }
    };
    let region = HostRegion {
        size: bytes,
        flags,
        owned: true,
        pinned,
    };
    c.lock().host.insert(p as usize, region);
    Ok(p)
}

/// Pool handles: one default pool per device; created pools share its memory.
/// What the client knows of a pointer, for `cuPointerGetAttribute(s)`.
struct PointerFacts {
    ptr: u64,
    /// (base, size) of the allocation or host region it lies in.
    range: (u64, u64),
    device: bool,
    managed: bool,
    ordinal: u32,
    context: usize,
}

/// `None` for memory the client does not know.
fn pointer_facts(c: &Client, st: &mut State, ptr: u64) -> Option<PointerFacts> {
    let device = st.allocation_of(ptr);
    let host = st
        .host_region_of(ptr as usize)
        .map(|(b, r)| (b as u64, r.size as u64));
    let range = device.or(host)?;
    // Device memory is its device's; host memory the current context's.
    let ordinal = c
        .placements()
        .device_of(ptr)
        .unwrap_or_else(|| st.current_device());
    let context = st.primary_context(ordinal, || c.mint());
    let managed = device.is_some() && st.is_managed(range.0);
    Some(PointerFacts {
        ptr,
        range,
        device: device.is_some(),
        managed,
        ordinal,
        context,
    })
}

fn pointer_attribute(
    facts: Option<&PointerFacts>,
    attr: CUpointer_attribute,
    data: *mut c_void,
) -> CuResult<()> {
    let Some(f) = facts else {
        if attr == CU_POINTER_ATTRIBUTE_MAPPED || attr == CU_POINTER_ATTRIBUTE_IS_MANAGED {
            // A plain "no" for unknown memory.
            return out(data.cast::<u32>(), 0);
        }
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let (base, size) = f.range;
    match attr {
        CU_POINTER_ATTRIBUTE_CONTEXT => out(data.cast::<*mut c_void>(), to_ptr(f.context)),
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
            let kind = if f.device {
                CU_MEMORYTYPE_DEVICE
            } else {
                CU_MEMORYTYPE_HOST
            };
            out(data.cast::<u32>(), kind)
        }
        CU_POINTER_ATTRIBUTE_DEVICE_POINTER => out(data.cast::<u64>(), f.ptr),
        CU_POINTER_ATTRIBUTE_HOST_POINTER => {
            let host = if f.device && !f.managed { 0 } else { f.ptr };
            out(data.cast::<u64>(), host)
        }
        CU_POINTER_ATTRIBUTE_SYNC_MEMOPS => out(data.cast::<u32>(), 1),
        CU_POINTER_ATTRIBUTE_BUFFER_ID | CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => {
            out(data.cast::<u64>(), base)
        }
        CU_POINTER_ATTRIBUTE_IS_MANAGED => out(data.cast::<u32>(), f.managed as u32),
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => out(data.cast::<i32>(), f.ordinal as i32),
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
        | CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE
        | CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE => out(data.cast::<u32>(), 0),
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR | CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR => {
            out(data.cast::<u64>(), base)
        }
        CU_POINTER_ATTRIBUTE_RANGE_SIZE | CU_POINTER_ATTRIBUTE_MAPPING_SIZE => {
            out(data.cast::<usize>(), size as usize)
        }
        CU_POINTER_ATTRIBUTE_MAPPED => out(data.cast::<u32>(), 1),
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES => out(data.cast::<u64>(), 0),
        CU_POINTER_ATTRIBUTE_ACCESS_FLAGS => out(
            data.cast::<u32>(),
            CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE,
        ),
        CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE => {
            out(data.cast::<*mut c_void>(), std::ptr::null_mut())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Allocates in stream order: on a stream known and past its host functions.
/// The program frees device memory: a graph's memory that a graph still
/// holds is kept until the last holder goes; any other is freed now.
fn program_free(c: &Client, ptr: u64) -> CuResult<()> {
    if super::graph_allocs::program_frees(&mut c.lock(), ptr) {
        return Ok(());
    }
    free(c, ptr)
}

driver_fn! {
    fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) {
        let c = client()?;
        out(dptr, alloc(c, c.lock(), bytes)?)
    }

    fn cuMemAllocManaged(dptr: *mut u64, bytes: usize, flags: u32) {
        if flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = client()?;
        if bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = c.lock().context_device()?;
        let attach = crate::managed_guard::Attach::of(flags, cumux_protocol::DEFAULT_STREAM);
        out(dptr, crate::managed::alloc(c, device, bytes, attach)?)
    }

    fn cuMemAllocPitch_v2(dptr: *mut u64, pitch: *mut usize, width: usize, height: usize, elem: u32) {
        if !matches!(elem, 4 | 8 | 16) || width == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = client()?;
        let p = width.next_multiple_of(PITCH_ALIGN);
        out(dptr, alloc(c, c.lock(), p * height)?)?;
        out(pitch, p)
    }

    fn cuMemFree_v2(ptr: u64) {
        program_free(client()?, ptr)
    }

    fn cuMemGetInfo_v2(free_bytes: *mut usize, total: *mut usize) {
        let c = client()?;
        let device = c.lock().context_device()?;
        match c.call(Call::MemGetInfo { device })? {
            ReplyBody::MemInfo { free, total: t } => {
                out_opt(free_bytes, free as usize);
                out_opt(total, t as usize);
                Ok(())
            }
            _ => Err(CUDA_ERROR_UNKNOWN),
        }
    }

    fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, ptr: u64) {
        let c = client()?;
        let (b, s) = c.lock().allocation_of(ptr).ok_or(CUDA_ERROR_NOT_FOUND)?;
        out_opt(base, b);
        out_opt(size, s as usize);
        Ok(())
    }

    fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: u32) {
        let c = client()?;
        out(pp, host_alloc(c, bytes, flags)?)
    }

    fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) {
        let c = client()?;
        out(pp, host_alloc(c, bytes, 0)?)
    }

    fn cuMemFreeHost(p: *mut c_void) {
        let c = client()?;
        let region = c.lock().host.remove(&(p as usize)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if let Some(pinned) = region.pinned {
            crate::pinned::free(c, pinned);
        } else if region.owned {
            // SAFETY: `p` came from posix_memalign in host_alloc and is freed once.
            unsafe { libc::free(p) };
        }
        Ok(())
    }

    fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, flags: u32) {
        let c = client()?;
        let mut st = c.lock();
        st.context_device()?;
        if p.is_null() || bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if st.host_region_of(p as usize).is_some() {
            return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
        st.host.insert(p as usize, HostRegion { size: bytes, flags, owned: false, pinned: None });
        Ok(())
    }

    fn cuMemHostUnregister(p: *mut c_void) {
        let c = client()?;
        let mut st = c.lock();
        match st.host.get(&(p as usize)) {
            Some(r) if !r.owned => {
                st.host.remove(&(p as usize));
                Ok(())
            }
            // Memory from cuMemHostAlloc is not "registered" memory.
            Some(_) => Err(CUDA_ERROR_INVALID_VALUE),
            None => Err(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
        }
    }

    fn cuMemHostGetDevicePointer_v2(dptr: *mut u64, p: *mut c_void, flags: u32) {
        let c = client()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        c.lock().host_region_of(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        out(dptr, p as u64)
    }

    fn cuMemHostGetFlags(flags: *mut u32, p: *mut c_void) {
        let c = client()?;
        let region_flags = c.lock().host_region_of(p as usize).map(|(_, r)| r.flags);
        out(flags, region_flags.ok_or(CUDA_ERROR_INVALID_VALUE)?)
    }

    fn cuPointerGetAttribute(data: *mut c_void, attr: CUpointer_attribute, ptr: u64) {
        let c = client()?;
        let facts = pointer_facts(c, &mut c.lock(), ptr);
        pointer_attribute(facts.as_ref(), attr, data)
    }

    fn cuPointerGetAttributes(n: u32, attrs: *mut CUpointer_attribute, data: *mut *mut c_void, ptr: u64) {
        let c = client()?;
        let attrs = host_bytes(attrs.cast(), n as usize * 4)?;
        let slots = host_bytes_mut(data.cast(), n as usize * 8)?;
        let facts = pointer_facts(c, &mut c.lock(), ptr);
        for i in 0..n as usize {
            let attr = u32::from_ne_bytes(attrs[i * 4..i * 4 + 4].try_into().unwrap_or_default());
            let slot = usize::from_ne_bytes(slots[i * 8..i * 8 + 8].try_into().unwrap_or_default());
            if slot == 0 {
                continue;
            }
            tracing::trace!("cuPointerGetAttributes({ptr:#x}): attribute {attr}");
            match pointer_attribute(facts.as_ref(), attr, slot as *mut c_void) {
                Ok(()) => {}
                // Unknown memory: cuPointerGetAttributes answers "unregistered".
                Err(CUDA_ERROR_INVALID_VALUE) if attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
                    out(slot as *mut u32, 0)?
                }
                Err(CUDA_ERROR_INVALID_VALUE) => {
                    let _ = out(slot as *mut u64, 0);
                    if attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL {
                        out(slot as *mut i32, -2)?;
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn cuMemFreeAsync | cuMemFreeAsync_ptsz (ptr: u64, stream: *mut c_void) {
        let c = client()?;
        let stream = handles::stream(stream)?;
        let mut st = ready(c, Some(stream))?;
        // Captured: the graph gets a free node.
        if st.capture(stream, GraphOp::MemFree { ptr }).is_none() {
            return Ok(());
        }
        drop(st);
        // Work queued before the free may still use the memory.
        c.call(Call::StreamSynchronize { stream })?;
        program_free(c, ptr)
    }

}
