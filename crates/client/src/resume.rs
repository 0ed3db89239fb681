//! What a program keeps to resume its session after its connection is lost
//! (`CUMUX_RESUME=1`): its resume key, where the session is, and every call sent
//! since the last answered one, with its bytes, to send again where it resumes.

use std::collections::VecDeque;
use std::time::Duration;

use cumux_protocol::address::ServerAddress;
use cumux_protocol::{Call, Join};

/// `CUMUX_RESUME=1`: the program's session may be resumed elsewhere.
pub const ENV: &str = "CUMUX_RESUME";
/// `CUMUX_RESUME_TIMEOUT=SECONDS`: how long a lost connection is retried.
pub const TIMEOUT_ENV: &str = "CUMUX_RESUME_TIMEOUT";
/// How long a lost connection is retried by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of calls kept unanswered before the client fences (waits for the
/// server to have taken them), besides [`cumux_protocol::FENCE_EVERY`].
pub const MAX_KEPT_BYTES: usize = 64 << 20;

/// Whether the program asked to be resumable.
pub fn wanted() -> bool {
    std::env::var(ENV).is_ok_and(|v| matches!(v.trim(), "1" | "true" | "yes"))
}

/// How long to retry a lost connection.
pub fn patience() -> Duration {
    std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
}

/// A resumable connection's way back to its session.
pub struct Resume {
    /// The key the session's first welcome gave.
    pub key: u64,
    /// Where the session is (it may have moved).
    pub address: ServerAddress,
    /// The hello's join and `CUDA_VISIBLE_DEVICES`, said again.
    pub join: Option<Join>,
    pub visible: Option<String>,
    /// Calls sent since the last answered one, by `seq`, bytes in them.
    kept: VecDeque<(u64, Call)>,
    kept_bytes: usize,
}

impl Resume {
    pub fn new(
        key: u64,
        address: ServerAddress,
        join: Option<Join>,
        visible: Option<String>,
    ) -> Self {
        Resume {
            key,
            address,
            join,
            visible,
            kept: VecDeque::new(),
            kept_bytes: 0,
        }
    }

    /// Keeps call `seq` (whose byte buffer, if any, is in it) until an
    /// answer to it or a later call says the server has it.
    pub fn keep(&mut self, seq: u64, call: Call) {
        self.kept_bytes += bytes_of(&call);
        self.kept.push_back((seq, call));
    }

    /// The server answered call `seq`: it and every earlier one are done.
    pub fn answered(&mut self, seq: u64) {
        while self.kept.front().is_some_and(|(s, _)| *s <= seq) {
            if let Some((_, call)) = self.kept.pop_front() {
                self.kept_bytes -= bytes_of(&call);
            }
        }
    }

    /// Whether the calls kept hold so many bytes that the client should
    /// wait for the server to take them.
    pub fn full(&self) -> bool {
        self.kept_bytes >= MAX_KEPT_BYTES
    }

    /// The calls to send again to a session resumed at call `from`, the last
    /// sent being `last`: an error where the client no longer keeps them.
    pub fn from(&self, from: u64, last: u64) -> Result<Vec<(u64, Call)>, String> {
        let first = self.kept.front().map_or(last + 1, |(s, _)| *s);
        if from < first || from > last {
            return Err(format!(
                "the session resumes at call {from}, but this program keeps calls {first} to \
                 {last} only (a checkpoint older than its last answered call cannot resume it)"
            ));
        }
        Ok(self
            .kept
            .iter()
            .filter(|(s, _)| *s >= from)
            .cloned()
            .collect())
    }
}

/// Bytes a kept call holds.
fn bytes_of(call: &Call) -> usize {
    match call {
        Call::MemcpyHtoD { data: b, .. }
        | Call::ModuleLoad { image: b }
        | Call::Launch { params: b, .. } => b.len(),
        _ => 0,
    }
    .saturating_add(64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_kept_until_answered_and_given_back_from_where_the_session_resumes() {
        let mut r = Resume::new(7, ServerAddress::Tcp("h:1".into()), None, None);
        for seq in 1..=5 {
            let data = vec![0u8; 1000];
            r.keep(
                seq,
                Call::MemcpyHtoD {
                    dst: 0,
                    data,
                    stream: Some(0),
                },
            );
        }
        r.answered(2);
        assert!(r.from(2, 5).is_err(), "call 2 was answered: not kept");
        let again = r.from(3, 5).unwrap();
        assert_eq!(again.iter().map(|c| c.0).collect::<Vec<_>>(), [3, 4, 5]);
        assert_eq!(r.from(5, 5).unwrap().len(), 1);
        assert!(r.from(6, 5).is_err());
        r.answered(5);
        assert_eq!(r.kept_bytes, 0);
        assert!(!r.full());
    }
}
