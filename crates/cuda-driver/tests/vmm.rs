//! Virtual memory through the fake driver (tests/fake_libcuda.c): a
//! reservation, physical allocations mapped side by side and read as one
//! range, one allocation mapped twice, one exported as a descriptor and
//! imported again, everything given back.

mod common;

use common::{fake_context, fake_driver};
use cumux_cuda_driver::Stream;

#[test]
fn physical_memory_mapped_side_by_side_reads_as_one_range() {
    let Some(path) = fake_driver("fake_vmm", &["-DFAKE_QUIET"]) else {
        return;
    };
    let ctx = fake_context(&path);
    let g = ctx.vmm_granularity(false).unwrap();
    assert_eq!(g, 2 << 20);
    assert_eq!(ctx.vmm_granularity(true).unwrap(), g);
    let base = ctx.vmm_reserve(4 * g, 0).unwrap();
    assert_eq!(base % g, 0);
    let (a, b) = (
        ctx.vmm_create(g, false, false).unwrap(),
        ctx.vmm_create(g, true, false).unwrap(),
    );
    ctx.vmm_map(base, g, a).unwrap();
    ctx.vmm_map(base + g, g, b).unwrap();
    ctx.vmm_set_access(base, 2 * g, 3).unwrap();
    // Nothing maps over a mapping; an offset is not supported.
    assert_eq!(ctx.vmm_map(base, g, b).unwrap_err().code, 1);
    let stream = Stream::new(&ctx, 0, 0).unwrap();
    let edge = base + g - 4;
    stream.copy_htod_sync(edge, b"12345678", None).0.unwrap();
    let mut back = [0u8; 8];
    stream.copy_dtoh_sync(&mut back, edge, None).0.unwrap();
    assert_eq!(&back, b"12345678");
    // The first allocation at a second place reads the same bytes.
    ctx.vmm_map(base + 3 * g, g, a).unwrap();
    ctx.vmm_set_access(base + 3 * g, g, 1).unwrap();
    let mut alias = [0u8; 4];
    stream
        .copy_dtoh_sync(&mut alias, base + 4 * g - 4, None)
        .0
        .unwrap();
    assert_eq!(&alias, b"1234");
    // The shareable allocation leaves as a descriptor and comes back as
    // another handle to the same bytes; the other one is not shareable.
    assert!(ctx.vmm_export(a).is_err());
    let fd = ctx.vmm_export(b).unwrap();
    let imported = ctx.vmm_import(std::os::fd::AsFd::as_fd(&fd)).unwrap();
    ctx.vmm_map(base + 2 * g, g, imported).unwrap();
    ctx.vmm_set_access(base + 2 * g, g, 3).unwrap();
    let mut shared = [0u8; 4];
    stream
        .copy_dtoh_sync(&mut shared, base + 2 * g, None)
        .0
        .unwrap();
    let mut first = [0u8; 4];
    stream.copy_dtoh_sync(&mut first, base + g, None).0.unwrap();
    assert_eq!(shared, first);
    ctx.vmm_release(imported).unwrap();
    // Released while mapped, unmapped, the reservation freed.
    ctx.vmm_release(a).unwrap();
    ctx.vmm_release(b).unwrap();
    ctx.vmm_unmap(base, 4 * g).unwrap();
    ctx.vmm_address_free(base, 4 * g).unwrap();
}
