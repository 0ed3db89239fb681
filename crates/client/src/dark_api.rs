//! The CUDA runtime's private export tables (`cuGetExportTable`). NVIDIA does
//! not document them; what is known comes from observing the runtime (run a
//! program with `CUMUX_LOG=debug`) and from other re-implementations. Each
//! table is an array of pointers; in most, slot 0 holds the table's size in
//! bytes. Slots whose meaning is unknown point to functions that log the call
//! and report success.
//!
//! | GUID | what it is |
//! |---|---|
//! | `6bd5fb6c-5bf4-e74a-8987-d93912fd9df9` | cudart interface: modules from fat binaries, primary context |
//! | `a094798c-2e74-2e74-93f2-0800200c0a66` | tools runtime callback hooks: two scratch buffers |
//! | `42d85a81-23f6-cb47-8298-f6e78a3aecdc` | tools thread-local storage: three slots of unknown use, answering 0 (cuBLASLt calls slot 2 on every heuristic query) |
//! | `c693336e-1121-df11-a8c3-68f355d89593` | context-local storage: put / delete / get per (context, key) |
//! | `263e8860-7cd2-6143-92f6-bbd5006dfa7e` | context checks, 4 slots: slot 1 "not supported", slot 2 writes 0 ("fine"), slot 3 answers 0 |
//! | `f8cff951-2146-8b4e-b9e2-fb469e7c0dd9` | asks whether start-up may be bypassed: refused (not found) |
//! | `d4082055-bde6-704b-8d34-ba123c66e1f2` | runtime/driver integrity check: slot 1 hashes; fixed answers for check versions ending in 0 and 1 |
//! | `21318c60-9714-3248-8ca6-41ff7324c8f2` | tools context; asked for by the CUDA 13.5 runtime, which fails without it and calls none of its slots, and by cuBLASLt, whose GEMMs all return `CUBLAS_STATUS_NOT_SUPPORTED` unless slot 4 (context number) answers (see `crate::tools_context`) |
//! | `6e163fbe-b958-444d-835c-e182aff1991e` | tools module: cuFFT finds each plan's kernel through slot 7, which visits a module's functions (see `crate::tools_module`) |
//! | `69a28e9f-2449-8b47-b030-c5da330ea4e9` | asked once per process by PyTorch's CUDA 13 runtime, right after it first looks up context-local storage; refused (not found) |
//! | `da9151d3-3ae6-cc41-a5c0-4f26d533e328` | asked by cuDNN 9 when it starts; refused (not found) |
//! | `1734dc26-800d-4745-8726-c0f1e7dd8bca` | device layout, 16 slots: cuBLASLt 13 asks for it before its Hopper bf16/fp16 GEMMs and calls it without a null check (a refusal crashes the program). Read from its code: slot 4 hands out a byte array of the GPU's layout (one byte per pair of SMs; it counts the bytes per value) and slot 13 releases it; any error from slot 4 sends cuBLASLt to its fallback. NVIDIA's driver 580 itself answered slot 4 with error 3 in a plain program on the H100. Every slot answers not supported, logged. |
//!
//! Who asks for what (measured on the H100 with PyTorch 2.11+cu130): every
//! copy of the runtime (the program's, and the static ones inside cuBLAS,
//! cuBLASLt and cuDNN) asks for `f8cff951`, `6bd5fb6c`, `a094798c`,
//! `42d85a81`, `c693336e`, `263e8860` and `d4082055`; the last two are the
//! ones cuBLAS checks at `cublasCreate`. `69a28e9f` and `da9151d3` are asked
//! for too; no public account of either exists and NVIDIA-less peers
//! refuse both. With both refused, cuDNN convolutions and graph capture ran
//! on the H100, and `cublasCreate` failed for another reason: cuBLAS loads
//! libraries with no code for the GPU, which NVIDIA's lazy loader accepts
//! (see `exports::module`). Past that, cuBLASLt calls the tools TLS slots on
//! every heuristic query, so no slot of any table here may be null.

use std::cell::UnsafeCell;
use std::ffi::c_void;

use crate::abi::{handle, out, to_ptr};
use crate::errors::*;

/// A table of pointers the runtime reads; immutable after start.
#[repr(transparent)]
pub struct Table<const N: usize>([*const c_void; N]);
// SAFETY: the table is never written after initialisation; it only holds
// function addresses and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

const fn size_of_table(slots: usize) -> *const c_void {
    (slots * std::mem::size_of::<usize>()) as *const c_void
}

/// Slots that answer success and do nothing, saying so in the log at
/// `$level` (the default: debug) with what they answer (`$answer`).
macro_rules! success_slots {
    ($($fname:ident = $label:literal),* $(,)?) => {
        success_slots!(debug, "success"; $($fname = $label),*);
    };
    ($level:ident, $answer:literal; $($fname:ident = $label:literal),* $(,)?) => {
        $(
            extern "C" fn $fname() -> CUresult {
                tracing::$level!(concat!("dark API ", $label, " called; answering ", $answer));
                CUDA_SUCCESS
            }
        )*
    };
}

success_slots! {
    cudart_slot3 = "cudart interface slot 3",
    cudart_slot4 = "cudart interface slot 4",
    cudart_slot5 = "cudart interface slot 5",
    cudart_slot9 = "cudart interface slot 9",
    cudart_slot10 = "cudart interface slot 10",
    cudart_slot11 = "cudart interface slot 11",
    cudart_slot12 = "cudart interface slot 12 (load compilers)",
    hooks_slot1 = "tools hooks slot 1",
    hooks_slot3 = "tools hooks slot 3",
    hooks_slot4 = "tools hooks slot 4",
    hooks_slot5 = "tools hooks slot 5",
    checks_slot3 = "context checks slot 3",
    storage_slot3 = "context storage slot 3",
    integrity_slot2 = "integrity check slot 2",
}

// ---- cudart interface ------------------------------------------------------

/// Slot 1: load the module of a `__fatBinC_Wrapper_t`.
extern "C" fn get_module_from_cubin(module: *mut *mut c_void, wrapper: *const c_void) -> CUresult {
    crate::abi::guard("cudart.get_module_from_cubin", || {
        load_into(module, wrapper)
    })
}

/// Slot 2: the primary context of a device, retained.
extern "C" fn primary_context(pctx: *mut *mut c_void, device: i32) -> CUresult {
    // SAFETY: forwarding the runtime's own arguments to the public entry point.
    unsafe { crate::exports::cuDevicePrimaryCtxRetain(pctx, device) }
}

/// Slot 6: as slot 1, with three extra arguments of unknown use.
extern "C" fn get_module_from_cubin_ext1(
    module: *mut *mut c_void,
    wrapper: *const c_void,
    _a3: *mut c_void,
    _a4: *mut c_void,
    _a5: u32,
) -> CUresult {
    crate::abi::guard("cudart.get_module_from_cubin_ext1", || {
        load_into(module, wrapper)
    })
}

/// Slot 7: called with one integer at start-up; nothing to do.
extern "C" fn cudart_slot7(_arg: usize) -> CUresult {
    CUDA_SUCCESS
}

/// Slot 8: load a module from a fat binary header (arguments in the other order).
extern "C" fn get_module_from_cubin_ext2(
    fatbin: *const c_void,
    module: *mut *mut c_void,
    _a3: *mut c_void,
    _a4: *mut c_void,
    _a5: u32,
) -> CUresult {
    crate::abi::guard("cudart.get_module_from_cubin_ext2", || {
        load_into(module, fatbin)
    })
}

fn load_into(module: *mut *mut c_void, image: *const c_void) -> CuResult<()> {
    let client = crate::state::client()?;
    let bytes = crate::exports::image_from_pointer(image)?;
    let device = client.lock().current_device();
    let m = client.load_module(device, bytes, None)?;
    out(module, crate::state::handles::to_program(m))
}

static CUDART_INTERFACE: Table<13> = Table([
    size_of_table(13),
    get_module_from_cubin as *const c_void,
    primary_context as *const c_void,
    cudart_slot3 as *const c_void,
    cudart_slot4 as *const c_void,
    cudart_slot5 as *const c_void,
    get_module_from_cubin_ext1 as *const c_void,
    cudart_slot7 as *const c_void,
    get_module_from_cubin_ext2 as *const c_void,
    cudart_slot9 as *const c_void,
    cudart_slot10 as *const c_void,
    cudart_slot11 as *const c_void,
    cudart_slot12 as *const c_void,
]);

// ---- tools callback hooks --------------------------------------------------

/// Zeroed scratch memory the runtime's tools hooks read and write.
struct Scratch<const N: usize>(UnsafeCell<[u64; N]>);
// SAFETY: the runtime owns the contents; cumux only hands out the address.
unsafe impl<const N: usize> Sync for Scratch<N> {}

static HOOKS_BUFFER_A: Scratch<1024> = Scratch(UnsafeCell::new([0; 1024]));
static HOOKS_BUFFER_B: Scratch<64> = Scratch(UnsafeCell::new([0; 64]));

extern "C" fn hooks_buffer_a(ptr: *mut *mut c_void, size: *mut usize) {
    let _ = out(ptr, HOOKS_BUFFER_A.0.get().cast());
    let _ = out(size, 1024);
}

extern "C" fn hooks_buffer_b(ptr: *mut *mut c_void, size: *mut usize) {
    let _ = out(ptr, HOOKS_BUFFER_B.0.get().cast());
    let _ = out(size, 14);
}

static TOOLS_HOOKS: Table<7> = Table([
    size_of_table(7),
    hooks_slot1 as *const c_void,
    hooks_buffer_a as *const c_void,
    hooks_slot3 as *const c_void,
    hooks_slot4 as *const c_void,
    hooks_slot5 as *const c_void,
    hooks_buffer_b as *const c_void,
]);

// Tools thread-local storage: cuBLASLt's copy of the runtime calls its slots
// (a null slot crashed `cublasSgemm` in `cublasLtSSSMatmulAlgoGetHeuristic`);
// answering 0 ("success", "nothing stored") lets it go on. Called on every
// cuBLASLt heuristic query: logged at trace level only.
success_slots! {
    trace, "0";
    tools_tls_slot1 = "tools TLS slot 1",
    tools_tls_slot2 = "tools TLS slot 2",
    tools_tls_slot3 = "tools TLS slot 3",
}

static TOOLS_TLS: Table<4> = Table([
    size_of_table(4),
    tools_tls_slot1 as *const c_void,
    tools_tls_slot2 as *const c_void,
    tools_tls_slot3 as *const c_void,
]);

// ---- context-local storage -------------------------------------------------

type StorageDtor = Option<extern "C" fn(*mut c_void, *mut c_void, *mut c_void)>;

fn storage_context(ctx: *mut c_void) -> CuResult<usize> {
    match handle(ctx) {
        0 => crate::state::current_context().ok_or(CUDA_ERROR_INVALID_CONTEXT),
        c => Ok(c),
    }
}

extern "C" fn storage_put(
    ctx: *mut c_void,
    key: *mut c_void,
    value: *mut c_void,
    _dtor: StorageDtor,
) -> CUresult {
    crate::abi::guard("context_storage.put", || {
        let ctx = storage_context(ctx)?;
        let client = crate::state::client()?;
        client
            .lock()
            .ctx_storage
            .insert((ctx, handle(key)), handle(value));
        Ok(())
    })
}

extern "C" fn storage_delete(ctx: *mut c_void, key: *mut c_void) -> CUresult {
    crate::abi::guard("context_storage.delete", || {
        let ctx = storage_context(ctx)?;
        let client = crate::state::client()?;
        client.lock().ctx_storage.remove(&(ctx, handle(key)));
        Ok(())
    })
}

extern "C" fn storage_get(value: *mut *mut c_void, ctx: *mut c_void, key: *mut c_void) -> CUresult {
    crate::abi::guard("context_storage.get", || {
        let ctx = storage_context(ctx)?;
        let client = crate::state::client()?;
        let found = client.lock().ctx_storage.get(&(ctx, handle(key))).copied();
        match found {
            Some(v) => out(value, to_ptr(v)),
            None => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    })
}

static CONTEXT_STORAGE: Table<4> = Table([
    storage_put as *const c_void,
    storage_delete as *const c_void,
    storage_get as *const c_void,
    storage_slot3 as *const c_void,
]);

// ---- context checks ----------------------------------------------------------

/// Slot 1: a check CUDA 13's driver answers "not supported" (as a peer
/// observed); it writes nothing, so no caller reads an out-value never set.
extern "C" fn context_check_unsupported(
    _ctx: *mut c_void,
    _result: *mut u32,
    _detail: *mut *const c_void,
) -> CUresult {
    tracing::debug!("dark API context checks slot 1 called; answering not supported");
    CUDA_ERROR_NOT_SUPPORTED
}

/// Slot 2: writes 0 ("fine") to `result` and leaves `detail` untouched.
extern "C" fn context_check(
    _ctx: *mut c_void,
    result: *mut u32,
    _detail: *mut *const c_void,
) -> CUresult {
    let _ = out(result, 0);
    CUDA_SUCCESS
}

/// Four slots, as cuBLAS, cuDNN and the runtime were seen using it on the
/// H100 (only slot 3 was called). A peer reports 17 slots for CUDA 13.3's
/// driver; a larger size invites callers into slots cumux cannot fill, so it
/// stays at what was measured to work.
static CONTEXT_CHECKS: Table<CONTEXT_CHECKS_SLOTS> = Table([
    size_of_table(CONTEXT_CHECKS_SLOTS),
    context_check_unsupported as *const c_void,
    context_check as *const c_void,
    checks_slot3 as *const c_void,
]);
const CONTEXT_CHECKS_SLOTS: usize = 4;

// ---- integrity check ---------------------------------------------------------

/// Slot 1 of the integrity table: see `crate::integrity`.
extern "C" fn integrity_check(version: u32, unix_seconds: u64, result: *mut [u64; 2]) -> CUresult {
    crate::abi::guard("integrity_check", || {
        tracing::debug!("dark API integrity check: version {version}, time {unix_seconds}");
        let client = crate::state::client()?;
        let devices = (0..client.devices.len() as i32)
            .map(|d| {
                Ok(crate::integrity::DeviceFacts {
                    uuid: client.device(d)?.uuid,
                    pci_domain: client.attribute(d, 50)?,
                    pci_bus: client.attribute(d, 33)?,
                    pci_device: client.attribute(d, 34)?,
                })
            })
            .collect::<CuResult<Vec<_>>>()?;
        let inputs = crate::integrity::Inputs {
            driver_version: crate::abi::DRIVER_VERSION as u32,
            version,
            process: std::process::id(),
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() } as u32,
            cudart_table: CUDART_INTERFACE.0.as_ptr() as u64,
            integrity_table: INTEGRITY.0.as_ptr() as u64,
            check_fn: integrity_check as *const c_void as u64,
            unix_seconds,
            devices,
        };
        out(result, crate::integrity::answer(&inputs))
    })
}

static INTEGRITY: Table<3> = Table([
    size_of_table(3),
    integrity_check as *const c_void,
    integrity_slot2 as *const c_void,
]);

// ---- device layout -------------------------------------------------------------

macro_rules! layout_slots {
    ($($fname:ident = $index:literal),* $(,)?) => {
        $(
            extern "C" fn $fname() -> CUresult {
                tracing::debug!(
                    "dark API device layout slot {} called; answering not supported",
                    $index
                );
                CUDA_ERROR_NOT_SUPPORTED
            }
        )*
        static DEVICE_LAYOUT: Table<17> = Table([
            size_of_table(17),
            $($fname as *const c_void),*
        ]);
    };
}

layout_slots! {
    layout1 = 1, layout2 = 2, layout3 = 3, layout4 = 4, layout5 = 5, layout6 = 6,
    layout7 = 7, layout8 = 8, layout9 = 9, layout10 = 10, layout11 = 11,
    layout12 = 12, layout13 = 13, layout14 = 14, layout15 = 15, layout16 = 16,
}

const fn guid(s: u128) -> [u8; 16] {
    s.to_be_bytes()
}

const CUDART_INTERFACE_ID: [u8; 16] = guid(0x6bd5fb6c_5bf4_e74a_8987_d93912fd9df9);
const TOOLS_HOOKS_ID: [u8; 16] = guid(0xa094798c_2e74_2e74_93f2_0800200c0a66);
const TOOLS_TLS_ID: [u8; 16] = guid(0x42d85a81_23f6_cb47_8298_f6e78a3aecdc);
const CONTEXT_STORAGE_ID: [u8; 16] = guid(0xc693336e_1121_df11_a8c3_68f355d89593);
const CONTEXT_CHECKS_ID: [u8; 16] = guid(0x263e8860_7cd2_6143_92f6_bbd5006dfa7e);
const BYPASS_ID: [u8; 16] = guid(0xf8cff951_2146_8b4e_b9e2_fb469e7c0dd9);
const INTEGRITY_ID: [u8; 16] = guid(0xd4082055_bde6_704b_8d34_ba123c66e1f2);
const DEVICE_LAYOUT_ID: [u8; 16] = guid(0x1734dc26_800d_4745_8726_c0f1e7dd8bca);
/// Tables asked for whose refusal is known to be harmless (see the module
/// docs); refused quietly, where an unknown one is a warning.
const KNOWN_REFUSED: [[u8; 16]; 2] = [
    guid(0x69a28e9f_2449_8b47_b030_c5da330ea4e9),
    guid(0xda9151d3_3ae6_cc41_a5c0_4f26d533e328),
];

fn format_guid(b: &[u8; 16]) -> String {
    let h: Vec<String> = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// The table for a GUID, or `None` (logged) for one cumux does not answer.
pub fn export_table(id: &[u8; 16]) -> Option<*const c_void> {
    let table: *const c_void = match *id {
        CUDART_INTERFACE_ID => CUDART_INTERFACE.0.as_ptr().cast(),
        TOOLS_HOOKS_ID => TOOLS_HOOKS.0.as_ptr().cast(),
        TOOLS_TLS_ID => TOOLS_TLS.0.as_ptr().cast(),
        CONTEXT_STORAGE_ID => CONTEXT_STORAGE.0.as_ptr().cast(),
        CONTEXT_CHECKS_ID => CONTEXT_CHECKS.0.as_ptr().cast(),
        INTEGRITY_ID => INTEGRITY.0.as_ptr().cast(),
        DEVICE_LAYOUT_ID => DEVICE_LAYOUT.0.as_ptr().cast(),
        crate::tools_context::TOOLS_CONTEXT_ID => crate::tools_context::table(),
        crate::tools_module::TOOLS_MODULE_ID => crate::tools_module::table(),
        _ if KNOWN_REFUSED.contains(id) => {
            tracing::debug!(
                "cuGetExportTable({}): refused (known, not needed)",
                format_guid(id)
            );
            return None;
        }
        BYPASS_ID => {
            tracing::debug!("cuGetExportTable({}): refused", format_guid(id));
            return None;
        }
        _ => {
            tracing::warn!("cuGetExportTable({}): unknown table", format_guid(id));
            return None;
        }
    };
    tracing::debug!("cuGetExportTable({}): answered", format_guid(id));
    Some(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_read_as_the_runtime_writes_them() {
        assert_eq!(
            format_guid(&CUDART_INTERFACE_ID),
            "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"
        );
        assert_eq!(CUDART_INTERFACE_ID[0], 0x6b);
        assert_eq!(CUDART_INTERFACE_ID[15], 0xf9);
    }

    #[test]
    fn known_tables_answer_and_others_do_not() {
        for id in [
            CUDART_INTERFACE_ID,
            TOOLS_HOOKS_ID,
            TOOLS_TLS_ID,
            CONTEXT_STORAGE_ID,
            CONTEXT_CHECKS_ID,
            INTEGRITY_ID,
            // The tools context table (`crate::tools_context`).
            crate::tools_context::TOOLS_CONTEXT_ID,
            crate::tools_module::TOOLS_MODULE_ID,
        ] {
            let table = export_table(&id).expect("answered");
            assert!(!table.is_null());
        }
        assert!(export_table(&BYPASS_ID).is_none());
        // No function slot is null: a caller jumping there would crash.
        let tls = export_table(&TOOLS_TLS_ID).unwrap() as *const usize;
        for slot in 1..4 {
            // SAFETY: the table is a static array of 4 pointers.
            assert_ne!(unsafe { *tls.add(slot) }, 0, "tools TLS slot {slot}");
        }
        for id in KNOWN_REFUSED {
            assert!(export_table(&id).is_none());
        }
        assert_eq!(
            format_guid(&KNOWN_REFUSED[0]),
            "69a28e9f-2449-8b47-b030-c5da330ea4e9"
        );
        // The context checks table: slot 1 says "not supported".
        let checks = export_table(&CONTEXT_CHECKS_ID).unwrap() as *const usize;
        // SAFETY: the table is a static array of CONTEXT_CHECKS_SLOTS pointers.
        let (size, slot1) = unsafe { (*checks, *checks.add(1)) };
        assert_eq!(size, CONTEXT_CHECKS_SLOTS * std::mem::size_of::<usize>());
        // SAFETY: slot 1 holds `context_check_unsupported`'s address.
        let check: extern "C" fn(*mut c_void, *mut u32, *mut *const c_void) -> CUresult =
            unsafe { std::mem::transmute(slot1) };
        let mut result = 7u32;
        assert_eq!(
            check(std::ptr::null_mut(), &mut result, std::ptr::null_mut()),
            CUDA_ERROR_NOT_SUPPORTED
        );
        assert!(export_table(&[0u8; 16]).is_none());
        // Slot 0 of the sized tables holds the size in bytes.
        let cudart = export_table(&CUDART_INTERFACE_ID).unwrap() as *const usize;
        // SAFETY: the table is a static array of 13 pointers.
        assert_eq!(unsafe { *cudart }, 13 * std::mem::size_of::<usize>());
    }

    /// cuBLASLt calls slot 4 of the device layout table without checking the
    /// table (a refusal crashed PyTorch's bf16 matmul on the H100); an error
    /// from the slot sends it to its fallback.
    #[test]
    fn the_device_layout_table_answers_with_errors_in_every_slot() {
        assert_eq!(
            format_guid(&DEVICE_LAYOUT_ID),
            "1734dc26-800d-4745-8726-c0f1e7dd8bca"
        );
        let table = export_table(&DEVICE_LAYOUT_ID).expect("answered") as *const usize;
        // SAFETY: the table is a static array of 17 pointers.
        assert_eq!(unsafe { *table }, 17 * std::mem::size_of::<usize>());
        for slot in 1..17 {
            // SAFETY: as above; each slot holds a `layout_slots!` function.
            let f: extern "C" fn() -> CUresult = unsafe { std::mem::transmute(*table.add(slot)) };
            assert_eq!(f(), CUDA_ERROR_NOT_SUPPORTED, "slot {slot}");
        }
    }
}
