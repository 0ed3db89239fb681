//! Which bytes of a call or a reply travel in the bulk ring instead of inside
//! the encoded message, and how they are put back on the other side.

use super::layout::ShmError;
use crate::arrays::ArrayCall;
use crate::messages::{Call, Reply, ReplyBody};

/// Byte buffers of at least this size travel in the bulk ring, not inside the message.
pub const BULK_THRESHOLD: usize = 512;

/// Moves a call's byte buffer out of it when it is large enough to travel in
/// the bulk ring; an empty vector otherwise.
pub fn take_call_bulk(call: &mut Call) -> Vec<u8> {
    match call {
        Call::MemcpyHtoD { data: b, .. }
        | Call::ModuleLoad { image: b }
        | Call::Launch { params: b, .. }
        | Call::Array(ArrayCall::Copy { data: b, .. })
            if b.len() >= BULK_THRESHOLD =>
        {
            std::mem::take(b)
        }
        _ => Vec::new(),
    }
}

/// Puts a bulk payload back into the call it came with. A payload for a call
/// that has no byte buffer, or whose buffer also came inline, is a violation.
pub fn put_call_bulk(call: &mut Call, bulk: Vec<u8>) -> Result<(), ShmError> {
    if bulk.is_empty() {
        return Ok(());
    }
    match call {
        Call::MemcpyHtoD { data: b, .. }
        | Call::ModuleLoad { image: b }
        | Call::Launch { params: b, .. }
        | Call::Array(ArrayCall::Copy { data: b, .. })
            if b.is_empty() =>
        {
            *b = bulk;
            Ok(())
        }
        _ => Err(ShmError::Violation(
            "a bulk payload for a call that takes none".into(),
        )),
    }
}

/// Moves a reply's data out of it when large enough to travel in the bulk ring.
pub fn take_reply_bulk(reply: &mut Reply) -> Vec<u8> {
    match &mut reply.result {
        Ok(ReplyBody::Data(d)) if d.len() >= BULK_THRESHOLD => std::mem::take(d),
        _ => Vec::new(),
    }
}

/// Puts a bulk payload back into the reply it came with.
pub fn put_reply_bulk(reply: &mut Reply, bulk: Vec<u8>) -> Result<(), ShmError> {
    if bulk.is_empty() {
        return Ok(());
    }
    match &mut reply.result {
        Ok(ReplyBody::Data(d)) if d.is_empty() => {
            *d = bulk;
            Ok(())
        }
        _ => Err(ShmError::Violation(
            "a bulk payload for a reply that takes none".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::test_data::pattern;

    #[test]
    fn large_byte_buffers_move_to_the_bulk_ring_and_back() {
        let data = pattern(3, 4096);
        let mut call = Call::MemcpyHtoD {
            dst: 1,
            data: data.clone(),
            stream: None,
        };
        let bulk = take_call_bulk(&mut call);
        assert_eq!(bulk, data);
        put_call_bulk(&mut call, bulk).unwrap();
        assert!(matches!(&call, Call::MemcpyHtoD { data: d, .. } if *d == data));
        // Small ones stay inline.
        let mut small = Call::MemcpyHtoD {
            dst: 1,
            data: vec![1, 2, 3],
            stream: None,
        };
        assert!(take_call_bulk(&mut small).is_empty());
        // A payload for a call without a buffer, or one already filled, is refused.
        assert!(put_call_bulk(&mut Call::ContextSynchronize, vec![1]).is_err());
        assert!(put_call_bulk(&mut small, vec![1]).is_err());

        let mut reply = Reply {
            seq: 1,
            result: Ok(ReplyBody::Data(data.clone())),
            stdout: Vec::new(),
        };
        let bulk = take_reply_bulk(&mut reply);
        assert_eq!(bulk.len(), 4096);
        put_reply_bulk(&mut reply, bulk).unwrap();
        assert_eq!(reply.result, Ok(ReplyBody::Data(data)));
        let mut unit = Reply {
            seq: 1,
            result: Ok(ReplyBody::Unit),
            stdout: Vec::new(),
        };
        assert!(put_reply_bulk(&mut unit, vec![1]).is_err());
    }
}
