//! `nvmlInternalGetExportTable`, NVML's private table of entry points, through
//! which `nvidia-smi` finds devices and lists processes instead of the public
//! calls: NVIDIA's table, with those entries answered for the tenant.

use std::ffi::{c_char, c_uint, c_void};
use std::sync::OnceLock;

use crate::devices::nvmlDeviceGetHandleByIndex_v2;
use crate::state::{guard, nvidia_fn, out};
use crate::types::*;
use crate::usage::processes;

/// The table `nvidia-smi` asks for: GUID 6c3efec4-8fc9-4e6c-a327-ee696e12f7c4,
/// its first three fields little-endian as NVML lays a GUID out.
const SMI_TABLE: [u8; 16] = [
    0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e, 0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4,
];
/// Entries of that table (an index into it, 8 bytes each; entry 0 holds the
/// table's size in bytes) on the driver branch where they were observed.
const DRIVER_BRANCH: &str = "580.";
const HANDLE_BY_INDEX: usize = 81;
const PROCESS_LISTS: std::ops::RangeInclusive<usize> = 213..=215;
/// One entry of a process list: pid at 0, bytes at 8, GPU and compute
/// instance at 16 and 20, protected bytes at 24, then the name inline.
const PROCESS_ENTRY: usize = 4128;
const PROCESS_NAME_AT: usize = 32;

type GetTableFn = unsafe extern "C" fn(*mut *const c_void, *const [u8; 16]) -> NvmlReturn;
type VersionFn = unsafe extern "C" fn(*mut c_char, c_uint) -> NvmlReturn;

/// Device `index` of the tenant's, as the table's lookup by index answers.
extern "C" fn handle_by_index(index: c_uint, handle: *mut *mut c_void) -> NvmlReturn {
    nvmlDeviceGetHandleByIndex_v2(index, handle)
}

/// Writes the tenant's processes on `device` into the caller's list of
/// `*count` entries; `*count` becomes how many were written.
fn list_processes(device: *mut c_void, count: *mut c_uint, list: *mut u8) -> NvmlReturn {
    guard(|| {
        if count.is_null() || list.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller passes its list's capacity there.
        let room = unsafe { count.read_unaligned() } as usize;
        let all = processes(device)?;
        let written = all.len().min(room);
        for (i, (pid, bytes, program)) in all.iter().take(written).enumerate() {
            let name = program.rsplit('/').next().unwrap_or(program).as_bytes();
            let name = &name[..name.len().min(PROCESS_ENTRY - PROCESS_NAME_AT - 1)];
            // SAFETY: entry i < the caller's capacity, each PROCESS_ENTRY bytes.
            unsafe {
                let entry = list.add(i * PROCESS_ENTRY);
                std::ptr::write_bytes(entry, 0, PROCESS_ENTRY);
                entry.cast::<u32>().write_unaligned(*pid);
                entry.add(8).cast::<u64>().write_unaligned(*bytes);
                entry.add(16).cast::<u32>().write_unaligned(NO_INSTANCE);
                entry.add(20).cast::<u32>().write_unaligned(NO_INSTANCE);
                std::ptr::copy_nonoverlapping(
                    name.as_ptr(),
                    entry.add(PROCESS_NAME_AT),
                    name.len(),
                );
            }
        }
        out(count, written as c_uint)
    })
}

/// The first process list: the tenant's own processes.
extern "C" fn own_processes(device: *mut c_void, count: *mut c_uint, list: *mut u8) -> NvmlReturn {
    list_processes(device, count, list)
}

/// The other process lists (graphics, MPS): a tenant's programs are none of them.
extern "C" fn no_processes(device: *mut c_void, count: *mut c_uint, _list: *mut u8) -> NvmlReturn {
    guard(|| {
        crate::state::device(device)?;
        out(count, 0)
    })
}

/// Whether NVIDIA's NVML is of the branch whose table layout is known here.
fn known_branch() -> bool {
    // SAFETY: NVIDIA's header gives nvmlSystemGetDriverVersion this type.
    let Some(version) = (unsafe { nvidia_fn::<VersionFn>("nvmlSystemGetDriverVersion") }) else {
        return false;
    };
    let mut text = [0 as c_char; 96];
    // SAFETY: a buffer of the length given.
    if unsafe { version(text.as_mut_ptr(), text.len() as c_uint) } != NVML_SUCCESS {
        return false;
    }
    // SAFETY: NVML wrote a NUL-terminated string into the buffer.
    let text = unsafe { std::ffi::CStr::from_ptr(text.as_ptr()) };
    text.to_string_lossy().starts_with(DRIVER_BRANCH)
}

/// A copy of NVIDIA's table at `table` with the tenant's entries in it;
/// `None` where its size is not one the known layout fits.
fn tenant_table(table: *const usize) -> Option<Vec<usize>> {
    // SAFETY: entry 0 of NVIDIA's table holds its size in bytes.
    let bytes = unsafe { table.read() };
    let entries = bytes / 8;
    if entries <= *PROCESS_LISTS.end() || entries > 4096 {
        return None;
    }
    // SAFETY: NVIDIA's table holds `entries` entries.
    let mut copy = unsafe { std::slice::from_raw_parts(table, entries) }.to_vec();
    copy[HANDLE_BY_INDEX] = handle_by_index as *const () as usize;
    for slot in PROCESS_LISTS {
        copy[slot] = no_processes as *const () as usize;
    }
    copy[*PROCESS_LISTS.start()] = own_processes as *const () as usize;
    Some(copy)
}

#[no_mangle]
pub extern "C" fn nvmlInternalGetExportTable(
    table: *mut *const c_void,
    guid: *const [u8; 16],
) -> NvmlReturn {
    // SAFETY: NVIDIA's NVML exports this entry point with `GetTableFn`'s type.
    let Some(nvidia) = (unsafe { nvidia_fn::<GetTableFn>("nvmlInternalGetExportTable") }) else {
        return NVML_ERROR_FUNCTION_NOT_FOUND;
    };
    // SAFETY: the program's arguments, passed on.
    let rc = unsafe { nvidia(table, guid) };
    // SAFETY: both pointers were accepted by NVIDIA's NVML just now.
    if rc != NVML_SUCCESS || table.is_null() || guid.is_null() || unsafe { *guid } != SMI_TABLE {
        return rc;
    }
    static TENANT_TABLE: OnceLock<Option<Vec<usize>>> = OnceLock::new();
    // SAFETY: NVIDIA's NVML wrote its table's address there.
    let original = unsafe { *table }.cast::<usize>();
    let ours = TENANT_TABLE.get_or_init(|| {
        let copy = known_branch().then(|| tenant_table(original)).flatten();
        if copy.is_none() {
            eprintln!(
                "cumux NVML: nvidia-smi's private table is of a driver branch cumux does not know: its process list shows the cumux server"
            );
        }
        copy
    });
    if let Some(ours) = ours {
        // SAFETY: the program's place for the table's address.
        unsafe { *table = ours.as_ptr().cast() };
    }
    rc
}
