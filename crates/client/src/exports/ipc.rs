//! Device memory and events shared between processes (`cuIpc*MemHandle`,
//! `cuIpc*EventHandle`): the handle is the device driver's own, so the process
//! that opens it reaches the memory device to device, or waits for the other
//! process's work; the server lets a program open only handles its tenant's
//! programs gave out.

use std::ffi::c_void;

use cumux_cuda_bindings::consts::{CU_EVENT_DISABLE_TIMING, CU_EVENT_INTERPROCESS};
use cumux_cuda_bindings::types::{CUipcEventHandle, CUipcMemHandle};
use cumux_protocol::{Call, ReplyBody, IPC_HANDLE_BYTES};

use super::*;
use crate::state::{client, handles, Event};

/// What an event shared between processes is made with.
const EVENT_IPC_FLAGS: u32 = CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;

driver_fn! {
    fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, ptr: u64) {
        let c = client()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        c.lock().allocation_of(ptr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let bytes = match c.call(Call::IpcGetMemHandle { ptr })? {
            ReplyBody::Data(bytes) if bytes.len() == IPC_HANDLE_BYTES => bytes,
            _ => return Err(CUDA_ERROR_UNKNOWN),
        };
        let slot = host_bytes_mut(handle.cast(), IPC_HANDLE_BYTES)?;
        slot.copy_from_slice(&bytes);
        Ok(())
    }

    fn cuIpcOpenMemHandle | cuIpcOpenMemHandle_v2 (pdptr: *mut u64, handle: CUipcMemHandle, flags: u32) {
        let c = client()?;
        let device = c.lock().context_device()?;
        let bytes = handle.reserved.map(|b| b as u8);
        let call = Call::IpcOpenMemHandle {
            handle: bytes.to_vec(),
            flags,
        };
        let (base, size) = match c.call_on(device, call)? {
            ReplyBody::Range { base, size } => (base, size),
            _ => return Err(CUDA_ERROR_UNKNOWN),
        };
        c.place(base, size, device)?;
        c.lock().allocations.insert(base, size);
        out(pdptr, base)
    }

    fn cuIpcGetEventHandle(handle: *mut CUipcEventHandle, event: *mut c_void) {
        let c = client()?;
        if handle.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let event = handles::wire_or_invalid(event)?;
        c.lock().check_event(event)?;
        let bytes = match c.call(Call::IpcGetEventHandle { event })? {
            ReplyBody::Data(bytes) if bytes.len() == IPC_HANDLE_BYTES => bytes,
            _ => return Err(CUDA_ERROR_UNKNOWN),
        };
        host_bytes_mut(handle.cast(), IPC_HANDLE_BYTES)?.copy_from_slice(&bytes);
        Ok(())
    }

    fn cuIpcOpenEventHandle(event: *mut *mut c_void, handle: CUipcEventHandle) {
        let c = client()?;
        let device = c.lock().context_device()?;
        let bytes = handle.reserved.map(|b| b as u8);
        let call = Call::IpcOpenEventHandle { handle: bytes.to_vec() };
        let opened = c.call_for_handle_on(device, call)?;
        c.lock().events.insert(opened, Event {
                flags: EVENT_IPC_FLAGS,
                mark: None,
            });
        out(event, handles::to_program(opened))
    }

    fn cuIpcCloseMemHandle(ptr: u64) {
        let c = client()?;
        c.call(Call::IpcCloseMemHandle { ptr })?;
        c.placements().remove(ptr);
        c.lock().allocations.remove(&ptr);
        Ok(())
    }
}
