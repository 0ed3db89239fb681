//! Modules and libraries: images from memory (fat binaries, wrappers, cubins,
//! PTX) or files, loaded on the server; function, kernel and global lookups
//! answered from what the load replied; JIT linking (`cuLink*`). A module is
//! named by the server's handle; a library by the handle the client minted,
//! which the program may also use as its module's.

use std::ffi::{c_char, c_void, CStr};

use cumux_cuda_bindings::{consts::*, types::*};
use cumux_fatbin::{Classified, FATBINC_WRAPPER_MAGIC};
use cumux_protocol::Handle;

use super::*;
use crate::state::handles::to_program;
use crate::state::{client, Client, Library, LibrarySource, State, StateGuard};

fn read_raw(p: *const c_void, len: usize) -> CuResult<Vec<u8>> {
    Ok(host_bytes(p, len)?.to_vec())
}

/// Copies the image a pointer refers to, finding its size from its own header.
pub(crate) fn image_from_pointer(p: *const c_void) -> CuResult<Vec<u8>> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let head = read_raw(p, 4)?;
    match cumux_fatbin::classify(&head) {
        Classified::Fatbin => {
            let header = read_raw(p, 16)?;
            let size = cumux_fatbin::fatbin_size(&header).map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
            read_raw(p, size)
        }
        Classified::FatbinWrapper => {
            // magic u32, version u32, then the fat binary's address.
            let wrapper = read_raw(p, 16)?;
            let magic = u32::from_le_bytes(wrapper[0..4].try_into().unwrap_or_default());
            debug_assert_eq!(magic, FATBINC_WRAPPER_MAGIC);
            let data = u64::from_le_bytes(wrapper[8..16].try_into().unwrap_or_default());
            if data == 0 || data as usize == p as usize {
                return Err(CUDA_ERROR_INVALID_IMAGE);
            }
            let header = read_raw(data as *const c_void, 16)?;
            let size = cumux_fatbin::fatbin_size(&header).map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
            read_raw(data as *const c_void, size)
        }
        Classified::Elf => {
            let header = read_raw(p, 64)?;
            let size = cumux_fatbin::elf_size(&header).map_err(|_| CUDA_ERROR_INVALID_IMAGE)?;
            read_raw(p, size)
        }
        Classified::Ptx | Classified::Unknown => {
            // SAFETY: text images are NUL-terminated per the API contract.
            let text = unsafe { CStr::from_ptr(p.cast::<c_char>()) };
            Ok(text.to_bytes().to_vec())
        }
    }
}

fn load_file(path: *const c_char) -> CuResult<Vec<u8>> {
    let path = c_str(path)?;
    std::fs::read(path).map_err(|e| {
        tracing::debug!("cannot read module file {path}: {e}");
        CUDA_ERROR_FILE_NOT_FOUND
    })
}

/// The function of a module (by the program's handle) named `name`.
fn find_function(st: &State, module: usize, name: &str) -> CuResult<Handle> {
    st.module(module)?
        .functions
        .iter()
        .copied()
        .find(|f| {
            st.functions
                .get(f)
                .is_some_and(|x| x.name.to_bytes() == name.as_bytes())
        })
        .ok_or(CUDA_ERROR_NOT_FOUND)
}

/// The global of a module (by the program's handle) named `name`: (address, size).
fn find_global(st: &State, module: usize, name: &str) -> CuResult<(u64, u64)> {
    st.module(module)?
        .globals
        .iter()
        .find(|g| g.name == name)
        .map(|g| (g.ptr, g.size))
        .ok_or(CUDA_ERROR_NOT_FOUND)
}

/// Loads an image on the current context's device (`cuModuleLoad*`).
fn load_module(c: &Client, image: impl FnOnce() -> CuResult<Vec<u8>>) -> CuResult<*mut c_void> {
    let device = c.lock().context_device()?;
    let module = c.load_module(device, image()?, None)?;
    Ok(to_program(module))
}

/// Loads a library under handle `h`. One whose fat binary has no code for
/// this GPU (cuBLAS and cuDNN ship such, for other architectures) loads as
/// NVIDIA's lazy loader has it: the load succeeds, and asking it for a
/// kernel, global or module fails with `CUDA_ERROR_NO_BINARY_FOR_GPU`.
fn load_library(c: &Client, h: usize, image: Vec<u8>) -> CuResult<()> {
    let device = c.lock().current_device();
    load_library_on(c, h, image, device)
}

/// Loads library `h` on `device` (see [`load_library`]).
fn load_library_on(c: &Client, h: usize, image: Vec<u8>, device: u32) -> CuResult<()> {
    // Told from the fat binary's headers when it can be, so the image (cuBLAS
    // ships over 500 MB of them) never crosses to the server. Not for an
    // `-rdc` program, whose cubin-only fat binary is replaced by its PTX.
    let dev = device as i32;
    let sm = if c.on_cpu(device) {
        None
    } else {
        let major = c.attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = c.attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        Some((major * 10 + minor) as u32)
    };
    let known_codeless = sm != Some(0)
        && crate::link::has_no_code_for(&image, sm)
        && crate::link::relocatable_ptx_of_program().is_none();
    let loaded = if known_codeless {
        Err(CUDA_ERROR_NO_BINARY_FOR_GPU)
    } else {
        c.load_module(device, image, Some(h)).map(|_| ())
    };
    match loaded {
        Err(CUDA_ERROR_NO_BINARY_FOR_GPU) => {
            let mut st = c.lock();
            if !matches!(st.libraries.get(&h), Some(Library::Loaded(_))) {
                st.libraries.insert(h, Library::Codeless);
            }
            tracing::debug!("library {h:#x} has no code for this GPU: loaded without it");
            Ok(())
        }
        r => r,
    }
}

/// A library from `code`: loaded when first asked for a kernel, global or
/// module if its image lies in a file the program mapped (the fat binaries
/// the CUDA runtime registers, all of a program's and its libraries' at
/// start: PyTorch's took 21 s to load eagerly, for a process that used
/// none), else at once.
fn library_from(c: &Client, code: *const c_void) -> CuResult<usize> {
    let h = c.mint();
    if lazy_loading() && !code.is_null() && crate::mapped::in_mapped_file(code as usize) {
        // Read now what a lazy load will read, so a bad image fails here.
        let head = read_raw(code, 4)?;
        if cumux_fatbin::classify(&head) != Classified::Unknown {
            let lazy = Library::Lazy {
                image_at: code as usize,
            };
            let mut st = c.lock();
            st.libraries.insert(h, lazy);
            let source = LibrarySource::Mapped(code as usize);
            st.library_sources.insert(h, source);
            return Ok(h);
        }
    }
    let image = image_from_pointer(code)?;
    keep_image(c, h, &image);
    load_library(c, h, image)?;
    Ok(h)
}

/// Keeps a copy of library `h`'s `image` (the program may free its own) to
/// load it on another device later; only a program that sees several
/// devices needs it.
fn keep_image(c: &Client, h: usize, image: &[u8]) {
    if c.devices.len() > 1 {
        let source = LibrarySource::Bytes(std::sync::Arc::new(image.to_vec()));
        c.lock().library_sources.insert(h, source);
    }
}

/// The function a launch on `device` runs for `f`: `f` itself if it is of
/// that device; else, for a kernel of a library (which runs in the current
/// context, whatever context it was got in), the same kernel of the
/// library's module on `device`, loaded there now if need be. A function of
/// a module loaded in another context is not this device's.
pub(crate) fn kernel_on(c: &'static Client, f: Handle, device: u32) -> CuResult<Handle> {
    if cumux_protocol::device_of_handle(f) == device {
        return Ok(f);
    }
    let (library, name) = {
        let st = c.lock();
        let function = st.function(f)?;
        let module = st
            .modules
            .get(&function.module)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let library = module.library.ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        (library, function.name.clone())
    };
    let module = library_module(c, library, device)?;
    let name = name.to_str().map_err(|_| CUDA_ERROR_NOT_FOUND)?;
    find_function(&c.lock(), to_program(module) as usize, name)
}

/// Library `library`'s server module on `device`, loaded there now if it is
/// not (a library is loaded, lazily, on the device current at the time).
fn library_module(c: &'static Client, library: usize, device: u32) -> CuResult<Handle> {
    let (known, source) = {
        let st = loaded(c, to_ptr(library))?;
        let known = st.library_module_on(library, device);
        (known, st.library_sources.get(&library).cloned())
    };
    if let Some(module) = known {
        return Ok(module);
    }
    let image = match source.ok_or(CUDA_ERROR_INVALID_HANDLE)? {
        LibrarySource::Mapped(at) => image_from_pointer(at as *const c_void)?,
        LibrarySource::Bytes(bytes) => bytes.to_vec(),
    };
    load_library_on(c, library, image, device)?;
    c.lock()
        .library_module_on(library, device)
        .ok_or(CUDA_ERROR_NO_BINARY_FOR_GPU)
}

/// Whether modules load lazily: unless `CUDA_MODULE_LOADING=EAGER`, as with
/// NVIDIA's driver since CUDA 12.2.
fn lazy_loading() -> bool {
    static LAZY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LAZY.get_or_init(|| {
        std::env::var("CUDA_MODULE_LOADING")
            .map_or(true, |v| !v.trim().eq_ignore_ascii_case("eager"))
    })
}

/// Loads `library` now if it waits to be loaded (or waits for the thread
/// loading it); the state, locked, for the caller's lookups.
fn loaded(c: &'static Client, library: *mut c_void) -> CuResult<StateGuard<'static>> {
    let h = handle(library);
    let mut st = c.lock();
    loop {
        match st.libraries.get(&h) {
            Some(Library::Lazy { image_at }) => {
                let code = *image_at;
                st.libraries.insert(h, Library::Loading);
                drop(st);
                let unwinding = Relazy { c, h, code };
                tracing::debug!("loading library {h:#x} at its first use");
                let result = image_from_pointer(code as *const c_void)
                    .and_then(|image| load_library(c, h, image));
                std::mem::forget(unwinding);
                st = c.lock();
                if result.is_err() {
                    st.libraries.remove(&h);
                }
                c.changed();
                return result.map(|()| st);
            }
            Some(Library::Loading) => st = c.wait(st),
            _ => return Ok(st),
        }
    }
}

/// Puts a library back to lazy if its load panics, so the threads waiting
/// for it do not wait forever (forgotten once the load returns).
struct Relazy {
    c: &'static Client,
    h: usize,
    code: usize,
}

impl Drop for Relazy {
    fn drop(&mut self) {
        let lazy = Library::Lazy {
            image_at: self.code,
        };
        self.c.lock().libraries.insert(self.h, lazy);
        self.c.changed();
    }
}

/// A library, loaded now if it waits to be, that has code for this device
/// (`CUDA_ERROR_NO_BINARY_FOR_GPU` for one loaded without).
fn with_code(c: &'static Client, library: *mut c_void) -> CuResult<StateGuard<'static>> {
    let st = loaded(c, library)?;
    if matches!(st.libraries.get(&handle(library)), Some(Library::Codeless)) {
        return Err(CUDA_ERROR_NO_BINARY_FOR_GPU);
    }
    Ok(st)
}

/// The program's handles of a module's functions (by the program's handle).
pub(crate) fn module_functions(st: &State, module: usize) -> CuResult<Vec<*mut c_void>> {
    Ok(st
        .module(module)?
        .functions
        .iter()
        .map(|f| to_program(*f))
        .collect())
}

fn write_handles(dst: *mut *mut c_void, n: u32, handles: &[*mut c_void]) -> CuResult<()> {
    let slots = host_bytes_mut(dst.cast(), n as usize * 8)?;
    for (i, f) in handles.iter().take(n as usize).enumerate() {
        slots[i * 8..i * 8 + 8].copy_from_slice(&(*f as usize).to_ne_bytes());
    }
    Ok(())
}

/// Adds an input to a link state.
fn link_input(state: *mut c_void, kind: u32, bytes: Vec<u8>) -> CuResult<()> {
    let c = client()?;
    let mut st = c.lock();
    let link = st
        .links
        .get_mut(&handle(state))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    link.inputs.push((kind, bytes));
    Ok(())
}

/// Defines the `cuLibraryLoad*` exports: each takes the library's out-pointer
/// and its source, then JIT options and library options (each an array of
/// options, an array of values and their count), which cumux ignores.
macro_rules! library_loaders {
    ($(fn $name:ident($library:ident: $out:ty, $source:ident: $from:ty) $body:block)*) => {
        driver_fn! { $(
            fn $name(
                $library: $out,
                $source: $from,
                _jit_opts: *mut CUjit_option,
                _jit_vals: *mut *mut c_void,
                _n_jit: u32,
                _lib_opts: *mut CUlibraryOption,
                _lib_vals: *mut *mut c_void,
                _n_lib: u32
            ) $body
        )* }
    };
}

library_loaders! {
    fn cuLibraryLoadData(library: *mut *mut c_void, code: *const c_void) {
        let c = client()?;
        out(library, to_ptr(library_from(c, code)?))
    }

    fn cuLibraryLoadFromFile(library: *mut *mut c_void, path: *const c_char) {
        let c = client()?;
        let h = c.mint();
        let image = load_file(path)?;
        keep_image(c, h, &image);
        load_library(c, h, image)?;
        out(library, to_ptr(h))
    }
}

driver_fn! {
    fn cuModuleLoad(module: *mut *mut c_void, path: *const c_char) {
        out(module, load_module(client()?, || load_file(path))?)
    }

    fn cuModuleLoadData | cuModuleLoadFatBinary (module: *mut *mut c_void, image: *const c_void) {
        out(module, load_module(client()?, || image_from_pointer(image))?)
    }

    fn cuModuleLoadDataEx(module: *mut *mut c_void, image: *const c_void, n: u32, opts: *mut CUjit_option, vals: *mut *mut c_void) {
        crate::transport::take_last_error_message();
        let loaded = load_module(client()?, || image_from_pointer(image));
        let log = crate::transport::take_last_error_message();
        crate::jit_log::fill(n, opts, vals, &log);
        out(module, loaded?)
    }

    fn cuModuleUnload | cuLibraryUnload (module: *mut c_void) {
        client()?.unload_module(handle(module))
    }

    fn cuModuleGetFunction(f: *mut *mut c_void, module: *mut c_void, name: *const c_char) {
        let c = client()?;
        let function = find_function(&c.lock(), handle(module), c_str(name)?)?;
        out(f, to_program(function))
    }

    fn cuModuleGetGlobal_v2(dptr: *mut u64, bytes: *mut usize, module: *mut c_void, name: *const c_char) {
        let c = client()?;
        let (p, s) = find_global(&c.lock(), handle(module), c_str(name)?)?;
        out_opt(dptr, p);
        out_opt(bytes, s as usize);
        Ok(())
    }

    fn cuModuleGetLoadingMode(mode: *mut u32) {
        // Libraries load at their first use (`library_from`) unless asked not to.
        out(mode, if lazy_loading() { CU_MODULE_LAZY_LOADING } else { CU_MODULE_EAGER_LOADING })
    }

    fn cuModuleGetFunctionCount(count: *mut u32, module: *mut c_void) {
        let c = client()?;
        let n = c.lock().module(handle(module))?.functions.len();
        out(count, n as u32)
    }

    fn cuModuleEnumerateFunctions(fs: *mut *mut c_void, n: u32, module: *mut c_void) {
        let functions = module_functions(&client()?.lock(), handle(module))?;
        write_handles(fs, n, &functions)
    }

    fn cuLibraryGetKernel(kernel: *mut *mut c_void, library: *mut c_void, name: *const c_char) {
        let c = client()?;
        let st = with_code(c, library)?;
        let function = find_function(&st, handle(library), c_str(name)?)?;
        drop(st);
        out(kernel, to_program(function))
    }

    fn cuLibraryGetModule(module: *mut *mut c_void, library: *mut c_void) {
        let c = client()?;
        with_code(c, library)?.module(handle(library))?;
        out(module, library)
    }

    fn cuLibraryGetGlobal(dptr: *mut u64, bytes: *mut usize, library: *mut c_void, name: *const c_char) {
        let c = client()?;
        drop(with_code(c, library)?);
        // The current context's global, as the driver answers.
        let module = library_module(c, handle(library), crate::state::current_device())?;
        let (p, s) = find_global(&c.lock(), to_program(module) as usize, c_str(name)?)?;
        out_opt(dptr, p);
        out_opt(bytes, s as usize);
        Ok(())
    }

    fn cuLibraryGetKernelCount(count: *mut u32, library: *mut c_void) {
        let c = client()?;
        let n = loaded(c, library)?.module(handle(library))?.functions.len();
        out(count, n as u32)
    }

    fn cuLibraryEnumerateKernels(ks: *mut *mut c_void, n: u32, library: *mut c_void) {
        let c = client()?;
        let fs = module_functions(&*loaded(c, library)?, handle(library))?;
        write_handles(ks, n, &fs)
    }

    fn cuLinkCreate_v2(_n: u32, _opts: *mut CUjit_option, _vals: *mut *mut c_void, state: *mut *mut c_void) {
        let c = client()?;
        let h = c.mint();
        c.lock().links.insert(h, crate::link::LinkState::default());
        out(state, to_ptr(h))
    }

    fn cuLinkAddData_v2(
        state: *mut c_void,
        kind: u32,
        data: *mut c_void,
        size: usize,
        _name: *const c_char,
        _n: u32,
        _opts: *mut CUjit_option,
        _vals: *mut *mut c_void
    ) {
        let bytes = if size == 0 { image_from_pointer(data)? } else { host_bytes(data, size)?.to_vec() };
        link_input(state, kind, bytes)
    }

    fn cuLinkAddFile_v2(
        state: *mut c_void,
        kind: u32,
        path: *const c_char,
        _n: u32,
        _opts: *mut CUjit_option,
        _vals: *mut *mut c_void
    ) {
        link_input(state, kind, load_file(path)?)
    }

    fn cuLinkComplete(state: *mut c_void, image: *mut *mut c_void, size: *mut usize) {
        let c = client()?;
        // a fat binary input gives the PTX the current device's capability runs
        let dev = c.lock().current_device() as i32;
        let major = c.attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = c.attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let sm = (major * 10 + minor) as u32;
        let mut st = c.lock();
        let link = st.links.get_mut(&handle(state)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        link.output = crate::link::link(&link.inputs, sm)?;
        out_opt(size, link.output.len());
        out(image, link.output.as_mut_ptr().cast())
    }

    fn cuLinkDestroy(state: *mut c_void) {
        let c = client()?;
        c.lock().links.remove(&handle(state)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}
