//! Entry points that CUDA 13.1–13.5 added as new versions or new names of
//! calls cumux already serves: `cuLaunchHostFunc_v2` (13.1), the parameter
//! count queries and the copies with attributes (13.2). Each maps onto the
//! existing implementation; `cuGetProcAddress` hands them out only to callers
//! asking for CUDA 13.1 or later (see `entry_points::resolve`).

use std::ffi::c_void;

use super::*;
use cumux_cuda_bindings::{consts::*, types::*};

/// `CUhostTaskSyncMode`: how the thread running host tasks waits for the
/// next one. Both are scheduling hints for that thread only.
const CU_HOST_TASK_BLOCKING: u32 = 0;
const CU_HOST_TASK_SPINWAIT: u32 = 1;

/// `CUmemcpySrcAccessOrder`: 0 is invalid; stream order, during the call,
/// any time.
const SRC_ACCESS_ORDER_STREAM: u32 = 1;
const SRC_ACCESS_ORDER_ANY: u32 = 3;

/// `CU_MEMCPY_OPERAND_TYPE_POINTER` / `_ARRAY`.
const OPERAND_POINTER: u32 = 1;
const OPERAND_ARRAY: u32 = 2;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemLocation {
    pub kind: u32,
    pub id: i32,
}

/// `CUmemcpyAttributes`.
#[repr(C)]
pub struct MemcpyAttributes {
    pub src_access_order: u32,
    pub src_loc_hint: MemLocation,
    pub dst_loc_hint: MemLocation,
    pub flags: u32,
}

/// `CUmemcpy3DOperand`: a type and a union of a pointer operand
/// `{ptr, rowLength, layerHeight, locHint}` and an array operand
/// `{array, offset x, y, z}`, both four words.
#[repr(C)]
pub struct Memcpy3DOperand {
    pub kind: u32,
    pub op: [u64; 4],
}

/// `CUDA_MEMCPY3D_BATCH_OP`.
#[repr(C)]
pub struct Memcpy3DBatchOp {
    pub src: Memcpy3DOperand,
    pub dst: Memcpy3DOperand,
    /// width, height, depth; in elements (bytes for pointer operands).
    pub extent: [usize; 3],
    pub src_access_order: u32,
    pub flags: u32,
}

const _: () = assert!(std::mem::size_of::<MemcpyAttributes>() == 24);
const _: () = assert!(std::mem::size_of::<Memcpy3DOperand>() == 40);
const _: () = assert!(std::mem::size_of::<Memcpy3DBatchOp>() == 112);

fn check_access_order(order: u32) -> CuResult<()> {
    if (SRC_ACCESS_ORDER_STREAM..=SRC_ACCESS_ORDER_ANY).contains(&order) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// One side of a 3D copy: (memory type, device pointer, pitch, height).
/// cumux implements no CUDA arrays, so an array operand is not supported.
fn operand(o: &Memcpy3DOperand, extent: &[usize; 3]) -> CuResult<(u32, u64, usize, usize)> {
    match o.kind {
        OPERAND_POINTER => {
            let [ptr, row_length, layer_height, _loc_hint] = o.op;
            let (row_length, layer_height) = (row_length as usize, layer_height as usize);
            if (row_length != 0 && row_length < extent[0])
                || (layer_height != 0 && layer_height < extent[1])
            {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // Zero means tightly packed; pitch and height 0 say so to copy_3d.
            Ok((CU_MEMORYTYPE_UNIFIED, ptr, row_length, layer_height))
        }
        OPERAND_ARRAY => {
            tracing::warn!("copies to or from CUDA arrays are not implemented");
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// The classic 3D copy description of one batch operation.
fn as_memcpy_3d(op: &Memcpy3DBatchOp) -> CuResult<CUDA_MEMCPY3D> {
    check_access_order(op.src_access_order)?;
    if op.extent.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (src_type, src, src_pitch, src_height) = operand(&op.src, &op.extent)?;
    let (dst_type, dst, dst_pitch, dst_height) = operand(&op.dst, &op.extent)?;
    Ok(CUDA_MEMCPY3D {
        srcXInBytes: 0,
        srcY: 0,
        srcZ: 0,
        srcLOD: 0,
        srcMemoryType: src_type,
        srcHost: src as usize as *const c_void,
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        reserved0: std::ptr::null_mut(),
        srcPitch: src_pitch,
        srcHeight: src_height,
        dstXInBytes: 0,
        dstY: 0,
        dstZ: 0,
        dstLOD: 0,
        dstMemoryType: dst_type,
        dstHost: dst as usize as *mut c_void,
        dstDevice: dst,
        dstArray: std::ptr::null_mut(),
        reserved1: std::ptr::null_mut(),
        dstPitch: dst_pitch,
        dstHeight: dst_height,
        WidthInBytes: op.extent[0],
        Height: op.extent[1],
        Depth: op.extent[2],
    })
}

driver_fn! {
    // `syncMode` says whether the thread running host tasks blocks or spins
    // while it waits for the next one. cumux runs host functions on its own
    // thread, which always blocks; both modes run the function at the same
    // point in stream order, so both are accepted and neither changes
    // behaviour. Other values are invalid.
    fn cuLaunchHostFunc_v2 | cuLaunchHostFunc_v2_ptsz (stream: *mut c_void, func: CUhostFn, data: *mut c_void, sync_mode: u32) {
        if sync_mode != CU_HOST_TASK_BLOCKING && sync_mode != CU_HOST_TASK_SPINWAIT {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's own arguments, forwarded to the 13.0 form.
        forwarded(unsafe { cuLaunchHostFunc(stream, func, data) })
    }

    fn cuFuncGetParamCount | cuKernelGetParamCount (f: *mut c_void, count: *mut usize) {
        super::function::param_count(f, count)
    }

    // The attributes are hints (location hints, overlap preference) and a
    // source access order; cumux reads host sources when the call is made,
    // which satisfies every order, so the copy is `cuMemcpyAsync`'s.
    fn cuMemcpyWithAttributesAsync | cuMemcpyWithAttributesAsync_ptsz (dst: u64, src: u64, bytes: usize, attr: *mut c_void, stream: *mut c_void) {
        check_access_order(read_in(attr.cast::<MemcpyAttributes>())?.src_access_order)?;
        // SAFETY: the program's own arguments, forwarded.
        forwarded(unsafe { cuMemcpyAsync(dst, src, bytes, stream) })
    }

    fn cuMemcpy3DWithAttributesAsync | cuMemcpy3DWithAttributesAsync_ptsz (op: *mut c_void, flags: u64, stream: *mut c_void) {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = as_memcpy_3d(read_in(op.cast::<Memcpy3DBatchOp>())?)?;
        // SAFETY: `p` lives across the call, which reads it synchronously.
        forwarded(unsafe { cuMemcpy3DAsync_v2(&p, stream) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer(ptr: u64, row: u64, height: u64) -> Memcpy3DOperand {
        Memcpy3DOperand {
            kind: OPERAND_POINTER,
            op: [ptr, row, height, 0],
        }
    }

    #[test]
    fn batch_op_maps_onto_a_3d_copy() {
        let op = Memcpy3DBatchOp {
            src: pointer(0x1000, 64, 0),
            dst: pointer(0x2000_0000_0000, 0, 0),
            extent: [16, 4, 2],
            src_access_order: SRC_ACCESS_ORDER_STREAM,
            flags: 0,
        };
        let p = as_memcpy_3d(&op).unwrap();
        assert_eq!((p.srcPitch, p.dstPitch, p.srcHeight), (64, 0, 0));
        assert_eq!((p.WidthInBytes, p.Height, p.Depth), (16, 4, 2));
        assert_eq!(p.srcMemoryType, CU_MEMORYTYPE_UNIFIED);
        assert_eq!(p.dstDevice, 0x2000_0000_0000);

        let bad_order = Memcpy3DBatchOp {
            src_access_order: 0,
            ..op
        };
        assert_eq!(
            as_memcpy_3d(&bad_order).err(),
            Some(CUDA_ERROR_INVALID_VALUE)
        );
        let short_row = Memcpy3DBatchOp {
            src: pointer(0x1000, 8, 0),
            src_access_order: SRC_ACCESS_ORDER_STREAM,
            ..bad_order
        };
        assert_eq!(
            as_memcpy_3d(&short_row).err(),
            Some(CUDA_ERROR_INVALID_VALUE)
        );
        let array = Memcpy3DBatchOp {
            src: Memcpy3DOperand {
                kind: OPERAND_ARRAY,
                op: [1, 0, 0, 0],
            },
            ..short_row
        };
        assert_eq!(as_memcpy_3d(&array).err(), Some(CUDA_ERROR_NOT_SUPPORTED));
    }

    #[test]
    fn each_runtime_gets_the_version_it_was_built_for() {
        use crate::entry_points::{resolve, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM as PTDS};
        let symbol = |name, version, flags| resolve(name, version, flags).unwrap().symbol;
        assert_eq!(symbol("cuLaunchHostFunc", 13000, 0), "cuLaunchHostFunc");
        assert_eq!(symbol("cuLaunchHostFunc", 13010, 0), "cuLaunchHostFunc_v2");
        assert_eq!(symbol("cuLaunchHostFunc", 13050, 0), "cuLaunchHostFunc_v2");
        assert_eq!(
            symbol("cuLaunchHostFunc", 13000, PTDS),
            "cuLaunchHostFunc_ptsz"
        );
        assert_eq!(
            symbol("cuLaunchHostFunc", 13050, PTDS),
            "cuLaunchHostFunc_v2_ptsz"
        );
        assert_eq!(
            symbol("cuFuncGetParamCount", 13050, 0),
            "cuFuncGetParamCount"
        );
        assert_eq!(
            symbol("cuMemcpyWithAttributesAsync", 13050, PTDS),
            "cuMemcpyWithAttributesAsync_ptsz"
        );
        assert!(resolve("cuKernelGetParamCount", 13000, 0).is_err());
        assert!(resolve("cuMemcpy3DWithAttributesAsync", 13020, 0).is_ok());
    }

    #[test]
    fn unknown_sync_mode_is_invalid() {
        // SAFETY: rejected before any pointer is used.
        let rc =
            unsafe { cuLaunchHostFunc_v2(std::ptr::null_mut(), None, std::ptr::null_mut(), 7) };
        assert_eq!(rc, CUDA_ERROR_INVALID_VALUE);
    }
}
