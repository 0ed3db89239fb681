//! Stream-ordered allocation and memory pools: `cuMemAllocAsync` and
//! `cuMemAllocFromPoolAsync` take device memory for a pool (its size limit
//! checked, its statistics kept in `state::pools`); pools are created with
//! the properties cumux can give (device memory, no IPC handles), and their
//! attributes and peers' access stick and read back.

use std::ffi::c_void;

use cumux_cuda_bindings::consts::*;

use super::copy::ready;
use super::cuda13x::MemLocation;
use super::memory::alloc_on;
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
    let device = st.pools.get(handle, devices)?.device;
    st.pools.room(handle, bytes as u64, devices)?;
    let capturing = st.capturing(stream);
    drop(st);
    let ptr = alloc_on(c, device, bytes)?;
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
            c.lock()
                .pools
                .get(handle, devices)?
                .peers
                .insert(peer, flags);
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
        if props.location.kind != CU_MEM_LOCATION_TYPE_DEVICE
            || props.handle_types != CU_MEM_HANDLE_TYPE_NONE
            || props.usage != 0
        {
            // As a device without these answers; the device attributes say
            // so too (MEMPOOL_SUPPORTED_HANDLE_TYPES is 0).
            SAID.call_once(|| {
                eprintln!(
                    "cumux: memory pools of host memory, with IPC handles or with usage flags \
                     are not supported (CUDA_ERROR_NOT_SUPPORTED)"
                )
            });
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let device = device_at(c, props.location)?;
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
        let made = Pool::new(device, false, max_size, props.handle_types);
        c.lock().pools.insert(handle, made);
        out(pool, handle as *mut c_void)
    }

    fn cuMemPoolDestroy(pool: *mut c_void) {
        client()?.lock().pools.destroy(pool_handle(pool))
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
