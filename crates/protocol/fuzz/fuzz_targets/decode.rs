//! Fuzzes everything the server decodes from a client: frames, hellos and
//! requests. Any input must give a value or an error, never a panic; a decoded
//! request must encode again and decode to itself.

#![no_main]

use cumux_protocol::{decode, encode, read_frame, Hello, Request};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode::<Hello>(data);
    let _ = decode::<(u32, u32)>(data);
    if let Ok(request) = decode::<Request>(data) {
        let again = encode(&request).expect("a decoded request encodes");
        assert_eq!(decode::<Request>(&again).expect("and decodes back"), request);
        let _ = request.call.is_fire_and_forget();
    }
    // The same bytes as a stream of frames.
    let mut stream = data;
    let mut buf = Vec::new();
    while read_frame(&mut stream, &mut buf).is_ok() {
        let _ = decode::<Request>(&buf);
    }
});
