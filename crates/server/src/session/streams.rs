//! A session's streams and events: the handles it hands out, their checks,
//! and the calls that create, order, wait for and ask after them.

use cumux_protocol::{codes, CuError, Handle, ReplyBody, DEFAULT_STREAM};

use super::core::{err, invalid_handle};
use super::{CallResult, Session, MAX_STREAMS};
use crate::device::ordering::{EVENT_DISABLE_TIMING, EVENT_INTERPROCESS, NON_BLOCKING};
use crate::device::{StreamWork, SyncTarget};

impl Session {
    pub(super) fn check_stream(&self, stream: Handle) -> Result<(), CuError> {
        if stream == DEFAULT_STREAM || self.streams.contains_key(&stream) {
            Ok(())
        } else {
            Err(invalid_handle("stream", stream))
        }
    }

    /// [`Session::check_stream`] for a call whose stream may be left out.
    pub(super) fn check_optional_stream(&self, stream: Option<Handle>) -> Result<(), CuError> {
        stream.map_or(Ok(()), |s| self.check_stream(s))
    }

    /// An event's `CU_EVENT_*` flags.
    fn event_flags(&self, event: Handle) -> Result<u32, CuError> {
        self.events
            .get(&event)
            .copied()
            .ok_or_else(|| invalid_handle("event", event))
    }

    /// A stream under the handle the server mints (`minted: None`) or the
    /// client chose in its minted range.
    pub(super) fn stream_create(
        &mut self,
        flags: u32,
        priority: i32,
        minted: Option<Handle>,
    ) -> CallResult {
        if flags & !NON_BLOCKING != 0 {
            return Err(err(
                codes::INVALID_VALUE,
                format!("stream flags {flags:#x}"),
            ));
        }
        if self.streams.len() >= MAX_STREAMS {
            return Err(err(
                codes::OUT_OF_MEMORY,
                format!("a session may hold {MAX_STREAMS} streams"),
            ));
        }
        let handle = match minted {
            Some(handle) => self.claim_minted(handle)?,
            None => self.mint_handle(),
        };
        let priority = self.forced_priority.unwrap_or(priority);
        self.ordered()?.stream_create(handle, flags, priority)?;
        self.streams.insert(handle, (flags, priority));
        Ok(ReplyBody::Handle(handle))
    }

    /// `handle`, if it is one the client may mint for this session and no
    /// stream or event has it (only those live in the minted range).
    fn claim_minted(&self, handle: Handle) -> Result<Handle, CuError> {
        if !cumux_protocol::is_minted(self.index, handle) {
            return Err(err(
                codes::INVALID_VALUE,
                format!("{handle:#x} is not a handle this session's client may choose"),
            ));
        }
        if self.streams.contains_key(&handle) || self.events.contains_key(&handle) {
            return Err(err(
                codes::INVALID_VALUE,
                format!("handle {handle:#x} is taken"),
            ));
        }
        Ok(handle)
    }

    pub(super) fn stream_destroy(&mut self, stream: Handle) -> CallResult {
        if self.streams.remove(&stream).is_none() {
            return Err(invalid_handle("stream", stream));
        }
        self.sched_streams.forget(stream);
        if let Some(signals) = &mut self.signals {
            signals.release(stream);
        }
        self.ordered()?.stream_destroy(stream)?;
        Ok(ReplyBody::Unit)
    }

    pub(super) fn stream_synchronize(&mut self, stream: Handle) -> CallResult {
        self.check_stream(stream)?;
        self.synchronize(SyncTarget::Stream(stream))
    }

    pub(super) fn stream_query(&self, stream: Handle) -> CallResult {
        self.check_stream(stream)?;
        self.query(SyncTarget::Stream(stream), "stream busy")
    }

    pub(super) fn stream_wait_event(&mut self, stream: Handle, event: Handle) -> CallResult {
        self.check_stream(stream)?;
        self.event_flags(event)?;
        self.queue(stream, StreamWork::Wait { event })
    }

    /// Waits for all of the session's work. Nothing queued since the last one:
    /// the device has nothing of ours to wait for (a program that synchronizes
    /// again and again).
    pub(super) fn context_synchronize(&mut self) -> CallResult {
        if !self.queued_since_sync.get() {
            return self.sync_result();
        }
        let result = self.synchronize(SyncTarget::Context);
        // A failure may still be pending on the device: look again next time.
        self.queued_since_sync.set(result.is_err());
        result
    }

    /// An event under the handle the server mints or the client chose.
    pub(super) fn event_create(&mut self, flags: u32, minted: Option<Handle>) -> CallResult {
        if flags & !0xf != 0 {
            return Err(err(codes::INVALID_VALUE, format!("event flags {flags:#x}")));
        }
        let handle = match minted {
            Some(handle) => self.claim_minted(handle)?,
            None => self.mint_handle(),
        };
        self.ordered()?.event_create(handle, flags)?;
        self.events.insert(handle, flags);
        Ok(ReplyBody::Handle(handle))
    }

    pub(super) fn event_record(&mut self, event: Handle, stream: Handle) -> CallResult {
        self.check_stream(stream)?;
        let flags = self.event_flags(event)?;
        let queued = self.queue(stream, StreamWork::Record { event })?;
        // Another program may wait for this record once the call returns
        // (the client fences after it): the device must have it by then.
        if flags & EVENT_INTERPROCESS != 0 {
            self.ordered()?.taken()?;
        }
        Ok(queued)
    }

    /// `Call::Mark`: queues the store of `value` into 8 aligned bytes of one
    /// of the session's pinned regions once `event`, just recorded on
    /// `stream`, is reached (`None`: once the stream's work so far is
    /// done). Left out when
    /// the next synchronize would have news (a failure, printf text, work
    /// that failed to queue): the client, seeing no mark, asks.
    pub(super) fn mark(
        &mut self,
        event: Option<Handle>,
        stream: Handle,
        region: Handle,
        offset: u64,
        value: u64,
    ) -> CallResult {
        self.check_stream(stream)?;
        if let Some(event) = event {
            self.event_flags(event)?;
        }
        if !offset.is_multiple_of(8) {
            return Err(err(
                codes::INVALID_VALUE,
                format!("a mark at offset {offset} of host region {region} is not 8-byte aligned"),
            ));
        }
        let host = self.host.span(region, offset, 8)?;
        let ordered = self.ordered()?;
        if self.core.holds_news() || self.enqueue_failed.get() || ordered.printf_waiting() {
            return Ok(ReplyBody::Unit);
        }
        // No work of the stream: its completion signals still say when it is idle.
        self.queued_since_sync.set(true);
        self.enqueue(stream, StreamWork::Mark { event, host, value });
        Ok(ReplyBody::Unit)
    }

    pub(super) fn event_query(&self, event: Handle) -> CallResult {
        self.event_flags(event)?;
        self.query(SyncTarget::Event(event), "event not reached yet")
    }

    pub(super) fn event_synchronize(&self, event: Handle) -> CallResult {
        self.event_flags(event)?;
        let outcome = self.ordered()?.synchronize(SyncTarget::Event(event));
        self.waited(outcome)
    }

    pub(super) fn event_elapsed(&self, start: Handle, end: Handle) -> CallResult {
        let flags = self.event_flags(start)? | self.event_flags(end)?;
        if flags & EVENT_DISABLE_TIMING != 0 {
            return Err(err(
                codes::INVALID_HANDLE,
                "event created with timing disabled",
            ));
        }
        let ms = self.ordered()?.elapsed_ms(start, end)?;
        Ok(ReplyBody::ElapsedMs(ms))
    }

    pub(super) fn event_destroy(&mut self, event: Handle) -> CallResult {
        self.events
            .remove(&event)
            .ok_or_else(|| invalid_handle("event", event))?;
        self.ordered()?.event_destroy(event)?;
        Ok(ReplyBody::Unit)
    }
}
