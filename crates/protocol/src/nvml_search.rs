//! Where NVIDIA's NVML is looked for: by cumux's NVML, which stands in front
//! of it, and by the server, which reads its per-process samples. One list.

use std::path::PathBuf;

/// Names NVIDIA's NVML to use instead of searching.
pub const REAL_NVML_ENV: &str = "CUMUX_REAL_NVML";
/// The symbol that marks cumux's own NVML, which is never NVIDIA's.
pub const CUMUX_NVML_MARKER: &str = "CUMUX_NVML";
/// NVML's library name.
pub const SONAME: &str = "libnvidia-ml.so.1";

/// Where NVIDIA's driver installs put NVML, after `LD_LIBRARY_PATH`.
const SYSTEM_DIRS: &[&str] = &[
    "/usr/local/nvidia/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib64",
    "/lib",
    "/usr/lib/wsl/lib",
];

/// `$CUMUX_REAL_NVML`, where it is set.
pub fn named() -> Option<PathBuf> {
    std::env::var_os(REAL_NVML_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// The places to look, in order: the named library alone, else
/// `libnvidia-ml.so.1` in each `LD_LIBRARY_PATH` folder and each system
/// folder (never the bare name, which in a client finds cumux's own NVML).
pub fn candidates() -> Vec<PathBuf> {
    if let Some(path) = named() {
        return vec![path];
    }
    let from_env = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    std::env::split_paths(&from_env)
        .filter(|dir| !dir.as_os_str().is_empty())
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(SONAME))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_search_starts_with_the_loader_path_and_skips_empty_entries() {
        // The environment is the test process's own: read it, change nothing.
        if named().is_some() {
            return;
        }
        let found = candidates();
        assert!(found.iter().all(|p| p.ends_with(SONAME)));
        assert!(found.contains(&PathBuf::from("/usr/lib64/libnvidia-ml.so.1")));
        assert!(!found.contains(&PathBuf::from(SONAME)));
    }
}
