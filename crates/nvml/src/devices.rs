//! Which devices a tenant's program sees and how it names them: only the
//! tenant's, in its `CUDA_VISIBLE_DEVICES` order, by index, UUID, PCI bus id or
//! serial; a device outside the tenant's set is not found.

use std::ffi::{c_char, c_uint, c_void, CStr};

use cumux_protocol::visible_devices::uuid_text;

use crate::state::{self, device, guard, nvidia_fn, out, out_str};
use crate::types::*;

#[no_mangle]
pub extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    guard(|| out(count, state::devices()?.len() as c_uint))
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
        let devices = state::devices()?;
        let d = devices
            .get(index as usize)
            .ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
        out(handle, d.handle as *mut c_void)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    handle: *mut *mut c_void,
) -> NvmlReturn {
    nvmlDeviceGetHandleByIndex_v2(index, handle)
}

/// The program's string argument.
fn text_arg(text: *const c_char) -> Result<String, NvmlReturn> {
    if text.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NVML's contract makes it a NUL-terminated string.
    Ok(unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .trim()
        .to_string())
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

type ByTextFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> NvmlReturn;

/// NVIDIA's handle for `key` through its entry point `name`, if it is one of
/// the tenant's devices; `None` where NVIDIA's NVML does not stand behind.
fn nvidia_handle(name: &str, key: *const c_char) -> Option<Result<usize, NvmlReturn>> {
    // SAFETY: the by-PCI-id and by-serial lookups have `ByTextFn`'s type.
    let lookup = unsafe { nvidia_fn::<ByTextFn>(name) }?;
    let mut handle = std::ptr::null_mut();
    // SAFETY: the program's string and a place for the handle.
    let rc = unsafe { lookup(key, &mut handle) };
    Some(match rc {
        NVML_SUCCESS => device(handle)
            .map(|_| handle as usize)
            .map_err(|_| NVML_ERROR_NOT_FOUND),
        rc => Err(rc),
    })
}

/// The handle of the tenant's device at a PCI bus id.
fn handle_by_pci(bus_id: *const c_char, handle: *mut *mut c_void) -> Result<(), NvmlReturn> {
    let text = text_arg(bus_id)?;
    let devices = state::devices()?;
    let found = match nvidia_handle("nvmlDeviceGetHandleByPciBusId_v2", bus_id) {
        Some(found) => found?,
        None => {
            let pci = parse_pci(&text).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
            let d = devices.iter().find(|d| d.info.pci == pci);
            d.ok_or(NVML_ERROR_NOT_FOUND)?.handle
        }
    };
    out(handle, found as *mut c_void)
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

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    handle: *mut *mut c_void,
) -> NvmlReturn {
    guard(|| {
        let text = text_arg(uuid)?;
        let devices = state::devices()?;
        let d = devices
            .iter()
            .find(|d| uuid_text(&d.info.uuid).eq_ignore_ascii_case(&text))
            .ok_or(NVML_ERROR_NOT_FOUND)?;
        out(handle, d.handle as *mut c_void)
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetHandleBySerial(
    serial: *const c_char,
    handle: *mut *mut c_void,
) -> NvmlReturn {
    guard(|| {
        text_arg(serial)?;
        state::devices()?;
        let found = nvidia_handle("nvmlDeviceGetHandleBySerial", serial)
            .unwrap_or(Err(NVML_ERROR_NOT_FOUND))?;
        out(handle, found as *mut c_void)
    })
}

type LinkFn = unsafe extern "C" fn(*mut c_void, c_uint, *mut c_void) -> NvmlReturn;

/// An NVLink query: NVIDIA's answer where it stands behind, else none (a
/// device cumux serves from elsewhere shows no links).
fn link(name: &str, handle: *mut c_void, link: c_uint, out: *mut c_void) -> NvmlReturn {
    if let Err(rc) = device(handle) {
        return rc;
    }
    // SAFETY: both NVLink queries here have `LinkFn`'s shape (a handle, a
    // link number, a pointer to what they fill).
    match unsafe { nvidia_fn::<LinkFn>(name) } {
        // SAFETY: the program's arguments, passed on.
        Some(f) => unsafe { f(handle, link, out) },
        None => NVML_ERROR_NOT_SUPPORTED,
    }
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    handle: *mut c_void,
    n: c_uint,
    pci: *mut c_void,
) -> NvmlReturn {
    link("nvmlDeviceGetNvLinkRemotePciInfo_v2", handle, n, pci)
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    handle: *mut c_void,
    n: c_uint,
    kind: *mut c_uint,
) -> NvmlReturn {
    link(
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        handle,
        n,
        kind.cast(),
    )
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetIndex(handle: *mut c_void, index: *mut c_uint) -> NvmlReturn {
    guard(|| out(index, device(handle)?.0 as c_uint))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetName(
    handle: *mut c_void,
    name: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    guard(|| out_str(name, len, &device(handle)?.1.name))
}

#[no_mangle]
pub extern "C" fn nvmlDeviceGetUUID(
    handle: *mut c_void,
    uuid: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    guard(|| out_str(uuid, len, &uuid_text(&device(handle)?.1.uuid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_ids_parse_as_nvml_writes_them() {
        assert_eq!(parse_pci("00000000:65:00.0"), Some([0, 0x65, 0]));
        assert_eq!(parse_pci("0001:B3:1F.0"), Some([1, 0xb3, 0x1f]));
        assert_eq!(parse_pci("65:00.0"), Some([0, 0x65, 0]));
        assert_eq!(parse_pci("nonsense"), None);
        assert_eq!(parse_pci("1:2:3:4.0"), None);
    }
}
