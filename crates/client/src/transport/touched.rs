//! The streams a connection has sent work for since its last context
//! synchronize: the streams such a synchronize polls before it waits.

use std::collections::HashSet;

use cumux_protocol::{Call, Handle};

/// Streams with work sent since they were last taken.
#[derive(Debug, Default)]
pub struct Touched {
    streams: HashSet<Handle>,
    /// The last stream noted: a run of work on one stream costs one insert.
    last: Option<Handle>,
}

impl Touched {
    /// Notes the stream `call` queues work on, if it does.
    pub fn note(&mut self, call: &Call) {
        let stream = match call {
            Call::Launch { stream, .. }
            | Call::EventRecord { stream, .. }
            | Call::StreamWaitEvent { stream, .. }
            | Call::GraphLaunch { stream, .. } => *stream,
            Call::MemcpyHtoD { stream, .. }
            | Call::MemcpyDtoH { stream, .. }
            | Call::MemcpyDtoD { stream, .. }
            | Call::Memset { stream, .. }
            | Call::MemcpyHtoDHost { stream, .. }
            | Call::MemcpyDtoHHost { stream, .. } => match stream {
                Some(stream) => *stream,
                None => return,
            },
            _ => return,
        };
        if self.last != Some(stream) {
            self.streams.insert(stream);
            self.last = Some(stream);
        }
    }

    /// The streams noted since the last take, forgotten here.
    pub fn take(&mut self) -> HashSet<Handle> {
        self.last = None;
        std::mem::take(&mut self.streams)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::test_calls::launch;

    #[test]
    fn streams_with_work_are_noted_until_taken() {
        let mut t = Touched::default();
        t.note(&launch(7));
        t.note(&launch(7));
        t.note(&Call::EventRecord {
            event: 3,
            stream: 9,
        });
        t.note(&Call::MemcpyDtoD {
            dst: 1,
            src: 2,
            bytes: 4,
            stream: None,
        });
        t.note(&Call::StreamQuery { stream: 11 });
        assert_eq!(t.take(), HashSet::from([7, 9]));
        assert!(t.take().is_empty());
        // After a take the same stream is noted again.
        t.note(&launch(9));
        assert_eq!(t.take(), HashSet::from([9]));
    }
}
