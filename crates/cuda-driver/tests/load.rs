//! Loading the driver without a GPU: missing and non-CUDA libraries, cumux's
//! own client, a driver whose `cuInit` finds no device, and a fake one-GPU
//! driver (tests/fake_libcuda.c, built with the system C compiler when present).

mod common;

use std::ffi::OsStr;

use common::{fake_context, fake_driver, fixture, read_f32s, scale_params};

use cumux_cuda_driver::{Driver, LoadError, REAL_LIBCUDA_ENV};

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
    let err = cumux_cuda_driver::Module::load(&ctx, b"garbage", 90)
        .err()
        .unwrap();
    assert_eq!(err.code, 200);
}

#[test]
fn a_kernel_of_the_fake_gpu_gets_its_packed_parameters() {
    use cumux_cuda_driver::{CodeChoice, LaunchConfig, Module, Stream};
    let Some(path) = fake_driver("fake_kernels", &[]) else {
        return;
    };
    let ctx = fake_context(&path);
    let stream = Stream::new(&ctx, 1, 0).unwrap();

    let module = Module::load(&ctx, &fixture("default.fatbin"), 90).unwrap();
    assert_eq!(module.code(), CodeChoice::PtxJit { sm: 75 });
    let functions = module.functions().unwrap();
    let names: Vec<String> = functions.iter().map(|f| f.name().unwrap()).collect();
    assert_eq!(names, ["add", "scale"]);
    let scale = &functions[1];
    let layout = scale.param_layout().unwrap();
    assert_eq!(layout, [(0, 8), (8, 4), (12, 4)]);
    assert_eq!(scale.attributes().unwrap().max_threads_per_block, 1024);
    assert!(module.function("nope").unwrap().is_none());
    let ptx = b".version 9.0\n.target sm_75\n.address_size 64\n.visible .entry k()\n{\n ret;\n}\n";
    let err = Module::load(&ctx, ptx, 90).err().unwrap();
    assert_eq!((err.code, err.name.as_str()), (218, "CUresult 218"));
    assert_eq!(err.detail, "ptxas fatal : fake syntax error");
    let globals = module.globals();
    assert_eq!(globals.len(), 1);
    assert_eq!((globals[0].0.as_str(), globals[0].2), ("g_val", 16));

    let data: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0];
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    let dev = ctx.mem_alloc(bytes.len() as u64).unwrap();
    let (r, _) = stream.copy_htod_sync(dev, &bytes, None);
    r.unwrap();
    // scale(a, s = 2.0, n = 3): a[i] *= s + g_val[0] (g_val[0] is 1).
    let params = scale_params(dev, 2.0, 3);
    let config = LaunchConfig::linear(1, 32);
    scale.launch(&stream, &config, &params, 16).unwrap();
    assert_eq!(read_f32s(&stream, dev, 4), [3.0, 6.0, 9.0, 4.0]);
    // add(a, a, b, 4) with the 28-byte layout: the fake wants 32 bytes, which
    // the retry with the size rounded up to 8 gives it.
    let add = &functions[0];
    assert_eq!(
        cumux_cuda_driver::image::params_bytes(&add.param_layout().unwrap()),
        28
    );
    let b = ctx.mem_alloc(16).unwrap();
    let mut add_params = Vec::new();
    for p in [dev, dev, b] {
        add_params.extend_from_slice(&p.to_le_bytes());
    }
    add_params.extend_from_slice(&4i32.to_le_bytes());
    add.launch(&stream, &config, &add_params, 28).unwrap();
    assert_eq!(read_f32s(&stream, b, 4), [6.0, 12.0, 18.0, 8.0]);
    // A bad launch still fails after the retry, with the first error.
    let err = add.launch(&stream, &config, &add_params, 20).unwrap_err();
    assert_eq!(err.code, 1);
    // A short parameter buffer is padded to the layout's size, not overread.
    scale.launch(&stream, &config, &params[..8], 16).unwrap();
    stream.memset_d32(dev, 0x3f80_0000, 4).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(ctx.mem_info().unwrap(), (70 << 30, 80 << 30));
    ctx.mem_free(dev).unwrap();
}

#[test]
fn host_memory_is_registered_with_the_driver_while_its_registration_lives() {
    use cumux_cuda_driver::{HostRegistration, Stream};
    let Some(path) = fake_driver("fake_host_register", &[]) else {
        return;
    };
    let ctx = fake_context(&path);
    let mut host = vec![7u8; 4096];
    // SAFETY: `host` outlives the registration, dropped below.
    let pinned = unsafe { HostRegistration::new(&ctx, host.as_mut_ptr(), host.len(), 0) }.unwrap();
    let stream = Stream::new(&ctx, 1, 0).unwrap();
    let dev = ctx.mem_alloc(4096).unwrap();
    // SAFETY: `host` stays alive and untouched until the stream is synchronized.
    unsafe { stream.copy_htod_async(dev, &host) }.unwrap();
    stream.synchronize().unwrap();
    let mut back = vec![0u8; 4096];
    let (r, _) = stream.copy_dtoh_sync(&mut back, dev, None);
    r.unwrap();
    assert_eq!(back, host);
    drop(pinned);
    // The driver refuses an empty range, and says so.
    // SAFETY: nothing is registered.
    let err = unsafe { HostRegistration::new(&ctx, host.as_mut_ptr(), 0, 0) }
        .err()
        .unwrap();
    assert_eq!(err.code, 1);
    ctx.mem_free(dev).unwrap();
}

#[test]
fn cumux_client_behind_a_libcuda_link_is_refused() {
    let Some(path) = fake_driver("libcumux_client_lookalike", &[]) else {
        return;
    };
    let dir = path.with_file_name("cumux-run-link");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libcuda.so.1");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let err = Driver::open(link.as_os_str()).unwrap_err();
    assert!(matches!(err, LoadError::CumuxClient { .. }), "{err:?}");
}
