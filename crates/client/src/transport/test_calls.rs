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
