//! A tenant's use of its devices as NVML reports it: memory total = its quota
//! and used = its own, its own processes, its own utilization. Per-process
//! figures NVIDIA's NVML would give describe the cumux server, not the tenant.

use std::ffi::{c_uint, c_ulonglong, c_void};

use cumux_protocol::DeviceInfo;

use crate::state::{device, guard, nvidia_fn, out};
use crate::types::*;
use crate::view;

/// The tenant's use of `device` now.
fn usage(device: &DeviceInfo) -> Result<view::Usage, NvmlReturn> {
    view::usage(&device.uuid).map_err(|why| {
        eprintln!("cumux NVML: {why}");
        NVML_ERROR_GPU_IS_LOST
    })
}

/// (total, free, used) of the tenant's memory on `handle`'s device.
fn memory(handle: *mut c_void) -> Result<(u64, u64, u64), NvmlReturn> {
    let (_, d) = device(handle)?;
    let used = usage(&d)?.used.min(d.total_mem);
    Ok((d.total_mem, d.total_mem - used, used))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo(
    handle: *mut c_void,
    memory_out: *mut NvmlMemory,
) -> NvmlReturn {
    guard(|| {
        let (total, free, used) = memory(handle)?;
        out(memory_out, NvmlMemory { total, free, used })
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    handle: *mut c_void,
    memory_out: *mut NvmlMemoryV2,
) -> NvmlReturn {
    guard(|| {
        let (total, free, used) = memory(handle)?;
        let v2 = NvmlMemoryV2 {
            version: NVML_MEMORY_V2,
            total,
            reserved: 0,
            free,
            used,
        };
        out(memory_out, v2)
    })
}

type RatesFn = unsafe extern "C" fn(*mut c_void, *mut NvmlUtilization) -> NvmlReturn;

/// The tenant's share of the device over the last second. Where all the
/// device's sessions are the tenant's, NVIDIA's figures for the whole device
/// are its own, and NVIDIA's NVML (where it stands behind) gives them;
/// otherwise the server's measure of the tenant's device time, with the
/// memory figure (the time device memory was read or written), which is not
/// measured per tenant, 0; where the server does not time the tenant's work,
/// `NVML_ERROR_NOT_SUPPORTED`.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetUtilizationRates(
    handle: *mut c_void,
    rates: *mut NvmlUtilization,
) -> NvmlReturn {
    let used = match device(handle).and_then(|(_, d)| usage(&d)) {
        Ok(used) => used,
        Err(rc) => return rc,
    };
    // SAFETY: NVIDIA's header gives nvmlDeviceGetUtilizationRates this type.
    let nvidia = unsafe { nvidia_fn::<RatesFn>("nvmlDeviceGetUtilizationRates") };
    match nvidia.filter(|_| used.sole) {
        // SAFETY: NVIDIA's handle for the device and the program's pointer.
        Some(whole) => unsafe { whole(handle, rates) },
        None => guard(|| {
            let gpu = used.gpu_percent.ok_or(NVML_ERROR_NOT_SUPPORTED)?;
            out(rates, NvmlUtilization { gpu, memory: 0 })
        }),
    }
}

/// Writes `list` into the program's array of `*count` entries as `entry`
/// makes them; `*count` becomes how many there are.
fn fill<T>(
    count: *mut c_uint,
    infos: *mut T,
    list: &[(u32, u64, String)],
    entry: impl Fn(u32, u64) -> T,
) -> Result<(), NvmlReturn> {
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NVML's contract makes it point to the array's length.
    let room = unsafe { count.read_unaligned() } as usize;
    out(count, list.len() as c_uint)?;
    if list.len() > room || (infos.is_null() && !list.is_empty()) {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, &(pid, bytes, _)) in list.iter().enumerate() {
        out(infos.wrapping_add(i), entry(pid, bytes))?;
    }
    Ok(())
}

/// The tenant's processes on `handle`'s device: (pid, bytes, program).
pub fn processes(handle: *mut c_void) -> Result<Vec<(u32, u64, String)>, NvmlReturn> {
    let (_, d) = device(handle)?;
    Ok(usage(&d)?.processes)
}

fn info(pid: u32, bytes: u64) -> NvmlProcessInfo {
    NvmlProcessInfo {
        pid,
        used_gpu_memory: bytes,
        gpu_instance_id: NO_INSTANCE,
        compute_instance_id: NO_INSTANCE,
    }
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    handle: *mut c_void,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    guard(|| fill(count, infos, &processes(handle)?, info))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    handle: *mut c_void,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    nvmlDeviceGetComputeRunningProcesses_v3(handle, count, infos)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    handle: *mut c_void,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfoV1,
) -> NvmlReturn {
    guard(|| {
        fill(count, infos, &processes(handle)?, |pid, bytes| {
            NvmlProcessInfoV1 {
                pid,
                used_gpu_memory: bytes as c_ulonglong,
            }
        })
    })
}

/// Graphics and MPS processes: a tenant's programs are neither.
fn none_of_its_own(handle: *mut c_void, count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        device(handle)?;
        out(count, 0)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    handle: *mut c_void,
    count: *mut c_uint,
    _infos: *mut c_void,
) -> NvmlReturn {
    none_of_its_own(handle, count)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    handle: *mut c_void,
    count: *mut c_uint,
    _infos: *mut c_void,
) -> NvmlReturn {
    none_of_its_own(handle, count)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetGraphicsRunningProcesses(
    handle: *mut c_void,
    count: *mut c_uint,
    _infos: *mut c_void,
) -> NvmlReturn {
    none_of_its_own(handle, count)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    handle: *mut c_void,
    count: *mut c_uint,
    _infos: *mut c_void,
) -> NvmlReturn {
    none_of_its_own(handle, count)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    handle: *mut c_void,
    count: *mut c_uint,
    _infos: *mut c_void,
) -> NvmlReturn {
    none_of_its_own(handle, count)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses(
    handle: *mut c_void,
    count: *mut c_uint,
    _infos: *mut c_void,
) -> NvmlReturn {
    none_of_its_own(handle, count)
}

/// Per-process samples, accounting and sample streams: NVIDIA's figures
/// would be the cumux server's, so a tenant gets none.
fn server_figures(handle: *mut c_void) -> NvmlReturn {
    guard(|| {
        device(handle)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetProcessUtilization(
    handle: *mut c_void,
    _samples: *mut c_void,
    _count: *mut c_uint,
    _since: c_ulonglong,
) -> NvmlReturn {
    server_figures(handle)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetProcessesUtilizationInfo(
    handle: *mut c_void,
    _info: *mut c_void,
) -> NvmlReturn {
    server_figures(handle)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetRunningProcessDetailList(
    handle: *mut c_void,
    _list: *mut c_void,
) -> NvmlReturn {
    server_figures(handle)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetSamples(
    handle: *mut c_void,
    _kind: c_uint,
    _since: c_ulonglong,
    _value_kind: *mut c_uint,
    _count: *mut c_uint,
    _samples: *mut c_void,
) -> NvmlReturn {
    server_figures(handle)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetAccountingPids(
    handle: *mut c_void,
    _count: *mut c_uint,
    _pids: *mut c_uint,
) -> NvmlReturn {
    server_figures(handle)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetAccountingStats(
    handle: *mut c_void,
    _pid: c_uint,
    _stats: *mut c_void,
) -> NvmlReturn {
    server_figures(handle)
}
