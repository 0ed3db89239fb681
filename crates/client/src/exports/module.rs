//! Modules and libraries: images from memory (fat binaries, wrappers, cubins,
//! PTX) or files, loaded on the server; function, kernel and global lookups
//! and attributes answered from what the load replied.

use std::ffi::{c_char, c_void, CStr};

use cumux_fatbin::{Classified, FATBINC_WRAPPER_MAGIC};

use super::*;
use crate::state::{client, Client};
use cumux_cuda_bindings::{consts::*, types::*};

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

fn find_function(c: &Client, module: usize, name: &str) -> CuResult<usize> {
    let t = c.tables();
    let m = t.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    m.functions
        .iter()
        .copied()
        .find(|f| {
            t.functions
                .get(f)
                .is_some_and(|x| x.name.to_bytes() == name.as_bytes())
        })
        .ok_or(CUDA_ERROR_NOT_FOUND)
}

/// Loads a library under handle `h`. One whose fat binary has no code for
/// this GPU (cuBLAS and cuDNN ship such, for other architectures) loads as
/// NVIDIA's lazy loader has it: the load succeeds, and asking it for a
/// kernel, global or module fails with `CUDA_ERROR_NO_BINARY_FOR_GPU`.
fn load_library(c: &Client, h: usize, image: Vec<u8>) -> CuResult<()> {
    // Told from the fat binary's headers when it can be, so the image (cuBLAS
    // ships over 500 MB of them) never crosses to the server. Not for an
    // `-rdc` program, whose cubin-only fat binary is replaced by its PTX.
    let dev = c.current_device() as i32;
    let sm = match c.devices.get(dev as usize) {
        Some(d) if d.backend == "cpu" => None,
        _ => Some((c.attribute(dev, 75)? * 10 + c.attribute(dev, 76)?) as u32),
    };
    let known_codeless = sm != Some(0)
        && crate::link::has_no_code_for(&image, sm)
        && crate::link::relocatable_ptx_of_program().is_none();
    let loaded = if known_codeless {
        Err(CUDA_ERROR_NO_BINARY_FOR_GPU)
    } else {
        c.load_module_as(h, image)
    };
    match loaded {
        Err(CUDA_ERROR_NO_BINARY_FOR_GPU) => {
            let mut t = c.tables();
            t.codeless.insert(h);
            t.modules.insert(
                h,
                crate::state::Module {
                    server: 0,
                    functions: Vec::new(),
                    globals: Vec::new(),
                },
            );
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
            c.tables().lazy_libraries.insert(h, code as usize);
            return Ok(h);
        }
    }
    load_library(c, h, image_from_pointer(code)?)?;
    Ok(h)
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

/// Loads `library` now if it waits to be loaded.
fn loaded(c: &Client, library: *mut c_void) -> CuResult<()> {
    let h = handle(library);
    if !c.tables().lazy_libraries.contains_key(&h) {
        return Ok(());
    }
    let _one_at_a_time = c.lazy_loading.lock().unwrap_or_else(|p| p.into_inner());
    let Some(code) = c.tables().lazy_libraries.get(&h).copied() else {
        return Ok(());
    };
    tracing::debug!("loading library {h:#x} at its first use");
    let result =
        image_from_pointer(code as *const c_void).and_then(|image| load_library(c, h, image));
    c.tables().lazy_libraries.remove(&h);
    result
}

/// `CUDA_ERROR_NO_BINARY_FOR_GPU` for a library loaded without code.
fn has_code(c: &Client, library: *mut c_void) -> CuResult<()> {
    if c.tables().codeless.contains(&handle(library)) {
        return Err(CUDA_ERROR_NO_BINARY_FOR_GPU);
    }
    Ok(())
}

fn find_global(c: &Client, module: usize, name: &str) -> CuResult<(u64, u64)> {
    let t = c.tables();
    let m = t.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    m.globals
        .iter()
        .find(|g| g.name == name)
        .map(|g| (g.ptr, g.size))
        .ok_or(CUDA_ERROR_NOT_FOUND)
}

/// The limit on dynamic shared memory a function may be launched with.
pub(crate) fn dynamic_shared_limit(
    c: &Client,
    attrs: &cumux_protocol::FunctionAttrs,
) -> CuResult<i32> {
    if attrs.max_dynamic_shared_size_bytes > 0 {
        return Ok(attrs.max_dynamic_shared_size_bytes);
    }
    let dev = c.current_device() as i32;
    let per_block = c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?;
    Ok((per_block - attrs.shared_size_bytes).max(0))
}

fn function_attribute(c: &Client, f: usize, attr: CUfunction_attribute) -> CuResult<i32> {
    let (attrs, settings) = {
        let t = c.tables();
        let func = t.function(f)?;
        (func.attrs, func.settings)
    };
    let dev = c.current_device() as i32;
    Ok(match attr {
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK if attrs.max_threads_per_block > 0 => {
            attrs.max_threads_per_block
        }
        CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => {
            c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?
        }
        CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES => attrs.shared_size_bytes,
        CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES => attrs.const_size_bytes,
        CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => attrs.local_size_bytes,
        CU_FUNC_ATTRIBUTE_NUM_REGS => attrs.num_regs,
        CU_FUNC_ATTRIBUTE_PTX_VERSION => attrs.ptx_version,
        CU_FUNC_ATTRIBUTE_BINARY_VERSION => attrs.binary_version,
        CU_FUNC_ATTRIBUTE_CACHE_MODE_CA => 0,
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => dynamic_shared_limit(c, &attrs)?,
        CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => settings.preferred_carveout,
        // CLUSTER_SIZE_MUST_BE_SET: only kernels compiled for explicit
        // clusters need one, and their launches name it.
        CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET => 0,
        CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH..=CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH => {
            settings.required_cluster[(attr - CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH) as usize]
        }
        CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED => {
            settings.non_portable_cluster_size_allowed
        }
        CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE => {
            settings.cluster_scheduling_policy
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    })
}

fn set_function_attribute(
    c: &Client,
    f: usize,
    attr: CUfunction_attribute,
    value: i32,
) -> CuResult<()> {
    let dev = c.current_device() as i32;
    let optin = c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
    let mut t = c.tables();
    let func = t.functions.get_mut(&f).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    match attr {
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
            let limit = optin.max(0) - func.attrs.shared_size_bytes;
            if value < 0 || value > limit {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            func.attrs.max_dynamic_shared_size_bytes = value;
            Ok(())
        }
        CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT if (-1..=100).contains(&value) => {
            // A hint to the driver about the L1/shared split; kept for queries.
            func.settings.preferred_carveout = value;
            Ok(())
        }
        CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH..=CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH
            if value >= 0 =>
        {
            func.settings.required_cluster
                [(attr - CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH) as usize] = value;
            Ok(())
        }
        // The worker opts a kernel in to non-portable cluster sizes whenever a
        // launch asks for one, as this setting allows.
        CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED if value == 0 || value == 1 => {
            func.settings.non_portable_cluster_size_allowed = value;
            Ok(())
        }
        CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE if (0..=2).contains(&value) => {
            func.settings.cluster_scheduling_policy = value;
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn param_info(
    c: &Client,
    f: usize,
    index: usize,
    offset: *mut usize,
    size: *mut usize,
) -> CuResult<()> {
    let t = c.tables();
    let p = *t
        .function(f)?
        .params
        .get(index)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    out_opt(offset, p.offset as usize);
    out_opt(size, p.size as usize);
    Ok(())
}

fn module_functions(c: &Client, module: usize) -> CuResult<Vec<usize>> {
    let t = c.tables();
    let m = t.modules.get(&module).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    Ok(m.functions.clone())
}

fn write_handles(dst: *mut *mut c_void, n: u32, handles: &[usize]) -> CuResult<()> {
    let slots = host_bytes_mut(dst.cast(), n as usize * 8)?;
    for (i, f) in handles.iter().take(n as usize).enumerate() {
        slots[i * 8..i * 8 + 8].copy_from_slice(&f.to_ne_bytes());
    }
    Ok(())
}

driver_fn! {
    fn cuModuleLoad(module: *mut *mut c_void, path: *const c_char) {
        let c = client()?;
        c.context_device()?;
        let image = load_file(path)?;
        out(module, to_ptr(c.load_module(image)?))
    }

    fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) {
        let c = client()?;
        c.context_device()?;
        out(module, to_ptr(c.load_module(image_from_pointer(image)?)?))
    }

    fn cuModuleLoadDataEx(module: *mut *mut c_void, image: *const c_void, _n: u32, _opts: *mut CUjit_option, _vals: *mut *mut c_void) {
        let c = client()?;
        c.context_device()?;
        out(module, to_ptr(c.load_module(image_from_pointer(image)?)?))
    }

    fn cuModuleLoadFatBinary(module: *mut *mut c_void, image: *const c_void) {
        let c = client()?;
        c.context_device()?;
        out(module, to_ptr(c.load_module(image_from_pointer(image)?)?))
    }

    fn cuModuleUnload(module: *mut c_void) {
        client()?.unload_module(handle(module))
    }

    fn cuModuleGetFunction(f: *mut *mut c_void, module: *mut c_void, name: *const c_char) {
        let c = client()?;
        out(f, to_ptr(find_function(c, handle(module), c_str(name)?)?))
    }

    fn cuModuleGetGlobal_v2(dptr: *mut u64, bytes: *mut usize, module: *mut c_void, name: *const c_char) {
        let c = client()?;
        let (p, s) = find_global(c, handle(module), c_str(name)?)?;
        out_opt(dptr, p);
        out_opt(bytes, s as usize);
        Ok(())
    }

    fn cuModuleGetLoadingMode(mode: *mut u32) {
        // CU_MODULE_LAZY_LOADING (libraries load at their first use: `library_from`)
        // or CU_MODULE_EAGER_LOADING.
        out(mode, if lazy_loading() { 2 } else { 1 })
    }

    fn cuModuleGetFunctionCount(count: *mut u32, module: *mut c_void) {
        let c = client()?;
        out(count, module_functions(c, handle(module))?.len() as u32)
    }

    fn cuModuleEnumerateFunctions(fs: *mut *mut c_void, n: u32, module: *mut c_void) {
        let functions = module_functions(client()?, handle(module))?;
        write_handles(fs, n, &functions)
    }

    fn cuFuncGetAttribute(value: *mut i32, attr: CUfunction_attribute, f: *mut c_void) {
        let c = client()?;
        out(value, function_attribute(c, handle(f), attr)?)
    }

    fn cuFuncSetAttribute(f: *mut c_void, attr: CUfunction_attribute, value: i32) {
        set_function_attribute(client()?, handle(f), attr, value)
    }

    fn cuFuncSetCacheConfig(f: *mut c_void, _config: u32) {
        client()?.tables().function(handle(f)).map(|_| ())
    }

    fn cuFuncSetSharedMemConfig(f: *mut c_void, _config: u32) {
        client()?.tables().function(handle(f)).map(|_| ())
    }

    fn cuFuncGetModule(module: *mut *mut c_void, f: *mut c_void) {
        let m = client()?.tables().function(handle(f))?.module;
        out(module, to_ptr(m))
    }

    fn cuFuncGetName(name: *mut *const c_char, f: *mut c_void) {
        let c = client()?;
        let t = c.tables();
        out(name, t.function(handle(f))?.name.as_ptr())
    }

    fn cuFuncGetParamInfo(f: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) {
        param_info(client()?, handle(f), index, offset, size)
    }

    fn cuFuncIsLoaded(state: *mut u32, f: *mut c_void) {
        client()?.tables().function(handle(f))?;
        // CU_FUNCTION_LOADING_STATE_LOADED
        out(state, 1)
    }

    fn cuFuncLoad(f: *mut c_void) {
        client()?.tables().function(handle(f)).map(|_| ())
    }

    fn cuLibraryLoadData(
        library: *mut *mut c_void,
        code: *const c_void,
        _jit_opts: *mut CUjit_option,
        _jit_vals: *mut *mut c_void,
        _n_jit: u32,
        _lib_opts: *mut CUlibraryOption,
        _lib_vals: *mut *mut c_void,
        _n_lib: u32
    ) {
        let c = client()?;
        out(library, to_ptr(library_from(c, code)?))
    }

    fn cuLibraryLoadFromFile(
        library: *mut *mut c_void,
        path: *const c_char,
        _jit_opts: *mut CUjit_option,
        _jit_vals: *mut *mut c_void,
        _n_jit: u32,
        _lib_opts: *mut CUlibraryOption,
        _lib_vals: *mut *mut c_void,
        _n_lib: u32
    ) {
        let c = client()?;
        let h = c.mint();
        load_library(c, h, load_file(path)?)?;
        out(library, to_ptr(h))
    }

    fn cuLibraryUnload(library: *mut c_void) {
        client()?.unload_module(handle(library))
    }

    fn cuLibraryGetKernel(kernel: *mut *mut c_void, library: *mut c_void, name: *const c_char) {
        let c = client()?;
        loaded(c, library)?;
        has_code(c, library)?;
        out(kernel, to_ptr(find_function(c, handle(library), c_str(name)?)?))
    }

    fn cuLibraryGetModule(module: *mut *mut c_void, library: *mut c_void) {
        let c = client()?;
        loaded(c, library)?;
        has_code(c, library)?;
        if !c.tables().modules.contains_key(&handle(library)) {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        out(module, library)
    }

    fn cuLibraryGetGlobal(dptr: *mut u64, bytes: *mut usize, library: *mut c_void, name: *const c_char) {
        let c = client()?;
        loaded(c, library)?;
        has_code(c, library)?;
        let (p, s) = find_global(c, handle(library), c_str(name)?)?;
        out_opt(dptr, p);
        out_opt(bytes, s as usize);
        Ok(())
    }

    fn cuLibraryGetKernelCount(count: *mut u32, library: *mut c_void) {
        let c = client()?;
        loaded(c, library)?;
        out(count, module_functions(c, handle(library))?.len() as u32)
    }

    fn cuLibraryEnumerateKernels(ks: *mut *mut c_void, n: u32, library: *mut c_void) {
        let c = client()?;
        loaded(c, library)?;
        let fs = module_functions(c, handle(library))?;
        write_handles(ks, n, &fs)
    }

    fn cuKernelGetFunction(f: *mut *mut c_void, kernel: *mut c_void) {
        client()?.tables().function(handle(kernel))?;
        out(f, kernel)
    }

    fn cuKernelGetLibrary(library: *mut *mut c_void, kernel: *mut c_void) {
        let m = client()?.tables().function(handle(kernel))?.module;
        out(library, to_ptr(m))
    }

    fn cuKernelGetAttribute(value: *mut i32, attr: CUfunction_attribute, kernel: *mut c_void, _dev: i32) {
        let c = client()?;
        out(value, function_attribute(c, handle(kernel), attr)?)
    }

    fn cuKernelSetAttribute(attr: CUfunction_attribute, value: i32, kernel: *mut c_void, _dev: i32) {
        set_function_attribute(client()?, handle(kernel), attr, value)
    }

    fn cuKernelSetCacheConfig(kernel: *mut c_void, _config: u32, _dev: i32) {
        client()?.tables().function(handle(kernel)).map(|_| ())
    }

    fn cuKernelGetName(name: *mut *const c_char, kernel: *mut c_void) {
        let c = client()?;
        let t = c.tables();
        out(name, t.function(handle(kernel))?.name.as_ptr())
    }

    fn cuKernelGetParamInfo(kernel: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) {
        param_info(client()?, handle(kernel), index, offset, size)
    }

    fn cuLinkCreate_v2(_n: u32, _opts: *mut CUjit_option, _vals: *mut *mut c_void, state: *mut *mut c_void) {
        let c = client()?;
        let h = c.mint();
        c.tables().links.insert(h, crate::link::LinkState::default());
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
        let c = client()?;
        let bytes = if size == 0 { image_from_pointer(data)? } else { host_bytes(data, size)?.to_vec() };
        let mut t = c.tables();
        let link = t.links.get_mut(&handle(state)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        link.inputs.push((kind, bytes));
        Ok(())
    }

    fn cuLinkAddFile_v2(
        state: *mut c_void,
        kind: u32,
        path: *const c_char,
        _n: u32,
        _opts: *mut CUjit_option,
        _vals: *mut *mut c_void
    ) {
        let c = client()?;
        let bytes = load_file(path)?;
        let mut t = c.tables();
        let link = t.links.get_mut(&handle(state)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        link.inputs.push((kind, bytes));
        Ok(())
    }

    fn cuLinkComplete(state: *mut c_void, image: *mut *mut c_void, size: *mut usize) {
        let c = client()?;
        let mut t = c.tables();
        let link = t.links.get_mut(&handle(state)).ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        link.output = crate::link::link(&link.inputs)?;
        out_opt(size, link.output.len());
        out(image, link.output.as_mut_ptr().cast())
    }

    fn cuLinkDestroy(state: *mut c_void) {
        let c = client()?;
        c.tables().links.remove(&handle(state)).map(|_| ()).ok_or(CUDA_ERROR_INVALID_HANDLE)
    }
}
