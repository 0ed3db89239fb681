//! One memory's allocation opened in another (`DeviceMemory::share`,
//! `open_shared`): both see the same bytes, the opener is not charged, and a
//! freed allocation opens nothing while an open one keeps its bytes.

use cumux_ptx::{DeviceMemory, MemError};

#[test]
fn an_opened_allocation_is_the_same_bytes_at_an_address_of_the_opener() {
    let exporter = DeviceMemory::new(1 << 20);
    let opener = DeviceMemory::new(1 << 20);
    let own = opener.alloc(4096).unwrap();
    let base = exporter.alloc(1000).unwrap();
    exporter.write(base, &[7; 1000]).unwrap();

    let shared = exporter.share(base).unwrap();
    assert_eq!(shared.size(), 1000);
    assert!(
        exporter.share(base + 256).is_err(),
        "only an allocation's base"
    );
    let used = opener.used();
    let at = opener.open_shared(&shared).unwrap();
    assert_ne!(at, own);
    assert_eq!(
        opener.used(),
        used,
        "the exporter's bytes, not the opener's"
    );
    assert_eq!(opener.range(at + 999), Some((at, 1000)));
    assert!(
        opener.range(at + 1000).is_none(),
        "no more than the allocation"
    );

    // Writes on either side are seen on the other.
    opener.write(at + 10, &[9; 4]).unwrap();
    let mut back = [0u8; 16];
    exporter.read(base + 8, &mut back).unwrap();
    assert_eq!(back[..2], [7, 7]);
    assert_eq!(back[2..6], [9; 4]);

    // The opener cannot free it, only close it; closing leaves the exporter's.
    assert_eq!(opener.free(at), Err(MemError::InvalidAddress(at)));
    opener.close_shared(at).unwrap();
    assert!(opener.range(at).is_none());
    assert!(opener.close_shared(at).is_err(), "closed once");
    exporter.read(base + 8, &mut back).unwrap();
    assert_eq!(back[2..6], [9; 4]);
}

#[test]
fn a_freed_allocation_opens_nothing_but_an_open_one_keeps_its_bytes() {
    let exporter = DeviceMemory::new(1 << 20);
    let opener = DeviceMemory::new(1 << 20);
    let base = exporter.alloc(512).unwrap();
    exporter.write(base, &[3; 512]).unwrap();
    let shared = exporter.share(base).unwrap();
    let at = opener.open_shared(&shared).unwrap();

    exporter.free(base).unwrap();
    assert!(shared.is_live(), "held by the opening");
    let mut back = [0u8; 512];
    opener.read(at, &mut back).unwrap();
    assert_eq!(back, [3; 512]);

    opener.close_shared(at).unwrap();
    assert!(!shared.is_live());
    assert!(opener.open_shared(&shared).is_err());
}

#[test]
fn an_imported_physical_allocation_maps_the_exporters_bytes() {
    const G: u64 = cumux_ptx::VMM_GRANULARITY;
    let exporter = DeviceMemory::new(8 * G);
    let importer = DeviceMemory::new(8 * G);
    let id = exporter.create_physical(G).unwrap();
    let va = exporter.reserve(G, 0).unwrap();
    exporter.map(va, G, id).unwrap();
    exporter.write(va + 100, &[5; 8]).unwrap();

    let shared = exporter.share_physical(id).unwrap();
    assert!(exporter.share_physical(id + 1).is_err());
    let used = importer.used();
    let mine = importer.import_physical(&shared).unwrap();
    assert_eq!(importer.used(), used, "the exporter's bytes");
    let at = importer.reserve(G, 0).unwrap();
    importer.map(at, G, mine).unwrap();
    let mut back = [0u8; 8];
    importer.read(at + 100, &mut back).unwrap();
    assert_eq!(back, [5; 8]);

    // The exporter lets go of its allocation: the import's mapping keeps it.
    exporter.unmap(va).unwrap();
    exporter.release_physical(id).unwrap();
    importer.write(at, &[1; 4]).unwrap();
    importer.unmap(at).unwrap();
    importer.release_physical(mine).unwrap();
    assert_eq!(importer.used(), used);
    assert!(!shared.is_live());
    assert!(importer.import_physical(&shared).is_err());
}
