//! A shared context's limits follow its live sessions: [`LimitBook`] keeps
//! what each session's view asked, and the context runs each limit at the
//! largest a live session asked, back to the start when none is left.
//!
//! A limit never goes below its value at the context's start (the driver's
//! default): a session that asked for nothing needs that much, as it would in
//! a context of its own, and a heap set below it and then used could never
//! grow back (the driver refuses). When the session that asked for the most
//! ends or lowers its request the limit is set again, smaller: one tenant's
//! big stack or malloc heap is not kept for the others after it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use cumux_protocol::CuError;

use crate::device::limits::LimitSetting;
use crate::locking::lock;

/// Each live view's limit requests: limit → value, by view tag.
type Views = HashMap<u64, BTreeMap<u32, u64>>;

/// The limit requests of one shared context's live sessions.
#[derive(Default)]
pub struct LimitBook {
    /// Held while the context's limit is set, so that settings reach it in
    /// the order they were made.
    views: Mutex<Views>,
}

impl LimitBook {
    /// View `view` is live; until it asks, it needs the defaults, which every
    /// limit keeps at least.
    pub fn join(&self, view: u64) {
        lock(&self.views).insert(view, BTreeMap::new());
    }

    /// View `view` asks `limit` at `value`: the context's limit is set, by
    /// `apply`, to what its live views asked now; lowered only when the view
    /// asked the most and now asks less (else not below a stack kernels grew).
    /// A refusal (a stack the driver cannot give) is the session's, and its
    /// request is undone.
    pub fn ask(
        &self,
        view: u64,
        limit: u32,
        value: u64,
        apply: impl FnOnce(u32, LimitSetting) -> Result<(), CuError>,
    ) -> Result<(), CuError> {
        let mut views = lock(&self.views);
        let before = views.entry(view).or_default().insert(limit, value);
        let most = largest(&views, limit);
        let now = match before {
            // It asked the most, and now less.
            Some(before) if most < before => setting(&views, limit),
            _ => LimitSetting::AtLeastNow(most),
        };
        let result = apply(limit, now);
        if result.is_err() {
            let asked = views.entry(view).or_default();
            match before {
                Some(value) => asked.insert(limit, value),
                None => asked.remove(&limit),
            };
        }
        result
    }

    /// View `view` ended: each limit it asked the most of follows the views
    /// left (`apply`); with none left, every limit of the context goes back
    /// to its start (`reset`), those that kernels grew too. A refusal is
    /// logged: no session is failed for it.
    pub fn leave(
        &self,
        view: u64,
        apply: impl Fn(u32, LimitSetting) -> Result<(), CuError>,
        reset: impl FnOnce() -> Result<(), CuError>,
    ) {
        let mut views = lock(&self.views);
        let asked = views.remove(&view).unwrap_or_default();
        if views.is_empty() {
            if let Err(e) = reset() {
                tracing::warn!("shared context: its limits stay as they are: {e}");
            }
            return;
        }
        for (&limit, &value) in &asked {
            if largest(&views, limit) >= value {
                continue;
            }
            if let Err(e) = apply(limit, setting(&views, limit)) {
                tracing::warn!(limit, "shared context: a limit stays as it is: {e}");
            }
        }
    }

    /// Forgets view `view` without setting anything (its context is gone).
    pub fn forget(&self, view: u64) {
        lock(&self.views).remove(&view);
    }
}

/// What `limit` must be for `views`: the largest request, at least the start.
fn setting(views: &Views, limit: u32) -> LimitSetting {
    LimitSetting::AtLeastStart(largest(views, limit))
}

/// The largest request of `limit` among `views` (0: none asked).
fn largest(views: &Views, limit: u32) -> u64 {
    let asks = views
        .values()
        .filter_map(|asked| asked.get(&limit).copied());
    asks.max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cumux_protocol::codes;
    use std::cell::RefCell;

    const HEAP: u32 = 2;
    const MIB: u64 = 1 << 20;

    /// The settings the book made, in order.
    #[derive(Default)]
    struct Seen(RefCell<Vec<(u32, LimitSetting)>>);

    impl Seen {
        fn apply(&self) -> impl Fn(u32, LimitSetting) -> Result<(), CuError> + '_ {
            |limit, setting| {
                self.0.borrow_mut().push((limit, setting));
                Ok(())
            }
        }
        fn last(&self) -> Option<(u32, LimitSetting)> {
            self.0.borrow().last().copied()
        }
        fn count(&self) -> usize {
            self.0.borrow().len()
        }
    }

    fn no_reset() -> Result<(), CuError> {
        panic!("a view is live")
    }

    #[test]
    fn a_limit_follows_the_largest_live_request() {
        let (book, seen) = (LimitBook::default(), Seen::default());
        book.join(1);
        book.join(2);
        book.ask(1, HEAP, 64 * MIB, seen.apply()).unwrap();
        assert_eq!(
            seen.last(),
            Some((HEAP, LimitSetting::AtLeastNow(64 * MIB)))
        );
        book.ask(2, HEAP, 16 * MIB, seen.apply()).unwrap();
        assert_eq!(
            seen.last(),
            Some((HEAP, LimitSetting::AtLeastNow(64 * MIB)))
        );
        // A lower request of its own lowers it.
        book.ask(1, HEAP, 32 * MIB, seen.apply()).unwrap();
        assert_eq!(
            seen.last(),
            Some((HEAP, LimitSetting::AtLeastStart(32 * MIB)))
        );
        book.leave(1, seen.apply(), no_reset);
        assert_eq!(
            seen.last(),
            Some((HEAP, LimitSetting::AtLeastStart(16 * MIB)))
        );
        let reset = RefCell::new(0);
        book.leave(2, seen.apply(), || {
            *reset.borrow_mut() += 1;
            Ok(())
        });
        assert_eq!(*reset.borrow(), 1, "the last view's end resets every limit");
    }

    #[test]
    fn a_limit_is_set_again_only_when_the_largest_request_goes() {
        let (book, seen) = (LimitBook::default(), Seen::default());
        for view in 1..=3 {
            book.join(view);
        }
        book.ask(1, HEAP, 64 * MIB, seen.apply()).unwrap();
        book.ask(2, HEAP, 16 * MIB, seen.apply()).unwrap();
        // Less of one that did not ask the most lowers nothing.
        book.ask(2, HEAP, 8 * MIB, seen.apply()).unwrap();
        assert_eq!(
            seen.last(),
            Some((HEAP, LimitSetting::AtLeastNow(64 * MIB)))
        );
        let count = seen.count();
        book.leave(2, seen.apply(), no_reset);
        book.leave(3, seen.apply(), no_reset);
        assert_eq!(seen.count(), count, "nothing to set: view 1 asked more");
        book.join(4);
        book.leave(1, seen.apply(), no_reset);
        assert_eq!(seen.last(), Some((HEAP, LimitSetting::AtLeastStart(0))));
    }

    #[test]
    fn a_refused_request_is_undone_and_a_refused_reset_fails_nobody() {
        let (book, seen) = (LimitBook::default(), Seen::default());
        book.join(1);
        book.join(2);
        book.ask(1, 0, 8 << 10, seen.apply()).unwrap();
        let refuse = |_, _| Err(CuError::new(codes::OUT_OF_MEMORY, "no such stack"));
        let e = book.ask(1, 0, 1 << 30, refuse).unwrap_err();
        assert_eq!(e.code, codes::OUT_OF_MEMORY);
        book.ask(2, 0, 4 << 10, seen.apply()).unwrap();
        assert_eq!(seen.last(), Some((0, LimitSetting::AtLeastNow(8 << 10))));
        book.leave(1, refuse, no_reset);
        let refused = || Err(CuError::new(codes::INVALID_VALUE, "heap used"));
        book.leave(2, refuse, refused);
        book.forget(3);
    }
}
