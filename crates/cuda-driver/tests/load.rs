//! Loading the driver without a GPU: missing and non-CUDA libraries, cumux's
//! own client, a driver whose `cuInit` finds no device, and a fake one-GPU
//! driver (tests/fake_libcuda.c, built with the system C compiler when present).

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::Command;

use cumux_cuda_driver::{Driver, LoadError, REAL_LIBCUDA_ENV};

/// Builds the fake driver with `defines`, or `None` when no C compiler exists.
fn fake_driver(name: &str, defines: &[&str]) -> Option<PathBuf> {
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

#[test]
fn a_missing_library_is_a_clear_error() {
    let err = Driver::open(OsStr::new("/nonexistent/libcuda.so.1")).unwrap_err();
    assert!(matches!(err, LoadError::Open { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("/nonexistent/libcuda.so.1"), "{text}");
    assert!(
        text.starts_with("cannot load the NVIDIA driver library"),
        "{text}"
    );
}

#[test]
fn a_library_that_is_not_a_cuda_driver_is_refused() {
    let err = Driver::open(OsStr::new("libc.so.6")).unwrap_err();
    assert_eq!(
        err,
        LoadError::MissingSymbol {
            library: "libc.so.6".into(),
            symbol: "cuInit"
        }
    );
    assert!(err.to_string().contains("is not a CUDA driver library"));
}

#[test]
fn the_environment_variable_picks_the_library() {
    // The only test that touches the environment (tests run on threads).
    std::env::set_var(REAL_LIBCUDA_ENV, "/nonexistent/dir/libcuda.so.1");
    let err = Driver::load().unwrap_err();
    assert!(
        matches!(&err, LoadError::Open { library, .. } if library == "/nonexistent/dir/libcuda.so.1"),
        "{err:?}"
    );
    std::env::set_var(REAL_LIBCUDA_ENV, "/lib/x86_64-linux-gnu/libc.so.6");
    if std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6").exists() {
        let err = Driver::load().unwrap_err();
        assert!(
            matches!(
                err,
                LoadError::MissingSymbol {
                    symbol: "cuInit",
                    ..
                }
            ),
            "{err:?}"
        );
    }
    if let Some(path) = fake_driver("fake_no_device", &["-DFAKE_NO_DEVICE"]) {
        std::env::set_var(REAL_LIBCUDA_ENV, &path);
        match Driver::load().unwrap_err() {
            LoadError::Init { error, .. } => {
                assert_eq!(error.code, 100);
                assert_eq!(error.name, "CUDA_ERROR_NO_DEVICE");
                assert_eq!(error.call, "cuInit");
            }
            other => panic!("expected an init error, got {other:?}"),
        }
    }
    if let Some(path) = fake_driver("fake_ok", &[]) {
        std::env::set_var(REAL_LIBCUDA_ENV, &path);
        let driver = Driver::load().unwrap();
        assert_eq!(driver.library(), path.to_string_lossy());
        assert_eq!(driver.version().unwrap(), 13000);
    }
    std::env::remove_var(REAL_LIBCUDA_ENV);
}

#[test]
fn cumux_client_driver_is_refused() {
    let Some(path) = fake_driver("fake_cumux", &["-DFAKE_CUMUX"]) else {
        return;
    };
    let err = Driver::open(path.as_os_str()).unwrap_err();
    assert!(matches!(err, LoadError::CumuxClient { .. }), "{err:?}");
    assert!(err.to_string().contains("cumux's own client driver"));
}

#[test]
fn a_fake_gpu_is_described_through_the_driver() {
    let Some(path) = fake_driver("fake_gpu", &[]) else {
        return;
    };
    let driver = std::sync::Arc::new(Driver::open(path.as_os_str()).unwrap());
    driver.init().unwrap();
    assert_eq!(driver.device_count().unwrap(), 1);
    let dev = driver.device(0).unwrap();
    assert_eq!(driver.device_name(dev).unwrap(), "Fake GPU 80GB");
    assert_eq!(driver.device_uuid(dev).unwrap()[0], 0xa0);
    assert_eq!(driver.device_total_mem(dev).unwrap(), 80 << 30);
    assert_eq!(driver.device_sm(dev).unwrap(), 90);
    assert_eq!(driver.device_pci(dev).unwrap(), [500, 330, 340]);
    let attrs = driver.device_attributes(dev).unwrap();
    assert_eq!(attrs.len(), 147 - 3);
    assert!(attrs.iter().all(|(a, _)| !(92..=94).contains(a)));
    assert_eq!(attrs[0], (1, 10));
    let err = driver.device(3).unwrap_err();
    assert_eq!((err.code, err.name.as_str()), (101, "CUresult 101"));

    let ctx = driver.create_context(dev, 0).unwrap();
    let err = ctx.mem_alloc(1 << 40).unwrap_err();
    assert_eq!(err.code, 2);
    assert_eq!(err.to_string(), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2)");
    // The fake has no streams: a missing entry point is an error, not a crash.
    let err = cumux_cuda_driver::Stream::new(&ctx, 0, 0).err().unwrap();
    assert_eq!(err.code, 801);
    let err = cumux_cuda_driver::Module::load(&ctx, b"garbage", 90)
        .err()
        .unwrap();
    assert_eq!(err.code, 200);
}
