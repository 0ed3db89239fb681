//! Virtual memory management over the real protocol: reservations, physical
//! allocations and their mappings on the model and CPU devices — the
//! expandable-segments pattern (handles mapped side by side, copies and a
//! kernel across the boundary), the driver's error codes for misaligned or
//! malformed calls, quotas, other sessions' handles and ranges, teardown.

mod common;

use std::sync::Arc;

use common::*;
use cumux_protocol::vmm::{ACCESS_READ, ACCESS_READWRITE, HANDLE_TYPE_POSIX_FD};
use cumux_protocol::*;
use cumux_server::tenants::{TenantPolicy, TenantSettings};
use cumux_server::Device;

/// The granularity of the model and CPU devices.
const G: u64 = 2 << 20;

fn vmm(c: &mut Client, call: VmmCall) -> Result<ReplyBody, CuError> {
    c.call(Call::Vmm(call))
}

fn code(c: &mut Client, call: VmmCall) -> u32 {
    c.code(Call::Vmm(call))
}

fn reserve(c: &mut Client, size: u64) -> DevicePtr {
    let call = VmmCall::Reserve {
        size,
        alignment: 0,
        hint: 0,
    };
    match vmm(c, call).unwrap() {
        ReplyBody::Ptr(p) => p,
        other => panic!("{other:?}"),
    }
}

fn try_create(c: &mut Client, size: u64) -> Result<Handle, u32> {
    let call = VmmCall::Create {
        device: 0,
        size,
        handle_types: HANDLE_TYPE_POSIX_FD,
        compressed: false,
    };
    match vmm(c, call) {
        Ok(ReplyBody::Handle(h)) => Ok(h),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e.code),
    }
}

fn create(c: &mut Client, size: u64) -> Handle {
    try_create(c, size).unwrap()
}

fn map(c: &mut Client, ptr: DevicePtr, size: u64, handle: Handle) -> u32 {
    code(
        c,
        VmmCall::Map {
            ptr,
            size,
            offset: 0,
            handle,
        },
    )
}

fn set_access(c: &mut Client, ptr: DevicePtr, size: u64, flags: u64) -> u32 {
    code(
        c,
        VmmCall::SetAccess {
            ptr,
            size,
            device: 0,
            flags,
        },
    )
}

fn value(c: &mut Client, call: VmmCall) -> u64 {
    match vmm(c, call).unwrap() {
        ReplyBody::Value(v) => v,
        other => panic!("{other:?}"),
    }
}

/// A reservation of `handles + 2` granules with `handles` physical
/// allocations of one granule mapped side by side from its start, writable.
fn expandable_segment(c: &mut Client, handles: usize) -> (DevicePtr, Vec<Handle>) {
    let base = reserve(c, (handles as u64 + 2) * G);
    let made: Vec<Handle> = (0..handles).map(|_| create(c, G)).collect();
    for (i, h) in made.iter().enumerate() {
        assert_eq!(map(c, base + i as u64 * G, G, *h), codes::SUCCESS);
    }
    let size = handles as u64 * G;
    assert_eq!(set_access(c, base, size, ACCESS_READWRITE), codes::SUCCESS);
    (base, made)
}

#[test]
fn handles_mapped_side_by_side_read_and_write_as_one_range() {
    let h = Harness::start("vmm-pattern");
    let mut c = h.client();
    for recommended in [false, true] {
        let granularity = value(
            &mut c,
            VmmCall::Granularity {
                device: 0,
                recommended,
            },
        );
        assert_eq!(granularity, G);
    }
    let (base, handles) = expandable_segment(&mut c, 2);
    assert_eq!(base % G, 0);
    assert_eq!(h.device.mem_used(), 2 * G);
    // Across the boundary: a write, a read, a device copy and a memset.
    let edge = base + G - 6;
    c.write(edge, b"across the edge");
    assert_eq!(c.read(edge, 15).unwrap(), b"across the edge");
    let copy = Call::MemcpyDtoD {
        dst: edge + 100,
        src: edge,
        bytes: 15,
        stream: None,
    };
    assert_eq!(c.code(copy), codes::SUCCESS);
    assert_eq!(c.read(edge + 100, 15).unwrap(), b"across the edge");
    assert_eq!(c.code(memset_call(edge, 0x2a, 1, 8, None)), codes::SUCCESS);
    assert_eq!(c.read(edge, 9).unwrap(), b"********h");
    // The second handle's memory starts at the boundary.
    c.write(base + G, &[7; 4]);
    assert_eq!(c.read(base + G - 2, 6).unwrap(), [42, 42, 7, 7, 7, 7]);
    // Pointer queries see each mapping.
    match c.call(Call::MemAddressRange { ptr: base + G + 5 }).unwrap() {
        ReplyBody::Range { base: b, size } => assert_eq!((b, size), (base + G, G)),
        other => panic!("{other:?}"),
    }
    let access = VmmCall::GetAccess {
        ptr: base + 3,
        device: 0,
    };
    assert_eq!(value(&mut c, access), ACCESS_READWRITE);
    // Properties, and a handle retained from an address.
    match vmm(&mut c, VmmCall::Properties { handle: handles[1] }).unwrap() {
        ReplyBody::VmmProperties(p) => assert_eq!(p.handle_types, HANDLE_TYPE_POSIX_FD),
        other => panic!("{other:?}"),
    }
    match vmm(&mut c, VmmCall::Retain { ptr: base + G + 9 }).unwrap() {
        ReplyBody::Handle(retained) => assert_eq!(retained, handles[1]),
        other => panic!("{other:?}"),
    }
    let release = |c: &mut Client, handle| code(c, VmmCall::Release { handle });
    assert_eq!(release(&mut c, handles[1]), codes::SUCCESS);
    // Unmapped in one call, released, freed: the device's memory is back.
    let unmap = VmmCall::Unmap {
        ptr: base,
        size: 2 * G,
    };
    assert_eq!(code(&mut c, unmap), codes::SUCCESS);
    assert_eq!(c.read(base, 4).unwrap_err().code, codes::INVALID_VALUE);
    assert_eq!(h.device.mem_used(), 2 * G, "still referenced");
    for handle in &handles {
        assert_eq!(release(&mut c, *handle), codes::SUCCESS);
    }
    assert_eq!(h.device.mem_used(), 0);
    let free = VmmCall::Free {
        ptr: base,
        size: 4 * G,
    };
    assert_eq!(code(&mut c, free.clone()), codes::SUCCESS);
    assert_eq!(code(&mut c, free), codes::INVALID_VALUE);
    drop(c);
    h.all_released();
}

#[test]
fn misaligned_and_malformed_calls_get_the_drivers_codes() {
    let h = Harness::start("vmm-codes");
    let mut c = h.client();
    let create = |device, size, handle_types| VmmCall::Create {
        device,
        size,
        handle_types,
        compressed: false,
    };
    assert_eq!(code(&mut c, create(0, G + 1, 0)), codes::INVALID_VALUE);
    assert_eq!(code(&mut c, create(0, 0, 0)), codes::INVALID_VALUE);
    assert_eq!(code(&mut c, create(1, G, 0)), codes::INVALID_DEVICE);
    // Fabric handles (8) are not offered.
    assert_eq!(code(&mut c, create(0, G, 8)), codes::NOT_SUPPORTED);
    let reserve_call = |size, alignment, hint| VmmCall::Reserve {
        size,
        alignment,
        hint,
    };
    assert_eq!(code(&mut c, reserve_call(1000, 0, 0)), codes::INVALID_VALUE);
    // One page is refused too (measured on NVIDIA's driver): granules only.
    assert_eq!(code(&mut c, reserve_call(4096, 0, 0)), codes::INVALID_VALUE);
    assert_eq!(code(&mut c, reserve_call(0, 0, 0)), codes::INVALID_VALUE);
    assert_eq!(code(&mut c, reserve_call(G, 3, 0)), codes::INVALID_VALUE);
    assert_eq!(code(&mut c, reserve_call(G, 0, 12)), codes::INVALID_VALUE);
    let base = reserve(&mut c, 4 * G);
    let handle = try_create(&mut c, 2 * G).unwrap();
    let map_at = |ptr, size, offset| VmmCall::Map {
        ptr,
        size,
        offset,
        handle,
    };
    for (ptr, size, offset) in [
        (base + 4096, G, 0),      // not at a granule
        (base, G + 4096, 0),      // not granules
        (base + 3 * G, 2 * G, 0), // past the reservation
        (base - 2 * G, 2 * G, 0), // outside it
    ] {
        let what = format!("map [{ptr:#x}, +{size}) from {offset}");
        let call = map_at(ptr, size, offset);
        assert_eq!(code(&mut c, call), codes::INVALID_VALUE, "{what}");
    }
    // An offset, or more than the handle has: "not supported", as the driver says.
    for (size, offset) in [(G, G), (4 * G, 0)] {
        let call = map_at(base, size, offset);
        assert_eq!(
            code(&mut c, call),
            codes::NOT_SUPPORTED,
            "{size} from {offset}"
        );
    }
    assert_eq!(map(&mut c, base, 2 * G, handle), codes::SUCCESS);
    // Nothing maps over a mapping.
    let other = try_create(&mut c, G).unwrap();
    assert_eq!(map(&mut c, base + G, G, other), codes::INVALID_VALUE);
    // Mapped memory is out of reach until access is set, read-only as set.
    assert_eq!(c.read(base, 4).unwrap_err().code, codes::INVALID_VALUE);
    assert_eq!(set_access(&mut c, base, 2 * G, 2), codes::INVALID_VALUE);
    assert_eq!(
        set_access(&mut c, base, 3 * G, ACCESS_READ),
        codes::INVALID_VALUE
    );
    assert_eq!(
        set_access(&mut c, base + G, G, ACCESS_READ),
        codes::INVALID_VALUE
    );
    assert_eq!(set_access(&mut c, base, 2 * G, ACCESS_READ), codes::SUCCESS);
    assert_eq!(c.read(base, 4).unwrap(), [0; 4]);
    let write = Call::MemcpyHtoD {
        dst: base,
        data: vec![1; 4],
        stream: None,
    };
    assert_eq!(c.code(write), codes::INVALID_VALUE);
    // Unmapping part of a mapping, or past the reservation, is refused;
    // a range with nothing mapped is unmapped without complaint.
    for (ptr, size) in [(base, G), (base + G, G), (base, 5 * G)] {
        let unmap = VmmCall::Unmap { ptr, size };
        let what = format!("[{ptr:#x}, +{size})");
        assert_eq!(code(&mut c, unmap), codes::INVALID_VALUE, "{what}");
    }
    let unmap_empty = VmmCall::Unmap {
        ptr: base + 2 * G,
        size: 2 * G,
    };
    assert_eq!(code(&mut c, unmap_empty), codes::SUCCESS);
    assert_eq!(c.read(base, 4).unwrap(), [0; 4], "still mapped");
    // A reservation with mappings, or named by a wrong size, stays.
    let free = |size| VmmCall::Free { ptr: base, size };
    assert_eq!(code(&mut c, free(4 * G)), codes::INVALID_VALUE);
    assert_eq!(
        code(&mut c, VmmCall::Retain { ptr: base + 2 * G }),
        codes::INVALID_VALUE
    );
    let unmap = VmmCall::Unmap {
        ptr: base,
        size: 2 * G,
    };
    assert_eq!(code(&mut c, unmap), codes::SUCCESS);
    assert_eq!(code(&mut c, free(2 * G)), codes::INVALID_VALUE);
    assert_eq!(code(&mut c, free(4 * G)), codes::SUCCESS);
    for h in [handle, other] {
        assert_eq!(code(&mut c, VmmCall::Release { handle: h }), codes::SUCCESS);
        assert_eq!(
            code(&mut c, VmmCall::Release { handle: h }),
            codes::INVALID_VALUE
        );
        assert_eq!(
            code(&mut c, VmmCall::Properties { handle: h }),
            codes::INVALID_VALUE
        );
    }
    // The session still works.
    assert_client_works(c, b"still here");
    h.all_released();
}

#[test]
fn physical_memory_counts_against_the_quota_until_its_last_use() {
    let mut policy = TenantPolicy::default();
    let quota = TenantSettings {
        memory_quota: Some(3 * G),
        ..TenantSettings::default()
    };
    policy.tenants.insert("team-a".into(), quota);
    let h = Harness::start_with("vmm-quota", policy, 1);
    let mut c = h.client();
    let (base, handles) = expandable_segment(&mut c, 2);
    let third = create(&mut c, G);
    assert_eq!(try_create(&mut c, G), Err(codes::OUT_OF_MEMORY));
    let free_bytes = |c: &mut Client| match c.call(Call::MemGetInfo { device: 0 }).unwrap() {
        ReplyBody::MemInfo { free, .. } => free,
        other => panic!("{other:?}"),
    };
    assert_eq!(free_bytes(&mut c), 0);
    // Released while mapped: the memory stays, and so does its charge.
    for handle in handles {
        assert_eq!(code(&mut c, VmmCall::Release { handle }), codes::SUCCESS);
    }
    assert_eq!(free_bytes(&mut c), 0);
    c.write(base + G - 2, &[5; 4]);
    let unmap = VmmCall::Unmap { ptr: base, size: G };
    assert_eq!(code(&mut c, unmap), codes::SUCCESS);
    assert_eq!(free_bytes(&mut c), G);
    assert_eq!(c.read(base + G, 2).unwrap(), [5, 5]);
    assert_eq!(
        code(&mut c, VmmCall::Release { handle: third }),
        codes::SUCCESS
    );
    assert_eq!(free_bytes(&mut c), 2 * G);
    drop(c);
    h.all_released();
}

#[test]
fn another_sessions_handles_and_ranges_are_unknown() {
    let h = Harness::start("vmm-foreign");
    let mut a = h.client();
    let (base, handles) = expandable_segment(&mut a, 1);
    a.write(base, b"mine");
    let mut b = h.client();
    let own = b.alloc(64);
    assert_foreign_refused(&mut b, base, own);
    let theirs = handles[0];
    let b_base = reserve(&mut b, 2 * G);
    let refused = [
        VmmCall::Map {
            ptr: b_base,
            size: G,
            offset: 0,
            handle: theirs,
        },
        VmmCall::Release { handle: theirs },
        VmmCall::Properties { handle: theirs },
        VmmCall::Retain { ptr: base },
        VmmCall::Unmap { ptr: base, size: G },
        VmmCall::SetAccess {
            ptr: base,
            size: G,
            device: 0,
            flags: ACCESS_READWRITE,
        },
        VmmCall::GetAccess {
            ptr: base,
            device: 0,
        },
        VmmCall::Free {
            ptr: base,
            size: 3 * G,
        },
    ];
    for call in refused {
        let what = format!("{call:?}");
        assert_eq!(code(&mut b, call), codes::INVALID_VALUE, "{what}");
    }
    // A mapping in B's reservation is B's, and A's memory is untouched.
    let mine = create(&mut b, G);
    assert_eq!(map(&mut b, b_base, G, mine), codes::SUCCESS);
    assert_eq!(a.read(base, 4).unwrap(), b"mine");
    drop((a, b));
    h.all_released();
}

#[test]
fn a_session_that_ends_with_live_mappings_gives_everything_back() {
    let h = Harness::start("vmm-teardown");
    let mut c = h.client();
    let (base, handles) = expandable_segment(&mut c, 3);
    // A released handle still mapped, a retained one, an unmapped one.
    assert_eq!(
        code(&mut c, VmmCall::Release { handle: handles[0] }),
        codes::SUCCESS
    );
    vmm(&mut c, VmmCall::Retain { ptr: base + G }).unwrap();
    create(&mut c, G);
    reserve(&mut c, 16 * G);
    c.alloc(4096);
    assert_eq!(h.device.mem_used(), 4 * G + 4096);
    drop(c);
    h.all_released();
    assert!(h.server.accounts().all().is_empty());
}

/// The parameters of `vector_add(a, b, c, n)` laid out as the kernel says.
fn vector_add_params(ptrs: [u64; 3], n: i32, layout: &[ParamInfo]) -> Vec<u8> {
    let size = layout.last().map_or(0, |p| p.offset + p.size) as usize;
    let mut params = vec![0u8; size];
    let values = ptrs
        .iter()
        .map(|p| p.to_le_bytes().to_vec())
        .chain([n.to_le_bytes().to_vec()]);
    for (p, bytes) in layout.iter().zip(values) {
        params[p.offset as usize..][..p.size as usize].copy_from_slice(&bytes[..p.size as usize]);
    }
    params
}

fn floats(v: impl Iterator<Item = f32>) -> Vec<u8> {
    v.flat_map(|f| f.to_le_bytes()).collect()
}

#[test]
fn a_cpu_kernel_reads_and_writes_across_two_mappings() {
    let (server, socket, _dir) = cpu_server("vmm-cpu", 64 << 20);
    let ptx = cumux_testkit::compile_ptx(cumux_testkit::corpus_source("vector_add"));
    let mut c = Client::connect(&socket, "vmm-cpu", None);
    let attr = |c: &Client, n| {
        c.devices[0]
            .attributes
            .iter()
            .find(|a| a.0 == n)
            .map(|a| a.1)
    };
    assert_eq!(
        attr(&c, 102),
        Some(1),
        "virtual memory management is supported"
    );
    let m = c.load_bytes(ptx.into_bytes());
    let f = m.functions[0].clone();
    let (base, handles) = expandable_segment(&mut c, 4);
    // Three arrays of n floats, each across a boundary between two handles.
    let n = 3000;
    let bytes = 4 * n as u64;
    let [a, b, out] = [1, 2, 3].map(|i| base + i * G - bytes / 2);
    c.write(a, &floats((0..n).map(|i| i as f32)));
    c.write(b, &floats((0..n).map(|i| 0.5 * i as f32)));
    let params = vector_add_params([a, b, out], n, &f.params);
    let grid = [(n as u32).div_ceil(128), 1, 1];
    c.post(launch_call(f.handle, grid, [128, 1, 1], params));
    assert_eq!(c.code(Call::ContextSynchronize), codes::SUCCESS);
    let expected = floats((0..n).map(|i| i as f32 + (0.5 * i as f32)));
    assert_eq!(c.read(out, bytes).unwrap(), expected);
    // One physical allocation at a second place aliases the first.
    let alias = base + 4 * G;
    assert_eq!(map(&mut c, alias, G, handles[2]), codes::SUCCESS);
    assert_eq!(
        set_access(&mut c, alias, G, ACCESS_READWRITE),
        codes::SUCCESS
    );
    assert_eq!(c.read(alias + G - bytes / 2, 8).unwrap(), expected[..8]);
    // Unmapped, the range faults for a kernel too.
    let unmap = VmmCall::Unmap {
        ptr: base,
        size: 4 * G,
    };
    assert_eq!(code(&mut c, unmap), codes::SUCCESS);
    let params = vector_add_params([a, b, out], 32, &f.params);
    c.post(launch_call(f.handle, [1, 1, 1], [32, 1, 1], params));
    assert_eq!(c.code(Call::ContextSynchronize), codes::ILLEGAL_ADDRESS);
    drop(c);
    let device = Arc::clone(&server.devices()[0]);
    eventually("memory to be released", || device.mem_used() == 0);
}
