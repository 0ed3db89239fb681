//! Host functions on streams (`cuLaunchHostFunc`, `cuStreamAddCallback`), run
//! in the program's own process in stream order. A host function records an
//! event on its stream and joins the stream's queue (`State::host_fns`); one
//! worker thread per busy stream waits (polling the event) until the stream
//! reaches it, then calls it. Until the queue is empty, new work for that
//! stream waits (`Client::ready_stream`), so it starts after the callback,
//! and synchronising the stream includes its callbacks.

use std::ffi::c_void;
use std::time::Duration;

use cumux_cuda_bindings::consts::CU_EVENT_DISABLE_TIMING;
use cumux_protocol::{Call, Handle};

use crate::errors::*;
use crate::state::{Client, HostCall};

/// Queues `run` to be called once `stream` has finished the work queued so
/// far (the caller has checked the stream and that it is not captured).
pub fn enqueue(
    client: &'static Client,
    stream: Handle,
    run: Box<dyn FnOnce(CUresult) + Send>,
) -> CuResult<()> {
    // The event is made on the stream's device, whose session records it.
    let device = client.device_for(0, Some(stream));
    let event = client.new_event(device, CU_EVENT_DISABLE_TIMING)?;
    client.call(Call::EventRecord { event, stream })?;
    let mut s = client.lock();
    let q = s.host_fns.entry(stream).or_default();
    q.calls.push_back(HostCall { event, run });
    q.pending += 1;
    if !q.worker {
        q.worker = true;
        std::thread::Builder::new()
            .name("cumux-host-fn".into())
            .spawn(move || worker(client, stream))
            .map_err(|_| CUDA_ERROR_OUT_OF_MEMORY)?;
    }
    Ok(())
}

/// Waits for the stream to reach one event: polls, backing off to 2 ms.
fn reached(client: &Client, event: Handle) -> CUresult {
    let mut pause = Duration::from_micros(20);
    loop {
        match client.call(Call::EventQuery { event }) {
            Ok(_) => return CUDA_SUCCESS,
            Err(CUDA_ERROR_NOT_READY) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(2));
            }
            Err(e) => return e,
        }
    }
}

fn worker(client: &'static Client, stream: Handle) {
    loop {
        let next = {
            let mut s = client.lock();
            let q = s.host_fns.entry(stream).or_default();
            match q.calls.pop_front() {
                Some(c) => c,
                None => {
                    q.worker = false;
                    return;
                }
            }
        };
        let status = reached(client, next.event);
        let _ = client.call(Call::EventDestroy { event: next.event });
        // A panicking host function must not take the worker (and the queue) down.
        let _inside = crate::managed_guard::Inside::enter();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (next.run)(status)));
        let mut s = client.lock();
        let q = s.host_fns.entry(stream).or_default();
        q.pending -= 1;
        if q.pending == 0 {
            client.changed();
        }
    }
}

/// A raw pointer the program handed over, moved to the worker thread.
#[derive(Clone, Copy)]
pub struct UserData(pub *mut c_void);
// SAFETY: the driver API hands the pointer to the callback on another thread,
// as NVIDIA's driver does; the program owns what it points to.
unsafe impl Send for UserData {}
// SAFETY: as above; a recorded host function may be replayed from any thread.
unsafe impl Sync for UserData {}
