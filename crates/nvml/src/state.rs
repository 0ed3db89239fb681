//! What `nvmlInit` found: the tenant's devices, each under the handle the
//! program gets (NVIDIA's own where NVIDIA's NVML stands behind, so that
//! forwarded calls work on it), and the C-ABI helpers every entry point uses.

use std::ffi::{c_char, c_uint, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};

use cumux_protocol::visible_devices::uuid_text;
use cumux_protocol::DeviceInfo;

use crate::real::{self, Nvidia};
use crate::types::*;
use crate::{forward, view};

/// One of the tenant's devices.
#[derive(Clone)]
pub struct Visible {
    pub info: DeviceInfo,
    /// The handle the program gets: NVIDIA's, else 1 + the device's index.
    pub handle: usize,
}

struct Nvml {
    devices: Vec<Visible>,
    inits: usize,
    /// NVIDIA's NVML, initialised, when it answers for every device here.
    behind: Option<&'static Nvidia>,
}

static STATE: Mutex<Nvml> = Mutex::new(Nvml {
    devices: Vec::new(),
    inits: 0,
    behind: None,
});

fn state() -> MutexGuard<'static, Nvml> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs an entry point's body; no panic crosses the C ABI.
pub fn guard(body: impl FnOnce() -> Result<(), NvmlReturn>) -> NvmlReturn {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

/// Writes through a pointer the program passed (null: invalid argument).
pub fn out<T>(ptr: *mut T, value: T) -> Result<(), NvmlReturn> {
    if ptr.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and NVML's contract makes it point to a writable T.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Copies `text` and a NUL into the program's buffer of `len` bytes.
pub fn out_str(buf: *mut c_char, len: c_uint, text: &str) -> Result<(), NvmlReturn> {
    if buf.is_null() {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    if text.len() + 1 > len as usize {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the program's buffer holds `len` bytes, more than written here.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), text.len());
        *buf.add(text.len()) = 0;
    }
    Ok(())
}

/// The tenant's devices, once initialised.
pub fn devices() -> Result<Vec<Visible>, NvmlReturn> {
    let nvml = state();
    if nvml.inits == 0 {
        return Err(NVML_ERROR_UNINITIALIZED);
    }
    Ok(nvml.devices.clone())
}

/// The index and device a handle names.
pub fn device(handle: *mut c_void) -> Result<(usize, DeviceInfo), NvmlReturn> {
    devices()?
        .into_iter()
        .enumerate()
        .find(|(_, d)| d.handle == handle as usize)
        .map(|(i, d)| (i, d.info))
        .ok_or(NVML_ERROR_INVALID_ARGUMENT)
}

/// NVIDIA's NVML where it answers for the tenant's devices.
pub fn behind() -> Option<&'static Nvidia> {
    state().behind
}

/// NVIDIA's function `name`, typed as `F`, where NVIDIA's NVML stands behind.
///
/// # Safety
/// `F` must be the C function type NVIDIA's header gives `name`.
pub unsafe fn nvidia_fn<F: Copy>(name: &str) -> Option<F> {
    // SAFETY: the caller's contract is `function`'s.
    unsafe { behind()?.function(name) }
}

type InitFn = unsafe extern "C" fn(c_uint) -> NvmlReturn;
type ShutdownFn = unsafe extern "C" fn() -> NvmlReturn;
type ByUuidFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> NvmlReturn;

/// NVIDIA's handle for each device, when NVIDIA's NVML here knows them all.
fn nvidia_handles(nvidia: &Nvidia, devices: &[DeviceInfo]) -> Result<Vec<usize>, String> {
    // SAFETY: NVIDIA's header gives nvmlDeviceGetHandleByUUID this type.
    let by_uuid: ByUuidFn = unsafe { nvidia.function("nvmlDeviceGetHandleByUUID") }
        .ok_or("it has no nvmlDeviceGetHandleByUUID")?;
    devices
        .iter()
        .map(|d| {
            let text = uuid_text(&d.uuid);
            let c = CString::new(text.clone()).map_err(|e| e.to_string())?;
            let mut handle = std::ptr::null_mut();
            // SAFETY: a NUL-terminated UUID and a place for the handle.
            let rc = unsafe { by_uuid(c.as_ptr(), &mut handle) };
            match rc {
                NVML_SUCCESS if !handle.is_null() => Ok(handle as usize),
                _ => Err(format!(
                    "it does not know the tenant's device {text} (error {rc})"
                )),
            }
        })
        .collect()
}

/// NVIDIA's NVML initialised with `flags`, and its handles for `devices`;
/// `None` (with the reason on stderr where one is worth telling) where it
/// cannot answer for all of them.
fn attach(devices: &[DeviceInfo], flags: c_uint) -> Option<(&'static Nvidia, Vec<usize>)> {
    let nvidia = real::nvidia()?;
    // SAFETY: NVIDIA's header gives these entry points these types.
    let (init, shutdown) = unsafe {
        (
            nvidia.function::<InitFn>("nvmlInitWithFlags")?,
            nvidia.function::<ShutdownFn>("nvmlShutdown")?,
        )
    };
    // SAFETY: NVIDIA's init with the program's flags.
    let rc = unsafe { init(flags) };
    if rc != NVML_SUCCESS {
        eprintln!(
            "cumux NVML: NVIDIA's NVML at {} did not start (error {rc}); only the tenant's view answers",
            nvidia.path.display()
        );
        return None;
    }
    match nvidia_handles(nvidia, devices) {
        Ok(handles) => Some((nvidia, handles)),
        Err(why) => {
            eprintln!(
                "cumux NVML: NVIDIA's NVML at {} is not used: {why}; only the tenant's view answers",
                nvidia.path.display()
            );
            // SAFETY: pairs the init above.
            unsafe { shutdown() };
            None
        }
    }
}

/// `nvmlInit*`: the first asks the server for the tenant's devices and puts
/// NVIDIA's NVML behind them where it can answer for them.
pub fn init(flags: c_uint) -> Result<(), NvmlReturn> {
    let mut nvml = state();
    if nvml.inits == 0 {
        let found = view::devices().map_err(|why| {
            eprintln!("cumux NVML: {why}");
            NVML_ERROR_DRIVER_NOT_LOADED
        })?;
        let attached = attach(&found, flags);
        let handles: Vec<usize> = match &attached {
            Some((nvidia, handles)) => {
                forward::fill(|name| nvidia.address(name));
                handles.clone()
            }
            None => {
                forward::clear();
                (1..=found.len()).collect()
            }
        };
        nvml.behind = attached.map(|(nvidia, _)| nvidia);
        nvml.devices = found
            .into_iter()
            .zip(handles)
            .map(|(info, handle)| Visible { info, handle })
            .collect();
    }
    nvml.inits += 1;
    forward::mark_initialized();
    Ok(())
}

/// `nvmlShutdown`: the last one lets NVIDIA's NVML go too.
pub fn shutdown() -> Result<(), NvmlReturn> {
    let mut nvml = state();
    nvml.inits = nvml.inits.checked_sub(1).ok_or(NVML_ERROR_UNINITIALIZED)?;
    if nvml.inits == 0 {
        if let Some(nvidia) = nvml.behind.take() {
            // SAFETY: NVIDIA's header gives nvmlShutdown this type.
            if let Some(shutdown) = unsafe { nvidia.function::<ShutdownFn>("nvmlShutdown") } {
                // SAFETY: pairs the init in `attach`.
                unsafe { shutdown() };
            }
        }
    }
    Ok(())
}
