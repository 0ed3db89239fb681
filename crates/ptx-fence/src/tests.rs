//! The fence pass on small texts: what it rewrites, what it keeps byte for
//! byte, and what it refuses.

use super::*;

const KERNEL: &str = ".version 8.0\n.target sm_75\n.address_size 64\n\n.visible .entry k(\n\t.param .u64 p\n)\n{\n\t.reg .b64 %rd<3>;\n\t.reg .f32 %f<2>;\n\tld.param.u64 %rd1, [p];\n\tcvta.to.global.u64 %rd2, %rd1;\n$L__BB0_1:\n\tld.global.f32 %f1, [%rd2+4];\n\tst.f32 [%rd2], %f1;\n\tret;\n}\n";

#[test]
fn global_and_generic_accesses_are_fenced_and_the_rest_kept() {
    let out = fence_ptx(KERNEL).expect("fences");
    assert_eq!(out.fenced, 2);
    assert!(out.ptx.contains(".const .align 16 .u64 __cumux_fence[4];"));
    assert!(out.ptx.contains("ld.param.u64 %rd1, [p];"), "param kept");
    assert!(out.ptx.contains("ld.global.f32 %f1, [%__cumux_a0];"));
    assert!(out.ptx.contains("add.s64 %__cumux_a0, %rd2, 4;"));
    assert!(out.ptx.contains("st.f32 [%__cumux_a0], %f1;"));
    assert_eq!(
        out.ptx.matches("isspacep.global").count(),
        1,
        "generic only"
    );
    assert!(out.ptx.contains("$L__BB0_1:\n\t\n\tadd.s64"), "label first");
}

#[test]
fn reserved_names_unfenceable_and_untouched_instructions() {
    let clash = KERNEL.replace("%rd<3>", "%rd<3>, %__cumux_a0");
    assert_eq!(fence_ptx(&clash).unwrap_err(), FenceError::ReservedName);
    let tensor = KERNEL.replace(
        "st.f32 [%rd2], %f1;",
        "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%rd1], [%rd2, {%r1}], [%rd1];",
    );
    assert!(matches!(
        fence_ptx(&tensor),
        Err(FenceError::Unfenceable { line: 15, .. })
    ));
    let shared = KERNEL
        .replace("ld.global.f32 %f1, [%rd2+4];", "ld.shared.f32 %f1, [%rd2];")
        .replace(
            "st.f32 [%rd2], %f1;",
            "cp.async.ca.shared.global [%rd1], [%rd2], 16;",
        );
    let out = fence_ptx(&shared).unwrap();
    assert_eq!(out.fenced, 1);
    assert!(out
        .ptx
        .contains("cp.async.ca.shared.global [%rd1], [%__cumux_a0], 16;"));
}

#[test]
fn functions_without_accesses_get_no_prologue() {
    let text = ".version 8.0\n.target sm_75\n.address_size 64\n.visible .entry e()\n{\n\tret;\n}\n";
    let out = fence_ptx(text).unwrap();
    assert_eq!(out.fenced, 0);
    assert!(!out.ptx.contains("ld.const"));
}

#[test]
fn fence_values_and_guards() {
    assert!(Fence::new(0x1000, 0x3000, 0, 0).is_none());
    assert!(Fence::new(0x1800, 0x1000, 0, 0).is_none());
    let f = Fence::new(1 << 30, 1 << 20, 0x500, 0x600).unwrap();
    assert_eq!(f.mask, (1 << 20) - 1);
    assert_eq!(&f.to_bytes()[0..8], &(1u64 << 30).to_le_bytes());
    assert!(f.guards((1 << 30) + 8, 32));
    assert!(f.guards(0x5f0, 8));
    assert!(!f.guards(0x700, 32));
}

#[test]
fn strided_bulk_and_heap_accesses_are_refused() {
    let wmma = KERNEL.replace(
        "st.f32 [%rd2], %f1;",
        "wmma.load.a.sync.aligned.row.m16n16k16.global.f16 {%r1, %r2}, [%rd2], %r3;",
    );
    assert!(matches!(
        fence_ptx(&wmma),
        Err(FenceError::Unfenceable { .. })
    ));
    let shared_wmma = KERNEL.replace(
        "st.f32 [%rd2], %f1;",
        "wmma.load.a.sync.aligned.row.m16n16k16.shared.f16 {%r1, %r2}, [%rd2], %r3;",
    );
    assert_eq!(fence_ptx(&shared_wmma).unwrap().fenced, 1);
    let bulk = KERNEL.replace(
        "st.f32 [%rd2], %f1;",
        "cp.async.bulk.global.shared::cta.bulk_group [%rd2], [%rd1], %r1;",
    );
    assert!(matches!(
        fence_ptx(&bulk),
        Err(FenceError::Unfenceable { .. })
    ));
    let heap = KERNEL.replace(
        ".visible .entry",
        ".extern .func  (.param .b64 func_retval0) malloc\n(\n\t.param .b64 malloc_param_0\n)\n;\n.visible .entry",
    );
    assert_eq!(fence_ptx(&heap).unwrap_err(), FenceError::DeviceHeap);
}

#[test]
fn the_window_ends_at_the_widest_aligned_access() {
    let f = Fence::new(1 << 30, 1 << 20, 0x1000, 0x1001).unwrap();
    assert_eq!(f.window_end(), 0x1080);
    assert_eq!(Fence::new(1 << 30, 1 << 20, 0, 0).unwrap().window_end(), 0);
}

#[test]
fn a_labelled_block_with_a_vector_operand_is_a_block() {
    let text = KERNEL.replace(
        "\tret;",
        "$L__BB0_31:\n\t{ mov.b32 %f1, {0,%rs1};}\n\tst.global.f32 [%rd2], %f1;\n\tret;",
    );
    let out = fence_ptx(&text).expect("fences");
    assert_eq!(out.fenced, 3);
    assert!(out.ptx.contains("$L__BB0_31:\n\t{ mov.b32 %f1, {0,%rs1};}"));
}

#[test]
fn generic_accesses_through_other_spaces_variables_are_fenced_by_their_generic_address() {
    let text = KERNEL
        .replace(
            "\t.reg .f32 %f<2>;",
            "\t.reg .f32 %f<2>;\n\t.shared .align 4 .b8 sh[64];",
        )
        .replace("st.f32 [%rd2], %f1;", "st.f32 [sh+0x40000000], %f1;");
    let out = fence_ptx(&text).unwrap();
    assert!(
        out.ptx.contains("cvta.shared.u64 %__cumux_a0, sh;"),
        "{}",
        out.ptx
    );
    assert!(out
        .ptx
        .contains("add.s64 %__cumux_a0, %__cumux_a0, 0x40000000;"));
    assert!(out.ptx.contains("st.f32 [%__cumux_a0], %f1;"));
}
