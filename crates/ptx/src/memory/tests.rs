//! Tests of the device's global memory: allocation, virtual memory, host
//! mappings and the copies across them.

use super::*;

/// Host bytes of a test's own.
struct TestHost {
    ptr: *mut u8,
    len: usize,
}

impl TestHost {
    fn new(len: usize) -> Arc<TestHost> {
        let bytes = Box::leak(vec![0u8; len].into_boxed_slice());
        Arc::new(TestHost {
            ptr: bytes.as_mut_ptr(),
            len,
        })
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are the leaked box's, given back once.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

// SAFETY: the bytes are the leaked box's, freed only when this drops.
unsafe impl Send for TestHost {}
// SAFETY: as for Send.
unsafe impl Sync for TestHost {}
// SAFETY: `ptr` holds `len` bytes until drop.
unsafe impl HostBytes for TestHost {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn size(&self) -> u64 {
        self.len as u64
    }
}

#[test]
fn host_memory_is_reached_at_the_programs_address_and_is_not_device_memory() {
    let mem = DeviceMemory::numbered(1 << 20, 0).unwrap();
    let dev = mem.alloc(4096).unwrap();
    let host = TestHost::new(8192);
    let at = 0x7f00_0000_0000;
    mem.map_host(at, host.clone()).unwrap();
    assert_eq!(mem.used(), 4096, "host memory is not device memory");
    // Copies and fills reach it, and its bytes are the host's own.
    mem.fill(at, &[0xab], 16).unwrap();
    mem.copy(dev, at, 16).unwrap();
    let mut out = [0u8; 16];
    mem.read(dev, &mut out).unwrap();
    assert_eq!(out, [0xab; 16]);
    // SAFETY: the test's own bytes, 8192 of them.
    assert_eq!(unsafe { *host.ptr.add(15) }, 0xab);
    assert_eq!(mem.range(at + 100), Some((at, 8192)));
    // Not freed as an allocation, not over it, not in any device window.
    assert!(mem.free(at).is_err());
    assert!(mem.map_host(at + 4096, TestHost::new(16)).is_err());
    assert!(mem
        .map_host(DEVICE_VA_BASE + (1 << 40), TestHost::new(16))
        .is_err());
    assert!(mem.unmap(at).is_err(), "not a VMM mapping");
    mem.unmap_host(at).unwrap();
    assert!(mem.read(at, &mut out).is_err());
    assert!(
        mem.unmap_host(dev).is_err(),
        "an allocation is not host memory"
    );
    assert_eq!(Arc::strong_count(&host), 1, "the memory let go of it");
}

#[test]
fn allocations_come_back_at_their_addresses_and_placements_in_order() {
    let source = DeviceMemory::numbered(1 << 20, 1).unwrap();
    let a = source.alloc(100).unwrap();
    let b = source.alloc(300).unwrap();
    // Another memory of the same window takes them where they were, and
    // later allocations go above them.
    let target = DeviceMemory::numbered(1 << 20, 1).unwrap();
    target.alloc_at(b, 300).unwrap();
    target.alloc_at(a, 100).unwrap();
    assert!(target.alloc(1).unwrap() > b);
    // Not over another block, not outside the window, not misaligned.
    assert!(target.alloc_at(a, 16).is_err());
    assert!(target.alloc_at(b + 256, 16).is_err());
    assert!(target.alloc_at(a + 8, 16).is_err());
    assert!(target.alloc_at(DEVICE_VA_BASE, 16).is_err());
    // Placed allocations take the listed addresses, then the bump goes on.
    let c = b + (1 << 16);
    assert_eq!(target.place_next(&[c]), 0);
    assert_eq!(target.alloc(64).unwrap(), c);
    assert!(target.alloc(64).unwrap() > c);
    assert_eq!(target.place_next(&[c, c + 4096]), 0);
    assert!(target.alloc(64).is_err(), "taken already");
    assert_eq!(target.place_next(&[]), 1);
}

#[test]
fn a_session_moved_in_from_a_gpu_keeps_the_addresses_its_driver_chose() {
    let memory = DeviceMemory::numbered(1 << 20, 0).unwrap();
    let gpu = 0x7f3a_1260_0000;
    memory.alloc_at(gpu, 4096).unwrap();
    memory.write(gpu + 8, &[1, 2, 3]).unwrap();
    let mut back = [0u8; 3];
    memory.read(gpu + 8, &mut back).unwrap();
    assert_eq!(back, [1, 2, 3]);
    assert_eq!(memory.range(gpu + 100), Some((gpu, 4096)));
    // Later allocations stay in the device's own window.
    let next = memory.alloc(64).unwrap();
    assert!((memory.window().0..memory.window().1).contains(&next));
    // Not over the ranges the CPU device gives a meaning to, nor low.
    assert!(memory.alloc_at(crate::LOCAL_WINDOW, 256).is_err());
    assert!(memory.alloc_at(crate::SHARED_WINDOW + 4096, 256).is_err());
    assert!(memory.alloc_at(crate::LOCAL_WINDOW - 256, 512).is_err());
    assert!(memory.alloc_at(DEVICE_VA_END - 256, 512).is_err());
    assert!(memory.alloc_at(0x1000, 256).is_err());
    assert!(memory.alloc_at(gpu + 256, 16).is_err(), "over a block");
    memory.free(gpu).unwrap();
    assert_eq!(memory.used(), 256);
}

#[test]
fn numbered_devices_hand_out_addresses_in_windows_of_their_own() {
    let zero = DeviceMemory::numbered(1 << 20, 0).unwrap();
    let two = DeviceMemory::numbered(8 << 20, 2).unwrap();
    let a = zero.alloc(64).unwrap();
    let b = two.alloc(64).unwrap();
    assert!((DEVICE_VA_BASE..DEVICE_VA_BASE + DEVICE_WINDOW_BYTES).contains(&a));
    assert_eq!(b, DEVICE_VA_BASE + 2 * DEVICE_WINDOW_BYTES);
    // Device 2 maps nothing in device 0's window, and there are 16 windows.
    let reserved = zero.reserve(VMM_GRANULARITY, 0).unwrap();
    let id = two.create_physical(VMM_GRANULARITY).unwrap();
    assert!(two.map(reserved, VMM_GRANULARITY, id).is_err());
    assert!(DeviceMemory::numbered(1, MAX_WINDOWS - 1).is_some());
    assert!(DeviceMemory::numbered(1, MAX_WINDOWS).is_none());
}

#[test]
fn alloc_free_read_write() {
    let m = DeviceMemory::new(1 << 20);
    assert_eq!(m.alloc(0), Err(MemError::InvalidSize));
    let a = m.alloc(100).unwrap();
    let b = m.alloc(1000).unwrap();
    assert!(a >= DEVICE_VA_BASE && a.is_multiple_of(256) && b.is_multiple_of(256) && b > a + 100);
    assert_eq!(m.range(a + 50), Some((a, 100)));
    assert_eq!(m.range(a + 100), None);
    let mut buf = [1u8; 100];
    m.read(a, &mut buf).unwrap();
    assert_eq!(buf, [0u8; 100]);
    m.write(a + 10, b"hello").unwrap();
    m.copy(a + 12, a + 10, 5).unwrap(); // overlapping
    m.read(a + 10, &mut buf[..7]).unwrap();
    assert_eq!(&buf[..7], b"hehello");
    assert!(matches!(
        m.write(a + 98, b"xyz"),
        Err(MemError::OutOfRange { .. })
    ));
    m.fill(b, &[1, 2], 3).unwrap();
    m.fill(b + 6, &[9, 8, 7, 6], 1).unwrap();
    m.read(b, &mut buf[..10]).unwrap();
    assert_eq!(&buf[..10], &[1, 2, 1, 2, 1, 2, 9, 8, 7, 6]);
    assert_eq!(m.fill(b, &[1, 2, 3], 1), Err(MemError::InvalidSize));
    assert_eq!(m.free(a + 1), Err(MemError::InvalidAddress(a + 1)));
    assert_eq!(m.used(), 256 + 1024);
    m.free(a).unwrap();
    assert_eq!(m.free(a), Err(MemError::InvalidAddress(a)));
    assert_eq!(m.alloc(1 << 20), Err(MemError::OutOfMemory));
    assert_eq!(MemError::OutOfMemory.cu_code(), 2);
    m.free(b).unwrap();
    assert_eq!(m.used(), 0);
}

#[test]
fn alloc_does_not_wait_for_a_launch() {
    let m = DeviceMemory::new(1 << 20);
    let a = m.alloc(64).unwrap();
    let view = m.view(); // what a running launch holds
    let b = m.alloc(64).unwrap();
    m.write(b, &[7; 64]).unwrap();
    assert!(view.resolve(b, 64).is_some());
    assert!(view.resolve(a, 64).is_some());
    drop(view);
    m.free(b).unwrap();
    m.free(a).unwrap();
}

#[test]
fn mappings_side_by_side_read_and_write_as_one_range() {
    const G: u64 = VMM_GRANULARITY;
    let m = DeviceMemory::new(8 * G);
    let plain = m.alloc(100).unwrap();
    let base = m.reserve(4 * G, 0).unwrap();
    assert!(base.is_multiple_of(G) && base > plain);
    let (a, b) = (m.create_physical(G).unwrap(), m.create_physical(G).unwrap());
    assert_eq!(m.used(), 256 + 2 * G);
    m.map(base, G, a).unwrap();
    m.map(base + G, G, b).unwrap();
    // A mapping may not meet another, nor an allocation.
    assert!(m.map(base + G, G, a).is_err());
    assert!(m.map(plain, G, a).is_err());
    assert_eq!(m.map(base + 2 * G, 2 * G, a), Err(MemError::InvalidSize));
    // Host copies across the boundary, all or nothing.
    let edge = base + G - 3;
    m.write(edge, b"abcdef").unwrap();
    let mut buf = [0u8; 6];
    m.read(edge, &mut buf).unwrap();
    assert_eq!(&buf, b"abcdef");
    m.copy(edge + 1, edge, 6).unwrap();
    m.read(edge, &mut buf).unwrap();
    assert_eq!(&buf, b"aabcde");
    m.fill(base + G - 4, &[1, 2, 3, 4], 2).unwrap();
    let mut filled = [0u8; 8];
    m.read(base + G - 4, &mut filled).unwrap();
    assert_eq!(filled, [1, 2, 3, 4, 1, 2, 3, 4]);
    assert!(m.write(base + 2 * G - 2, b"past").is_err());
    m.read(base + 2 * G - 2, &mut buf[..2]).unwrap();
    assert_eq!(&buf[..2], &[0, 0]);
    // The same physical memory at a second place aliases the first.
    m.map(base + 3 * G, G, a).unwrap();
    m.read(base + 4 * G - 3, &mut buf[..3]).unwrap();
    assert_eq!(&buf[..3], &[2, 3, 4]);
    assert_eq!(m.free(base), Err(MemError::InvalidAddress(base)));
    // Released while mapped: the bytes live until the last mapping goes.
    m.release_physical(a).unwrap();
    m.read(base, &mut buf[..1]).unwrap();
    for at in [base, base + G, base + 3 * G] {
        m.unmap(at).unwrap();
    }
    assert_eq!(m.unmap(base), Err(MemError::InvalidAddress(base)));
    assert!(m.read(base, &mut buf[..1]).is_err());
    m.release_physical(b).unwrap();
    assert_eq!(m.release_physical(b), Err(MemError::InvalidAddress(b)));
    m.free(plain).unwrap();
    assert_eq!(m.used(), 0);
    assert_eq!(m.create_physical(9 * G), Err(MemError::OutOfMemory));
    assert_eq!(m.reserve(G, 3), Err(MemError::InvalidSize));
}
