//! This thread's stack of current contexts (the top is current), as
//! `cuCtxPush/PopCurrent` and `cuCtxSetCurrent` keep it, in storage that
//! outlives the thread's other thread-locals (see `CURRENT`).

use std::cell::{Cell, RefCell};

thread_local! {
    /// The top of the stack: the current context. Plain data needs no
    /// destructor, so this is never torn down: the driver calls a program
    /// makes after its thread-locals are gone (the CUDA runtime's `atexit`
    /// teardown, a key destructor at a thread's end) still find their context.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
    /// The contexts under the top, oldest first. Torn down with the thread's
    /// other thread-locals; after that, a push forgets the context it covers
    /// and a pop leaves no context current.
    static BELOW: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

pub fn current_context() -> Option<usize> {
    CURRENT.with(Cell::get)
}

/// The device of this thread's current context (its handle says it,
/// `handles::device_of_context`); device 0 when none is current.
pub fn current_device() -> u32 {
    current_context().map_or(0, super::handles::device_of_context)
}

/// Replaces the top (`None` pops it).
pub fn set_current_context(ctx: Option<usize>) {
    match ctx {
        Some(c) => CURRENT.with(|top| top.set(Some(c))),
        None => {
            pop_context();
        }
    }
}

pub fn push_context(ctx: usize) {
    if let Some(covered) = CURRENT.with(|top| top.replace(Some(ctx))) {
        let _ = BELOW.try_with(|below| below.borrow_mut().push(covered));
    }
}

pub fn pop_context() -> Option<usize> {
    let next = BELOW
        .try_with(|below| below.borrow_mut().pop())
        .ok()
        .flatten();
    CURRENT.with(|top| top.replace(next))
}

/// Drops a destroyed context from this thread's stack wherever it is.
pub fn forget_context(ctx: usize) {
    let _ = BELOW.try_with(|below| below.borrow_mut().retain(|c| *c != ctx));
    if current_context() == Some(ctx) {
        pop_context();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_set_and_forget_keep_the_stack() {
        std::thread::spawn(|| {
            assert_eq!(current_context(), None);
            push_context(1);
            push_context(2);
            push_context(3);
            assert_eq!(current_context(), Some(3));
            set_current_context(Some(4));
            assert_eq!(current_context(), Some(4));
            forget_context(2);
            assert_eq!(pop_context(), Some(4));
            assert_eq!(current_context(), Some(1));
            push_context(1);
            forget_context(1);
            assert_eq!(current_context(), None);
            assert_eq!(pop_context(), None);
            push_context(5);
            set_current_context(None);
            assert_eq!(current_context(), None);
        })
        .join()
        .unwrap();
    }

    /// A key destructor or `atexit` handler runs after the thread's
    /// thread-locals are torn down; the current context is still there, and
    /// nothing panics.
    #[test]
    fn the_current_context_outlives_the_threads_storage() {
        static SEEN: std::sync::Mutex<Vec<Option<usize>>> = std::sync::Mutex::new(Vec::new());
        struct AtThreadEnd;
        impl Drop for AtThreadEnd {
            fn drop(&mut self) {
                let gone = BELOW.try_with(|_| ()).is_err();
                let mut seen = vec![Some(usize::from(gone)), current_context()];
                push_context(3);
                seen.push(current_context());
                seen.push(pop_context());
                seen.push(current_context());
                set_current_context(Some(2));
                forget_context(2);
                seen.push(current_context());
                *SEEN.lock().unwrap() = seen;
            }
        }
        thread_local!(static AT_THREAD_END: AtThreadEnd = const { AtThreadEnd });
        std::thread::spawn(|| {
            // Registered first, so torn down last: after `BELOW`.
            AT_THREAD_END.with(|_| ());
            push_context(1);
            push_context(2);
        })
        .join()
        .unwrap();
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(seen, [Some(1), Some(2), Some(3), Some(3), None, None]);
    }
}
