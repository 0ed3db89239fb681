//! Stream-ordered allocation and memory pools: `cuMemAllocAsync` and
//! `cuMemAllocFromPoolAsync` take device memory for a pool (its size limit
//! checked, its statistics kept in `state::pools`); pools are created with
//! the properties cumux can give (device memory; IPC handles as file
//! descriptors where the device shares memory so, through `pool_ipc`), and
//! their attributes and peers' access stick and read back.

use std::ffi::c_void;

use cumux_cuda_bindings::consts::*;
use cumux_cuda_bindings::types::CUmemPoolPtrExportData;
use cumux_protocol::{Call, VmmCall};

use super::copy::ready;
use super::cuda13x::MemLocation;
use super::memory::alloc_on;
use super::pool_ipc;
use super::vmm::device_at;
use super::*;
use crate::graph::GraphOp;
use crate::state::handles;
use crate::state::pools::{default_pool, Pool};
use crate::state::{client, Client};

/// `CUmemPoolProps`.
#[repr(C)]
struct PoolProps {
    alloc_type: u32,
    handle_types: u32,
    location: MemLocation,
    win32_security_attributes: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
}

const _: () = assert!(std::mem::size_of::<PoolProps>() == 88);

/// What a pool's size limit is rounded up to where the device's granularity
/// is not known: a GPU's (2 MiB).
const POOL_GRANULE: u64 = 2 << 20;
/// The smallest size limit a pool gets, whatever it asks for.
const MIN_POOL_LIMIT: u64 = 32 << 20;

/// `CU_MEM_ACCESS_FLAGS_PROT_*`: none, read, read and write.
const ACCESS_NONE: u32 = 0;
const ACCESS_READ: u32 = 1;
const ACCESS_READWRITE: u32 = 3;

fn pool_handle(pool: *mut c_void) -> usize {
    pool as usize
}

/// Allocates `bytes` on `stream` from `pool` (the current pool of the
/// stream's device when `None`); captured, the graph gets an allocation
/// node owning the memory.
fn alloc_async(
    dptr: *mut u64,
    bytes: usize,
    pool: Option<usize>,
    stream: *mut c_void,
) -> CuResult<()> {
    let c = client()?;
    let stream = handles::stream(stream)?;
    let mut st = ready(c, Some(stream))?;
    let devices = c.devices.len();
    let stream_device = match stream {
        cumux_protocol::DEFAULT_STREAM => st.context_device()?,
        s => cumux_protocol::device_of_handle(s),
    };
    let handle = pool.unwrap_or_else(|| st.pools.current(stream_device));
    let p = st.pools.get(handle, devices)?;
    let (device, shareable) = (p.device, p.share_id != 0);
    if p.imported_from.is_some() {
        // An imported pool's memory is the exporter's to allocate.
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let access: Vec<u32> = std::iter::once(device)
        .chain(p.peers.keys().copied())
        .collect();
    st.pools.room(handle, bytes as u64, devices)?;
    let capturing = st.capturing(stream);
    drop(st);
    let ptr = match shareable && !capturing {
        true => pool_ipc::alloc(c, handle, device, bytes as u64, &access)?,
        false => alloc_on(c, device, bytes)?,
    };
    let mut st = c.lock();
    if capturing {
        super::graph_allocs::register(&mut st, ptr, bytes as u64);
        st.capture(
            stream,
            GraphOp::MemAlloc {
                ptr,
                bytes: bytes as u64,
            },
        );
    } else {
        st.pools.took(handle, ptr, bytes as u64);
    }
    drop(st);
    out(dptr, ptr)
}

/// Gives device `peer` the access `flags` to pool `handle`'s memory: peer
/// access from `peer`'s context to the pool's device, enabled where it is
/// not yet.
fn set_peer_access(c: &Client, handle: usize, peer: u32, flags: u32) -> CuResult<()> {
    let devices = c.devices.len();
    let device = c.lock().pools.get(handle, devices)?.device;
    if peer == device {
        // A pool's own device always reads and writes it.
        return match flags {
            ACCESS_READWRITE => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        };
    }
    match flags {
        ACCESS_NONE => {
            // Revoking what only the context's peer access gives: cumux
            // cannot take one pool's memory away from a peer that keeps the
            // rest.
            let granted = c
                .lock()
                .pools
                .get(handle, devices)?
                .peers
                .contains_key(&peer);
            if granted {
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
            Ok(())
        }
        ACCESS_READ | ACCESS_READWRITE => {
            let access = super::device::P2P_ACCESS_SUPPORTED;
            if super::device::peer_attribute(c, peer as i32, device as i32, access)? == 0 {
                return Err(CUDA_ERROR_INVALID_DEVICE);
            }
            if !c.lock().peer_access.contains(&(peer, device)) {
                super::context::switch_peer_access(c, peer, device, true)?;
            }
            let mut st = c.lock();
            st.pools.get(handle, devices)?.peers.insert(peer, flags);
            // A shareable pool's allocations are mappings of their own: each
            // gets the peer's access too.
            let mapped: Vec<(u64, u64)> = st
                .pools
                .shared
                .iter()
                .filter(|(_, a)| a.pool == handle)
                .map(|(ptr, a)| (*ptr, a.size))
                .collect();
            drop(st);
            for (ptr, size) in mapped {
                let access = VmmCall::SetAccess {
                    ptr,
                    size,
                    device: peer,
                    flags: u64::from(flags),
                };
                c.call(Call::Vmm(access))?;
            }
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

driver_fn! {
    fn cuMemAllocAsync | cuMemAllocAsync_ptsz (dptr: *mut u64, bytes: usize, stream: *mut c_void) {
        alloc_async(dptr, bytes, None, stream)
    }

    fn cuMemAllocFromPoolAsync | cuMemAllocFromPoolAsync_ptsz (dptr: *mut u64, bytes: usize, pool: *mut c_void, stream: *mut c_void) {
        alloc_async(dptr, bytes, Some(pool_handle(pool)), stream)
    }

    fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, dev: i32) {
        client()?.device(dev)?;
        out(pool, default_pool(dev as u32) as *mut c_void)
    }

    fn cuDeviceGetMemPool(pool: *mut *mut c_void, dev: i32) {
        let c = client()?;
        c.device(dev)?;
        out(pool, c.lock().pools.current(dev as u32) as *mut c_void)
    }

    fn cuDeviceSetMemPool(dev: i32, pool: *mut c_void) {
        let c = client()?;
        c.device(dev)?;
        let devices = c.devices.len();
        let mut st = c.lock();
        let handle = pool_handle(pool);
        if st.pools.get(handle, devices)?.device != dev as u32 {
            return Err(CUDA_ERROR_INVALID_DEVICE);
        }
        st.pools.set_current(dev as u32, handle);
        Ok(())
    }

    fn cuMemPoolCreate(pool: *mut *mut c_void, props: *const c_void) {
        static SAID: std::sync::Once = std::sync::Once::new();
        let c = client()?;
        non_null(pool)?;
        let props = read_in(props.cast::<PoolProps>())?;
        if props.alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED
            || !props.win32_security_attributes.is_null()
            || props.reserved.iter().any(|b| *b != 0)
        {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let device = device_at(c, props.location)?;
        // Shareable as file descriptors where the device shares memory so.
        let shareable = props.handle_types == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            && c.attribute(device as i32, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES)? & 1 != 0;
        if props.location.kind != CU_MEM_LOCATION_TYPE_DEVICE
            || (props.handle_types != CU_MEM_HANDLE_TYPE_NONE && !shareable)
            || props.usage != 0
        {
            // As a device without these answers; the device attributes say
            // so too (MEMPOOL_SUPPORTED_HANDLE_TYPES is 0).
            SAID.call_once(|| {
                eprintln!(
                    "cumux: memory pools of host memory, with IPC handles other than file \
                     descriptors of a GPU, or with usage flags are not supported \
                     (CUDA_ERROR_NOT_SUPPORTED)"
                )
            });
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        // As NVIDIA's driver holds a limit (measured on 580): whole granules,
        // and never below 32 MiB (a 1 MiB limit took 32 allocations of 1 MiB).
        let granule = c
            .device(device as i32)?
            .vmm_granularity
            .map_or(POOL_GRANULE, |(minimum, _)| minimum.max(1));
        let max_size = match props.max_size as u64 {
            0 => 0,
            asked => asked.next_multiple_of(granule).max(MIN_POOL_LIMIT),
        };
        let handle = c.mint();
        let mut made = Pool::new(device, false, max_size, props.handle_types);
        if shareable {
            made.share_id = pool_ipc::new_share_id();
        }
        c.lock().pools.insert(handle, made);
        out(pool, handle as *mut c_void)
    }

    fn cuMemPoolDestroy(pool: *mut c_void) {
        if let Some(listener) = client()?.lock().pools.destroy(pool_handle(pool))? {
            pool_ipc::stop(listener);
        }
        Ok(())
    }

    fn cuMemPoolExportToShareableHandle(handle_out: *mut c_void, pool: *mut c_void, handle_type: u32, flags: u64) {
        let c = client()?;
        non_null(handle_out)?;
        if flags != 0 || handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let devices = c.devices.len();
        let mut st = c.lock();
        let p = st.pools.get(pool_handle(pool), devices)?;
        if p.share_id == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if p.listener.is_none() {
            let uuid = c.device(p.device as i32)?.uuid;
            p.listener = Some(pool_ipc::listen(c, p.share_id, uuid)?);
        }
        let fd = p.listener.as_ref().map(pool_ipc::program_copy).ok_or(CUDA_ERROR_UNKNOWN)??;
        out(handle_out.cast::<i32>(), fd)
    }

    fn cuMemPoolImportFromShareableHandle(pool_out: *mut *mut c_void, handle: *mut c_void, handle_type: u32, flags: u64) {
        let c = client()?;
        non_null(pool_out)?;
        if flags != 0 || handle_type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let name = pool_ipc::socket_name(pool_ipc::program_fd(handle as usize)?)?;
        // The exporter's device, as this process numbers it; no context needed.
        let uuid = pool_ipc::pool_device(&name)?;
        let device = c
            .devices
            .iter()
            .position(|d| d.uuid == uuid)
            .ok_or(CUDA_ERROR_INVALID_DEVICE)? as u32;
        let mut imported = Pool::new(device, false, 0, handle_type);
        imported.imported_from = Some(name);
        let h = c.mint();
        c.lock().pools.insert(h, imported);
        out(pool_out, h as *mut c_void)
    }

    fn cuMemPoolExportPointer(data_out: *mut CUmemPoolPtrExportData, ptr: u64) {
        let c = client()?;
        let devices = c.devices.len();
        let mut st = c.lock();
        let shared = st.pools.shared.get(&ptr).copied().ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let p = st.pools.get(shared.pool, devices)?;
        if p.share_id == 0 || p.imported_from.is_some() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let data = pool_ipc::export_data(p.share_id, ptr);
        drop(st);
        host_bytes_mut(data_out.cast(), data.len())?.copy_from_slice(&data);
        Ok(())
    }

    fn cuMemPoolImportPointer(ptr_out: *mut u64, pool: *mut c_void, data: *mut CUmemPoolPtrExportData) {
        let c = client()?;
        non_null(ptr_out)?;
        let data: [u8; 64] = host_bytes(data.cast_const().cast(), 64)?.try_into().map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        if pool_ipc::parse_export_data(&data).is_none() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let devices = c.devices.len();
        let handle = pool_handle(pool);
        let (name, device, access) = {
            let mut st = c.lock();
            let p = st.pools.get(handle, devices)?;
            let name = p.imported_from.clone().ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let access: Vec<u32> = std::iter::once(p.device).chain(p.peers.keys().copied()).collect();
            (name, p.device, access)
        };
        let ptr = pool_ipc::import(c, handle, &name, &data, device, &access)?;
        out(ptr_out, ptr)
    }

    fn cuMemPoolTrimTo(pool: *mut c_void, _keep: usize) {
        // Freed memory goes back at once: nothing is held to trim.
        let c = client()?;
        let devices = c.devices.len();
        c.lock().pools.get(pool_handle(pool), devices).map(|_| ())
    }

    fn cuMemPoolSetAttribute(pool: *mut c_void, attr: u32, value: *mut c_void) {
        let c = client()?;
        non_null(value)?;
        let devices = c.devices.len();
        let mut st = c.lock();
        let p = st.pools.get(pool_handle(pool), devices)?;
        let v = match attr {
            // The reuse policies are ints, the rest 64-bit.
            1..=3 => *read_in(value.cast::<i32>())? as u64,
            _ => *read_in(value.cast::<u64>())?,
        };
        p.set_attribute(attr, v)
    }

    fn cuMemPoolGetAttribute(pool: *mut c_void, attr: u32, value: *mut c_void) {
        let c = client()?;
        let devices = c.devices.len();
        let v = c.lock().pools.get(pool_handle(pool), devices)?.attribute(attr)?;
        match attr {
            1..=3 | CU_MEMPOOL_ATTR_ALLOCATION_TYPE | CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES
            | CU_MEMPOOL_ATTR_LOCATION_ID | CU_MEMPOOL_ATTR_LOCATION_TYPE
            | CU_MEMPOOL_ATTR_HW_DECOMPRESS_ENABLED => out(value.cast::<i32>(), v as i32),
            _ => out(value.cast::<u64>(), v),
        }
    }

    fn cuMemPoolSetAccess(pool: *mut c_void, map: *const c_void, count: usize) {
        let c = client()?;
        for (location, flags) in super::vmm::access_descs(map, count)? {
            let peer = device_at(c, location)?;
            set_peer_access(c, pool_handle(pool), peer, flags)?;
        }
        Ok(())
    }

    fn cuMemPoolGetAccess(flags: *mut u32, pool: *mut c_void, location: *mut c_void) {
        let c = client()?;
        let location = read_in(location.cast::<MemLocation>())?;
        let device = device_at(c, *location)?;
        let devices = c.devices.len();
        let mut st = c.lock();
        let p = st.pools.get(pool_handle(pool), devices)?;
        let granted = match device == p.device {
            true => ACCESS_READWRITE,
            false => p.peers.get(&device).copied().unwrap_or(ACCESS_NONE),
        };
        out(flags, granted)
    }
}
