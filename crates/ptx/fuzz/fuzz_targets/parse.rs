//! Fuzz target: the PTX parser must return Ok or Err, never panic (the
//! `ptx_parse` target of crates/fuzz).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cumux_fuzz::targets::ptx::PARSE.check_once(data);
});
