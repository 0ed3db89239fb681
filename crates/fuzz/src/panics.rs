//! The panic hook of a fuzzing process: a panic on a thread that is checking an
//! input is recorded (message and location) instead of printed, so the loop can
//! name and deduplicate it; panics on other threads (a server's stream thread
//! running the model device's `panic` kernel) are counted by location, printed
//! once each, and summed up at the end of a run.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::panic::{self, PanicHookInfo};
use std::sync::{Mutex, Once};

thread_local! {
    /// `Some` while this thread checks an input: the last panic's description.
    static CAPTURE: RefCell<Option<Option<PanicRecord>>> = const { RefCell::new(None) };
}

/// Panics seen on threads that were not checking an input, by location.
static BACKGROUND: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
static INSTALL: Once = Once::new();

/// Where a panic happened and what it said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PanicRecord {
    /// `file:line:column`.
    pub location: String,
    pub message: String,
}

/// Installs the hook (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let record = describe(info);
            let captured = CAPTURE.with(|c| match c.borrow_mut().as_mut() {
                Some(slot) => {
                    *slot = Some(record.clone());
                    true
                }
                None => false,
            });
            if captured {
                return;
            }
            let first = {
                let mut background = BACKGROUND.lock().unwrap_or_else(|e| e.into_inner());
                let count = background.entry(record.location.clone()).or_default();
                *count += 1;
                *count == 1
            };
            if first {
                previous(info);
            }
        }));
    });
}

fn describe(info: &PanicHookInfo<'_>) -> PanicRecord {
    let message = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".into());
    let mut location = info
        .location()
        .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
        .unwrap_or_else(|| "(unknown location)".into());
    // A panic inside the standard library (an overflowing `product`, an
    // `unwrap`) is told apart by the workspace code that called it.
    if location.starts_with("/rustc/") {
        if let Some(caller) = workspace_caller() {
            location = format!("{location} (from {caller})");
        }
    }
    PanicRecord { location, message }
}

/// The innermost frame of the stack in this workspace's crates (not the
/// standard library, not a registry crate), outside this file.
fn workspace_caller() -> Option<String> {
    let trace = std::backtrace::Backtrace::force_capture().to_string();
    trace
        .lines()
        .filter_map(|line| line.trim().strip_prefix("at "))
        .find(|at| {
            !at.starts_with("/rustc/")
                && !at.contains("/.cargo/registry/")
                && !at.contains("src/panics.rs:")
        })
        .map(str::to_string)
}

/// Runs `f` with this thread's panics recorded instead of printed; the panic,
/// if `f` panicked.
pub fn capture<R>(f: impl FnOnce() -> R) -> Result<R, PanicRecord> {
    install();
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let result = panic::catch_unwind(panic::AssertUnwindSafe(f));
    let record = CAPTURE.with(|c| c.borrow_mut().take()).flatten();
    result.map_err(|_| {
        record.unwrap_or_else(|| PanicRecord {
            location: "(unknown location)".into(),
            message: "(the panic hook saw nothing)".into(),
        })
    })
}

/// Panics seen so far on threads that were not checking an input, by location.
pub fn background() -> BTreeMap<String, u64> {
    BACKGROUND.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
