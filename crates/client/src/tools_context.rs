//! Export table `21318c60-9714-3248-8ca6-41ff7324c8f2`, the driver's
//! "tools context" interface (CU_ETID_ToolsContext in public accounts of the
//! driver's private tables: context → device, context number, …).
//!
//! The CUDA 13.5 runtime (libcudart 13.5.37) asks for it at start-up, right
//! after the tools TLS table, and fails every later call (`cudaMalloc` →
//! invalid argument) when it is refused; 13.0 never asks. Measured with
//! `CUMUX_LOG=debug` on `tests/cuda/corpus` and `tests/cuda/driver`: having
//! the table is all the runtime needs; it calls none of its slots. A peer
//! reports the table as a size header and 94 slots for driver 595.99.02
//! (CUDA 13.4 runtimes), so cumux answers that shape.
//!
//! cuBLASLt 13.0 (`nvidia-cublas` 13.0.2.14) asks for it too, on the first
//! GEMM, and calls slot 4 (the context number in public accounts) as
//! `(context, *mut u64)`, with a null context, several times per heuristic
//! query. When slot 4 failed, every GEMM (`cublasSgemm`, `cublasGemmEx`,
//! `cublasLtMatmulAlgoGetHeuristic`) returned `CUBLAS_STATUS_NOT_SUPPORTED`
//! with nothing logged above debug; answering 0 for the null context lets
//! `cublasSgemm` run (measured on the CPU device). Every other slot says
//! which one was called and answers `CUDA_ERROR_NOT_SUPPORTED`, writing
//! nothing: a caller that does use one gets an honest error, never a crash.
use std::ffi::c_void;

use crate::errors::*;

/// The GUID as the runtime passes it (bytes in this order).
pub const TOOLS_CONTEXT_ID: [u8; 16] = 0x21318c60_9714_3248_8ca6_41ff7324c8f2u128.to_be_bytes();

/// Slots, including the size header in slot 0.
pub const TOOLS_CONTEXT_SLOTS: usize = 95;

// `name = index` defines a slot answering not supported; a bare `name` is a
// slot defined below.
macro_rules! unsupported_slots {
    ($($fname:ident $(= $index:literal)?),* $(,)?) => {
        $($(
            extern "C" fn $fname() -> CUresult {
                tracing::debug!(
                    "dark API tools context slot {} called; answering not supported",
                    $index
                );
                CUDA_ERROR_NOT_SUPPORTED
            }
        )?)*
        /// The table: size in bytes, then one function per slot.
        static TABLE: Table = Table([
            (TOOLS_CONTEXT_SLOTS * std::mem::size_of::<usize>()) as *const c_void,
            $($fname as *const c_void),*
        ]);
    };
}

#[repr(transparent)]
struct Table([*const c_void; TOOLS_CONTEXT_SLOTS]);
// SAFETY: never written after initialisation; holds a size and function
// addresses only.
unsafe impl Sync for Table {}

unsupported_slots! {
    slot1 = 1,
    slot2 = 2,
    slot3 = 3,
    slot4,
    slot5 = 5,
    slot6 = 6,
    slot7 = 7,
    slot8 = 8,
    slot9 = 9,
    slot10 = 10,
    slot11 = 11,
    slot12 = 12,
    slot13 = 13,
    slot14 = 14,
    slot15 = 15,
    slot16 = 16,
    slot17 = 17,
    slot18 = 18,
    slot19 = 19,
    slot20 = 20,
    slot21 = 21,
    slot22 = 22,
    slot23 = 23,
    slot24 = 24,
    slot25 = 25,
    slot26 = 26,
    slot27 = 27,
    slot28 = 28,
    slot29 = 29,
    slot30 = 30,
    slot31 = 31,
    slot32 = 32,
    slot33 = 33,
    slot34 = 34,
    slot35 = 35,
    slot36 = 36,
    slot37 = 37,
    slot38 = 38,
    slot39,
    slot40 = 40,
    slot41 = 41,
    slot42 = 42,
    slot43 = 43,
    slot44 = 44,
    slot45 = 45,
    slot46 = 46,
    slot47 = 47,
    slot48 = 48,
    slot49 = 49,
    slot50 = 50,
    slot51,
    slot52 = 52,
    slot53 = 53,
    slot54 = 54,
    slot55 = 55,
    slot56 = 56,
    slot57 = 57,
    slot58 = 58,
    slot59 = 59,
    slot60 = 60,
    slot61 = 61,
    slot62 = 62,
    slot63 = 63,
    slot64 = 64,
    slot65 = 65,
    slot66 = 66,
    slot67 = 67,
    slot68 = 68,
    slot69 = 69,
    slot70 = 70,
    slot71 = 71,
    slot72 = 72,
    slot73 = 73,
    slot74 = 74,
    slot75 = 75,
    slot76 = 76,
    slot77 = 77,
    slot78 = 78,
    slot79 = 79,
    slot80 = 80,
    slot81 = 81,
    slot82 = 82,
    slot83 = 83,
    slot84 = 84,
    slot85 = 85,
    slot86 = 86,
    slot87 = 87,
    slot88 = 88,
    slot89 = 89,
    slot90 = 90,
    slot91 = 91,
    slot92 = 92,
    slot93 = 93,
    slot94 = 94,
}

/// Slot 4, the context number: 0 for the null context (all cuBLASLt has
/// been seen to pass), else the context's handle, which is also what
/// `cuCtxGetId` answers for it.
extern "C" fn slot4(ctx: *mut c_void, number: *mut u64) -> CUresult {
    tracing::trace!("dark API tools context slot 4 ({ctx:?}, {number:?})");
    if number.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a u64 to fill.
    unsafe { *number = ctx as u64 };
    CUDA_SUCCESS
}

/// What slot 51 hands out for a context: the words NVIDIA's driver 580 wrote
/// for the H100's primary context (1, 0, 0, the context), then zeros.
#[repr(C)]
#[allow(dead_code)] // read by the library, through the pointer slot 51 hands out
struct ContextObject([u64; 8]);

/// Slot 51, called by cuSOLVER (`cusolverDn*getrs`, through `torch.linalg.solve`
/// and `cupy.linalg.solve`) as `(context, 0, *mut object)`; it then passes the
/// object to slot 39. Its meaning is not known; the driver's answer is
/// reproduced: a pointer to an object of the context (one per context, kept for
/// the process's life). Answering "not supported" failed every `getrs` with
/// `CUSOLVER_STATUS_INTERNAL_ERROR`.
extern "C" fn slot51(ctx: *mut c_void, reserved: u64, object: *mut *const c_void) -> CUresult {
    tracing::debug!("dark API tools context slot 51 ({ctx:?}, {reserved:#x})");
    if object.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    static OBJECTS: std::sync::Mutex<Vec<(usize, &'static ContextObject)>> =
        std::sync::Mutex::new(Vec::new());
    let mut objects = OBJECTS.lock().unwrap_or_else(|p| p.into_inner());
    let found = match objects.iter().find(|(c, _)| *c == ctx as usize) {
        Some(&(_, o)) => o,
        None => {
            let o: &'static ContextObject =
                Box::leak(Box::new(ContextObject([1, 0, ctx as u64, 0, 0, 0, 0, 0])));
            objects.push((ctx as usize, o));
            o
        }
    };
    // SAFETY: checked non-null; the caller passes a pointer to fill.
    unsafe { *object = (found as *const ContextObject).cast() };
    CUDA_SUCCESS
}

/// Slot 39, called by cuSOLVER right after slot 51 as `(context, object, *mut u64)`:
/// NVIDIA's driver 580 wrote 7 for the H100's primary context; cumux writes the same.
extern "C" fn slot39(ctx: *mut c_void, object: *const c_void, value: *mut u64) -> CUresult {
    tracing::debug!("dark API tools context slot 39 ({ctx:?}, {object:?})");
    if object.is_null() || value.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a u64 to fill.
    unsafe { *value = 7 };
    CUDA_SUCCESS
}

/// The table `cuGetExportTable` hands out for [`TOOLS_CONTEXT_ID`].
pub fn table() -> *const c_void {
    TABLE.0.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_its_size_and_no_null_slot() {
        let t = table() as *const usize;
        // SAFETY: the table is a static array of TOOLS_CONTEXT_SLOTS words.
        let words = unsafe { std::slice::from_raw_parts(t, TOOLS_CONTEXT_SLOTS) };
        assert_eq!(words[0], TOOLS_CONTEXT_SLOTS * 8);
        assert!(words[1..].iter().all(|&w| w != 0));
        // SAFETY: every slot holds an `extern "C" fn() -> CUresult`.
        let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(words[7]) };
        assert_eq!(f(), CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(TOOLS_CONTEXT_ID[0], 0x21);
        assert_eq!(TOOLS_CONTEXT_ID[15], 0xf2);
    }

    /// cuSOLVER's `getrs` fails unless slot 51 hands out an object that slot 39 reads.
    #[test]
    fn slots_51_and_39_answer_as_the_driver_did() {
        let t = table() as *const usize;
        type ObjectSlot = extern "C" fn(*mut c_void, u64, *mut *const c_void) -> CUresult;
        type ValueSlot = extern "C" fn(*mut c_void, *const c_void, *mut u64) -> CUresult;
        // SAFETY: slots 51 and 39 of the static table hold `slot51` and `slot39`.
        let s51 = unsafe { std::mem::transmute::<usize, ObjectSlot>(*t.add(51)) };
        // SAFETY: as above.
        let s39 = unsafe { std::mem::transmute::<usize, ValueSlot>(*t.add(39)) };
        let ctx = 0x1230 as *mut c_void;
        let (mut a, mut b) = (std::ptr::null(), std::ptr::null());
        assert_eq!(s51(ctx, 0, &mut a), CUDA_SUCCESS);
        assert_eq!(s51(ctx, 0, &mut b), CUDA_SUCCESS);
        assert!(!a.is_null());
        assert_eq!(a, b, "one object per context");
        assert_eq!(s51(ctx, 0, std::ptr::null_mut()), CUDA_ERROR_INVALID_VALUE);
        let mut v = 0u64;
        assert_eq!(s39(ctx, a, &mut v), CUDA_SUCCESS);
        assert_eq!(v, 7);
        assert_eq!(s39(ctx, std::ptr::null(), &mut v), CUDA_ERROR_INVALID_VALUE);
    }

    /// cuBLASLt fails every GEMM with `CUBLAS_STATUS_NOT_SUPPORTED` unless
    /// slot 4 answers for the null context.
    #[test]
    fn slot4_answers_the_context_number() {
        let t = table() as *const usize;
        // SAFETY: slot 4 of the static table holds `slot4`.
        let f: extern "C" fn(*mut c_void, *mut u64) -> CUresult =
            unsafe { std::mem::transmute(*t.add(4)) };
        let mut n = 7u64;
        assert_eq!(f(std::ptr::null_mut(), &mut n), CUDA_SUCCESS);
        assert_eq!(n, 0);
        assert_eq!(f(0x1234 as *mut c_void, &mut n), CUDA_SUCCESS);
        assert_eq!(n, 0x1234);
        assert_eq!(
            f(std::ptr::null_mut(), std::ptr::null_mut()),
            CUDA_ERROR_INVALID_VALUE
        );
    }
}
