//! Fuzzes everything the server decodes from a client: frames, hellos and
//! requests (the `wire` target of crates/fuzz). Any input must give a value or
//! an error, never a panic; a decoded request must encode again and decode to
//! itself.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cumux_fuzz::targets::wire::TARGET.check_once(data);
});
