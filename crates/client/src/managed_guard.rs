//! Managed memory the host may not touch while device work is out, as on a
//! device without concurrent managed access (what cumux reports): after a
//! launch, the pages of each managed allocation the launch may use are made
//! inaccessible to the host. A host access then faults, and the fault handler
//! waits for the device, brings the host copy up to date and lets the access
//! through, so host and device never use an allocation at once and neither
//! loses the other's writes. Synchronising calls open the pages again.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use cumux_cuda_bindings::consts::{CU_MEM_ATTACH_HOST, CU_MEM_ATTACH_SINGLE};
use cumux_protocol::Handle;

use crate::errors::*;

/// What device work may use an allocation (`cuStreamAttachMemAsync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// Work on any stream.
    Global,
    /// No device work: the host may use it at any time.
    Host,
    /// Work on this stream only.
    Stream(Handle),
}

impl Attach {
    /// The attachment `flags` (`CU_MEM_ATTACH_*`) name for `stream`.
    pub fn of(flags: u32, stream: Handle) -> Attach {
        match flags {
            CU_MEM_ATTACH_HOST => Attach::Host,
            CU_MEM_ATTACH_SINGLE => Attach::Stream(stream),
            _ => Attach::Global,
        }
    }

    fn used_by(self, stream: Handle) -> bool {
        match self {
            Attach::Global => true,
            Attach::Host => false,
            Attach::Stream(s) => s == stream,
        }
    }
}

struct Range {
    len: u64,
    attach: Attach,
    guarded: bool,
}

/// Managed allocations by address.
static RANGES: Mutex<BTreeMap<u64, Range>> = Mutex::new(BTreeMap::new());
/// Whether any allocation is registered (a launch then looks at them).
static ANY: AtomicBool = AtomicBool::new(false);
/// Whether any allocation is guarded (a synchronising call then opens them).
static GUARDED: AtomicBool = AtomicBool::new(false);
/// The handler of `SIGSEGV` before ours, for faults that are not ours.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
/// What a host access to a closed allocation at an address does: waits for
/// the device and opens the allocations (`crate::managed::settle`).
static SETTLE: OnceLock<fn(u64)> = OnceLock::new();

thread_local! {
    /// How deep this thread is in cumux's own code (an exported call, a host
    /// function's worker): a fault there only opens the pages.
    static INSIDE: Cell<u32> = const { Cell::new(0) };
}

fn ranges() -> MutexGuard<'static, BTreeMap<u64, Range>> {
    RANGES.lock().unwrap_or_else(|p| p.into_inner())
}

const PAGE: u64 = 4096;

/// The pages `[ptr, ptr + len)` touches: (first byte, end).
pub fn pages(ptr: u64, len: u64) -> (u64, u64) {
    let start = ptr / PAGE * PAGE;
    (start, (ptr + len.max(1)).div_ceil(PAGE) * PAGE)
}

fn protect(ptr: u64, len: u64, prot: libc::c_int) {
    let (start, end) = pages(ptr, len);
    // SAFETY: the pages belong to a managed allocation this process mapped
    // read-write (`crate::managed`) and has not yet unmapped (it unregisters
    // first); only their protection changes.
    let done = unsafe { libc::mprotect(start as *mut c_void, (end - start) as usize, prot) };
    if done != 0 {
        tracing::warn!(
            "managed memory at {ptr:#x}: mprotect failed: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Marks the calling thread as in cumux's own code while the value lives.
pub struct Inside(());

impl Inside {
    pub fn enter() -> Inside {
        INSIDE.with(|d| d.set(d.get() + 1));
        Inside(())
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Registers a managed allocation of `len` bytes at `ptr` (mapped read-write
/// in this process), used by device work as `attach` says; a host access
/// while it is closed calls `settle` with the address.
pub fn register(ptr: u64, len: u64, attach: Attach, settle: fn(u64)) {
    SETTLE.get_or_init(|| settle);
    install_handler();
    ranges().insert(
        ptr,
        Range {
            len,
            attach,
            guarded: false,
        },
    );
    ANY.store(true, Ordering::Release);
}

/// Forgets the allocation at `ptr`, its pages open again, before they are
/// unmapped.
pub fn unregister(ptr: u64) {
    let mut r = ranges();
    if let Some(range) = r.remove(&ptr) {
        if range.guarded {
            protect(ptr, range.len, libc::PROT_READ | libc::PROT_WRITE);
        }
    }
    ANY.store(!r.is_empty(), Ordering::Release);
}

/// Sets which device work may use the managed allocation holding `ptr`;
/// `INVALID_VALUE` where none holds it.
pub fn attach(ptr: u64, attach: Attach) -> CuResult<()> {
    let mut r = ranges();
    let (_, range) = r
        .range_mut(..=ptr)
        .next_back()
        .filter(|(base, range)| ptr < **base + range.len.max(1))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    range.attach = attach;
    Ok(())
}

/// Whether work on `stream` may use the managed allocation at `ptr`.
pub fn used_by(ptr: u64, stream: Handle) -> bool {
    ranges().get(&ptr).is_none_or(|r| r.attach.used_by(stream))
}

/// After device work queued on `stream`: the allocations it may use are
/// closed to the host until a synchronising call.
pub fn after_work(stream: Handle) {
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    let mut r = ranges();
    for (ptr, range) in r.iter_mut() {
        if !range.guarded && range.attach.used_by(stream) {
            protect(*ptr, range.len, libc::PROT_NONE);
            range.guarded = true;
            GUARDED.store(true, Ordering::Release);
        }
    }
}

/// After a synchronising call (or a wait for the device): every allocation
/// open to the host again.
pub fn open_all() {
    if !GUARDED.load(Ordering::Acquire) {
        return;
    }
    let mut r = ranges();
    for (ptr, range) in r.iter_mut() {
        if range.guarded {
            protect(*ptr, range.len, libc::PROT_READ | libc::PROT_WRITE);
            range.guarded = false;
        }
    }
    GUARDED.store(false, Ordering::Release);
}

/// Whether the page holding `addr` is closed by a guarded allocation.
fn guards(addr: u64) -> bool {
    let (page, _) = pages(addr, 1);
    ranges().iter().any(|(ptr, range)| {
        let (start, end) = pages(*ptr, range.len);
        range.guarded && (start..end).contains(&page)
    })
}

fn install_handler() {
    PREVIOUS.get_or_init(|| {
        // SAFETY: sigaction with a handler of the SA_SIGINFO shape; the
        // structs are zeroed plain C data, filled before the call.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_fault as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGSEGV, &action, &mut previous) != 0 {
                tracing::warn!(
                    "managed memory: no fault handler ({}); host accesses during kernels are not held",
                    std::io::Error::last_os_error()
                );
            }
            previous
        }
    });
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as u64;
    let ours = std::panic::catch_unwind(|| guards(addr)).unwrap_or(false);
    if !ours {
        chain(sig, info, context);
        return;
    }
    let _ = std::panic::catch_unwind(|| match (INSIDE.with(Cell::get), SETTLE.get()) {
        (0, Some(settle)) => settle(addr),
        // cumux's own code reading or writing the program's memory, as it
        // did before the pages were closed.
        _ => open_all(),
    });
}

/// A fault that is not ours goes to the handler before ours; with none, the
/// default action is restored and the access, made again, ends the process
/// as it would have.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut c_void) {
    let Some(previous) = PREVIOUS.get() else {
        return;
    };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: resets SIGSEGV's disposition to the default.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
        return;
    }
    if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it
        // has this shape; it gets the arguments we got.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, context);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO takes the signal only.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cumux_cuda_bindings::consts::CU_MEM_ATTACH_GLOBAL;

    #[test]
    fn pages_cover_every_byte() {
        assert_eq!(pages(4096, 1), (4096, 8192));
        assert_eq!(pages(4095, 2), (0, 8192));
        assert_eq!(pages(8192, 4096), (8192, 12288));
        assert_eq!(pages(100, 0), (0, 4096));
    }

    #[test]
    fn attachment_decides_which_launches_close_an_allocation() {
        let stream = 0x55;
        assert!(Attach::of(CU_MEM_ATTACH_GLOBAL, stream).used_by(7));
        assert!(!Attach::of(CU_MEM_ATTACH_HOST, stream).used_by(stream));
        assert!(Attach::of(CU_MEM_ATTACH_SINGLE, stream).used_by(stream));
        assert!(!Attach::of(CU_MEM_ATTACH_SINGLE, stream).used_by(7));
    }
}
