//! Block barriers (`bar.sync`, `bar.red`, `barrier.arrive`): a barrier
//! completes once its expected number of threads arrived; `bar.red` reduces
//! the waiters' predicates.

use super::state::{Block, Geo, Status, Thread};
use crate::ir::{BarRed, Inst, Op, NONE};

/// `bar.arrive` of barrier `id`: counts the thread without waiting.
#[inline]
pub(super) fn arrive(block: &mut Block, id: u64) {
    let id = (id & 15) as usize;
    block.arrivals[id] = block.arrivals[id].wrapping_add(1);
}

/// Completes every barrier whose threads all arrived; whether any did.
pub(super) fn resolve_barriers(g: &Geo<'_>, threads: &mut [Thread], block: &mut Block) -> bool {
    let alive = threads
        .iter()
        .filter(|t| t.status != Status::Exited)
        .count() as u64;
    let mut progressed = false;
    for id in 0..16u64 {
        let mut waiters = Vec::new();
        let mut expected = alive;
        let mut red = BarRed::None;
        for (i, t) in threads.iter().enumerate() {
            if t.status != Status::AtBar {
                continue;
            }
            let f = &g.prog.funcs[t.func as usize];
            if let Some(Inst {
                op:
                    Op::Bar {
                        id: bid,
                        count,
                        red: r,
                        ..
                    },
                ..
            }) = f.code.get(t.pc as usize)
            {
                if t.get(*bid) & 15 == id {
                    let c = t.get(*count);
                    if c != u64::MAX {
                        expected = c.min(alive.max(1));
                    }
                    red = *r;
                    waiters.push(i);
                }
            }
        }
        if waiters.is_empty() {
            continue;
        }
        let arrived = waiters.len() as u64 + block.arrivals[id as usize] as u64;
        if arrived < expected {
            continue;
        }
        block.arrivals[id as usize] = 0;
        // reduction
        let mut popc = 0u64;
        let mut all = true;
        let mut any = false;
        if red != BarRed::None {
            for &i in &waiters {
                let t = &threads[i];
                let f = &g.prog.funcs[t.func as usize];
                if let Some(Inst {
                    op: Op::Bar { p, pneg, .. },
                    ..
                }) = f.code.get(t.pc as usize)
                {
                    let v = (t.get(*p) & 1 != 0) != *pneg;
                    popc += v as u64;
                    all &= v;
                    any |= v;
                }
            }
        }
        for &i in &waiters {
            let t = &mut threads[i];
            let f = &g.prog.funcs[t.func as usize];
            if let Some(Inst {
                op: Op::Bar { d, .. },
                ..
            }) = f.code.get(t.pc as usize)
            {
                if *d != NONE {
                    let v = match red {
                        BarRed::Popc => popc,
                        BarRed::And => all as u64,
                        BarRed::Or => any as u64,
                        BarRed::None => 0,
                    };
                    t.set(*d, v);
                }
            }
            t.release();
        }
        progressed = true;
    }
    progressed
}
