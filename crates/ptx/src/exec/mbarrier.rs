//! `mbarrier` objects of one thread's block: init, arrivals, waits and the
//! arrival of `cp.async` copies, on the object's 8 bytes (layout: `MbarKind`).

use super::access::Access;
use super::state::{Block, Geo, Thread};
use crate::ir::{MbarKind, Op, NONE};
use crate::launch::Fault;

const PENDING: u64 = 0xffff_ffff;
const PHASE: u64 = 1 << 63;

/// The object after `count` arrivals (and, with `drop`, as many fewer
/// expected from the next phase on): the phase completes, and the next one
/// starts expecting its arrivals, when none is pending any more.
fn arrive(word: u64, count: u64, drop: bool) -> u64 {
    let mut expected = (word >> 32) & (PENDING >> 1);
    if drop {
        expected = expected.saturating_sub(count);
    }
    let pending = (word & PENDING).saturating_sub(count);
    let phase = word & PHASE;
    if pending == 0 {
        (phase ^ PHASE) | expected << 32 | expected
    } else {
        phase | expected << 32 | pending
    }
}

/// Runs `op` (an [`Op::Mbarrier`]) for thread `th`; false for a wait whose
/// phase has not completed (the thread then lets the others run).
pub(super) fn step(
    g: &Geo<'_>,
    b: &mut Block,
    th: &mut Thread,
    op: &Op,
    line: u32,
) -> Result<bool, Fault> {
    let &Op::Mbarrier { kind, d, addr, a } = op else {
        debug_assert!(false, "{op:?} is not an mbarrier op");
        return Ok(true);
    };
    let a = th.get(a);
    if kind == MbarKind::PendingCount {
        th.set(d, a & PENDING);
        return Ok(true);
    }
    let at = Access {
        sp: addr.sp,
        addr: th.address(&addr),
        size: 8,
        line,
    };
    let word = b.load(g, &mut th.local, at)?;
    let (new, result) = match kind {
        MbarKind::Init => {
            let count = a & 0xf_ffff;
            (Some(count << 32 | count), None)
        }
        MbarKind::Inval => (Some(0), None),
        MbarKind::Arrive { drop } => (Some(arrive(word, a, drop)), Some(word)),
        // the copies are done: only `.noinc` is an arrival of its own
        MbarKind::CopiesArrive { noinc } => (noinc.then(|| arrive(word, 1, false)), None),
        MbarKind::Wait { parity } => {
            let asked = if parity { a & 1 } else { a >> 63 };
            let done = (word >> 63) != asked;
            th.set(d, done as u64);
            return Ok(done);
        }
        MbarKind::PendingCount => (None, None),
    };
    if let Some(new) = new {
        b.store(g, &mut th.local, at, new)?;
    }
    if let (Some(state), true) = (result, d != NONE) {
        th.set(d, state);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_completes_at_its_last_arrival_and_the_next_expects_as_many() {
        let init = 3u64 << 32 | 3;
        let one = arrive(init, 1, false);
        assert_eq!(one, 3 << 32 | 2);
        let done = arrive(arrive(one, 1, false), 1, false);
        assert_eq!(done, PHASE | 3 << 32 | 3);
        // two arrivals at once, then one that drops out of later phases
        let two = arrive(done, 2, false);
        assert_eq!(two, PHASE | 3 << 32 | 1);
        assert_eq!(arrive(two, 1, true), 2 << 32 | 2);
    }
}
