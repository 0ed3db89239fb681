//! Calls the transport's unit tests send through their bookkeeping
//! (`quiet`, `touched`).

use cumux_protocol::{Call, Handle};

/// A launch of function 1 on `stream`, one thread, no parameters.
pub fn launch(stream: Handle) -> Call {
    Call::Launch {
        function: 1,
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 0,
        stream,
        params: Vec::new(),
        attributes: Vec::new(),
    }
}

/// A 4-byte memset of 0x100 on `stream` (`None`: synchronous).
pub fn memset(stream: Option<Handle>) -> Call {
    Call::Memset {
        dst: 0x100,
        value: 0,
        elem_bytes: 1,
        count: 4,
        pitch: 4,
        height: 1,
        stream,
    }
}
