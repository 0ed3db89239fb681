//! The process's compiled kernels, keyed by what their code is made from (the
//! lowered kernel: its instructions, lines, registers, frame): a module
//! loaded again, by this program or another, compiles nothing again.

use super::compiled::CompiledKernel;
use crate::ir::Func;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Kernels the cache keeps at most; past it the oldest goes (modules using
/// it keep their own reference).
const CACHE_KERNELS: usize = 512;

/// Kernels compiled to native code in this process.
static COMPILED: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct Cache {
    kernels: HashMap<String, Arc<CompiledKernel>>,
    order: VecDeque<String>,
}

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(Mutex::default)
}

/// What a kernel's native code is made from: the whole lowered function
/// (the compiler reads nothing else of the module once the plan takes it).
pub(super) fn key_of(f: &Func) -> String {
    format!("{f:?}")
}

/// The cached kernel compiled from `key`, else `compile`'s, kept for the
/// next module with the same kernel.
pub(super) fn cached(
    key: String,
    compile: impl FnOnce() -> Result<CompiledKernel, String>,
) -> Result<Arc<CompiledKernel>, String> {
    let lock = || cache().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = lock().kernels.get(&key) {
        return Ok(k.clone());
    }
    // compiled outside the lock: two modules may compile one kernel at
    // once, and the second keeps the first's
    let kernel = Arc::new(compile()?);
    COMPILED.fetch_add(1, Ordering::Relaxed);
    let mut c = lock();
    if let Some(k) = c.kernels.get(&key) {
        return Ok(k.clone());
    }
    if c.order.len() >= CACHE_KERNELS {
        if let Some(old) = c.order.pop_front() {
            c.kernels.remove(&old);
        }
    }
    c.order.push_back(key.clone());
    c.kernels.insert(key, kernel.clone());
    Ok(kernel)
}

/// Kernels compiled to native code in this process so far (a kernel found
/// in the cache is not counted again).
pub fn compilations() -> u64 {
    COMPILED.load(Ordering::Relaxed)
}
