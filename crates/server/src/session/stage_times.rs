//! Where a checkpoint's time went (issue 17): the writing thread's wall time
//! split into waiting on the device's reads, waiting on the pool's packing,
//! writing and syncing, with the device side's and the pool's own busy time beside.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A part of a checkpoint's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// The writing thread waiting for the device's next piece.
    ReadWait,
    /// The writing thread waiting for the pool to pack a chunk.
    PackWait,
    /// The writing thread writing records (the file's writeback waits included).
    Write,
    /// The file flushed and synced to its disk.
    Sync,
    /// The device side inside its reads (on a thread of its own).
    DeviceBusy,
    /// The pool's threads packing, all of them together.
    PackBusy,
}

const STAGES: usize = 6;

/// Nanoseconds spent in each [`Stage`], summed from any thread.
#[derive(Debug, Default)]
pub(super) struct StageTimes {
    nanos: [AtomicU64; STAGES],
}

impl StageTimes {
    /// Adds the time since `since` to `stage`.
    pub(super) fn add(&self, stage: Stage, since: Instant) {
        self.add_time(stage, since.elapsed());
    }

    /// Adds `time` to `stage`.
    pub(super) fn add_time(&self, stage: Stage, time: Duration) {
        let ns = u64::try_from(time.as_nanos()).unwrap_or(u64::MAX);
        self.nanos[stage as usize].fetch_add(ns, Ordering::Relaxed);
    }

    /// `run`'s result, its time added to `stage`.
    pub(super) fn timed<T>(&self, stage: Stage, run: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let done = run();
        self.add(stage, started);
        done
    }

    /// The time spent in `stage` so far.
    pub(super) fn get(&self, stage: Stage) -> Duration {
        Duration::from_nanos(self.nanos[stage as usize].load(Ordering::Relaxed))
    }

    /// What a user reads: `memory` bytes in `elapsed`, its rate, and the split.
    pub(super) fn summary(&self, memory: u64, elapsed: Duration, threads: usize) -> String {
        let s = |stage| self.get(stage).as_secs_f64();
        let secs = elapsed.as_secs_f64();
        let rate = if secs > 0.0 {
            memory as f64 / secs / 1e9
        } else {
            0.0
        };
        format!(
            "in {secs:.3} s, {rate:.2} GB/s of memory (waiting on device reads {:.3} s, on packing \
             {:.3} s; writing {:.3} s; syncing {:.3} s; the device side read for {:.3} s, the pool \
             packed for {:.3} s on {threads} threads)",
            s(Stage::ReadWait),
            s(Stage::PackWait),
            s(Stage::Write),
            s(Stage::Sync),
            s(Stage::DeviceBusy),
            s(Stage::PackBusy),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_add_up_per_stage_from_several_threads() {
        let times = StageTimes::default();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    times.timed(Stage::PackBusy, || {
                        std::thread::sleep(Duration::from_millis(20))
                    })
                });
            }
        });
        assert!(times.get(Stage::PackBusy) >= Duration::from_millis(80));
        assert_eq!(times.get(Stage::Write), Duration::ZERO);
        let line = times.summary(2_000_000_000, Duration::from_secs(1), 4);
        assert!(
            line.starts_with("in 1.000 s, 2.00 GB/s of memory"),
            "{line}"
        );
        assert!(
            line.contains("writing 0.000 s") && line.contains("on 4 threads"),
            "{line}"
        );
    }
}
