//! The handles the program holds. An object the server made (stream, event,
//! module, function) is named inside the client by the server's handle, the
//! one the wire carries; the program gets that handle shifted into a range
//! of its own (`WIRE_TAG | handle << 4`), so it stays 16-byte aligned as the
//! handles the client mints are (a program may keep flags in the low bits of
//! a pointer it is given) and never meets those, which name objects only the
//! client keeps (contexts, libraries, graphs, link states) and count up from
//! `FIRST_MINTED`. Inside the client the wire's handle is the only name.

use std::ffi::c_void;

use cumux_protocol::{Handle, DEFAULT_STREAM};

use crate::errors::*;

/// Marks a program's handle as a server object's.
const WIRE_TAG: usize = 1 << 48;

/// The first handle the client mints; each next one is 0x10 further.
pub const FIRST_MINTED: usize = 0x10_0000;

/// Where a context's handle keeps its device: contexts are minted handles
/// with the device's number above this bit, so the calling thread's current
/// device is known without the state lock (`current::current_device`).
const CONTEXT_DEVICE_SHIFT: u32 = 40;

/// The handle of a context on `device`, from a freshly minted handle.
pub fn context(minted: usize, device: u32) -> usize {
    minted | (device as usize) << CONTEXT_DEVICE_SHIFT
}

/// The device a context's handle names (see [`context`]).
pub fn device_of_context(ctx: usize) -> u32 {
    ((ctx & !WIRE_TAG) >> CONTEXT_DEVICE_SHIFT) as u32 & 0xff
}

/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: special stream handles.
pub const STREAM_LEGACY: usize = 1;
pub const STREAM_PER_THREAD: usize = 2;

/// The program's handle for a server object.
pub fn to_program(wire: Handle) -> *mut c_void {
    (WIRE_TAG | (wire as usize) << 4) as *mut c_void
}

/// The server's handle a program's handle names, if it names a server object.
pub fn wire(program: *mut c_void) -> Option<Handle> {
    let p = program as usize;
    (p & WIRE_TAG != 0 && p & 0xf == 0).then_some(((p & !WIRE_TAG) >> 4) as Handle)
}

/// The server's handle for a server object the program names, or
/// `CUDA_ERROR_INVALID_HANDLE`.
pub fn wire_or_invalid(program: *mut c_void) -> CuResult<Handle> {
    wire(program).ok_or(CUDA_ERROR_INVALID_HANDLE)
}

/// The server's stream for a program's stream: the legacy default stream for
/// 0, `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`. Whether the stream
/// exists is for `State::check_stream`.
pub fn stream(program: *mut c_void) -> CuResult<Handle> {
    match program as usize {
        0 | STREAM_LEGACY | STREAM_PER_THREAD => Ok(DEFAULT_STREAM),
        _ => wire_or_invalid(program),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contexts_handle_names_its_device() {
        for device in [0, 1, 7] {
            let ctx = context(FIRST_MINTED + 0x30, device);
            assert_eq!(ctx % 16, 0);
            assert_eq!(device_of_context(ctx), device);
            assert_eq!(wire(ctx as *mut c_void), None);
        }
    }

    #[test]
    fn server_handles_go_to_the_program_and_back() {
        for h in [0x100, 0x101, 0x1234_5678] {
            let p = to_program(h);
            assert_eq!(p as usize % 16, 0);
            assert_eq!(wire(p), Some(h));
            assert_eq!(stream(p), Ok(h));
        }
        assert_eq!(stream(std::ptr::null_mut()), Ok(DEFAULT_STREAM));
        assert_eq!(stream(STREAM_PER_THREAD as *mut c_void), Ok(DEFAULT_STREAM));
        // Minted handles and odd values are not a server object's.
        assert_eq!(wire(FIRST_MINTED as *mut c_void), None);
        assert_eq!(wire((WIRE_TAG | 0x1008) as *mut c_void), None);
        assert_eq!(
            stream(FIRST_MINTED as *mut c_void),
            Err(CUDA_ERROR_INVALID_HANDLE)
        );
    }
}
