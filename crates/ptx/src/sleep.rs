//! `nanosleep` on the CPU device: a thread waits about the time asked, as
//! on a GPU, so a spin loop's back-off takes real time, whichever engine runs it.

use std::time::{Duration, Instant};

/// Waits up to this long by spinning (then yielding); longer waits sleep.
const SPIN_UP_TO_NS: u64 = 20_000;
/// The longest wait PTX allows (`nanosleep` takes at most 1 ms).
const MAX_NS: u64 = 1_000_000;

/// Waits about `ns` nanoseconds (at most 1 ms): short waits spin on the
/// clock and then yield, so other threads of the host run; long ones sleep.
pub fn nanosleep(ns: u64) {
    let ns = ns.min(MAX_NS);
    if ns >= SPIN_UP_TO_NS {
        std::thread::sleep(Duration::from_nanos(ns));
        return;
    }
    let until = Instant::now() + Duration::from_nanos(ns);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    std::thread::yield_now();
}

#[cfg(test)]
mod tests {
    use super::nanosleep;
    use std::time::{Duration, Instant};

    #[test]
    fn a_sleep_takes_about_the_time_asked_and_at_most_a_millisecond() {
        let t = Instant::now();
        for _ in 0..100 {
            nanosleep(10_000);
        }
        assert!(t.elapsed() >= Duration::from_millis(1), "{:?}", t.elapsed());
        let t = Instant::now();
        nanosleep(u64::MAX);
        let took = t.elapsed();
        assert!(
            took >= Duration::from_millis(1) && took < Duration::from_secs(1),
            "{took:?}"
        );
    }
}
