//! Whether this thread is being torn down: its thread-locals are gone, as in
//! a key destructor at the thread's end, or in the `atexit` handlers of the
//! thread that called `exit` (it tears its thread-locals down first).

/// Torn down with the thread's thread-locals: having a destructor, even an
/// empty one, is what makes a thread-local one that is torn down.
struct Marker;

impl Drop for Marker {
    fn drop(&mut self) {}
}

thread_local!(static MARKER: Marker = const { Marker });

/// Whether this thread's thread-locals are torn down. `abi::guard` asks on
/// every call, so the marker exists on every thread that calls the driver,
/// made at its first call (thread-locals made before that one may outlive
/// it). Calls made then that find things gone (a server that went away) say
/// so quietly.
pub(crate) fn thread_ending() -> bool {
    MARKER.try_with(|_| ()).is_err()
}
