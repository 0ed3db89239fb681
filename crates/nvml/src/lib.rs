//! A tenant's NVML (`libnvidia-ml.so.1`, which `cumux run` puts in front of
//! NVIDIA's): the tenant's devices in its `CUDA_VISIBLE_DEVICES` order, memory
//! total = its quota and used = its own, its own processes. The cumux server
//! answers (`view`). Utilization is not measured per tenant yet: it answers
//! `NVML_ERROR_NOT_SUPPORTED`, as NVML does where a GPU cannot say. Entry
//! points not here are absent, so a program that looks one up learns so.

mod view;

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};

use cumux_protocol::DeviceInfo;

pub type NvmlReturn = c_uint;
pub const NVML_SUCCESS: NvmlReturn = 0;
pub const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
pub const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
pub const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: NvmlReturn = 9;
pub const NVML_ERROR_GPU_IS_LOST: NvmlReturn = 15;
pub const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlProcessInfo_t` (the v2 and v3 entry points share it).
#[repr(C)]
pub struct NvmlProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlMemory_v2`: the structure's size and version 2, as NVML marks it.
const NVML_MEMORY_V2: c_uint = std::mem::size_of::<NvmlMemoryV2>() as c_uint | (2 << 24);

/// NVML's "no instance" id for processes outside MIG.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// The devices `nvmlInit` found, and how many inits are open.
struct Nvml {
    devices: Vec<DeviceInfo>,
    inits: usize,
}

static STATE: Mutex<Nvml> = Mutex::new(Nvml {
    devices: Vec::new(),
    inits: 0,
});

fn state() -> MutexGuard<'static, Nvml> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs an entry point's body; no panic crosses the C ABI.
fn guard(body: impl FnOnce() -> Result<(), NvmlReturn>) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

/// Writes through a pointer the program passed (null: invalid argument).
fn out<T>(ptr: *mut T, value: T) -> Result<(), NvmlReturn> {
    if ptr.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NVML's contract makes it point to a writable T.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Copies `text` and a NUL into the program's buffer of `len` bytes.
fn out_str(buf: *mut c_char, len: c_uint, text: &str) -> Result<(), NvmlReturn> {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if text.len() + 1 > len as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the program's buffer holds `len` bytes, more than written here.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    Ok(())
}

/// The device a handle names: handles are 1 + the device's index.
fn device(handle: *mut c_void) -> Result<DeviceInfo, NvmlReturn> {
    let nvml = state();
    if nvml.inits == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    let index = (handle as usize)
        .checked_sub(1)
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    nvml.devices
        .get(index)
        .cloned()
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

fn init() -> Result<(), NvmlReturn> {
    let mut nvml = state();
    if nvml.inits == 0 {
        nvml.devices = view::devices().map_err(|why| {
            eprintln!("cumux NVML: {why}");
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
    }
    nvml.inits += 1;
    Ok(())
}

/// The tenant's use of `device` now.
fn usage(device: &DeviceInfo) -> Result<view::Usage, NvmlReturn> {
    view::usage(&device.uuid).map_err(|why| {
        eprintln!("cumux NVML: {why}");
        NVML_ERROR_GPU_IS_LOST
    })
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as NVML writes a UUID.
fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: Vec<String> = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

/// The CUDA driver version cumux's client driver reports.
const CUDA_DRIVER_VERSION: c_int = 13000;

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    guard(init)
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    guard(init)
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    guard(init)
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    guard(|| {
        let mut nvml = state();
        nvml.inits = nvml.inits.checked_sub(1).ok_or(NVML_ERROR_UNINITIALIZED)?;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    let text: &'static CStr = match result {
        NVML_SUCCESS => c"Success",
        NVML_ERROR_UNINITIALIZED => c"Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
        NVML_ERROR_NOT_FOUND => c"Not Found",
        NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) -> NvmlReturn {
    guard(|| out_str(version, len, concat!("cumux-", env!("CARGO_PKG_VERSION"))))
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, len: c_uint) -> NvmlReturn {
    guard(|| out_str(version, len, "13.0.cumux"))
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> NvmlReturn {
    guard(|| out(version, CUDA_DRIVER_VERSION))
}

#[no_mangle]
pub extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    guard(|| out(version, CUDA_DRIVER_VERSION))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    guard(|| {
        let nvml = state();
        if nvml.inits == 0 {
            return Err(NVML_ERROR_UNINITIALIZED);
        }
        out(count, nvml.devices.len() as c_uint)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount(count: *mut c_uint) -> NvmlReturn {
    nvmlDeviceGetCount_v2(count)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    handle: *mut *mut c_void,
) -> NvmlReturn {
    guard(|| {
        let h = (index as usize + 1) as *mut c_void;
        device(h)?;
        out(handle, h)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    handle: *mut *mut c_void,
) -> NvmlReturn {
    nvmlDeviceGetHandleByIndex_v2(index, handle)
}

/// `DOMAIN:BUS:DEVICE.FUNCTION` in hex (`0000:65:00.0`, or without the
/// domain) as (domain, bus, device).
fn parse_pci(text: &str) -> Option<[u32; 3]> {
    let (rest, _function) = text.rsplit_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let hex = |s: &str| u32::from_str_radix(s, 16).ok();
    match parts[..] {
        [domain, bus, device] => Some([hex(domain)?, hex(bus)?, hex(device)?]),
        [bus, device] => Some([0, hex(bus)?, hex(device)?]),
        _ => None,
    }
}

/// The handle of the tenant's device at a PCI bus id; `NVML_ERROR_NOT_FOUND`
/// for a device it does not see.
fn handle_by_pci(bus_id: *const c_char, handle: *mut *mut c_void) -> Result<(), NvmlReturn> {
    if bus_id.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NVML's contract makes it a NUL-terminated string.
    let text = unsafe { CStr::from_ptr(bus_id) }.to_string_lossy();
    let pci = parse_pci(text.trim()).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
    let nvml = state();
    if nvml.inits == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    let index = nvml
        .devices
        .iter()
        .position(|d| d.pci == pci)
        .ok_or(NVML_ERROR_NOT_FOUND)?;
    out(handle, (index + 1) as *mut c_void)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    handle: *mut *mut c_void,
) -> NvmlReturn {
    guard(|| handle_by_pci(bus_id, handle))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByPciBusId(
    bus_id: *const c_char,
    handle: *mut *mut c_void,
) -> NvmlReturn {
    nvmlDeviceGetHandleByPciBusId_v2(bus_id, handle)
}

/// NVLink queries: a tenant's device has no links it may see.
#[no_mangle]
pub extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    handle: *mut c_void,
    _link: c_uint,
    _pci: *mut c_void,
) -> NvmlReturn {
    guard(|| {
        device(handle)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    handle: *mut c_void,
    _link: c_uint,
    _kind: *mut c_uint,
) -> NvmlReturn {
    guard(|| {
        device(handle)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetIndex(handle: *mut c_void, index: *mut c_uint) -> NvmlReturn {
    guard(|| {
        device(handle)?;
        out(index, (handle as usize - 1) as c_uint)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetName(
    handle: *mut c_void,
    name: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    guard(|| out_str(name, len, &device(handle)?.name))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUUID(
    handle: *mut c_void,
    uuid: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    guard(|| out_str(uuid, len, &uuid_text(&device(handle)?.uuid)))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo(
    handle: *mut c_void,
    memory: *mut NvmlMemory,
) -> NvmlReturn {
    guard(|| {
        let d = device(handle)?;
        let used = usage(&d)?.used.min(d.total_mem);
        let free = d.total_mem - used;
        out(
            memory,
            NvmlMemory {
                total: d.total_mem,
                free,
                used,
            },
        )
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    handle: *mut c_void,
    memory: *mut NvmlMemoryV2,
) -> NvmlReturn {
    guard(|| {
        let d = device(handle)?;
        let used = usage(&d)?.used.min(d.total_mem);
        let v2 = NvmlMemoryV2 {
            version: NVML_MEMORY_V2,
            total: d.total_mem,
            reserved: 0,
            free: d.total_mem - used,
            used,
        };
        out(memory, v2)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUtilizationRates(
    handle: *mut c_void,
    _rates: *mut c_void,
) -> NvmlReturn {
    guard(|| {
        device(handle)?;
        Err(NVML_ERROR_NOT_SUPPORTED)
    })
}

/// The tenant's processes on `handle`'s device into the program's array of
/// `*count` entries; `*count` becomes how many there are.
fn processes(
    handle: *mut c_void,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> Result<(), NvmlReturn> {
    if count.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    let d = device(handle)?;
    let list = usage(&d)?.processes;
    // SAFETY: non-null, and NVML's contract makes it point to the array's length.
    let room = unsafe { count.read_unaligned() } as usize;
    out(count, list.len() as c_uint)?;
    if list.len() > room || (infos.is_null() && !list.is_empty()) {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (i, &(pid, bytes)) in list.iter().enumerate() {
        let info = NvmlProcessInfo {
            pid,
            used_gpu_memory: bytes,
            gpu_instance_id: NO_INSTANCE,
            compute_instance_id: NO_INSTANCE,
        };
        out(infos.wrapping_add(i), info)?;
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    handle: *mut c_void,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    guard(|| processes(handle, count, infos))
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
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    nvmlDeviceGetComputeRunningProcesses_v3(handle, count, infos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_written_as_nvml_writes_them() {
        let uuid: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(uuid_text(&uuid), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
    }

    #[test]
    fn pci_bus_ids_parse_as_nvml_writes_them() {
        assert_eq!(parse_pci("00000000:65:00.0"), Some([0, 0x65, 0]));
        assert_eq!(parse_pci("0001:B3:1F.0"), Some([1, 0xb3, 0x1f]));
        assert_eq!(parse_pci("65:00.0"), Some([0, 0x65, 0]));
        assert_eq!(parse_pci("nonsense"), None);
        assert_eq!(parse_pci("1:2:3:4.0"), None);
    }

    #[test]
    fn calls_before_init_say_uninitialized() {
        let mut count = 7;
        assert_eq!(nvmlDeviceGetCount_v2(&mut count), NVML_ERROR_UNINITIALIZED);
        assert_eq!(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
        let mut buf = [0 as c_char; 4];
        assert_eq!(
            nvmlSystemGetNVMLVersion(buf.as_mut_ptr(), 4),
            NVML_ERROR_INSUFFICIENT_SIZE
        );
    }
}
