//! Helpers of the integration tests: the fake driver and the fat binary fixtures.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use cumux_cuda_driver::{Context, Driver, Stream};

/// Builds tests/fake_libcuda.c with `defines` as `<name>.so`, or `None` (and a
/// note) when no C compiler exists.
pub fn fake_driver(name: &str, defines: &[&str]) -> Option<PathBuf> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake_libcuda.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.so"));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&out)
        .arg(&src)
        .args(defines)
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        _ => {
            eprintln!("no C compiler: skipping the fake-driver checks");
            None
        }
    }
}

/// A fat binary of crates/fatbin/tests/fixtures (kernels `add`, `scale`).
#[allow(dead_code)]
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../fatbin/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(path).unwrap()
}

/// The fake driver built at `path`, initialised, and a new context on its
/// device 0 (the context keeps the driver alive).
#[allow(dead_code)]
pub fn fake_context(path: &Path) -> Arc<Context> {
    let driver = Arc::new(Driver::open(path.as_os_str()).unwrap());
    driver.init().unwrap();
    driver.create_context(driver.device(0).unwrap(), 0).unwrap()
}

/// The packed parameters of the fixtures' `scale(float *a, float s, int n)`.
#[allow(dead_code)]
pub fn scale_params(a: u64, s: f32, n: i32) -> Vec<u8> {
    let mut params = a.to_le_bytes().to_vec();
    params.extend_from_slice(&s.to_le_bytes());
    params.extend_from_slice(&n.to_le_bytes());
    params
}

/// `n` floats copied back from `dev` on `stream`.
#[allow(dead_code)]
pub fn read_f32s(stream: &Stream, dev: u64, n: usize) -> Vec<f32> {
    let mut back = vec![0u8; 4 * n];
    let (r, _) = stream.copy_dtoh_sync(&mut back, dev, None);
    r.unwrap();
    back.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
