//! The fake GPU of `cumux-cuda-driver`'s tests for other crates' tests: its
//! libcuda (`tests/fake_libcuda.c`) built with the system C compiler, the fat
//! binary of the fatbin fixtures that loads into it, and the `f32` buffers
//! its `scale` kernel works on.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fake libcuda built as `cumux-<tag>-fake-libcuda-<pid>.so` in the temp
/// folder (`quiet`: without its printf), or `None` without a C compiler.
pub fn fake_libcuda(tag: &str, quiet: bool) -> Option<PathBuf> {
    let source = crate::workspace_root().join("crates/cuda-driver/tests/fake_libcuda.c");
    let out = std::env::temp_dir().join(format!(
        "cumux-{tag}-fake-libcuda-{}.so",
        std::process::id()
    ));
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC"]);
    if quiet {
        cc.arg("-DFAKE_QUIET");
    }
    let built = cc
        .arg("-o")
        .arg(&out)
        .arg(source)
        .status()
        .is_ok_and(|s| s.success());
    built.then_some(out)
}

/// The fat binary `crates/fatbin/tests/fixtures/default.fatbin`: kernels
/// `add` and `scale(float *data, float factor, int n)` and a global `g_val`.
pub fn fixture_fatbin() -> Vec<u8> {
    let path = crate::workspace_root().join("crates/fatbin/tests/fixtures/default.fatbin");
    std::fs::read(path).expect("the fatbin fixture")
}

/// `values` as the device sees them (little-endian).
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The `f32`s of `bytes`.
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The parameter buffer of the fixture's `scale(data, factor, n)`.
pub fn scale_params(data: u64, factor: f32, n: i32) -> Vec<u8> {
    let mut params = data.to_le_bytes().to_vec();
    params.extend_from_slice(&factor.to_le_bytes());
    params.extend_from_slice(&n.to_le_bytes());
    params
}

/// The reports the fake's worker processes wrote of their own objects
/// (`REPORT.PID`, beside `report`, which `FAKE_LIVE_REPORT` names).
pub fn live_reports(report: &Path) -> Vec<(PathBuf, String)> {
    let prefix = format!(
        "{}.",
        report.file_name().unwrap_or_default().to_string_lossy()
    );
    let Some(dir) = report.parent() else {
        return Vec::new();
    };
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| {
                    let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                    (e.path(), text)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Removes `report` and every process's own report beside it.
pub fn remove_live_reports(report: &Path) {
    let _ = std::fs::remove_file(report);
    for (path, _) in live_reports(report) {
        let _ = std::fs::remove_file(path);
    }
}
