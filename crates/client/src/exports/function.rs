//! Functions and kernels (one and the same handle, the server's): their
//! attributes, settings, names, modules and parameters, answered from what
//! the module's load replied.

use std::ffi::{c_char, c_void};

use cumux_cuda_bindings::{consts::*, types::*};

use super::*;
use crate::state::handles;
use crate::state::{client, Client, StateGuard};

/// A function the program names, checked under the lock (which stays held).
fn known_function(f: *mut c_void) -> CuResult<(StateGuard<'static>, cumux_protocol::Handle)> {
    let f = handles::wire_or_invalid(f)?;
    let st = client()?.lock();
    st.function(f)?;
    Ok((st, f))
}

/// `CUDA_ERROR_INVALID_HANDLE` unless the program names a loaded function.
fn check_function(f: *mut c_void) -> CuResult<()> {
    known_function(f).map(drop)
}

/// The limit on dynamic shared memory a function may be launched with.
pub(crate) fn dynamic_shared_limit(
    c: &Client,
    dev: i32,
    attrs: &cumux_protocol::FunctionAttrs,
) -> CuResult<i32> {
    if attrs.max_dynamic_shared_size_bytes > 0 {
        return Ok(attrs.max_dynamic_shared_size_bytes);
    }
    let per_block = c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?;
    Ok((per_block - attrs.shared_size_bytes).max(0))
}

/// The copy of library kernel `f` on `device` (a library's kernel has one
/// per device, each with its own attributes, as natively); a module's
/// function is its own.
fn on_device(c: &'static Client, f: *mut c_void, device: u32) -> CuResult<cumux_protocol::Handle> {
    c.device(device as i32)?;
    let f = handles::wire_or_invalid(f)?;
    let from_library = {
        let st = c.lock();
        let module = st.function(f)?.module;
        st.modules.get(&module).is_some_and(|m| m.library.is_some())
    };
    match from_library {
        true => super::module::kernel_on(c, f, device),
        false => Ok(f),
    }
}

fn function_attribute(
    c: &'static Client,
    f: *mut c_void,
    attr: CUfunction_attribute,
    device: u32,
) -> CuResult<i32> {
    let f = on_device(c, f, device)?;
    let (attrs, settings, dev) = {
        let st = c.lock();
        let func = st.function(f)?;
        (func.attrs, func.settings, device as i32)
    };
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
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => dynamic_shared_limit(c, dev, &attrs)?,
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
    c: &'static Client,
    f: *mut c_void,
    attr: CUfunction_attribute,
    value: i32,
    device: u32,
) -> CuResult<()> {
    let f = on_device(c, f, device)?;
    let mut st = c.lock();
    let dev = device as i32;
    let optin = c.attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
    let func = st.function_mut(f)?;
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

fn param_info(f: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) -> CuResult<()> {
    let (st, f) = known_function(f)?;
    let p = *st
        .function(f)?
        .params
        .get(index)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    drop(st);
    out_opt(offset, p.offset as usize);
    out_opt(size, p.size as usize);
    Ok(())
}

/// The number of a function's parameters.
pub(crate) fn param_count(f: *mut c_void, count: *mut usize) -> CuResult<()> {
    let (st, f) = known_function(f)?;
    let n = st.function(f)?.params.len();
    drop(st);
    out(count, n)
}

/// The handle the program knows a function's module (or library) by.
fn module_of(f: *mut c_void) -> CuResult<*mut c_void> {
    let (st, f) = known_function(f)?;
    let module = st.function(f)?.module;
    Ok(to_ptr(st.program_module(module)))
}

/// A function's name, for as long as its module is loaded.
fn name_of(f: *mut c_void) -> CuResult<*const c_char> {
    let (st, f) = known_function(f)?;
    Ok(st.function(f)?.name.as_ptr())
}

driver_fn! {
    fn cuFuncGetAttribute(value: *mut i32, attr: CUfunction_attribute, f: *mut c_void) {
        let device = crate::state::current_device();
        out(value, function_attribute(client()?, f, attr, device)?)
    }

    // A library kernel's attributes are its copy's on `dev` (NCCL sets the
    // shared memory of its kernels on every device it launches them on).
    fn cuKernelGetAttribute(value: *mut i32, attr: CUfunction_attribute, kernel: *mut c_void, dev: i32) {
        let device = u32::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        out(value, function_attribute(client()?, kernel, attr, device)?)
    }

    fn cuFuncSetAttribute(f: *mut c_void, attr: CUfunction_attribute, value: i32) {
        let device = crate::state::current_device();
        set_function_attribute(client()?, f, attr, value, device)
    }

    fn cuKernelSetAttribute(attr: CUfunction_attribute, value: i32, kernel: *mut c_void, dev: i32) {
        let device = u32::try_from(dev).map_err(|_| CUDA_ERROR_INVALID_DEVICE)?;
        set_function_attribute(client()?, kernel, attr, value, device)
    }

    fn cuFuncSetCacheConfig | cuFuncSetSharedMemConfig (f: *mut c_void, _config: u32) {
        check_function(f)
    }

    fn cuKernelSetCacheConfig(kernel: *mut c_void, _config: u32, _dev: i32) {
        check_function(kernel)
    }

    fn cuFuncGetModule | cuKernelGetLibrary (module: *mut *mut c_void, f: *mut c_void) {
        out(module, module_of(f)?)
    }

    fn cuFuncGetName | cuKernelGetName (name: *mut *const c_char, f: *mut c_void) {
        out(name, name_of(f)?)
    }

    fn cuFuncGetParamInfo | cuKernelGetParamInfo (f: *mut c_void, index: usize, offset: *mut usize, size: *mut usize) {
        param_info(f, index, offset, size)
    }

    fn cuFuncIsLoaded(state: *mut u32, f: *mut c_void) {
        check_function(f)?;
        out(state, CU_FUNCTION_LOADING_STATE_LOADED)
    }

    fn cuFuncLoad(f: *mut c_void) {
        check_function(f)
    }

    fn cuKernelGetFunction(f: *mut *mut c_void, kernel: *mut c_void) {
        check_function(kernel)?;
        let kernel = handles::wire_or_invalid(kernel)?;
        let device = crate::state::current_device();
        let function = super::module::kernel_on(client()?, kernel, device)?;
        out(f, handles::to_program(function))
    }
}
