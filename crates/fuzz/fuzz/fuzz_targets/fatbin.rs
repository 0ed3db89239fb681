//! Fuzz target `fatbin` of crates/fuzz: fat binaries and the server's reading
//! of module images: a value or an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cumux_fuzz::targets::fatbin::TARGET.check_once(data);
});
