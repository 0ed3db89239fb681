//! Export table `6e163fbe-b958-444d-835c-e182aff1991e`, the driver's "tools
//! module" interface (CU_ETID_ToolsModule in public accounts): functions of a module.
//!
//! cuFFT 12/13 (through `torch.fft` and `cupy.fft`) loads each plan's kernels
//! as a module and finds its kernel through slot 7, never by name. Observed
//! with a logging `libcuda.so.1` in front of NVIDIA's driver 580 on the H100
//! (`bench/h100/probes/export_log.sh`): slot 7 is called as `(context,
//! module, callback, user data)`, calls `callback(user data, function)` for
//! the module's functions (cuFFT's callback stores the function through its
//! user data) and returned 1 for each of cuFFT's one-kernel modules. cumux
//! answers the number of functions it visited. Without the table every plan
//! fails with `CUFFT_INTERNAL_ERROR`. No other slot was called; each says
//! which one it is and answers `CUDA_ERROR_NOT_SUPPORTED`.
use std::ffi::c_void;

use crate::abi::handle;
use crate::errors::*;

/// The GUID as the runtime passes it (bytes in this order).
pub const TOOLS_MODULE_ID: [u8; 16] = 0x6e163fbe_b958_444d_835c_e182aff1991eu128.to_be_bytes();

/// Slots, including the size header in slot 0 (driver 580's size: 0x318 bytes).
pub const TOOLS_MODULE_SLOTS: usize = 99;

/// What slot 7 calls once per function: (user data, function, reserved 0).
type FunctionVisitor = extern "C" fn(*mut c_void, *mut c_void, u64);

#[repr(transparent)]
struct Table([*const c_void; TOOLS_MODULE_SLOTS]);
// SAFETY: never written after initialisation; holds a size and function
// addresses only.
unsafe impl Sync for Table {}

/// Every slot but 7: says which one was called, answers not supported (the
/// indices are token trees so that `@slot 7` can pick slot 7 out).
macro_rules! unsupported_slots {
    (@slot 7) => { slot7 as *const c_void };
    (@slot $index:tt) => {{
        extern "C" fn unsupported() -> CUresult {
            tracing::warn!(
                "dark API tools module slot {} called; answering not supported",
                $index
            );
            CUDA_ERROR_NOT_SUPPORTED
        }
        unsupported as *const c_void
    }};
    ($($index:tt)*) => {
        static TABLE: Table = Table([
            (TOOLS_MODULE_SLOTS * std::mem::size_of::<usize>()) as *const c_void,
            $(unsupported_slots!(@slot $index)),*
        ]);
    };
}

unsupported_slots! {
    1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32
    33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61
    62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90
    91 92 93 94 95 96 97 98
}

/// The module's functions, as the program names them.
fn functions_of(module: *mut c_void) -> CuResult<Vec<*mut c_void>> {
    let c = crate::state::client()?;
    let st = c.lock();
    crate::exports::module_functions(&st, handle(module))
}

/// Slot 7: calls `visit(user, function, 0)` for each function of `module`
/// and answers how many it visited; 0 (nothing visited) for a module it does
/// not know, a missing callback, or a callback that panicked.
extern "C" fn slot7(
    ctx: *mut c_void,
    module: *mut c_void,
    visit: Option<FunctionVisitor>,
    user: *mut c_void,
) -> u32 {
    let functions = std::panic::catch_unwind(|| functions_of(module));
    let (Ok(Ok(functions)), Some(visit)) = (functions, visit) else {
        tracing::debug!("dark API tools module slot 7 ({ctx:?}, {module:?}): nothing to visit");
        return 0;
    };
    tracing::debug!(
        "dark API tools module slot 7 ({ctx:?}, {module:?}): {} functions",
        functions.len()
    );
    for &f in &functions {
        visit(user, f, 0);
    }
    functions.len() as u32
}

/// The table `cuGetExportTable` hands out for [`TOOLS_MODULE_ID`].
pub fn table() -> *const c_void {
    TABLE.0.as_ptr().cast()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_its_size_and_no_null_slot() {
        let t = table() as *const usize;
        // SAFETY: the table is a static array of TOOLS_MODULE_SLOTS words.
        let words = unsafe { std::slice::from_raw_parts(t, TOOLS_MODULE_SLOTS) };
        assert_eq!(words[0], 0x318);
        assert!(words[1..].iter().all(|&w| w != 0));
        assert_eq!(words[7], slot7 as *const () as usize);
        // SAFETY: every slot but 7 holds an `extern "C" fn() -> CUresult`.
        let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(words[8]) };
        assert_eq!(f(), CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(TOOLS_MODULE_ID[0], 0x6e);
        assert_eq!(TOOLS_MODULE_ID[15], 0x1e);
    }

    extern "C" fn keep(user: *mut c_void, f: *mut c_void, _: u64) {
        // SAFETY: the test passes a `Vec<usize>` as user data.
        unsafe { (*user.cast::<Vec<usize>>()).push(f as usize) };
    }

    #[test]
    fn slot7_visits_nothing_without_a_callback_or_a_known_module() {
        let mut seen: Vec<usize> = Vec::new();
        let user = (&mut seen as *mut Vec<usize>).cast();
        assert_eq!(
            slot7(std::ptr::null_mut(), 0x40 as *mut c_void, None, user),
            0
        );
        // No server here: the module is unknown, nothing is visited.
        assert_eq!(
            slot7(std::ptr::null_mut(), 0x40 as *mut c_void, Some(keep), user),
            0
        );
        assert!(seen.is_empty());
    }
}
