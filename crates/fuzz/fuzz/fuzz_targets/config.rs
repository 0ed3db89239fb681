//! Fuzz target `config` of crates/fuzz: the server's config file: settings or
//! an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cumux_fuzz::targets::config::TARGET.check_once(data);
});
