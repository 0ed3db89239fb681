//! Moves in worker processes on the fake GPU (issue 17), for
//! `e2e_worker_fake_cuda`: a move's memory placed early, mapped early by the
//! source, and copied device to device in few round trips.

use std::sync::Arc;

use cumux_server::device::placed_copy;
use cumux_server::device::DeviceContext;
use cumux_testkit::fake_gpu::fixture_fatbin;

/// The granularity of the fake GPU.
pub const GRANULE: u64 = 2 << 20;

/// A move's memory copied device to device (issue 17): the target
/// context's placed memory exported by its worker, mapped in the source's
/// worker and copied into there. The target then reads what the source
/// held, at the same addresses, and the source keeps nothing of it.
pub fn moved_memory_goes_device_to_device(device: &Arc<dyn cumux_server::Device>) {
    let source = device.create_context().unwrap();
    // Two allocations sharing a granule, and one of three granules' worth.
    let sizes = [4096u64, 100, 3 * GRANULE + 12];
    let allocations: Vec<(u64, u64)> = sizes
        .iter()
        .map(|&n| (source.mem_alloc(n).unwrap(), n))
        .collect();
    let pattern = |i: usize, n: u64| -> Vec<u8> {
        (0..n)
            .map(|j| (j as u8).wrapping_mul(7) ^ (i as u8 + 1))
            .collect()
    };
    for (i, &(ptr, n)) in allocations.iter().enumerate() {
        source.mem_write(ptr, &pattern(i, n)).unwrap();
    }
    let used = device.mem_used();
    let target = device
        .movable()
        .expect("a GPU makes contexts for moves")
        .create_context_in_window(0)
        .unwrap();
    let placed = target.movable().expect("a GPU context places memory");
    placed.place_all(&allocations).unwrap();
    let placed_bytes = device.mem_used() - used;
    // Not an allocation placed here: a clear refusal, and nothing exported.
    let stray = placed.export_placed(allocations[0].0 + 1).unwrap_err();
    assert!(stray.detail.contains("no placed allocation"), "{stray:?}");

    let copied = placed_copy::copy_placed(source.as_ref(), placed, &allocations).unwrap();
    assert_eq!(copied, sizes.iter().sum::<u64>());
    for (i, &(ptr, n)) in allocations.iter().enumerate() {
        let mut back = vec![0u8; n as usize];
        target.mem_read(ptr, &mut back).unwrap();
        assert!(back == pattern(i, n), "allocation {i} at {ptr:#x} differs");
    }
    // The source's mappings of the target's memory went with the copy, and
    // its count never included them.
    assert_eq!(device.mem_used(), used + placed_bytes);
    let again = placed_copy::copy_placed(source.as_ref(), placed, &allocations);
    assert_eq!(again, Ok(copied), "a second copy maps the chunks afresh");
    drop(target);
    assert_eq!(device.mem_used(), used);
    // A target made ready beforehand keeps the addresses free first (its
    // modules' memory must not land there); placing then maps into them.
    let ready = move_target(device);
    let placed = ready.movable().unwrap();
    placed.hold(&allocations).unwrap();
    ready.module_load(&fixture_fatbin()).unwrap();
    placed.place_all(&allocations).unwrap();
    let copied = placed_copy::copy_placed(source.as_ref(), placed, &allocations).unwrap();
    assert_eq!(copied, sizes.iter().sum::<u64>());
    let (ptr, n) = allocations[2];
    let mut back = vec![0u8; n as usize];
    ready.mem_read(ptr, &mut back).unwrap();
    assert!(back == pattern(2, n), "held, then placed: the bytes arrive");
    drop(ready);
    for &(ptr, n) in &allocations {
        source.mem_free(ptr, n).unwrap();
    }
    many_chunks_cost_two_round_trips_each(device, source.as_ref());
    memory_placed_early_changes_with_the_session(device, source.as_ref());
    memory_mapped_early_leaves_only_the_copy(device, &source);
    memory_mapped_in_later_rounds_is_only_copied(device, &source);
    a_window_taken_in_part_is_asked_in_blocks(device, source.as_ref());
    room_to_grow_is_kept_from_modules(device, source.as_ref());
    globals_move_in_one_request(source.as_ref());
}

/// Ranges `(offset, bytes)` of one fresh allocation of `granules` of the
/// source, each filled with its index + 1, as allocations a move places:
/// laid out by offset, not by where the fake's heap puts allocations.
fn ranges_of_one_block(
    source: &dyn DeviceContext,
    granules: u64,
    ranges: &[(u64, u64)],
) -> (u64, Vec<(u64, u64)>) {
    let block = source.mem_alloc(granules * GRANULE).unwrap();
    (block, filled(source, block, ranges))
}

/// Ranges `(offset, bytes)` of `block`, each filled with its index + 1, as
/// allocations `(ptr, bytes)`.
fn filled(source: &dyn DeviceContext, block: u64, ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    ranges
        .iter()
        .enumerate()
        .map(|(i, &(offset, n))| {
            let ptr = block + offset;
            source
                .mem_write(ptr, &vec![i as u8 + 1; n as usize])
                .unwrap();
            (ptr, n)
        })
        .collect()
}

/// A fresh context of `device` for a move's target, in the first window.
fn move_target(device: &Arc<dyn cumux_server::Device>) -> Arc<dyn DeviceContext> {
    device
        .movable()
        .expect("a GPU makes contexts for moves")
        .create_context_in_window(0)
        .unwrap()
}

/// Requests a worker context has waited on.
fn trips(ctx: &dyn DeviceContext) -> u64 {
    ctx.as_any()
        .downcast_ref::<cumux_server::worker::context::WorkerContext>()
        .expect("a worker's context")
        .round_trips()
}

/// A move's target places the session's memory while it runs; in the pause
/// only what changed since is placed: freed allocations go, new ones come,
/// and the early ones keep what they hold. A new allocation sharing a page
/// with an early one has that one placed again with it, and only that one.
fn memory_placed_early_changes_with_the_session(
    device: &Arc<dyn cumux_server::Device>,
    source: &dyn DeviceContext,
) {
    let g = GRANULE;
    // a, b and c each in granules of their own; d in a's last one.
    let (block, r) = ranges_of_one_block(
        source,
        12,
        &[(0, g), (3 * g, g / 2), (6 * g, g / 4), (g + 64, 64)],
    );
    let (a, b, c, d) = (r[0], r[1], r[2], r[3]);
    let target = move_target(device);
    let placed = target.movable().unwrap();
    let early = [a, b];
    let before = device.mem_used();
    placed.place_all(&early).unwrap();
    target.mem_write(a.0, &[7u8; 64]).unwrap();
    // b freed and c allocated since.
    let now = [a, c];
    let kept_early = placed_copy::place_changes(target.as_ref(), placed, &early, &now).unwrap();
    assert_eq!(kept_early, [a], "a was placed early and kept");
    let mut kept = [0u8; 64];
    target.mem_read(a.0, &mut kept).unwrap();
    assert_eq!(kept, [7u8; 64], "an early allocation is not placed again");
    let gone = placed.export_placed(b.0).unwrap_err();
    assert!(gone.detail.contains("no placed allocation"), "{gone:?}");
    assert!(
        placed.export_placed(c.0).is_ok(),
        "the new allocation is placed"
    );
    // a spans at most 2 granules, c 1.
    assert!(device.mem_used() - before <= 3 * g);
    // d, in a's last page: a is placed again with it; c keeps its bytes.
    target.mem_write(c.0, &[5u8; 64]).unwrap();
    let (a_start, a_size, _) = placed.export_placed(a.0).unwrap();
    assert!(
        d.0 >= a_start && d.0 < a_start + a_size,
        "d shares a's page"
    );
    let later = [a, c, d];
    let kept_early = placed_copy::place_changes(target.as_ref(), placed, &now, &later).unwrap();
    assert_eq!(kept_early, [c], "only a placed again");
    target.mem_read(a.0, &mut kept).unwrap();
    assert_eq!(kept, [0u8; 64], "a placed afresh");
    target.mem_read(c.0, &mut kept).unwrap();
    assert_eq!(kept, [5u8; 64], "c left where it was");
    let (d_start, ..) = placed.export_placed(d.0).unwrap();
    assert_eq!(d_start, a_start, "a and d share their chunk");
    drop(target);
    assert_eq!(device.mem_used(), before, "the target's memory all gone");
    source.mem_free(block, 12 * g).unwrap();
}

/// A move's target memory mapped by the session's context while it runs:
/// the pause copies into it in one request, and only memory allocated since
/// is exported, imported and mapped then (with an early allocation sharing a
/// page with a new one, placed again: its early mapping is stale and never
/// copied into). The bytes copied are those of the pause.
fn memory_mapped_early_leaves_only_the_copy(
    device: &Arc<dyn cumux_server::Device>,
    source: &Arc<dyn DeviceContext>,
) {
    let g = GRANULE;
    let mut layout: Vec<(u64, u64)> = (0..5).map(|i| (3 * g * i, g / 2)).collect();
    // Right after the first, in its last page.
    layout.push((g / 2 + 64, 64));
    let (block, r) = ranges_of_one_block(source.as_ref(), 15, &layout);
    // The last two allocated after the early placing, as far as the move knows.
    let (early, new, beside) = (r[..4].to_vec(), r[4], r[5]);
    let target = move_target(device);
    let placed = target.movable().unwrap();
    placed.place_all(&early).unwrap();
    let mapping = placed_copy::map_early(source, placed, &early).unwrap();
    // The program runs on: it writes again.
    source.mem_write(early[0].0, &[0xee; 256]).unwrap();
    let now: Vec<(u64, u64)> = r.clone();
    let kept = placed_copy::place_changes(target.as_ref(), placed, &early, &now).unwrap();
    assert_eq!(
        kept,
        early[1..],
        "the first placed again with the one beside it"
    );
    let (source_before, target_before) = (trips(source.as_ref()), trips(target.as_ref()));
    let early_kept = (std::slice::from_ref(&mapping), kept.as_slice());
    let copied = placed_copy::copy_placed_after(source.as_ref(), placed, &now, early_kept).unwrap();
    assert_eq!(copied, now.iter().map(|a| a.1).sum::<u64>());
    assert_eq!(
        trips(source.as_ref()) - source_before,
        4,
        "the mapped copy, then an import for each of 2 chunks and the rest"
    );
    assert_eq!(
        trips(target.as_ref()) - target_before,
        2,
        "exports: the new chunk, the first's placed again"
    );
    let mut back = vec![0u8; 64];
    target.mem_read(beside.0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 6), "the one beside the first");
    let mut back = vec![0u8; 512];
    target.mem_read(early[0].0, &mut back).unwrap();
    assert!(back[..256].iter().all(|&b| b == 0xee), "the pause's bytes");
    assert!(back[256..].iter().all(|&b| b == 1));
    let mut back = vec![0u8; new.1 as usize];
    target.mem_read(new.0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 5), "the new allocation's bytes");
    let before_unmap = trips(source.as_ref());
    drop(mapping);
    assert_eq!(
        trips(source.as_ref()) - before_unmap,
        1,
        "unmapped in one request"
    );
    drop(target);
    source.mem_free(block, 15 * g).unwrap();
}

/// Memory a session allocated after a move's first preparing round, placed
/// and mapped by a later round: the pause copies each round's mapping in
/// one request and exports nothing.
fn memory_mapped_in_later_rounds_is_only_copied(
    device: &Arc<dyn cumux_server::Device>,
    source: &Arc<dyn DeviceContext>,
) {
    let g = GRANULE;
    let layout: Vec<(u64, u64)> = (0..4).map(|i| (3 * g * i, g / 2)).collect();
    let (block, r) = ranges_of_one_block(source.as_ref(), 12, &layout);
    let target = move_target(device);
    let placed = target.movable().unwrap();
    let mut mappings = Vec::new();
    for round in [&r[..2], &r[2..]] {
        placed.place_all(round).unwrap();
        mappings.push(placed_copy::map_early(source, placed, round).unwrap());
    }
    let kept = placed_copy::place_changes(target.as_ref(), placed, &r, &r).unwrap();
    assert_eq!(kept, r);
    let (source_before, target_before) = (trips(source.as_ref()), trips(target.as_ref()));
    let copied =
        placed_copy::copy_placed_after(source.as_ref(), placed, &r, (&mappings, &kept)).unwrap();
    assert_eq!(copied, r.iter().map(|a| a.1).sum::<u64>());
    assert_eq!(
        trips(source.as_ref()) - source_before,
        2,
        "a copy request for each round's mapping"
    );
    assert_eq!(trips(target.as_ref()), target_before, "nothing exported");
    for (i, &(ptr, n)) in r.iter().enumerate() {
        let mut back = vec![0u8; n as usize];
        target.mem_read(ptr, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == i as u8 + 1), "allocation {i}");
    }
    drop(mappings);
    drop(target);
    source.mem_free(block, 12 * g).unwrap();
}

/// An allocation whose 1 GiB window is taken in part in the target's process
/// (the driver keeps a range of it for itself), where the driver passes over
/// the hints of small ranges, as NVIDIA's did for 2-4 MiB ones: placed in an
/// aligned block of 64 MiB or more around it, not refused.
fn a_window_taken_in_part_is_asked_in_blocks(
    device: &Arc<dyn cumux_server::Device>,
    source: &dyn DeviceContext,
) {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    let (block, r) = ranges_of_one_block(source, 1, &[(0, 4096)]);
    let ptr = r[0].0;
    let window = ptr & !(GIB - 1);
    // 16 MiB of the window the driver keeps, away from the 256 MiB around
    // the allocation.
    let taken = match ptr - window < GIB / 2 {
        true => window + GIB - 16 * MIB,
        false => window,
    };
    std::env::set_var("FAKE_MIN_HINT", (64 * MIB).to_string());
    std::env::set_var("FAKE_TAKEN", format!("{taken}:{}", 16 * MIB));
    let target = move_target(device);
    std::env::remove_var("FAKE_MIN_HINT");
    std::env::remove_var("FAKE_TAKEN");
    let placed = target.movable().unwrap();
    placed.place_all(&r).unwrap();
    let copied = placed_copy::copy_placed(source, placed, &r).unwrap();
    assert_eq!(copied, 4096);
    let mut back = vec![0u8; 4096];
    target.mem_read(ptr, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 1), "placed at its address");
    drop(target);
    source.mem_free(block, GRANULE).unwrap();
}

/// A target made ready beforehand keeps room for its session to grow: the
/// memory the program allocates after the first round is placed, where the
/// target's driver would have put the modules it loaded (it takes the next
/// free address, as the source's driver did for the program: on the H200 a
/// drain refused such a session's prepared target). A later allocation
/// across two windows kept free is placed too.
fn room_to_grow_is_kept_from_modules(
    device: &Arc<dyn cumux_server::Device>,
    source: &dyn DeviceContext,
) {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    let granules = (2 * GIB + 128 * MIB) / GRANULE;
    let block = source.mem_alloc(granules * GRANULE).unwrap();
    let boundary = (block + GIB - 1) & !(GIB - 1);
    let r = filled(
        source,
        block,
        &[
            (0, 4096),
            (boundary + GIB - 2 * MIB - block, 4 * MIB),
            (boundary + 64 * MIB - block, 4096),
        ],
    );
    let first_round = &r[..1];
    std::env::set_var("FAKE_MODULE_AT", r[2].0.to_string());
    let target = move_target(device);
    std::env::remove_var("FAKE_MODULE_AT");
    let placed = target.movable().unwrap();
    placed.hold(first_round).unwrap();
    let kept = placed
        .keep_free(&cumux_server::session::room_to_grow(first_round))
        .unwrap();
    assert!(kept >= 2 * GIB, "kept {kept} bytes free");
    target.module_load(&fixture_fatbin()).unwrap();
    for later in [&r[..1], &r[1..2], &r[2..]] {
        placed.place_all(later).unwrap();
    }
    let copied = placed_copy::copy_placed(source, placed, &r).unwrap();
    assert_eq!(copied, r.iter().map(|a| a.1).sum::<u64>());
    for (i, &(ptr, n)) in r.iter().enumerate() {
        let mut back = vec![0u8; n as usize];
        target.mem_read(ptr, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == i as u8 + 1), "allocation {i}");
    }
    drop(target);
    source.mem_free(block, granules * GRANULE).unwrap();
}

/// A move of many allocations, each in a chunk of its own: the target
/// exports each chunk and the source imports it (a round trip each), then
/// the source maps, copies and lets go of them all in one request.
fn many_chunks_cost_two_round_trips_each(
    device: &Arc<dyn cumux_server::Device>,
    source: &dyn DeviceContext,
) {
    let g = GRANULE;
    let layout: Vec<(u64, u64)> = (0..12).map(|i| (3 * g * i, g - 64 * i)).collect();
    let (block, allocations) = ranges_of_one_block(source, 36, &layout);
    let target = move_target(device);
    let placed = target.movable().unwrap();
    placed.place_all(&allocations).unwrap();
    let (source_before, target_before) = (trips(source), trips(target.as_ref()));
    let copied = placed_copy::copy_placed(source, placed, &allocations).unwrap();
    assert_eq!(copied, allocations.iter().map(|a| a.1).sum::<u64>());
    let chunks = allocations.len() as u64;
    assert_eq!(
        trips(target.as_ref()) - target_before,
        chunks,
        "one export a chunk"
    );
    assert_eq!(
        trips(source) - source_before,
        chunks + 1,
        "one import a chunk, then one request for the rest"
    );
    for (i, &(ptr, n)) in allocations.iter().enumerate() {
        let mut back = vec![0u8; n as usize];
        target.mem_read(ptr, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == i as u8 + 1), "allocation {i}");
    }
    drop(target);
    source.mem_free(block, 36 * g).unwrap();
}

/// A moved session's globals (many small spans) are read from the source and
/// written on the target in one request each, whatever their number.
fn globals_move_in_one_request(ctx: &dyn DeviceContext) {
    let (block, spans) = ranges_of_one_block(ctx, 1, &[(0, 8), (64, 4), (4096, 300), (9000, 1)]);
    let before = trips(ctx);
    let read = ctx.mem_read_spans(&spans).unwrap();
    assert_eq!(trips(ctx) - before, 1, "one read for every span");
    for (i, bytes) in read.iter().enumerate() {
        assert_eq!(bytes.len() as u64, spans[i].1);
        assert!(bytes.iter().all(|&b| b == i as u8 + 1), "span {i}");
    }
    let fresh: Vec<Vec<u8>> = spans.iter().map(|&(_, n)| vec![0xa5; n as usize]).collect();
    let writes: Vec<(u64, &[u8])> = spans
        .iter()
        .zip(&fresh)
        .map(|(&(ptr, _), data)| (ptr, data.as_slice()))
        .collect();
    // Between the spans (the block may be one freed before, as it was).
    let mut gap_before = [0u8; 4];
    ctx.mem_read(block + 8, &mut gap_before).unwrap();
    let before = trips(ctx);
    ctx.mem_write_spans(&writes).unwrap();
    assert_eq!(trips(ctx) - before, 1, "one write for every span");
    let back = ctx.mem_read_spans(&spans).unwrap();
    assert!(back.iter().flatten().all(|&b| b == 0xa5));
    // Between the spans, nothing written.
    let mut gap = [0u8; 4];
    ctx.mem_read(block + 8, &mut gap).unwrap();
    assert_eq!(gap, gap_before);
    ctx.mem_free(block, GRANULE).unwrap();
}
