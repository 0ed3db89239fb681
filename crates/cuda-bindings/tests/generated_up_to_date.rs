//! Reruns `gen/generate.py` against the CUDA headers in `.venv` and fails if
//! what it writes differs from what is checked in (the bindings here and the
//! client's symbol list). Skipped, saying so, only where the headers are missing
//! (`scripts/setup-nvcc` installs them; CI has them).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files the generator writes, relative to the repository root.
const OUTPUTS: &[&str] = &[
    "crates/cuda-bindings/src/types.rs",
    "crates/cuda-bindings/src/pfn.rs",
    "crates/cuda-bindings/src/consts.rs",
    "crates/cuda-bindings/src/errors.rs",
    "crates/cuda-bindings/src/entry_points.rs",
    "crates/client/src/generated/symbols.rs",
    "docs/driver-calls.md",
];

/// The header directories the generator reads by default.
const HEADERS: &[&str] = &[
    ".venv/lib/python3.11/site-packages/nvidia/cu13/include/cudaTypedefs.h",
    ".venv/cuda135/nvidia/cu13/include/cudaTypedefs.h",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn checked_in_bindings_match_the_headers() {
    let root = repo_root();
    let missing: Vec<&str> = HEADERS
        .iter()
        .copied()
        .filter(|h| !root.join(h).exists())
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "SKIPPED: the CUDA headers are not installed ({}); run scripts/setup-nvcc to check the generated bindings",
            missing.join(", ")
        );
        return;
    }
    let out = std::env::temp_dir().join(format!("cumux-bindings-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let status = Command::new("python3")
        .arg(root.join("crates/cuda-bindings/gen/generate.py"))
        .arg("--out")
        .arg(&out)
        .status()
        .expect("python3 runs the generator");
    assert!(status.success(), "gen/generate.py failed");
    let stale: Vec<&str> = OUTPUTS
        .iter()
        .copied()
        .filter(|rel| {
            let fresh = std::fs::read_to_string(out.join(rel)).unwrap_or_default();
            let checked_in = std::fs::read_to_string(root.join(rel)).unwrap_or_default();
            fresh.is_empty() || fresh != checked_in
        })
        .collect();
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        stale.is_empty(),
        "generated files differ from the headers' output: {stale:?}; \
         rerun `python3 crates/cuda-bindings/gen/generate.py` and commit"
    );
}
