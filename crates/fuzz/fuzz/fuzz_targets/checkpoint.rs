//! Fuzz target `checkpoint` of crates/fuzz: checkpoint streams, any bytes
//! and valid ones changed: refused or read back exactly, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cumux_fuzz::targets::checkpoint::TARGET.check_once(data);
});
