//! The client's logger: events to stderr at the level `CUMUX_LOG` names
//! (default warn), and none on a thread whose formatter may be torn down, so
//! a driver call made while a thread or the process ends never panics in it.

use std::cell::Cell;

use tracing_subscriber::layer::{Context, Layer};

/// Installs the stderr logger once.
pub(crate) fn init() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = std::env::var("CUMUX_LOG").unwrap_or_else(|_| "warn".into());
        let filter = tracing_subscriber::EnvFilter::try_new(&filter)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(false)
            .finish()
            .with(SilentOnceTornDown)
            .try_init();
    });
}

/// Where this thread's formatter stands. The formatter writes each event
/// through a thread-local buffer that it registers for teardown at the
/// thread's first formatted event; a thread-local torn down before it is
/// the sign that it may be gone.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Formatter {
    /// No event formatted on this thread yet: its buffer does not exist, and
    /// would be made afresh.
    Unused,
    /// The buffer exists, and `TornDownFirst` was registered after it.
    InUse,
    /// `TornDownFirst` is gone, so the buffer may be.
    MayBeGone,
}

thread_local! {
    /// Plain data needs no destructor, so this is never torn down.
    static FORMATTER: Cell<Formatter> = const { Cell::new(Formatter::Unused) };
    /// Registered for teardown just after the formatter's buffer, at the
    /// thread's first formatted event; thread-locals are torn down in the
    /// reverse order of their registration, so this goes first.
    static TORN_DOWN_FIRST: TornDownFirst = const { TornDownFirst };
}

struct TornDownFirst;

impl Drop for TornDownFirst {
    fn drop(&mut self) {
        FORMATTER.with(|f| f.set(Formatter::MayBeGone));
    }
}

/// Drops every event on a thread whose formatter may be torn down: a thread
/// ending (a key destructor, a C++ `thread_local` destructor) or the thread
/// that called `exit`, which tears its thread-locals down before it runs the
/// `atexit` handlers where the CUDA runtime unloads its modules. The
/// formatter would panic there, and a panic in `abi::guard`'s own logging
/// escapes its catch.
struct SilentOnceTornDown;

impl<S: tracing::Subscriber> Layer<S> for SilentOnceTornDown {
    fn event_enabled(&self, _event: &tracing::Event<'_>, _ctx: Context<'_, S>) -> bool {
        FORMATTER.with(Cell::get) != Formatter::MayBeGone
    }

    /// Runs after the formatter wrote the event (the inner layers first).
    fn on_event(&self, _event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        FORMATTER.with(|f| {
            if f.get() == Formatter::Unused && TORN_DOWN_FIRST.try_with(|_| ()).is_ok() {
                f.set(Formatter::InUse);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Thread-local destructors that log, registered before the thread's
    /// first event (torn down after the formatter's buffer) and between its
    /// first driver call and its first event: neither panics, whatever the
    /// order.
    #[test]
    fn events_while_a_thread_ends_do_not_panic() {
        static LOGGED: Mutex<Vec<&str>> = Mutex::new(Vec::new());
        struct LogsOnDrop(&'static str);
        impl Drop for LogsOnDrop {
            fn drop(&mut self) {
                tracing::warn!("logged while the thread ends ({})", self.0);
                LOGGED.lock().unwrap().push(self.0);
            }
        }
        thread_local! {
            static FIRST: LogsOnDrop = const { LogsOnDrop("first") };
            static SECOND: LogsOnDrop = const { LogsOnDrop("second") };
        }
        init();
        std::thread::spawn(|| {
            FIRST.with(|_| ());
            tracing::warn!("the thread's first event");
            SECOND.with(|_| ());
        })
        .join()
        .unwrap();
        let mut logged = LOGGED.lock().unwrap().clone();
        logged.sort();
        assert_eq!(logged, ["first", "second"]);
    }
}
