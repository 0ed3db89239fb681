//! Objects that live in a [`Context`]: streams, events, pinned host buffers,
//! modules and their functions. Each holds an `Arc` of its context, so the
//! context outlives it, and releases its driver object when dropped.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::Arc;
use std::time::Duration;

use crate::capture::StdoutCapture;

use crate::driver::{cu, to_usize, Context, MemsetValue};
use crate::error::CudaError;
use crate::image::{self, CodeChoice, ImageKind, ImageNames};
use crate::sys::*;

/// Declares `NAME(HANDLE)`, a driver object made in a context: it holds the
/// context (`ctx`) and the handle (`raw`), any thread may use it (the driver's
/// calls on one handle are thread-safe), and dropping it releases the handle
/// with `RELEASE(raw)`, the context current (a null handle, none).
macro_rules! context_object {
    ($(#[$doc:meta])* $vis:vis struct $name:ident($handle:ty), released by $release:ident;) => {
        $(#[$doc])*
        $vis struct $name {
            ctx: Arc<Context>,
            raw: $handle,
        }

        // SAFETY: driver handles are the process's, usable from any thread.
        unsafe impl Send for $name {}
        // SAFETY: as for Send; the driver serialises calls on one handle itself.
        unsafe impl Sync for $name {}

        impl Drop for $name {
            fn drop(&mut self) {
                if !self.raw.is_null() && self.ctx.make_current().is_ok() {
                    // SAFETY: `raw` is live and released once, here.
                    let _ = unsafe { cu!(self.ctx.driver, $release(self.raw)) };
                }
            }
        }
    };
}

/// A query's answer: finished, not yet (`CUDA_ERROR_NOT_READY`), or its error.
fn finished(query: Result<(), CudaError>) -> Result<bool, CudaError> {
    match query {
        Ok(()) => Ok(true),
        Err(e) if e.code == CUDA_ERROR_NOT_READY => Ok(false),
        Err(e) => Err(e),
    }
}

context_object! {
    /// A CUDA stream; the null handle is the context's legacy default stream,
    /// which is never destroyed.
    pub struct Stream(CUstream), released by cuStreamDestroy;
}

impl Stream {
    /// A stream with `CU_STREAM_*` `flags` and a priority (lower is more urgent).
    pub fn new(ctx: &Arc<Context>, flags: u32, priority: i32) -> Result<Stream, CudaError> {
        ctx.make_current()?;
        let mut raw: CUstream = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        unsafe {
            cu!(
                ctx.driver,
                cuStreamCreateWithPriority(&mut raw, flags as c_uint, priority as c_int)
            )?
        };
        Ok(Stream {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    /// The context's legacy default stream (the null stream), which waits for
    /// and is waited for by every blocking stream of the context.
    pub fn legacy_default(ctx: &Arc<Context>) -> Stream {
        Stream {
            ctx: Arc::clone(ctx),
            raw: std::ptr::null_mut(),
        }
    }

    /// Makes later work of this stream wait for `event`'s latest record.
    pub fn wait_event(&self, event: &Event) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        // SAFETY: both handles are live.
        unsafe { cu!(self.ctx.driver, cuStreamWaitEvent(self.raw, event.raw, 0)) }
    }

    /// Queues an 8-byte store of `value` at device address `addr` (registered host
    /// memory, for one), made once the stream's earlier work is done and visible.
    pub fn write_value64(&self, addr: u64, value: u64) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        // SAFETY: the stream is live; the driver checks `addr` and fails the call
        // (or the stream) for an address the device cannot write.
        unsafe {
            cu!(
                self.ctx.driver,
                cuStreamWriteValue64(self.raw, addr, value, 0)
            )
        }
    }

    /// Queues a copy from pageable host memory. The driver has staged `data`
    /// when this returns (CUDA's documented behaviour for pageable sources),
    /// so the caller may drop it at once.
    pub fn copy_htod_pageable(&self, dst: u64, data: &[u8]) -> Result<(), CudaError> {
        // SAFETY: pageable memory is staged before the call returns (see
        // above); `data` is never pinned memory here, the caller's own heap.
        unsafe { self.copy_htod_async(dst, data) }
    }

    /// The driver's handle, for this crate's other calls on the stream.
    pub(crate) fn raw(&self) -> CUstream {
        self.raw
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Waits for the stream's work (flushes device printf).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        // SAFETY: `raw` is live while `self` is.
        unsafe { cu!(self.ctx.driver, cuStreamSynchronize(self.raw)) }
    }

    /// Whether all work queued so far has finished (does not flush printf).
    pub fn is_idle(&self) -> Result<bool, CudaError> {
        self.ctx.make_current()?;
        // SAFETY: `raw` is live while `self` is.
        finished(unsafe { cu!(self.ctx.driver, cuStreamQuery(self.raw)) })
    }

    /// Queues a device-to-device copy.
    pub fn copy_dtod(&self, dst: u64, src: u64, bytes: u64) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        // SAFETY: device pointers only; `raw` is live.
        unsafe {
            cu!(
                self.ctx.driver,
                cuMemcpyDtoDAsync(dst, src, to_usize(bytes)?, self.raw)
            )
        }
    }

    /// Waits until the stream's work is done. Without `capture` this is one
    /// `cuStreamSynchronize`. With it, the stream is first polled until idle
    /// (polling flushes no printf), then synchronized inside a capture window,
    /// so the window stays short; the captured device printf output is
    /// returned with the result.
    pub fn finish(&self, capture: Option<&StdoutCapture>) -> (Result<(), CudaError>, Vec<u8>) {
        let Some(capture) = capture else {
            return (self.synchronize(), Vec::new());
        };
        let mut spins = 0u32;
        let mut pause = Duration::from_micros(10);
        // Idle, or failed: the synchronize below says which.
        while let Ok(false) = self.is_idle() {
            if spins < 200 {
                spins += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
        capture.window(|| self.synchronize())
    }

    /// Copies `data` to `dst` on this stream and waits as [`Stream::finish`] does.
    pub fn copy_htod_sync(
        &self,
        dst: u64,
        data: &[u8],
        capture: Option<&StdoutCapture>,
    ) -> (Result<(), CudaError>, Vec<u8>) {
        // SAFETY: `data` outlives the copy: the stream is finished before the
        // borrow ends (and synchronized again if finishing failed).
        if let Err(e) = unsafe { self.copy_htod_async(dst, data) } {
            return (Err(e), Vec::new());
        }
        self.finish_surely(capture)
    }

    /// Copies from `src` into `buf` on this stream and waits as [`Stream::finish`] does.
    pub fn copy_dtoh_sync(
        &self,
        buf: &mut [u8],
        src: u64,
        capture: Option<&StdoutCapture>,
    ) -> (Result<(), CudaError>, Vec<u8>) {
        // SAFETY: as in `copy_htod_sync`.
        if let Err(e) = unsafe { self.copy_dtoh_async(buf, src) } {
            return (Err(e), Vec::new());
        }
        self.finish_surely(capture)
    }

    /// [`Stream::finish`], then a plain synchronize if that failed, so no copy
    /// touching a host buffer can still be running when the caller returns.
    fn finish_surely(&self, capture: Option<&StdoutCapture>) -> (Result<(), CudaError>, Vec<u8>) {
        let (result, out) = self.finish(capture);
        if result.is_err() {
            let _ = self.synchronize();
        }
        (result, out)
    }

    /// Queues a host-to-device copy.
    ///
    /// # Safety
    /// `data` must stay valid and unchanged until the stream has passed the
    /// copy (pinned memory is read asynchronously).
    pub unsafe fn copy_htod_async(&self, dst: u64, data: &[u8]) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        // SAFETY: the caller keeps `data` alive; `raw` is live.
        unsafe {
            cu!(
                self.ctx.driver,
                cuMemcpyHtoDAsync(dst, data.as_ptr().cast(), data.len(), self.raw)
            )
        }
    }

    /// Queues a device-to-host copy.
    ///
    /// # Safety
    /// `buf` must stay valid and untouched until the stream has passed the copy.
    pub unsafe fn copy_dtoh_async(&self, buf: &mut [u8], src: u64) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        // SAFETY: the caller keeps `buf` alive; `raw` is live.
        unsafe {
            cu!(
                self.ctx.driver,
                cuMemcpyDtoHAsync(buf.as_mut_ptr().cast(), src, buf.len(), self.raw)
            )
        }
    }

    /// Queues a fill of `count` elements of `value` at `dst`.
    pub fn memset(&self, dst: u64, value: MemsetValue, count: u64) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        let (d, n) = (&self.ctx.driver, to_usize(count)?);
        // SAFETY: device pointer only; `raw` is live.
        unsafe {
            match value {
                MemsetValue::D8(v) => cu!(d, cuMemsetD8Async(dst, v, n, self.raw)),
                MemsetValue::D16(v) => cu!(d, cuMemsetD16Async(dst, v, n, self.raw)),
                MemsetValue::D32(v) => cu!(d, cuMemsetD32Async(dst, v, n, self.raw)),
            }
        }
    }

    pub fn memset_d8(&self, dst: u64, value: u8, count: u64) -> Result<(), CudaError> {
        self.memset(dst, MemsetValue::D8(value), count)
    }

    pub fn memset_d16(&self, dst: u64, value: u16, count: u64) -> Result<(), CudaError> {
        self.memset(dst, MemsetValue::D16(value), count)
    }

    pub fn memset_d32(&self, dst: u64, value: u32, count: u64) -> Result<(), CudaError> {
        self.memset(dst, MemsetValue::D32(value), count)
    }
}

context_object! {
    /// An instantiated CUDA graph, made by capturing work queued on a stream
    /// ([`Stream::capture`]) and launched as one piece ([`Stream::launch_graph`]).
    /// Two threads may launch it at once; dropping it while work that uses it
    /// runs is allowed.
    pub struct GraphExec(CUgraphExec), released by cuGraphExecDestroy;
}

impl Stream {
    /// Records what `queue` queues on this stream (which must not be the legacy
    /// default stream) into a graph instead of running it, and instantiates it;
    /// `map` turns the driver's errors into `queue`'s. The capture ends whether
    /// or not `queue` succeeds.
    pub fn capture<E>(
        &self,
        queue: impl FnOnce(&Stream) -> Result<(), E>,
        map: impl Fn(CudaError) -> E,
    ) -> Result<GraphExec, E> {
        self.ctx.make_current().map_err(&map)?;
        let driver = &self.ctx.driver;
        // SAFETY: the stream is live and owned by this context.
        unsafe {
            cu!(
                driver,
                cuStreamBeginCapture(self.raw, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            )
        }
        .map_err(&map)?;
        let queued = queue(self);
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: `graph` is a valid out-pointer; ends the capture begun above.
        let ended = unsafe { cu!(driver, cuStreamEndCapture(self.raw, &mut graph)) };
        let made = queued.and(ended.map_err(&map)).and_then(|()| {
            let mut exec: CUgraphExec = std::ptr::null_mut();
            // SAFETY: `graph` is the live graph the capture made; `exec` an out-pointer.
            unsafe { cu!(driver, cuGraphInstantiateWithFlags(&mut exec, graph, 0)) }
                .map_err(&map)?;
            Ok(GraphExec {
                ctx: Arc::clone(&self.ctx),
                raw: exec,
            })
        });
        if !graph.is_null() {
            // SAFETY: the instantiated graph does not need its template any more.
            let _ = unsafe { cu!(driver, cuGraphDestroy(graph)) };
        }
        made
    }

    /// Queues `graph`'s work on this stream.
    pub fn launch_graph(&self, graph: &GraphExec) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        // SAFETY: both are live; the graph was made in this stream's context.
        unsafe { cu!(self.ctx.driver, cuGraphLaunch(graph.raw, self.raw)) }
    }
}

context_object! {
    /// A CUDA event.
    pub struct Event(CUevent), released by cuEventDestroy;
}

impl Event {
    /// An event with `CU_EVENT_*` flags.
    pub fn new(ctx: &Arc<Context>, flags: u32) -> Result<Event, CudaError> {
        ctx.make_current()?;
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        unsafe { cu!(ctx.driver, cuEventCreate(&mut raw, flags as c_uint))? };
        Ok(Event {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    /// The driver's handle for this event (made `CU_EVENT_INTERPROCESS`),
    /// which another process opens ([`Event::open_ipc`]); 64 bytes.
    pub fn ipc_handle(&self) -> Result<[u8; 64], CudaError> {
        self.ctx.make_current()?;
        let mut handle = CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `handle` is a valid out-pointer, `raw` is live.
        unsafe { cu!(self.ctx.driver, cuIpcGetEventHandle(&mut handle, self.raw))? };
        Ok(handle.reserved)
    }

    /// Another process's event, by its handle: waits on it wait for that
    /// process's work; destroying it closes it.
    pub fn open_ipc(ctx: &Arc<Context>, handle: [u8; 64]) -> Result<Event, CudaError> {
        ctx.make_current()?;
        let mut raw: CUevent = std::ptr::null_mut();
        let handle = CUipcMemHandle { reserved: handle };
        // SAFETY: `raw` is a valid out-pointer; the handle is bytes the driver checks.
        unsafe { cu!(ctx.driver, cuIpcOpenEventHandle(&mut raw, handle))? };
        Ok(Event {
            ctx: Arc::clone(ctx),
            raw,
        })
    }

    pub fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        // SAFETY: both handles are live.
        unsafe { cu!(self.ctx.driver, cuEventRecord(self.raw, stream.raw)) }
    }

    /// Whether the work before the record has finished.
    pub fn is_done(&self) -> Result<bool, CudaError> {
        self.ctx.make_current()?;
        // SAFETY: `raw` is live.
        finished(unsafe { cu!(self.ctx.driver, cuEventQuery(self.raw)) })
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx.make_current()?;
        // SAFETY: `raw` is live.
        unsafe { cu!(self.ctx.driver, cuEventSynchronize(self.raw)) }
    }

    /// Milliseconds from `self` to `end` (both recorded, both with timing).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, CudaError> {
        self.ctx.make_current()?;
        let mut ms = 0f32;
        // SAFETY: `ms` is a valid out-pointer; both handles are live.
        unsafe {
            cu!(
                self.ctx.driver,
                cuEventElapsedTime(&mut ms, self.raw, end.raw)
            )?
        };
        Ok(ms)
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, for staging copies.
pub struct PinnedBuffer {
    ctx: Arc<Context>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this value.
unsafe impl Send for PinnedBuffer {}
// SAFETY: shared access only reads (`as_slice`); writes need `&mut`.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// `len` bytes (at least one) with `CU_MEMHOSTALLOC_*` flags, zeroed.
    pub fn new(ctx: &Arc<Context>, len: usize, flags: u32) -> Result<PinnedBuffer, CudaError> {
        ctx.make_current()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer.
        unsafe {
            cu!(
                ctx.driver,
                cuMemHostAlloc(&mut ptr, len.max(1), flags as c_uint)
            )?
        };
        let ptr = ptr.cast::<u8>();
        // SAFETY: the driver returned `len.max(1)` writable bytes at `ptr`.
        unsafe { std::ptr::write_bytes(ptr, 0, len.max(1)) };
        Ok(PinnedBuffer {
            ctx: Arc::clone(ctx),
            ptr,
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialised bytes owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.ctx.make_current().is_ok() {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed once.
            let _ = unsafe { cu!(self.ctx.driver, cuMemFreeHost(self.ptr.cast())) };
        }
    }
}

/// Host memory the caller mapped, page-locked and known to the driver
/// (`cuMemHostRegister`) for as long as this lives, so async copies to and
/// from it run as DMA without staging.
pub struct HostRegistration {
    ctx: Arc<Context>,
    ptr: *mut c_void,
}

// SAFETY: the registration is a driver-side record keyed by address; it may
// be dropped from any thread.
unsafe impl Send for HostRegistration {}
// SAFETY: as for Send; shared access does nothing.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Registers `len` bytes at `ptr` with `CU_MEMHOSTREGISTER_*` flags.
    ///
    /// # Safety
    /// `ptr..ptr + len` must stay mapped while the registration lives, and
    /// no copy may use it after the registration is dropped.
    pub unsafe fn new(
        ctx: &Arc<Context>,
        ptr: *mut u8,
        len: usize,
        flags: u32,
    ) -> Result<HostRegistration, CudaError> {
        ctx.make_current()?;
        // SAFETY: the caller keeps the range mapped.
        unsafe {
            cu!(
                ctx.driver,
                cuMemHostRegister(ptr.cast(), len, flags as c_uint)
            )?
        };
        Ok(HostRegistration {
            ctx: Arc::clone(ctx),
            ptr: ptr.cast(),
        })
    }

    /// The address the device uses for the start of the range (registered with
    /// `CU_MEMHOSTREGISTER_DEVICEMAP`).
    pub fn device_ptr(&self) -> Result<u64, CudaError> {
        self.ctx.make_current()?;
        let mut device_ptr: CUdeviceptr = 0;
        // SAFETY: `device_ptr` is a valid out-pointer; `ptr` is registered.
        unsafe {
            cu!(
                self.ctx.driver,
                cuMemHostGetDevicePointer(&mut device_ptr, self.ptr, 0)
            )?
        };
        Ok(device_ptr)
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.ctx.make_current().is_ok() {
            // SAFETY: `ptr` was registered by `new` and is unregistered once.
            let _ = unsafe { cu!(self.ctx.driver, cuMemHostUnregister(self.ptr)) };
        }
    }
}

context_object! {
    /// A loaded module, unloaded once every [`Function`] made from it is gone
    /// (they hold an `Arc` of it).
    struct ModuleHandle(CUmodule), released by cuModuleUnload;
}

/// A loaded module; unloaded when it and all its [`Function`]s are dropped.
pub struct Module {
    handle: Arc<ModuleHandle>,
    kind: ImageKind,
    code: CodeChoice,
    names: ImageNames,
}

impl Module {
    /// Loads a fat binary, cubin or PTX image as is: the driver picks the
    /// cubin for the GPU, or JIT-compiles PTX (see [`Module::code`]). Images
    /// whose headers overrun `image` are refused before the driver sees them.
    pub fn load(ctx: &Arc<Context>, image: &[u8], device_sm: u32) -> Result<Module, CudaError> {
        let kind = image::check_image(image)?;
        let words = image::driver_copy(image, kind);
        ctx.make_current()?;
        let mut raw: CUmodule = std::ptr::null_mut();
        if ctx.driver.api.cuModuleLoadDataEx.is_some() {
            // Ask for the JIT's error log, so a PTX that fails says why.
            let mut log = vec![0u8; 16 << 10];
            let mut options = [CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES];
            let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), log.len() as *mut c_void];
            // SAFETY: `words` holds the whole image (headers checked to lie
            // within it; PTX NUL-terminated) and outlives the call; the log
            // buffer has the size passed next to it; `raw` is an out-pointer.
            let loaded = unsafe {
                cu!(
                    ctx.driver,
                    cuModuleLoadDataEx(
                        &mut raw,
                        words.as_ptr().cast(),
                        options.len() as c_uint,
                        options.as_mut_ptr(),
                        values.as_mut_ptr()
                    )
                )
            };
            if let Err(e) = loaded {
                let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]).trim().to_string();
                return Err(if text.is_empty() {
                    e
                } else {
                    e.with_detail(text)
                });
            }
        } else {
            // SAFETY: as above, without the options.
            unsafe {
                cu!(
                    ctx.driver,
                    cuModuleLoadData(&mut raw, words.as_ptr().cast())
                )?
            };
        }
        Ok(Module {
            handle: Arc::new(ModuleHandle {
                ctx: Arc::clone(ctx),
                raw,
            }),
            kind,
            code: image::code_choice(image, device_sm),
            names: image::image_names(image),
        })
    }

    pub fn kind(&self) -> ImageKind {
        self.kind
    }

    /// Which code of the image the driver runs (judged from the image).
    pub fn code(&self) -> CodeChoice {
        self.code
    }

    /// Kernel and variable names found in the image.
    pub fn names(&self) -> &ImageNames {
        &self.names
    }

    fn driver_call_ctx(&self) -> Result<&Arc<Context>, CudaError> {
        self.handle.ctx.make_current()?;
        Ok(&self.handle.ctx)
    }

    /// Every kernel of the module: enumerated by the driver (CUDA 12.4+), or
    /// looked up by the names found in the image on older drivers.
    pub fn functions(&self) -> Result<Vec<Function>, CudaError> {
        let ctx = self.driver_call_ctx()?;
        let d = &ctx.driver;
        if d.api.cuModuleGetFunctionCount.is_none() || d.api.cuModuleEnumerateFunctions.is_none() {
            let mut found = Vec::new();
            for name in &self.names.kernels {
                if let Some(f) = self.function(name)? {
                    found.push(f);
                }
            }
            return Ok(found);
        }
        let mut count: c_uint = 0;
        // SAFETY: `count` is a valid out-pointer; the module is live.
        unsafe { cu!(d, cuModuleGetFunctionCount(&mut count, self.handle.raw))? };
        let mut raws: Vec<CUfunction> = vec![std::ptr::null_mut(); count as usize];
        // SAFETY: `raws` has room for `count` handles.
        unsafe {
            cu!(
                d,
                cuModuleEnumerateFunctions(raws.as_mut_ptr(), count, self.handle.raw)
            )?
        };
        let raws: Vec<CUfunction> = raws.into_iter().filter(|r| !r.is_null()).collect();
        // Under lazy loading (the default since CUDA 12.2) enumerated functions
        // are not loaded yet, and attribute queries on them fail with
        // CUDA_ERROR_FUNCTION_NOT_LOADED: load each one first.
        if d.api.cuFuncLoad.is_some() {
            for &raw in &raws {
                // SAFETY: `raw` is a function handle of this live module.
                unsafe { cu!(d, cuFuncLoad(raw))? };
            }
        }
        Ok(raws
            .into_iter()
            .map(|raw| Function {
                module: Arc::clone(&self.handle),
                raw,
            })
            .collect())
    }

    /// The kernel called `name`, or `None` when the module has none.
    pub fn function(&self, name: &str) -> Result<Option<Function>, CudaError> {
        let ctx = self.driver_call_ctx()?;
        let Ok(cname) = CString::new(name) else {
            return Ok(None);
        };
        let mut raw: CUfunction = std::ptr::null_mut();
        // SAFETY: `cname` is NUL-terminated; `raw` is an out-pointer.
        match unsafe {
            cu!(
                ctx.driver,
                cuModuleGetFunction(&mut raw, self.handle.raw, cname.as_ptr())
            )
        } {
            Ok(()) => Ok(Some(Function {
                module: Arc::clone(&self.handle),
                raw,
            })),
            Err(e) if e.code == CUDA_ERROR_NOT_FOUND => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Address and size of the module variable `name`, or `None`.
    pub fn global(&self, name: &str) -> Result<Option<(u64, u64)>, CudaError> {
        let ctx = self.driver_call_ctx()?;
        let Ok(cname) = CString::new(name) else {
            return Ok(None);
        };
        let (mut ptr, mut size): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: `cname` is NUL-terminated; both are out-pointers.
        match unsafe {
            cu!(
                ctx.driver,
                cuModuleGetGlobal(&mut ptr, &mut size, self.handle.raw, cname.as_ptr())
            )
        } {
            Ok(()) => Ok(Some((ptr, size as u64))),
            Err(e) if e.code == CUDA_ERROR_NOT_FOUND => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every variable named in the image that the driver can find: (name,
    /// address, size). A name the driver rejects is left out.
    pub fn globals(&self) -> Vec<(String, u64, u64)> {
        self.names
            .variables
            .iter()
            .filter_map(|name| match self.global(name) {
                Ok(Some((ptr, size))) => Some((name.clone(), ptr, size)),
                _ => None,
            })
            .collect()
    }
}

/// Grid, block, dynamic shared memory and `CU_LAUNCH_ATTRIBUTE_*`s of one launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
    pub attributes: Vec<LaunchAttr>,
}

impl LaunchConfig {
    /// `blocks` blocks of `threads` threads along x, with no dynamic shared
    /// memory and no attributes.
    pub fn linear(blocks: u32, threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            dynamic_shared_bytes: 0,
            attributes: Vec::new(),
        }
    }
}

/// `config`'s attributes as the driver takes them.
fn raw_attributes(config: &LaunchConfig) -> Vec<CUlaunchAttribute> {
    config
        .attributes
        .iter()
        .map(|a| {
            let mut value = [0u32; 16];
            value[..3].copy_from_slice(&a.value);
            CUlaunchAttribute {
                id: a.id,
                pad: [0; 4],
                value,
            }
        })
        .collect()
}

/// `config` as the driver takes it, on `stream`, pointing at `attrs` (which
/// must outlive its use).
fn raw_config(
    config: &LaunchConfig,
    stream: CUstream,
    attrs: &mut [CUlaunchAttribute],
) -> CUlaunchConfig {
    CUlaunchConfig {
        grid_dim: config.grid,
        block_dim: config.block,
        shared_mem_bytes: config.dynamic_shared_bytes,
        stream,
        attrs: if attrs.is_empty() {
            std::ptr::null_mut()
        } else {
            attrs.as_mut_ptr()
        },
        num_attrs: attrs.len() as c_uint,
    }
}

/// One launch attribute: its `CUlaunchAttributeID` and the first words of
/// its value (cluster dimensions take three, the others one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchAttr {
    pub id: u32,
    pub value: [u32; 3],
}

/// Declares [`FunctionAttributes`], one `i32` field per `FIELD =
/// CU_FUNC_ATTRIBUTE_*`, and [`Function::attributes`], which reads them all.
macro_rules! function_attributes {
    ($($field:ident = $attr:ident,)*) => {
        /// The `cuFuncGetAttribute` values a client needs.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct FunctionAttributes {
            $(pub $field: i32,)*
        }

        impl Function {
            pub fn attributes(&self) -> Result<FunctionAttributes, CudaError> {
                Ok(FunctionAttributes {
                    $($field: self.attribute($attr)?,)*
                })
            }
        }
    };
}

function_attributes! {
    max_threads_per_block = CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
    shared_size_bytes = CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
    const_size_bytes = CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
    local_size_bytes = CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
    num_regs = CU_FUNC_ATTRIBUTE_NUM_REGS,
    ptx_version = CU_FUNC_ATTRIBUTE_PTX_VERSION,
    binary_version = CU_FUNC_ATTRIBUTE_BINARY_VERSION,
    max_dynamic_shared_size_bytes = CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
}

/// A kernel of a loaded module; keeps the module loaded.
#[derive(Clone)]
pub struct Function {
    module: Arc<ModuleHandle>,
    raw: CUfunction,
}

// SAFETY: function handles may be used from any thread.
unsafe impl Send for Function {}
// SAFETY: as for Send.
unsafe impl Sync for Function {}

impl Function {
    fn ctx(&self) -> Result<&Arc<Context>, CudaError> {
        self.module.ctx.make_current()?;
        Ok(&self.module.ctx)
    }

    /// The kernel's (mangled) name.
    pub fn name(&self) -> Result<String, CudaError> {
        let ctx = self.ctx()?;
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: `name` is an out-pointer; on success the driver points it at
        // a NUL-terminated string that lives as long as the module.
        unsafe { cu!(ctx.driver, cuFuncGetName(&mut name, self.raw))? };
        if name.is_null() {
            return Ok(String::new());
        }
        // SAFETY: non-null, NUL-terminated, and the module is loaded.
        Ok(unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned())
    }

    /// Byte offset and size of each parameter in the packed parameter buffer.
    pub fn param_layout(&self) -> Result<Vec<(u32, u32)>, CudaError> {
        let ctx = self.ctx()?;
        image::param_layout(|index| {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: both are valid out-pointers.
            match unsafe {
                cu!(
                    ctx.driver,
                    cuFuncGetParamInfo(self.raw, index, &mut offset, &mut size)
                )
            } {
                Ok(()) => Ok(Some((offset, size))),
                Err(e) if e.code == CUDA_ERROR_INVALID_VALUE => Ok(None),
                Err(e) => Err(e),
            }
        })
    }

    /// One `CUfunction_attribute`.
    pub fn attribute(&self, attr: i32) -> Result<i32, CudaError> {
        let ctx = self.ctx()?;
        let mut v: c_int = 0;
        // SAFETY: `v` is a valid out-pointer.
        unsafe { cu!(ctx.driver, cuFuncGetAttribute(&mut v, attr, self.raw))? };
        Ok(v)
    }

    pub fn set_attribute(&self, attr: i32, value: i32) -> Result<(), CudaError> {
        let ctx = self.ctx()?;
        // SAFETY: plain values and a live handle.
        unsafe { cu!(ctx.driver, cuFuncSetAttribute(self.raw, attr, value)) }
    }

    /// `cuOccupancyMaxActiveClusters`: how many clusters of a launch shaped
    /// as `config` (its cluster dimension among the attributes, or the
    /// kernel's required one) can be resident on the device at once.
    pub fn max_active_clusters(&self, config: &LaunchConfig) -> Result<i32, CudaError> {
        self.cluster_occupancy(config, false)
    }

    /// `cuOccupancyMaxPotentialClusterSize`: the largest cluster a launch
    /// shaped as `config` could run in.
    pub fn max_potential_cluster_size(&self, config: &LaunchConfig) -> Result<i32, CudaError> {
        self.cluster_occupancy(config, true)
    }

    /// One of the two cluster occupancy queries (`potential`: the size).
    fn cluster_occupancy(&self, config: &LaunchConfig, potential: bool) -> Result<i32, CudaError> {
        let ctx = self.ctx()?;
        let mut attrs = raw_attributes(config);
        let raw = raw_config(config, std::ptr::null_mut(), &mut attrs);
        let mut n: c_int = 0;
        let (n_ptr, f) = (&mut n as *mut c_int, self.raw);
        // SAFETY: `n_ptr` is an out-pointer; `raw` and the `attrs` it points
        // at outlive the call; a null stream asks about the current context.
        unsafe {
            match potential {
                true => cu!(
                    ctx.driver,
                    cuOccupancyMaxPotentialClusterSize(n_ptr, f, &raw)
                )?,
                false => cu!(ctx.driver, cuOccupancyMaxActiveClusters(n_ptr, f, &raw))?,
            }
        };
        Ok(n)
    }

    /// Queues the kernel on `stream` with the packed parameter buffer `params`
    /// (passed through `CU_LAUNCH_PARAM_BUFFER_POINTER`/`SIZE`; the driver
    /// copies it before returning). The buffer handed over is exactly
    /// `params_bytes` long (the end of the last parameter, see
    /// [`crate::image::params_bytes`]): a shorter `params` is zero-padded, a
    /// longer one cut. A kernel without parameters gets no `extra` at all.
    pub fn launch(
        &self,
        stream: &Stream,
        config: &LaunchConfig,
        params: &[u8],
        params_bytes: usize,
    ) -> Result<(), CudaError> {
        let ctx = self.ctx()?;
        let mut buffer = params.to_vec();
        buffer.resize(params_bytes, 0);
        match self.launch_packed(ctx, stream, config, &mut buffer) {
            // Should the driver want the buffer rounded up to the parameter
            // space's 8-byte alignment, give it that once.
            Err(e) if e.code == CUDA_ERROR_INVALID_VALUE && !params_bytes.is_multiple_of(8) => {
                buffer.resize(params_bytes.next_multiple_of(8), 0);
                self.launch_packed(ctx, stream, config, &mut buffer)
                    .map_err(|_| e)
            }
            other => other,
        }
    }

    fn launch_packed(
        &self,
        ctx: &Context,
        stream: &Stream,
        config: &LaunchConfig,
        buffer: &mut [u8],
    ) -> Result<(), CudaError> {
        let mut size = buffer.len();
        let mut extra: [*mut c_void; 5] = [
            CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buffer.as_mut_ptr().cast(),
            CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            CU_LAUNCH_PARAM_END as *mut c_void,
        ];
        let extra_ptr = if buffer.is_empty() {
            std::ptr::null_mut()
        } else {
            extra.as_mut_ptr()
        };
        if !config.attributes.is_empty() {
            let mut attrs = raw_attributes(config);
            let raw_config = raw_config(config, stream.raw, &mut attrs);
            // SAFETY: `raw_config` and `attrs` outlive the call, `extra_ptr` is
            // as below, and the driver copies everything before returning.
            return unsafe {
                cu!(
                    ctx.driver,
                    cuLaunchKernelEx(&raw_config, self.raw, std::ptr::null_mut(), extra_ptr)
                )
            };
        }
        let [gx, gy, gz] = config.grid;
        let [bx, by, bz] = config.block;
        // SAFETY: `extra_ptr` is null or a CU_LAUNCH_PARAM_END-terminated list
        // whose pointers (`buffer`, `size`) outlive the call, and the driver
        // copies the parameters before returning; `stream` and the function
        // are live.
        unsafe {
            cu!(
                ctx.driver,
                cuLaunchKernel(
                    self.raw,
                    gx,
                    gy,
                    gz,
                    bx,
                    by,
                    bz,
                    config.dynamic_shared_bytes,
                    stream.raw,
                    std::ptr::null_mut(),
                    extra_ptr
                )
            )
        }
    }
}
