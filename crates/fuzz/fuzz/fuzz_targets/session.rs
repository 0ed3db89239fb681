//! Fuzz target `session` of crates/fuzz: a session's dispatch under an
//! arbitrary call sequence; no call panics and the server stays usable.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cumux_fuzz::targets::session::TARGET.check_once(data);
});
