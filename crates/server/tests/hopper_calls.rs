//! Hopper's launch attributes and tensor maps through the protocol, on a
//! device without either (the model device, like the CPU one, reports
//! compute capability 7.5): clear errors, the session going on after them.

mod common;

use common::*;
use cumux_protocol::*;

const IMAGE: &str = "model:scale_add";

fn launch_with(
    c: &mut Client,
    module: &ModuleInfo,
    attributes: Vec<LaunchAttribute>,
    params: Vec<u8>,
) {
    let function = module.functions[0].handle;
    c.post(launch_call_on(
        function,
        [2, 1, 1],
        [32, 1, 1],
        DEFAULT_STREAM,
        params,
        attributes,
    ));
}

#[test]
fn clusters_are_refused_where_the_device_has_none_and_hints_pass() {
    let h = Harness::start("clusters");
    let mut c = h.client();
    let m = c.load(IMAGE);
    let p = c.alloc(64);
    c.write(p, &1u32.to_le_bytes());
    launch_with(
        &mut c,
        &m,
        vec![LaunchAttribute::ClusterDim([2, 1, 1])],
        scale_add(p, 2, 0, 0),
    );
    assert_eq!(c.code(Call::ContextSynchronize), codes::NOT_SUPPORTED);
    // A cluster of one block is no cluster; scheduling hints change nothing.
    let hints = vec![
        LaunchAttribute::ClusterDim([1, 1, 1]),
        LaunchAttribute::ProgrammaticSerialization(1),
        LaunchAttribute::Priority(-1),
        LaunchAttribute::MemSyncDomain(0),
    ];
    launch_with(&mut c, &m, hints, scale_add(p, 3, 0, 0));
    assert_eq!(c.code(Call::ContextSynchronize), codes::SUCCESS);
    assert_eq!(
        u32_at(&c.read(p, 4).unwrap()),
        3,
        "the refused launch did not run"
    );
}

fn tiled(address: DevicePtr, rank: u32) -> Call {
    let r = rank.min(8) as usize;
    Call::TensorMapEncode {
        request: TensorMapRequest {
            data_type: 7,
            rank,
            global_address: address,
            global_dim: vec![16; r],
            global_strides: vec![64; r.saturating_sub(1)],
            element_strides: vec![1; r],
            interleave: 0,
            swizzle: 0,
            l2_promotion: 0,
            oob_fill: 0,
            layout: TensorMapLayout::Tiled {
                box_dim: vec![8; r],
            },
        },
    }
}

#[test]
fn tensor_maps_name_only_the_sessions_memory() {
    let h = Harness::start("tmaps");
    let mut c = h.client();
    let mine = c.alloc(4096);
    let mut other = h.client();
    let theirs = other.alloc(4096);
    // Bad shapes and foreign memory are refused before any device sees them.
    assert_eq!(c.code(tiled(mine, 0)), codes::INVALID_VALUE);
    assert_eq!(c.code(tiled(mine, 6)), codes::INVALID_VALUE);
    assert_eq!(c.code(tiled(theirs, 2)), codes::INVALID_VALUE);
    assert_eq!(c.code(tiled(0, 2)), codes::INVALID_VALUE);
    // This device has no tensor memory access: it says so.
    assert_eq!(c.code(tiled(mine, 2)), codes::NOT_SUPPORTED);
    c.write(mine, &[7; 4]);
    assert_eq!(c.read(mine, 4).unwrap(), [7; 4]);
}

fn cluster_query(function: Handle, block: [u32; 3], query: ClusterQuery) -> Call {
    Call::ClusterOccupancy {
        launch: GraphLaunch {
            function,
            grid: [4, 1, 1],
            block,
            shared_bytes: 0,
            params: Vec::new(),
            attributes: vec![LaunchAttribute::ClusterDim([2, 1, 1])],
        },
        query,
    }
}

#[test]
fn cluster_occupancy_is_asked_of_a_driver_and_checked_first() {
    let h = Harness::start("cluster-occupancy");
    let mut c = h.client();
    let m = c.load(IMAGE);
    let function = m.functions[0].handle;
    let active = ClusterQuery::MaxActiveClusters;
    // No function of the session's (handles are the session's own), and a
    // block no launch could have.
    assert_eq!(
        c.code(cluster_query(function + 1000, [32, 1, 1], active)),
        codes::INVALID_HANDLE
    );
    assert_eq!(
        c.code(cluster_query(function, [4096, 1, 1], active)),
        codes::INVALID_VALUE
    );
    // A device with no driver to ask says so, rather than guess: the client
    // answers for such a device itself.
    let sizes = ClusterQuery::MaxPotentialClusterSize { non_portable: true };
    for query in [active, sizes] {
        match c.call(cluster_query(function, [32, 1, 1], query)) {
            Err(e) => {
                assert_eq!(e.code, codes::NOT_SUPPORTED);
                assert!(e.detail.contains("clusters"), "{}", e.detail);
            }
            Ok(reply) => panic!("answered {reply:?} without a driver"),
        }
    }
    // The session goes on.
    let p = c.alloc(64);
    c.write(p, &5u32.to_le_bytes());
    launch_with(&mut c, &m, Vec::new(), scale_add(p, 2, 0, 0));
    assert_eq!(c.code(Call::ContextSynchronize), codes::SUCCESS);
}
