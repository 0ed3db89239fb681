//! Hints about managed memory: prefetches, advice and stream attachment.
//! Checked like the driver checks them, then taken as hints that need no work.
//!
//! Managed memory here is reachable from the host and the device at every
//! moment: on a GPU it is shared host memory the device reaches by the same
//! address, and on the CPU device its two copies are made coherent at every
//! launch and synchronisation (`crate::managed`). So a prefetch moves
//! nothing, advice changes no placement, and attaching to a stream changes no
//! visibility; none of them can make a program's result differ. Each still
//! refuses what the driver refuses: a range outside managed memory, an
//! unknown device, stream or advice.

use std::ffi::c_void;

use cumux_cuda_bindings::consts::*;

use super::cuda13x::MemLocation;
use super::*;
use crate::state::{client, handles};
use cumux_protocol::Handle;

/// `CU_DEVICE_CPU`: the host, where a device ordinal is expected.
const DEVICE_CPU: i32 = -1;

/// Whether `[ptr, ptr + count)` lies in one managed allocation.
fn check_managed(ptr: u64, count: usize) -> CuResult<()> {
    let c = client()?;
    let st = c.lock();
    st.context_device()?;
    if count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (base, size) = st.allocation_of(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let managed = st.is_managed(base);
    let end = ptr
        .checked_add(count as u64)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if !managed || end > base + size {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// A device ordinal or the host.
fn check_device(device: i32) -> CuResult<()> {
    let known = device == DEVICE_CPU || (0..client()?.devices.len() as i32).contains(&device);
    known.then_some(()).ok_or(CUDA_ERROR_INVALID_DEVICE)
}

fn check_location(location: MemLocation) -> CuResult<()> {
    match location.kind {
        CU_MEM_LOCATION_TYPE_DEVICE => check_device(location.id),
        CU_MEM_LOCATION_TYPE_HOST
        | CU_MEM_LOCATION_TYPE_HOST_NUMA
        | CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT => Ok(()),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn check_stream(s: *mut c_void) -> CuResult<Handle> {
    let stream = handles::stream(s)?;
    client()?.lock().check_stream(stream)?;
    Ok(stream)
}

fn check_advice(advice: u32) -> CuResult<()> {
    (CU_MEM_ADVISE_SET_READ_MOSTLY..=CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        .contains(&advice)
        .then_some(())
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

driver_fn! {
    fn cuMemPrefetchAsync | cuMemPrefetchAsync_ptsz (ptr: u64, count: usize, device: i32, s: *mut c_void) {
        check_managed(ptr, count)?;
        check_device(device)?;
        check_stream(s).map(|_| ())
    }

    unchecked fn cuMemPrefetchAsync_v2(ptr: u64, count: usize, location: MemLocation, flags: u32, s: *mut c_void) {
        prefetch_v2(ptr, count, location, flags, s)
    }

    unchecked fn cuMemPrefetchAsync_v2_ptsz(ptr: u64, count: usize, location: MemLocation, flags: u32, s: *mut c_void) {
        prefetch_v2(ptr, count, location, flags, s)
    }

    fn cuMemAdvise(ptr: u64, count: usize, advice: u32, device: i32) {
        check_managed(ptr, count)?;
        check_advice(advice)?;
        check_device(device)
    }

    unchecked fn cuMemAdvise_v2(ptr: u64, count: usize, advice: u32, location: MemLocation) {
        check_managed(ptr, count)?;
        check_advice(advice)?;
        check_location(location)
    }

    fn cuStreamAttachMemAsync | cuStreamAttachMemAsync_ptsz (s: *mut c_void, ptr: u64, length: usize, flags: u32) {
        if !matches!(flags, CU_MEM_ATTACH_GLOBAL | CU_MEM_ATTACH_HOST | CU_MEM_ATTACH_SINGLE) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let stream = check_stream(s)?;
        // Length 0 names the whole allocation.
        check_managed(ptr, length.max(1))?;
        crate::managed_guard::attach(ptr, crate::managed_guard::Attach::of(flags, stream))
    }
}

fn prefetch_v2(
    ptr: u64,
    count: usize,
    location: MemLocation,
    flags: u32,
    s: *mut c_void,
) -> CuResult<()> {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    check_managed(ptr, count)?;
    check_location(location)?;
    check_stream(s).map(|_| ())
}
