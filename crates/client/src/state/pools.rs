//! Stream-ordered memory pools as the program sees them: each pool's device,
//! properties and attributes as set, each device's current pool, and which
//! pool each allocation came from, for the pool's statistics and size limit.
//! cumux gives a pool's freed memory back at once, so what a pool reserves
//! is what it has in use. A pool other processes import keeps each
//! allocation as shareable virtual memory (`exports::pool_ipc`).

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use cumux_cuda_bindings::consts::*;

use crate::errors::*;

/// Where the handles of the devices' default pools start (device `d`'s is
/// this plus `d * 0x10`); created pools take minted handles.
pub const DEFAULT_POOL_BASE: usize = 0x7000_0000;

/// One pool.
#[derive(Debug)]
pub struct Pool {
    pub device: u32,
    /// A device's default pool: never destroyed.
    pub default: bool,
    /// Bytes the pool may hold at once (0: no limit of its own).
    pub max_size: u64,
    pub handle_types: u32,
    pub release_threshold: u64,
    /// `CU_MEMPOOL_ATTR_REUSE_*`, in attribute order (1, 2, 3).
    pub reuse: [i32; 3],
    pub used: u64,
    pub used_high: u64,
    pub reserved_high: u64,
    /// Peer devices given access (`cuMemPoolSetAccess`), with their flags.
    pub peers: HashMap<u32, u32>,
    /// What names a shareable pool to its importers (random; 0 for others).
    pub share_id: u64,
    /// The socket importers ask for allocations on, once exported.
    pub listener: Option<OwnedFd>,
    /// An imported pool: the exporter's socket (abstract name).
    pub imported_from: Option<Vec<u8>>,
}

impl Pool {
    pub fn new(device: u32, default: bool, max_size: u64, handle_types: u32) -> Pool {
        Pool {
            device,
            default,
            max_size,
            handle_types,
            release_threshold: 0,
            reuse: [1, 1, 1],
            used: 0,
            used_high: 0,
            reserved_high: 0,
            peers: HashMap::new(),
            share_id: 0,
            listener: None,
            imported_from: None,
        }
    }

    /// An attribute's value, widened to 64 bits (the caller writes an `int`
    /// for the reuse policies).
    pub fn attribute(&self, attr: u32) -> CuResult<u64> {
        Ok(match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                self.reuse[attr as usize - 1] as u64
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => self.release_threshold,
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT | CU_MEMPOOL_ATTR_USED_MEM_CURRENT => self.used,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => self.reserved_high,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH => self.used_high,
            CU_MEMPOOL_ATTR_ALLOCATION_TYPE => u64::from(CU_MEM_ALLOCATION_TYPE_PINNED),
            CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES => u64::from(self.handle_types),
            CU_MEMPOOL_ATTR_LOCATION_ID => u64::from(self.device),
            CU_MEMPOOL_ATTR_LOCATION_TYPE => u64::from(CU_MEM_LOCATION_TYPE_DEVICE),
            CU_MEMPOOL_ATTR_MAX_POOL_SIZE => self.max_size,
            CU_MEMPOOL_ATTR_HW_DECOMPRESS_ENABLED => 0,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        })
    }

    /// Sets an attribute: the reuse policies and the release threshold stick;
    /// the high-water marks only go back to 0 (to the current use for the
    /// reserved one, as the driver does); the rest are read-only.
    pub fn set_attribute(&mut self, attr: u32, value: u64) -> CuResult<()> {
        match attr {
            CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
            | CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                self.reuse[attr as usize - 1] = i32::from(value as i32 != 0)
            }
            CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => self.release_threshold = value,
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH if value == 0 => self.reserved_high = self.used,
            CU_MEMPOOL_ATTR_USED_MEM_HIGH if value == 0 => self.used_high = self.used,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        Ok(())
    }
}

/// Every pool the program knows, and where its allocations came from.
#[derive(Debug, Default)]
pub struct Pools {
    pools: HashMap<usize, Pool>,
    /// Each device's current pool (`cuDeviceSetMemPool`), if not its default.
    current: HashMap<u32, usize>,
    /// Allocation → (pool, bytes).
    from: HashMap<u64, (usize, u64)>,
    /// Allocations of shareable pools, made or imported, as virtual memory.
    pub shared: HashMap<u64, SharedAllocation>,
}

/// An allocation of a shareable pool (or imported from one): a physical
/// allocation mapped at its own reservation.
#[derive(Debug, Clone, Copy)]
pub struct SharedAllocation {
    pub pool: usize,
    /// The physical allocation (a `cuMemCreate` or import handle).
    pub physical: u64,
    /// Bytes reserved and mapped (whole granules).
    pub size: u64,
}

/// Device `device`'s default pool.
pub fn default_pool(device: u32) -> usize {
    DEFAULT_POOL_BASE + device as usize * 0x10
}

impl Pools {
    /// The pool `handle` names (a device's default one made at its first
    /// use, for a device below `devices`).
    pub fn get(&mut self, handle: usize, devices: usize) -> CuResult<&mut Pool> {
        let default = handle
            .checked_sub(DEFAULT_POOL_BASE)
            .filter(|off| off % 0x10 == 0 && off / 0x10 < devices)
            .map(|off| (off / 0x10) as u32);
        if let Some(device) = default {
            return Ok(self
                .pools
                .entry(handle)
                .or_insert_with(|| Pool::new(device, true, 0, 0)));
        }
        self.pools.get_mut(&handle).ok_or(CUDA_ERROR_INVALID_VALUE)
    }

    pub fn insert(&mut self, handle: usize, pool: Pool) {
        self.pools.insert(handle, pool);
    }

    /// Forgets a pool the program destroys (never a default one); its
    /// allocations stay valid until freed, as the driver keeps them. The
    /// socket it was exported on, to shut.
    pub fn destroy(&mut self, handle: usize) -> CuResult<Option<OwnedFd>> {
        match self.pools.get(&handle) {
            Some(p) if !p.default => {}
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        }
        let gone = self.pools.remove(&handle);
        self.current.retain(|_, p| *p != handle);
        Ok(gone.and_then(|p| p.listener))
    }

    /// Device `device`'s current pool.
    pub fn current(&self, device: u32) -> usize {
        self.current
            .get(&device)
            .copied()
            .unwrap_or_else(|| default_pool(device))
    }

    pub fn set_current(&mut self, device: u32, handle: usize) {
        self.current.insert(device, handle);
    }

    /// Whether `bytes` more fit under the pool's size limit.
    pub fn room(&mut self, handle: usize, bytes: u64, devices: usize) -> CuResult<()> {
        let pool = self.get(handle, devices)?;
        match pool.max_size {
            0 => Ok(()),
            max if pool.used.saturating_add(bytes) <= max => Ok(()),
            _ => Err(CUDA_ERROR_OUT_OF_MEMORY),
        }
    }

    /// `ptr` (of `bytes`) came from pool `handle`.
    pub fn took(&mut self, handle: usize, ptr: u64, bytes: u64) {
        if let Some(pool) = self.pools.get_mut(&handle) {
            pool.used += bytes;
            pool.used_high = pool.used_high.max(pool.used);
            pool.reserved_high = pool.reserved_high.max(pool.used);
        }
        self.from.insert(ptr, (handle, bytes));
    }

    /// `ptr` is freed: its pool (if it had one) holds it no more.
    pub fn gave_back(&mut self, ptr: u64) {
        if let Some((handle, bytes)) = self.from.remove(&ptr) {
            if let Some(pool) = self.pools.get_mut(&handle) {
                pool.used = pool.used.saturating_sub(bytes);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_stick_and_statistics_follow_the_allocations() {
        let mut pools = Pools::default();
        let h = default_pool(1);
        assert!(pools.get(h, 1).is_err(), "device 1 of a one-device client");
        let pool = pools.get(h, 2).unwrap();
        assert!(pool.default && pool.device == 1);
        pool.set_attribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, u64::MAX)
            .unwrap();
        pool.set_attribute(CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, 0)
            .unwrap();
        assert_eq!(
            pool.attribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD),
            Ok(u64::MAX)
        );
        assert_eq!(
            pool.attribute(CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC),
            Ok(0)
        );
        assert_eq!(
            pool.attribute(CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES),
            Ok(1)
        );
        // Read-only, and high-water marks set to anything but 0: refused.
        assert!(pool
            .set_attribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 0)
            .is_err());
        assert!(pool
            .set_attribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH, 5)
            .is_err());
        assert!(pool.set_attribute(99, 0).is_err());

        pools.took(h, 0x1000, 300);
        pools.took(h, 0x2000, 700);
        pools.gave_back(0x1000);
        pools.gave_back(0x9999);
        let pool = pools.get(h, 2).unwrap();
        assert_eq!(pool.attribute(CU_MEMPOOL_ATTR_USED_MEM_CURRENT), Ok(700));
        assert_eq!(
            pool.attribute(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
            Ok(700)
        );
        assert_eq!(pool.attribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH), Ok(1000));
        pool.set_attribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)
            .unwrap();
        assert_eq!(pool.attribute(CU_MEMPOOL_ATTR_USED_MEM_HIGH), Ok(700));
        assert!(pools.destroy(h).is_err(), "a default pool stays");
    }

    #[test]
    fn a_created_pool_limits_its_size_and_can_be_current() {
        let mut pools = Pools::default();
        pools.insert(0x55, Pool::new(0, false, 1024, 0));
        pools.room(0x55, 1024, 1).unwrap();
        pools.took(0x55, 0x1000, 1000);
        assert_eq!(pools.room(0x55, 25, 1), Err(CUDA_ERROR_OUT_OF_MEMORY));
        assert_eq!(pools.current(0), default_pool(0));
        pools.set_current(0, 0x55);
        assert_eq!(pools.current(0), 0x55);
        assert!(pools.destroy(0x55).unwrap().is_none());
        assert_eq!(pools.current(0), default_pool(0));
        assert!(pools.get(0x55, 1).is_err());
    }
}
