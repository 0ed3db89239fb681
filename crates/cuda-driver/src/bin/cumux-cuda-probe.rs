//! `cumux-cuda-probe`: checks the driver layer on a real GPU without the server.
//! Loads the system driver, describes every GPU, then on GPU 0 runs corpus
//! kernels (vector add, device printf under capture, a fault in one context
//! while another goes on) and times the basics. Exit status 1 on any failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cumux_cuda_driver::capture::StdoutCapture;
use cumux_cuda_driver::image::params_bytes;
use cumux_cuda_driver::sys::CU_STREAM_NON_BLOCKING;
use cumux_cuda_driver::{
    Context, CudaError, DeviceId, Driver, Function, LaunchConfig, MemsetValue, Module, Stream,
};

const VECTOR_ADD: &[u8] = include_bytes!("../../tests/fixtures/vector_add.fatbin");
const PRINTF: &[u8] = include_bytes!("../../tests/fixtures/printf_kernel.fatbin");
const OUT_OF_BOUNDS: &[u8] = include_bytes!("../../tests/fixtures/out_of_bounds.fatbin");

/// Results are written to stderr: stdout is captured by the printf check.
macro_rules! report {
    ($($arg:tt)*) => { eprintln!($($arg)*) };
}

fn main() {
    let driver = match Driver::load() {
        Ok(d) => d,
        Err(e) => {
            report!("FAIL load: {e}");
            std::process::exit(1);
        }
    };
    report!(
        "driver: {} (file {}), CUDA {}",
        driver.library(),
        driver
            .library_file()
            .map_or_else(|| "?".into(), |p| p.display().to_string()),
        driver.version().unwrap_or(0)
    );
    let mut failures = 0;
    let mut check = |name: &str, result: Result<String, CudaError>| match result {
        Ok(detail) => report!("ok   {name}: {detail}"),
        Err(e) => {
            failures += 1;
            report!("FAIL {name}: {e}");
        }
    };
    let count = driver.device_count().unwrap_or(0);
    for ordinal in 0..count {
        check(&format!("gpu {ordinal}"), describe(&driver, ordinal));
    }
    if count == 0 {
        report!("FAIL no GPU");
        std::process::exit(1);
    }
    let dev = match driver.device(0) {
        Ok(d) => d,
        Err(e) => {
            report!("FAIL device 0: {e}");
            std::process::exit(1);
        }
    };
    let sm = driver.device_sm(dev).unwrap_or(0);
    let started = Instant::now();
    let ctx = match driver.create_context(dev, 0) {
        Ok(c) => c,
        Err(e) => {
            report!("FAIL context: {e}");
            std::process::exit(1);
        }
    };
    check("context", Ok(format!("created in {:?}", started.elapsed())));
    check("vector_add", vector_add(&ctx, sm));
    check("printf capture", printf_capture(&ctx, sm));
    // Last: a fault may poison every context of this process (it does on
    // driver 580), which is why cumux keeps each context in a worker.
    check("latency", latency(&ctx, sm));
    check("fault isolation", fault_isolation(&driver, dev, &ctx, sm));
    if failures > 0 {
        std::process::exit(1);
    }
}

fn describe(driver: &Arc<Driver>, ordinal: u32) -> Result<String, CudaError> {
    let dev = driver.device(ordinal)?;
    Ok(format!(
        "{} sm_{} {} MiB, {} attributes, pci {:?}",
        driver.device_name(dev)?,
        driver.device_sm(dev)?,
        driver.device_total_mem(dev)? >> 20,
        driver.device_attributes(dev)?.len(),
        driver.device_pci(dev)?
    ))
}

fn kernel(module: &Module, name: &str) -> Result<Function, CudaError> {
    module.function(name)?.ok_or_else(|| {
        CudaError::new(500, "CUDA_ERROR_NOT_FOUND", "cuModuleGetFunction").with_detail(name)
    })
}

fn vector_add(ctx: &Arc<Context>, sm: u32) -> Result<String, CudaError> {
    let stream = Stream::new(ctx, CU_STREAM_NON_BLOCKING, 0)?;
    let started = Instant::now();
    let module = Module::load(ctx, VECTOR_ADD, sm)?;
    let load_time = started.elapsed();
    let functions = module.functions()?;
    let names: Vec<String> = functions.iter().filter_map(|f| f.name().ok()).collect();
    let f = kernel(&module, "_Z10vector_addPKfS0_Pfi")?;
    let layout = f.param_layout()?;
    let n = 1000usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 2.0 * i as f32).collect();
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let size = (n * 4) as u64;
    let (da, db, dc) = (
        ctx.mem_alloc(size)?,
        ctx.mem_alloc(size)?,
        ctx.mem_alloc(size)?,
    );
    stream.copy_htod_sync(da, &bytes(&a), None).0?;
    stream.copy_htod_sync(db, &bytes(&b), None).0?;
    let mut params = Vec::new();
    for p in [da, db, dc] {
        params.extend_from_slice(&p.to_le_bytes());
    }
    params.extend_from_slice(&(n as i32).to_le_bytes());
    f.launch(
        &stream,
        &LaunchConfig::linear(4, 256),
        &params,
        params_bytes(&layout),
    )?;
    let mut out = vec![0u8; n * 4];
    stream.copy_dtoh_sync(&mut out, dc, None).0?;
    for p in [da, db, dc] {
        ctx.mem_free(p)?;
    }
    let wrong = out
        .chunks(4)
        .enumerate()
        .filter(|(i, c)| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) != 3.0 * *i as f32)
        .count();
    if wrong > 0 {
        return Err(CudaError::new(0, "WRONG RESULT", "vector_add")
            .with_detail(format!("{wrong} of {n} elements wrong")));
    }
    Ok(format!(
        "{} from a {:?} image, loaded in {load_time:?}, functions {names:?}, params {layout:?}",
        module.code(),
        module.kind()
    ))
}

fn printf_capture(ctx: &Arc<Context>, sm: u32) -> Result<String, CudaError> {
    let capture = StdoutCapture::install()
        .map_err(|e| CudaError::new(0, "NO CAPTURE", "StdoutCapture::install").with_detail(e))?;
    let stream = Stream::new(ctx, CU_STREAM_NON_BLOCKING, 0)?;
    let module = Module::load(ctx, PRINTF, sm)?;
    let f = kernel(&module, "_Z13printf_kernelif")?;
    let layout = f.param_layout()?;
    let mut params = 7i32.to_le_bytes().to_vec();
    params.extend_from_slice(&1.25f32.to_le_bytes());
    let (launched, before) = capture.window(|| {
        f.launch(
            &stream,
            &LaunchConfig::linear(2, 32),
            &params,
            params_bytes(&layout),
        )
    });
    launched?;
    let (synced, out) = stream.finish(Some(capture));
    synced?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let want = "block 0: int=7 float=1.250 str=first char=A big=1099511627776";
    if !text.contains(want) || !before.is_empty() {
        return Err(
            CudaError::new(0, "NOT CAPTURED", "printf").with_detail(format!(
                "at the launch {:?}, at the sync {text:?}",
                String::from_utf8_lossy(&before)
            )),
        );
    }
    Ok(format!(
        "{} lines captured at the stream sync",
        text.lines().count()
    ))
}

fn fault_isolation(
    driver: &Arc<Driver>,
    dev: DeviceId,
    healthy: &Arc<Context>,
    sm: u32,
) -> Result<String, CudaError> {
    let victim = driver.create_context(dev, 0)?;
    let stream = Stream::new(&victim, CU_STREAM_NON_BLOCKING, 0)?;
    let module = Module::load(&victim, OUT_OF_BOUNDS, sm)?;
    let f = kernel(&module, "_Z13out_of_boundsPiy")?;
    let data = victim.mem_alloc(1024)?;
    let mut params = data.to_le_bytes().to_vec();
    params.extend_from_slice(&(1u64 << 40).to_le_bytes());
    f.launch(&stream, &LaunchConfig::linear(1, 32), &params, 16)?;
    let fault = stream.synchronize();
    let code = fault.as_ref().err().map(|e| e.code);
    if code != Some(700) {
        return Err(CudaError::new(0, "NO FAULT", "out_of_bounds")
            .with_detail(format!("the sync returned {fault:?}, not 700")));
    }
    let sticky = victim.memset(data, MemsetValue::D8(0), 4).is_err();
    drop((f, module, stream));
    drop(victim);
    // Whether another context of this process goes on: a finding about the
    // driver, reported either way.
    let other = (|| -> Result<bool, CudaError> {
        let stream = Stream::new(healthy, CU_STREAM_NON_BLOCKING, 0)?;
        let p = healthy.mem_alloc(16)?;
        stream.memset_d32(p, 0x1234_5678, 4)?;
        let mut back = [0u8; 16];
        stream.copy_dtoh_sync(&mut back, p, None).0?;
        healthy.mem_free(p)?;
        Ok(back[..4] == 0x1234_5678u32.to_le_bytes())
    })();
    let others = match other {
        Ok(true) => "another context of this process unaffected".to_string(),
        Ok(false) => "another context of this process computes wrong results".to_string(),
        Err(e) => format!(
            "another context of this process fails too ({e}): contexts need processes of their own"
        ),
    };
    Ok(format!(
        "700 in its own context (sticky: {sticky}); {others}"
    ))
}

fn latency(ctx: &Arc<Context>, sm: u32) -> Result<String, CudaError> {
    let stream = Stream::new(ctx, CU_STREAM_NON_BLOCKING, 0)?;
    let module = Module::load(ctx, VECTOR_ADD, sm)?;
    let f = kernel(&module, "_Z10vector_addPKfS0_Pfi")?;
    let bytes = params_bytes(&f.param_layout()?);
    // n = 0: the kernel does nothing; pointers are never touched.
    let params = vec![0u8; bytes];
    let capture = StdoutCapture::install().ok();
    let measure = |with_capture: bool| -> Result<(Duration, Duration), CudaError> {
        let mut samples = Vec::with_capacity(2000);
        for _ in 0..2000 {
            let t = Instant::now();
            f.launch(&stream, &LaunchConfig::linear(1, 32), &params, bytes)?;
            let (r, _) = stream.finish(if with_capture { capture } else { None });
            r?;
            samples.push(t.elapsed());
        }
        samples.sort();
        Ok((
            samples[samples.len() / 2],
            samples[samples.len() * 99 / 100],
        ))
    };
    let (p50, p99) = measure(false)?;
    let (c50, c99) = measure(true)?;
    Ok(format!(
        "launch+sync p50 {p50:?} p99 {p99:?}; with a capture window p50 {c50:?} p99 {c99:?}"
    ))
}
