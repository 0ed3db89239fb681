//! Fuzzes the shared-memory ring as the server reads it (the `shm` target of
//! crates/fuzz): whatever a client writes into its area, the server's end
//! answers with a message or an error.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cumux_fuzz::targets::shm::TARGET.check_once(data);
});
