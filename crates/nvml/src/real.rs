//! NVIDIA's own NVML, which stands behind cumux's: the library at
//! `$CUMUX_REAL_NVML`, else the first `libnvidia-ml.so.1` on the usual paths
//! that is not cumux's; loaded once and never unloaded.

use std::ffi::{c_void, OsStr};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

pub use cumux_protocol::nvml_search::REAL_NVML_ENV;
use cumux_protocol::nvml_search::{candidates, named, CUMUX_NVML_MARKER};

/// Marks cumux's NVML, so that a search never loads it as NVIDIA's
/// (`nvml_search::CUMUX_NVML_MARKER` is its name).
#[unsafe(no_mangle)]
#[used]
pub static CUMUX_NVML: [u8; 6] = *b"cumux\0";

/// NVIDIA's NVML, loaded.
pub struct Nvidia {
    library: Library,
    pub path: PathBuf,
}

impl Nvidia {
    /// The address of NVIDIA's `name`, if it has one.
    pub fn address(&self, name: &str) -> Option<*mut c_void> {
        // SAFETY: only the symbol's address is read here; callers give it the
        // type NVIDIA's header gives that name before calling it.
        let symbol = unsafe { self.library.get::<*mut c_void>(name.as_bytes()) }.ok()?;
        let address: *mut c_void = *symbol;
        (!address.is_null()).then_some(address)
    }

    /// NVIDIA's function `name`, typed as `F`.
    ///
    /// # Safety
    /// `F` must be the C function type NVIDIA's header gives `name`.
    pub unsafe fn function<F: Copy>(&self, name: &str) -> Option<F> {
        assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
        let address = self.address(name)?;
        // SAFETY: a function pointer of the caller's type, per the contract above.
        Some(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&address) })
    }
}

/// `path` loaded, if it is an NVML that is not cumux's.
fn open(path: &Path) -> Result<Nvidia, String> {
    // SAFETY: loading runs the library's initialisers; the library is the
    // system's NVML or the one the operator named.
    let library = unsafe { Library::new(OsStr::new(path)) }.map_err(|e| e.to_string())?;
    let nvidia = Nvidia {
        library,
        path: path.to_path_buf(),
    };
    if nvidia.address(CUMUX_NVML_MARKER).is_some() {
        return Err("it is cumux's own NVML".into());
    }
    if nvidia.address("nvmlInit_v2").is_none() {
        return Err("it has no nvmlInit_v2".into());
    }
    Ok(nvidia)
}

/// NVIDIA's NVML, if this machine has one.
pub fn nvidia() -> Option<&'static Nvidia> {
    static NVIDIA: OnceLock<Option<Nvidia>> = OnceLock::new();
    NVIDIA
        .get_or_init(|| {
            let named = named().is_some();
            for path in candidates() {
                if !named && !path.exists() {
                    continue;
                }
                match open(&path) {
                    Ok(nvidia) => return Some(nvidia),
                    Err(why) if named => {
                        eprintln!("cumux NVML: cannot use {}: {why}", path.display())
                    }
                    Err(_) => {}
                }
            }
            None
        })
        .as_ref()
}
