//! This thread's stack of current contexts (the last entry is current), as
//! `cuCtxPush/PopCurrent` and `cuCtxSetCurrent` keep it.

use std::cell::RefCell;

thread_local! {
    static CONTEXT_STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

pub fn current_context() -> Option<usize> {
    CONTEXT_STACK.with(|s| s.borrow().last().copied())
}

pub fn set_current_context(ctx: Option<usize>) {
    CONTEXT_STACK.with(|s| {
        let mut s = s.borrow_mut();
        s.pop();
        if let Some(c) = ctx {
            s.push(c);
        }
    });
}

pub fn push_context(ctx: usize) {
    CONTEXT_STACK.with(|s| s.borrow_mut().push(ctx));
}

pub fn pop_context() -> Option<usize> {
    CONTEXT_STACK.with(|s| s.borrow_mut().pop())
}

/// Drops a destroyed context from this thread's stack wherever it is.
pub fn forget_context(ctx: usize) {
    CONTEXT_STACK.with(|s| s.borrow_mut().retain(|c| *c != ctx));
}
