//! How `cuGetProcAddress` picks a symbol: from the table generated from the
//! toolkit headers (`cumux_cuda_bindings::entry_points`), every driver entry
//! point keyed by base name, the CUDA version that introduced each form, and
//! whether it is the per-thread-default-stream form.

use cumux_cuda_bindings::entry_points::ENTRY_POINTS;

pub use cumux_cuda_bindings::entry_points::EntryPoint;

pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum SymbolStatus {
    Success = 0,
    SymbolNotFound = 1,
    VersionNotSufficient = 2,
}

/// Resolves `name` as a program built for CUDA `version` means it. The
/// per-thread form wins when asked for and it exists at that version.
pub fn resolve(name: &str, version: i32, flags: u64) -> Result<&'static EntryPoint, SymbolStatus> {
    let forms = ENTRY_POINTS.iter().filter(|e| e.name == name);
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let mut any = false;
    let mut best: Option<&EntryPoint> = None;
    let mut best_ptds: Option<&EntryPoint> = None;
    for e in forms {
        any = true;
        if e.version as i64 > version as i64 {
            continue;
        }
        let slot = if e.per_thread {
            &mut best_ptds
        } else {
            &mut best
        };
        if slot.is_none_or(|b| b.version < e.version) {
            *slot = Some(e);
        }
    }
    if !any {
        return Err(SymbolStatus::SymbolNotFound);
    }
    match (per_thread, best_ptds, best) {
        (true, Some(p), _) => Ok(p),
        (_, _, Some(b)) => Ok(b),
        _ => Err(SymbolStatus::VersionNotSufficient),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_pick_the_right_symbol() {
        assert_eq!(
            resolve("cuMemAlloc", 13000, 0).unwrap().symbol,
            "cuMemAlloc_v2"
        );
        assert_eq!(resolve("cuMemAlloc", 3000, 0).unwrap().symbol, "cuMemAlloc");
        assert_eq!(
            resolve("cuCtxCreate", 12080, 0).unwrap().symbol,
            "cuCtxCreate_v4"
        );
        assert_eq!(
            resolve("cuCtxCreate", 12000, 0).unwrap().symbol,
            "cuCtxCreate_v3"
        );
        assert_eq!(
            resolve(
                "cuMemcpyHtoD",
                12000,
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
            )
            .unwrap()
            .symbol,
            "cuMemcpyHtoD_v2_ptds"
        );
        assert_eq!(
            resolve(
                "cuLaunchKernel",
                12000,
                CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
            )
            .unwrap()
            .symbol,
            "cuLaunchKernel_ptsz"
        );
        assert_eq!(
            resolve("cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM)
                .unwrap()
                .symbol,
            "cuLaunchKernel"
        );
        assert_eq!(
            resolve("cuGetProcAddress", 13000, 0).unwrap().symbol,
            "cuGetProcAddress_v2"
        );
        assert_eq!(
            resolve("cuMemAllocAsync", 11000, 0).unwrap_err(),
            SymbolStatus::VersionNotSufficient
        );
        assert_eq!(
            resolve("cuNoSuchThing", 13000, 0).unwrap_err(),
            SymbolStatus::SymbolNotFound
        );
    }
}
