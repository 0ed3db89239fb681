//! Fuzz target: parse, load and launch every kernel of arbitrary PTX under an
//! instruction budget; nothing may panic or hang (the `ptx_run` target of
//! crates/fuzz).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cumux_fuzz::targets::ptx::RUN.check_once(data);
});
