//! Exclusive turns under `fair` ([`TurnConfig`]): which tenant holds the device, how much
//! of its work may be on it, when the turn passes, and the idle time a holder is charged.

use super::{Activity, Candidate, Scheduler, Tenant, Turn, VT_SCALE};
use crate::{Nanos, TenantId, TurnConfig};

/// The shortest idle hold: a closed loop's round trip through the server takes longer.
const MIN_HOLD_NS: Nanos = 20_000;
/// How much estimated work a holder that no one waits for may have on the device, in
/// quanta: enough that the device never runs dry between its items, little enough that
/// a tenant arriving waits at most that long (or the overrun) for the turn.
const ALONE_AHEAD_QUANTA: Nanos = 4;

impl Scheduler {
    /// The item that may go now under turns: the holder's oldest ready item, within its
    /// budget; a new holder (least virtual time among tenants with a ready item) once the
    /// turn has passed.
    pub(super) fn choose_turn(&mut self, now: Nanos, turns: TurnConfig) -> Option<Candidate> {
        if let Some(turn) = self.turn {
            if self.turn_over(now, turn, turns) {
                let holder_runs = self
                    .tenants
                    .get(&turn.tenant)
                    .is_some_and(|t| t.in_flight > 0);
                self.turn_stats.overruns += u64::from(holder_runs);
                self.turn = None;
            }
        }
        let mut turn = match self.turn {
            Some(turn) => turn,
            None => {
                let next = self.candidates().min_by_key(|c| (c.vtime, c.seq))?;
                self.turn_stats.turns += 1;
                Turn {
                    tenant: next.tenant,
                    since: now,
                    items: 0,
                }
            }
        };
        self.turn = Some(turn);
        let mine = self
            .candidates()
            .filter(|c| c.tenant == turn.tenant)
            .min_by_key(|c| c.seq)?;
        let budget = if self.others_waiting(turn.tenant) {
            turns.quantum_ns.saturating_sub(now - turn.since)
        } else {
            turn.since = now;
            turns.quantum_ns.saturating_mul(ALONE_AHEAD_QUANTA)
        };
        let goes = turn.items == 0 || self.estimates_in_flight(turn.tenant) < budget;
        turn.items += u32::from(goes);
        self.turn = Some(turn);
        goes.then_some(mine)
    }

    /// Whether `turn` has passed: another tenant waits, and the holder's work is done and
    /// its quantum used or its idle hold over, or its work overran the quantum.
    fn turn_over(&self, now: Nanos, turn: Turn, turns: TurnConfig) -> bool {
        let Some(holder) = self.tenants.get(&turn.tenant) else {
            return true;
        };
        if !self.others_waiting(turn.tenant) {
            return false;
        }
        let used = now - turn.since;
        if holder.in_flight > 0 {
            return used >= turns.quantum_ns.saturating_add(turns.overrun_ns);
        }
        if used >= turns.quantum_ns {
            return true;
        }
        match holder.activity {
            Activity::Busy => false,
            Activity::IdleSince(since) => now - since >= hold_window(holder, turns),
            Activity::Dormant => true,
        }
    }

    /// Whether a tenant other than `holder` has an item ready.
    fn others_waiting(&self, holder: TenantId) -> bool {
        self.candidates().any(|c| c.tenant != holder)
    }

    /// The cost estimates of `tenant`'s items in flight.
    fn estimates_in_flight(&self, tenant: TenantId) -> Nanos {
        self.tenants.get(&tenant).map_or(0, |t| {
            Nanos::try_from(t.estimated_in_flight_ns).unwrap_or(Nanos::MAX)
        })
    }

    /// Charges the holder the `elapsed` time it kept an idle turn while others had work
    /// queued (its virtual time only: the device did no work of its).
    pub(super) fn charge_idle_turn(&mut self, elapsed: Nanos) {
        let Some(turn) = self.turn else { return };
        let queued_total = self.queued_total;
        let Some(holder) = self.tenants.get_mut(&turn.tenant) else {
            return;
        };
        if elapsed > 0 && holder.in_flight == 0 && queued_total > holder.queued {
            holder.vtime += u128::from(elapsed) * VT_SCALE / u128::from(holder.config.weight);
            self.turn_stats.idle_held_ns = self.turn_stats.idle_held_ns.saturating_add(elapsed);
        }
    }

    /// When the turn may pass by time alone: its quantum or overrun running out, or the
    /// holder's idle hold.
    pub(super) fn turn_wakeups(&self, turns: TurnConfig) -> Vec<Nanos> {
        let Some(turn) = self.turn else {
            return Vec::new();
        };
        let Some(holder) = self.tenants.get(&turn.tenant) else {
            return Vec::new();
        };
        if holder.in_flight > 0 {
            let end = turns.quantum_ns.saturating_add(turns.overrun_ns);
            return vec![turn.since.saturating_add(end).saturating_add(1)];
        }
        let mut times = vec![turn
            .since
            .saturating_add(turns.quantum_ns)
            .saturating_add(1)];
        if let Activity::IdleSince(since) = holder.activity {
            times.push(
                since
                    .saturating_add(hold_window(holder, turns))
                    .saturating_add(1),
            );
        }
        times
    }
}

/// How long `holder`, idle, keeps its turn: twice its usual pause between finishing and
/// submitting again (a closed loop's round trip), within `[MIN_HOLD_NS,
/// hold_idle_max_ns]`; nothing for a tenant that usually pauses longer; the most before
/// its first pause is known.
fn hold_window(holder: &Tenant, turns: TurnConfig) -> Nanos {
    match holder.pause_ns {
        None => turns.hold_idle_max_ns,
        Some(pause) if pause <= turns.hold_idle_max_ns => pause.saturating_mul(2).clamp(
            MIN_HOLD_NS.min(turns.hold_idle_max_ns),
            turns.hold_idle_max_ns,
        ),
        Some(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Charging, FairConfig, KernelId, Policy, SchedulerConfig, StreamId, TenantConfig, WorkId,
        WorkItem,
    };

    const A: TenantId = TenantId(0);
    const B: TenantId = TenantId(1);
    const US: Nanos = 1_000;

    /// The turns of these tests: 1 ms, idle holds of up to 300 µs (the times
    /// they are written in).
    fn turns() -> TurnConfig {
        TurnConfig {
            quantum_ns: 1_000 * US,
            hold_idle_max_ns: 300 * US,
            ..TurnConfig::default()
        }
    }

    /// A GPU's gate as the server makes it for isolated contexts: deep streams, the
    /// running item charged, [`turns`].
    fn gpu(tenants: u32) -> Scheduler {
        let mut config = SchedulerConfig::new(Policy::Fair(FairConfig::default()), 1024);
        config.stream_depth = 64;
        config.charging = Charging::Oldest;
        config.turns = Some(turns());
        let mut s = Scheduler::new(config).unwrap();
        for t in 0..tenants {
            s.register_tenant(0, TenantId(t), TenantConfig::default())
                .unwrap();
        }
        s
    }

    fn submit(s: &mut Scheduler, now: Nanos, id: u64, tenant: TenantId, cost: Nanos) {
        let item = WorkItem {
            id: WorkId(id),
            tenant,
            stream: StreamId(tenant.0),
            kernel: KernelId(u64::from(tenant.0)),
            cost_hint_ns: Some(cost),
            after: None,
        };
        s.submit(now, item).unwrap();
    }

    fn drain(s: &mut Scheduler, now: Nanos) -> Vec<u64> {
        std::iter::from_fn(|| s.poll(now)).map(|w| w.0).collect()
    }

    fn complete(s: &mut Scheduler, now: Nanos, id: u64) {
        s.completed(now, WorkId(id), Nanos::MAX).unwrap();
    }

    #[test]
    fn only_the_holders_items_go_until_its_turn_passes() {
        let mut s = gpu(2);
        submit(&mut s, 0, 1, A, 100 * US);
        submit(&mut s, 0, 2, A, 100 * US);
        submit(&mut s, 0, 3, B, 100 * US);
        assert_eq!(drain(&mut s, 0), [1, 2], "A holds the turn: B's item waits");
        complete(&mut s, 100 * US, 1);
        assert_eq!(drain(&mut s, 100 * US), Vec::<u64>::new());
        complete(&mut s, 200 * US, 2);
        // A is idle with no pause known yet: it keeps its turn for the longest hold.
        assert_eq!(drain(&mut s, 200 * US), Vec::<u64>::new());
        let hold = turns().hold_idle_max_ns;
        assert!(s.next_wakeup().unwrap() <= 200 * US + hold + 1);
        assert_eq!(drain(&mut s, 200 * US + hold), [3], "the hold ran out");
    }

    #[test]
    fn a_closed_loop_keeps_its_turn_over_its_round_trip_and_pays_for_it() {
        let mut s = gpu(2);
        submit(&mut s, 0, 1, A, 5 * US);
        assert_eq!(drain(&mut s, 0), [1]);
        submit(&mut s, 0, 100, B, 2_000 * US);
        let mut t = 0;
        for id in 2..40 {
            complete(&mut s, t + 5 * US, id - 1);
            // Launch, wait, launch: back 15 µs after its kernel ended.
            t += 20 * US;
            submit(&mut s, t, id, A, 5 * US);
            assert_eq!(
                drain(&mut s, t),
                [id],
                "A keeps the device over its round trip"
            );
            if t >= 700 * US {
                break;
            }
        }
        let before = s.tenant_stats(A).unwrap().virtual_time_ns;
        // Its quantum is used: once its kernel is done the turn passes to B.
        let last = s.in_flight.keys().next().unwrap().0;
        complete(&mut s, 1_000 * US, last);
        assert_eq!(drain(&mut s, 1_000 * US), [100]);
        // The round trips it held the device idle were charged to it, as its kernels.
        assert!(
            before >= 600 * US,
            "A was charged {before} ns of the ~700 µs it held the turn"
        );
        // 35 round trips of 15 µs with B waiting: the device's idle time, counted.
        let idle = s.turn_stats().idle_held_ns;
        assert!((500 * US..=560 * US).contains(&idle), "{idle}");
    }

    #[test]
    fn a_tenant_that_pauses_long_gives_the_turn_up_at_once() {
        let mut s = gpu(2);
        // A learns its pauses: 2 ms between finishing and asking again.
        let mut t = 0;
        for id in 1..6 {
            submit(&mut s, t, id, A, 10 * US);
            assert_eq!(drain(&mut s, t), [id]);
            complete(&mut s, t + 10 * US, id);
            t += 2_010 * US;
        }
        submit(&mut s, t, 7, A, 10 * US);
        assert_eq!(drain(&mut s, t), [7]);
        submit(&mut s, t, 100, B, 10 * US);
        complete(&mut s, t + 10 * US, 7);
        assert_eq!(
            drain(&mut s, t + 10 * US),
            [100],
            "no hold for a long pauser"
        );
    }

    #[test]
    fn the_holder_gets_its_quantum_then_the_turn_passes() {
        let mut s = gpu(2);
        for id in 1..=10 {
            submit(&mut s, 0, id, A, 300 * US);
        }
        submit(&mut s, 0, 100, B, 300 * US);
        // 1 ms of estimates: the first four (the fourth starts under the budget).
        assert_eq!(drain(&mut s, 0), [1, 2, 3, 4]);
        complete(&mut s, 300 * US, 1);
        assert_eq!(drain(&mut s, 300 * US), Vec::<u64>::new(), "budget spent");
        complete(&mut s, 600 * US, 2);
        complete(&mut s, 900 * US, 3);
        complete(&mut s, 1_200 * US, 4);
        assert_eq!(drain(&mut s, 1_200 * US), [100], "quantum used: B's turn");
        // B holds its turn idle for a while (its pauses are not known yet), then A
        // has it again.
        complete(&mut s, 1_500 * US, 100);
        assert_eq!(drain(&mut s, 1_500 * US), Vec::<u64>::new());
        let hold = turns().hold_idle_max_ns;
        assert_eq!(
            drain(&mut s, 1_500 * US + hold),
            [5, 6, 7, 8, 9, 10],
            "alone now"
        );
    }

    #[test]
    fn an_item_overrunning_the_turn_lets_the_next_tenant_in_beside_it() {
        let mut s = gpu(2);
        submit(&mut s, 0, 1, A, 10 * US);
        assert_eq!(drain(&mut s, 0), [1]);
        submit(&mut s, 0, 100, B, 10 * US);
        let turns = turns();
        let end = turns.quantum_ns + turns.overrun_ns;
        assert_eq!(drain(&mut s, end - 1), Vec::<u64>::new());
        assert!(s.next_wakeup().unwrap() <= end + 1);
        assert_eq!(drain(&mut s, end + 1), [100], "A's kernel still runs");
        assert_eq!(s.in_flight_count(), 2);
        assert_eq!(s.turn_stats().overruns, 1);
        assert_eq!(s.turn_stats().turns, 2);
    }

    #[test]
    fn alone_a_tenant_keeps_four_quanta_of_work_on_the_device() {
        let mut s = gpu(1);
        for id in 1..=20 {
            submit(&mut s, 0, id, A, 500 * US);
        }
        assert_eq!(drain(&mut s, 0), [1, 2, 3, 4, 5, 6, 7, 8]);
        complete(&mut s, 500 * US, 1);
        assert_eq!(drain(&mut s, 500 * US), [9], "topped up as items finish");
    }

    #[test]
    fn the_least_served_waiting_tenant_gets_the_next_turn() {
        let mut s = gpu(3);
        let c = TenantId(2);
        submit(&mut s, 0, 1, A, 1_000 * US);
        submit(&mut s, 0, 2, B, 1_000 * US);
        submit(&mut s, 0, 3, c, 1_000 * US);
        assert_eq!(drain(&mut s, 0), [1]);
        // A finishes and asks again at once, ahead of the others' waiting items.
        complete(&mut s, 1_000 * US, 1);
        submit(&mut s, 1_000 * US, 4, A, 1_000 * US);
        assert_eq!(drain(&mut s, 1_000 * US), [2], "B: least virtual time");
        complete(&mut s, 2_000 * US, 2);
        submit(&mut s, 2_000 * US, 5, B, 1_000 * US);
        assert_eq!(
            drain(&mut s, 2_000 * US),
            [3],
            "C, never served, before A and B"
        );
        complete(&mut s, 3_000 * US, 3);
        assert_eq!(
            drain(&mut s, 3_000 * US),
            [4],
            "then A, the first to have asked"
        );
        assert_eq!(s.turn_stats().turns, 4);
        assert_eq!(s.turn_stats().overruns, 0);
    }
}
