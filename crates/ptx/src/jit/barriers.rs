//! Block barriers of compiled kernels between runs, as the interpreter resolves
//! them: each of the 16 ids completes once its waiters and `bar.arrive`s reach
//! its count (the block's live threads by default); `bar.red` reduces.

use super::compiled::CompiledKernel;
use super::warp::State;
use crate::ir::{BarRed, Op, Src, NONE};

/// The block's threads as a barrier sees them.
pub(super) struct Waiters<'a> {
    pub kernel: &'a CompiledKernel,
    /// Threads of `state` at a barrier.
    pub waiting: &'a mut usize,
    pub state: &'a mut [State],
    pub resume: &'a [u32],
    pub regs: &'a mut [u64],
    /// `bar.arrive`s of each id since it last completed.
    pub arrivals: &'a mut [u32; 16],
}

impl Waiters<'_> {
    /// Completes every barrier whose threads all arrived, `alive` threads
    /// of the block live; whether any did.
    pub(super) fn resolve(&mut self, alive: usize) -> bool {
        if self.kernel.plain_barriers {
            return self.resolve_plain(alive);
        }
        let alive = alive as u64;
        let mut waiters: [Vec<usize>; 16] = Default::default();
        let mut expected = [alive; 16];
        let mut red = [BarRed::None; 16];
        for t in 0..self.state.len() {
            if self.state[t] != State::AtBarrier {
                continue;
            }
            let Some(Op::Bar {
                id, count, red: r, ..
            }) = self.bar_of(t)
            else {
                continue;
            };
            let id = (self.get(t, *id) & 15) as usize;
            let c = self.get(t, *count);
            if c != u64::MAX {
                expected[id] = c.min(alive.max(1));
            }
            red[id] = *r;
            waiters[id].push(t);
        }
        let mut progressed = false;
        for id in 0..16 {
            let arrived = waiters[id].len() as u64 + self.arrivals[id] as u64;
            if waiters[id].is_empty() || arrived < expected[id] {
                continue;
            }
            self.arrivals[id] = 0;
            self.release(&waiters[id], red[id]);
            *self.waiting -= waiters[id].len();
            progressed = true;
        }
        progressed
    }

    /// [`Self::resolve`] of a kernel whose barriers all wait for the whole
    /// block at one id, without arrivals or reductions.
    fn resolve_plain(&mut self, alive: usize) -> bool {
        let waiting = *self.waiting;
        if waiting == 0 || waiting < alive {
            return false;
        }
        if waiting == self.state.len() {
            self.state.fill(State::Ready);
        } else {
            for s in self.state.iter_mut() {
                if *s == State::AtBarrier {
                    *s = State::Ready;
                }
            }
        }
        *self.waiting = 0;
        true
    }

    /// Lets `waiters` go on, each `bar.red`'s destination given the
    /// reduction `red` of their predicates.
    fn release(&mut self, waiters: &[usize], red: BarRed) {
        let (mut popc, mut all, mut any) = (0u64, true, false);
        if red != BarRed::None {
            for &t in waiters {
                if let Some(&Op::Bar { p, pneg, .. }) = self.bar_of(t) {
                    let v = (self.get(t, p) & 1 != 0) != pneg;
                    popc += v as u64;
                    all &= v;
                    any |= v;
                }
            }
        }
        let nregs = self.kernel.nregs as usize;
        for &t in waiters {
            if let Some(&Op::Bar { d, .. }) = self.bar_of(t) {
                if d != NONE {
                    let v = match red {
                        BarRed::Popc => popc,
                        BarRed::And => all as u64,
                        BarRed::Or => any as u64,
                        BarRed::None => 0,
                    };
                    if let Some(slot) = self.regs.get_mut(t * nregs + d as usize) {
                        *slot = v;
                    }
                }
            }
            self.state[t] = State::Ready;
        }
    }

    /// The barrier thread `t` waits at (the op before its resume point).
    fn bar_of(&self, t: usize) -> Option<&Op> {
        let pc = self.kernel.resumes.get(self.resume[t] as usize)?;
        let op = self.kernel.ops.get(pc.checked_sub(1)? as usize)?;
        matches!(op, Op::Bar { .. }).then_some(op)
    }

    /// Operand `s` of thread `t` (its registers as it stopped).
    fn get(&self, t: usize, s: Src) -> u64 {
        let nregs = self.kernel.nregs as usize;
        match s {
            Src::Reg(r) => self.regs.get(t * nregs + r as usize).copied().unwrap_or(0),
            Src::Imm(v) => v,
            Src::Frame(o) => o as u64,
        }
    }
}
