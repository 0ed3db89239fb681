//! The kernel watchdog of worker contexts (`cumux serve --kernel-timeout`): a context
//! whose queued work stops making progress for the timeout holds a kernel that does
//! not end, and is reset (its worker stopped), as a GPU's own watchdog resets one.
//!
//! Progress is read from the sessions' completion signals ([`crate::device::signals`]): each
//! signal queued on a stream is a point the device must pass. A context is stalled
//! while some queued signal is not reached and no counter of the context moved; a
//! stall of the timeout fires the watchdog. It cannot tell a kernel that never ends
//! from work that takes longer than the timeout between two signals (sessions on a
//! watched device signal every few launches, and before every wait), so the timeout
//! should be far above the longest kernel a tenant may run.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cumux_protocol::{codes, CuError};

use crate::device::signals::{SignalArea, ERROR_SLOT};
use crate::locking::lock;

/// How the watchdog resets a hung context: fails it with the error given and
/// stops whatever runs it.
pub type Reset = Box<dyn Fn(CuError) + Send + Sync>;

/// One device's watchdog: a thread, started with the first context it watches,
/// that looks at every watched context a few times per timeout.
pub struct Watchdog {
    timeout: Duration,
    contexts: Arc<Mutex<Vec<Weak<ContextWatch>>>>,
    thread: std::sync::Once,
}

impl Watchdog {
    /// A watchdog that resets contexts stalled for `timeout`.
    pub fn new(timeout: Duration) -> Arc<Self> {
        Arc::new(Watchdog {
            timeout,
            contexts: Arc::new(Mutex::new(Vec::new())),
            thread: std::sync::Once::new(),
        })
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How often the thread looks: an eighth of the timeout, within 5 ms and 500 ms.
    fn period(&self) -> Duration {
        (self.timeout / 8).clamp(Duration::from_millis(5), Duration::from_millis(500))
    }

    /// Watches a new context, which `reset` resets; the watch ends when the
    /// returned handle (shared by the context's connections) is dropped.
    pub fn watch(self: &Arc<Self>, reset: Reset) -> Arc<ContextWatch> {
        let watch = Arc::new(ContextWatch {
            timeout: self.timeout,
            reset,
            areas: Mutex::new(Vec::new()),
            stalled_since: Mutex::new(None),
            fired: std::sync::atomic::AtomicBool::new(false),
        });
        lock(&self.contexts).push(Arc::downgrade(&watch));
        self.thread.call_once(|| self.start());
        watch
    }

    fn start(self: &Arc<Self>) {
        let contexts = Arc::downgrade(&self.contexts);
        let period = self.period();
        let started = std::thread::Builder::new()
            .name("cumux-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(period);
                // The device is gone: so is its watchdog.
                let Some(contexts) = contexts.upgrade() else {
                    return;
                };
                let live: Vec<Arc<ContextWatch>> = {
                    let mut list = lock(&contexts);
                    list.retain(|w| w.strong_count() > 0);
                    list.iter().filter_map(Weak::upgrade).collect()
                };
                let now = Instant::now();
                for watch in live {
                    watch.check(now);
                }
            });
        if let Err(e) = started {
            tracing::error!("cannot start the kernel watchdog: {e}");
        }
    }
}

/// What the watchdog knows of one context: the signal areas of its connections,
/// and since when it has been stalled.
pub struct ContextWatch {
    timeout: Duration,
    reset: Reset,
    areas: Mutex<Vec<Weak<AreaWatch>>>,
    stalled_since: Mutex<Option<Instant>>,
    fired: std::sync::atomic::AtomicBool,
}

impl ContextWatch {
    /// Watches `area`, a connection's signal area (opened by the watcher itself),
    /// for as long as the returned handle lives.
    pub fn add_area(&self, area: SignalArea) -> Arc<AreaWatch> {
        let watch = Arc::new(AreaWatch {
            area,
            queued: (0..ERROR_SLOT).map(|_| AtomicU64::new(0)).collect(),
            slots: AtomicU32::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let mut areas = lock(&self.areas);
        areas.retain(|w| w.strong_count() > 0);
        areas.push(Arc::downgrade(&watch));
        watch
    }

    /// Whether the watchdog has reset this context.
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// One look at `now`: resets the context once it has been stalled for the timeout.
    pub fn check(&self, now: Instant) {
        if self.fired() {
            return;
        }
        let areas: Vec<Arc<AreaWatch>> =
            lock(&self.areas).iter().filter_map(Weak::upgrade).collect();
        let (mut outstanding, mut moved) = (false, false);
        for area in &areas {
            let (o, m) = area.look();
            outstanding |= o;
            moved |= m;
        }
        let mut since = lock(&self.stalled_since);
        if !outstanding {
            *since = None;
            return;
        }
        if moved || since.is_none() {
            *since = Some(now);
            return;
        }
        let stalled = since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        if stalled < self.timeout {
            return;
        }
        self.fired.store(true, Ordering::Release);
        drop(since);
        let why = CuError::new(
            codes::LAUNCH_TIMEOUT,
            format!(
                "the device made no progress for {:.1} s (kernel timeout {:.1} s): a kernel \
                 that does not end; the context was reset",
                stalled.as_secs_f64(),
                self.timeout.as_secs_f64()
            ),
        );
        tracing::warn!("kernel watchdog: {}", why.detail);
        (self.reset)(why);
    }
}

/// One connection's signal area under watch: the highest value queued per slot
/// (raised as signals are queued) against what the device has reached.
pub struct AreaWatch {
    area: SignalArea,
    queued: Vec<AtomicU64>,
    /// Slots used so far (one past the highest).
    slots: AtomicU32,
    /// The counters at the watchdog's last look (its thread's alone).
    seen: Mutex<Vec<u64>>,
}

impl AreaWatch {
    /// A signal of `value` was queued on `slot`.
    pub fn queued(&self, slot: u32, value: u64) {
        if let Some(q) = self.queued.get(slot as usize) {
            q.fetch_max(value, Ordering::AcqRel);
            self.slots.fetch_max(slot + 1, Ordering::AcqRel);
        }
    }

    /// Whether some queued signal is not reached, and whether any counter moved
    /// since the last look.
    fn look(&self) -> (bool, bool) {
        let slots = self.slots.load(Ordering::Acquire) as usize;
        let mut seen = lock(&self.seen);
        if seen.len() < slots {
            // New slots start from what they hold now: no movement yet.
            let from = seen.len();
            seen.extend((from..slots).map(|s| self.area.load(s as u32)));
        }
        let (mut outstanding, mut moved) = (false, false);
        for (slot, last) in seen.iter_mut().enumerate() {
            let done = self.area.load(slot as u32);
            if done != *last {
                moved = true;
                *last = done;
            }
            if self.queued[slot].load(Ordering::Acquire) > done {
                outstanding = true;
            }
        }
        (outstanding, moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A context watch whose resets are counted, over one fresh area; the area as
    /// the device sees it (the same file, mapped twice as with a worker).
    fn watched(
        timeout: Duration,
    ) -> (
        Arc<ContextWatch>,
        Arc<AreaWatch>,
        SignalArea,
        Arc<AtomicUsize>,
    ) {
        let resets = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&resets);
        let watch = Arc::new(ContextWatch {
            timeout,
            reset: Box::new(move |e| {
                assert_eq!(e.code, codes::LAUNCH_TIMEOUT);
                counted.fetch_add(1, Ordering::SeqCst);
            }),
            areas: Mutex::new(Vec::new()),
            stalled_since: Mutex::new(None),
            fired: std::sync::atomic::AtomicBool::new(false),
        });
        let device = SignalArea::create().unwrap();
        let path = device.path().unwrap();
        let area = watch.add_area(SignalArea::open(&path).unwrap());
        device.unlink();
        (watch, area, device, resets)
    }

    #[test]
    fn a_stalled_signal_fires_once_after_the_timeout() {
        let t = Duration::from_secs(10);
        let (watch, area, _device, resets) = watched(t);
        let t0 = Instant::now();
        area.queued(0, 1);
        watch.check(t0);
        watch.check(t0 + t / 2);
        assert_eq!(resets.load(Ordering::SeqCst), 0, "not stalled long enough");
        watch.check(t0 + t);
        assert_eq!(resets.load(Ordering::SeqCst), 1);
        assert!(watch.fired());
        watch.check(t0 + 3 * t);
        assert_eq!(resets.load(Ordering::SeqCst), 1, "a context is reset once");
    }

    #[test]
    fn progress_or_nothing_queued_never_fires() {
        let t = Duration::from_secs(10);
        let (watch, area, device, resets) = watched(t);
        let t0 = Instant::now();
        // Nothing queued: idle for ages.
        watch.check(t0);
        watch.check(t0 + 5 * t);
        // Long queued work that keeps passing signals: each look sees a counter move.
        for i in 1..=20u64 {
            area.queued(1, i + 1);
            device.store(1, i);
            watch.check(t0 + 5 * t + (t / 2) * i as u32);
        }
        // Everything reached: idle again.
        device.store(1, 21);
        watch.check(t0 + 20 * t);
        watch.check(t0 + 40 * t);
        assert_eq!(resets.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn another_connection_moving_counts_as_progress_of_the_context() {
        let t = Duration::from_secs(10);
        let (watch, stuck, _device, resets) = watched(t);
        let other_device = SignalArea::create().unwrap();
        let other = watch.add_area(SignalArea::open(&other_device.path().unwrap()).unwrap());
        other_device.unlink();
        let t0 = Instant::now();
        stuck.queued(0, 1);
        for i in 1..=5u64 {
            other.queued(2, i);
            other_device.store(2, i);
            watch.check(t0 + (t / 2) * i as u32);
        }
        assert_eq!(resets.load(Ordering::SeqCst), 0, "the context moved");
        // Now nothing moves: the stalled connection fires the watchdog.
        watch.check(t0 + 4 * t);
        watch.check(t0 + 5 * t);
        assert_eq!(resets.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_thread_resets_a_stalled_context_and_forgets_dropped_ones() {
        let dog = Watchdog::new(Duration::from_millis(40));
        let resets = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&resets);
        let watch = dog.watch(Box::new(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        let device = SignalArea::create().unwrap();
        let area = watch.add_area(SignalArea::open(&device.path().unwrap()).unwrap());
        device.unlink();
        area.queued(0, 1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while resets.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(resets.load(Ordering::SeqCst), 1);
        drop((area, watch));
        std::thread::sleep(Duration::from_millis(50));
        assert!(lock(&dog.contexts).iter().all(|w| w.strong_count() == 0));
    }
}
