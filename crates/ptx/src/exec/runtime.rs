//! One grid's device runtime state for dynamic parallelism: parameter
//! buffers handed out, launches queued, device streams, last errors.

use crate::launch::LaunchConfig;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Mutex;

/// Launches made and not yet complete (a grid completes with its children),
/// the whole tree together (`cudaLimitDevRuntimePendingLaunchCount`'s
/// default). It alone bounds nesting: on an H200 a chain of launches went
/// 2,048 deep and the next failed with 69, not 65.
pub(crate) const PENDING_LIMIT: usize = 2048;

/// `cudaStreamTailLaunch` and `cudaStreamFireAndForget`.
pub(super) const TAIL: u64 = 3;
pub(super) const FIRE_AND_FORGET: u64 = 4;
/// Handles of streams made on the device start here.
const STREAM_BASE: u64 = 0x1000;

// the runtime's `cudaError_t` codes a device-side call returns
pub(super) const INVALID_VALUE: u32 = 1;
pub(super) const MEMORY_ALLOCATION: u32 = 2;
pub(super) const INVALID_CONFIGURATION: u32 = 9;
pub(super) const PENDING_COUNT_EXCEEDED: u32 = 69;
pub(super) const INVALID_DEVICE_FUNCTION: u32 = 98;
pub(super) const INVALID_RESOURCE_HANDLE: u32 = 400;

/// A parameter buffer handed out: the launch it is for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Header {
    /// Index into the module's kernels, `None` for a bad function address.
    pub(super) kernel: Option<usize>,
    pub(super) cfg: LaunchConfig,
    pub(super) params_len: usize,
}

/// A launch queued by a thread of the grid.
#[derive(Debug)]
pub(super) struct Queued {
    pub(super) kernel: usize,
    pub(super) cfg: LaunchConfig,
    pub(super) buf: u64,
    pub(super) params_len: usize,
    pub(super) tail: bool,
}

/// One grid's device runtime: its parameter buffers, queued launches,
/// streams and each thread's last error.
#[derive(Debug)]
pub(super) struct Cdp<'a> {
    /// Launches made and not complete in the whole tree.
    pub(super) pending: &'a AtomicUsize,
    pub(super) bufs: Mutex<HashMap<u64, Header>>,
    pub(super) queue: Mutex<Vec<Queued>>,
    pub(super) streams: Mutex<HashSet<u64>>,
    pub(super) next_stream: AtomicU64,
    pub(super) errors: Mutex<HashMap<([u32; 3], u32), u32>>,
}

impl<'a> Cdp<'a> {
    pub(super) fn new(pending: &'a AtomicUsize) -> Cdp<'a> {
        Cdp {
            pending,
            bufs: Mutex::default(),
            queue: Mutex::default(),
            streams: Mutex::default(),
            next_stream: AtomicU64::new(STREAM_BASE),
            errors: Mutex::default(),
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
