//! What a connection knows without asking: the streams with no work left on
//! the device, and the events already reached, from the calls it sent and answers it got.

use std::collections::{HashMap, HashSet};

use cumux_protocol::{Call, Handle, DEFAULT_STREAM};

/// A connection's streams that may have work outstanding, and its events
/// known to be reached. A stream is idle once a call that waits for all of
/// its work was answered without error (its synchronize, a query that found
/// it idle, a copy to the host in its order, a context synchronize) and no
/// work went to it since. An event recorded on an idle stream is reached
/// when it is recorded. Asked before a synchronize or a query, these answer
/// it here, exactly: over a network each is a round trip saved.
#[derive(Debug, Default)]
pub struct Quiet {
    /// Streams that may have work outstanding. The default stream is busy
    /// whenever any stream is (the legacy stream waits for the others).
    busy: HashSet<Handle>,
    reached: HashSet<Handle>,
    /// Calls sent and not answered yet whose success makes something idle or reached.
    waiting: HashMap<u64, Settles>,
}

/// What the answer of a waiting call settles.
#[derive(Debug, Clone, Copy)]
enum Settles {
    Stream(Handle),
    Event(Handle),
    Context,
}

impl Quiet {
    /// Notes call `seq` as it is sent.
    pub fn sent(&mut self, seq: u64, call: &Call) {
        match *call {
            Call::EventRecord { event, stream } => {
                self.waiting
                    .retain(|_, s| !matches!(s, Settles::Event(e) if *e == event));
                match self.busy.contains(&stream) {
                    true => self.reached.remove(&event),
                    false => self.reached.insert(event),
                };
            }
            Call::StreamWaitEvent { stream, event } if !self.reached.contains(&event) => {
                self.work(stream)
            }
            Call::StreamWaitEvent { .. } => {}
            Call::Launch { stream, .. } | Call::GraphLaunch { stream, .. } => self.work(stream),
            Call::MemcpyHtoD { stream, .. }
            | Call::MemcpyDtoD { stream, .. }
            | Call::Memset { stream, .. }
            | Call::MemcpyHtoDHost { stream, .. }
            | Call::MemcpyDtoHHost { stream, .. } => self.work(stream.unwrap_or(DEFAULT_STREAM)),
            // Read in the stream's order and answered once read.
            Call::MemcpyDtoH { stream, .. } => {
                self.settles(seq, Settles::Stream(stream.unwrap_or(DEFAULT_STREAM)))
            }
            Call::StreamSynchronize { stream } | Call::StreamQuery { stream } => {
                self.settles(seq, Settles::Stream(stream))
            }
            Call::EventSynchronize { event } | Call::EventQuery { event } => {
                self.settles(seq, Settles::Event(event))
            }
            Call::ContextSynchronize => self.settles(seq, Settles::Context),
            Call::QueryWithin { ref query, .. } => self.sent(seq, query),
            Call::StreamDestroy { stream } => {
                self.busy.remove(&stream);
            }
            Call::EventDestroy { event } => {
                self.reached.remove(&event);
            }
            // Anything else that may queue device work without naming a
            // stream (a graph's nodes, a module's initializers) is left to
            // the calls above: none of them makes a stream idle.
            _ => {}
        }
    }

    /// Notes the answer to call `seq`: `ok` when it succeeded (a query that
    /// found work left did not).
    pub fn answered(&mut self, seq: u64, ok: bool) {
        let Some(settles) = self.waiting.remove(&seq) else {
            return;
        };
        if !ok {
            return;
        }
        match settles {
            Settles::Stream(stream) => {
                self.busy.remove(&stream);
            }
            Settles::Event(event) => {
                self.reached.insert(event);
            }
            Settles::Context => self.busy.clear(),
        }
    }

    /// Whether `stream` has no work left on the device.
    pub fn idle(&self, stream: Handle) -> bool {
        !self.busy.contains(&stream)
    }

    /// Whether `event` is known to be reached.
    pub fn reached(&self, event: Handle) -> bool {
        self.reached.contains(&event)
    }

    fn work(&mut self, stream: Handle) {
        self.busy.insert(stream);
        self.busy.insert(DEFAULT_STREAM);
        // A waiting call sent before this work cannot vouch for it.
        self.waiting.retain(|_, s| match s {
            Settles::Stream(s) => *s != stream && *s != DEFAULT_STREAM,
            Settles::Event(_) => true,
            Settles::Context => false,
        });
    }

    fn settles(&mut self, seq: u64, what: Settles) {
        self.waiting.insert(seq, what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::test_calls::launch;

    #[test]
    fn a_stream_is_idle_once_a_wait_for_all_its_work_succeeded() {
        let mut q = Quiet::default();
        assert!(q.idle(5), "a stream with no work");
        q.sent(1, &launch(5));
        assert!(!q.idle(5) && !q.idle(DEFAULT_STREAM) && q.idle(6));
        q.sent(2, &Call::StreamQuery { stream: 5 });
        q.answered(2, false);
        assert!(!q.idle(5), "a query that found work");
        q.sent(3, &Call::StreamSynchronize { stream: 5 });
        q.answered(3, true);
        assert!(q.idle(5));
        assert!(
            !q.idle(DEFAULT_STREAM),
            "the legacy stream waits for the others"
        );
        q.sent(4, &Call::ContextSynchronize);
        q.answered(4, true);
        assert!(q.idle(DEFAULT_STREAM));
    }

    #[test]
    fn a_copy_to_the_host_in_stream_order_settles_its_stream() {
        let mut q = Quiet::default();
        q.sent(1, &launch(0));
        q.sent(
            2,
            &Call::MemcpyDtoH {
                src: 0x100,
                bytes: 4,
                stream: None,
            },
        );
        assert!(!q.idle(0));
        q.answered(2, true);
        assert!(q.idle(0));
    }

    #[test]
    fn work_sent_before_an_answer_keeps_its_stream_busy() {
        // Calls of other threads may go out between a wait and its answer
        // (a socket's chunked copies): the answer vouches only for before.
        let mut q = Quiet::default();
        q.sent(1, &launch(3));
        q.sent(2, &Call::StreamSynchronize { stream: 3 });
        q.sent(3, &launch(3));
        q.answered(2, true);
        assert!(!q.idle(3));
    }

    #[test]
    fn an_event_recorded_on_an_idle_stream_is_reached() {
        let mut q = Quiet::default();
        q.sent(
            1,
            &Call::EventRecord {
                event: 9,
                stream: 4,
            },
        );
        assert!(q.reached(9));
        q.sent(2, &launch(4));
        q.sent(
            3,
            &Call::EventRecord {
                event: 9,
                stream: 4,
            },
        );
        assert!(!q.reached(9), "recorded again behind work");
        // Waiting on a reached event adds no work; on another one it does.
        q.sent(4, &Call::StreamSynchronize { stream: 4 });
        q.answered(4, true);
        q.sent(5, &Call::EventQuery { event: 9 });
        q.answered(5, true);
        q.sent(
            6,
            &Call::StreamWaitEvent {
                stream: 4,
                event: 9,
            },
        );
        assert!(q.idle(4));
        q.sent(
            7,
            &Call::StreamWaitEvent {
                stream: 4,
                event: 8,
            },
        );
        assert!(!q.idle(4));
    }
}
