//! [`Driver`]: the system's `libcuda.so.1`, opened at run time, with devices and
//! contexts; [`Context`] owns memory calls and is the parent of streams, events,
//! pinned buffers and modules (`objects.rs`), which keep it alive.

use std::ffi::{c_char, c_int, c_void, CStr, OsStr, OsString};
use std::mem::ManuallyDrop;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use libloading::Library;

use crate::error::{CudaError, LoadError};
use crate::sys::*;

/// Calls entry point `$name` of driver `$d` and turns its `CUresult` into a
/// `Result`. Expands to an unsafe fn-pointer call: the caller wraps it in
/// `unsafe` with a `SAFETY:` line about the pointers it passes.
macro_rules! cu {
    ($d:expr, $name:ident ( $($arg:expr),* $(,)? )) => {{
        let d: &$crate::driver::Driver = &$d;
        match d.api.$name {
            Some(f) => d.check(f($($arg),*), stringify!($name)),
            None => Err(d.missing(stringify!($name))),
        }
    }};
}
pub(crate) use cu;

/// Environment variable naming the NVIDIA driver library to load by path.
pub const REAL_LIBCUDA_ENV: &str = "CUMUX_REAL_LIBCUDA";
/// The soname loaded when [`REAL_LIBCUDA_ENV`] is unset.
pub const LIBCUDA_SONAME: &str = "libcuda.so.1";
/// Symbols only cumux's client driver exports; a library with any is refused.
pub const CUMUX_CLIENT_MARKERS: &[&str] = &["cumuxClientVersion", "cumux_client_marker"];

/// Device attributes are queried from 1 up to this number (CUDA 13.0 defines
/// 1 ..= 147; a few more leave room for newer drivers). Numbers the driver
/// does not know are skipped.
pub const MAX_DEVICE_ATTRIBUTE: u32 = 160;

/// A CUDA device ordinal of this driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId(pub(crate) CUdevice);

impl DeviceId {
    pub fn ordinal(self) -> i32 {
        self.0
    }
}

/// The system's CUDA driver, initialised. Shared (`Arc`) by everything made
/// from it. The library is never unloaded: the driver leaves threads running.
pub struct Driver {
    pub(crate) api: Api,
    library: String,
    version: i32,
    _lib: ManuallyDrop<Library>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("library", &self.library)
            .field("version", &self.version)
            .finish()
    }
}

impl Driver {
    /// Loads and initialises the system driver: the library named by
    /// `CUMUX_REAL_LIBCUDA` (a path) if set, else `libcuda.so.1`.
    pub fn load() -> Result<Arc<Driver>, LoadError> {
        let name: OsString = std::env::var_os(REAL_LIBCUDA_ENV)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| LIBCUDA_SONAME.into());
        let driver = Driver::open(&name)?;
        driver.init().map_err(|error| LoadError::Init {
            library: driver.library.clone(),
            error,
        })?;
        Ok(Arc::new(driver))
    }

    /// Opens `library` and resolves its entry points without initialising it.
    /// Refuses cumux's own client driver and libraries that are not CUDA drivers.
    pub fn open(library: &OsStr) -> Result<Driver, LoadError> {
        let shown = library.to_string_lossy().into_owned();
        // SAFETY: loading runs the library's initialisers; the library is the
        // system's CUDA driver or the one the operator named, and it is checked
        // for cumux's marker before any of its functions is called.
        let lib = unsafe { Library::new(library) }.map_err(|e| LoadError::Open {
            library: shown.clone(),
            reason: e.to_string(),
        })?;
        for marker in CUMUX_CLIENT_MARKERS {
            // SAFETY: only the symbol's address is read, never dereferenced.
            if unsafe { lookup::<*const c_void>(&lib, marker) }.is_some() {
                return Err(LoadError::CumuxClient { library: shown });
            }
        }
        let api = Api::resolve(&lib);
        if let Some(file) = api.cuInit.and_then(|f| defining_file(f as *const c_void)) {
            // cumux's client loaded through a `libcuda.so.1` link (as `cumux
            // run` arranges) still has its own file name behind the link.
            let real = std::fs::canonicalize(&file).unwrap_or(file);
            let name = real.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.is_some_and(|n| n.starts_with("libcumux")) {
                return Err(LoadError::CumuxClient {
                    library: real.display().to_string(),
                });
            }
        }
        let required = [
            ("cuInit", api.cuInit.is_some()),
            ("cuDriverGetVersion", api.cuDriverGetVersion.is_some()),
            ("cuGetErrorName", api.cuGetErrorName.is_some()),
            ("cuDeviceGetCount", api.cuDeviceGetCount.is_some()),
            ("cuDeviceGet", api.cuDeviceGet.is_some()),
            ("cuDeviceGetAttribute", api.cuDeviceGetAttribute.is_some()),
            (
                "cuCtxCreate_v2",
                api.cuCtxCreate.is_some() || api.cuCtxCreate_v4.is_some(),
            ),
            ("cuCtxSetCurrent", api.cuCtxSetCurrent.is_some()),
            ("cuMemAlloc_v2", api.cuMemAlloc.is_some()),
            ("cuModuleLoadData", api.cuModuleLoadData.is_some()),
            ("cuLaunchKernel", api.cuLaunchKernel.is_some()),
        ];
        if let Some((symbol, _)) = required.iter().find(|(_, present)| !present) {
            return Err(LoadError::MissingSymbol {
                library: shown,
                symbol,
            });
        }
        Ok(Driver {
            api,
            library: shown,
            version: 0,
            _lib: ManuallyDrop::new(lib),
        })
    }

    /// `cuInit(0)`, then the driver's CUDA version.
    pub fn init(&self) -> Result<(), CudaError> {
        // SAFETY: cuInit takes flags by value.
        unsafe { cu!(self, cuInit(0)) }
    }

    /// The library this driver was loaded from, as named when loading.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// The file the driver's code lives in, links resolved, if known.
    pub fn library_file(&self) -> Option<std::path::PathBuf> {
        let file = defining_file(self.api.cuInit? as *const c_void)?;
        Some(std::fs::canonicalize(&file).unwrap_or(file))
    }

    /// The driver's CUDA version, e.g. 13000 for CUDA 13.0.
    pub fn version(&self) -> Result<i32, CudaError> {
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer for the call.
        unsafe { cu!(self, cuDriverGetVersion(&mut v))? };
        Ok(v)
    }

    /// The driver's name for `code` (`CUDA_ERROR_INVALID_VALUE`), or `CUresult N`.
    pub fn error_name(&self, code: u32) -> String {
        let fallback = || format!("CUresult {code}");
        let Some(f) = self.api.cuGetErrorName else {
            return fallback();
        };
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: `name` is a valid out-pointer; on success the driver points it
        // at a static NUL-terminated string.
        let rc = unsafe { f(code, &mut name) };
        if rc != CUDA_SUCCESS || name.is_null() {
            return fallback();
        }
        // SAFETY: non-null and NUL-terminated, owned by the driver for its life.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// The driver's description of `code`, if it has one.
    pub fn error_string(&self, code: u32) -> Option<String> {
        let f = self.api.cuGetErrorString?;
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: as in `error_name`.
        let rc = unsafe { f(code, &mut text) };
        if rc != CUDA_SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: non-null and NUL-terminated, owned by the driver.
        Some(
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    pub(crate) fn check(&self, code: CUresult, call: &'static str) -> Result<(), CudaError> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CudaError::new(code, self.error_name(code), call))
        }
    }

    pub(crate) fn missing(&self, call: &'static str) -> CudaError {
        CudaError::new(CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", call)
            .with_detail(format!("{} has no {call}", self.library))
    }

    // ---- devices ----

    pub fn device_count(&self) -> Result<u32, CudaError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer.
        unsafe { cu!(self, cuDeviceGetCount(&mut n))? };
        Ok(u32::try_from(n).unwrap_or(0))
    }

    pub fn device(&self, ordinal: u32) -> Result<DeviceId, CudaError> {
        let ordinal = c_int::try_from(ordinal).unwrap_or(c_int::MAX);
        let mut dev: CUdevice = 0;
        // SAFETY: `dev` is a valid out-pointer.
        unsafe { cu!(self, cuDeviceGet(&mut dev, ordinal))? };
        Ok(DeviceId(dev))
    }

    pub fn device_name(&self, dev: DeviceId) -> Result<String, CudaError> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the driver writes at most `len` bytes, NUL included, into `buf`.
        unsafe {
            cu!(
                self,
                cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev.0)
            )?
        };
        let bytes: Vec<u8> = buf
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub fn device_uuid(&self, dev: DeviceId) -> Result<[u8; 16], CudaError> {
        let mut uuid = CUuuid::default();
        // SAFETY: `uuid` is a valid out-pointer to 16 bytes.
        unsafe { cu!(self, cuDeviceGetUuid(&mut uuid, dev.0))? };
        Ok(uuid.bytes.map(|b| b as u8))
    }

    pub fn device_total_mem(&self, dev: DeviceId) -> Result<u64, CudaError> {
        let mut bytes: usize = 0;
        // SAFETY: `bytes` is a valid out-pointer.
        unsafe { cu!(self, cuDeviceTotalMem(&mut bytes, dev.0))? };
        Ok(bytes as u64)
    }

    /// One `CUdevice_attribute`.
    pub fn device_attribute(&self, dev: DeviceId, attr: u32) -> Result<i32, CudaError> {
        let mut v: c_int = 0;
        let attr = c_int::try_from(attr).unwrap_or(c_int::MAX);
        // SAFETY: `v` is a valid out-pointer.
        unsafe { cu!(self, cuDeviceGetAttribute(&mut v, attr, dev.0))? };
        Ok(v)
    }

    /// What `dev` may do with `peer`'s memory: `cuDeviceGetP2PAttribute`'s
    /// performance rank, access, native atomics and array access (1 ..= 4),
    /// all 0 where it has no access (`cuDeviceCanAccessPeer`).
    pub fn peer_attributes(&self, dev: DeviceId, peer: DeviceId) -> Result<[i32; 4], CudaError> {
        let mut can: c_int = 0;
        // SAFETY: `can` is a valid out-pointer.
        unsafe { cu!(self, cuDeviceCanAccessPeer(&mut can, dev.0, peer.0))? };
        let mut out = [0; 4];
        if can == 0 {
            return Ok(out);
        }
        for (i, v) in out.iter_mut().enumerate() {
            let mut value: c_int = 0;
            // SAFETY: as above; the attribute numbers are the header's 1 ..= 4.
            let got = unsafe {
                cu!(
                    self,
                    cuDeviceGetP2PAttribute(&mut value, i as c_int + 1, dev.0, peer.0)
                )
            };
            *v = got.map_or(0, |()| value);
        }
        out[1] = 1;
        Ok(out)
    }

    /// Every attribute 1 ..= [`MAX_DEVICE_ATTRIBUTE`] the driver knows, in order;
    /// numbers it rejects as invalid (unknown or retired) are left out.
    pub fn device_attributes(&self, dev: DeviceId) -> Result<Vec<(u32, i32)>, CudaError> {
        collect_attributes(|attr| match self.device_attribute(dev, attr) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.code == CUDA_ERROR_INVALID_VALUE => Ok(None),
            Err(e) => Err(e),
        })
    }

    /// PCI domain, bus and device of `dev`.
    pub fn device_pci(&self, dev: DeviceId) -> Result<[u32; 3], CudaError> {
        let get = |attr: c_int| -> Result<u32, CudaError> {
            Ok(u32::try_from(self.device_attribute(dev, attr as u32)?).unwrap_or(0))
        };
        Ok([
            get(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            get(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            get(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
        ])
    }

    /// Compute capability as major × 10 + minor (90 for an H100).
    pub fn device_sm(&self, dev: DeviceId) -> Result<u32, CudaError> {
        let major =
            self.device_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as u32)?;
        let minor =
            self.device_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as u32)?;
        Ok(u32::try_from(major * 10 + minor).unwrap_or(0))
    }

    // ---- contexts ----

    /// The device's primary context, retained until the [`Context`] drops.
    pub fn primary_context(self: &Arc<Self>, dev: DeviceId) -> Result<Arc<Context>, CudaError> {
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        unsafe { cu!(self, cuDevicePrimaryCtxRetain(&mut raw, dev.0))? };
        Ok(Arc::new(Context {
            driver: Arc::clone(self),
            raw,
            device: dev,
            kind: ContextKind::Primary,
        }))
    }

    /// A new context of its own on `dev` (`CU_CTX_*` flags), destroyed when the
    /// [`Context`] drops. It has its own address space and its own sticky error.
    pub fn create_context(
        self: &Arc<Self>,
        dev: DeviceId,
        flags: u32,
    ) -> Result<Arc<Context>, CudaError> {
        let mut raw: CUcontext = std::ptr::null_mut();
        if self.api.cuCtxCreate.is_none() && self.api.cuCtxCreate_v4.is_some() {
            // SAFETY: `raw` is a valid out-pointer; null creation parameters
            // are documented as "none".
            unsafe {
                cu!(
                    self,
                    cuCtxCreate_v4(&mut raw, std::ptr::null_mut(), flags, dev.0)
                )?
            };
        } else {
            // SAFETY: `raw` is a valid out-pointer.
            unsafe { cu!(self, cuCtxCreate(&mut raw, flags, dev.0))? };
        }
        Ok(Arc::new(Context {
            driver: Arc::clone(self),
            raw,
            device: dev,
            kind: ContextKind::Own,
        }))
    }
}

/// The file of the shared object that defines `addr`, from `dladdr`.
fn defining_file(addr: *const c_void) -> Option<std::path::PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only reads `addr` as an address and fills `info`.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is initialised.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated path owned by the dynamic loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
        name.to_bytes(),
    )))
}

/// Values of attributes 1 ..= [`MAX_DEVICE_ATTRIBUTE`], skipping those `query`
/// answers `None` for.
pub fn collect_attributes(
    mut query: impl FnMut(u32) -> Result<Option<i32>, CudaError>,
) -> Result<Vec<(u32, i32)>, CudaError> {
    let mut out = Vec::new();
    for attr in 1..=MAX_DEVICE_ATTRIBUTE {
        if let Some(v) = query(attr)? {
            out.push((attr, v));
        }
    }
    Ok(out)
}

/// A CUDA context. Every method makes it current on the calling thread first,
/// so any thread may use it.
pub struct Context {
    pub(crate) driver: Arc<Driver>,
    pub(crate) raw: CUcontext,
    pub(crate) device: DeviceId,
    pub(crate) kind: ContextKind,
}

/// What a [`Context`] is, which says how it ends.
#[derive(Debug)]
pub(crate) enum ContextKind {
    /// The device's primary context, retained (released on drop).
    Primary,
    /// A context of its own (destroyed on drop).
    Own,
    /// A green context: the primary context's memory on a part of the SMs
    /// (the green context destroyed on drop; `crate::green`).
    Green(crate::sys::CUgreenCtx),
}

// SAFETY: a CUcontext is a handle the driver lets any thread use (it is made
// current per call); the driver's entry points are thread-safe.
unsafe impl Send for Context {}
// SAFETY: as for Send; no method mutates Rust-side state.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("raw", &self.raw)
            .field("device", &self.device)
            .field("kind", &self.kind)
            .finish()
    }
}

impl Context {
    pub fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    pub fn device(&self) -> DeviceId {
        self.device
    }

    pub fn is_primary(&self) -> bool {
        matches!(self.kind, ContextKind::Primary)
    }

    /// Makes this context current on the calling thread.
    pub fn make_current(&self) -> Result<(), CudaError> {
        // SAFETY: `raw` is a live context (it lives as long as `self`).
        unsafe { cu!(self.driver, cuCtxSetCurrent(self.raw)) }
    }

    /// Waits for all work of the context (flushes device printf).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: no arguments.
        unsafe { cu!(self.driver, cuCtxSynchronize()) }
    }

    /// The context's value of a `CUlimit` (`cuCtxGetLimit`).
    pub fn limit(&self, limit: u32) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut value = 0usize;
        // SAFETY: `value` is a valid out-pointer.
        unsafe { cu!(self.driver, cuCtxGetLimit(&mut value, limit))? };
        Ok(value as u64)
    }

    /// Sets a `CUlimit` of the context (`cuCtxSetLimit`).
    pub fn set_limit(&self, limit: u32, value: u64) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: plain values.
        unsafe { cu!(self.driver, cuCtxSetLimit(limit, to_usize(value)?)) }
    }

    // ---- memory ----

    pub fn mem_alloc(&self, bytes: u64) -> Result<u64, CudaError> {
        self.make_current()?;
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe { cu!(self.driver, cuMemAlloc(&mut ptr, to_usize(bytes)?))? };
        Ok(ptr)
    }

    pub fn mem_free(&self, ptr: u64) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: device pointers are validated by the driver.
        unsafe { cu!(self.driver, cuMemFree(ptr)) }
    }

    /// (free, total) bytes of the context's device.
    pub fn mem_info(&self) -> Result<(u64, u64), CudaError> {
        self.make_current()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both are valid out-pointers.
        unsafe { cu!(self.driver, cuMemGetInfo(&mut free, &mut total))? };
        Ok((free as u64, total as u64))
    }

    /// Base and size of the allocation holding `ptr`.
    pub fn address_range(&self, ptr: u64) -> Result<(u64, u64), CudaError> {
        self.make_current()?;
        let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: both are valid out-pointers.
        unsafe { cu!(self.driver, cuMemGetAddressRange(&mut base, &mut size, ptr))? };
        Ok((base, size as u64))
    }

    /// Blocking fill of `count` elements of `value` at `dst`.
    pub fn memset(&self, dst: u64, value: MemsetValue, count: u64) -> Result<(), CudaError> {
        self.make_current()?;
        let n = to_usize(count)?;
        // SAFETY: device pointer only.
        unsafe {
            match value {
                MemsetValue::D8(v) => cu!(self.driver, cuMemsetD8(dst, v, n)),
                MemsetValue::D16(v) => cu!(self.driver, cuMemsetD16(dst, v, n)),
                MemsetValue::D32(v) => cu!(self.driver, cuMemsetD32(dst, v, n)),
            }
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the context is live until here; nothing made from it survives
        // (streams, events, modules and buffers each hold an `Arc<Context>`).
        let result = unsafe {
            match self.kind {
                ContextKind::Primary => {
                    cu!(self.driver, cuDevicePrimaryCtxRelease(self.device.0))
                }
                ContextKind::Own => cu!(self.driver, cuCtxDestroy(self.raw)),
                ContextKind::Green(green) => cu!(self.driver, cuGreenCtxDestroy(green)),
            }
        };
        // Nothing to do on failure: the context is gone either way.
        let _ = result;
    }
}

/// The value a memset writes, by element width (`cuMemsetD8`/`D16`/`D32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemsetValue {
    D8(u8),
    D16(u16),
    D32(u32),
}

pub(crate) fn to_usize(v: u64) -> Result<usize, CudaError> {
    usize::try_from(v).map_err(|_| {
        CudaError::new(CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "size")
            .with_detail("a size beyond the address space")
    })
}
