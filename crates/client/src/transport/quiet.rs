//! What a connection knows without asking: the streams with no work left on
//! the device, and the events already reached, from the calls it sent and answers it got.

use std::collections::{HashMap, HashSet};

use cumux_protocol::{Call, Handle, DEFAULT_STREAM};

/// `CU_STREAM_NON_BLOCKING`.
const NON_BLOCKING: u32 = 0x1;

/// A connection's streams that may have work outstanding, and its events
/// known to be reached. A stream is idle once a call that waits for all of
/// its work was answered without error (its synchronize, a query that found
/// it idle, a copy to the host in its order, a context synchronize) and no
/// work went to it since. An event recorded on an idle stream is reached
/// when it is recorded. Asked before a synchronize or a query, these answer
/// it here, exactly: over a network each is a round trip saved.
#[derive(Debug, Default)]
pub struct Quiet {
    /// Streams that may have work outstanding. The default stream counts
    /// as busy whenever a blocking stream is (the legacy stream waits for
    /// those), so it is idle only when nothing else here is blocking.
    busy: HashSet<Handle>,
    /// Streams made with `CU_STREAM_NON_BLOCKING`, which the legacy default
    /// stream neither waits for nor makes wait (PyTorch's side streams).
    nonblocking: HashSet<Handle>,
    reached: HashSet<Handle>,
    /// Busy streams whose work since they were last idle is plain: copies to
    /// the device whose bytes their calls carried, memsets and copies within
    /// the device, all on memory the client knows: waiting for that work
    /// depends on nothing the program does later, so the server may do it
    /// in the calls' order while the program goes on (`Call::Settle`,
    /// [`Quiet::settleable`]).
    plain_only: HashSet<Handle>,
    /// Streams given such work on memory the client could not check, until
    /// they are idle again: their waits are never settled so.
    unchecked: HashSet<Handle>,
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
                // On a blocking stream the record also waits for the
                // default stream's work before it.
                // A record behind work is work of its stream.
                let behind_default =
                    !self.nonblocking.contains(&stream) && self.busy.contains(&DEFAULT_STREAM);
                match self.idle(stream) && !behind_default {
                    true => {
                        self.reached.insert(event);
                    }
                    false => {
                        self.reached.remove(&event);
                        self.work(stream);
                    }
                }
            }
            Call::StreamWaitEvent { stream, event } if !self.reached.contains(&event) => {
                self.work(stream)
            }
            Call::StreamWaitEvent { .. } => {}
            Call::Launch { stream, .. } | Call::GraphLaunch { stream, .. } => self.work(stream),
            Call::MemcpyHtoD {
                stream: Some(stream),
                ..
            }
            | Call::Memset {
                stream: Some(stream),
                ..
            }
            | Call::MemcpyDtoD {
                stream: Some(stream),
                ..
            } => self.plain_work(stream),
            Call::Settle {
                stream: Some(stream),
            } => self.quieted(stream),
            Call::Settle { stream: None } => self.all_quieted(),
            Call::MemcpyHtoD { stream, .. }
            | Call::MemcpyDtoD { stream, .. }
            | Call::Memset { stream, .. }
            | Call::MemcpyHtoDHost { stream, .. }
            | Call::MemcpyDtoHHost { stream, .. } => match stream {
                Some(stream) => self.work(stream),
                // Synchronous: answered once done, in the default stream's order.
                None => {
                    self.work(DEFAULT_STREAM);
                    self.settles(seq, Settles::Stream(DEFAULT_STREAM));
                }
            },
            // Read in the stream's order and answered once read.
            Call::MemcpyDtoH { stream, .. } => {
                self.settles(seq, Settles::Stream(stream.unwrap_or(DEFAULT_STREAM)))
            }
            // Seen stored (`Link::mark_seen`), it settles as an answer does.
            Call::Mark {
                event: None,
                stream,
                ..
            }
            | Call::StreamSynchronize { stream }
            | Call::StreamQuery { stream } => self.settles(seq, Settles::Stream(stream)),
            Call::EventSynchronize { event } | Call::EventQuery { event } => {
                self.settles(seq, Settles::Event(event))
            }
            Call::ContextSynchronize => self.settles(seq, Settles::Context),
            Call::QueryWithin { ref query, .. } => self.sent(seq, query),
            Call::NewStream { handle, flags, .. } if flags & NON_BLOCKING != 0 => {
                self.nonblocking.insert(handle);
            }
            Call::StreamDestroy { stream } => {
                self.quieted(stream);
                self.nonblocking.remove(&stream);
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
            Settles::Stream(stream) => self.quieted(stream),
            Settles::Event(event) => {
                self.reached.insert(event);
            }
            Settles::Context => self.all_quieted(),
        }
    }

    /// Whether `stream` has no work left on the device.
    pub fn idle(&self, stream: Handle) -> bool {
        match stream {
            // Its own work and that of every blocking stream (a stream whose
            // flags the connection never saw counts as blocking).
            DEFAULT_STREAM => self.busy.iter().all(|s| self.nonblocking.contains(s)),
            _ => !self.busy.contains(&stream),
        }
    }

    /// The streams that may have work left.
    pub fn busy(&self) -> Vec<Handle> {
        self.busy.iter().copied().collect()
    }

    /// Whether no stream of the connection may have work left.
    pub fn all_idle(&self) -> bool {
        self.busy.is_empty()
    }

    /// Whether `event` is known to be reached.
    pub fn reached(&self, event: Handle) -> bool {
        self.reached.contains(&event)
    }

    /// Whether a synchronize of `stream` (of the context with `None`) may be
    /// settled: answered here, the server waiting for the work in the calls'
    /// order (`Call::Settle`). It may when the stream has work and all the
    /// work it waits for is [`Quiet::plain_only`]: on a blocking stream
    /// (the default one too) that of every busy blocking stream, which the
    /// legacy default stream orders it behind; for the context, every
    /// stream's.
    pub fn settleable(&self, stream: Option<Handle>) -> bool {
        let copies = |s: &Handle| self.plain_only.contains(s);
        match stream {
            None => !self.busy.is_empty() && self.busy.iter().all(copies),
            Some(s) if self.nonblocking.contains(&s) => copies(&s),
            Some(s) => !self.idle(s) && self.blocking_work_plain(),
        }
    }

    /// Whether every busy blocking stream (the default one among them) has
    /// [`Quiet::plain_only`] work.
    fn blocking_work_plain(&self) -> bool {
        self.busy
            .iter()
            .filter(|b| !self.nonblocking.contains(b))
            .all(|b| self.plain_only.contains(b))
    }

    /// Whether a copy in on the default stream, sent now, could be settled
    /// at once (see [`Quiet::settleable`]): every busy blocking stream's
    /// work is plain, and the default stream's was checked.
    pub fn copy_in_settleable(&self) -> bool {
        !self.unchecked.contains(&DEFAULT_STREAM) && self.blocking_work_plain()
    }

    /// Notes that a copy into memory the client could not check goes to
    /// `stream`: its waits are not settled until it is idle again.
    pub fn unchecked_copy(&mut self, stream: Handle) {
        self.unchecked.insert(stream);
        self.plain_only.remove(&stream);
    }

    /// Plain work on `stream`: a copy to the device whose bytes its call
    /// carries, a memset, or a copy within the device.
    fn plain_work(&mut self, stream: Handle) {
        let only = !self.busy.contains(&stream) || self.plain_only.contains(&stream);
        self.work(stream);
        if only && !self.unchecked.contains(&stream) {
            self.plain_only.insert(stream);
        }
    }

    /// `stream` has no work left.
    fn quieted(&mut self, stream: Handle) {
        self.busy.remove(&stream);
        self.plain_only.remove(&stream);
        self.unchecked.remove(&stream);
    }

    /// No stream has work left.
    fn all_quieted(&mut self) {
        self.busy.clear();
        self.plain_only.clear();
        self.unchecked.clear();
    }

    fn work(&mut self, stream: Handle) {
        self.busy.insert(stream);
        self.plain_only.remove(&stream);
        // A waiting call sent before this work cannot vouch for it.
        self.waiting.retain(|_, s| match s {
            Settles::Stream(s) => *s != stream,
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
    use crate::transport::test_calls::{launch, memset};

    /// A synchronize's mark seen stored settles its stream idle, as an
    /// answer would; one not seen settles nothing, nor does one after which
    /// more work went to its stream (the mark does not vouch for it), nor
    /// does a mark of an event.
    #[test]
    fn a_stream_mark_seen_settles_its_stream_unless_work_came_after_it() {
        let mark = |stream, event| Call::Mark {
            event,
            stream,
            region: 1,
            offset: 0,
            value: 1,
        };
        let mut q = Quiet::default();
        q.sent(1, &launch(5));
        q.sent(2, &mark(5, None));
        q.answered(2, false);
        assert!(!q.idle(5), "a mark not seen");
        q.sent(3, &mark(5, None));
        q.answered(3, true);
        assert!(q.idle(5), "a mark seen");
        q.sent(4, &launch(5));
        q.sent(5, &mark(5, None));
        q.sent(6, &launch(5));
        q.answered(5, true);
        assert!(!q.idle(5), "work after the mark");
        q.sent(7, &mark(5, Some(9)));
        q.answered(7, true);
        assert!(!q.idle(5), "an event's mark");
        assert!(q.busy().contains(&5));
    }

    /// The legacy default stream neither waits for a non-blocking stream's
    /// work nor orders a record there behind its own (PyTorch's side streams:
    /// `loss.item()`'s wait on the default stream costs a round trip without this).
    #[test]
    fn non_blocking_streams_are_apart_from_the_default_stream() {
        let mut q = Quiet::default();
        let new = |handle, flags| Call::NewStream {
            handle,
            flags,
            priority: 0,
        };
        q.sent(1, &new(5, NON_BLOCKING));
        q.sent(2, &new(6, 0));
        q.sent(3, &launch(5));
        assert!(q.idle(DEFAULT_STREAM), "a non-blocking stream's work");
        q.sent(4, &launch(6));
        assert!(!q.idle(DEFAULT_STREAM), "a blocking stream's work");
        q.sent(5, &Call::StreamSynchronize { stream: 6 });
        q.answered(5, true);
        assert!(q.idle(DEFAULT_STREAM));
        // Default-stream work: a record on an idle non-blocking stream is
        // not behind it; on an idle blocking one it is.
        q.sent(6, &launch(DEFAULT_STREAM));
        q.sent(7, &Call::StreamSynchronize { stream: 5 });
        q.answered(7, true);
        q.sent(
            8,
            &Call::EventRecord {
                event: 9,
                stream: 5,
            },
        );
        q.sent(
            9,
            &Call::EventRecord {
                event: 10,
                stream: 6,
            },
        );
        assert!(q.reached(9) && !q.reached(10));
        q.sent(10, &Call::StreamDestroy { stream: 5 });
        q.sent(11, &launch(5));
        assert!(
            !q.idle(DEFAULT_STREAM),
            "a handle seen again counts as blocking"
        );
    }

    #[test]
    fn a_stream_is_idle_once_a_wait_for_all_its_work_succeeded() {
        let mut q = Quiet::default();
        assert!(q.idle(5), "a stream with no work");
        q.sent(1, &launch(5));
        q.sent(2, &launch(7));
        assert!(!q.idle(5) && !q.idle(DEFAULT_STREAM) && q.idle(6));
        q.sent(3, &Call::StreamQuery { stream: 5 });
        q.answered(3, false);
        assert!(!q.idle(5), "a query that found work");
        q.sent(4, &Call::StreamSynchronize { stream: 5 });
        q.answered(4, true);
        assert!(q.idle(5));
        assert!(!q.idle(DEFAULT_STREAM), "the legacy stream waits for 7");
        assert!(!q.all_idle());
        q.sent(5, &Call::ContextSynchronize);
        q.answered(5, true);
        assert!(q.idle(DEFAULT_STREAM) && q.idle(7) && q.all_idle());
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
    fn a_synchronous_copy_settles_the_default_stream_once_answered() {
        let mut q = Quiet::default();
        let memset = memset(None);
        q.sent(1, &memset);
        assert!(!q.all_idle());
        q.answered(1, true);
        assert!(q.all_idle());
        q.sent(2, &memset);
        q.answered(2, false);
        assert!(!q.all_idle(), "a failed one vouches for nothing");
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

    /// A copy in on `stream` whose bytes the call carries.
    fn copy_in(stream: Handle) -> Call {
        Call::MemcpyHtoD {
            dst: 0x100,
            data: Vec::new(),
            stream: Some(stream),
        }
    }

    /// A wait for copies in alone may be settled (`.to("cuda")` then its
    /// synchronize): on the stream, the context, the default stream while
    /// the blocking streams it waits for have copies in alone; never behind
    /// a launch, a copy into memory the client could not check, or on an
    /// idle stream. A settle sent quiets what it waits for.
    #[test]
    fn waits_for_copies_in_alone_are_settled() {
        let mut q = Quiet::default();
        q.sent(
            1,
            &Call::NewStream {
                handle: 5,
                flags: NON_BLOCKING,
                priority: 0,
            },
        );
        assert!(
            !q.settleable(Some(5)) && !q.settleable(None),
            "nothing to wait for"
        );
        q.sent(2, &copy_in(5));
        q.sent(3, &copy_in(5));
        assert!(q.settleable(Some(5)) && q.settleable(None));
        q.sent(4, &launch(DEFAULT_STREAM));
        assert!(q.settleable(Some(5)), "a non-blocking stream is apart");
        assert!(!q.settleable(None) && !q.settleable(Some(DEFAULT_STREAM)));
        assert!(!q.copy_in_settleable(), "behind the launch");
        q.sent(5, &Call::Settle { stream: Some(5) });
        assert!(q.idle(5));
        q.sent(
            6,
            &Call::StreamSynchronize {
                stream: DEFAULT_STREAM,
            },
        );
        q.answered(6, true);
        // The default stream waits for a blocking stream's work.
        q.sent(7, &copy_in(6));
        assert!(q.copy_in_settleable());
        q.sent(8, &copy_in(DEFAULT_STREAM));
        assert!(q.settleable(Some(DEFAULT_STREAM)) && q.settleable(Some(6)));
        q.sent(9, &launch(6));
        assert!(!q.settleable(Some(DEFAULT_STREAM)) && !q.settleable(Some(6)));
        q.sent(10, &Call::Settle { stream: None });
        assert!(q.all_idle());
        // A copy the client could not check, until its stream is idle.
        q.unchecked_copy(DEFAULT_STREAM);
        q.sent(11, &copy_in(DEFAULT_STREAM));
        assert!(!q.settleable(Some(DEFAULT_STREAM)) && !q.copy_in_settleable());
        q.sent(
            12,
            &Call::StreamSynchronize {
                stream: DEFAULT_STREAM,
            },
        );
        q.answered(12, true);
        q.sent(13, &copy_in(DEFAULT_STREAM));
        assert!(q.settleable(Some(DEFAULT_STREAM)));
        // Memsets and copies within the device count with copies in.
        q.sent(20, &memset(Some(DEFAULT_STREAM)));
        q.sent(
            21,
            &Call::MemcpyDtoD {
                dst: 0x200,
                src: 0x100,
                bytes: 4,
                stream: Some(DEFAULT_STREAM),
            },
        );
        assert!(q.settleable(Some(DEFAULT_STREAM)));
        // Copies behind an event wait are not copies alone.
        q.sent(
            14,
            &Call::StreamWaitEvent {
                stream: 5,
                event: 40,
            },
        );
        q.sent(15, &copy_in(5));
        assert!(!q.settleable(Some(5)));
    }

    #[test]
    fn an_event_recorded_on_an_idle_stream_is_reached() {
        let record = |event, stream| Call::EventRecord { event, stream };
        let wait = |stream, event| Call::StreamWaitEvent { stream, event };
        let mut q = Quiet::default();
        q.sent(1, &record(9, 4));
        assert!(q.reached(9));
        q.sent(2, &launch(4));
        q.sent(3, &record(9, 4));
        assert!(!q.reached(9), "recorded again behind work");
        // Waiting on a reached event adds no work; on another one it does.
        q.sent(4, &Call::StreamSynchronize { stream: 4 });
        q.answered(4, true);
        q.sent(5, &Call::EventQuery { event: 9 });
        q.answered(5, true);
        q.sent(6, &wait(4, 9));
        assert!(q.idle(4));
        // Behind the default stream's work, a blocking stream's record waits.
        q.sent(7, &launch(DEFAULT_STREAM));
        q.sent(8, &record(9, 4));
        assert!(!q.reached(9) && !q.idle(4));
        q.sent(9, &wait(4, 8));
        assert!(!q.idle(4));
    }
}
