//! Fuzz target: the PTX parser must return Ok or Err, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = cumux_ptx::parse(text);
    }
});
