//! `cumux install`: a prefix with `cumux`, its driver and `libcuda.so.1`
//! links, and with `--system` the loader's entry; the installed `cumux run`
//! finds its driver, and a program that loads the linked `libcuda.so.1`
//! itself (as the loader's entry makes every program do) runs on cumux
//! without `cumux run`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{corpus_program, ensure_driver, wait_bounded, ServerProc, TempDir, CUMUX};

#[test]
fn an_installed_cumux_finds_its_driver_and_programs_find_cumux() {
    ensure_driver();
    let root = TempDir::new("install");
    let prefix = root.0.join("usr");
    let conf = root.0.join("etc/ld.so.conf.d");
    let out = Command::new(CUMUX)
        .args(["install", "--system", "--prefix"])
        .arg(&prefix)
        .arg("--ld-conf-dir")
        .arg(&conf)
        .env_remove("CUMUX_DRIVER")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let lib = prefix.join("lib/cumux");
    assert!(lib.join("libcumux_client.so").is_file());
    let target = std::fs::read_link(lib.join("libcuda.so.1")).unwrap();
    assert_eq!(target, Path::new("libcumux_client.so"));
    let nvml = std::fs::read_link(lib.join("libnvidia-ml.so.1")).unwrap();
    assert_eq!(nvml, Path::new("libcumux_nvml.so"));
    assert!(lib.join("libcumux_nvml.so").is_file());
    let entry = std::fs::read_to_string(conf.join("cumux.conf")).unwrap();
    assert!(entry.lines().any(|l| l == lib.to_str().unwrap()), "{entry}");

    let server = ServerProc::start("installed");
    let program = corpus_program("vector_add");
    // The installed cumux, on its own: its driver is in <prefix>/lib/cumux.
    let child = Command::new(prefix.join("bin/cumux"))
        .args(["run", "--server", &server.address, "--"])
        .arg(&program)
        .env_remove("CUMUX_DRIVER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, Duration::from_secs(120));
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    // Without cumux run: the program loads the linked libcuda.so.1 itself.
    let child = Command::new(&program)
        .env("LD_LIBRARY_PATH", &lib)
        .env("CUMUX_SERVER", &server.address)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_bounded(child, Duration::from_secs(120));
    assert_eq!(out.code(), Some(0), "{}", out.describe());
    let status = server.status_json();
    assert!(status["sessions"].as_array().is_some(), "{status}");
    assert!(
        server.log().contains("program=") && server.log().contains("vector_add"),
        "the server saw no session of the program:\n{}",
        server.log()
    );
}
