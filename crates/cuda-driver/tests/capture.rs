//! The stdout capture behind device printf: what is written to fd 1 inside a
//! window (raw writes and C stdio alike) comes back to the window's caller, in
//! order, and windows do not mix even when large. (fd 1 stays a pipe until the
//! process exits, so the harness lines printed after the test may be lost.)

mod common;

use cumux_cuda_driver::capture::StdoutCapture;

fn raw_write(bytes: &[u8]) {
    // SAFETY: writes from a live slice to fd 1.
    let n = unsafe { libc::write(1, bytes.as_ptr().cast(), bytes.len()) };
    assert_eq!(n as usize, bytes.len());
}

#[test]
fn windows_capture_what_reaches_stdout() {
    let capture = StdoutCapture::install().unwrap();
    let (value, out) = capture.window(|| {
        raw_write(b"first line\n");
        // SAFETY: a NUL-terminated format with one int argument.
        unsafe { libc::printf(c"block %d: buffered by stdio\n".as_ptr(), 7) };
        42
    });
    assert_eq!(value, 42);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "first line\nblock 7: buffered by stdio\n"
    );

    let (_, empty) = capture.window(|| ());
    assert!(empty.is_empty());

    // More than a pipe holds: the reader drains while the window writes.
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let (_, out) = capture.window(|| raw_write(&big));
    assert_eq!(out, big);

    // Concurrent windows are serialised: each gets exactly its own text.
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let capture = StdoutCapture::install().unwrap();
                for i in 0..20 {
                    let text = format!("thread {t} round {i}\n");
                    let (_, out) = capture.window(|| raw_write(text.as_bytes()));
                    assert_eq!(String::from_utf8(out).unwrap(), text);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn device_printf_of_a_fake_driver_is_captured_at_the_stream_sync() {
    use cumux_cuda_driver::{LaunchConfig, Module, Stream};
    let Some(path) = common::fake_driver("fake_printf", &[]) else {
        return;
    };
    let capture = StdoutCapture::install().unwrap();
    let ctx = common::fake_context(&path);
    let stream = Stream::new(&ctx, 1, 0).unwrap();
    let module = Module::load(&ctx, &common::fixture("default.fatbin"), 90).unwrap();
    let scale = module.function("scale").unwrap().unwrap();
    let dev = ctx.mem_alloc(64).unwrap();
    let params = common::scale_params(dev, 1.0, 5);
    scale
        .launch(&stream, &LaunchConfig::linear(1, 8), &params, 16)
        .unwrap();
    // The fake prints through C stdio at the synchronize, fully buffered
    // because fd 1 is a pipe: the window's fflush must bring it out.
    let (result, out) = stream.finish(Some(capture));
    result.unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), "scale printed n=5\n");
    let (result, out) = stream.finish(Some(capture));
    result.unwrap();
    assert!(out.is_empty());
    ctx.mem_free(dev).unwrap();
}
