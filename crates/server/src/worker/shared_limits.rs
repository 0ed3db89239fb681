//! A shared context's limits follow its live sessions: [`LimitBook`] keeps
//! what each session's view asked, and the context runs each limit at the
//! largest a live session needs, back to the start when none is left.
//!
//! A live session that never asked for a limit needs the driver's default
//! (the limit's value at the context's start), as it would in a context of
//! its own; so a limit is set exactly to the largest request only when every
//! live session asked for it, and to at least the start otherwise. When a
//! session ends or lowers its request the limit is set again, smaller if so:
//! one tenant's big stack or malloc heap is not kept for the others after it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use cumux_protocol::CuError;

use crate::device::limits::LimitSetting;
use crate::locking::lock;

/// The limit requests of one shared context's live sessions, by view tag.
#[derive(Default)]
pub struct LimitBook {
    /// Each live view's requests: limit → value. Held while the context's
    /// limit is set, so that settings reach it in the order they were made.
    views: Mutex<Views>,
}

impl LimitBook {
    /// View `view` is live, needing every limit's default until it asks:
    /// a limit set below it for the views before is raised (`apply`), and
    /// none is lowered.
    pub fn join(&self, view: u64, apply: impl Fn(u32, LimitSetting) -> Result<(), CuError>) {
        let mut views = lock(&self.views);
        let raise = |limit, setting| match setting {
            LimitSetting::AtLeastStart(v) => apply(limit, LimitSetting::RaisedToStart(v)),
            other => apply(limit, other),
        };
        follow(&mut views, |v| drop(v.insert(view, BTreeMap::new())), raise);
    }

    /// View `view` asks `limit` at `value`: the context's limit is set, by
    /// `apply`, to what its live views need now. A refusal (a stack the
    /// driver cannot give) is the session's, and its request is undone.
    pub fn ask(
        &self,
        view: u64,
        limit: u32,
        value: u64,
        apply: impl FnOnce(u32, LimitSetting) -> Result<(), CuError>,
    ) -> Result<(), CuError> {
        let mut views = lock(&self.views);
        let before = views.entry(view).or_default().insert(limit, value);
        let result = apply(limit, setting(&views, limit));
        if result.is_err() {
            let asked = views.entry(view).or_default();
            match before {
                Some(value) => asked.insert(limit, value),
                None => asked.remove(&limit),
            };
        }
        result
    }

    /// View `view` ended: each limit whose setting that changes follows the
    /// views left (`apply`): those it asked for, and those it needed the
    /// default of; with none left, every limit of the context goes back to
    /// its start (`reset`), those that kernels grew too. A refusal is logged:
    /// no session is failed for it.
    pub fn leave(
        &self,
        view: u64,
        apply: impl Fn(u32, LimitSetting) -> Result<(), CuError>,
        reset: impl FnOnce() -> Result<(), CuError>,
    ) {
        let mut views = lock(&self.views);
        if views.len() == 1 && views.contains_key(&view) {
            views.clear();
            if let Err(e) = reset() {
                tracing::warn!("shared context: its limits stay as they are: {e}");
            }
            return;
        }
        follow(&mut views, |v| drop(v.remove(&view)), apply);
    }

    /// Forgets view `view` without setting anything (its context is gone).
    pub fn forget(&self, view: u64) {
        lock(&self.views).remove(&view);
    }
}

/// Changes `views` by `change`, then sets (by `apply`) each limit a view
/// asked for whose setting that changed; a refusal is logged.
fn follow(
    views: &mut Views,
    change: impl FnOnce(&mut Views),
    apply: impl Fn(u32, LimitSetting) -> Result<(), CuError>,
) {
    let asked: BTreeSet<u32> = views.values().flat_map(|a| a.keys().copied()).collect();
    let before: Vec<LimitSetting> = asked.iter().map(|&l| setting(views, l)).collect();
    change(views);
    for (&limit, before) in asked.iter().zip(before) {
        let now = setting(views, limit);
        if now == before {
            continue;
        }
        if let Err(e) = apply(limit, now) {
            tracing::warn!(limit, "shared context: a limit stays as it is: {e}");
        }
    }
}

/// Each live view's limit requests: limit → value, by view tag.
type Views = HashMap<u64, BTreeMap<u32, u64>>;

/// What `limit` must be for `views`: the largest request, exactly when every
/// view asked for it, else at least the limit's start.
fn setting(views: &Views, limit: u32) -> LimitSetting {
    let asks = || views.values().map(|asked| asked.get(&limit).copied());
    let largest = asks().flatten().max().unwrap_or(0);
    match asks().all(|a| a.is_some()) && !views.is_empty() {
        true => LimitSetting::Exactly(largest),
        false => LimitSetting::AtLeastStart(largest),
    }
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
        book.join(1, seen.apply());
        book.join(2, seen.apply());
        assert_eq!(seen.count(), 0, "nobody asked: nothing to set");
        book.ask(1, HEAP, 64 * MIB, seen.apply()).unwrap();
        // View 2 has not asked: it needs the default at least.
        assert_eq!(
            seen.last(),
            Some((HEAP, LimitSetting::AtLeastStart(64 * MIB)))
        );
        book.ask(2, HEAP, 16 * MIB, seen.apply()).unwrap();
        assert_eq!(seen.last(), Some((HEAP, LimitSetting::Exactly(64 * MIB))));
        // A lower request of its own lowers it.
        book.ask(1, HEAP, 32 * MIB, seen.apply()).unwrap();
        assert_eq!(seen.last(), Some((HEAP, LimitSetting::Exactly(32 * MIB))));
        book.leave(1, seen.apply(), no_reset);
        assert_eq!(seen.last(), Some((HEAP, LimitSetting::Exactly(16 * MIB))));
        let reset = RefCell::new(0);
        book.leave(2, seen.apply(), || {
            *reset.borrow_mut() += 1;
            Ok(())
        });
        assert_eq!(*reset.borrow(), 1, "the last view's end resets every limit");
    }

    #[test]
    fn a_view_that_asked_nothing_keeps_the_default_while_it_lives() {
        let (book, seen) = (LimitBook::default(), Seen::default());
        book.join(1, seen.apply());
        book.ask(1, HEAP, 4 * MIB, seen.apply()).unwrap();
        assert_eq!(seen.last(), Some((HEAP, LimitSetting::Exactly(4 * MIB))));
        book.join(2, seen.apply());
        assert_eq!(
            seen.last(),
            Some((HEAP, LimitSetting::RaisedToStart(4 * MIB)))
        );
        book.leave(2, seen.apply(), no_reset);
        assert_eq!(seen.last(), Some((HEAP, LimitSetting::Exactly(4 * MIB))));
        // Set again only when a setting changes.
        let count = seen.count();
        book.join(2, seen.apply());
        book.join(3, seen.apply());
        book.leave(3, seen.apply(), no_reset);
        assert_eq!(seen.count(), count + 1);
    }

    #[test]
    fn a_refused_request_is_undone_and_a_refused_reset_fails_nobody() {
        let (book, seen) = (LimitBook::default(), Seen::default());
        book.join(1, seen.apply());
        book.join(2, seen.apply());
        book.ask(1, 0, 8 << 10, seen.apply()).unwrap();
        let refuse = |_, _| Err(CuError::new(codes::OUT_OF_MEMORY, "no such stack"));
        let e = book.ask(1, 0, 1 << 30, refuse).unwrap_err();
        assert_eq!(e.code, codes::OUT_OF_MEMORY);
        book.ask(2, 0, 4 << 10, seen.apply()).unwrap();
        assert_eq!(seen.last(), Some((0, LimitSetting::Exactly(8 << 10))));
        book.leave(1, refuse, no_reset);
        let refused = || Err(CuError::new(codes::INVALID_VALUE, "heap used"));
        book.leave(2, refuse, refused);
        book.forget(3);
    }
}
