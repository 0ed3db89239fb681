//! Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`,
//! `cuMemSetAccess` …): arguments checked as NVIDIA's driver checks them, then
//! the server's answer (the server checks again and holds the tables); the
//! mapped ranges are kept in the client's state, where pointer queries and
//! copies see them as device memory. Sharing physical memory with other
//! processes is not supported yet.

use std::ffi::c_void;
use std::os::fd::{BorrowedFd, IntoRawFd};
use std::sync::Once;

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_protocol::vmm::{is_access_flags, HANDLE_TYPE_POSIX_FD, HOST_PAGE};
use cumux_protocol::{Call, ReplyBody, VmmCall};

use super::cuda13x::MemLocation;
use super::*;
use crate::state::{client, Client};

/// `CUmemAllocationProp`.
#[repr(C)]
struct AllocationProp {
    kind: u32,
    requested_handle_types: u32,
    location: MemLocation,
    win32_handle_meta_data: *mut c_void,
    compression_type: u8,
    gpu_direct_rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct AccessDesc {
    location: MemLocation,
    flags: u32,
}

const _: () = assert!(std::mem::size_of::<AllocationProp>() == 32);
const _: () = assert!(std::mem::size_of::<AccessDesc>() == 12);

/// Says once on stderr why a call cumux cannot honour yet failed.
fn not_supported(said: &Once, what: &str) -> CuResult<()> {
    said.call_once(|| {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "cumux: {what} is not supported yet (CUDA_ERROR_NOT_SUPPORTED)"
        );
    });
    Err(CUDA_ERROR_NOT_SUPPORTED)
}

/// The device a location names, which must be a device of this client.
pub(super) fn device_at(c: &Client, location: MemLocation) -> CuResult<u32> {
    match location.kind {
        CU_MEM_LOCATION_TYPE_DEVICE => {
            c.device(location.id)?;
            Ok(location.id as u32)
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Virtual memory on the host is not given yet: says so (once) and refuses.
fn refuse_host(location: MemLocation) -> CuResult<()> {
    static HOST: Once = Once::new();
    match location.kind {
        CU_MEM_LOCATION_TYPE_HOST | CU_MEM_LOCATION_TYPE_HOST_NUMA => {
            not_supported(&HOST, "virtual memory on the host")
        }
        _ => Ok(()),
    }
}

/// `CU_MEM_ALLOCATION_COMP_GENERIC`.
const COMPRESSION_GENERIC: u8 = 1;

/// The device, shareable handle types and compression of pinned device
/// memory's properties, as `cuMemCreate` and `cuMemGetAllocationGranularity`
/// take them.
fn pinned_device_memory(c: &Client, prop: *const c_void) -> CuResult<(u32, u64, bool)> {
    let prop = read_in(prop.cast::<AllocationProp>())?;
    if prop.kind != CU_MEM_ALLOCATION_TYPE_PINNED {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let compressed = match prop.compression_type {
        0 => false,
        COMPRESSION_GENERIC => true,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    refuse_host(prop.location)?;
    let device = device_at(c, prop.location)?;
    Ok((device, u64::from(prop.requested_handle_types), compressed))
}

pub(super) fn vmm(c: &Client, call: VmmCall) -> CuResult<ReplyBody> {
    c.call(Call::Vmm(call))
}

pub(super) fn reply_value(reply: ReplyBody) -> CuResult<u64> {
    match reply {
        ReplyBody::Value(v) | ReplyBody::Ptr(v) | ReplyBody::Handle(v) => Ok(v),
        _ => Err(CUDA_ERROR_UNKNOWN),
    }
}

/// The `CUmemAccessDesc`s of `cuMemSetAccess` (and `cuMemPoolSetAccess`).
pub(super) fn access_descs(desc: *const c_void, count: usize) -> CuResult<Vec<(MemLocation, u32)>> {
    let len = count
        .checked_mul(std::mem::size_of::<AccessDesc>())
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let bytes = host_bytes(desc, len)?;
    let word = |b: &[u8], at: usize| u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    Ok(bytes
        .chunks_exact(std::mem::size_of::<AccessDesc>())
        .map(|d| {
            let location = MemLocation {
                kind: word(d, 0),
                id: word(d, 4) as i32,
            };
            (location, word(d, 8))
        })
        .collect())
}

driver_fn! {
    fn cuMemGetAllocationGranularity(granularity: *mut usize, prop: *const c_void, option: CUmemAllocationGranularity_flags) {
        let c = client()?;
        non_null(granularity)?;
        let prop = read_in(prop.cast::<AllocationProp>())?;
        if prop.kind != CU_MEM_ALLOCATION_TYPE_PINNED {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        refuse_host(prop.location)?;
        // NVIDIA's driver answers for any location, even a device it does
        // not have (measured): a device's granularity (the current one's, so
        // that no other device's session wakes for it).
        let device = device_at(c, prop.location).unwrap_or_else(|_| crate::state::current_device());
        let recommended = match option {
            CU_MEM_ALLOC_GRANULARITY_MINIMUM => false,
            CU_MEM_ALLOC_GRANULARITY_RECOMMENDED => true,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        // Known from the handshake: no session wakes for the question (NCCL
        // asks it of every GPU).
        if let Some((minimum, preferred)) = c.device(device as i32)?.vmm_granularity {
            return out(granularity, if recommended { preferred } else { minimum } as usize);
        }
        let value = reply_value(vmm(c, VmmCall::Granularity { device, recommended })?)?;
        out(granularity, value as usize)
    }

    fn cuMemAddressReserve(ptr: *mut CUdeviceptr, size: usize, alignment: usize, addr: CUdeviceptr, flags: u64) {
        let c = client()?;
        non_null(ptr)?;
        let size = size as u64;
        let misaligned = !size.is_multiple_of(HOST_PAGE) || !addr.is_multiple_of(HOST_PAGE);
        let bad_alignment = alignment != 0 && !alignment.is_power_of_two();
        if flags != 0 || size == 0 || misaligned || bad_alignment {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let call = VmmCall::Reserve { size, alignment: alignment as u64, hint: addr };
        out(ptr, reply_value(vmm(c, call)?)?)
    }

    fn cuMemAddressFree(ptr: CUdeviceptr, size: usize) {
        let c = client()?;
        vmm(c, VmmCall::Free { ptr, size: size as u64 }).map(|_| ())
    }

    fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const c_void, flags: u64) {
        let c = client()?;
        non_null(handle)?;
        if flags != 0 || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (device, handle_types, compressed) = pinned_device_memory(c, prop)?;
        let call = VmmCall::Create { device, size: size as u64, handle_types, compressed };
        out(handle, reply_value(vmm(c, call)?)?)
    }

    fn cuMemRelease(handle: CUmemGenericAllocationHandle) {
        vmm(client()?, VmmCall::Release { handle }).map(|_| ())
    }

    fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) {
        let c = client()?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let size = size as u64;
        vmm(c, VmmCall::Map { ptr, size, offset: offset as u64, handle })?;
        c.place(ptr, size, cumux_protocol::device_of_handle(handle))?;
        c.lock().mappings.insert(ptr, size);
        Ok(())
    }

    fn cuMemUnmap(ptr: CUdeviceptr, size: usize) {
        let c = client()?;
        vmm(c, VmmCall::Unmap { ptr, size: size as u64 })?;
        let mut st = c.lock();
        let gone: Vec<u64> = st.mappings.range(ptr..ptr.saturating_add(size as u64)).map(|(b, _)| *b).collect();
        for base in gone {
            st.mappings.remove(&base);
            c.placements().remove(base);
        }
        Ok(())
    }

    fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const c_void, count: usize) {
        let c = client()?;
        if count == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let descs = access_descs(desc, count)?;
        for (location, flags) in &descs {
            if location.kind != CU_MEM_LOCATION_TYPE_DEVICE {
                // Host access to device memory (the driver's answer, measured).
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
            device_at(c, *location)?;
            if !is_access_flags(u64::from(*flags)) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        for (location, flags) in descs {
            let device = device_at(c, location)?;
            let call = VmmCall::SetAccess { ptr, size: size as u64, device, flags: u64::from(flags) };
            vmm(c, call)?;
        }
        Ok(())
    }

    fn cuMemGetAccess(flags: *mut u64, location: *const c_void, ptr: CUdeviceptr) {
        let c = client()?;
        non_null(flags)?;
        let device = device_at(c, *read_in(location.cast::<MemLocation>())?)?;
        out(flags, reply_value(vmm(c, VmmCall::GetAccess { ptr, device })?)?)
    }

    fn cuMemGetAllocationPropertiesFromHandle(prop: *mut c_void, handle: CUmemGenericAllocationHandle) {
        let c = client()?;
        non_null(prop)?;
        let found = match vmm(c, VmmCall::Properties { handle })? {
            ReplyBody::VmmProperties(p) => p,
            _ => return Err(CUDA_ERROR_UNKNOWN),
        };
        let props = AllocationProp {
            kind: CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: found.handle_types as u32,
            location: MemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: found.device as i32 },
            win32_handle_meta_data: std::ptr::null_mut(),
            compression_type: if found.compressed { COMPRESSION_GENERIC } else { 0 },
            gpu_direct_rdma_capable: 0,
            usage: 0,
            reserved: [0; 4],
        };
        out(prop.cast::<AllocationProp>(), props)
    }

    fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) {
        let c = client()?;
        non_null(handle)?;
        out(handle, reply_value(vmm(c, VmmCall::Retain { ptr: addr as u64 })?)?)
    }

    fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: CUmemAllocationHandleType, flags: u64) {
        static SAID: Once = Once::new();
        let c = client()?;
        non_null(shareable)?;
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // An unknown handle, or one created without this type, is the
        // program's mistake, answered as the driver does.
        let allowed = match vmm(c, VmmCall::Properties { handle })? {
            ReplyBody::VmmProperties(p) => p.handle_types,
            _ => return Err(CUDA_ERROR_UNKNOWN),
        };
        if allowed & u64::from(handle_type) == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if u64::from(handle_type) != HANDLE_TYPE_POSIX_FD {
            return not_supported(&SAID, "shareable handles other than file descriptors");
        }
        // The driver's own descriptor, from the worker through the server:
        // the process it is passed to imports the very memory.
        let (_, fd) = c.call_for_fd(Call::Vmm(VmmCall::Export { handle }))?;
        out(shareable.cast::<i32>(), fd.into_raw_fd())
    }

    fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: CUmemAllocationHandleType) {
        static SAID: Once = Once::new();
        let c = client()?;
        non_null(handle)?;
        if u64::from(handle_type) != HANDLE_TYPE_POSIX_FD {
            return not_supported(&SAID, "shareable handles other than file descriptors");
        }
        let raw = i32::try_from(os_handle as usize).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if raw < 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program passes a descriptor it holds, open for the call.
        let fd = unsafe { BorrowedFd::borrow_raw(raw) };
        let device = c.lock().context_device()?;
        let reply = c.call_with_fd_on(device, Call::Vmm(VmmCall::Import), fd)?;
        out(handle, reply_value(reply)?)
    }
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use super::*;
    use crate::state::State;

    #[test]
    fn the_structs_have_the_headers_layout() {
        assert_eq!(offset_of!(AllocationProp, location), 8);
        assert_eq!(offset_of!(AllocationProp, win32_handle_meta_data), 16);
        assert_eq!(offset_of!(AllocationProp, compression_type), 24);
        assert_eq!(offset_of!(AllocationProp, usage), 26);
        assert_eq!(offset_of!(AccessDesc, flags), 8);
    }

    #[test]
    fn every_access_descriptor_is_read() {
        let descs = [
            AccessDesc {
                location: MemLocation { kind: 1, id: 0 },
                flags: 3,
            },
            AccessDesc {
                location: MemLocation { kind: 1, id: 7 },
                flags: 1,
            },
        ];
        let read = access_descs(descs.as_ptr().cast(), 2).unwrap();
        let read: Vec<(u32, i32, u32)> = read.iter().map(|(l, f)| (l.kind, l.id, *f)).collect();
        assert_eq!(read, [(1, 0, 3), (1, 7, 1)]);
        assert_eq!(
            access_descs(std::ptr::null(), 1).err(),
            Some(CUDA_ERROR_INVALID_VALUE)
        );
    }

    /// A mapping is device memory to copies and pointer queries, wherever
    /// the GPU's driver put it.
    #[test]
    fn mapped_ranges_are_device_memory() {
        let mut st = State::default();
        let base = 0x7f00_0000_0000;
        assert!(!st.is_device_memory(base + 5));
        st.mappings.insert(base, 2 << 20);
        st.mappings.insert(base + (2 << 20), 2 << 20);
        assert!(st.is_device_memory(base + 5));
        assert_eq!(
            st.allocation_of(base + (2 << 20) + 1),
            Some((base + (2 << 20), 2 << 20))
        );
        assert!(!st.is_device_memory(base + (4 << 20)));
    }
}
